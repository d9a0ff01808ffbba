"""The authors' recipes (CopyRecipe.paper_descriptor / paper_matcher): structure, exact tracing, replay."""

from __future__ import annotations

import copy
import dataclasses
import json
import os

import numpy as np
import pytest
from _oracles import ramp_check
from conftest import ramp_image, shared_split
from PIL import Image
from test_editor import assert_same_result, content_scores, textured_image

from copynce_hf.modeling.errors import ConfigError, EditParameterError
from copynce_hf.pixtrace import CoordinateTable, CopyEditor, CopyRecipe, replay
from copynce_hf.pixtrace.edits import (
    ALBUMENTATIONS_OPS,
    EDIT_REGISTRY,
    Albumentation,
    OverlayImageBox,
    PasteIntoBox,
    Smear,
)
from copynce_hf.pixtrace.steps import snap_angle

PRESETS = {"descriptor": CopyRecipe.paper_descriptor, "matcher": CopyRecipe.paper_matcher}
SIZE = (64, 64)
DRAWS = 60


def _traced_equivalent(edits: list[dict]) -> list[dict]:
    """The drawn edits without the photometric ones and the overlays whose covered pixels keep their trace
    (``covered="mapped"``, the authors' map: the table says the ramp lies beneath them), and with every blend
    set to the extreme that traces the same pixels (the copy's weight 1 where it is at least 0.5, an overlay's
    opacity 0 where it is below 0.5): what remains must show the ramp wherever the table says so."""
    kept = []
    for description in copy.deepcopy(edits):
        if EDIT_REGISTRY[description["name"]].kind == "photometric" or description["params"].get("covered") == "mapped":
            continue
        params = description["params"]
        if description["name"] == "paste_into_box":
            params["opacity"] = 1.0 if params["opacity"] * 255 + 0.5 >= 128 else 0.0
        elif "opacity" in params and params["opacity"] * 255 + 0.5 < 128:
            params["opacity"] = 0.0
        kept.append(description)
    return kept


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_ramp_oracle_on_paper_preset_draws(preset):
    """Tables of 60 draws are exact: the traced positions show the ramp colour there."""
    source = ramp_image(80, 96)
    editor = CopyEditor(seed=11, recipe=PRESETS[preset](), output_size=SIZE)
    agreements, judged_draws = [], 0
    for k in range(DRAWS):
        result = editor(source, seed=k)
        # Rendered fused (bilinear, antialiased): bicubic's overshoot next to an occluder's edge is not the table's.
        geometry = replay(source, _traced_equivalent(result.edits), fuse=True)
        # Photometric edits and the blend levels above the 0.5 rule do not change the table.
        np.testing.assert_array_equal(geometry.table.coords, result.table.coords)
        check = ramp_check(geometry.image, geometry.table, tolerance=3.0, blend_band=3)
        if check.interior >= 50:
            judged_draws += 1
            agreements.append(check.agreement)
            assert check.agreement >= 0.97, (k, check, [d["name"] for d in result.edits])
    assert judged_draws >= 0.8 * DRAWS
    assert np.mean(agreements) >= 0.99


@pytest.mark.shared_data
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_content_oracle_on_paper_preset_draws(preset):
    """Edited luminance correlates with the original's at the traced positions, and not when shuffled."""
    editor = CopyEditor(seed=2025, recipe=PRESETS[preset](), output_size=(96, 96))
    scores, shuffled = content_scores(editor, shared_split("train"), DRAWS, 11, 160, 300)
    assert len(scores) >= 0.8 * DRAWS
    assert np.median(scores) >= 0.75
    assert np.median(shuffled) < 0.3


@pytest.mark.parametrize("preset, group_p", [("descriptor", 0.25), ("matcher", 0.35)])
def test_rotations_beyond_45_degrees_occur_at_the_expected_rate(preset, group_p):
    """Rate = P(linear group) * P(affine | group) * P(angle 45..315 after snapping) = p * 0.5 * 0.75."""
    recipe = PRESETS[preset]()
    editor = CopyEditor(seed=3, recipe=recipe)
    image = textured_image(16, 20)
    draws, beyond, angles = 400, 0, []
    for k in range(draws):
        for description in editor(image, seed=k).edits:
            if description["name"] == "affine":
                angle = description["params"]["angle"]
                angles.append(angle)
                beyond += min(angle, 360 - angle) > 45
    expected = group_p * 0.5 * 0.75
    sd = np.sqrt(expected * (1 - expected) / draws)
    assert abs(beyond / draws - expected) < 4 * sd, (beyond / draws, expected)
    # Snapping: no angle within 22.5 degrees of a right angle except the right angles themselves.
    for angle in angles:
        distance = min(abs(angle - t) for t in (0, 90, 180, 270, 360))
        assert distance == 0 or distance > 22.5
    assert snap_angle(-10.0) == 0.0 and snap_angle(100.0) == 90.0 and snap_angle(380.0) == 0.0 and snap_angle(400.0) == 40.0
    assert snap_angle(200.0) == 180.0 and snap_angle(135.0) == 135.0


