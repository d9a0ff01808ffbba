"""Query crops: each query's own content, cut from its pixels and searched and verified as more views of the query in
``detect`` (beyond the paper).

A query that pastes a reference into a screenshot, a meme band, a poster or onto a background keeps a few percent of
the reference's pixels at the models' input size: too few to be found or verified as a whole. Its crops (the
references are left whole: a reference set is the originals a moderation database holds) come from two places:

* **content crops**, where the other images show the frame: the query's matcher encoder tokens against its
  ``content_neighbours`` nearest images by descriptor cosine among the references *and the other queries*
  (:func:`query_neighbours`: a queue of uploads holds many screenshots of one app, many posts of one meme template,
  so frames recur among the queries too), and the box of the tokens it keeps (:func:`~.crops.content_box`);
* **layout crops** (``layout_crops``), where the query alone shows it: at most :data:`~.layout.LAYOUT_CROPS` boxes
  read from its own pixels (:func:`~.layout.layout_boxes`: a region not of the frame's colours, a rectangle of
  straight sides, a dense region), so that a frame met once, in a query that arrives alone, is recognised too.

Each crop is a view of its query, cut from the query's full-resolution pixels (:class:`~.crops.CropSource`):

1. each view's descriptor searches the references, a content crop for its ``candidates`` nearest, a layout crop for
   its ``layout_candidates`` nearest (a layout box is a guess, which the descriptor checks);
2. a ``(query, reference)`` pair that some view matches better than the whole query does (a higher cosine) is scored
   by the matcher on the view of the best cosine and the reference, every token kept (:func:`query_crop_pairs`);
3. a content crop's score replaces the whole query's, a layout crop's only where it is higher (:func:`settled`,
   :func:`with_crop_scores`): a layout box is a guess, which may add evidence but not take it away. Chosen on
   development draws of ``train`` photos: on lone framed queries replacing and keeping the higher score did the same,
   on plain copies of the mini-DISC recipe replacing lost muAP where keeping the higher did not (benchmarks/LOG.md,
   "Lone framed queries").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ...images import load_image
from ...modeling.errors import ImageLoadError
from ...runtime.onnx_runtime import check_content_fusion
from ..descriptors.extract import extract_descriptors
from ..descriptors.sets import DescriptorSet
from ..predictions import Prediction
from ..presets import DEFAULT_LAYOUT_CANDIDATES
from .crops import Box, CropSource, content_boxes, nearest_rows
from .layout import SAME_BOX, box_iou, layout_boxes
from .masks import CollectionMatches, TokenCache, sharded_matches
from .stage import QueriesAndReferences, StoredByRole, matcher_content

logger = logging.getLogger(__name__)

__all__ = ["QueryView", "QueryCrops", "query_neighbours", "query_layouts", "query_views",
           "query_crop_pairs", "query_crops", "settled", "with_crop_scores"]

#: The kinds of query crop.
CONTENT, LAYOUT = "content", "layout"


@dataclasses.dataclass(frozen=True)
class QueryView:
    """A crop of a query: the query's id, where the box comes from (``content`` or ``layout``) and the box."""

    query: str
    kind: str
    box: Box


@dataclasses.dataclass
class QueryCrops:
    """What :func:`query_crops` found.

    Attributes:
        boxes: each cropped query's box (fractions of its width and height): its content crop (:func:`settled`: the
            crop whose pair scored best among those its crops decide, else its content crop).
        scores: the ``(query, reference)`` pairs scored on a crop, with their scores.
        pair_boxes, kinds: the box each of those pairs was scored on, and where it comes from (``content`` or
            ``layout``).
        layout: the queries whose box in ``boxes`` is a layout crop (:func:`settled`).
        cost: the encoder and fusion passes run.
    """

    boxes: dict[str, Box] = dataclasses.field(default_factory=dict)
    scores: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    pair_boxes: dict[tuple[str, str], Box] = dataclasses.field(default_factory=dict)
    kinds: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    layout: list[str] = dataclasses.field(default_factory=list)
    cost: dict[str, int] = dataclasses.field(default_factory=lambda: {"encoded_views": 0, "fused_pairs": 0})


