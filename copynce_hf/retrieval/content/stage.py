"""The content-token hooks of ``dedup`` and ``detect`` (:mod:`copynce_hf.retrieval.content.tokens`, beyond the paper): which
images are each image's neighbours, the collection's keep masks for the matcher, and the search again on
content descriptors.

* Matcher stage (``content_tokens``): ``detect`` masks each query and its candidates against one another inside
  :class:`~copynce_hf.retrieval.verify.scorer.MatcherScorer`; ``dedup`` masks each image against the images it shares
  candidate pairs with (:func:`dedup_keep_masks`: one more encoder pass per image), each side of a pair
  without the other counting among its neighbours.
* Descriptor stage (``descriptor_content_tokens``): after the raw search, each image is masked against its
  nearest images by raw descriptor (its own final-layer patch tokens, one more encoder pass), described again
  from its content tokens (a second pass, for the images that lost tokens), and the search runs again on the
  content descriptors: :func:`content_index` for a collection searched against itself (``dedup``, ``detect``'s
  references), :func:`content_queries` for queries against the references (``detect``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import torch

from ...modeling.errors import ConfigError
from ...runtime.onnx_runtime import check_content_fusion
from ..descriptors.sets import DescriptorSet
from ..predictions import Prediction
from ..search.index import DescriptorIndex, IndexConfig
from ..search.references import search_references
from ..work_folder import lines_digest
from .masks import (
    CollectionMatches,
    StoredUnitTokens,
    TokenCache,
    processed_pixels,
    sharded_matches,
)
from .store import TokenStore
from .tokens import ContentSettings, content_descriptors

logger = logging.getLogger(__name__)


def matcher_content(config) -> ContentSettings | None:
    """The matcher stage's content settings of a :class:`~copynce_hf.retrieval.detection.config.DetectConfig` (``None``: every token)."""
    if not config.content_tokens:
        return None
    return ContentSettings(config.content_tau, config.content_min_images, config.content_neighbours)


def descriptor_content(config) -> ContentSettings | None:
    """The descriptor stage's content settings of a :class:`~copynce_hf.retrieval.detection.config.DetectConfig` (``None``: raw descriptors)."""
    if not config.descriptor_content_tokens:
        return None
    return ContentSettings(config.descriptor_content_tau, config.content_min_images, config.content_neighbours)


def content_setting(settings: ContentSettings | None) -> dict | bool:
    """How a calibration records a stage's content tokens: their settings, or ``False`` (also what a calibration
    made before content tokens existed means)."""
    return False if settings is None else settings.identity()


def content_identity(settings: ContentSettings | None, matches: CollectionMatches | None) -> dict:
    """What content tokens add to the identity of saved matcher scores: nothing without them; the settings, and
    a digest of the collection's matches (or ``"per query"`` when each query's local set masks it)."""
    if settings is None:
        return {}
    masks = "per query" if matches is None else lines_digest(matches.digest_lines())
    return {"content_tokens": settings.identity(), "content_masks": masks}


def log_local_masks(settings: ContentSettings, counts: Iterable[dict[str, int]], log: Callable[[str], None]) -> None:
    """The line saying what the per-query masks of ``detect``'s matcher dropped (``counts`` of each process, from
    :attr:`~copynce_hf.retrieval.verify.scorer.MatcherScorer.content_counts`)."""
    total = {name: sum(count[name] for count in counts) for name in ("pairs", "dropped", "tokens", "kept whole")}
    if not total["pairs"]:
        return
    log(f"matcher content tokens (tau {settings.tau}, {settings.min_images} of the query's {settings.neighbours} "
        f"best candidates): {total['dropped'] / max(1, total['tokens']):.1%} of the tokens of {total['pairs']} "
        f"pairs dropped, {total['kept whole']} sides kept whole (every token shared)")


def pair_neighbours(pairs: Iterable[Prediction]) -> dict[str, list[str]]:
    """Each image's partners in ``pairs`` (either side), best score first (ties by id)."""
    scored: dict[str, list[tuple[float, str]]] = {}
    for p in pairs:
        scored.setdefault(p.query_id, []).append((p.score, p.reference_id))
        scored.setdefault(p.reference_id, []).append((p.score, p.query_id))
    return {image_id: list(dict.fromkeys(other for _, other in sorted(found, key=lambda s: (-s[0], s[1]))))
            for image_id, found in scored.items()}


