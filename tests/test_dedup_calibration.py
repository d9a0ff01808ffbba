"""``copynce dedup``'s self-calibrated default threshold: the calibration collection made from the collection, the dedup
run's verified pairs labelled by provenance, the threshold rule (checked again from the saved file), where the threshold comes from in the log and the report, the options
that override it, determinism, reuse, and collections smaller than the sample."""

from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest
from conftest import run_cli, save_tiny_models, tiny_models
from PIL import Image

from copynce_hf.calibration.collection import (
    FILE_NAME,
    FOLDER,
    choose_threshold,
    self_calibrate,
)
from copynce_hf.calibration.synthetic import (
    COPY_KINDS,
    NON_COPY_KINDS,
    TEMPLATE_GROUP,
    pair_kind,
    synthetic_set,
)
from copynce_hf.modeling.errors import PredictionsError
from copynce_hf.retrieval import (
    Descriptor,
    DetectConfig,
    ImageFolderSource,
    ImageListSource,
    connected_groups,
)
from copynce_hf.retrieval.deduplication.collection import dedup
from copynce_hf.retrieval.deduplication.settings import DedupSettings


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """10 random 64x72 images, of which R1 is copied byte for byte once (R1_again)."""
    folder = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(0)
    for i in range(9):
        Image.fromarray(rng.integers(0, 255, (64, 72, 3), dtype=np.uint8)).save(folder / f"R{i}.png")
    shutil.copy(folder / "R1.png", folder / "R1_again.png")
    return folder


def test_choose_threshold_takes_the_lowest_score_reaching_the_weighted_precision():
    is_copy = [True, True, False, True, False, True]
    scores = [0.9, 0.8, 0.75, 0.7, 0.3, 0.2]
    # at 0.7: 3 copies, 1 non-copy: precision 3/4 with weight 1, 3/5 with weight 2
    choice = choose_threshold(is_copy, scores, 1.0, 0.75)
    assert (choice.threshold, choice.precision, choice.recall, choice.reached) == (0.7, 0.75, 0.75, True)
    assert choose_threshold(is_copy, scores, 2.0, 0.75).threshold == 0.8
    assert choose_threshold(is_copy, scores, 1.0, 1.0).threshold == 0.8
    assert choose_threshold(is_copy, scores, 0.0, 0.9).threshold == 0.2  # no weight: every copy kept
    # unreachable: the non-copy outscores every copy; the best precision (0.5, then the most recall) is taken
    choice = choose_threshold([False, True, True], [0.9, 0.5, 0.5], 1.0, 0.9)
    assert (choice.threshold, choice.precision, choice.recall, choice.reached) == (0.5, pytest.approx(2 / 3), 1.0,
                                                                                   False)
    # a tie between a copy and a non-copy is one threshold, both kept
    tie = choose_threshold([True, False, False], [0.6, 0.6, 0.1], 1.0, 0.9)
    assert (tie.threshold, tie.precision, tie.reached) == (0.6, 0.5, False)
    # copies never scored count in the recall only
    missed = choose_threshold(is_copy, scores, 1.0, 0.75, positives=8)
    assert (missed.threshold, missed.precision, missed.recall) == (0.7, 0.75, 3 / 8)
    with pytest.raises(PredictionsError, match="no copy pair"):
        choose_threshold([False], [0.3], 1.0, 0.9)


