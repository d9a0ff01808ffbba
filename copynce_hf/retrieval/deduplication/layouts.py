"""Step 2c of :func:`~copynce_hf.retrieval.deduplication.collection.dedup`: layout crops as more views of the
collection's images (:mod:`copynce_hf.retrieval.content.layout`, beyond the paper).

Content crops (:mod:`.crops`) cut an image to what it does not share with its neighbours, so they need the frame to
recur in the collection. A screenshot, a poster or a photo pasted onto a background met once is recognised from its
own pixels instead: each image gets up to :data:`~copynce_hf.retrieval.content.layout.LAYOUT_CROPS` layout boxes
(none repeating its content crop), cut from its full-resolution pixels, and

1. each layout crop's descriptor searches the whole images for its ``layout_candidates`` nearest other images
   (:func:`layout_pairs`); a pair is kept where the crop's cosine is above the two whole images' own, on the crop of
   the best cosine;
2. the matcher scores the kept pairs on the crop and the other whole image, every token kept (a crop is its image's
   own content), in both orders where the collection's matcher scores them so;
3. a layout crop's score replaces a pair's raw score only where it is higher, and adds the pairs no other stage
   scored (a layout box is a guess, which may add evidence but not take it away), as ``detect``'s query crops
   settle them (:func:`~copynce_hf.retrieval.content.queries.settled`).

Pairs that only the grouping scores (a member and its group's first member) are not searched on layout crops.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..content.crops import VIEW_LAYOUT, VIEW_WHOLE, Box, CropPair, CropSource, nearest_rows
from ..content.queries import LAYOUT, query_layouts, query_views
from ..descriptors.cached import Descriptor
from ..descriptors.extract import extract_descriptors
from ..descriptors.sets import DescriptorSet
from ..search.index import DescriptorIndex
from ..sources import SourceImages
from .self_search import collection_order
from .verification import CollectionMatcher


@dataclasses.dataclass
class LayoutViews:
    """The layout crops of a collection and the pairs they decided.

    Attributes:
        crops: the crops (an image source; ids ``layout<n>:<image id>``, :meth:`CropSource.image_id` gives the image).
        pairs: the pairs whose raw score a layout crop decided (:class:`~copynce_hf.retrieval.content.crops.CropPair`,
            one view :data:`~copynce_hf.retrieval.content.crops.VIEW_LAYOUT`).
        boxes: ``(earlier, later)`` -> the box of the layout crop that decided the pair.
    """

    crops: CropSource
    pairs: list[CropPair] = dataclasses.field(default_factory=list)
    boxes: dict[tuple[str, str], Box] = dataclasses.field(default_factory=dict)


def layout_pairs(whole: DescriptorSet, crops: DescriptorSet, image_of, candidates: int
                 ) -> dict[tuple[str, str], tuple[float, str]]:
    """``(image, other image)`` -> ``(cosine, crop id)`` of the pairs layout crops propose: each crop's ``candidates``
    nearest whole images other than its own, kept where the crop's cosine is above the two whole images' own; a
    pair once, on the crop of the best cosine. ``whole``: (N, D) unit descriptors of the whole images; ``crops``:
    (C, D) of the crops; ``image_of(crop id)`` gives a crop's image."""
    rows = {image_id: row for row, image_id in enumerate(whole.ids)}
    best: dict[tuple[str, str], tuple[float, str]] = {}
    if not len(crops) or len(whole) < 2:
        return best
    cosines, found = nearest_rows(crops.descriptors, whole.descriptors, candidates + 1)
    for crop_id, row_cosines, row_found in zip(crops.ids, cosines, found):
        image_id = image_of(crop_id)
        if image_id not in rows:
            continue
        own = whole.descriptors[rows[image_id]]
        kept = [(float(c), whole.ids[r]) for c, r in zip(row_cosines, row_found) if r >= 0 and whole.ids[r] != image_id]
        for cosine, other in kept[:candidates]:
            if cosine > float(own @ whole.descriptors[rows[other]]) and cosine > best.get((image_id, other),
                                                                                          (float("-inf"), ""))[0]:
                best[(image_id, other)] = (cosine, crop_id)
    return best


