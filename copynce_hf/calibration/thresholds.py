"""Score thresholds calibrated on known copies: the ``calibration.json`` file and how its thresholds are chosen.

``copynce calibrate`` (:mod:`copynce_hf.calibration.planted`) makes edited copies of a sample of
the user's references and of distractor images, runs the detection pipeline on them and keeps, for
each stage, the lowest score at which the pooled predictions still reach a target precision.
``copynce detect --calibration`` and ``copynce dedup`` read the file back to turn scores into
decisions (a pair is a copy when its score is at least the threshold).

The file (JSON, ``"format": "copynce-calibration"``, ``"version": 1``)::

    {"format": "copynce-calibration", "version": 1,
     "pipeline": {"descriptors": [model, ...], "matcher": model | null, "preset": "fast",
                  "settings": {"descriptor_lce": ..., "matcher_lce": ..., "score_normalisation": false, ...}},
     "stages": {"descriptor": [{"precision": 0.9, "threshold": 0.41, "recall": 0.83}, ...],
                "matcher": [...]},
     "provenance": {"recipe": {...}, "seed": 0, "sample_ids": [...], "distractor_ids": [...],
                    "counts": {...}, "runtime": "torch" | "onnx", "scores": {"matcher": "the matcher's copy
                    probability ...", ...}, ...}}

``threshold`` is ``null`` where no score reaches the precision (then ``recall`` is 0). ``provenance["scores"]`` says
in words what each stage's scores are (:func:`~copynce_hf.calibration.meaning.detect_score`; files written before
it have none). The runtime that ran the
models (``copynce calibrate --runtime``) is recorded, not checked: both give the same scores (to about 1e-4).
Stages: ``descriptor`` scores what ``detect --matcher none`` outputs (the merged descriptor candidates,
score-normalised when an auxiliary set is used), ``matcher`` what ``detect`` outputs with the matcher.

Threshold choice (the DISC21 "threshold at P90", generalised): pool every prediction, sort by
decreasing score with negatives first among ties, take the highest recall among the ranks whose
precision is at least the target; the threshold is the score at the first rank reaching that recall
(:func:`~copynce_hf.metrics.copy_detection.formulas.recall_at_precision`). A higher target precision
can only keep fewer ranks, so thresholds never decrease and recalls never increase with the target.

A small sample cannot tell high precisions apart (:func:`copies_needed`): with ``n`` copies found above a threshold,
one false positive gives a precision of ``n / (n + 1)``, so a target ``p`` allows a false positive only once
``n >= p / (1 - p)`` (9 copies found for 0.9, 19 for 0.95, 99 for 0.99). Below that its threshold is the one of
precision 1 on the sample (the highest distractor score), whatever ``p``: ``copynce calibrate`` says so
(:func:`unresolved_precisions`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..modeling.errors import ConfigError
from ..outputs import OwnFile, StagedFile, first_bytes

CALIBRATION_FORMAT = "copynce-calibration"
CALIBRATION_VERSION = 1
#: A calibration file as :meth:`Calibration.save` writes it (its first key is ``format``): ``copynce calibrate
#: --output`` rewrites such a file and refuses to overwrite any other.
CALIBRATION_FILE = OwnFile(
    "a calibration file written by `copynce calibrate`",
    lambda path: re.match(rb'\s*\{\s*"format"\s*:\s*"copynce-calibration"', first_bytes(path, 256)) is not None)
#: Target precisions written by ``copynce calibrate``.
PRECISIONS = (0.9, 0.95, 0.99)
#: The seed of a calibration's sample, distractors and edits (:mod:`copynce_hf.calibration.planted`).
DEFAULT_SEED = 0
#: Stages a calibration can hold, in pipeline order.
STAGES = ("descriptor", "matcher")
#: :class:`~copynce_hf.retrieval.DetectConfig` fields that change the scores (``k`` and ``candidates`` only
#: change how many pairs are scored): a calibration holds for a detect run only when they agree.
SCORE_SETTINGS = ("descriptor_lce", "matcher_lce", "alpha", "k_start", "k_end")

#: The content-token settings of a calibration (:func:`~copynce_hf.retrieval.content.stage.content_setting`: ``False`` or the
#: settings; ``query_crops``, ``layout_crops``: ``True`` or ``False``); a calibration written before they existed was
#: made without them.
CONTENT_SETTINGS = ("content_tokens", "descriptor_content_tokens", "query_crops", "layout_crops")


@dataclasses.dataclass(frozen=True)
class OperatingPoint:
    """One row of a stage: at scores ``>= threshold`` the calibration copies were found with ``recall`` at a
    precision of at least ``precision`` (``threshold`` is ``None`` when no score reached it)."""

    precision: float
    threshold: float | None
    recall: float


@dataclasses.dataclass(frozen=True)
class Decision:
    """A calibrated decision: pairs that ``stage`` scores at or above ``point.threshold`` are copies (``source``: the
    calibration file)."""

    stage: str
    point: OperatingPoint
    source: str | None = None

    @property
    def threshold(self) -> float:
        return self.point.threshold


def operating_points(is_copy: Sequence[bool], scores: Sequence[float], num_positives: int,
                     precisions: Iterable[float] = PRECISIONS) -> list[OperatingPoint]:
    """The threshold and recall at each target precision.

    Args:
        is_copy: (P,) whether each pooled prediction is a true copy pair.
        scores: (P,) its score.
        num_positives: the number of copy pairs that exist (recall denominator), found or not.
        precisions: target precisions, each in (0, 1].
    """
    from ..metrics.copy_detection.formulas import precision_recall, recall_at_precision

    precisions = [float(p) for p in precisions]
    for target in precisions:
        if not 0 < target <= 1:
            raise ConfigError(f"target precision {target} must be in (0, 1]")
    if num_positives < 1:
        raise ConfigError("calibration needs at least one copy pair (num_positives is 0)")
    precision, recall, thresholds = precision_recall(is_copy, scores, num_positives)
    points = []
    for target in precisions:
        found, threshold = recall_at_precision(precision, recall, thresholds, target)
        points.append(OperatingPoint(target, threshold, found))
    return points


def copies_needed(precision: float) -> int:
    """Copies found above a threshold before a target ``precision`` < 1 allows one false positive among them:
    ``ceil(p / (1 - p))`` (``n / (n + 1) >= p``); 9 for 0.9, 19 for 0.95, 99 for 0.99.

    With fewer, the threshold at ``p`` is the threshold at precision 1: a rank holding a false positive has a
    precision of at most ``n / (n + 1) < p``, so only ranks above every distractor score qualify, and the deepest of
    them is precision 1's choice. The calibration then measured nothing that separates ``p`` from 1 (a rule of
    three: no false positive among ``n`` kept pairs bounds their false-positive rate by about ``3 / n`` at 95 %
    confidence, 0.2 for 15 copies): a precision needs at least this many copies found to be calibrated at all.
    """
    if not 0 < precision < 1:
        return 0
    return math.ceil(precision / (1 - precision) - 1e-9)  # 0.9 / 0.1 is 9.000000000000002 in floats


def unresolved_precisions(rows: Sequence[OperatingPoint], copies: int) -> list[tuple[OperatingPoint, int]]:
    """``(row, copies found there)`` of each row of a stage whose copies found (``recall * copies``, ``copies``: the
    calibration copies that exist) are fewer than :func:`copies_needed`: its threshold is that of precision 1 on
    the sample."""
    found = [(row, round(row.recall * copies)) for row in rows]
    return [(row, count) for row, count in found if count < copies_needed(row.precision)]


def decision_rates(is_copy: Sequence[bool], scores: Sequence[float], num_positives: int,
                   threshold: float | None) -> tuple[float | None, float]:
    """``(precision, recall)`` of the pairs scored at least ``threshold`` (precision ``None`` when none is)."""
    if threshold is None:
        return None, 0.0
    kept = [copy for copy, score in zip(is_copy, scores) if score >= threshold]
    found = sum(bool(copy) for copy in kept)
    return (found / len(kept) if kept else None), found / max(num_positives, 1)


def decision_report(predictions: Sequence, ground_truth: dict[str, list[str]], stage: str, point: OperatingPoint,
                    num_positives: int) -> dict:
    """How the calibrated ``point`` of ``stage`` decided on ``predictions`` (objects with ``query_id``,
    ``reference_id``, ``score``) against ``ground_truth`` (query id -> reference ids; ``num_positives`` true
    pairs): its threshold, the precision and recall it was calibrated for and those it gave here."""
    is_copy = [p.reference_id in ground_truth.get(p.query_id, ()) for p in predictions]
    precision, recall = decision_rates(is_copy, [p.score for p in predictions], num_positives, point.threshold)
    return {"stage": stage, "target_precision": point.precision, "threshold": point.threshold,
            "expected_recall": point.recall, "precision": precision, "recall": recall}


def calibrated_decision(path: str | os.PathLike, precision: float | None, pipeline: dict[str, Any]) -> Decision:
    """The decision of ``copynce detect --calibration PATH --precision P`` (``precision`` ``None``: 0.9) for a run of
    the pipeline identity ``pipeline``: read before any model loads, refused when the run differs from the one
    calibrated (:meth:`Calibration.decision`)."""
    return Calibration.load(path).decision(pipeline, 0.9 if precision is None else precision)


def model_identity(path: str | os.PathLike | None, kind: str) -> str:
    """How a calibration names a model: ``embedded:<kind>`` for the package's embedded model, the absolute path
    of a local folder (``onnx:`` and the absolute path for an ONNX embedding model), or the Hub id as given."""
    from ..runtime.embedding_declaration import absolute_embedding_path, is_embedding_path
    from ..runtime.loading import DEFAULTS

    if path is None:
        return f"embedded:{kind}"
    if is_embedding_path(path):
        return absolute_embedding_path(path)
    local = Path(os.fspath(path)).expanduser()
    if local.exists():
        resolved = local.resolve()
        for name, folder in DEFAULTS.items():
            if resolved == folder.resolve():
                return f"embedded:{name}"
        return str(resolved)
    return os.fspath(path)


def reference_normalisation(config) -> dict[str, Any] | None:
    """The reference-side collection normalisation of a :class:`~copynce_hf.retrieval.DetectConfig` as a calibration
    records it: ``None`` when off, else its source, ranks and weight. It changes descriptor scores only (with a
    matcher, which candidates are verified), so only a calibration's descriptor stage is tied to it."""
    if not getattr(config, "normalises_references", False):
        return None
    collection = config.collection
    return {"source": config.reference_background, "alpha": collection.alpha, "k_start": collection.k_start,
            "k_end": collection.k_end}