def test_the_synthetic_set_holds_copies_templated_copies_and_template_sharing_non_copies(collection):
    source = ImageFolderSource(collection)
    made = synthetic_set(source, 7, seed=0)
    assert len(made.sample) == 7 and len(set(made.sample)) == 7 and set(made.sample) <= set(source.ids)
    kinds = [pair.kind for pair in made.pairs]
    assert {kind: kinds.count(kind) for kind in COPY_KINDS} == {"copy": 7, "template copy": 7, "copy of copy": 7}
    groups: dict[int, list[int]] = {}
    for i in range(7):
        groups.setdefault(made.records[f"{i:04d}:template"]["template"]["group"], []).append(i)
    # groups of TEMPLATE_GROUP images (7 = 3 + 4: a last group of one joins the one before)
    assert sorted(map(len, groups.values())) == [TEMPLATE_GROUP, TEMPLATE_GROUP + 1]
    shared = [pair for pair in made.pairs if pair.kind == "shared template"]
    assert len(shared) == sum(math.comb(len(group), 2) for group in groups.values())
    for pair in shared:  # two different sampled images in the same template
        a, b = (made.records[image] for image in (pair.query, pair.reference))
        assert a["of"] != b["of"] and a["template"] == b["template"] and a["edits"] and b["edits"]
    for pair in made.pairs:
        if pair.kind in COPY_KINDS:  # both sides made from the same sampled image
            assert made.records[pair.query]["of"] == made.records[pair.reference]["of"]
    assert all(made.records[f"{i:04d}:copy1"]["edits"] for i in range(7))
    for pair in made.pairs:  # the kind of any two synthetic images comes from their records
        assert pair_kind(made.records, pair.query, pair.reference) == pair.kind
    assert pair_kind(made.records, "0002:copy2", "0002:copy1") == "copy of copy"
    assert pair_kind(made.records, "0002:copy2", "0002:template") == "template copy"
    assert pair_kind(made.records, "0002:original", "0002:copy2") == "copy"
    other = next(i for i in range(7) if made.records[f"{i:04d}:template"]["template"]["group"]
                 != made.records["0000:template"]["template"]["group"])
    assert pair_kind(made.records, "0000:template", f"{other:04d}:template") == "other image"
    assert pair_kind(made.records, "0000:copy1", f"{other:04d}:original") == "other image"
    again = synthetic_set(source, 7, seed=0)
    assert again.sample == made.sample and again.records == made.records
    assert synthetic_set(source, 7, seed=1).sample != made.sample
    assert len(synthetic_set(source, 64, seed=0).sample) == len(source)  # a collection smaller than the sample


def _precision(rows: list[dict], threshold: float) -> float:
    kept = [row for row in rows if row["score"] >= threshold]
    return sum(row["copy"] for row in kept) / len(kept)


def check_saved_choice(saved: dict) -> None:
    """The saved threshold follows the rule, recomputed from the saved pairs alone: the lowest decision score whose
    verified pairs at or above it reach the target precision (no weighting), else the best precision reached; the
    recall counts the true pairs never verified too."""
    rows, target, counts = saved["pairs"], saved["target_precision"], saved["counts"]
    copies = sum(row["copy"] for row in rows)
    assert all(row["copy"] == (row["kind"] in COPY_KINDS) and row["kind"] in (*COPY_KINDS, *NON_COPY_KINDS)
               for row in rows)
    assert all(row["copy"] == (saved["images"][row["query"]]["of"] == saved["images"][row["reference"]]["of"])
               for row in rows)  # labelled by provenance
    assert counts["copy_pairs"] == copies and counts["non_copy_pairs"] == len(rows) - copies
    assert counts["missed_true_pairs"] == counts["true_pairs"] - copies >= 0
    precisions = {score: _precision(rows, score) for score in {row["score"] for row in rows}
                  if any(r["copy"] and r["score"] >= score for r in rows)}
    threshold = saved["threshold"]
    assert threshold in precisions and saved["precision"] == pytest.approx(precisions[threshold])
    assert saved["recall"] == pytest.approx(sum(r["copy"] and r["score"] >= threshold for r in rows)
                                            / counts["true_pairs"])
    if saved["reached"]:
        assert precisions[threshold] >= target
        assert all(p < target for score, p in precisions.items() if score < threshold)
    else:
        assert all(p < target for p in precisions.values())
        assert precisions[threshold] == max(precisions.values())


