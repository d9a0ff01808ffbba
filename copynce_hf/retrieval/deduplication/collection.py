"""Deduplication of one collection: every group of copies among its own images.

The detection pipeline of :mod:`copynce_hf.retrieval.detection` with the collection on both sides, in three steps:

1. the descriptor stage (:mod:`.self_search`): the index over the collection searched with every image's own
   descriptors, each image keeping its ``candidates`` best other images (collection-normalised by default);
2. the matcher stage (:mod:`.verification`): each unordered candidate pair verified (in one or both orders), every
   whole image encoded once into a token store that content tokens and every fusion read; content crops as a
   second view (:mod:`.crops`); each pair's raw score turned into its decision score (matcher normalisation);
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

from ...modeling.errors import ConfigError, PredictionsError
from ...outputs import StagedFile
from ..content.crops import VIEW_LAYOUT, VIEW_WHOLE, Box, CropPair, write_box_rows
from ..content.stage import dedup_content_index
from ..content.store import token_folder
from ..descriptors.cached import Descriptor
from ..descriptors.sets import DescriptorSet
from ..descriptors.views import ViewPreset
from ..detection.config import DetectConfig
from ..predictions import Prediction
from ..search.index import DescriptorIndex
from ..sources import SourceImages
from .crops import score_missing, verify_on_crops
from .grouping import GroupMember, group_members
from .layouts import verify_on_layouts
from .self_search import candidate_pairs, collection_descriptors, collection_order
from .settings import DedupSettings
from .verification import CollectionMatcher, pair_decision, verify_candidates

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
        threshold: the decision score at or above which a pair is a copy (``None``: no group was formed).
        seconds: wall time per stage (``whitening``, ``index``, ``self-search``, ``matcher``, ``groups``).
        skipped: image id -> plain-words reason of each image left out.
        matcher_cost: encoder and fusion passes the matcher ran (``None`` without matcher).
        raw_scores: ``(earlier, later)`` -> raw score of every verified pair (the matcher's probability, or the
            descriptor cosine without matcher).
        raw_candidate_scores: ``(earlier, later)`` -> descriptor cosine of every candidate.
        backgrounds: ``descriptor`` / ``matcher`` -> image id -> its background (cosine, logit); empty without
            normalisation.
        crop_boxes: image id -> the box of its content crop (:mod:`copynce_hf.retrieval.content.crops`), for the images that have one.
        crop_pairs: the pairs verified on their best views, one of them a content crop or a layout crop
            (:class:`~copynce_hf.retrieval.content.crops.CropPair`; a layout crop's after a content crop's of the same
            pair, which it decided); their raw scores are those of those views.
        layout_boxes: ``(earlier, later)`` -> the box of the layout crop that decided the pair
            (:mod:`.layouts`).
    """

    members: list[list[GroupMember]]
    pairs: list[Prediction]
    candidates: list[Prediction]
    threshold: float | None
    seconds: dict[str, float]
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    matcher_cost: dict[str, int] | None = None
    raw_scores: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    raw_candidate_scores: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    backgrounds: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    crop_boxes: dict[str, Box] = dataclasses.field(default_factory=dict)
    crop_pairs: list[CropPair] = dataclasses.field(default_factory=list)
    layout_boxes: dict[tuple[str, str], Box] = dataclasses.field(default_factory=dict)

    @property
    def pair_views(self) -> dict[tuple[str, str], str]:
        """``(earlier, later)`` -> the views the matcher compared for each verified pair (``pairs.csv``'s ``views``:
        ``whole/whole``, or the views of its entry in :attr:`crop_pairs`, the last one where a layout crop decided a
        pair after a content crop)."""
        views = {pair: f"{VIEW_WHOLE}/{VIEW_WHOLE}" for pair in self.raw_scores}
        views.update({(pair.a, pair.b): f"{pair.view_a}/{pair.view_b}" for pair in self.crop_pairs})
        return views

    @property
    def groups(self) -> list[list[tuple[str, float | None]]]:
        """Each group as ``[(image id, score to the first member), ...]``, the first member first (score ``None``)."""
        return [[(member.image_id, member.score_to_first) for member in group] for group in self.members]


