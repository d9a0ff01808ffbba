"""Deduplication of one collection: every group of copies among its own images.

The detection pipeline of :mod:`.detect` with the collection on both sides:

1. the descriptor index over the collection (the same :func:`~.detect.view_index`, cache folder and
   optional whitening as ``detect``), searched with every image's own descriptors for its
   ``candidates + 1`` nearest neighbours, the image itself then left out (self-search);
2. each unordered pair found (from either side) is verified once by the matcher, the earlier image in
   the collection's order as the query, in the chunks ``detect`` scores in (:func:`~.detect.matcher_scores`:
   the encoder-token cache, chunks shared by Accelerate's processes, saved and resumed); without a matcher
   the descriptor score is the pair's score;
3. groups are the connected components of the graph whose edges are the pairs scored at or above the
   threshold; a group's first member is its earliest image, and every other member is given its
   score to that first member (scored now when that pair was not a candidate).

Scores are copy probabilities with a matcher (``sigmoid`` of its logit), cosines without one.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ...modeling.errors import ConfigError, PredictionsError
from ...outputs import StagedFile
from ..search.descriptors import DescriptorSet
from ..search.index import DescriptorIndex
from ..search.predictions import Prediction
from ..search.references import search_references
from ..search.view_search import owner_of
from ..search.views import ViewPreset
from .detect import (
    Descriptor,
    DetectConfig,
    learn_whitening,
    matcher_scores,
    note_skips,
    query_view_descriptors,
    view_index,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DedupResult:
    """What :func:`dedup` found.

    Attributes:
        groups: each group of copies (two images or more) as ``[(image id, score to the first member), ...]``,
            the first member first with score ``None``; groups ordered by their first member, members by
            their place in the collection.
        pairs: every verified pair ``Prediction(earlier image, later image, score)``.
        candidates: the descriptor's pairs (the same orientation, descriptor scores) that were verified.
        threshold: the score at or above which a pair joins its images' groups.
        seconds: wall time per stage (``whitening``, ``index``, ``self-search``, ``matcher``, ``groups``).
        skipped: image id -> plain-words reason of each image left out.
        matcher_cost: encoder and fusion passes the matcher ran (``None`` without matcher).
    """

    groups: list[list[tuple[str, float | None]]]
    pairs: list[Prediction]
    candidates: list[Prediction]
    threshold: float
    seconds: dict[str, float]
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    matcher_cost: dict[str, int] | None = None


def connected_groups(ids: list[str], edges: list[tuple[str, str]]) -> list[list[str]]:
    """Connected components of two images or more of the graph over ``ids`` with ``edges``.

    Each component lists its ids in the order of ``ids``; components are ordered by their first id.
    """
    position = {image_id: i for i, image_id in enumerate(ids)}
    parent = list(range(len(ids)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in edges:
        ra, rb = root(position[a]), root(position[b])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the earlier image stays the root
    members: dict[int, list[str]] = {}
    for i, image_id in enumerate(ids):
        members.setdefault(root(i), []).append(image_id)
    return [group for _, group in sorted(members.items()) if len(group) > 1]


def group_pairs(groups: Iterable[Iterable[str]]) -> set[frozenset[str]]:
    """Every unordered pair of images that share a group."""
    return {frozenset(pair) for group in groups for pair in itertools.combinations(list(group), 2)}


def pair_precision_recall(found: Iterable[Iterable[str]], truth: Iterable[Iterable[str]]) -> tuple[float, float]:
    """``(precision, recall)`` of the image pairs grouped together by ``found`` against those of ``truth``
    (groups of image ids); precision is 1 when ``found`` groups nothing, recall 1 when ``truth`` does."""
    found_pairs, true_pairs = group_pairs(found), group_pairs(truth)
    hits = len(found_pairs & true_pairs)
    return (hits / len(found_pairs) if found_pairs else 1.0), (hits / len(true_pairs) if true_pairs else 1.0)


def self_search_pairs(index: DescriptorIndex, queries: DescriptorSet, preset: ViewPreset, candidates: int,
                      order: dict[str, int]) -> list[Prediction]:
    """Each image's ``candidates`` nearest other images, as unordered pairs ``(earlier, later)`` by ``order``
    (image id -> place in the collection); a pair found from both sides keeps its best score."""
    found = search_references(index, queries, candidates + 1, query_views=preset)
    best: dict[tuple[str, str], float] = {}
    kept: dict[str, int] = {}
    for p in sorted(found, key=lambda p: (order[p.query_id], -p.score, order[p.reference_id])):
        if p.query_id == p.reference_id or kept.get(p.query_id, 0) >= candidates:
            continue
        kept[p.query_id] = kept.get(p.query_id, 0) + 1
        pair = tuple(sorted((p.query_id, p.reference_id), key=order.__getitem__))
        best[pair] = max(p.score, best.get(pair, -np.inf))
    return [Prediction(a, b, score) for (a, b), score in sorted(best.items(), key=lambda item: (
        order[item[0][0]], order[item[0][1]]))]


def _descriptor_scores(index: DescriptorIndex, queries: DescriptorSet, preset: ViewPreset,
                       pairs: list[tuple[str, str]]) -> list[float]:
    """The descriptor score of each ``(a, b)`` pair: the best cosine of a query view of ``a`` and a reference view
    of ``b`` (whitened when the index whitens), as the search scores it."""
    def rows(descriptors: DescriptorSet) -> dict[str, list[int]]:
        owners: dict[str, list[int]] = {}
        for row, row_id in enumerate(descriptors.ids):
            owners.setdefault(owner_of(row_id, preset.name), []).append(row)
        return owners

    query_rows, reference_rows = rows(queries), rows(index.references)
    query_vectors, reference_vectors = index.transform(queries.descriptors), index.transform(index.references.descriptors)
    return [float((query_vectors[query_rows[a]] @ reference_vectors[reference_rows[b]].T).max()) for a, b in pairs]


def calibrated_threshold(calibration, precision: float, descriptor: str, matcher: str | None,
                         config: DetectConfig, whitened: bool = False) -> tuple[float, str]:
    """The threshold at ``precision`` of a :class:`~.calibration.Calibration` (a ``copynce calibrate`` file) for a
    dedup run, and a line saying where it comes from. ``descriptor`` and ``matcher`` are the run's model
    identities (:func:`~.calibration.model_identity`).

    With a matcher the ``matcher`` stage decides: its scores depend on the matcher and its views only, which must
    be those calibrated. Without one the ``descriptor`` stage decides: the calibrated descriptor, views, no score
    normalisation and no whitening (dedup has neither) must match. A mismatch is a :class:`ConfigError` naming both.
    """
    calibrated, settings = calibration.pipeline, calibration.pipeline.get("settings", {})
    if matcher is not None:
        checks = [("matcher", calibrated.get("matcher"), matcher),
                  ("matcher_lce", settings.get("matcher_lce"), config.matcher_lce)]
    else:
        checks = [("descriptor model(s)", calibrated.get("descriptors"), [descriptor]),
                  ("descriptor_lce", settings.get("descriptor_lce"), config.descriptor_lce),
                  ("score normalisation", settings.get("score_normalisation"), False)]
        if whitened:
            raise ConfigError(f"{calibration.name} holds descriptor thresholds without whitening; a dedup run with "
                              "--whiten-from and --matcher none needs --threshold")
    for name, made_with, used in checks:
        if made_with != used:
            raise ConfigError(f"{calibration.name} was made with {name} {made_with!r}, but this dedup run uses "
                              f"{used!r}; calibrate again with it or pass --threshold")
    stage = calibration.stage_for({"matcher": matcher})
    point = calibration.point(precision, stage)
    return point.threshold, (f"{stage} score {point.threshold:.4g} at precision {point.precision:g} in "
                             f"{calibration.source} (expected recall {point.recall:.3f})")


def dedup(
    source,
    descriptor: Descriptor,
    matcher: tuple | None = None,
    threshold: float = 0.5,
    config: DetectConfig | None = None,
    index_folder: str | os.PathLike | None = None,
    progress: bool = True,
    log: Callable[[str], None] = logger.info,
    whiten_from=None,
    rescoring_folder: str | os.PathLike | None = None,
    accelerator=None,
) -> DedupResult:
    """Find the groups of copies among the images of ``source``.

    Args:
        source: an image source (``ids`` + ``load(i)``, e.g. :class:`ImageFolderSource`).
        descriptor: the descriptor model that proposes candidate pairs.
        matcher: ``(model, image_processor)`` of a CopyNCE matcher verifying the pairs, or ``None``
            (descriptor scores decide).
        threshold: pairs scored at or above it are copies.
        config: :class:`~.detect.DetectConfig`: ``candidates`` (neighbours verified per image),
            ``descriptor_lce``, ``matcher_lce``, ``whiten_dim``, batch size, workers, cache size.
        index_folder: where the index (and whitening) of ``source`` are kept and reused, as by ``detect``:
            ``<index_folder>/<descriptor name>/references``; ``None``: not kept.
        progress: progress bars per stage.
        log: receives one line per stage.
        whiten_from: sample images to learn a whitening from (:mod:`.whitening`); ``None``: none.
        rescoring_folder: where the matcher's scored chunks are kept, so that a run cut short resumes
            (:mod:`.chunked_scoring`); ``None``: not kept.
        accelerator: an ``accelerate.Accelerator`` (``None``: one is made); under ``accelerate launch`` every
            process calls :func:`dedup` and gets the whole result, as with :func:`~.detect.detect`.
    """
    from ...precision import make_accelerator

    config = config or DetectConfig()
    if len(source) < 2:
        raise ConfigError(f"deduplication needs at least 2 images, got {len(source)}")
    run = _DedupRun(source, descriptor, matcher, config, accelerator or make_accelerator(), progress, log)
    folder = Path(index_folder) / descriptor.name if index_folder is not None else None
    index, queries, skipped = run.descriptors(folder, whiten_from)
    readable = [image_id for image_id in source.ids if image_id not in skipped]
    if len(readable) < 2:
        raise PredictionsError(f"deduplication needs at least 2 readable images, got {len(readable)} of "
                               f"{len(source)}")
    order = {image_id: i for i, image_id in enumerate(source.ids)}
    start = time.perf_counter()
    candidates = self_search_pairs(index, queries, run.preset, config.candidates, order)
    run.seconds["self-search"] = time.perf_counter() - start
    log(f"{descriptor.name}: {len(candidates)} candidate pairs among {len(readable)} images "
        f"(the {config.candidates} nearest other images of each)")
    pairs = run.verify(candidates, rescoring_folder)
    start = time.perf_counter()
    groups = run.groups(pairs, threshold, lambda missing: _descriptor_scores(index, queries, run.preset, missing))
    run.seconds["groups"] = time.perf_counter() - start
    log(f"{len(groups)} groups of copies ({sum(len(group) for group in groups)} images) at threshold "
        f"{threshold:.4g}")
    return DedupResult(groups, pairs, candidates, threshold, run.seconds, skipped, run.cost)


@dataclasses.dataclass
class _DedupRun:
    """The steps of :func:`dedup` over one collection: its inputs, settings, times and matcher passes."""

    source: object
    descriptor: Descriptor
    matcher: tuple | None
    config: DetectConfig
    accelerator: object
    progress: bool
    log: Callable[[str], None]
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    cost: dict[str, int] | None = None

    @property
    def preset(self) -> ViewPreset:
        return ViewPreset(self.config.descriptor_lce)

    @property
    def extract(self) -> dict:
        return {"batch_size": self.config.batch_size, "num_workers": self.config.num_workers,
                "accelerator": self.accelerator}

    def descriptors(self, folder: Path | None, whiten_from) -> tuple[DescriptorIndex, DescriptorSet, dict[str, str]]:
        """Step 1: ``(index of the collection's views, its query views, id -> reason of each image left out)``,
        whitened when ``whiten_from`` is given; cached in ``folder`` as ``detect`` caches them."""
        descriptor, progress = self.descriptor, self.progress
        whitening = None
        if whiten_from is not None:
            start = time.perf_counter()
            whitening = learn_whitening(descriptor, whiten_from, self.preset, self.config.whiten_dim,
                                        folder / "whitening" if folder else None, progress=progress,
                                        description="whitening sample", **self.extract)
            self.seconds["whitening"] = time.perf_counter() - start
            self.log(f"whitening learned from {whitening.samples} sample views ({whitening.input_dim} -> "
                     f"{whitening.dim} dimensions)")
        start = time.perf_counter()
        index = view_index(descriptor, self.source, self.preset, folder / "references" if folder else None,
                           progress=progress, description=f"{descriptor.name}: image views", whitening=whitening,
                           log=self.log, **self.extract)
        self.seconds["index"] = time.perf_counter() - start
        skipped: dict[str, str] = {}
        note_skips(index.references, skipped)
        if self.preset.name == "none":
            return index, index.references, skipped  # one view per image: the indexed descriptors are the queries
        queries, _, _ = query_view_descriptors(descriptor, self.source, self.preset,
                                               folder / "queries" if folder else None, progress=progress,
                                               description=f"{descriptor.name}: query views", **self.extract)
        note_skips(queries, skipped)
        return index, queries, skipped

    def matcher_scores(self, pairs: list[tuple[str, str]], folder) -> list[float | None]:
        """The matcher's score of each pair (:func:`~.detect.matcher_scores`); its passes add to :attr:`cost`."""
        scores, cost = matcher_scores(pairs, *self.matcher, self.source, self.source, self.config, self.accelerator,
                                      folder, self.progress, self.log)
        self.cost = cost if self.cost is None else {name: self.cost[name] + cost[name] for name in cost}
        return scores

    def verify(self, candidates: list[Prediction], folder) -> list[Prediction]:
        """Step 2: the candidate pairs scored by the matcher (chunks kept in ``folder``), or as they are without
        one."""
        if self.matcher is None:
            return list(candidates)
        start = time.perf_counter()
        pair_ids = [(p.query_id, p.reference_id) for p in candidates]
        scores = self.matcher_scores(pair_ids, folder)
        pairs = [Prediction(a, b, s) for (a, b), s in zip(pair_ids, scores) if s is not None]
        self.seconds["matcher"] = time.perf_counter() - start
        on = f" on {self.accelerator.num_processes} processes" if self.accelerator.num_processes > 1 else ""
        self.log(f"matcher: {len(pairs)} pairs verified{on} ({self.cost['encoded_views']} encoder passes, "
                 f"{self.cost['fused_pairs']} fusion passes)")
        return pairs

    def groups(self, pairs: list[Prediction], threshold: float,
               descriptor_scores: Callable[[list[tuple[str, str]]], list[float]]) -> list[list[tuple[str, float | None]]]:
        """Step 3: the connected components of the pairs scored at or above ``threshold``, each member with its
        score to the group's first image (scored now, by the matcher or ``descriptor_scores``, when that pair was
        not a candidate)."""
        edges = [(p.query_id, p.reference_id) for p in pairs if p.score >= threshold]
        members = connected_groups(self.source.ids, edges)
        scored = {(p.query_id, p.reference_id): p.score for p in pairs}
        missing = [(group[0], member) for group in members for member in group[1:] if (group[0], member) not in scored]
        if missing:
            extra = self.matcher_scores(missing, None) if self.matcher is not None else descriptor_scores(missing)
            scored.update(zip(missing, extra))
        return [[(group[0], None), *((member, scored.get((group[0], member))) for member in group[1:])]
                for group in members]


#: The header of ``groups.csv``.
GROUP_COLUMNS = ("group_id", "image_id", "score_to_first")


def write_groups(path: str | os.PathLike, groups: list[list[tuple[str, float | None]]]) -> int:
    """Write ``groups.csv``: one row per member (``group_id`` from 0, ``image_id``, ``score_to_first``: the pair's
    score with the group's first member, empty on the first member's own row); returns the rows written."""
    rows = 0
    with StagedFile(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(GROUP_COLUMNS)
        for number, group in enumerate(groups):
            for image_id, score in group:
                writer.writerow([number, image_id, "" if score is None else f"{score:.6f}"])
                rows += 1
    return rows