def test_groups_are_shuffled_and_erasing_comes_after_the_resize():
    image = textured_image(48, 64)
    base = CopyRecipe.paper_descriptor()
    recipe = base.replace(
        crop=dataclasses.replace(base.crop, p=1.0), linear=dataclasses.replace(base.linear, p=1.0),
        random_erasing=dataclasses.replace(base.random_erasing, p=1.0),
        padding=dataclasses.replace(base.padding, p=1.0))
    editor = CopyEditor(seed=0, recipe=recipe, output_size=(32, 32))
    crop_first, geometry_first = 0, 0
    for k in range(40):
        names = [d["name"] for d in editor(image, seed=k).edits]
        assert names[-3:] == ["pad", "resize", "random_erasing"], names
        crop = min(i for i, n in enumerate(names) if n in ("random_resized_crop", "paste_into_box", "overlay_image_box"))
        linear = min(i for i, n in enumerate(names) if n in ("affine", "perspective"))
        crop_first += crop < linear
        geometry_first += linear < crop
    assert crop_first >= 5 and geometry_first >= 5


def test_every_paper_step_draws_a_working_replayable_edit():
    image = textured_image(60, 80)
    base = CopyRecipe.paper_matcher().with_probability(1.0)
    recipe = base.replace(crop=dataclasses.replace(base.crop, p=1.0), linear=dataclasses.replace(base.linear, p=1.0),
                          overlay_text=dataclasses.replace(base.overlay_text, p=0.0))  # p_means "skip": always
    editor = CopyEditor(seed=5, recipe=recipe, output_size=SIZE)
    seen = set()
    for k in range(12):
        result = editor(image, seed=k)
        seen.update(d["name"] for d in result.edits)
        assert result.image.size == SIZE and result.table.size == SIZE
        assert_same_result(replay(image, json.loads(json.dumps(result.edits)), fuse=editor.fuse), result)
    assert {"random_resized_crop", "paste_into_box", "overlay_image_box", "affine", "perspective", "hflip", "vflip",
            "color_jitter", "pixelization", "shuffle_pixels", "jpeg_quality", "grayscale", "blur", "overlay_text",
            "overlay_emoji", "edge_enhance", "smear", "albumentation", "pad", "resize", "random_erasing"} <= seen


def test_presets_differ_where_the_authors_configs_differ_and_round_trip():
    descriptor, matcher = CopyRecipe.paper_descriptor(), CopyRecipe.paper_matcher()
    assert (descriptor.crop.p, matcher.crop.p) == (0.3, 0.5)
    assert (descriptor.linear.p, matcher.linear.p) == (0.25, 0.35)
    assert (descriptor.color_jitter.brightness, matcher.color_jitter.hue) == (0.5, 0.2)
    assert (descriptor.other_image_onto.scale, matcher.other_image_onto.scale) == ((0.3, 0.7), (0.5, 0.8))
    assert (descriptor.random_erasing.p, matcher.random_erasing.p) == (0.15, 0.25)
    assert descriptor.additional.p == matcher.additional.p == 0.15 and len(ALBUMENTATIONS_OPS) == 24
    for recipe in (descriptor, matcher):
        data = json.loads(json.dumps(recipe.to_dict()))
        assert CopyRecipe.from_dict(data) == recipe
        assert CopyEditor(recipe=data).recipe == recipe
    with pytest.raises(ConfigError, match="affine.degree"):
        descriptor.updated({"affine": {"degree": [0, 10]}})
    with pytest.raises(ConfigError, match="'crop'.*p=1.5"):
        descriptor.updated({"crop": {"p": 1.5}})
    with pytest.raises(ConfigError, match="ops"):
        descriptor.updated({"additional": {"ops": ["Emboss"]}})


# ---------------------------------------------------------------------- the new edits


def test_half_transparent_pastes_follow_the_one_half_rule():
    image = textured_image(40, 40)
    table = CoordinateTable.identity(40, 40)
    spec = {"kind": "solid", "color": [0, 0, 255], "size": [10, 10]}
    for opacity, traced in ((0.5, True), (0.49, False), (1.0, True)):
        edited, new_table = PasteIntoBox(spec, 50, 60, 5, 7, 20, 30, opacity=opacity)(image, table)
        box = new_table.valid[7:27, 5:35]
        assert edited.size == (60, 50) and box.all() == traced and box.any() == traced
        assert new_table.valid.sum() == (600 if traced else 0)
    for opacity, covered in ((0.49, False), (0.51, True)):
        edit = OverlayImageBox(spec, x=0.25, y=0.25, width=0.5, height=0.5, opacity=opacity)
        edited, new_table = edit(image, table)
        assert (~new_table.valid).sum() == (400 if covered else 0)
        changed = np.any(np.asarray(edited) != np.asarray(image), axis=-1)
        assert changed[10:30, 10:30].mean() > 0.9 and not changed[:10].any()