def pipeline_identity(descriptors: Sequence[str], matcher: str | None, preset: str, config,
                      score_normalisation: bool) -> dict[str, Any]:
    """The ``pipeline`` entry of a calibration: model identities (:func:`model_identity`), the preset, and the
    settings that change scores (``config`` is a :class:`~copynce_hf.retrieval.DetectConfig`)."""
    settings = {name: getattr(config, name) for name in SCORE_SETTINGS}
    if not score_normalisation:
        for name in ("alpha", "k_start", "k_end"):
            settings.pop(name)
    from ..retrieval.content.stage import (  # torch: not for --help
        content_setting,
        descriptor_content,
        matcher_content,
    )

    settings["score_normalisation"] = bool(score_normalisation)
    settings["reference_normalisation"] = reference_normalisation(config)
    settings["content_tokens"] = content_setting(matcher_content(config))
    settings["descriptor_content_tokens"] = content_setting(descriptor_content(config))
    settings["query_crops"] = config.crops_queries
    settings["layout_crops"] = config.crops_layouts
    settings["descriptor_weight"] = float(config.descriptor_weight)
    return {"descriptors": list(descriptors), "matcher": matcher, "preset": preset, "settings": settings}


@dataclasses.dataclass
class Calibration:
    """A calibration file in memory.

    Attributes:
        pipeline: models, preset and score settings it was made with (:func:`pipeline_identity`).
        stages: stage name (``descriptor``, ``matcher``) -> its :class:`OperatingPoint` rows, by precision.
        provenance: what reproduces it: references folder, recipe, seed, sample and distractor ids, counts.
        source: the file it was read from (for error messages); ``None`` when made in memory.
    """

    pipeline: dict[str, Any]
    stages: dict[str, list[OperatingPoint]]
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str | None = None

    @property
    def name(self) -> str:
        return f"calibration {self.source!r}" if self.source else "the calibration"

    def stage_for(self, pipeline: dict[str, Any]) -> str:
        """The stage whose scores a run of the pipeline identity ``pipeline`` (:func:`pipeline_identity`) outputs:
        ``matcher`` when it names a matcher (the embedded one included: ``embedded:matcher``), ``descriptor`` for a
        run without one (``"matcher": None``, ``--matcher none``)."""
        return "descriptor" if pipeline["matcher"] is None else "matcher"

    def decision(self, pipeline: dict[str, Any], precision: float) -> Decision:
        """How a run of ``pipeline`` (:func:`pipeline_identity`) decides at ``precision``: the threshold of the stage
        whose scores it outputs (:meth:`stage_for`), once :meth:`check_pipeline` accepts the run."""
        self.check_pipeline(pipeline)
        stage = self.stage_for(pipeline)
        return Decision(stage, self.point(precision, stage), self.source)

    def point(self, precision: float, stage: str) -> OperatingPoint:
        """The row of ``stage`` at ``precision``.

        Raises:
            ConfigError: the file has no such stage, or not that precision (the message lists those it has),
                or no score reached it.
        """
        if stage not in self.stages:
            raise ConfigError(f"{self.name} has no {stage} stage (it has {', '.join(self.stages) or 'none'}); "
                              "calibrate with the same matcher as the detect run")
        rows = self.stages[stage]
        for row in rows:
            if abs(row.precision - float(precision)) < 1e-9:
                if row.threshold is None:
                    raise ConfigError(f"{self.name}: no {stage} score reached precision {precision} on the "
                                      "calibration copies; choose a lower precision")
                return row
        have = ", ".join(f"{row.precision:g}" for row in rows)
        raise ConfigError(f"{self.name} has no {stage} threshold at precision {precision:g} (it has {have})")

    def check_pipeline(self, pipeline: dict[str, Any]) -> None:
        """Refuse a detect run whose models, preset or score settings differ from those calibrated (both named).

        A run without matcher may use a calibration made with one (its ``descriptor`` stage)."""
        mine = self.pipeline
        if list(pipeline["descriptors"]) != list(mine["descriptors"]):
            raise ConfigError(f"{self.name} was made with the descriptor model(s) {', '.join(mine['descriptors'])}, "
                              f"but this run uses {', '.join(pipeline['descriptors'])}; calibrate again with them")
        if pipeline["matcher"] is not None and pipeline["matcher"] != mine["matcher"]:
            raise ConfigError(f"{self.name} was made with the matcher {mine['matcher'] or 'none'}, but this run "
                              f"uses {pipeline['matcher']}; calibrate again with it")
        if pipeline["preset"] != mine["preset"]:
            raise ConfigError(f"{self.name} was made with --preset {mine['preset']}, but this run uses --preset "
                              f"{pipeline['preset']}")
        for name in ("score_normalisation", *SCORE_SETTINGS, *CONTENT_SETTINGS):  # on/off first: alpha... apply
            if pipeline["matcher"] is None and name in ("matcher_lce", "content_tokens", "query_crops", "layout_crops"):
                continue
            made_with = mine["settings"].get(name, False if name in CONTENT_SETTINGS else None)  # older files: off
            if made_with != pipeline["settings"].get(name):
                raise ConfigError(f"{self.name} was made with {name}={made_with!r}, but this run "
                                  f"uses {name}={pipeline['settings'].get(name)!r}")
        weighed, weighs = float(mine["settings"].get("descriptor_weight", 0.0)), float(  # older files: 0
            pipeline["settings"].get("descriptor_weight", 0.0))
        if pipeline["matcher"] is not None and weighed != weighs:
            raise ConfigError(f"{self.name} was made with descriptor_weight={weighed:g}, but this run uses "
                              f"descriptor_weight={weighs:g}; calibrate again with --descriptor-weight {weighs:g}")
        # a file written before reference normalisation existed was made without it
        made_with, used = mine["settings"].get("reference_normalisation"), pipeline["settings"].get(
            "reference_normalisation")
        if pipeline["matcher"] is None and made_with != used:
            raise ConfigError(f"{self.name} holds descriptor thresholds made with reference_normalisation="
                              f"{made_with!r}, but this run uses {used!r}; calibrate with the same "
                              "--collection-normalisation settings")

    def to_dict(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, "pipeline": self.pipeline,
                "stages": {stage: [dataclasses.asdict(row) for row in rows] for stage, rows in self.stages.items()},
                "provenance": self.provenance}

    def save(self, path: str | os.PathLike) -> None:
        """Write the JSON file (atomically)."""
        with StagedFile(path) as temporary:
            temporary.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        """Read a file written by :meth:`save`.

        Raises:
            ConfigError: the file is missing, not JSON, not a calibration, of another version, or a field is
                missing or malformed (named).
        """
        name = f"calibration file {os.fspath(path)!r}"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{name} does not exist") from None
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ConfigError(f"{name} cannot be read as JSON: {error}") from None
        if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
            raise ConfigError(f"{name} is not a calibration (no \"format\": \"{CALIBRATION_FORMAT}\"); "
                              "it is written by `copynce calibrate`")
        if data.get("version") != CALIBRATION_VERSION:
            raise ConfigError(f"{name} has version {data.get('version')!r}; this package reads version "
                              f"{CALIBRATION_VERSION}")
        pipeline = data.get("pipeline")
        if not isinstance(pipeline, dict) or {"descriptors", "matcher", "preset", "settings"} - set(pipeline):
            raise ConfigError(f"{name}: field \"pipeline\" must hold descriptors, matcher, preset and settings")
        stages = {}
        for stage, rows in (data.get("stages") or {}).items():
            if stage not in STAGES:
                raise ConfigError(f"{name}: unknown stage {stage!r} (expected {', '.join(STAGES)})")
            try:
                stages[stage] = [OperatingPoint(float(row["precision"]),
                                                None if row["threshold"] is None else float(row["threshold"]),
                                                float(row["recall"])) for row in rows]
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"{name}: stage {stage!r} must be a list of {{precision, threshold, recall}} "
                                  "rows") from None
        if not stages:
            raise ConfigError(f"{name}: field \"stages\" holds no stage")
        return cls(pipeline, stages, data.get("provenance") or {}, source=os.fspath(path))


