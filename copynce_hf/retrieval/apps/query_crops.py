"""Query crops: ``detect``'s content crops (:mod:`.content_crops`) of the queries, beyond the paper.

A query that pastes a reference into a screenshot, a meme band or onto a background keeps a few percent of its
pixels for the copy; at the models' input size the copy is a handful of patches, and the frame decides the query's
descriptor and most of the matcher's tokens. ``dedup`` cuts each image's own content from its frame as a second view
(:mod:`.content_crops`); ``detect`` does the same for its queries (:func:`query_crops`):

1. each query's content tokens: its matcher encoder tokens against its ``content_neighbours`` nearest images by
   descriptor cosine, among the references *and the other queries* (a moderation queue holds many screenshots of
   one app, many posts of one meme template: the frames recur among the queries as well as the references);
2. the box of the largest region of content tokens (:func:`~.content_crops.content_box`), cut from the query's own
   pixels where it covers less than :data:`~.content_crops.MAX_AREA` of the image;
3. each crop's descriptor searches the references for its ``candidates`` nearest; a pair whose crop cosine is above
   the whole query's cosine to that reference is scored by the matcher on the crop and the reference (every token
   kept: the crop is the query's own content), and that score replaces the whole query's.

The references are not cropped: a reference set is the originals a moderation database holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..jobs.content_masks import CollectionMatches, TokenCache, sharded_matches
from ..jobs.matcher_cache import check_content_fusion
from ..search.descriptors import DescriptorSet
from ..search.extract import extract_descriptors
from ..search.predictions import Prediction
from .content_crops import Box, CropSource, content_boxes, nearest_rows
from .content_stage import QueriesAndReferences, matcher_content

__all__ = ["QueryCrops", "query_neighbours", "query_crop_pairs", "query_crops", "with_crop_scores"]


@dataclasses.dataclass
class QueryCrops:
    """What :func:`query_crops` found: each cropped query's box (fractions of its width and height), the
    ``(query, reference)`` pairs scored on the crop with their scores, and the passes it ran."""

    boxes: dict[str, Box] = dataclasses.field(default_factory=dict)
    scores: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    cost: dict[str, int] = dataclasses.field(default_factory=lambda: {"encoded_views": 0, "fused_pairs": 0})


def query_neighbours(queries: DescriptorSet, references: DescriptorSet, k: int) -> dict[tuple, list[tuple]]:
    """Each query's ``2 k`` nearest images by cosine among the references and the other queries, best first, as
    keys of :class:`~.content_stage.QueriesAndReferences` (``("query", id)``, ``("reference", id)``; the content
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


def query_crop_pairs(queries: DescriptorSet, references: DescriptorSet, crops: DescriptorSet, candidates: int
                     ) -> list[tuple[str, str]]:
    """The ``(query, reference)`` pairs a crop decides: each crop's ``candidates`` nearest references, kept where
    the crop's cosine is above the whole query's (else the whole query decides the pair). Unit descriptors: whole
    queries (N, D), references (M, D), crops (C, D) with the ids of their queries."""
    if not len(crops) or not len(references):
        return []
    query_rows = {query_id: row for row, query_id in enumerate(queries.ids)}
    cosines, rows = nearest_rows(crops.descriptors, references.descriptors, candidates)
    pairs = []
    for query_id, row_cosines, row_found in zip(crops.ids, cosines, rows):
        whole = queries.descriptors[query_rows[query_id]]
        for cosine, row in zip(row_cosines, row_found):
            if row >= 0 and float(cosine) > float(whole @ references.descriptors[row]):
                pairs.append((query_id, references.ids[row]))
    return pairs


def query_crops(query_source, reference_source, descriptor, matcher: tuple, queries: DescriptorSet,
                references: DescriptorSet, config, accelerator, log: Callable[[str], None], score_pairs,
                progress: bool = False) -> QueryCrops:
    """The crops of :mod:`this module <.query_crops>` and the pairs they decide.

    Args:
        query_source, reference_source: the image sources of ``detect``.
        descriptor: the :class:`~.detect.Descriptor` whose whole-image descriptors are ``queries`` and
            ``references`` (raw, unit rows) and which describes the crops.
        matcher: ``(model, image processor)``; its encoder tokens find the content tokens.
        config: the :class:`~.detect.DetectConfig` (content settings, candidates, batch size).
        score_pairs: ``(pairs, query source) -> (scores, cost)``: the matcher's scores of ``(query, reference)``
            pairs with the queries read from that source, every token kept (:func:`~.detect.matcher_scores`).
    """
    from .detect import SourceImages

    settings = matcher_content(config)
    model, processor = matcher
    check_content_fusion(model)
    images = QueriesAndReferences(SourceImages(query_source), SourceImages(reference_source))
    cache = TokenCache(model.to(accelerator.device).pre_fusion_tokens, processor, images, config.cache_size,
                       config.batch_size, images.max_pixels, accelerator.device)
    with accelerator.autocast():
        matches: CollectionMatches = sharded_matches(
            [("query", query_id) for query_id in queries.ids],
            query_neighbours(queries, references, settings.neighbours), cache, settings, accelerator, progress)
    found = QueryCrops(content_boxes(queries.ids, lambda query_id: matches.keep(("query", query_id))))
    found.cost["encoded_views"] += matches.encoded
    if not found.boxes:
        log("query crops: no query has a region of its own content small enough to crop")
        return found
    crops = CropSource(SourceImages(query_source), found.boxes, images.max_pixels)
    described = extract_descriptors(descriptor.model, descriptor.processor, crops, batch_size=config.batch_size,
                                    num_workers=config.num_workers, accelerator=accelerator, progress=progress,
                                    description=f"{descriptor.name}: query crops")
    pairs = query_crop_pairs(queries, references, described, config.candidates)
    scores, cost = score_pairs(pairs, crops) if pairs else ([], {"encoded_views": 0, "fused_pairs": 0})
    found.scores = {pair: score for pair, score in zip(pairs, scores) if score is not None}
    found.cost = {name: found.cost[name] + cost[name] for name in found.cost}
    log(f"query crops: {len(found.boxes)} of {len(queries)} queries cropped to their own content (content tokens "
        f"against their nearest references and queries), {len(found.scores)} pairs scored on their crops")
    return found


def with_crop_scores(rescored: list[Prediction], crops: QueryCrops) -> list[Prediction]:
    """The matcher's predictions with those of the crop pairs: a pair scored on a crop takes that score."""
    scores = {(p.query_id, p.reference_id): p.score for p in rescored}
    scores.update(crops.scores)
    return [Prediction(query_id, reference_id, score) for (query_id, reference_id), score in scores.items()]
