"""Deduplication of one collection: every group of copies among its own images.

The detection pipeline of :mod:`copynce_hf.retrieval.detection` with the collection on both sides:

1. the descriptor index over the collection (the same :func:`~copynce_hf.retrieval.search.cached_index.view_index`, cache folder and
   optional whitening as ``detect``), searched with every image's own descriptors for its nearest other images
   (self-search, the image itself left out). With collection normalisation (``DedupSettings.collection``, on by
   default) each image's background is its mean cosine to its neighbours of ranks ``collection.k_start..
   collection.k_end``, a pair's score is its cosine minus the mean of its two backgrounds (CSLS,
   :mod:`~copynce_hf.retrieval.search.background`), and each image keeps its ``candidates`` best pairs by that score out of its
   ``max(2 * candidates, collection.k_end + 1)`` nearest; without it, its ``candidates`` nearest by cosine;
2. each unordered pair kept (from either side) is verified by the matcher: once, the earlier image in the
   collection's order as the query, when the matcher's score does not depend on the order (the authors' form);
   in both orders for a matcher whose fused sequence tells query from reference (segment embeddings), its
   probability then the sigmoid of the mean of the two logits (``DedupSettings.matcher_orders``); in the
   chunks ``detect`` scores in (:func:`~copynce_hf.retrieval.verify.pairs.score_pairs`: chunks shared by Accelerate's processes, saved
   and resumed). Whole images (``matcher_lce`` ``none``) are encoded once each into a token store
   (:mod:`~copynce_hf.retrieval.content.store`) that the content tokens and every fusion read; LCE views go through the
   encoder-token cache. With matcher normalisation (:class:`DedupSettings`, on by default)
   the decision score is the matcher's probability with each image's background logit above an anchor discounted
   (:func:`~copynce_hf.retrieval.search.background.normalised_probability`); without a matcher the descriptor score of step 1
   decides;
3. groups of the pairs whose decision score is at or above the threshold (:mod:`.grouping`): by default a pair
   joins a group only if it clears the threshold against the group's representative, or connected components
   (``grouping="connected"``); each member gets its score to the first member (scored now when that pair was not
   a candidate) and how it joined.

Scores are copy probabilities with a matcher (``sigmoid`` of its logit), cosines without one; every verified
pair keeps its raw score beside its decision score (``pairs.csv``'s ``raw_score`` and ``score``).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...modeling.errors import ConfigError, PredictionsError
from ...outputs import StagedFile
from ..content.crops import (
    VIEW_CROP,
    VIEW_WHOLE,
    Box,
    CropPair,
    CropSource,
    content_boxes,
    crop_pairs,
    crop_views,
)
from ..content.stage import (
    content_setting,
    dedup_content_index,
    dedup_keep_masks,
    descriptor_content,
    matcher_content,
)
from ..content.store import TokenStore, token_folder, token_identity
from ..descriptors.cached import Descriptor, learn_whitening, note_skips, query_view_descriptors
from ..descriptors.extract import extract_descriptors
from ..descriptors.sets import DescriptorSet
from ..descriptors.view_extraction import owner_of
from ..descriptors.views import ViewPreset
from ..detection.config import MATCHER_VIEW_NAMES, DetectConfig
from ..predictions import Prediction
from ..search.background import (
    matcher_backgrounds,
    mean_logit_probability,
    neighbour_background,
    normalised_probability,
    pair_background,
)
from ..search.cached_index import view_index
from ..search.index import DescriptorIndex
from ..search.references import search_references
from ..sources import SourceImages
from ..verify.pairs import score_pairs
from .grouping import GroupMember, group_members
from .settings import DedupSettings

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DedupResult:
    """What :func:`dedup` found.

    Attributes:
        members: each group of copies (two images or more) as :class:`~.grouping.GroupMember` rows, the first
            member (the representative) first, the others in the collection's order; groups ordered by their
            first member.
        pairs: every verified pair ``Prediction(earlier image, later image, decision score)``.
        candidates: the descriptor's pairs that were verified, with their descriptor decision scores (normalised
            when collection normalisation is on).
        threshold: the decision score at or above which a pair is a copy.
        seconds: wall time per stage (``whitening``, ``index``, ``self-search``, ``matcher``, ``groups``).
        skipped: image id -> plain-words reason of each image left out.
        matcher_cost: encoder and fusion passes the matcher ran (``None`` without matcher).
        raw_scores: ``(earlier, later)`` -> raw score of every verified pair (the matcher's probability, or the
            descriptor cosine without matcher).
        raw_candidate_scores: ``(earlier, later)`` -> descriptor cosine of every candidate.
        backgrounds: ``descriptor`` / ``matcher`` -> image id -> its background (cosine, logit); empty without
            normalisation.
        crop_boxes: image id -> the box of its content crop (:mod:`copynce_hf.retrieval.content.crops`), for the images that have one.
        crop_pairs: the pairs verified on their best views, one of them a content crop
            (:class:`~copynce_hf.retrieval.content.crops.CropPair`); their raw scores are those of those views.
    """

    members: list[list[GroupMember]]
    pairs: list[Prediction]
    candidates: list[Prediction]
    threshold: float
    seconds: dict[str, float]
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    matcher_cost: dict[str, int] | None = None
    raw_scores: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    raw_candidate_scores: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    backgrounds: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    crop_boxes: dict[str, Box] = dataclasses.field(default_factory=dict)
    crop_pairs: list[CropPair] = dataclasses.field(default_factory=list)

    @property
    def groups(self) -> list[list[tuple[str, float | None]]]:
        """Each group as ``[(image id, score to the first member), ...]``, the first member first (score ``None``)."""
        return [[(member.image_id, member.score_to_first) for member in group] for group in self.members]


@dataclasses.dataclass
class CandidatePairs:
    """The descriptor stage of :func:`dedup`: the pairs to verify and the backgrounds behind their scores.

    Attributes:
        pairs: ``Prediction(earlier, later, score)``, ``score`` the cosine minus the pair's background
            (:func:`~copynce_hf.retrieval.search.background.pair_background`; the cosine itself without normalisation).
        raw: ``(earlier, later)`` -> the pair's cosine (its best over the two searches).
        background: image id -> its background (empty without normalisation).
        alpha: the weight of the background.
    """

    pairs: list[Prediction]
    raw: dict[tuple[str, str], float]
    background: dict[str, float]
    alpha: float = 1.0

    def score(self, a: str, b: str, cosine: float) -> float:
        """The normalised descriptor score of the pair ``(a, b)`` of cosine ``cosine``."""
        return cosine - self.alpha * pair_background(self.background, a, b)


def self_neighbours(index: DescriptorIndex, queries: DescriptorSet, preset: ViewPreset, k: int,
                    order: dict[str, int]) -> dict[str, list[tuple[str, float]]]:
    """Each image's ``k`` nearest *other* images ``[(image id, cosine), ...]``, best first (ties in the
    collection's ``order``), by the search ``detect`` makes (:func:`~copynce_hf.retrieval.search.references.search_references`)."""
    found = search_references(index, queries, k + 1, query_views=preset)
    neighbours: dict[str, list[tuple[str, float]]] = {}
    for p in sorted(found, key=lambda p: (order[p.query_id], -p.score, order[p.reference_id])):
        row = neighbours.setdefault(p.query_id, [])
        if p.query_id != p.reference_id and len(row) < k:
            row.append((p.reference_id, p.score))
    return neighbours