def test_smear_covers_exactly_the_pixels_it_paints():
    image = Image.new("RGB", (50, 40), (10, 200, 30))
    edit = Smear(points=((0.1, 0.2), (0.5, 0.9), (0.9, 0.1), (0.3, 0.3)), width=3, color=(250, 0, 250))
    edited, table = edit(image, CoordinateTable.identity(40, 50))
    changed = np.any(np.asarray(edited) != np.asarray(image), axis=-1)
    assert changed.sum() > 30
    np.testing.assert_array_equal(changed, ~table.valid)


def test_albumentation_edit_replays_and_keeps_the_table():
    image = textured_image(32, 40)
    table = CoordinateTable.identity(32, 40)
    for op in ("RandomRain", "GaussNoise", "InvertImg"):
        first, first_table = Albumentation(op=op, seed=7)(image, table)
        second, _ = Albumentation(op=op, seed=7)(image, table)
        np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
        assert first_table is table and first.size == image.size
        assert np.any(np.asarray(first) != np.asarray(image))
    with pytest.raises(EditParameterError, match="op"):
        Albumentation(op="Emboss")


def test_pair_maker_and_paper_configs_use_the_paper_presets():
    from copynce_hf.data import CopyPairMaker
    from copynce_hf.training import load_config

    maker = CopyPairMaker(32, query_recipe="paper_descriptor")
    original = textured_image(60, 80)
    pair = maker(original, original, 1, query_seed=3, reference_seed=4)
    assert pair.query.size == (32, 32) and pair.query_table.source_size == (60, 80)
    assert maker.editor("paper_descriptor").recipe == CopyRecipe.paper_descriptor()
    assert CopyPairMaker(32, query_recipe="paper_matcher").editor("paper_matcher").recipe == CopyRecipe.paper_matcher()
    for no_editor in ("resize", "heavy"):
        with pytest.raises(ConfigError, match=f"recipe='{no_editor}' has no editor"):
            maker.editor(no_editor)
    root = __import__("pathlib").Path(__file__).resolve().parents[1] / "configs"
    for name, recipe in (("descriptor_vitb16_224", "paper_descriptor"), ("descriptor_vits16_224", "paper_descriptor"),
                         ("matcher_vitb16_224", "paper_matcher"), ("matcher_vits16_224", "paper_matcher"),
                         ("matcher_vits16_336", "paper_matcher")):
        with pytest.raises(ConfigError, match="knn_graph"):
            load_config(root / f"{name}.yaml")
        assert load_config(root / f"{name}.yaml", {"knn_graph": "graph.safetensors"}).query_recipe == recipe
        assert load_config(root / f"{name}.yaml", {"hard_negative_mining": None}).query_recipe == recipe


# ---------------------------------------------------------------------- the authors' text overlay


def _ink_columns_rows(text: str, font_path: str, pixels: int, anchor: tuple[float, float], size: tuple[int, int]):
    """Rendered independently on a canvas 40 pixels larger on every side: (ink pixels in all, ink pixels
    inside the (H, W) image placed at the canvas's (40, 40))."""
    from PIL import ImageDraw, ImageFont

    height, width = size
    canvas = Image.new("L", (width + 80, height + 80), 0)
    ImageDraw.Draw(canvas).text((anchor[0] + 40, anchor[1] + 40), text, fill=255,
                                font=ImageFont.truetype(font_path, pixels))
    ink = np.asarray(canvas) > 0
    return int(ink.sum()), int(ink[40:40 + height, 40:40 + width].sum())


def _authors_text(**changes):
    return dataclasses.replace(CopyRecipe.paper_descriptor().overlay_text, **changes)


def test_paper_presets_draw_the_authors_text_from_every_augly_font():
    import os

    from augly.utils import FONTS_DIR

    from copynce_hf.pixtrace.steps import DrawContext

    step = CopyRecipe.paper_matcher().overlay_text
    assert (step.form, step.fonts, step.length, step.font_size, step.opacity) == (
        "authors", ("*",), (1, 100), (0.1, 0.3), (0.1, 1.0))  # overlay.py RandomOverlayText
    assert (CopyRecipe.paper_descriptor().overlay_text.p, step.p) == (0.25, 0.35)
    augly_fonts = {name for name in os.listdir(FONTS_DIR) if name.endswith(".ttf")}
    assert set(step.font_choices()) == augly_fonts and len(augly_fonts) > 300
    # One character per text keeps the draws fast; the fonts are drawn uniformly from all of them.
    rng, one_letter = np.random.default_rng(0), dataclasses.replace(step, length=(1, 1))
    drawn = [one_letter.draw(DrawContext(rng, (40, 48))) for _ in range(1500)]
    fonts = [edits[0].font for edits in drawn if edits]
    assert len(fonts) > 1400 and set(fonts) <= augly_fonts
    assert len(set(fonts)) > 330  # 1500 uniform picks of 364 fonts miss about 6 of them on average
    assert CopyRecipe.training().overlay_text.form == "alphabet" and len(CopyRecipe.training().overlay_text.fonts) == 8


