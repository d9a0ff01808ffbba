"""The default threshold of ``copynce dedup``: calibrated on the collection itself, at a stated precision.

Beyond the paper. Without ``--threshold`` or ``--calibration``, :func:`self_calibrate` runs the dedup pipeline
itself (:func:`~copynce_hf.retrieval.deduplication.collection.dedup`, with the run's models, :class:`~copynce_hf.retrieval.detection.config.DetectConfig` and
:class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`) on a *calibration collection* held in memory: a seeded sample of the collection's
images with their PixTrace copies, copies put into templates and copies of copies (:mod:`copynce_hf.calibration.synthetic`).
Every pair that run verifies gets the score the run thresholds (its decision score: collection-normalised as the
run's are, ``pairs.csv``'s ``score``) and a label from the provenance of its two images: a copy when both were made
from the same sampled image, else not (template-sharing non-copies named as such). The threshold is the lowest
decision score at which these verified pairs reach the target precision (:func:`choose_threshold`).

No class weighting: the ratio of copies to non-copies is that of the calibration collection's own candidate
pairs. The true pairs the candidates missed (never verified) lower the recall, not the precision; the log, the
report and the saved file say how many. Where no threshold reaches the target, the one of best precision is taken
and a warning names the precision reached.

Two sampled images may be copies of each other in the collection; their pairs still count as non-copies (no score
tells them from the hard non-copies a model confuses). A sample of K of N images holds about K(K-1) / 2(N-1) such
pairs where every image has one copy: none to speak of in a large collection; in a small one full of copies they
make the threshold higher (more precise, less recall) than it would be.

Everything is kept in ``OUTPUT/self_calibration/self_calibration.json`` (the verified pairs' kinds, decision and
raw scores, how each synthetic image was made, the chosen threshold): a resumed run with the same collection,
models, settings, whitening sample, sample and seed reuses its scores and only chooses the threshold again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..modeling.errors import ConfigError, PredictionsError
from ..outputs import StagedFile
from ..retrieval.deduplication.collection import dedup
from ..retrieval.deduplication.settings import DedupSettings
from ..retrieval.descriptors.cached import Descriptor
from ..retrieval.detection.config import DetectConfig
from ..retrieval.sources import ImageListSource
from ..retrieval.work_folder import as_stored, digest, model_fingerprint, source_identity
from .synthetic import (
    COPY_RECIPE,
    NON_COPY_KINDS,
    TEMPLATE_GROUP,
    SyntheticPair,
    SyntheticSet,
    pair_kind,
    synthetic_set,
)

logger = logging.getLogger(__name__)

#: The folder of the self-calibration inside a dedup output folder, and its file.
FOLDER, FILE_NAME = "self_calibration", "self_calibration.json"
FORMAT, VERSION = "copynce-dedup-self-calibration", 2
DEFAULT_SAMPLE, DEFAULT_PRECISION, DEFAULT_SEED = 64, 0.9, 0
#: How the class ratio is set, in the saved file's words.
CLASS_RATIO = ("unweighted: copies and non-copies as the calibration collection's own candidate pairs hold them; "
               "true pairs never verified lower the recall, not the precision")


@dataclasses.dataclass(frozen=True)
class ThresholdChoice:
    """The chosen ``threshold``, the ``precision`` and the ``recall`` of the pairs scored at or above it, and whether
    the precision ``reached`` the target."""

    threshold: float
    precision: float
    recall: float
    reached: bool


def choose_threshold(is_copy: Sequence[bool], scores: Sequence[float], negative_weight: float,
                     target: float, positives: int | None = None) -> ThresholdChoice:
    """The lowest score ``t`` at which the pairs scored ``>= t`` reach precision ``target``, each non-copy counting
    ``negative_weight``: precision ``TP / (TP + negative_weight * FP)``, recall ``TP / positives``. Where no score
    reaches it, the score of best precision (then of most recall), with ``reached`` false.

    Args:
        is_copy: (P,) whether each pair is a copy.
        scores: (P,) its score.
        negative_weight: how many negatives one non-copy stands for (1: none).
        target: the precision aimed at, in (0, 1].
        positives: the copies the recall counts (``None``: those in ``is_copy``; more where some were never scored).
    """
    copies = sum(bool(c) for c in is_copy)
    if copies == 0:
        raise PredictionsError("the self-calibration verified no copy pair: no threshold can be chosen")
    positives = copies if positives is None else max(int(positives), copies)
    ranked = sorted(zip(map(float, scores), map(bool, is_copy)), key=lambda pair: -pair[0])
    points, found, false = [], 0, 0
    for i, (score, copy) in enumerate(ranked):
        found, false = found + copy, false + (not copy)
        if found and (i + 1 == len(ranked) or ranked[i + 1][0] < score):  # the last pair of this score
            points.append(ThresholdChoice(score, found / (found + negative_weight * false), found / positives, False))
    reaching = [point for point in points if point.precision >= target - 1e-12]
    if reaching:
        return dataclasses.replace(reaching[-1], reached=True)
    return max(points, key=lambda point: (point.precision, point.recall))


@dataclasses.dataclass
class SelfCalibration:
    """A self-calibration: the verified pairs of its calibration collection (kinds, decision scores), the sample,
    the ``true_pairs`` of the calibration collection (copy pairs among its readable images, verified or not), the
    target precision, the :class:`ThresholdChoice`, where it is saved and whether its scores were reused from
    there."""

    pairs: list[SyntheticPair]
    sample: list[str]
    true_pairs: int
    target: float
    choice: ThresholdChoice
    file: Path | None = None
    reused: bool = False

    @property
    def threshold(self) -> float:
        return self.choice.threshold

    @property
    def counts(self) -> dict[str, int]:
        copies = sum(p.is_copy for p in self.pairs)
        counts = {"images": len(self.sample), "copy_pairs": copies, "non_copy_pairs": len(self.pairs) - copies,
                  "true_pairs": self.true_pairs, "missed_true_pairs": self.true_pairs - copies}
        counts.update({kind: sum(p.kind == kind for p in self.pairs) for kind in NON_COPY_KINDS})
        return counts

    @property
    def origin(self) -> str:
        """Where the threshold comes from, in one line (the log's and the report's)."""
        counts, choice = self.counts, self.choice
        made = (f"self-calibrated on {counts['images']} images of this collection ({counts['copy_pairs']} positive "
                f"and {counts['non_copy_pairs']} negative verified pairs, {counts['shared template']} of them "
                "template-sharing)")
        measured = (f"(measured recall {choice.recall:.3f}; the candidates missed {counts['missed_true_pairs']} of "
                    f"the {counts['true_pairs']} true pairs; no class weighting)")
        if choice.reached:
            return f"{made}: threshold {choice.threshold:.4g} aims at precision {self.target:g} {measured}"
        return (f"{made}: no threshold reaches precision {self.target:g}; threshold {choice.threshold:.4g} has the "
                f"best, {choice.precision:.3f} {measured}")

    def to_dict(self, identity: dict, records: dict[str, dict]) -> dict:
        return {"format": FORMAT, "version": VERSION, "identity": identity, "target_precision": self.target,
                "class_ratio": CLASS_RATIO, "score": "the dedup run's decision score (pairs.csv's score)",
                "threshold": self.threshold, "precision": self.choice.precision, "recall": self.choice.recall,
                "reached": self.choice.reached, "counts": self.counts, "origin": self.origin,
                "recipe": COPY_RECIPE, "template_group": TEMPLATE_GROUP, "sample": self.sample, "images": records,
                "pairs": [{"query": p.query, "reference": p.reference, "kind": p.kind, "copy": p.is_copy,
                           "score": p.score, "raw_score": p.raw} for p in self.pairs]}


def _decide(pairs: list[SyntheticPair], sample: list[str], true_pairs: int, target: float) -> SelfCalibration:
    """The :class:`SelfCalibration` of verified ``pairs`` at ``target``."""
    choice = choose_threshold([p.is_copy for p in pairs], [p.score for p in pairs], 1.0, target, true_pairs)
    return SelfCalibration(pairs, sample, true_pairs, target, choice)


def _identity(source, descriptor: Descriptor, matcher: tuple | None, config: DetectConfig, settings: DedupSettings,
              whiten_from, sample: int, seed: int) -> dict:
    """What the calibration collection's verified pairs and their scores depend on (see :func:`self_calibrate`)."""
    decides = {name: value for name, value in dataclasses.asdict(config).items()
               if name not in ("batch_size", "num_workers", "cache_size", "chunk_size", "k", "collection")}
    identity = {"version": VERSION, "collection": source_identity(source), "sample": sample, "seed": seed,
                "recipe": COPY_RECIPE, "descriptor": model_fingerprint(descriptor.model),
                "descriptor_processor": digest(descriptor.processor.to_dict()), "config": decides,
                "settings": {name: value for name, value in dataclasses.asdict(settings).items() if name != "grouping"},
                "whiten_from": None if whiten_from is None else source_identity(whiten_from), "matcher": None}
    if matcher is not None:
        processor = matcher[1].to_dict() if hasattr(matcher[1], "to_dict") else repr(matcher[1])
        identity.update(matcher=model_fingerprint(matcher[0]), matcher_processor=digest(processor))
    return as_stored(identity)


