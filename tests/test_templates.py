"""Templates (copynce_hf.pixtrace.templates): each kind puts an image where its table says, leaves its own
pixels untraced and the same for every image, replays from its edit records and round-trips through its dict."""

import numpy as np
import pytest
from PIL import Image

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import bind_pool_images, replay
from copynce_hf.pixtrace.templates import TEMPLATE_KINDS, Template, TemplateRecipe


def _photo(seed: int, size=(48, 64)) -> Image.Image:
    """A smooth RGB image (bilinear upsampling of a coarse random grid): resampling changes it little."""
    coarse = np.random.default_rng(seed).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((size[1], size[0]), Image.BILINEAR)


def _background_picker(rng):
    return "bg-7", _photo(7, (90, 120))


def _template(kind: str, seed: int = 0) -> Template:
    template = TemplateRecipe({kind: 1.0}).draw(np.random.default_rng(seed), backgrounds=_background_picker)
    assert template.kind == kind
    return template


@pytest.mark.parametrize("kind", TEMPLATE_KINDS)
def test_the_image_is_where_the_table_says_and_the_template_is_untraced(kind):
    image = _photo(1)
    framed, table = _template(kind).apply(image)
    pixels, source = np.asarray(framed).astype(float), np.asarray(image).astype(float)
    coords = table.coords
    traced = ~np.isnan(coords[..., 0])
    assert traced.mean() > 0.05  # the image is in the output
    assert (~traced).sum() > 0  # and the template's own pixels are untraced
    rows, cols = np.nonzero(traced)
    y = np.clip(np.rint(coords[rows, cols, 0]).astype(int), 0, image.height - 1)
    x = np.clip(np.rint(coords[rows, cols, 1]).astype(int), 0, image.width - 1)
    error = np.abs(pixels[rows, cols] - source[y, x]).mean(axis=1)
    if kind == "overlay":  # text and emoji edges blend over traced pixels at partial cover
        assert np.median(error) < 6
    else:
        assert np.median(error) < 6 and np.mean(error) < 12
    # against another image: the traced pixels follow the image, the template's stay the template's
    other, other_table = _template(kind).apply(_photo(2))
    assert other.size == framed.size and np.array_equal(np.isnan(other_table.coords[..., 0]), ~traced)
    untraced = ~traced
    if kind != "overlay":  # an overlay's half-covered edge pixels keep some of the image
        same = np.abs(np.asarray(other).astype(float)[untraced] - pixels[untraced]).max(axis=1) <= 2
        assert same.mean() > 0.9
    assert np.abs(np.asarray(other).astype(float)[traced] - pixels[traced]).mean() > 10


@pytest.mark.parametrize("kind", TEMPLATE_KINDS)
def test_edit_records_replay_the_template(kind):
    template, image = _template(kind, seed=3), _photo(4)
    framed, table = template.apply(image)
    records = template.edit_dicts((image.height, image.width))
    if kind == "background":  # the photo is named by id, as the crop group's pastes
        assert records[0]["params"]["background"] == {"kind": "pool", "id": "bg-7"}
        with pytest.raises(Exception, match="bg-7"):
            bind_pool_images(records, {})
    again = replay(image, bind_pool_images(records, {"bg-7": template.background}), fuse=False)
    assert np.array_equal(np.asarray(again.image), np.asarray(framed))
    assert np.array_equal(again.table.coords, table.coords, equal_nan=True)


@pytest.mark.parametrize("kind", TEMPLATE_KINDS)
def test_dict_round_trip(kind):
    template = _template(kind, seed=5)
    data = template.to_dict()
    assert data["kind"] == kind
    back = Template.from_dict(data, background=template.background)
    assert back == template
    first, second = template.apply(_photo(6))[0], back.apply(_photo(6))[0]
    assert np.array_equal(np.asarray(first), np.asarray(second))


def test_a_draw_is_a_function_of_the_generator():
    recipe = TemplateRecipe()
    first = [recipe.draw(np.random.default_rng([4, i]), backgrounds=_background_picker).to_dict() for i in range(12)]
    again = [recipe.draw(np.random.default_rng([4, i]), backgrounds=_background_picker).to_dict() for i in range(12)]
    assert first == again
    assert len({template["kind"] for template in first}) >= 3  # the default weights draw several kinds


def test_background_without_photos_is_procedural():
    template = TemplateRecipe({"background": 1.0}).draw(np.random.default_rng(0))
    assert template.params["image"]["kind"] == "gradient" and template.background is None
    framed, table = template.apply(_photo(1))
    assert np.isnan(table.coords[..., 0]).any() and framed.mode == "RGB"


def test_bad_kinds_and_weights_are_refused():
    with pytest.raises(ConfigError, match="bogus"):
        Template("bogus", {})
    with pytest.raises(ConfigError, match="unknown kinds"):
        TemplateRecipe({"bogus": 1.0})
    with pytest.raises(ConfigError, match=">= 0 with a positive sum"):
        TemplateRecipe({"frame": -1.0, "meme": 2.0})
    with pytest.raises(ConfigError, match=">= 0 with a positive sum"):
        TemplateRecipe({"frame": 0.0})
