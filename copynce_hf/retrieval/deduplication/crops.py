"""Step 2b of :func:`~copynce_hf.retrieval.deduplication.collection.dedup`: content crops as a second view of the
collection's images (:mod:`copynce_hf.retrieval.content.crops`, beyond the paper).

Each image's own content (its largest region of content tokens, grown by a patch, under 60 % of the image) is cut
from its pixels; the crops' descriptors propose pairs, and a pair whose best descriptor match involves a crop is
verified by the matcher on those views, every token kept (a crop is its image's own content).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..content.crops import VIEW_CROP, VIEW_WHOLE, CropPair, CropSource, content_boxes, crop_pairs, crop_views
from ..content.store import TokenStore
from ..descriptors.cached import Descriptor
from ..descriptors.extract import extract_descriptors
from ..descriptors.sets import DescriptorSet
from ..descriptors.views import ViewPreset
from ..search.index import DescriptorIndex
from ..sources import SourceImages
from .self_search import collection_order, descriptor_pair_scores
from .verification import CollectionMatcher, PairDecision


@dataclasses.dataclass
class CropViews:
    """The content crops of a collection and the pairs verified on them.

    Attributes:
        crops: the crops (an image source; ids: their images').
        descriptors: the crops' descriptors (ids: their images').
        pairs: the pairs verified on their best views (:class:`~copynce_hf.retrieval.content.crops.CropPair`).
        tokens: the crops' matcher encoder tokens, each crop encoded once (``None`` with LCE views).
    """

    crops: CropSource
    descriptors: DescriptorSet | None = None
    pairs: list[CropPair] = dataclasses.field(default_factory=list)
    tokens: TokenStore | None = None


def verify_on_crops(scorer: CollectionMatcher, descriptor: Descriptor, index: DescriptorIndex,
                    raw: dict[tuple[str, str], float], folder, seconds: dict[str, float], tokens_folder: Path | None = None
                    ) -> tuple[dict[tuple[str, str], float], CropViews | None]:
    """``raw`` with the pairs that content crops propose or decide scored on their best views (chunks kept in
    ``folder``, :func:`view_scores`; the crops' encoder tokens in ``tokens_folder/crops``), and the crops;
    ``(raw, None)`` without content tokens, with view presets, or with ``content_crops`` off. The time goes to
    ``seconds["content crops"]``."""
    config, source = scorer.config, scorer.source
    if not (scorer.settings.content_crops and scorer.matches is not None and config.descriptor_lce == "none"):
        return raw, None
    start = time.perf_counter()
    images = SourceImages(source)
    found = CropViews(CropSource(images, content_boxes(source.ids, scorer.matches.keep), images.max_pixels))
    if not len(found.crops):
        seconds["content crops"] = time.perf_counter() - start
        scorer.log("content crops: no image has a region of its own content small enough to crop")
        return raw, found
    found.descriptors = extract_descriptors(descriptor.model, descriptor.processor, found.crops,
                                            progress=scorer.progress, description=f"{descriptor.name}: content crops",
                                            batch_size=config.batch_size, num_workers=config.num_workers,
                                            accelerator=scorer.accelerator)
    pairs = crop_pairs(index.references, found.descriptors, config.candidates, collection_order(source))
    if tokens_folder is not None and scorer.tokens is not None and pairs:
        found.tokens = scorer.crop_tokens(found.crops, list(found.crops.ids), tokens_folder / "crops", "crops")
    scores = view_scores(scorer, pairs, found, folder)
    scored = {(pair.a, pair.b): (pair, score) for pair, score in zip(pairs, scores) if score is not None}
    found.pairs = [pair for pair, _ in scored.values()]
    replaced = len(scored.keys() & raw.keys())
    seconds["content crops"] = time.perf_counter() - start
    scorer.log(f"content crops: {len(found.crops)} of {len(source)} images cropped to their own content, "
               f"{len(pairs)} pairs verified on their crops ({replaced} of them whole-image candidates)")
    return {**raw, **{key: score for key, (_, score) in scored.items()}}, found


def view_scores(scorer: CollectionMatcher, pairs: list[CropPair], crops: CropViews | None, folder=None
                ) -> list[float | None]:
    """The matcher's score of each :class:`~copynce_hf.retrieval.content.crops.CropPair` on its two views, every token
    kept (a crop is its image's own content), in both orders where the collection's matcher scores them so. The
    scored chunks of each kind of view pair and order are kept in ``folder/crops-<view>-<view>[-reversed]``
    (``None``: not kept); the whole images' and the crops' encoder tokens are read from the run's stores."""
    sources = {VIEW_WHOLE: (scorer.source, scorer.tokens),
               VIEW_CROP: (crops.crops, crops.tokens) if crops is not None else (None, None)}
    scores: dict[int, float | None] = {}
    for views in sorted({(pair.view_a, pair.view_b) for pair in pairs}):
        rows = [i for i, pair in enumerate(pairs) if (pair.view_a, pair.view_b) == views]
        forward = [(pairs[i].a, pairs[i].b) for i in rows]
        kept = Path(folder) / f"crops-{views[0]}-{views[1]}" if folder is not None else None
        (queries, query_tokens), (references, reference_tokens) = sources[views[0]], sources[views[1]]
        scores.update(zip(rows, scorer.view_scores(forward, queries, references, kept,
                                                   (query_tokens, reference_tokens))))
    return [scores[i] for i in range(len(pairs))]


def score_missing(scorer: CollectionMatcher | None, pairs: list[tuple[str, str]], decide: PairDecision,
                  index: DescriptorIndex, queries: DescriptorSet, preset: ViewPreset, crops: CropViews | None
                  ) -> list[float | None]:
    """The decision scores of pairs that were not candidates (a member and its group's first member): scored now by
    the matcher (on their views when a content crop matches best, as :func:`verify_on_crops` scores), or by the
    descriptor without one (``None``: the matcher could not)."""
    if scorer is None:
        raw = descriptor_pair_scores(index, queries, preset, pairs)
        return [None if score is None else decide(a, b, score) for (a, b), score in zip(pairs, raw)]
    views = ([None] * len(pairs) if crops is None or crops.descriptors is None
             else crop_views(pairs, index.references, crops.descriptors))
    raw_scores: list[float | None] = [None] * len(pairs)
    whole = [i for i, view in enumerate(views) if view is None]
    on_crops = [i for i, view in enumerate(views) if view is not None]
    for rows, scores in ((whole, scorer.whole_scores([pairs[i] for i in whole]) if whole else []),
                         (on_crops, view_scores(scorer, [views[i] for i in on_crops], crops))):
        for i, score in zip(rows, scores):
            raw_scores[i] = score
    return [None if score is None else decide(a, b, score) for (a, b), score in zip(pairs, raw_scores)]
