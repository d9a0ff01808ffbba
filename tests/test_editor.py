"""CopyEditor and CopyRecipe: reproducible, replayable random copies whose tables are right."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from _oracles import bilinear
from conftest import shared_split
from PIL import Image

from copynce_hf.images import load_image
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import (
    CoordinateTable,
    CopyEditor,
    CopyRecipe,
    pair_overlaps,
    pair_tables,
    replay,
)
from copynce_hf.pixtrace.edits import EDIT_REGISTRY

PATCH = 16
MODEL_SIZE = (224, 224)


def textured_image(height: int = 150, width: int = 200, seed: int = 0) -> Image.Image:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    rng = np.random.default_rng(seed)
    base = np.stack([128 + 90 * np.sin(xs / 11.0), 128 + 90 * np.cos(ys / 13.0), 128 + 60 * np.sin((xs - ys) / 7.0)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8), "RGB")


def all_steps_on() -> CopyRecipe:
    recipe = CopyRecipe.training()
    return recipe.with_probability(1.0)


def assert_same_result(first, second):
    assert first.edits == second.edits
    np.testing.assert_array_equal(np.asarray(first.image), np.asarray(second.image))
    assert first.table.size == second.table.size and first.table.source_size == second.table.source_size
    np.testing.assert_array_equal(first.table.coords, second.table.coords)  # NaN in the same places too


# ---------------------------------------------------------------------- reproducibility and replay


def test_same_seed_same_copies_and_different_seeds_differ():
    image = textured_image()
    first, second = CopyEditor(seed=7), CopyEditor(seed=7)
    for _ in range(4):
        assert_same_result(first(image), second(image))
    drawn = [json.dumps(CopyEditor(seed=s)(image).edits) for s in range(6)]
    assert len(set(drawn)) == 6


def test_per_call_seed_ignores_history_but_depends_on_editor_seed():
    image = textured_image()
    editor = CopyEditor(seed=3)
    expected = editor(image, seed=11)
    editor(image)
    editor(image, seed=12)
    assert_same_result(editor(image, seed=11), expected)
    assert_same_result(CopyEditor(seed=3)(image, seed=11), expected)
    assert CopyEditor(seed=4)(image, seed=11).edits != expected.edits
    assert_same_result(editor(image, seed=(2, 5)), CopyEditor(seed=3)(image, seed=(2, 5)))


@pytest.mark.parametrize("fuse", [True, False])
def test_replay_of_the_json_recipe_is_exact(fuse):
    image = textured_image()
    editor = CopyEditor(seed=0, recipe=all_steps_on(), output_size=(96, 128), fuse=fuse)
    for k in range(3):
        result = editor(image, seed=k)
        edits = json.loads(json.dumps(result.edits))
        assert_same_result(replay(image, edits, fuse=fuse), result)


@pytest.mark.parametrize("recipe", [all_steps_on(), CopyRecipe.paper_descriptor(), CopyRecipe.paper_matcher()])
def test_draw_gives_the_chain_the_call_applies(recipe):
    image = textured_image()
    for fuse in (True, False):
        editor = CopyEditor(seed=5, recipe=recipe, output_size=(64, 64), fuse=fuse)
        for k in range(4):
            drawn = [edit.to_dict() for edit in editor.draw((image.height, image.width), seed=k)]
            assert drawn == editor(image, seed=k).edits
    # Without a per-call seed both draw from the editor's own generator, in turn.
    drawing, editing = (CopyEditor(seed=9, recipe=recipe) for _ in range(2))
    for _ in range(3):
        assert [edit.to_dict() for edit in drawing.draw((150, 200))] == editing(image).edits
    with pytest.raises(ConfigError, match="per-call seed"):
        drawing.draw((150, 200), seed=-1)


def test_every_step_of_the_recipe_draws_a_working_edit():
    image = textured_image()
    editor = CopyEditor(seed=1, recipe=all_steps_on(), output_size=MODEL_SIZE)
    seen = set()
    for k in range(3):
        result = editor(image, seed=k)
        names = [d["name"] for d in result.edits]
        seen.update(names)
        assert names[-1] == "resize" and result.image.size == (224, 224) and result.table.size == MODEL_SIZE
        assert result.table.source_size == (150, 200)
        assert 0.0 < result.table.traced_fraction < 1.0
        assert set(names) <= set(EDIT_REGISTRY)
    expected = {"crop", "hflip", "vflip", "affine", "perspective", "color_jitter", "grayscale", "blur",
                "overlay_onto_background", "pad", "overlay_text", "overlay_emoji", "overlay_image",
                "overlay_stripes", "random_erasing", "jpeg_quality", "pixelization", "shuffle_pixels", "noise"}
    assert expected <= seen


def test_image_pool_files_serve_as_backgrounds_and_overlays(tmp_path):
    pool = []
    for i in range(2):
        path = tmp_path / f"pool{i}.png"
        textured_image(120, 180, seed=10 + i).save(path)
        pool.append(path)
    recipe = CopyRecipe.off().replace(
        onto_background=dataclasses.replace(CopyRecipe.training().onto_background, p=1.0),
        overlay_image=dataclasses.replace(CopyRecipe.training().overlay_image, p=1.0),
    )
    result = CopyEditor(seed=2, recipe=recipe, image_pool=pool)(textured_image())
    specs = [d["params"].get("background") or d["params"].get("overlay") for d in result.edits]
    assert [d["name"] for d in result.edits] == ["overlay_onto_background", "overlay_image"]
    assert all(spec["kind"] == "file" and spec["path"] in {str(p) for p in pool} for spec in specs)
    assert result.image.size == (180, 120)  # the background's size
    again = replay(textured_image(), json.loads(json.dumps(result.edits)), fuse=False)  # off() renders edit by edit
    assert_same_result(again, result)
    with pytest.raises(ConfigError, match="image_pool"):
        CopyEditor(image_pool=[tmp_path / "missing.png"])


def test_changing_one_step_leaves_the_other_draws_alone():
    image = textured_image()
    base = CopyRecipe.training()
    changed = base.replace(grayscale=dataclasses.replace(base.grayscale, p=1.0))
    for k in range(5):
        first = [d for d in CopyEditor(seed=9, recipe=base)(image, seed=k).edits if d["name"] != "grayscale"]
        second = [d for d in CopyEditor(seed=9, recipe=changed)(image, seed=k).edits if d["name"] != "grayscale"]
        assert first == second


# ---------------------------------------------------------------------- the recipe object


def test_recipe_round_trips_through_json_and_users_can_change_it():
    recipe = CopyRecipe.training()
    data = json.loads(json.dumps(recipe.to_dict()))
    assert CopyRecipe.from_dict(data) == recipe
    data["steps"]["blur"]["p"] = 0.9
    data["steps"]["overlay_text"]["fonts"] = ["Ubuntu-B.ttf"]
    changed = CopyRecipe.from_dict(data)
    assert changed.blur.p == 0.9 and changed.overlay_text.fonts == ("Ubuntu-B.ttf",)
    assert CopyRecipe.training().updated({"jpeg": {"p": 1.0}}).jpeg.quality == recipe.jpeg.quality
    assert CopyEditor(recipe=data).recipe == changed


@pytest.mark.parametrize(
    "data, key",
    [
        ({"sharpen_more": {"p": 0.1}}, "sharpen_more"),
        ({"blur": {"sigma": 1.0}}, "blur.sigma"),
        ({"blur": {"p": 1.5}}, "p"),
        ({"blur": {"radius": [0.01, 0.001]}}, "radius"),
        ({"jpeg": {"quality": [10]}}, "quality"),
        ({"color_jitter": {"hue": 0.9}}, "hue"),
        ({"overlay_text": {"fonts": []}}, "fonts"),
        ({"overlay_text": {"fonts": ["NoSuchFont.ttf"]}}, "fonts"),
    ],
)
def test_bad_recipe_values_are_refused_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        CopyRecipe.training().updated(data)


def test_bad_editor_arguments_are_refused():
    with pytest.raises(ConfigError, match="output_size"):
        CopyEditor(output_size=(224, 0))
    with pytest.raises(ConfigError, match="seed"):
        CopyEditor(seed=-1)
    with pytest.raises(ConfigError, match="seed"):
        CopyEditor(seed=0)(textured_image(), seed=-3)


def test_light_recipe_is_only_the_resize():
    image = textured_image()
    result = CopyEditor(seed=0, recipe=CopyRecipe.off(), output_size=MODEL_SIZE)(image)
    assert [d["name"] for d in result.edits] == ["resize"]
    expected = CoordinateTable.identity(150, 200).resize(*MODEL_SIZE)
    np.testing.assert_allclose(result.table.coords, expected.coords, atol=1e-5)
    assert CopyEditor(seed=0, recipe=CopyRecipe.off())(image).edits == []


# ---------------------------------------------------------------------- density of the pair priors


def test_unedited_query_overlap_rows_sum_to_one():
    original = textured_image(375, 500)
    light = CopyEditor(seed=0, recipe=CopyRecipe.off(), output_size=MODEL_SIZE)
    query, reference = light(original), light(original)
    overlap_qr, overlap_rq = pair_overlaps(query.table, reference.table, PATCH)
    assert overlap_qr.shape == (196, 196)
    np.testing.assert_allclose(overlap_qr.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(overlap_rq.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(overlap_qr, np.eye(196), atol=1e-6)


@pytest.mark.parametrize("area", [0.25, 0.5, 0.8])
def test_cropped_query_traces_about_its_area_fraction_of_the_reference(area):
    original = textured_image(375, 500)
    crop = dataclasses.replace(CopyRecipe.off().random_resized_crop, p=1.0, scale=(area, area), ratio=(4 / 3, 4 / 3))
    query = CopyEditor(seed=1, recipe=CopyRecipe.off().replace(random_resized_crop=crop),
                       output_size=MODEL_SIZE)(original)
    reference = CopyEditor(recipe=CopyRecipe.off(), output_size=MODEL_SIZE)(original)
    table_qr, table_rq = pair_tables(query.table, reference.table)
    # Every query pixel shows the original, so all are traced into the reference ...
    assert table_qr.traced_fraction > 0.99
    # ... and the reference shows the crop on about `area` of its pixels.
    assert abs(table_rq.traced_fraction - area) < 0.02
    overlap_qr, overlap_rq = pair_overlaps(query.table, reference.table, PATCH)
    assert np.all(overlap_qr.sum(axis=1) > 0.99)
    assert abs(overlap_rq.sum() / overlap_rq.shape[0] - area) < 0.02


def test_training_pairs_have_priors_consistent_with_their_tables():
    original = textured_image(375, 500)
    editor = CopyEditor(seed=5, output_size=MODEL_SIZE)
    reference = CopyEditor(recipe=CopyRecipe.off(), output_size=MODEL_SIZE)(original)
    for k in range(4):
        query = editor(original, seed=k)
        table_qr, _ = pair_tables(query.table, reference.table)
        overlap_qr, _ = pair_overlaps(query.table, reference.table, PATCH)
        assert overlap_qr.sum(axis=1).max() <= 1.0 + 1e-6
        # Traced query pixels all land inside the reference (it shows the whole original).
        assert abs(overlap_qr.sum() / overlap_qr.shape[0] - table_qr.traced_fraction) < 1e-3
        assert abs(table_qr.traced_fraction - query.table.traced_fraction) < 0.01


# ---------------------------------------------------------------------- content oracle on natural images


def _ncc(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    return float((a * b).sum() / max(np.sqrt((a * a).sum() * (b * b).sum()), 1e-9))


def content_scores(editor: CopyEditor, paths, draws: int, stride: int, side: int, min_valid: int):
    """NCC of the edited luminance with the original's at the traced positions, and with shuffled positions,
    over ``draws`` copies of originals shrunk to ``side`` (copies with fewer traced pixels are skipped)."""
    rng = np.random.default_rng(0)
    scores, shuffled_scores = [], []
    for k in range(draws):
        original = load_image(paths[(k * stride) % len(paths)])
        original.thumbnail((side, side), Image.BILINEAR)
        result = editor(original, seed=k)
        valid = result.table.valid
        if valid.sum() < min_valid:  # almost everything covered: nothing to correlate
            continue
        y, x = result.table.coords[valid].astype(np.float64).T
        edited = np.asarray(result.image.convert("L"), dtype=np.float64)[valid]
        source = np.asarray(original.convert("L"), dtype=np.float64)
        scores.append(_ncc(edited, bilinear(source, y, x)))
        order = rng.permutation(y.size)
        shuffled_scores.append(_ncc(edited, bilinear(source, y[order], x[order])))
    return scores, shuffled_scores


@pytest.mark.shared_data
def test_content_oracle_on_natural_images():
    """Edited luminance correlates with the original's at the traced positions, and not when shuffled."""
    editor = CopyEditor(seed=2024, recipe=CopyRecipe.training(), output_size=MODEL_SIZE)
    scores, shuffled_scores = content_scores(editor, shared_split("train"), 60, 7, 256, 500)
    assert len(scores) >= 50
    assert np.median(scores) >= 0.85
    assert np.median(shuffled_scores) < 0.3