def _reused(file: Path | None, identity: dict) -> dict | None:
    """The saved self-calibration in ``file`` when it was made for ``identity``, else ``None``."""
    if file is None or not file.is_file():
        return None
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("identity") != identity:
        return None
    return saved


def _check(sample: int, precision: float) -> None:
    if sample < 1:
        raise ConfigError(f"--self-calibration-sample must be at least 1, got {sample}")
    if not 0 < precision <= 1:
        raise ConfigError(f"--precision must be in (0, 1], got {precision}")


def self_calibrate(source, descriptor: Descriptor, matcher: tuple | None, config: DetectConfig,
                   folder: str | os.PathLike | None = None, sample: int = DEFAULT_SAMPLE,
                   precision: float = DEFAULT_PRECISION, seed: int = DEFAULT_SEED, whiten_from=None,
                   whitening_folder: str | os.PathLike | None = None, accelerator=None, progress: bool = True,
                   log: Callable[[str], None] = logger.info, settings: DedupSettings | None = None) -> SelfCalibration:
    """The threshold of a dedup run of ``source`` with these models, ``config`` and ``settings``, self-calibrated at
    ``precision`` by running :func:`~copynce_hf.retrieval.deduplication.collection.dedup` on the calibration collection (see the module).

    Args:
        source: the collection (``ids`` + ``load(i)``); nothing is written into it.
        descriptor, matcher, config, settings: the run's models and settings (``settings``' grouping is not used).
        folder: where ``self_calibration.json`` is kept and reused from (``None``: nowhere).
        sample: images of the collection sampled (all of them when it has fewer).
        precision: the precision aimed at.
        seed: draws the sample, the copies and the templates.
        whiten_from, whitening_folder: the run's whitening sample and the folder its descriptors are cached in (the
            run's own, so that they are read once).
        accelerator, progress, log: as for :func:`~copynce_hf.retrieval.deduplication.collection.dedup`.
    """
    from ..precision import make_accelerator

    _check(sample, precision)
    accelerator, settings = accelerator or make_accelerator(), settings or DedupSettings()
    identity = _identity(source, descriptor, matcher, config, settings, whiten_from, sample, seed)
    file = Path(folder) / FILE_NAME if folder is not None else None
    saved = _reused(file, identity)
    if saved is not None:
        log(f"self-calibration: reusing the verified pairs of {file}")
        pairs = [SyntheticPair(row["query"], row["reference"], row["kind"], row["score"], row["raw_score"])
                 for row in saved["pairs"]]
        made = _decide(pairs, saved["sample"], saved["counts"]["true_pairs"], precision)
        made.reused, records = True, saved["images"]
    else:
        collection = synthetic_set(source, sample, seed)
        run = dataclasses.replace(settings, grouping="connected")
        pairs, true_pairs = _verified(collection, descriptor, matcher, config, run, whiten_from, whitening_folder,
                                      accelerator, progress, log)
        made, records = _decide(pairs, collection.sample, true_pairs, precision), collection.records
    made.file = file
    if file is not None and accelerator.is_main_process:
        with StagedFile(file) as temporary:
            temporary.write_text(json.dumps(made.to_dict(identity, records), indent=1) + "\n", encoding="utf-8")
    log(made.origin)
    if not made.choice.reached:
        logger.warning("self-calibration: no threshold reaches precision %g on the calibration collection's verified "
                       "pairs; the best reached is %.3f, at threshold %.4g", precision, made.choice.precision,
                       made.threshold)
    return made