def dedup(source, descriptor: Descriptor, matcher: tuple | None = None, threshold: float | None = 0.5,
          config: DetectConfig | None = None, index_folder: str | os.PathLike | None = None, progress: bool = True,
          log: Callable[[str], None] = logger.info, whiten_from=None, rescoring_folder: str | os.PathLike | None = None,
          accelerator=None, settings: DedupSettings | None = None, whitening_folder: str | os.PathLike | None = None,
          tokens_folder: str | os.PathLike | None = None) -> DedupResult:
    """Find the groups of copies among the images of ``source``.

    Args:
        source: an image source (``ids`` + ``load(i)``, e.g. :class:`ImageFolderSource`).
        descriptor: the descriptor model that proposes candidate pairs.
        matcher: ``(model, image_processor)`` of a CopyNCE matcher verifying the pairs, or ``None``
            (descriptor scores decide).
        threshold: pairs whose decision score is at or above it are copies; ``None``: the pairs are verified and
            scored, and no group is formed (``members`` is empty; the self-calibration's run).
        config: the :class:`~copynce_hf.retrieval.detection.config.DetectConfig` (pairs verified per image, views,
            batches; its ``collection``, ``detect``'s reference-side normalisation, is not read).
        index_folder: where the index (and whitening) of ``source`` are kept and reused, as by ``detect``:
            ``<index_folder>/<descriptor name>/references``; ``None``: not kept.
        progress: progress bars per stage.
        log: receives one line per stage.
        whiten_from: sample images to learn a whitening from; ``None``: none.
        rescoring_folder: where the matcher's scored chunks are kept, so that a run cut short resumes (those of the
            content crops in its ``crops-*`` folders); ``None``: not kept.
        accelerator: an ``accelerate.Accelerator`` (``None``: one is made); under ``accelerate launch`` every
            process calls :func:`dedup` and gets the whole result.
        settings: :class:`~.settings.DedupSettings`: collection normalisation (descriptor and matcher stages), the
            matcher's orders, content crops and the grouping (``None``: the defaults).
        whitening_folder: where the whitening's sample descriptors are kept (``None``: in ``index_folder``).
        tokens_folder: where the matcher's token store is kept and resumed from (``None``: a temporary folder).
    """
    from ...precision import make_accelerator

    config, settings = config or DetectConfig(), settings or DedupSettings()
    if len(source) < 2:
        raise ConfigError(f"deduplication needs at least 2 images, got {len(source)}")
    accelerator, seconds = accelerator or make_accelerator(), {}
    folder = Path(index_folder) / descriptor.name if index_folder is not None else None
    whitening_folder = whitening_folder or (folder / "whitening" if folder else None)
    index, queries, skipped = _descriptor_stage(source, descriptor, config, accelerator, (folder, whitening_folder),
                                                whiten_from, progress, log, seconds)
    candidates = candidate_pairs(index, queries, config, settings.collection, collection_order(source),
                                 len(source) - len(skipped), descriptor.name, log, seconds)
    scorer = matcher and CollectionMatcher(source, matcher, config, settings, accelerator, progress, log)
    with token_folder(tokens_folder, accelerator) as kept_tokens:
        raw, crops = (dict(candidates.raw), None) if scorer is None else verify_on_crops(
            scorer, descriptor, index, verify_candidates(scorer, candidates, rescoring_folder, kept_tokens, seconds),
            rescoring_folder, seconds, kept_tokens)
        raw, layouts = (raw, None) if scorer is None else verify_on_layouts(
            scorer, descriptor, index, raw, crops.crops.boxes if crops else {}, rescoring_folder, seconds, kept_tokens)
        decide = pair_decision(candidates, raw, scorer is not None, settings, log)
        members, decided = _groups(source, raw, decide, threshold, settings.grouping, lambda missing: score_missing(
            scorer, missing, decide, index, queries, ViewPreset(config.descriptor_lce), crops), log, seconds)
    backgrounds = {"descriptor": candidates.background, "matcher": decide.matcher_background or {}}
    return DedupResult(members, [Prediction(a, b, score) for (a, b), score in decided.items()], candidates.pairs,
                       threshold, seconds, skipped, scorer and scorer.cost, raw, candidates.raw,
                       {stage: found for stage, found in backgrounds.items() if found},
                       crops.crops.boxes if crops else {}, (crops.pairs if crops else []) + (layouts.pairs if layouts else []),
                       layouts.boxes if layouts else {})