def self_search_pairs(index: DescriptorIndex, queries: DescriptorSet, preset: ViewPreset, candidates: int,
                      order: dict[str, int], ranks: tuple[int, int] | None = None, alpha: float = 1.0) -> CandidatePairs:
    """Each image's ``candidates`` best other images, as unordered pairs ``(earlier, later)`` by ``order`` (image
    id -> place in the collection); a pair found from both sides keeps its best cosine.

    ``ranks``: ``(k_start, k_end)`` of collection normalisation: each image's background is its mean cosine to its
    neighbours of those ranks (:func:`~copynce_hf.retrieval.search.background.neighbour_background`), and the best pairs are those of
    the highest ``cosine - alpha * (bg(a) + bg(b)) / 2`` (cross-domain similarity local scaling, Conneau et al.
    2018) among its ``max(2 * candidates, k_end + 1)`` nearest. ``None``: the ``candidates`` nearest by cosine.
    """
    pool = candidates if ranks is None else max(2 * candidates, ranks[1] + 1)
    neighbours = self_neighbours(index, queries, preset, pool, order)
    background = {} if ranks is None else neighbour_background(
        {image: [score for _, score in row] for image, row in neighbours.items()}, *ranks)
    found = CandidatePairs([], {}, background, alpha)
    for image, row in neighbours.items():
        for other, cosine in sorted(row, key=lambda item: (-found.score(image, item[0], item[1]), order[item[0]]))[
                :candidates]:
            pair = (image, other) if order[image] < order[other] else (other, image)
            found.raw[pair] = max(cosine, found.raw.get(pair, -np.inf))
    found.raw = dict(sorted(found.raw.items(), key=lambda item: (order[item[0][0]], order[item[0][1]])))
    found.pairs = [Prediction(a, b, found.score(a, b, cosine)) for (a, b), cosine in found.raw.items()]
    return found