def _verified(collection: SyntheticSet, descriptor: Descriptor, matcher: tuple | None, config: DetectConfig,
              settings: DedupSettings, whiten_from, whitening_folder, accelerator, progress: bool,
              log: Callable[[str], None]) -> tuple[list[SyntheticPair], int]:
    """Run :func:`~copynce_hf.retrieval.deduplication.collection.dedup` on ``collection``'s images (in memory, nothing cached but the whitening sample):
    ``(its verified pairs, labelled and scored, the copy pairs among its readable images)``."""
    ids = list(collection.images)
    images = ImageListSource(ids, [collection.images[i] for i in ids])
    log(f"self-calibration: {len(collection.sample)} sampled images, a calibration collection of {len(ids)} images "
        f"run through dedup ({'matcher' if matcher is not None else 'descriptor'} decision scores)")
    result = dedup(images, descriptor, matcher, math.inf, config, progress=progress,
                   log=lambda line: log(f"self-calibration: {line}"), whiten_from=whiten_from,
                   accelerator=accelerator, settings=settings, whitening_folder=whitening_folder)
    pairs = [SyntheticPair(p.query_id, p.reference_id, pair_kind(collection.records, p.query_id, p.reference_id),
                           float(p.score), float(result.raw_scores[(p.query_id, p.reference_id)]))
             for p in result.pairs]
    per_image: dict[str, int] = {}
    for image in ids:
        if image not in result.skipped:
            per_image[collection.records[image]["of"]] = per_image.get(collection.records[image]["of"], 0) + 1
    if result.skipped:
        log(f"self-calibration: {len(result.skipped)} synthetic image(s) could not be read (too small)")
    return pairs, sum(math.comb(count, 2) for count in per_image.values())