def test_authors_text_length_is_uniform_up_to_as_many_characters_as_fit(tmp_path):
    """With a font whose character listing is one letter, the longest text that fits is known
    independently (rendered); the drawn lengths must be uniform on 1..that length."""
    import pickle
    import shutil

    from augly.utils import FONTS_DIR

    from copynce_hf.pixtrace.steps import DrawContext

    font = tmp_path / "OneLetter.ttf"
    shutil.copy(os.path.join(FONTS_DIR, "NotoMono-Regular.ttf"), font)
    (tmp_path / "OneLetter.pkl").write_bytes(pickle.dumps([ord("W")]))
    size, font_size = (60, 80), 0.3
    pixels = int(60 * font_size)
    fitting = [n for n in range(1, 60) if _ink_fits("W" * n, str(font), pixels, size)]
    longest = max(fitting)
    assert fitting == list(range(1, longest + 1)) and 3 <= longest <= 10
    step = _authors_text(fonts=(str(font),), font_size=(font_size, font_size))
    rng = np.random.default_rng(3)
    lengths = [len(step.draw(DrawContext(rng, size))[0].text) for _ in range(80 * longest)]
    counts = np.bincount(lengths, minlength=longest + 1)
    assert counts[0] == 0 and len(counts) == longest + 1  # 1..longest, never more
    assert np.all(np.abs(counts[1:] - 80) < 4 * np.sqrt(80))  # uniform: 80 expected per length


def _ink_fits(text: str, font_path: str, pixels: int, size: tuple[int, int]) -> bool:
    """Whether ``text`` can be placed so that its ink lies inside the image with one pixel spare on the
    right and bottom (for Pillow's sub-pixel start), found by rendering it once at a known offset."""
    from PIL import ImageDraw, ImageFont

    canvas = Image.new("L", (size[1] * 4 + 200, size[0] * 4 + 200), 0)
    ImageDraw.Draw(canvas).text((100, 100), text, fill=255, font=ImageFont.truetype(font_path, pixels))
    rows, columns = np.nonzero(np.asarray(canvas))
    left, right = min(columns.min(), 100), columns.max() + 1
    top, bottom = min(rows.min(), 100), rows.max() + 1
    return right - left + 1 <= size[1] and bottom - top + 1 <= size[0]


@pytest.mark.parametrize("size", [(224, 224), (120, 400), (400, 90), (48, 48)])
def test_authors_text_lies_fully_inside_the_image_and_replays(size):
    from copynce_hf.pixtrace.edits.occluding import _font_path
    from copynce_hf.pixtrace.steps import DrawContext

    step = _authors_text()
    rng = np.random.default_rng(sum(size))
    image = textured_image(*size)
    for _ in range(15):
        edits = step.draw(DrawContext(rng, size))
        assert len(edits) == 1, "one character always fits these sizes"
        edit = edits[0]
        assert 1 <= len(edit.text) <= 100 and all(c.isprintable() for c in edit.text)
        pixels = max(1, int(min(size) * edit.font_size))
        everywhere, inside = _ink_columns_rows(edit.text, _font_path(edit.font), pixels,
                                               (edit.x * size[1], edit.y * size[0]), size)
        assert everywhere == inside > 0, (edit, size)
        result = replay(image, json.loads(json.dumps([edit.to_dict()])))
        assert_same_result(replay(image, [edit.to_dict()]), result)
        assert result.table.valid.all()  # covered="mapped": the authors' map keeps the pixels under the text
        untraced = replay(image, [dataclasses.replace(edit, covered="untraced").to_dict()])
        assert (~untraced.table.valid).sum() == (edit.coverage(*size) >= 128).sum()


def test_authors_text_form_checks_its_settings():
    with pytest.raises(ConfigError, match="form='sscd'"):
        _authors_text(form="sscd")
    with pytest.raises(ConfigError, match=r"length=\(3, 14\) with form='authors'"):
        _authors_text(length=(3, 14))
    with pytest.raises(ConfigError, match="fonts entry 'NoSuch.ttf'"):
        _authors_text(fonts=("*", "NoSuch.ttf"))