def query_neighbours(queries: DescriptorSet, references: DescriptorSet, k: int) -> dict[tuple, list[tuple]]:
    """Each query's ``2 k`` nearest images by cosine among the references and the other queries, best first, as
    keys of :class:`~copynce_hf.retrieval.content.stage.QueriesAndReferences` (``("query", id)``, ``("reference", id)``; the content
    tokens count the first ``k`` readable ones). Descriptors (N, D) and (M, D), unit rows."""
    if not len(queries):
        return {}
    ref_cosines, ref_rows = nearest_rows(queries.descriptors, references.descriptors, 2 * k)
    query_cosines, query_rows = nearest_rows(queries.descriptors, queries.descriptors, 2 * k + 1)
    found: dict[tuple, list[tuple]] = {}
    for row, query_id in enumerate(queries.ids):
        scored = [(float(c), ("reference", references.ids[r])) for c, r in zip(ref_cosines[row], ref_rows[row])
                  if r >= 0]
        scored += [(float(c), ("query", queries.ids[r])) for c, r in zip(query_cosines[row], query_rows[row])
                   if r >= 0 and r != row]
        scored.sort(key=lambda item: (-item[0], item[1]))
        found[("query", query_id)] = [key for _, key in scored[:2 * k]]
    return found


def query_layouts(images: Mapping, ids: Sequence[str], accelerator=None, max_pixels: int | None = None
                  ) -> dict[str, list[Box]]:
    """Each query's layout boxes (:func:`~.layout.layout_boxes`), for the queries of ``ids`` that have some
    (``images``: id -> path or PIL image); an unreadable query has none. Under ``accelerate launch`` each process
    reads a share of the queries and every process gets them all."""
    processes = accelerator.num_processes if accelerator is not None else 1
    rank = accelerator.process_index if accelerator is not None else 0
    found: dict[str, list[Box]] = {}
    for query_id in list(ids)[rank::processes]:
        try:
            boxes = layout_boxes(load_image(images[query_id], max_pixels=max_pixels))
        except ImageLoadError as error:
            logger.warning("layout crops: skipping query %s: %s", query_id, error)
            continue
        if boxes:
            found[query_id] = boxes
    if processes > 1:
        from accelerate.utils import gather_object

        found = {key: value for part in gather_object([found]) for key, value in part.items()}
    return {query_id: found[query_id] for query_id in ids if query_id in found}


def query_views(content: Mapping[str, Box], layout: Mapping[str, list[Box]]) -> dict[str, QueryView]:
    """Every crop of the queries, by a crop id of its own (``content:<query>``, ``layout<n>:<query>``): each query's
    content box, then its layout boxes that do not repeat an earlier box of it (:data:`~.layout.SAME_BOX`)."""
    views: dict[str, QueryView] = {}
    for query_id in dict.fromkeys([*content, *layout]):
        kept = [content[query_id]] if query_id in content else []
        if query_id in content:
            views[f"{CONTENT}:{query_id}"] = QueryView(query_id, CONTENT, content[query_id])
        for number, box in enumerate(layout.get(query_id, ())):
            if all(box_iou(box, other) < SAME_BOX for other in kept):
                kept.append(box)
                views[f"{LAYOUT}{number}:{query_id}"] = QueryView(query_id, LAYOUT, box)
    return views