def verify_on_layouts(scorer: CollectionMatcher, descriptor: Descriptor, index: DescriptorIndex,
                      raw: dict[tuple[str, str], float], content_boxes: dict[str, Box], folder,
                      seconds: dict[str, float], tokens_folder: Path | None = None
                      ) -> tuple[dict[tuple[str, str], float], LayoutViews | None]:
    """``raw`` with the pairs layout crops propose scored on them where that is higher (the module's docstring;
    chunks kept in ``folder/layouts[-reversed]``, the crops' encoder tokens in ``tokens_folder/layouts``), and the
    crops; ``(raw, None)`` without ``layout_crops``, without a token store (LCE views) or with descriptor views.
    ``content_boxes``: each image's content crop, which no layout box repeats. The time goes to
    ``seconds["layout crops"]``."""
    config = scorer.config
    if not (scorer.settings.layout_crops and scorer.tokens is not None and config.descriptor_lce == "none"):
        return raw, None
    start = time.perf_counter()
    images = SourceImages(scorer.source)
    views = {crop_id: view for crop_id, view in query_views(content_boxes, query_layouts(
        images, list(index.references.ids), scorer.accelerator, images.max_pixels)).items() if view.kind == LAYOUT}
    found = LayoutViews(CropSource(images, {crop_id: view.box for crop_id, view in views.items()}, images.max_pixels,
                                   {crop_id: view.query for crop_id, view in views.items()}))
    proposed = {}
    if len(found.crops):
        described = extract_descriptors(descriptor.model, descriptor.processor, found.crops,
                                        progress=scorer.progress, description=f"{descriptor.name}: layout crops",
                                        batch_size=config.batch_size, num_workers=config.num_workers,
                                        accelerator=scorer.accelerator)
        proposed = layout_pairs(index.references, described, found.crops.image_id,
                                min(config.candidates, config.layout_candidates))
    if proposed:
        scores = _layout_scores(scorer, found.crops, [(crop_id, other) for (_, other), (_, crop_id) in proposed.items()],
                                folder, tokens_folder)
        raw = _settled(raw, found, proposed, scores, collection_order(scorer.source))
    seconds["layout crops"] = time.perf_counter() - start
    scorer.log(f"layout crops: {len({view.query for view in views.values()})} of {len(index.references)} images have "
               f"layout boxes ({len(found.crops)} crops), {len(proposed)} pairs verified on a crop, {len(found.pairs)} "
               "of them scored higher there")
    return raw, found


def _layout_scores(scorer: CollectionMatcher, crops: CropSource, pairs: list[tuple[str, str]], folder,
                   tokens_folder: Path | None) -> list[float | None]:
    """The matcher's score of each ``(crop, other image)`` pair, every token kept, in both orders where the
    collection's matcher scores them so (:meth:`~.verification.CollectionMatcher.view_scores`)."""
    tokens = None if tokens_folder is None else scorer.crop_tokens(
        crops, list(dict.fromkeys(crop for crop, _ in pairs)), tokens_folder / "layouts", "layout crops")
    return scorer.view_scores(pairs, crops, scorer.source, Path(folder) / "layouts" if folder is not None else None,
                              (tokens, scorer.tokens))


def _settled(raw: dict[tuple[str, str], float], found: LayoutViews, proposed: dict, scores: list[float | None],
             order: dict[str, int]) -> dict[tuple[str, str], float]:
    """``raw`` with each layout crop's score where it is higher or the pair had none; the deciding pairs and their
    boxes recorded in ``found``."""
    settled, decided = dict(raw), {}
    for ((image_id, other), (cosine, crop_id)), score in zip(proposed.items(), scores):
        first, second = sorted((image_id, other), key=order.__getitem__)
        if score is None or score <= settled.get((first, second), float("-inf")):
            continue
        settled[(first, second)] = score
        views = (VIEW_LAYOUT, VIEW_WHOLE) if first == image_id else (VIEW_WHOLE, VIEW_LAYOUT)
        decided[(first, second)] = CropPair(first, second, *views, cosine)
        found.boxes[(first, second)] = found.crops.boxes[crop_id]
    found.pairs = list(decided.values())
    return settled