@pytest.mark.parametrize("with_matcher", [False, True])
def test_the_self_calibrated_threshold_follows_its_rule_on_its_saved_pairs(collection, tmp_path, with_matcher):
    """The saved pairs are the verified pairs of a dedup run on the calibration collection, with that run's decision
    scores (collection-normalised, the scale the run thresholds), and the threshold follows its rule on them."""
    descriptor, matcher, processor = tiny_models(0)
    models = (Descriptor("tiny", descriptor, processor), (matcher, processor) if with_matcher else None)
    settings = DedupSettings(matcher_anchor=-20.0)  # every matcher background discounted: the tiny one scores low
    lines: list[str] = []
    made = self_calibrate(ImageFolderSource(collection), *models, DetectConfig(candidates=4), folder=tmp_path,
                          progress=False, log=lines.append, settings=settings)
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved["threshold"] == made.threshold and "unweighted" in saved["class_ratio"]
    check_saved_choice(saved)
    # the same pairs and decision scores as dedup itself on the calibration collection
    calibration = synthetic_set(ImageFolderSource(collection), 64, seed=0)
    images = ImageListSource(list(calibration.images), list(calibration.images.values()))
    found = dedup(images, *models, 0.5, DetectConfig(candidates=4), progress=False, log=lambda line: None,
                  settings=settings)
    assert {(p.query_id, p.reference_id): p.score for p in found.pairs} == pytest.approx(
        {(row["query"], row["reference"]): row["score"] for row in saved["pairs"]})
    assert any(row["score"] != row["raw_score"] for row in saved["pairs"])  # normalised, not raw
    counts = saved["counts"]
    assert counts["images"] == 10 and counts["true_pairs"] == 60  # 4 images per sampled image: 6 pairs each
    assert counts["shared template"] == sum(row["kind"] == "shared template" for row in saved["pairs"])
    assert lines[-1].startswith(f"self-calibrated on 10 images of this collection ({counts['copy_pairs']} positive "
                                f"and {counts['non_copy_pairs']} negative verified pairs, {counts['shared template']} "
                                "of them template-sharing): ")
    assert f"threshold {made.threshold:.4g}" in lines[-1]
    assert f"the candidates missed {counts['missed_true_pairs']} of the 60 true pairs" in lines[-1]
    assert ("aims at precision 0.9 (measured recall" in lines[-1]) == saved["reached"]


def test_the_threshold_reaches_the_precision_when_a_model_tells_copies_apart(tmp_path):
    """The embedded models on the bundled images: the target is reached on the calibration collection's verified
    pairs, checked again from the saved file."""
    from conftest import shrunk_asset_images

    from copynce_hf.runtime.loading import load_model

    folder = tmp_path / "images"
    folder.mkdir()
    shrunk_asset_images(folder, 160)
    descriptor = Descriptor("embedded", *load_model(None, "descriptor", "--model"))
    made = self_calibrate(ImageFolderSource(folder), descriptor, None, DetectConfig(candidates=5),
                          folder=tmp_path / "calibration", precision=0.8, progress=False)
    saved = json.loads((tmp_path / "calibration" / FILE_NAME).read_text())
    check_saved_choice(saved)
    assert made.choice.reached and saved["reached"] and saved["precision"] >= 0.8


def test_self_calibration_is_deterministic_with_its_seed(collection):
    descriptor, _, processor = tiny_models(0)
    runs = [self_calibrate(ImageFolderSource(collection), Descriptor("tiny", descriptor, processor), None,
                           DetectConfig(candidates=3), sample=6, seed=seed, progress=False, log=lambda line: None)
            for seed in (0, 0, 1)]
    same, other = ([(p.query, p.reference, p.kind, p.score) for p in run.pairs] for run in runs[1:])
    assert [(p.query, p.reference, p.kind, p.score) for p in runs[0].pairs] == same
    assert runs[0].sample == runs[1].sample and runs[0].threshold == runs[1].threshold
    assert runs[2].sample != runs[0].sample and other != same