def dedup_keep_masks(matcher: tuple, images: Mapping, ids: list[str], candidates: list[Prediction], config,
                     accelerator, log: Callable[[str], None], progress: bool = False,
                     tokens: TokenStore | None = None) -> CollectionMatches | None:
    """``dedup``'s matcher matches: each image's encoder tokens against those of its ``content_neighbours`` best
    partners among the candidate pairs, read from ``tokens`` (every image encoded once) or encoded through a token
    cache (one encoder pass per image while it holds the walk's reach, counted in the result); ``None`` when
    ``content_tokens`` is off. ``progress``: a bar over the images."""
    settings = matcher_content(config)
    if settings is None:
        return None
    model, processor = matcher
    check_content_fusion(model)
    if tokens is not None:
        cache = StoredUnitTokens(tokens)
    else:
        model = model.to(accelerator.device)
        cache = TokenCache(model.pre_fusion_tokens, processor, images, config.cache_size, config.batch_size,
                           getattr(images, "max_pixels", None), accelerator.device)
    with accelerator.autocast():
        found = sharded_matches(ids, pair_neighbours(candidates), cache, settings, accelerator, progress)
    log(f"matcher content tokens (tau {settings.tau}, {settings.min_images} of {settings.neighbours} "
        f"neighbours): {found.summary()}")
    return found


def _self_neighbours(index: DescriptorIndex, k: int) -> dict[str, list[str]]:
    """Each indexed image's ``k`` nearest other indexed images by raw descriptor, best first."""
    found = search_references(index, index.references, k + 1)
    neighbours: dict[str, list[str]] = {}
    for p in found:
        if p.query_id != p.reference_id:
            neighbours.setdefault(p.query_id, []).append(p.reference_id)
    return {image_id: others[:k] for image_id, others in neighbours.items()}


def _describe_changed(descriptor, images: Mapping, keys: list, matches: CollectionMatches, raw: DescriptorSet,
                      config, accelerator) -> tuple[DescriptorSet, int]:
    """``raw`` (row ``i`` the image ``images[keys[i]]``) with the rows of the images that lose tokens (every
    neighbour counting) replaced by their content descriptors, and how many were described again (each process a
    share, gathered)."""
    masks = {key: matches.keep(key) for key in keys}
    changed = [row for row, key in enumerate(keys) if masks[key] is not None and not bool(masks[key].all())]
    processes, rank = accelerator.num_processes, accelerator.process_index
    mine = changed[rank::processes]
    model = descriptor.model.to(accelerator.device).eval()
    described: dict[int, np.ndarray] = {}
    for start in range(0, len(mine), config.batch_size):
        part = mine[start:start + config.batch_size]
        pixels = torch.stack([processed_pixels(images, keys[row], descriptor.processor,
                                               getattr(images, "max_pixels", None)) for row in part])
        keep = torch.stack([masks[keys[row]] for row in part])
        with torch.inference_mode(), accelerator.autocast():
            vectors = content_descriptors(model, pixels.to(accelerator.device), keep).float().cpu().numpy()
        described.update(zip(part, vectors))
    if processes > 1:
        from accelerate.utils import gather_object

        described = {key: value for part in gather_object([described]) for key, value in part.items()}
    rows = np.array(raw.descriptors, copy=True)
    for row, vector in described.items():
        rows[row] = vector
    return DescriptorSet(raw.ids, rows, raw.skipped, raw.skip_reasons), len(described)


def content_descriptor_set(descriptor, images: Mapping, keys: list, raw: DescriptorSet,
                           neighbours: Mapping[object, list], settings: ContentSettings, config, accelerator,
                           log: Callable[[str], None], what: str) -> DescriptorSet:
    """The content descriptors of ``raw``'s images (row ``i`` the image ``images[keys[i]]``; ``raw``'s own row
    for those that keep every token): each image's final-layer patch tokens masked against its ``neighbours``
    (keys of ``images``, best first)."""
    model = descriptor.model
    if not hasattr(model, "encode") or not hasattr(model, "vit"):
        raise ConfigError("descriptor content tokens re-run the blocks of a PyTorch CopyNCE descriptor; "
                          f"{type(model).__name__} of {descriptor.name} is not one (use --runtime torch and a CopyNCE "
                          "descriptor, not an ONNX embedding model onnx:PATH)")
    model = model.to(accelerator.device).eval()
    cache = TokenCache(model.encode, descriptor.processor, images, config.cache_size, config.batch_size,
                       getattr(images, "max_pixels", None), accelerator.device)
    with accelerator.autocast():
        matches = sharded_matches(keys, neighbours, cache, settings, accelerator)
    content, described = _describe_changed(descriptor, images, keys, matches, raw, config, accelerator)
    log(f"{descriptor.name}: descriptor content tokens of the {what} (tau {settings.tau}, {settings.min_images} "
        f"of {settings.neighbours} neighbours): {matches.summary()}; {described} images described again from their "
        "content tokens (a second encoder pass each)")
    return content