def query_crop_pairs(queries: DescriptorSet, references: DescriptorSet, crops: DescriptorSet, candidates: int,
                     views: Mapping[str, QueryView] | None = None,
                     layout_candidates: int = DEFAULT_LAYOUT_CANDIDATES) -> list[tuple[str, str]]:
    """The ``(crop, reference)`` pairs the crops decide: each crop's nearest references (``candidates`` of them; a
    layout crop's ``layout_candidates`` at most), kept where the crop's cosine is above its whole query's (else
    the whole query decides the pair); a query's pair with one reference once, on the crop of the best cosine. Unit
    descriptors: whole queries (N, D), references (M, D), crops (C, D); ``views`` says each crop's query and kind
    (``None``: the crops' ids are their queries' ids, every crop a content crop)."""
    if not len(crops) or not len(references):
        return []
    query_rows = {query_id: row for row, query_id in enumerate(queries.ids)}
    views = views if views is not None else {crop_id: QueryView(crop_id, CONTENT, (0, 0, 1, 1)) for crop_id in crops.ids}
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for kind, count in ((CONTENT, candidates), (LAYOUT, min(candidates, layout_candidates))):
        rows = [row for row, crop_id in enumerate(crops.ids) if views[crop_id].kind == kind]
        if not rows:
            continue
        cosines, found = nearest_rows(crops.descriptors[rows], references.descriptors, count)
        for row, row_cosines, row_found in zip(rows, cosines, found):
            crop_id = crops.ids[row]
            whole = queries.descriptors[query_rows[views[crop_id].query]]
            for cosine, reference in zip(row_cosines.tolist(), row_found.tolist()):
                key = (views[crop_id].query, references.ids[reference]) if reference >= 0 else None
                if key and cosine > float(whole @ references.descriptors[reference]) and cosine > best.get(
                        key, (-np.inf, ""))[0]:
                    best[key] = (cosine, crop_id)
    return [(crop_id, reference_id) for (_, reference_id), (_, crop_id) in best.items()]


def _content_crops(images: QueriesAndReferences, matcher: tuple, queries: DescriptorSet, references: DescriptorSet,
                   config, accelerator, progress: bool, stored: StoredByRole | None) -> tuple[dict[str, Box], int]:
    """The queries' content boxes (their content tokens against their nearest references and queries) and the encoder
    passes run to find them."""
    settings = matcher_content(config)
    model, processor = matcher
    check_content_fusion(model)
    cache = TokenCache(model.to(accelerator.device).pre_fusion_tokens, processor, images, config.cache_size,
                       config.batch_size, images.max_pixels, accelerator.device, stored)
    with accelerator.autocast():
        matches: CollectionMatches = sharded_matches(
            [("query", query_id) for query_id in queries.ids],
            query_neighbours(queries, references, settings.neighbours), cache, settings, accelerator, progress)
    return content_boxes(queries.ids, lambda query_id: matches.keep(("query", query_id))), matches.encoded


