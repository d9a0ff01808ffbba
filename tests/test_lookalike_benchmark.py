"""The look-alike benchmark (benchmarks/quality/lookalikes.py): its images are drawn from seeds, its photo textures come
from the evaluation splits only, and its rates count what they say."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED_DATA, SPLITS_CSV

from benchmarks.quality.lookalike_images import FAMILIES, KINDS, PHOTO_GROUPS, draw_image, photo_group_files
from benchmarks.quality.lookalikes import _entry, auc, detect_scores


@pytest.mark.parametrize("family", [family for family in FAMILIES if family not in PHOTO_GROUPS])
def test_a_family_draws_the_same_image_from_a_seed_and_another_from_another(family):
    first, again, other = (np.asarray(draw_image(family, np.random.default_rng(seed))) for seed in (3, 3, 4))
    assert first.shape == other.shape and first.dtype == np.uint8
    assert np.array_equal(first, again)
    assert np.abs(first.astype(int) - other.astype(int)).mean() > 5  # another drawing, not the same one shifted


@pytest.mark.shared_data
def test_photo_textures_come_from_the_evaluation_splits_only():
    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    from copynce_hf.evaluation.minidisc import read_splits

    splits = read_splits(SPLITS_CSV, SHARED_DATA / "imagenet-sample")
    groups = photo_group_files(SHARED_DATA / "imagenet-sample", splits["reference"] + splits["distractor"])
    assert list(groups) == list(PHOTO_GROUPS) == list(KINDS["photo texture"])
    files = [path for paths in groups.values() for path in paths]
    assert len(files) == len(set(files)) == 30 and not set(files) & set(splits["train"])
    crop = draw_image("fabric", np.random.default_rng(0), groups["fabric"][0])
    assert crop.size == (256, 256)
    with pytest.raises(FileNotFoundError, match="no evaluation image of the classes"):
        photo_group_files(SHARED_DATA, splits["reference"])  # the distractor-split classes are missing


def test_rates_count_look_alikes_and_copies_at_or_above_each_threshold():
    entry = _entry([0.2, 0.6, 0.99], [0.99, 0.999, 0.1, 0.7], [0.99, float("-inf"), 0.1, 0.7],
                   {"0.5": 0.5, "card": 0.98})
    assert entry["false_match"] == {"0.5": pytest.approx(2 / 3), "card": pytest.approx(1 / 3)}
    assert entry["found"] == {"0.5": 0.5, "card": 0.25}  # the copy ranked below a wrong reference is not found
    assert entry["negative_scores"][2] == 0.99 and entry["positive_scores"][2] == 0.1  # the max, the min
    assert auc([1.0, 0.5], [0.5, 0.0]) == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert auc([], [0.3]) is None


def test_a_query_scores_its_best_prediction_and_finds_its_reference_only_first(tmp_path):
    (tmp_path / "detect").mkdir()
    (tmp_path / "detect" / "predictions.csv").write_text(
        "query_id,reference_id,score\nQ0,grass-0,0.99\nQ0,grass-1,0.5\nQ1,photo-a,0.4\nQ1,photo-b,0.8\n")
    truth = {"images": {"grass-0": {"family": "grass"}, "grass-1": {"family": "grass"}, "grass-4": {"family": "grass"},
                        "photo-a": {"family": None}, "photo-b": {"family": None}},
             "queries": {"Q0": {"role": "look-alike", "reference": None, "kind": "procedural texture",
                                "source": "grass-4"},
                         "Q1": {"role": "copy", "reference": "photo-a", "kind": "photo", "source": "photo-a"},
                         "Q2": {"role": "copy", "reference": "photo-b", "kind": "photo", "source": "photo-b"}}}
    rows = {row["query"]: row for row in detect_scores(tmp_path, truth)}
    assert rows["Q0"]["score"] == 0.99 and rows["Q0"]["top_family"] == rows["Q0"]["family"] == "grass"
    assert rows["Q1"]["score"] == 0.8 and not rows["Q1"]["correct"]  # photo-b came first
    assert rows["Q2"]["score"] == float("-inf") and rows["Q2"]["top"] is None  # no prediction at all


@pytest.mark.shared_data
def test_descriptors_compared_on_a_draw_score_each_model_once(tmp_path, monkeypatch):
    """``--descriptors``: a model scores the draw's pairs by cosine, summed per kind of image; a rerun reads the scores
    back instead of scoring again, and a model given anew under that name is scored again. (A small draw: 4 images
    per family, 4 photos.)"""
    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    from benchmarks.quality import lookalikes

    monkeypatch.setattr(lookalikes, "PER_FAMILY", 4)
    monkeypatch.setattr(lookalikes, "PHOTOS", 4)
    monkeypatch.setattr(lookalikes, "DISTRACTORS", 2)
    models = {"embedded": "embedded"}
    result = lookalikes.compare_descriptors(tmp_path, 0, models)
    summary = result["summary"]
    pairs = json.loads((tmp_path / "draw-0" / "descriptors.json").read_text())["embedded"]["pairs"]
    drawings = [p["cosine"] for p in pairs if p["kind"] == "drawing" and p["role"] == "look-alike"]
    assert len(drawings) == 3 * 6  # three drawing families, 4 images each: 6 pairs
    assert summary["embedded/drawing"]["negative_median"] == pytest.approx(float(np.median(drawings)))
    assert summary["embedded/photo"]["auc"] is None and summary["embedded/photo"]["positive_median"] > 0
    assert 0 <= summary["embedded/procedural texture"]["auc"] <= 1

    def no_scoring(*args, **kwargs):
        raise AssertionError("scored again")

    monkeypatch.setattr(lookalikes, "score_pairs", no_scoring)
    assert lookalikes.compare_descriptors(tmp_path, 0, models)["summary"] == summary
    with pytest.raises(AssertionError, match="scored again"):
        lookalikes.compare_descriptors(tmp_path, 0, {"embedded": "onnx:other.onnx"})
    table = lookalikes.descriptor_table([result], list(models))
    assert table.count("| embedded |") == len(KINDS) + 2


def test_descriptors_named_wrongly_are_refused():
    from benchmarks.quality.lookalikes import main

    with pytest.raises(SystemExit, match="'noequals' is not NAME=MODEL"):
        main(["--descriptors", "noequals"])


def test_a_calibration_planted_with_another_recipe_is_made_again(tmp_path, monkeypatch):
    """A draw folder's ``calibration.json`` is reused only when its copies were planted with the recipe ``copynce
    calibrate`` plants now (name and steps): one planted with mini-DISC's recipe is calibrated again, and detect run
    again with it."""
    from benchmarks.quality import lookalikes
    from copynce_hf.pixtrace import CopyRecipe

    ran = []

    def copynce(*argv, log):
        ran.append(argv[0])
        if argv[0] == "calibrate":
            provenance = {"recipe_name": "calibration_copies", "recipe": CopyRecipe.calibration_copies().to_dict()}
            (tmp_path / "calibration.json").write_text(json.dumps({"stages": {"descriptor": [
                {"precision": 0.9, "threshold": 0.5}]}, "provenance": provenance}))
        else:
            (tmp_path / "detect").mkdir(exist_ok=True)
            (tmp_path / "detect" / "scores.json").write_text("{}")

    monkeypatch.setattr(lookalikes, "copynce", copynce)
    stale = {"recipe_name": "minidisc_queries", "recipe": CopyRecipe.minidisc_queries().to_dict()}
    (tmp_path / "calibration.json").write_text(json.dumps({"stages": {}, "provenance": stale}))
    (tmp_path / "detect").mkdir()
    (tmp_path / "detect" / "scores.json").write_text("{}")
    assert lookalikes.run_detect(tmp_path)["calibrated"] == {"descriptor": {"precision": 0.9, "threshold": 0.5}}
    assert ran == ["calibrate", "detect"]
    lookalikes.run_detect(tmp_path)  # planted as now: both kept
    assert ran == ["calibrate", "detect"]