def descriptor_pair_scores(index: DescriptorIndex, queries: DescriptorSet, preset: ViewPreset,
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
                         config: DetectConfig, whitened: bool = False,
                         settings: DedupSettings | None = None) -> tuple[float, str]:
    """The threshold at ``precision`` of a :class:`~copynce_hf.calibration.thresholds.Calibration` (a ``copynce calibrate`` file) for a
    dedup run, and a line saying where it comes from. ``descriptor`` and ``matcher`` are the run's model
    identities (:func:`~copynce_hf.calibration.thresholds.model_identity`).

    With a matcher the ``matcher`` stage decides: its scores depend on the matcher and its views only, which must
    be those calibrated; with matcher normalisation (:class:`DedupSettings`) the threshold applies to the decision
    score, which equals the matcher's probability wherever an image's background is below the anchor. Without one
    the ``descriptor`` stage decides: the calibrated descriptor, views, no score normalisation, no collection
    normalisation (``settings.collection``, on by default) and no whitening must match. A mismatch is a
    :class:`ConfigError` naming both.
    """
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
    settings: DedupSettings | None = None,
    whitening_folder: str | os.PathLike | None = None,
    tokens_folder: str | os.PathLike | None = None,
) -> DedupResult:
    """Find the groups of copies among the images of ``source``.

    Args:
        source: an image source (``ids`` + ``load(i)``, e.g. :class:`ImageFolderSource`).
        descriptor: the descriptor model that proposes candidate pairs.
        matcher: ``(model, image_processor)`` of a CopyNCE matcher verifying the pairs, or ``None``
            (descriptor scores decide).
        threshold: pairs whose decision score is at or above it are copies.
        config: :class:`~copynce_hf.retrieval.detection.config.DetectConfig`: ``candidates`` (pairs verified per image), ``descriptor_lce``,
            ``matcher_lce``, ``whiten_dim``, batch size, workers, cache size (its ``collection``, ``detect``'s
            reference-side normalisation, is not read: ``settings.collection`` normalises the descriptor stage).
        index_folder: where the index (and whitening) of ``source`` are kept and reused, as by ``detect``:
            ``<index_folder>/<descriptor name>/references``; ``None``: not kept.
        progress: progress bars per stage.
        log: receives one line per stage.
        whiten_from: sample images to learn a whitening from (:mod:`.whitening`); ``None``: none.
        rescoring_folder: where the matcher's scored chunks are kept, so that a run cut short resumes
            (:mod:`.chunked_scoring`; those of the content crops in its ``crops-*`` folders); ``None``: not kept.
        accelerator: an ``accelerate.Accelerator`` (``None``: one is made); under ``accelerate launch`` every
            process calls :func:`dedup` and gets the whole result, as with :func:`~copynce_hf.retrieval.detection.pipeline.detect`.
        settings: :class:`~.settings.DedupSettings`: collection normalisation (descriptor and matcher stages), the
            matcher's orders, content crops and the grouping (``None``: the defaults).
        whitening_folder: where the whitening's sample descriptors are kept (``None``:
            ``<index_folder>/<descriptor name>/whitening``, or nowhere without ``index_folder``).
        tokens_folder: where the matcher's token store is kept and resumed from (:mod:`~copynce_hf.retrieval.content.store`;
            ``None``: a temporary folder, removed at the end).
    """
    from ...precision import make_accelerator

    config, settings = config or DetectConfig(), settings or DedupSettings()
    if len(source) < 2:
        raise ConfigError(f"deduplication needs at least 2 images, got {len(source)}")
    run = _DedupRun(source, descriptor, matcher, config, settings, accelerator or make_accelerator(), progress, log)
    folder = Path(index_folder) / descriptor.name if index_folder is not None else None
    if whitening_folder is None and folder is not None:
        whitening_folder = folder / "whitening"
    index, queries, skipped = run.descriptors(folder, whiten_from, whitening_folder)
    index, queries = dedup_content_index(descriptor, SourceImages(source), index, queries, config, run.accelerator,
                                         log, run.seconds)
    readable = [image_id for image_id in source.ids if image_id not in skipped]
    if len(readable) < 2:
        raise PredictionsError(f"deduplication needs at least 2 readable images, got {len(readable)} of "
                               f"{len(source)}")
    candidates = run.candidates(index, queries, len(readable))
    with token_folder(tokens_folder, run.accelerator) as run.tokens_folder:
        raw = run.verify(candidates, rescoring_folder)
        raw = run.content_crops(index, raw, rescoring_folder)
        decide = run.decision(candidates, raw)
        start = time.perf_counter()
        decided = {pair: decide(*pair, score) for pair, score in raw.items()}
        members = group_members(source.ids, decided, threshold, settings.grouping,
                                lambda missing: run.score_missing(missing, decide, index, queries))
        run.seconds["groups"] = time.perf_counter() - start
    log(f"{len(members)} groups of copies ({sum(len(group) for group in members)} images) at threshold "
        f"{threshold:.4g} ({settings.grouping} grouping)")
    backgrounds = {"descriptor": candidates.background, "matcher": decide.matcher_background or {}}
    return DedupResult(members, [Prediction(a, b, score) for (a, b), score in decided.items()], candidates.pairs,
                       threshold, run.seconds, skipped, run.cost, raw, candidates.raw,
                       {stage: found for stage, found in backgrounds.items() if found}, run.crops.boxes if run.crops
                       else {}, run.crop_pairs)