def calibrated_threshold(calibration, precision: float, descriptor: str, matcher: str | None,
                         config, whitened: bool = False, settings=None) -> tuple[float, str]:
    """The threshold at ``precision`` of a :class:`Calibration` (a ``copynce calibrate`` file) for a
    dedup run, and a line saying where it comes from. ``descriptor`` and ``matcher`` are the run's model
    identities (:func:`model_identity`).

    With a matcher the ``matcher`` stage decides: its scores depend on the matcher and its views only, which must
    be those calibrated; with matcher normalisation the threshold applies to the decision score, which equals the
    matcher's probability wherever an image's background is below the anchor. Without one the ``descriptor`` stage
    decides: the calibrated descriptor, views, no score normalisation, no collection normalisation (``settings``: the
    run's :class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`, whose ``collection`` is on by default)
    and no whitening must match. A mismatch is a :class:`ConfigError` naming both.
    """
    from ..retrieval.content.stage import (  # torch: not for --help
        content_setting,
        descriptor_content,
        matcher_content,
    )
    from ..retrieval.deduplication.settings import DedupSettings

    normalised = (settings or DedupSettings()).collection.on
    calibrated, recorded = calibration.pipeline, calibration.pipeline.get("settings", {})
    if matcher is not None:
        checks = [("matcher", calibrated.get("matcher"), matcher),
                  ("matcher_lce", recorded.get("matcher_lce"), config.matcher_lce),
                  ("content tokens", recorded.get("content_tokens", False), content_setting(matcher_content(config)))]
    else:
        checks = [("descriptor model(s)", calibrated.get("descriptors"), [descriptor]),
                  ("descriptor_lce", recorded.get("descriptor_lce"), config.descriptor_lce),
                  ("score normalisation", recorded.get("score_normalisation"), False),
                  ("descriptor content tokens", recorded.get("descriptor_content_tokens", False),
                   content_setting(descriptor_content(config)))]
        if whitened:
            raise ConfigError(f"{calibration.name} holds descriptor thresholds without whitening; a dedup run with "
                              "--whiten-from and --matcher none needs --threshold")
        if normalised:
            raise ConfigError(f"{calibration.name} holds thresholds of raw descriptor cosines; a dedup run with "
                              "--matcher none decides by collection-normalised scores: pass "
                              "--collection-normalisation off to use it, or --threshold")
    for name, made_with, used in checks:
        if made_with != used:
            raise ConfigError(f"{calibration.name} was made with {name} {made_with!r}, but this dedup run uses "
                              f"{used!r}; calibrate again with it or pass --threshold")
    stage = calibration.stage_for({"matcher": matcher})
    point = calibration.point(precision, stage)
    return point.threshold, (f"{stage} score {point.threshold:.4g} at precision {point.precision:g} in "
                             f"{calibration.source} (expected recall {point.recall:.3f})")