def _groups(output) -> list[list[str]]:
    with (output / "groups.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["group_id"], []).append(row["image_id"])
    return list(found.values())


def test_copynce_dedup_without_a_threshold_self_calibrates_and_says_so(collection, tmp_path, capsys):
    from copynce_hf.cli import main

    before = sorted(path.name for path in collection.iterdir())
    models = save_tiny_models(tmp_path / "models", seed=0)
    args = ["dedup", str(collection), "--model", models["descriptor"], "--matcher", "none", "--candidates", "3",
            "--grouping", "connected"]  # the grouping does not change the self-calibration
    output = tmp_path / "found"
    assert main([*args, "--output", str(output)]) == 0  # --matcher none: no longer refused without a threshold
    err = capsys.readouterr().err
    saved = json.loads((output / FOLDER / FILE_NAME).read_text())
    check_saved_choice(saved)
    assert f"copynce dedup: {saved['origin']}" in err.splitlines()
    assert saved["origin"].startswith("self-calibrated on 10 images of this collection (")
    report = (output / "report.html").read_text()
    assert saved["origin"] in report and str(output / FOLDER / FILE_NAME) in report
    with (output / "pairs.csv").open(newline="") as handle:  # the groups are those of the self-calibrated threshold
        edges = [(row["query_id"], row["reference_id"]) for row in csv.DictReader(handle)
                 if float(row["score"]) >= saved["threshold"]]
    assert _groups(output) == connected_groups(ImageFolderSource(collection).ids, edges)
    assert sorted(path.name for path in collection.iterdir()) == before  # nothing written into the collection

    # a rerun reuses the scored pairs; another --precision chooses again from them
    assert main([*args, "--precision", "0.5", "--output", str(output)]) == 0
    err = capsys.readouterr().err
    again = json.loads((output / FOLDER / FILE_NAME).read_text())
    assert "reusing the verified pairs" in err and again["pairs"] == saved["pairs"]
    assert again["target_precision"] == 0.5
    check_saved_choice(again)


def test_a_given_threshold_or_calibration_overrides_the_self_calibration(collection, tmp_path, capsys):
    from copynce_hf.calibration.thresholds import Calibration, OperatingPoint, model_identity

    models = save_tiny_models(tmp_path / "models", seed=0)
    args = ("dedup", collection, "--model", models["descriptor"], "--matcher", "none")
    code, _, err = run_cli(capsys, *args, "--threshold", 0.9999, "--output", tmp_path / "given")
    assert code == 0, err
    assert not (tmp_path / "given" / FOLDER).exists()
    assert "0.9999 (given)" in (tmp_path / "given" / "report.html").read_text()
    pipeline = {"descriptors": [model_identity(models["descriptor"], "descriptor")], "matcher": None,
                "preset": "fast", "settings": {"descriptor_lce": "none", "matcher_lce": "none",
                                               "score_normalisation": False}}
    Calibration(pipeline, {"descriptor": [OperatingPoint(0.9, 0.9999, 0.5)]}).save(tmp_path / "calibration.json")
    code, _, err = run_cli(capsys, *args, "--calibration", tmp_path / "calibration.json", "--collection-normalisation",
                           "off", "--output", tmp_path / "file")
    assert code == 0, err
    assert not (tmp_path / "file" / FOLDER).exists()
    assert "descriptor score 0.9999 at precision 0.9 in" in (tmp_path / "file" / "report.html").read_text()
    code, _, err = run_cli(capsys, *args, "--threshold", 0.5, "--precision", 0.9, "--output", tmp_path / "x")
    assert code == 2 and "give one of them" in err
    code, _, err = run_cli(capsys, *args, "--precision", 1.5, "--output", tmp_path / "x")
    assert code == 2 and "--precision must be in (0, 1], got 1.5" in err and not (tmp_path / "x").exists()


def test_a_collection_of_two_images_self_calibrates_with_the_matcher(collection, tmp_path, capsys):
    models = save_tiny_models(tmp_path / "models", seed=0)
    pair = tmp_path / "pair"
    pair.mkdir()
    for name in ("R0.png", "R2.png"):
        shutil.copy(collection / name, pair / name)
    code, _, err = run_cli(capsys, "dedup", pair, "--model", models["descriptor"], "--matcher", models["matcher"],
                           "--self-calibration-sample", 5, "--output", tmp_path / "found")
    assert code == 0, err
    saved = json.loads((tmp_path / "found" / FOLDER / FILE_NAME).read_text())
    assert saved["counts"]["images"] == 2 and saved["counts"]["true_pairs"] == 12
    check_saved_choice(saved)
