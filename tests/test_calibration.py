"""Calibrated thresholds: the calibration file (round trip, refusals) and how thresholds are chosen."""

from __future__ import annotations

import json

import numpy as np
import pytest

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval.calibration import (
    Calibration,
    OperatingPoint,
    decision_rates,
    model_identity,
    operating_points,
    pipeline_identity,
)
from copynce_hf.retrieval.detect import DetectConfig


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


def test_model_identity(tmp_path):
    from copynce_hf.evaluation.models import DEFAULT_DESCRIPTOR

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