def query_crops(query_images: Mapping, reference_images: Mapping, descriptor, matcher: tuple,
                queries: DescriptorSet, references: DescriptorSet, config, accelerator, log: Callable[[str], None],
                score_pairs, progress: bool = False, stored: StoredByRole | None = None) -> QueryCrops:
    """``detect``'s query crops (the module's docstring) and the pairs they decide.

    Args:
        query_images, reference_images: id -> image (a path or a PIL image) of the queries and the references
            (``detect``'s :class:`~copynce_hf.retrieval.sources.SourceImages`).
        descriptor: the :class:`~copynce_hf.retrieval.descriptors.cached.Descriptor` whose whole-image descriptors are
            ``queries`` and ``references`` (raw, unit rows) and which describes the crops.
        matcher: ``(model, image processor)``; its encoder tokens find the content tokens.
        config: the :class:`~copynce_hf.retrieval.detection.config.DetectConfig` (content settings, ``layout_crops``,
            candidates, batch size).
        score_pairs: ``(pairs, crop source) -> (scores, cost)``: the matcher's scores of ``(crop, reference)`` pairs
            with the crops read from that source, every token kept (:func:`~copynce_hf.retrieval.verify.pairs.score_pairs`).
        stored: the encoder tokens of the queries and references already computed (the run's token stores): read, not
            encoded again, for the content tokens.
    """
    images = QueriesAndReferences(query_images, reference_images)
    found = QueryCrops()
    content, found.cost["encoded_views"] = _content_crops(images, matcher, queries, references, config, accelerator,
                                                          progress, stored)
    layout = query_layouts(query_images, queries.ids, accelerator, images.max_pixels) if config.crops_layouts else {}
    views = query_views(content, layout)
    found.boxes = dict(content)
    if not views:
        log("query crops: no query has a region of its own content small enough to crop")
        return found
    crops = CropSource(query_images, {crop_id: view.box for crop_id, view in views.items()}, images.max_pixels,
                       {crop_id: view.query for crop_id, view in views.items()})
    described = extract_descriptors(descriptor.model, descriptor.processor, crops, batch_size=config.batch_size,
                                    num_workers=config.num_workers, accelerator=accelerator, progress=progress,
                                    description=f"{descriptor.name}: query crops")
    pairs = query_crop_pairs(queries, references, described, config.candidates, views, config.layout_candidates)
    if pairs:
        scores, cost = score_pairs(pairs, crops)
        _decided(found, views, pairs, scores)
        found.cost = {name: found.cost[name] + cost[name] for name in found.cost}
    layout_views = sum(view.kind == LAYOUT for view in views.values())
    log(f"query crops: {len(content)} of {len(queries)} queries cropped to their own content by content tokens "
        f"(against their nearest references and queries), {len(layout)} have layout crops ({layout_views} boxes); "
        f"{len(found.scores)} pairs scored on a crop ({found.cost['encoded_views']} encoder passes, "
        f"{found.cost['fused_pairs']} fusion passes)")
    return found


def _decided(found: QueryCrops, views: Mapping[str, QueryView], pairs: list[tuple[str, str]],
             scores: Sequence[float | None]) -> None:
    """Record in ``found`` the scores of the ``(crop, reference)`` pairs by ``(query, reference)``, with the box and
    the kind of the crop each was scored on."""
    for (crop_id, reference_id), score in zip(pairs, scores):
        if score is not None:
            view = views[crop_id]
            found.scores[(view.query, reference_id)] = score
            found.pair_boxes[(view.query, reference_id)] = view.box
            found.kinds[(view.query, reference_id)] = view.kind


def settled(rescored: list[Prediction], crops: QueryCrops) -> QueryCrops:
    """The crop pairs that decide a score, out of those :func:`query_crops` scored: every content-crop pair (its score
    replaces the whole query's), and each layout-crop pair whose crop scored above the whole query or that the whole
    query did not score (a layout box is a guess: it may add evidence, never take it away); each query's box is that of
    its best deciding pair, else its content crop's. ``rescored``: the whole queries' scores."""
    whole = {(p.query_id, p.reference_id): p.score for p in rescored}
    found = QueryCrops(boxes=dict(crops.boxes), cost=dict(crops.cost))
    best: dict[str, tuple[str, str]] = {}
    for pair, score in crops.scores.items():
        kind = crops.kinds[pair]
        if kind == LAYOUT and pair in whole and score <= whole[pair]:
            continue
        found.scores[pair], found.pair_boxes[pair], found.kinds[pair] = score, crops.pair_boxes[pair], kind
        if pair[0] not in best or score > found.scores[best[pair[0]]]:
            best[pair[0]] = pair
    for query_id, pair in best.items():
        found.boxes[query_id] = found.pair_boxes[pair]
        if found.kinds[pair] == LAYOUT:
            found.layout.append(query_id)
    return found


def with_crop_scores(rescored: list[Prediction], crops: QueryCrops) -> list[Prediction]:
    """The matcher's predictions with those of the crop pairs (:func:`settled` ones): a pair decided on a crop takes
    that score."""
    scores = {(p.query_id, p.reference_id): p.score for p in rescored}
    scores.update(crops.scores)
    return [Prediction(query_id, reference_id, score) for (query_id, reference_id), score in scores.items()]