@dataclasses.dataclass
class _PairDecision:
    """How a pair's raw score becomes its decision score: the descriptor's cosine less the pair's background
    (:meth:`CandidatePairs.score`) without matcher; with one, the matcher's probability, its backgrounds discounted
    (:func:`~copynce_hf.retrieval.search.background.normalised_probability`) when ``matcher_background`` is given."""

    candidates: CandidatePairs
    has_matcher: bool
    settings: DedupSettings
    matcher_background: dict[str, float] | None = None

    def __call__(self, a: str, b: str, raw: float) -> float:
        if not self.has_matcher:
            return self.candidates.score(a, b, raw)
        if self.matcher_background is None:
            return raw
        background, settings = self.matcher_background, self.settings
        return normalised_probability(raw, background.get(a), background.get(b), settings.matcher_alpha,
                                      settings.matcher_anchor)


@dataclasses.dataclass
class _DedupRun:
    """The steps of :func:`dedup` over one collection: its inputs, settings, times and matcher passes."""

    source: object
    descriptor: Descriptor
    matcher: tuple | None
    config: DetectConfig
    settings: DedupSettings
    accelerator: object
    progress: bool
    log: Callable[[str], None]
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    cost: dict[str, int] | None = None
    matches: object = None  # the images' content-token matches in their neighbours (``content_tokens``)
    tokens_folder: Path | None = None  # where the token store goes
    tokens: TokenStore | None = None  # the images' matcher encoder tokens (whole images)
    crops: CropSource | None = None  # the content crops (``content_crops``)
    crop_pairs: list[CropPair] = dataclasses.field(default_factory=list)  # the pairs verified on them
    crop_descriptors: DescriptorSet | None = None  # the crops' descriptors (ids: their images')

    @property
    def preset(self) -> ViewPreset:
        return ViewPreset(self.config.descriptor_lce)

    @property
    def extract(self) -> dict:
        return {"batch_size": self.config.batch_size, "num_workers": self.config.num_workers,
                "accelerator": self.accelerator}

    def descriptors(self, folder: Path | None, whiten_from,
                    whitening_folder=None) -> tuple[DescriptorIndex, DescriptorSet, dict[str, str]]:
        """Step 1: ``(index of the collection's views, its query views, id -> reason of each image left out)``,
        whitened when ``whiten_from`` is given (its sample kept in ``whitening_folder``); cached in ``folder`` as
        ``detect`` caches them."""
        descriptor, progress = self.descriptor, self.progress
        whitening = None
        if whiten_from is not None:
            start = time.perf_counter()
            whitening = learn_whitening(descriptor, whiten_from, self.preset, self.config.whiten_dim,
                                        whitening_folder, progress=progress,
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

    @property
    def order(self) -> dict[str, int]:
        return {image_id: i for i, image_id in enumerate(self.source.ids)}

    def candidates(self, index: DescriptorIndex, queries: DescriptorSet, readable: int) -> CandidatePairs:
        """Step 1's self-search: the pairs to verify (:func:`self_search_pairs`), collection-normalised when
        ``settings.collection.on``."""
        config, collection, start = self.config, self.settings.collection, time.perf_counter()
        ranks = (collection.k_start, collection.k_end) if collection.on else None
        found = self_search_pairs(index, queries, self.preset, config.candidates, self.order, ranks,
                                  collection.alpha)
        self.seconds["self-search"] = time.perf_counter() - start
        normalised = ""
        if ranks is not None:
            values = list(found.background.values())
            normalised = (f"; collection-normalised: each image's background is its mean cosine to its neighbours of "
                          f"ranks {ranks[0]}-{ranks[1]}" + (f", median {np.median(values):.3f}, largest "
                                                            f"{max(values):.3f}" if values else " (too few images)"))
        self.log(f"{self.descriptor.name}: {len(found.pairs)} candidate pairs among {readable} images (the "
                 f"{config.candidates} best other images of each{normalised})")
        return found

    def matcher_scores(self, pairs: list[tuple[str, str]], folder) -> list[float | None]:
        """The matcher's score of each pair (:meth:`_scores_between`; with ``matcher_orders="both"`` the
        pairs and their reversals in one scoring, so that they share chunks and resume, then
        :func:`~copynce_hf.retrieval.search.background.mean_logit_probability` of the two); its passes add to :attr:`cost`."""
        both = self.settings.scores_both_orders(self.matcher[0])
        ordered = pairs + [(b, a) for a, b in pairs] if both else pairs
        scores = self._scores_between(ordered, self.source, self.source, self.config, folder, self.progress,
                                      self.tokens)
        if not both:
            return scores
        return [None if None in (forward, backward) else mean_logit_probability(forward, backward)
                for forward, backward in zip(scores[:len(pairs)], scores[len(pairs):])]

    def verify(self, candidates: CandidatePairs, folder) -> dict[tuple[str, str], float]:
        """Step 2: ``(earlier, later)`` -> raw score of each candidate pair: the matcher's probability (chunks kept in
        ``folder``; a pair it cannot score is left out), or its cosine without matcher."""
        if self.matcher is None:
            return dict(candidates.raw)
        start = time.perf_counter()
        pair_ids = list(candidates.raw)
        self.tokens = self.token_store(pair_ids)
        self.matches = dedup_keep_masks(self.matcher, SourceImages(self.source), list(self.source.ids),
                                        candidates.pairs, self.config, self.accelerator, self.log, self.progress,
                                        self.tokens)
        scores = self.matcher_scores(pair_ids, folder)
        self.cost["encoded_views"] += self.matches.encoded if self.matches is not None else 0
        self.cost["encoded_views"] += self.tokens.encoded if self.tokens is not None else 0
        verified = {pair: score for pair, score in zip(pair_ids, scores) if score is not None}
        self.seconds["matcher"] = time.perf_counter() - start
        on = f" on {self.accelerator.num_processes} processes" if self.accelerator.num_processes > 1 else ""
        self.log(f"matcher: {len(verified)} pairs verified{on} ({self.cost['encoded_views']} encoder passes, "
                 f"{self.cost['fused_pairs']} fusion passes)")
        return verified

    def content_crops(self, index: DescriptorIndex, raw: dict[tuple[str, str], float], folder
                      ) -> dict[tuple[str, str], float]:
        """Step 2b (:mod:`copynce_hf.retrieval.content.crops`): ``raw`` with the pairs that content crops propose or decide scored on
        their best views (chunks kept in ``folder``, :meth:`view_scores`); ``raw`` itself without content tokens,
        with view presets, or with ``content_crops`` off."""
        if not (self.settings.content_crops and self.matches is not None and self.preset.name == "none"):
            return raw
        start = time.perf_counter()
        images = SourceImages(self.source)
        self.crops = crops = CropSource(images, content_boxes(self.source.ids, self.matches.keep), images.max_pixels)
        if not len(crops):
            self.seconds["content crops"] = time.perf_counter() - start
            self.log("content crops: no image has a region of its own content small enough to crop")
            return raw
        described = extract_descriptors(self.descriptor.model, self.descriptor.processor, crops,
                                        progress=self.progress, description=f"{self.descriptor.name}: content crops",
                                        **self.extract)
        self.crop_descriptors = described
        pairs = crop_pairs(index.references, described, self.config.candidates, self.order)
        scores = self.view_scores(pairs, crops, folder)
        scored = {(pair.a, pair.b): (pair, score) for pair, score in zip(pairs, scores) if score is not None}
        self.crop_pairs = [pair for pair, _ in scored.values()]
        replaced = len(scored.keys() & raw.keys())
        updated = {**raw, **{key: score for key, (_, score) in scored.items()}}
        self.seconds["content crops"] = time.perf_counter() - start
        self.log(f"content crops: {len(crops)} of {len(self.source)} images cropped to their own content, "
                 f"{len(pairs)} pairs verified on their crops ({replaced} of them whole-image candidates)")
        return updated

    def view_scores(self, pairs: list, crops: CropSource, folder=None) -> list[float | None]:
        """The matcher's score of each :class:`~copynce_hf.retrieval.content.crops.CropPair` on its two views, every token kept (a crop
        is its image's own content); both orders as :meth:`matcher_scores`. The scored chunks of each kind of view
        pair and order are kept in ``folder/crops-<view>-<view>[-reversed]`` (``None``: not kept)."""
        both = self.settings.scores_both_orders(self.matcher[0])
        config = dataclasses.replace(self.config, content_tokens=False)
        sources = {VIEW_WHOLE: self.source, VIEW_CROP: crops}
        scores: dict[int, float | None] = {}
        for views in sorted({(pair.view_a, pair.view_b) for pair in pairs}):
            rows = [i for i, pair in enumerate(pairs) if (pair.view_a, pair.view_b) == views]
            forward = [(pairs[i].a, pairs[i].b) for i in rows]
            kept = Path(folder) / f"crops-{views[0]}-{views[1]}" if folder is not None else None
            found = self._scores_between(forward, sources[views[0]], sources[views[1]], config, kept)
            if both:
                backward = self._scores_between([(b, a) for a, b in forward], sources[views[1]], sources[views[0]],
                                                config, kept and kept.with_name(f"{kept.name}-reversed"))
                found = [None if None in pair else mean_logit_probability(*pair) for pair in zip(found, backward)]
            scores.update(zip(rows, found))
        return [scores[i] for i in range(len(pairs))]

    def _scores_between(self, pairs: list[tuple[str, str]], queries, references, config, folder,
                        progress: bool = False, tokens: TokenStore | None = None) -> list[float | None]:
        """The matcher's scores of ``pairs`` read from two sources (:func:`~copynce_hf.retrieval.verify.pairs.score_pairs`,
        with the run's content matches where ``config`` fuses content tokens, and ``tokens`` read instead of encoding
        the images); its passes add to :attr:`cost`."""
        query_images, reference_images = SourceImages(queries), SourceImages(references)
        scoring = config.pair_scoring(query_images.max_pixels, self.matches, tokens)
        scored = score_pairs(pairs, *self.matcher, query_images, reference_images, scoring, self.accelerator, folder,
                             progress, f"matcher ({MATCHER_VIEW_NAMES[config.matcher_lce]})",
                             lambda line: self.log(f"matcher: {line}"))
        self._add_cost(scored.cost)
        return scored.scores

    def _add_cost(self, cost: dict[str, int]) -> None:
        """Add a scoring's encoder and fusion passes to :attr:`cost`."""
        self.cost = cost if self.cost is None else {name: self.cost[name] + cost[name] for name in cost}

    def token_store(self, pairs: list[tuple[str, str]]) -> TokenStore | None:
        """The matcher's encoder tokens of every image of ``pairs``, each encoded once (kept in
        :attr:`tokens_folder`, resumed after a kill); ``None`` with LCE views, which the scorer's cache encodes."""
        if self.config.matcher_lce != "none":
            return None
        in_pairs = {image_id for pair in pairs for image_id in pair}
        ids = [image_id for image_id in self.source.ids if image_id in in_pairs]
        model, processor = self.matcher
        model = model.to(self.accelerator.device)
        images = SourceImages(self.source)
        identity = token_identity(model, processor, ids, images.files or {}, self.source, self.accelerator)
        return TokenStore.build(ids, images, model.pre_fusion_tokens, processor, self.tokens_folder, identity,
                                batch_size=self.config.batch_size, num_workers=self.config.num_workers,
                                accelerator=self.accelerator, progress=self.progress,
                                log=lambda line: self.log(f"matcher: {line}"))

    def decision(self, candidates: CandidatePairs, raw: dict[tuple[str, str], float]) -> _PairDecision:
        """How raw scores become decision scores; with a matcher and matcher normalisation, each image's matcher
        background is measured over its verified pairs (:func:`~copynce_hf.retrieval.search.background.matcher_backgrounds`)."""
        settings = self.settings
        if self.matcher is None or not settings.matcher_normalisation:
            return _PairDecision(candidates, self.matcher is not None, settings)
        background = matcher_backgrounds(((a, b, score) for (a, b), score in raw.items()), settings.matcher_k_start,
                                         settings.matcher_k_end)
        above = [value for value in background.values() if value > settings.matcher_anchor]
        self.log(f"matcher normalisation: {len(above)} of {len(background)} images have a background (mean logit of "
                 f"their verified pairs of ranks {settings.matcher_k_start}-{settings.matcher_k_end}) above "
                 f"{settings.matcher_anchor:g}, discounted from their pairs" + (
                     f" (largest {max(above):.2f})" if above else ""))
        return _PairDecision(candidates, True, settings, background)

    def score_missing(self, pairs: list[tuple[str, str]], decide: _PairDecision, index: DescriptorIndex,
                      queries: DescriptorSet) -> list[float | None]:
        """The decision scores of pairs that were not candidates (a member and its group's first member): scored
        now by the matcher (on their views when a content crop matches best, as :meth:`content_crops` scores), or by
        the descriptor without one (``None``: the matcher could not)."""
        if self.matcher is not None:  # a pair a content crop matches best is scored on its views, as in the run
            views = ([None] * len(pairs) if self.crop_descriptors is None
                     else crop_views(pairs, index.references, self.crop_descriptors))
            raw: list[float | None] = [None] * len(pairs)
            whole = [i for i, view in enumerate(views) if view is None]
            on_crops = [i for i, view in enumerate(views) if view is not None]
            for rows, scores in ((whole, self.matcher_scores([pairs[i] for i in whole], None) if whole else []),
                                 (on_crops, self.view_scores([views[i] for i in on_crops], self.crops))):
                for i, score in zip(rows, scores):
                    raw[i] = score
        else:
            raw = descriptor_pair_scores(index, queries, self.preset, pairs)
        return [None if score is None else decide(a, b, score) for (a, b), score in zip(pairs, raw)]


#: The header of ``pairs.csv``: the decision score (``score``, the one the threshold applies to), the raw one, and
#: the views the matcher compared (``whole/whole``, or a content crop on either side: ``crop/whole``, ...).
PAIR_COLUMNS = ("query_id", "reference_id", "score", "raw_score", "views")


def write_pairs(path: str | os.PathLike, result: DedupResult) -> int:
    """Write ``pairs.csv``: every verified pair (:data:`PAIR_COLUMNS`: the earlier image as ``query_id``, its
    decision score, its raw score and the views scored), by decreasing decision score; returns the rows written."""
    rows = sorted(result.pairs, key=lambda p: (-p.score, p.query_id, p.reference_id))
    views = {(pair.a, pair.b): f"{pair.view_a}/{pair.view_b}" for pair in result.crop_pairs}
    with StagedFile(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(PAIR_COLUMNS)
        for p in rows:
            if not math.isfinite(p.score):
                raise PredictionsError(f"score {p.score} of pair ({p.query_id!r}, {p.reference_id!r}) is not finite")
            key = (p.query_id, p.reference_id)
            writer.writerow((*key, repr(p.score), repr(float(result.raw_scores[key])),
                             views.get(key, f"{VIEW_WHOLE}/{VIEW_WHOLE}")))
    return len(rows)
