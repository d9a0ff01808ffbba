"""Calibrated thresholds: the calibration file (round trip, refusals) and how thresholds are chosen."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from copynce_hf.calibration.thresholds import (
    Calibration,
    Decision,
    OperatingPoint,
    copies_needed,
    decision_rates,
    model_identity,
    operating_points,
    pipeline_identity,
    unresolved_precisions,
)
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import CopyRecipe
from copynce_hf.retrieval.detection.config import DetectConfig
from copynce_hf.retrieval.presets import CollectionNormalisation


def _pipeline(matcher="embedded:matcher", preset="fast", score_normalisation=False, **overrides):
    config = DetectConfig.from_preset(preset, **overrides)
    return pipeline_identity(["embedded:descriptor"], matcher, preset, config, score_normalisation)


def _calibration(**pipeline):
    stages = {"descriptor": [OperatingPoint(0.9, 0.4, 0.8), OperatingPoint(0.95, 0.5, 0.6),
                             OperatingPoint(0.99, None, 0.0)],
              "matcher": [OperatingPoint(0.9, 0.3, 0.9), OperatingPoint(0.95, 0.6, 0.85),
                          OperatingPoint(0.99, 0.9, 0.5)]}
    return Calibration(_pipeline(**pipeline), stages, {"seed": 3, "sample_ids": ["a", "b"]})


def test_operating_points_by_hand():
    # pooled by score: 0.9 copy, 0.8 copy, 0.7 not, 0.6 copy, 0.5 not; 4 copies exist (one never predicted)
    is_copy = [True, False, True, True, False]
    scores = [0.9, 0.7, 0.8, 0.6, 0.5]
    points = operating_points(is_copy, scores, 4, precisions=(0.7, 0.9, 1.0))
    assert points == [OperatingPoint(0.7, 0.6, 0.75), OperatingPoint(0.9, 0.8, 0.5), OperatingPoint(1.0, 0.8, 0.5)]
    assert decision_rates(is_copy, scores, 4, 0.6) == (0.75, 0.75)
    assert decision_rates(is_copy, scores, 4, None) == (None, 0.0)
    # no rank reaches the precision: no threshold, recall 0
    assert operating_points([False, True], [0.9, 0.8], 1, precisions=(0.9,)) == [OperatingPoint(0.9, None, 0.0)]


def test_operating_points_are_monotone_in_precision():
    rng = np.random.default_rng(0)
    is_copy = rng.random(400) < 0.4
    scores = np.where(is_copy, rng.normal(0.7, 0.15, 400), rng.normal(0.4, 0.15, 400))
    points = operating_points(is_copy, scores, int(is_copy.sum()) + 10, precisions=(0.8, 0.9, 0.95, 0.99))
    thresholds = [p.threshold for p in points if p.threshold is not None]
    recalls = [p.recall for p in points]
    assert len(thresholds) >= 3
    assert thresholds == sorted(thresholds) and recalls == sorted(recalls, reverse=True)
    for point in points:  # the decision at each threshold really gives at least that precision
        if point.threshold is not None:
            precision, recall = decision_rates(is_copy, scores, int(is_copy.sum()) + 10, point.threshold)
            assert precision >= point.precision and recall == pytest.approx(point.recall)


def test_a_small_sample_cannot_tell_high_precisions_apart_and_calibrate_says_so():
    from copynce_hf.runs.calibrate import format_calibration

    assert [copies_needed(p) for p in (0.5, 0.9, 0.95, 0.99, 1.0)] == [1, 9, 19, 99, 0]
    # 15 copies, pooled by decreasing score: 12 copies, a distractor, the 3 other copies, 10 distractors
    is_copy = [True] * 12 + [False] + [True] * 3 + [False] * 10
    scores = list(np.linspace(1.0, 0.0, len(is_copy)))
    points = operating_points(is_copy, scores, 15, precisions=(0.9, 0.95, 0.99, 1.0))
    assert [(p.threshold == points[3].threshold, p.recall) for p in points] == [
        (False, 1.0), (True, 0.8), (True, 0.8), (True, 0.8)]  # 15 / 16 reaches 0.9, not 0.95
    assert unresolved_precisions(points[:3], 15) == [(points[1], 12), (points[2], 12)]
    table = format_calibration(Calibration(_pipeline(), {"matcher": points[:3]}, {"counts": {"copies": 15}}))
    assert table.splitlines()[-1] == (
        "matcher: 15 copies are too few for precision 0.95 (12 found, 19 needed) and 0.99 (12 found, 99 needed): their "
        "threshold is that of precision 1 on these copies (a precision p allows one false positive only among "
        "p/(1-p) copies found); calibrate on more copies (--sample, a larger collection) to tell them apart")
    many = [OperatingPoint(p, 0.5, 0.9) for p in (0.9, 0.95, 0.99)]  # 180 of 200 copies found
    assert "too few" not in format_calibration(Calibration(_pipeline(), {"matcher": many}, {"counts": {"copies": 200}}))
    # the rule holds on any sample: a precision with fewer copies found than it needs takes precision 1's threshold
    rng = np.random.default_rng(0)
    for _ in range(50):
        copies = int(rng.integers(1, 40))
        labels = rng.permutation([True] * copies + [False] * int(rng.integers(1, 40)))
        found = operating_points(labels, rng.random(len(labels)), copies, precisions=(0.8, 0.9, 0.95, 0.99, 1.0))
        for row, _ in unresolved_precisions(found[:4], copies):
            assert row.threshold == found[4].threshold


def test_json_round_trip(tmp_path):
    calibration = _calibration()
    calibration.save(tmp_path / "calibration.json")
    loaded = Calibration.load(tmp_path / "calibration.json")
    assert loaded.pipeline == calibration.pipeline and loaded.stages == calibration.stages
    assert loaded.provenance == calibration.provenance and loaded.source == str(tmp_path / "calibration.json")
    assert loaded.point(0.95, "matcher") == OperatingPoint(0.95, 0.6, 0.85)


def test_point_errors():
    calibration = _calibration()
    with pytest.raises(ConfigError, match=r"no matcher threshold at precision 0.8 \(it has 0.9, 0.95, 0.99\)"):
        calibration.point(0.8, "matcher")
    with pytest.raises(ConfigError, match="no descriptor score reached precision 0.99"):
        calibration.point(0.99, "descriptor")
    only_descriptor = Calibration(calibration.pipeline, {"descriptor": calibration.stages["descriptor"]})
    with pytest.raises(ConfigError, match="has no matcher stage"):
        only_descriptor.point(0.9, "matcher")


def test_check_pipeline_names_both_sides():
    calibration = _calibration()
    calibration.check_pipeline(_pipeline())
    calibration.check_pipeline(_pipeline(matcher=None))  # descriptors only: the descriptor stage holds
    calibration.check_pipeline(_pipeline(candidates=7, k=3))  # fewer pairs, same scores
    with pytest.raises(ConfigError, match="--preset fast, but this run uses --preset paper"):
        calibration.check_pipeline(_pipeline(preset="paper"))
    with pytest.raises(ConfigError, match="matcher embedded:matcher, but this run uses /models/m"):
        calibration.check_pipeline(_pipeline(matcher="/models/m"))
    other = _pipeline()
    other["descriptors"] = ["/models/d"]
    with pytest.raises(ConfigError, match="descriptor model\\(s\\) embedded:descriptor, but this run uses /models/d"):
        calibration.check_pipeline(other)
    with pytest.raises(ConfigError, match="score_normalisation=False, but this run uses score_normalisation=True"):
        calibration.check_pipeline(_pipeline(score_normalisation=True))
    with pytest.raises(ConfigError, match="descriptor_lce='none', but this run uses descriptor_lce='authors'"):
        calibration.check_pipeline(_pipeline(descriptor_lce="authors"))


def test_a_descriptor_weight_ties_the_matcher_stage_and_older_files_were_made_without_one():
    calibration = _calibration(descriptor_weight=20.0)
    assert calibration.pipeline["settings"]["descriptor_weight"] == 20.0
    calibration.check_pipeline(_pipeline(descriptor_weight=20.0))
    calibration.check_pipeline(_pipeline(matcher=None))  # the descriptor stage's cosines hold without the matcher
    with pytest.raises(ConfigError, match="descriptor_weight=20, but this run uses descriptor_weight=0; calibrate "
                                          "again with --descriptor-weight 0"):
        calibration.check_pipeline(_pipeline())
    older = _calibration()
    del older.pipeline["settings"]["descriptor_weight"]
    older.check_pipeline(_pipeline())
    with pytest.raises(ConfigError, match="made with descriptor_weight=0, but this run uses descriptor_weight=5"):
        older.check_pipeline(_pipeline(descriptor_weight=5.0))


def test_reference_normalisation_ties_only_the_descriptor_stage():
    """Collection normalisation of the references changes descriptor scores, not the matcher's: a run with a
    matcher may change it, a run without one (the descriptor stage decides) may not; a file written before it
    existed counts as made without it."""
    calibration = _calibration(collection=CollectionNormalisation(on=True))  # made with it on, ranks 2-9
    assert calibration.pipeline["settings"]["reference_normalisation"] == {
        "source": "collection", "alpha": 1.0, "k_start": 2, "k_end": 9}
    calibration.check_pipeline(_pipeline(collection=CollectionNormalisation(on=False)))
    calibration.check_pipeline(_pipeline(collection=CollectionNormalisation(k_end=5)))
    with pytest.raises(ConfigError, match="reference_normalisation=.*'k_end': 9.*but this run uses .*'k_end': 5"):
        calibration.check_pipeline(_pipeline(matcher=None, collection=CollectionNormalisation(on=True, k_end=5)))
    with pytest.raises(ConfigError, match="but this run uses None; calibrate with the same --collection-normalisation"):
        calibration.check_pipeline(_pipeline(matcher=None, collection=CollectionNormalisation(on=False)))
    older = _calibration(collection=CollectionNormalisation(on=True))
    del older.pipeline["settings"]["reference_normalisation"]
    older.check_pipeline(_pipeline(matcher=None, collection=CollectionNormalisation(on=False)))
    with pytest.raises(ConfigError, match="made with reference_normalisation=None"):
        older.check_pipeline(_pipeline(matcher=None, collection=CollectionNormalisation(on=True)))


def test_the_decision_takes_the_stage_of_the_run():
    """A run with the embedded matcher (``embedded:matcher``, its default) decides on the matcher stage, a run
    without matcher on the descriptor stage."""
    calibration = _calibration()
    assert calibration.decision(_pipeline(), 0.9) == Decision("matcher", OperatingPoint(0.9, 0.3, 0.9))
    assert calibration.decision(_pipeline(matcher=None), 0.95) == Decision("descriptor", OperatingPoint(0.95, 0.5, 0.6))
    with pytest.raises(ConfigError, match="--preset fast, but this run uses --preset paper"):
        calibration.decision(_pipeline(preset="paper"), 0.9)


def test_model_identity(tmp_path):
    from copynce_hf.runtime.loading import DEFAULT_DESCRIPTOR

    assert model_identity(None, "matcher") == "embedded:matcher"
    assert model_identity(DEFAULT_DESCRIPTOR, "descriptor") == "embedded:descriptor"
    assert model_identity(tmp_path, "descriptor") == str(tmp_path.resolve())
    assert model_identity("org/model", "descriptor") == "org/model"


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "cannot be read as JSON"),
    ('{"format": "other"}', "is not a calibration"),
    ('{"format": "copynce-calibration", "version": 7}', "has version 7"),
    ('{"format": "copynce-calibration", "version": 1, "pipeline": {}}', 'field "pipeline"'),
])
def test_load_errors(tmp_path, content, message):
    path = tmp_path / "calibration.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        Calibration.load(path)


def test_load_rejects_malformed_stages(tmp_path):
    data = _calibration().to_dict()
    data["stages"]["matcher"] = [{"precision": 0.9}]
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="stage 'matcher' must be a list of"):
        Calibration.load(tmp_path / "c.json")
    data["stages"] = {"ranker": []}
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown stage 'ranker'"):
        Calibration.load(tmp_path / "c.json")


# --------------------------------------------------------------------------- copynce calibrate / detect --calibration


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from conftest import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """refs/: 8 smooth random images; others/: 3 more (distractor sources); queries/: a flip of R1 and R5
    and an unrelated image; gt.csv."""
    from PIL import Image

    root = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(1)
    for folder in ("refs", "others", "queries"):
        (root / folder).mkdir()

    def picture():  # smooth blobs: edits such as crops and blurs keep them recognisable
        small = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
        return Image.fromarray(small).resize((96, 72), Image.Resampling.BICUBIC)

    originals = {f"R{i}": picture() for i in range(8)}
    for name, image in originals.items():
        image.save(root / "refs" / f"{name}.png")
    for i in range(3):
        picture().save(root / "others" / f"D{i}.png")
    originals["R1"].transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(root / "queries" / "Q0.png")
    originals["R5"].crop((10, 8, 90, 70)).save(root / "queries" / "Q1.png")
    picture().save(root / "queries" / "Q2.png")
    (root / "gt.csv").write_text("query_id,reference_id\nQ0,R1\nQ1,R5\nQ2,\n")
    return root


def test_calibrate_command_writes_a_reproducible_file(models, collection, tmp_path, capsys):
    args = ["calibrate", collection / "refs", "--sample", 3, "--num-distractors", 2, "--seed", 4,
            "--models", models["descriptor"], "--matcher", models["matcher"], "--k", 3]
    code, out, err = run_cli(capsys, *args, "--output", tmp_path / "a.json")
    assert code == 0, err
    assert "matcher" in out and "0.99" in out and "--calibration" in out
    assert "matcher: 3 copies are too few for precision 0.9 (" in out  # 3 copies resolve no precision
    first = json.loads((tmp_path / "a.json").read_text())
    assert set(first["stages"]) == {"descriptor", "matcher"}
    assert [row["precision"] for row in first["stages"]["matcher"]] == [0.9, 0.95, 0.99]
    provenance = first["provenance"]
    assert provenance["seed"] == 4 and provenance["distractor_source"] == "held-out references"
    # the calibration's own recipe, which no benchmark draws (mini-DISC's queries are minidisc_queries copies)
    assert provenance["recipe_name"] == "calibration_copies"
    assert provenance["recipe"] == CopyRecipe.calibration_copies().to_dict() != CopyRecipe.minidisc_queries().to_dict()
    assert len(provenance["sample_ids"]) == 3 and len(provenance["distractor_ids"]) == 2
    assert not set(provenance["sample_ids"]) & set(provenance["distractor_ids"])  # held out: not copies, not indexed
    assert provenance["counts"]["indexed_references"] == 6
    assert provenance["counts"]["matcher_pairs"] == 5 * 3  # 5 queries, top 3 each
    # each stage's pooled metrics on the calibration copies; RP90 is the recall kept at precision 0.9
    assert "matcher on the calibration copies: muAP" in out
    # what each stage's scores are, printed and kept in the file
    assert provenance["scores"] == {"descriptor": "the descriptor's cosine",
                                    "matcher": "the matcher's copy probability (sigmoid of its logit), the highest "
                                               "over the views of a pair scored"}
    assert "matcher scores: the matcher's copy probability" in out and "a pair scored at or above a row's" in out
    for stage in ("descriptor", "matcher"):
        found = provenance["metrics"][stage]
        assert set(found) == {"micro_ap", "recall_at_p90", "recall_at_rank1"}
        assert all(0.0 <= value <= 1.0 for value in found.values())
        at_p90 = next(row["recall"] for row in first["stages"][stage] if row["precision"] == 0.9)
        assert found["recall_at_p90"] == pytest.approx(at_p90)
    assert first["pipeline"]["descriptors"] == [str(Path(models["descriptor"]).resolve())]
    code, _, err = run_cli(capsys, *args, "--output", tmp_path / "b.json")
    assert code == 0, err
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()  # deterministic given the seed
    # given distractors: every reference stays indexed, the distractors come from the folder
    code, _, err = run_cli(capsys, "calibrate", collection / "refs", "--distractors", collection / "others", "--sample", 2,
                        "--models", models["descriptor"], "--matcher", "none", "--output", tmp_path / "c.json")
    assert code == 0, err
    third = json.loads((tmp_path / "c.json").read_text())
    assert set(third["stages"]) == {"descriptor"} and third["pipeline"]["matcher"] is None
    distractor_ids = third["provenance"]["distractor_ids"]
    assert len(set(distractor_ids)) == 2 and set(distractor_ids) <= {"D0", "D1", "D2"}  # --sample 2: 2 of the 3
    assert third["provenance"]["counts"]["indexed_references"] == 8
    # the matcher's scores with the descriptor's evidence weighed in: the file records the weight and what they are
    code, _, err = run_cli(capsys, *args, "--descriptor-weight", 3, "--output", tmp_path / "d.json")
    assert code == 0, err
    weighed = json.loads((tmp_path / "d.json").read_text())
    assert weighed["pipeline"]["settings"]["descriptor_weight"] == 3.0 and first["pipeline"]["settings"][
        "descriptor_weight"] == 0.0
    assert weighed["provenance"]["scores"]["matcher"].startswith("the matcher's logit (of its copy probability")
    assert weighed["stages"]["descriptor"] == first["stages"]["descriptor"]  # the descriptor stage is the same


def test_calibration_finds_planted_copies_with_the_embedded_models(collection):
    """The embedded models find copies of the collection's own images: the labels of the calibration pairs are
    right (wrong labels would leave no threshold reaching 90 % precision)."""
    from copynce_hf.calibration.planted import calibrate
    from copynce_hf.retrieval import Descriptor, ImageFolderSource
    from copynce_hf.runtime.loading import load_model

    config = DetectConfig.from_preset("fast", k=2, candidates=4)
    pipeline = _pipeline(candidates=4, k=2)
    calibration = calibrate(ImageFolderSource(collection / "refs"), [Descriptor("d", *load_model(None, "descriptor"))],
                            load_model(None, "matcher"), pipeline, config,
                            distractors=ImageFolderSource(collection / "others"), sample=8, progress=False,
                            log=lambda line: None)
    matcher = calibration.point(0.9, "matcher")
    assert matcher.threshold is not None and matcher.recall >= 0.5
    thresholds = [row.threshold for row in calibration.stages["matcher"] if row.threshold is not None]
    assert thresholds == sorted(thresholds)


def _hand_calibration(models, threshold, path, precision=0.9, preset="fast"):
    descriptors = [model_identity(models["descriptor"], "descriptor")]
    pipeline = pipeline_identity(descriptors, model_identity(models["matcher"], "matcher"), preset,
                                 DetectConfig.from_preset(preset), False)
    rows = [OperatingPoint(precision, threshold, 0.5)]
    Calibration(pipeline, {"descriptor": rows, "matcher": rows}).save(path)


def test_detect_decides_with_a_calibration(models, collection, tmp_path, capsys):
    from copynce_hf.retrieval import read_predictions

    base = ["detect", collection / "queries", "--references", collection / "refs", "--models", models["descriptor"],
            "--matcher", models["matcher"], "--k", 2, "--ground-truth", collection / "gt.csv"]
    code, _, err = run_cli(capsys, *base, "--output", tmp_path / "plain")
    assert code == 0, err
    scores = sorted(p.score for p in read_predictions(tmp_path / "plain" / "predictions.csv"))
    threshold = (scores[2] + scores[3]) / 2  # 3 of the 6 pairs are above it
    _hand_calibration(models, threshold, tmp_path / "calibration.json")
    code, out, err = run_cli(capsys, *base, "--output", tmp_path / "found", "--calibration", tmp_path / "calibration.json",
                          "--precision", 0.9)
    assert code == 0, err
    rows = (tmp_path / "found" / "predictions.csv").read_text().splitlines()
    assert rows[0] == "query_id,reference_id,score,copy"
    decided = {tuple(row.split(",")[:2]): row.split(",")[3] for row in rows[1:]}
    above = {(p.query_id, p.reference_id) for p in read_predictions(tmp_path / "plain" / "predictions.csv")
             if p.score >= threshold}
    assert {pair for pair, copy in decided.items() if copy == "1"} == above and len(above) == 3
    assert {(p.query_id, p.reference_id) for p in read_predictions(tmp_path / "found" / "copies.csv")} == above
    assert read_predictions(tmp_path / "found" / "predictions.csv") == read_predictions(
        tmp_path / "plain" / "predictions.csv")  # the extra column does not disturb readers
    assert f"{threshold:.4f}" in (tmp_path / "found" / "report.html").read_text()
    assert "3 pairs at or above the threshold" in out
    decision = json.loads((tmp_path / "found" / "metrics.json").read_text())["decision"]
    assert decision["threshold"] == threshold and decision["stage"] == "matcher"
    truth = {("Q0", "R1"), ("Q1", "R5")}
    assert decision["precision"] == pytest.approx(len(above & truth) / 3)
    assert decision["recall"] == pytest.approx(len(above & truth) / 2)


def test_detect_calibration_errors(models, collection, tmp_path, capsys):
    _hand_calibration(models, 0.5, tmp_path / "calibration.json")
    base = ["detect", collection / "queries", "--references", collection / "refs", "--models", models["descriptor"],
            "--matcher", models["matcher"], "--calibration", tmp_path / "calibration.json"]
    cases = [
        (["--precision", 0.95], "no matcher threshold at precision 0.95 (it has 0.9)"),
        (["--preset", "paper"], "--preset fast, but this run uses --preset paper"),
        (["--aux", collection / "others"], "score_normalisation=False, but this run uses score_normalisation=True"),
    ]
    for extra, message in cases:
        code, _, err = run_cli(capsys, *base, *extra, "--output", tmp_path / "out")
        assert code == 2 and message in err.strip().splitlines()[-1], err
    code, _, err = run_cli(capsys, "detect", collection / "queries", "--references", collection / "refs",
                        "--calibration", tmp_path / "calibration.json", "--output", tmp_path / "out")
    assert code == 2 and "was made with the descriptor model(s) " + str(Path(models["descriptor"]).resolve()) in err
    assert "but this run uses embedded:descriptor" in err
    code, _, err = run_cli(capsys, *base[:-2], "--precision", 0.9, "--output", tmp_path / "out")
    assert code == 2 and "--precision needs --calibration" in err
    assert not (tmp_path / "out" / "predictions.csv").exists()  # refused before any work


def test_calibration_queries_are_seeded_and_refuse_a_too_small_collection(collection, tmp_path):
    from PIL import Image

    from copynce_hf.calibration.planted import calibration_queries
    from copynce_hf.retrieval import ImageFolderSource

    references = ImageFolderSource(collection / "refs")
    first, again = (calibration_queries(references, 3, num_distractors=2, seed=9) for _ in range(2))
    assert [q.edits for q in first.queries] == [q.edits for q in again.queries]
    assert first.sample_ids == again.sample_ids and len(first.indexed_ids) == 6
    # query k of the sample, then of the distractors, is the calibration recipe's draw k (not mini-DISC's recipe)
    edits = {q.source_path.stem: list(q.edits) for q in first.queries}
    for k, image_id in enumerate(first.sample_ids + first.distractor_ids):
        size = Image.open(collection / "refs" / f"{image_id}.png").size[::-1]
        drawn = CopyRecipe.calibration_copies().draw(np.random.default_rng([9, k]), size)
        assert edits[image_id] == [edit.to_dict() for edit in drawn]
    other = calibration_queries(references, 3, num_distractors=2, seed=10)
    assert [q.edits for q in other.queries] != [q.edits for q in first.queries]
    truth = first.ground_truth
    assert sorted(r for refs in truth.values() for r in refs) == first.sample_ids
    assert sum(1 for refs in truth.values() if not refs) == 2
    (tmp_path / "two").mkdir()
    for name in ("a", "b"):
        Image.new("RGB", (32, 32)).save(tmp_path / "two" / f"{name}.png")
    with pytest.raises(ConfigError, match="calibrating without --distractors needs at least 3"):
        calibration_queries(ImageFolderSource(tmp_path / "two"), 5)


def test_the_default_matcher_decides_with_the_matcher_stage(collection, tmp_path, capsys):
    """``calibrate`` then ``detect --calibration`` and ``dedup --calibration`` with the default (embedded) models: the
    decision uses the matcher stage's threshold, since the default matcher is the embedded one (``detect`` once took the
    descriptor stage's threshold to decide on matcher scores when ``--matcher`` was left out)."""
    from copynce_hf.calibration.thresholds import Calibration

    code, _, err = run_cli(capsys, "calibrate", collection / "refs", "--distractors", collection / "others",
                           "--sample", 8, "--k", 2, "--candidates", 4, "--output", tmp_path / "calibration.json")
    assert code == 0, err
    calibration = Calibration.load(tmp_path / "calibration.json")
    assert calibration.pipeline["matcher"] == "embedded:matcher"
    matcher, descriptor = (calibration.point(0.9, stage).threshold for stage in ("matcher", "descriptor"))
    assert f"{matcher:.4f}" != f"{descriptor:.4f}"  # the two stages' thresholds tell the decisions apart

    code, out, err = run_cli(capsys, "detect", collection / "queries", "--references", collection / "refs", "--k", 2,
                             "--candidates", 4, "--ground-truth", collection / "gt.csv", "--calibration",
                             tmp_path / "calibration.json", "--precision", 0.9, "--output", tmp_path / "found")
    assert code == 0, err
    decision = json.loads((tmp_path / "found" / "metrics.json").read_text())["decision"]
    assert decision["stage"] == "matcher" and decision["threshold"] == matcher
    assert f"at or above the threshold {matcher:.4f}" in out
    meaning = json.loads((tmp_path / "found" / "scores.json").read_text())
    assert (meaning["threshold"], meaning["precision"]) == (matcher, 0.9)
    assert meaning["source"] == f"{tmp_path / 'calibration.json'} (`copynce calibrate`)"
    assert meaning["recall"] == calibration.point(0.9, "matcher").recall and meaning["meaning"] in out
    assert f"threshold {matcher:.4g} ({tmp_path / 'calibration.json'} (`copynce calibrate`): precision 0.9" in out
    assert f"{matcher:.4f} (matcher score at precision 0.9" in (tmp_path / "found" / "report.html").read_text()
    rows = [row.split(",") for row in (tmp_path / "found" / "predictions.csv").read_text().splitlines()[1:]]
    assert rows and all((row[3] == "1") == (float(row[2]) >= matcher) for row in rows)

    code, out, err = run_cli(capsys, "dedup", collection / "refs", "--calibration", tmp_path / "calibration.json",
                             "--output", tmp_path / "groups")
    assert code == 0, err
    meaning = json.loads((tmp_path / "groups" / "scores.json").read_text())
    assert (meaning["threshold"], meaning["precision"]) == (matcher, 0.9) and meaning["meaning"] in out
    assert "discounted by the part of each image's background above probability 0.5" in meaning["score"]
    report = (tmp_path / "groups" / "report.html").read_text()
    assert f"matcher score {matcher:.4g} at precision 0.9" in report and "descriptor score" not in report