def _groups(source, raw: dict[tuple[str, str], float], decide, threshold: float | None, grouping: str, score_missing,
            log: Callable[[str], None], seconds: dict[str, float]
            ) -> tuple[list[list[GroupMember]], dict[tuple[str, str], float]]:
    """Step 3: the groups of the pairs whose decision score (``decide``) is at or above ``threshold``, and every
    verified pair's decision score; pairs outside ``raw`` that a group needs are scored by ``score_missing``. No
    group (and no line) with ``threshold`` ``None``."""
    start = time.perf_counter()
    decided = {pair: decide(*pair, score) for pair, score in raw.items()}
    if threshold is None:
        return [], decided
    members = group_members(source.ids, decided, threshold, grouping, score_missing)
    seconds["groups"] = time.perf_counter() - start
    log(f"{len(members)} groups of copies ({sum(len(group) for group in members)} images) at threshold "
        f"{threshold:.4g} ({grouping} grouping)")
    return members, decided


def _descriptor_stage(source, descriptor: Descriptor, config: DetectConfig, accelerator, folders: tuple, whiten_from,
                      progress: bool, log: Callable[[str], None], seconds: dict[str, float]
                      ) -> tuple[DescriptorIndex, DescriptorSet, dict[str, str]]:
    """Step 1's descriptors (:func:`~.self_search.collection_descriptors`, content descriptors with descriptor content
    tokens): ``(index, query views, id -> reason of each image left out)``; ``folders`` are the index's and the
    whitening sample's cache folders. At least two images must be readable."""
    extract = {"batch_size": config.batch_size, "num_workers": config.num_workers, "accelerator": accelerator}
    index, queries, skipped = collection_descriptors(source, descriptor, config, extract, folders[0], whiten_from, folders[1],
                                                     progress, log, seconds)
    index, queries = dedup_content_index(descriptor, SourceImages(source), index, queries, config, accelerator, log,
                                         seconds)
    readable = len(source) - len(skipped)
    if readable < 2:
        raise PredictionsError(f"deduplication needs at least 2 readable images, got {readable} of {len(source)}")
    return index, queries, skipped


#: The header of ``layout_crops.csv``: each pair decided on a layout crop (:mod:`.layouts`), the image cut and its box
#: as fractions of its width and height.
LAYOUT_COLUMNS = ("query_id", "reference_id", "image_id", "left", "top", "right", "bottom")


def write_layout_crops(path: str | os.PathLike, result: DedupResult) -> int:
    """Write ``layout_crops.csv`` (:data:`LAYOUT_COLUMNS`), the pairs in the collection's order; returns the rows
    written (none: no file, an earlier run's removed)."""
    views = {(pair.a, pair.b): pair for pair in result.crop_pairs}
    return write_box_rows(path, LAYOUT_COLUMNS, [((a, b, a if views[(a, b)].view_a == VIEW_LAYOUT else b), box)
                                                 for (a, b), box in result.layout_boxes.items()])


#: The header of ``pairs.csv``: the decision score (``score``, the one the threshold applies to), the raw one, and
#: the views the matcher compared (``whole/whole``, or a content crop or a layout crop on either side: ``crop/whole``,
#: ``whole/layout``, ...).
PAIR_COLUMNS = ("query_id", "reference_id", "score", "raw_score", "views")


def write_pairs(path: str | os.PathLike, result: DedupResult) -> int:
    """Write ``pairs.csv``: every verified pair (:data:`PAIR_COLUMNS`: the earlier image as ``query_id``, its
    decision score, its raw score and the views scored), by decreasing decision score; returns the rows written."""
    rows = sorted(result.pairs, key=lambda p: (-p.score, p.query_id, p.reference_id))
    views = result.pair_views
    with StagedFile(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(PAIR_COLUMNS)
        for p in rows:
            if not math.isfinite(p.score):
                raise PredictionsError(f"score {p.score} of pair ({p.query_id!r}, {p.reference_id!r}) is not finite")
            key = (p.query_id, p.reference_id)
            writer.writerow((*key, repr(p.score), repr(float(result.raw_scores[key])), views[key]))
    return len(rows)
