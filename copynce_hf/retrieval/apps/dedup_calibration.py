"""The default threshold of ``copynce dedup``: calibrated on the collection itself, at a stated precision.

Beyond the paper. Without ``--threshold`` or ``--calibration``, :func:`self_calibrate` makes the synthetic pairs of
:mod:`.dedup_synthetic` (PixTrace copies of a seeded sample of the collection, copies put into templates, copies
of copies; template-sharing non-copies; pairs of different sampled images the descriptor finds nearest) and scores
them with the run's own scoring path (:class:`_RunScorer`): the matcher with its ``matcher_lce`` views when the run
has one, else the descriptor's cosine with its ``descriptor_lce`` views and the run's whitening. The threshold is
the lowest score at which these pairs reach the target precision (:func:`choose_threshold`).

Precision depends on how many non-copies there are per copy. The prior used here: the non-copy pairs count as
``candidates - 1`` negatives per copy pair (:func:`negatives_per_positive`), the candidate pairs a dedup run
verifies per true pair in a collection where each image has one copy among its ``candidates`` nearest images. The
synthetic non-copies are harder than most candidates (the nearest and the template-sharing ones) while real
collections hold fewer copies than one per image: the two are meant to balance, and the log, the report and the
saved file state the ratio. Where no threshold reaches the target, the one of best precision is taken and a
warning names the precision reached.

Two sampled images may be copies of each other in the collection; their pairs still count as non-copies (no score
tells them from the hard non-copies a model confuses: leaving the pairs that score like copies out would leave
those out too). A sample of K of N images holds about K(K-1) / 2(N-1) such pairs where every image has one copy:
none to speak of in a large collection; in a small one full of copies they make the threshold higher (more
precise, less recall) than it would be.

Everything is kept in ``OUTPUT/self_calibration/self_calibration.json`` (the pairs' kinds and scores, how each
synthetic image was made, the chosen threshold): a resumed run with the same collection, models, views, whitening,
sample and seed reuses its scores and only chooses the threshold again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ...modeling.errors import ConfigError, PredictionsError
from ...outputs import StagedFile
from ..jobs.work_folder import as_stored, digest, model_fingerprint, source_identity
from ..search.sources import ImageListSource
from ..search.view_search import owner_of
from ..search.views import ViewPreset
from ..search.whitening import Whitening
from .dedup import descriptor_pair_scores, self_search_pairs
from .dedup_synthetic import (
    COPY_RECIPE,
    NON_COPY_KINDS,
    TEMPLATE_GROUP,
    SyntheticPair,
    SyntheticSet,
    synthetic_set,
)
from .detect import (
    Descriptor,
    DetectConfig,
    learn_whitening,
    matcher_scores,
    query_view_descriptors,
    view_index,
)

logger = logging.getLogger(__name__)

#: The folder of the self-calibration inside a dedup output folder, and its file.
FOLDER, FILE_NAME = "self_calibration", "self_calibration.json"
FORMAT, VERSION = "copynce-dedup-self-calibration", 1
DEFAULT_SAMPLE, DEFAULT_PRECISION, DEFAULT_SEED = 64, 0.9, 0
#: The nearest other sampled images each sampled image is paired with as non-copies.
NEAREST_NEGATIVES = 2


def negatives_per_positive(candidates: int) -> int:
    """The class-ratio prior: negative pairs per copy pair, ``candidates - 1`` (at least 1; see the module)."""
    return max(1, int(candidates) - 1)


@dataclasses.dataclass(frozen=True)
class ThresholdChoice:
    """The chosen ``threshold``, the weighted ``precision`` and the ``recall`` of the synthetic pairs scored at or
    above it, and whether the precision ``reached`` the target."""

    threshold: float
    precision: float
    recall: float
    reached: bool


def choose_threshold(is_copy: Sequence[bool], scores: Sequence[float], negative_weight: float,
                     target: float) -> ThresholdChoice:
    """The lowest score ``t`` at which the pairs scored ``>= t`` reach precision ``target``, each non-copy counting
    ``negative_weight``: precision ``TP / (TP + negative_weight * FP)``, recall ``TP / copies``. Where no score
    reaches it, the score of best precision (then of most recall), with ``reached`` false.

    Args:
        is_copy: (P,) whether each pair is a copy.
        scores: (P,) its score.
        negative_weight: how many negatives one synthetic non-copy stands for.
        target: the precision aimed at, in (0, 1].
    """
    copies = sum(bool(c) for c in is_copy)
    if copies == 0:
        raise PredictionsError("the self-calibration scored no copy pair: no threshold can be chosen")
    ranked = sorted(zip(map(float, scores), map(bool, is_copy)), key=lambda pair: -pair[0])
    points, found, false = [], 0, 0
    for i, (score, copy) in enumerate(ranked):
        found, false = found + copy, false + (not copy)
        if found and (i + 1 == len(ranked) or ranked[i + 1][0] < score):  # the last pair of this score
            points.append(ThresholdChoice(score, found / (found + negative_weight * false), found / copies, False))
    reaching = [point for point in points if point.precision >= target - 1e-12]
    if reaching:
        return dataclasses.replace(reaching[-1], reached=True)
    return max(points, key=lambda point: (point.precision, point.recall))


@dataclasses.dataclass
class SelfCalibration:
    """A self-calibration: its synthetic pairs (scored), the sample, the target precision, the class-ratio prior
    (``ratio`` negatives per copy pair), the :class:`ThresholdChoice`, where it is saved and whether its scores
    were reused from there."""

    pairs: list[SyntheticPair]
    sample: list[str]
    target: float
    ratio: int
    choice: ThresholdChoice
    file: Path | None = None
    reused: bool = False

    @property
    def threshold(self) -> float:
        return self.choice.threshold

    @property
    def counts(self) -> dict[str, int]:
        copies = sum(p.is_copy for p in self.pairs)
        counts = {"images": len(self.sample), "copy_pairs": copies, "non_copy_pairs": len(self.pairs) - copies}
        counts.update({kind: sum(p.kind == kind for p in self.pairs) for kind in NON_COPY_KINDS})
        return counts

    @property
    def negative_weight(self) -> float:
        counts = self.counts
        return self.ratio * counts["copy_pairs"] / counts["non_copy_pairs"] if counts["non_copy_pairs"] else 0.0

    @property
    def origin(self) -> str:
        """Where the threshold comes from, in one line (the log's and the report's)."""
        counts, choice = self.counts, self.choice
        made = (f"self-calibrated on {counts['images']} images of this collection ({counts['copy_pairs']} positive "
                f"pairs, {counts['non_copy_pairs']} negative pairs incl. {counts['shared template']} template-sharing, "
                f"weighted as {self.ratio} negative{'s' if self.ratio != 1 else ''} per positive pair)")
        if choice.reached:
            return (f"{made}: threshold {choice.threshold:.4g} aims at precision {self.target:g} (measured recall "
                    f"{choice.recall:.3f} on the synthetic pairs)")
        return (f"{made}: no threshold reaches precision {self.target:g}; threshold {choice.threshold:.4g} has the "
                f"best, {choice.precision:.3f} (measured recall {choice.recall:.3f} on the synthetic pairs)")

    def to_dict(self, identity: dict, records: dict[str, dict]) -> dict:
        return {"format": FORMAT, "version": VERSION, "identity": identity, "target_precision": self.target,
                "negatives_per_positive": self.ratio, "negative_weight": self.negative_weight,
                "threshold": self.threshold, "precision": self.choice.precision, "recall": self.choice.recall,
                "reached": self.choice.reached, "counts": self.counts, "origin": self.origin,
                "recipe": COPY_RECIPE, "template_group": TEMPLATE_GROUP, "nearest_negatives": NEAREST_NEGATIVES,
                "sample": self.sample, "images": records,
                "pairs": [{"query": p.query, "reference": p.reference, "kind": p.kind, "copy": p.is_copy,
                           "score": p.score} for p in self.pairs]}


def _decide(pairs: list[SyntheticPair], sample: list[str], target: float, ratio: int) -> SelfCalibration:
    """The :class:`SelfCalibration` of scored ``pairs`` at ``target`` with the prior ``ratio``."""
    made = SelfCalibration(pairs, sample, target, ratio, ThresholdChoice(0.0, 0.0, 0.0, False))
    made.choice = choose_threshold([p.is_copy for p in pairs], [p.score for p in pairs], made.negative_weight, target)
    return made


@dataclasses.dataclass
class _RunScorer:
    """The scoring path of one dedup run, over synthetic images: the matcher when there is one, else the descriptor's
    cosine (``descriptor_lce`` views, ``whitening``)."""

    descriptor: Descriptor
    matcher: tuple | None
    config: DetectConfig
    whitening: Whitening | None
    accelerator: object
    progress: bool
    log: Callable[[str], None]

    def descriptors(self, source, what: str):
        """``(index of the reference views, query view descriptors)`` of ``source``'s images."""
        preset, extract = ViewPreset(self.config.descriptor_lce), {
            "batch_size": self.config.batch_size, "num_workers": self.config.num_workers,
            "accelerator": self.accelerator}
        index = view_index(self.descriptor, source, preset, None, progress=self.progress,
                           description=f"self-calibration: {what}", whitening=self.whitening, **extract)
        if preset.name == "none":
            return index, index.references
        queries, _, _ = query_view_descriptors(self.descriptor, source, preset, None, progress=self.progress,
                                               description=f"self-calibration: {what} (query views)", **extract)
        return index, queries

    def nearest(self, made: SyntheticSet) -> list[tuple[str, str]]:
        """Each sampled original's :data:`NEAREST_NEGATIVES` nearest other sampled originals, by the run's
        descriptor search (unordered pairs)."""
        originals = made.originals()
        if len(originals) < 2:
            return []
        source = ImageListSource(originals, [made.images[i] for i in originals])
        index, queries = self.descriptors(source, "sampled images")
        found = self_search_pairs(index, queries, ViewPreset(self.config.descriptor_lce),
                                  min(NEAREST_NEGATIVES, len(originals) - 1), {i: n for n, i in enumerate(originals)})
        return [(p.query_id, p.reference_id) for p in found.pairs]

    def score(self, made: SyntheticSet) -> None:
        """Score every pair of ``made`` (its ``score``; ``None`` where the matcher could not score it)."""
        ids = list(made.images)
        source = ImageListSource(ids, [made.images[i] for i in ids])
        pairs = [(p.query, p.reference) for p in made.pairs]
        if self.matcher is not None:
            scores, _ = matcher_scores(pairs, *self.matcher, source, source, self.config, self.accelerator, None,
                                       self.progress, lambda line: self.log(f"self-calibration {line}"))
        else:
            scores = self.descriptor_scores(source, pairs)
        for pair, score in zip(made.pairs, scores):
            pair.score = None if score is None else float(score)

    def descriptor_scores(self, source, pairs: list[tuple[str, str]]) -> list[float | None]:
        """The descriptor score of each pair of ``source``'s images, the best of its two directions (a pair the
        self-search finds from both sides keeps its best score); ``None`` where an image could not be read."""
        index, queries = self.descriptors(source, "synthetic images")
        preset = ViewPreset(self.config.descriptor_lce)
        read = ({owner_of(row, preset.name) for row in index.references.ids}
                & {owner_of(row, preset.name) for row in queries.ids})
        scored = [(a, b) for a, b in pairs if a in read and b in read]
        forward = descriptor_pair_scores(index, queries, preset, scored)
        backward = descriptor_pair_scores(index, queries, preset, [(b, a) for a, b in scored])
        best = {pair: max(f, b) for pair, f, b in zip(scored, forward, backward)}
        return [best.get(pair) for pair in pairs]

    def identity(self, source, sample: int, seed: int) -> dict:
        """What the synthetic pairs and their scores depend on (see :func:`self_calibrate`)."""
        descriptor, matcher = self.descriptor, self.matcher
        identity = {"version": VERSION, "collection": source_identity(source), "sample": sample, "seed": seed,
                    "recipe": COPY_RECIPE, "descriptor": model_fingerprint(descriptor.model),
                    "descriptor_processor": digest(descriptor.processor.to_dict()),
                    "descriptor_lce": self.config.descriptor_lce,
                    "whitening": self.whitening.fingerprint() if self.whitening is not None else None, "matcher": None}
        if matcher is not None:
            processor = matcher[1].to_dict() if hasattr(matcher[1], "to_dict") else repr(matcher[1])
            identity.update(matcher=model_fingerprint(matcher[0]), matcher_processor=digest(processor),
                            matcher_lce=self.config.matcher_lce)
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
                   log: Callable[[str], None] = logger.info) -> SelfCalibration:
    """The threshold of a dedup run of ``source`` with these models and ``config``, self-calibrated at ``precision``.

    Args:
        source: the collection (``ids`` + ``load(i)``); nothing is written into it.
        descriptor, matcher, config: the run's models and settings (``descriptor_lce``, ``matcher_lce``,
            ``candidates``: the class-ratio prior, batch size, workers).
        folder: where ``self_calibration.json`` is kept and reused from (``None``: nowhere).
        sample: images of the collection sampled (all of them when it has fewer).
        precision: the precision aimed at.
        seed: draws the sample, the copies and the templates.
        whiten_from, whitening_folder: the run's whitening sample and the folder its descriptors are cached in (the
            run's own, so that it is learned once).
        accelerator, progress, log: as for :func:`~.dedup.dedup`.
    """
    from ...precision import make_accelerator

    _check(sample, precision)
    accelerator = accelerator or make_accelerator()
    whitening = None
    if whiten_from is not None:
        whitening = learn_whitening(descriptor, whiten_from, ViewPreset(config.descriptor_lce), config.whiten_dim,
                                    whitening_folder, progress=progress, batch_size=config.batch_size,
                                    num_workers=config.num_workers, accelerator=accelerator)
    scorer = _RunScorer(descriptor, matcher, config, whitening, accelerator, progress, log)
    identity = scorer.identity(source, sample, seed)
    file = Path(folder) / FILE_NAME if folder is not None else None
    ratio = negatives_per_positive(config.candidates)
    saved = _reused(file, identity)
    if saved is not None:
        log(f"self-calibration: reusing the scored pairs of {file}")
        pairs = [SyntheticPair(row["query"], row["reference"], row["kind"], row["score"]) for row in saved["pairs"]]
        made = _decide(pairs, saved["sample"], precision, ratio)
        made.reused, records = True, saved["images"]
    else:
        made, records = _scored(source, scorer, sample, seed, precision, ratio)
    made.file = file
    if file is not None and accelerator.is_main_process:
        with StagedFile(file) as temporary:
            temporary.write_text(json.dumps(made.to_dict(identity, records), indent=1) + "\n", encoding="utf-8")
    log(made.origin)
    if not made.choice.reached:
        logger.warning("self-calibration: no threshold reaches precision %g on the synthetic pairs; the best reached "
                       "is %.3f, at threshold %.4g", precision, made.choice.precision, made.threshold)
    return made


def _scored(source, scorer: _RunScorer, sample: int, seed: int, precision: float,
            ratio: int) -> tuple[SelfCalibration, dict[str, dict]]:
    """Make the synthetic set, score it with ``scorer`` and decide: ``(the self-calibration, how each synthetic
    image was made)``."""
    made = synthetic_set(source, sample, seed)
    made.add_nearest(scorer.nearest(made))
    scorer.log(f"self-calibration: {len(made.sample)} sampled images, {len(made.pairs)} synthetic pairs scored by the "
               f"{'matcher' if scorer.matcher is not None else 'descriptor'}")
    scorer.score(made)
    unscored = [p for p in made.pairs if p.score is None]
    made.pairs = [p for p in made.pairs if p.score is not None]
    if unscored:
        scorer.log(f"self-calibration: {len(unscored)} pair(s) could not be scored (an image unreadable or too small)")
    return _decide(made.pairs, made.sample, precision, ratio), made.records