def content_index(descriptor, images: Mapping, index: DescriptorIndex, settings: ContentSettings, config,
                  accelerator, log: Callable[[str], None], what: str) -> DescriptorIndex:
    """An index over the content descriptors of ``index``'s images (whole images, the same whitening), each
    masked against its nearest other indexed images."""
    if index.info.get("views", "none") != "none":
        raise ConfigError("descriptor content tokens apply to whole images only (descriptor_lce none)")
    neighbours = _self_neighbours(index, settings.neighbours)
    content = content_descriptor_set(descriptor, images, list(index.references.ids), index.references, neighbours,
                                     settings, config, accelerator, log, what)
    return DescriptorIndex.build(content, IndexConfig(kind="flat"), info=dict(index.info),
                                 whitening=index.whitening)


class StoredByRole:
    """The encoder tokens the queries' and the references' token stores hold, looked up by the keys of
    :class:`QueriesAndReferences` (``("query", id)``, ``("reference", id)``): ``key in`` says whether a store holds
    the image, ``[key]`` gives its tokens (1 + L, C) (``None``: unreadable)."""

    def __init__(self, queries: TokenStore | None, references: TokenStore | None):
        self.stores = {"query": queries, "reference": references}

    def __contains__(self, key) -> bool:
        store = self.stores.get(key[0])
        return store is not None and key[1] in store

    def __getitem__(self, key):
        return self.stores[key[0]].tokens(key[1])


class QueriesAndReferences(Mapping):
    """``("query", id)`` -> a query image, ``("reference", id)`` -> a reference image (ids may repeat between the
    two sets)."""

    def __init__(self, queries: Mapping, references: Mapping):
        self.sides = {"query": queries, "reference": references}
        self.max_pixels = getattr(queries, "max_pixels", None)  # one limit for both: detect reads both with it

    def __getitem__(self, key):
        side, image_id = key
        return self.sides[side][image_id]

    def __iter__(self):
        raise TypeError("the images of queries and references are looked up by key, not listed")

    def __len__(self) -> int:
        raise TypeError("the images of queries and references are looked up by key, not counted")


def dedup_content_index(descriptor, images: Mapping, index: DescriptorIndex, queries: DescriptorSet, config,
                        accelerator, log: Callable[[str], None], seconds: dict[str, float]
                        ) -> tuple[DescriptorIndex, DescriptorSet]:
    """``dedup``'s descriptor stage with ``descriptor_content_tokens``: the index of the collection's content
    descriptors and the same descriptors as the queries of the self-search; ``(index, queries)`` unchanged
    without. The time goes to ``seconds["descriptor content tokens"]``."""
    settings = descriptor_content(config)
    if settings is None:
        return index, queries
    start = time.perf_counter()
    index = content_index(descriptor, images, index, settings, config, accelerator, log, "images")
    seconds["descriptor content tokens"] = time.perf_counter() - start
    return index, index.references


def content_queries(descriptor, query_images: Mapping, reference_images: Mapping, queries: DescriptorSet,
                    raw_index: DescriptorIndex, settings: ContentSettings, config, accelerator,
                    log: Callable[[str], None]) -> DescriptorSet:
    """The content descriptors of the queries, each masked against its nearest references by raw descriptor."""
    neighbours: dict[object, list] = {}
    for p in search_references(raw_index, queries, settings.neighbours):
        neighbours.setdefault(("query", p.query_id), []).append(("reference", p.reference_id))
    return content_descriptor_set(descriptor, QueriesAndReferences(query_images, reference_images),
                                  [("query", image_id) for image_id in queries.ids], queries, neighbours, settings,
                                  config, accelerator, log, "queries")


def detect_content_search(descriptor, images: tuple[Mapping, Mapping, Mapping | None], index: DescriptorIndex,
                          auxiliary_index: DescriptorIndex | None, queries: DescriptorSet, config, accelerator,
                          log: Callable[[str], None]) -> tuple[DescriptorIndex, DescriptorIndex | None, DescriptorSet]:
    """``detect``'s descriptor stage with ``descriptor_content_tokens``: ``(reference index, auxiliary index,
    query descriptors)`` of content descriptors (the references and the auxiliary images each masked against their
    nearest images of their own set, the queries against their nearest references); unchanged without.

    Args:
        images: id -> image of the queries, the references and the auxiliary images (``None`` without).
    """
    settings = descriptor_content(config)
    if settings is None:
        return index, auxiliary_index, queries
    query_images, reference_images, auxiliary_images = images
    queries = content_queries(descriptor, query_images, reference_images, queries, index, settings, config,
                              accelerator, log)
    index = content_index(descriptor, reference_images, index, settings, config, accelerator, log, "references")
    if auxiliary_index is not None:
        auxiliary_index = content_index(descriptor, auxiliary_images, auxiliary_index, settings, config, accelerator,
                                        log, "auxiliary images")
    return index, auxiliary_index, queries
