"""The paper presets render as the authors' augmentation does: bicubic at every geometric edit, a bicubic
final resize and a bicubic reference, the original at full resolution."""

from __future__ import annotations

import dataclasses

import numpy as np
from PIL import Image
from test_editor import textured_image

from copynce_hf.data.pairs import CopyPairMaker
from copynce_hf.pixtrace import CopyEditor, CopyRecipe, replay
from copynce_hf.pixtrace.edits import edit_from_dict
from copynce_hf.pixtrace.fused import render_fused
from copynce_hf.pixtrace.table import CoordinateTable

SIZE = 64
#: Geometric edits the reference chain renders with Pillow's own operations (as torchvision does on PIL images).
_PIL_NATIVE = {"resize", "random_resized_crop", "hflip", "vflip"}


def _pillow_bicubic_chain(image: Image.Image, edits: list[dict]) -> Image.Image:
    """``edits`` applied one by one, resizes and crops with Pillow's bicubic resize (torchvision's ``Resize`` and
    ``RandomResizedCrop`` on PIL images: crop, then resize), flips with ``transpose``; every other edit (affine and
    perspective: Pillow's bicubic ``transform``) as the edit renders itself."""
    for description in edits:
        params = description["params"]
        if description["name"] == "resize":
            assert params["resample"] == "bicubic"
            image = image.resize((params["width"], params["height"]), Image.BICUBIC)
        elif description["name"] == "random_resized_crop":
            assert params["resample"] == "bicubic"
            box = (params["left"], params["top"], params["right"], params["bottom"])
            image = image.crop(box).resize((params["width"], params["height"]), Image.BICUBIC)
        elif description["name"] in ("hflip", "vflip"):
            flip = Image.Transpose.FLIP_LEFT_RIGHT if description["name"] == "hflip" else Image.Transpose.FLIP_TOP_BOTTOM
            image = image.transpose(flip)
        else:
            edit = edit_from_dict(description)
            if edit.kind == "geometric":
                assert getattr(edit, "resample", "bicubic") == "bicubic", description
            image, _ = edit(image, CoordinateTable.identity(image.height, image.width))
    return image


def _geometric_copies(recipe: str, count: int):
    """(original, copy, edits) of ``count`` training-path copies whose chain warps the image (affine or perspective)."""
    maker = CopyPairMaker(SIZE, query_recipe=recipe)
    original = textured_image(150, 200)
    found = []
    for seed in range(200):
        pair = maker(original, original, 1, seed, 10_000 + seed)
        names = {d["name"] for d in pair.edits["query"]}
        if names & {"affine", "perspective"} and not names & {"albumentation", "shuffle_pixels"}:
            found.append((original, pair.query, pair.edits["query"]))
        if len(found) == count:
            return maker, found, pair
    raise AssertionError(f"fewer than {count} warped copies in 200 draws of {recipe}")


def _mean_difference(first: Image.Image, second: Image.Image) -> float:
    return float(np.abs(np.asarray(first, dtype=np.float64) - np.asarray(second, dtype=np.float64)).mean())


def test_paper_copies_of_the_training_path_equal_a_pillow_bicubic_chain():
    for recipe in ("paper_descriptor", "paper_matcher"):
        maker, copies, _ = _geometric_copies(recipe, 4)
        assert maker.max_source_side == 0  # the authors edit the original at full resolution
        for original, query, edits in copies:
            assert _mean_difference(query, _pillow_bicubic_chain(original, edits)) <= 0.5, (recipe, edits)
        # The fused renderer (bilinear, one resampling per run) is measurably not this chain.
        fused = [_mean_difference(render_fused(original, [edit_from_dict(d) for d in edits])[0], query)
                 for original, query, edits in copies]
        assert np.mean(fused) > 0.5


def test_paper_references_are_a_bicubic_resize_of_the_original():
    maker, _, pair = _geometric_copies("paper_matcher", 1)
    original = textured_image(150, 200)
    expected = original.resize((SIZE, SIZE), Image.BICUBIC)
    assert np.array_equal(np.asarray(pair.reference), np.asarray(expected))
    assert pair.edits["reference"] == [{"name": "resize", "params": {"height": SIZE, "width": SIZE,
                                                                     "resample": "bicubic"}}]


def test_paper_presets_render_edit_by_edit_and_the_package_recipe_fused():
    for recipe in (CopyRecipe.paper_descriptor(), CopyRecipe.paper_matcher(), CopyRecipe.off()):
        assert not recipe.fused and recipe.resample == "bicubic"
        assert CopyEditor(recipe=recipe).fuse is False
        assert CopyRecipe.from_dict(recipe.to_dict()) == recipe
    training = CopyRecipe.training()
    assert training.fused and CopyEditor(recipe=training).fuse is True
    assert CopyPairMaker(SIZE, "training").max_source_side == 4 * SIZE
    editor = CopyEditor(seed=0, recipe=CopyRecipe.paper_descriptor(), output_size=(SIZE, SIZE))
    result = editor(textured_image(150, 200), seed=3)
    assert result.edits[-1]["params"]["resample"] == "bicubic" or result.edits[-1]["name"] == "random_erasing"
    again = replay(textured_image(150, 200), result.edits, fuse=False)
    assert np.array_equal(np.asarray(again.image), np.asarray(result.image))


def test_authors_emoji_fits_inside_the_image_at_a_fraction_of_the_largest_scale():
    from copynce_hf.pixtrace.edits import OverlayEmoji, emoji_names

    names = emoji_names()
    image = textured_image(90, 160)
    for k, (size, x, y) in enumerate([(0.5, 1.0, 1.0), (0.1, 0.0, 0.0), (0.3, 0.99, 0.2)]):
        emoji = OverlayEmoji(emoji=names[37 * k], size=size, x=x, y=y, opacity=1.0, form="authors")
        covered = np.argwhere(emoji.coverage(90, 160) > 0)
        assert len(covered)
        height, width = np.ptp(covered, axis=0) + 1
        # The emoji (square, 72 px) at `size` of the largest scale that fits the 90-pixel height: fully inside,
        # every pixel of it that the same emoji shows placed in the middle (where nothing can be cut).
        assert abs(max(height, width) - int(90 * size)) <= 1, (size, height, width)
        middle = dataclasses.replace(emoji, x=0.5, y=0.5).coverage(90, 160)
        assert len(covered) == np.count_nonzero(middle), (size, x, y)
        if x == 1.0:
            assert covered[:, 1].max() == 159 and covered[:, 0].max() == 89  # pushed to the corner, not cut
        edited, table = emoji(image, CoordinateTable.identity(90, 160))
        assert np.isnan(table.coords[tuple(covered[len(covered) // 2])]).all()
        assert edited.size == image.size
    # The package's form places the corner anywhere in [0, 1] and may cut the emoji.
    cut = OverlayEmoji(emoji=names[0], size=0.5, x=0.9, y=0.9, opacity=1.0).coverage(90, 160)
    assert np.argwhere(cut > 0)[:, 0].max() == 89 and np.count_nonzero(cut.any(axis=1)) < int(90 * 0.5)
    drawn = CopyRecipe.paper_descriptor().overlay_emoji
    assert drawn.form == "authors" and drawn.size == (0.1, 0.5) and drawn.opacity == (0.7, 1.0)
