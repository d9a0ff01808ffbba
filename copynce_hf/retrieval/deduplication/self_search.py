"""Step 1 of :func:`~copynce_hf.retrieval.deduplication.collection.dedup`: the descriptor stage over one collection.

The index over the collection's views (the same :func:`~copynce_hf.retrieval.search.cached_index.view_index`, cache
folder and optional whitening as ``detect``) is searched with every image's own descriptors for its nearest other
images (self-search, the image itself left out). With collection normalisation each image's background is its mean
cosine to its neighbours of ranks ``collection.k_start..collection.k_end``, a pair's score is its cosine minus the
mean of its two backgrounds (CSLS, :mod:`~copynce_hf.retrieval.search.background`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..descriptors.cached import Descriptor, learn_whitening, note_skips, query_view_descriptors
from ..descriptors.sets import DescriptorSet
from ..descriptors.view_extraction import owner_of
from ..descriptors.views import ViewPreset
from ..detection.config import DetectConfig
from ..predictions import Prediction
from ..presets import CollectionNormalisation
from ..search.background import neighbour_background, pair_background
from ..search.cached_index import view_index
from ..search.index import DescriptorIndex
from ..search.references import search_references


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


def collection_descriptors(source, descriptor: Descriptor, config: DetectConfig, extract: dict, folder: Path | None,
                           whiten_from, whitening_folder, progress: bool, log: Callable[[str], None],
                           seconds: dict[str, float]) -> tuple[DescriptorIndex, DescriptorSet, dict[str, str]]:
    """``(index of the collection's views, its query views, id -> reason of each image left out)``, whitened when
    ``whiten_from`` is given (its sample kept in ``whitening_folder``); cached in ``folder`` as ``detect`` caches
    them. The times go to ``seconds`` (``whitening``, ``index``)."""
    preset = ViewPreset(config.descriptor_lce)
    whitening = None
    if whiten_from is not None:
        start = time.perf_counter()
        whitening = learn_whitening(descriptor, whiten_from, preset, config.whiten_dim, whitening_folder,
                                    progress=progress, description="whitening sample", **extract)
        seconds["whitening"] = time.perf_counter() - start
        log(f"whitening learned from {whitening.samples} sample views ({whitening.input_dim} -> "
            f"{whitening.dim} dimensions)")
    start = time.perf_counter()
    index = view_index(descriptor, source, preset, folder / "references" if folder else None, progress=progress,
                       description=f"{descriptor.name}: image views", whitening=whitening, log=log, **extract)
    seconds["index"] = time.perf_counter() - start
    skipped: dict[str, str] = {}
    note_skips(index.references, skipped)
    if preset.name == "none":
        return index, index.references, skipped  # one view per image: the indexed descriptors are the queries
    queries, _, _ = query_view_descriptors(descriptor, source, preset, folder / "queries" if folder else None,
                                           progress=progress, description=f"{descriptor.name}: query views", **extract)
    note_skips(queries, skipped)
    return index, queries, skipped


def collection_order(source) -> dict[str, int]:
    """Image id -> its place in the collection (what "earlier" means for a pair)."""
    return {image_id: i for i, image_id in enumerate(source.ids)}


def candidate_pairs(index: DescriptorIndex, queries: DescriptorSet, config: DetectConfig,
                    collection: CollectionNormalisation, order: dict[str, int], readable: int, name: str,
                    log: Callable[[str], None], seconds: dict[str, float]) -> CandidatePairs:
    """The self-search's pairs to verify (:func:`self_search_pairs`), collection-normalised when ``collection.on``;
    its time goes to ``seconds["self-search"]``."""
    start = time.perf_counter()
    ranks = (collection.k_start, collection.k_end) if collection.on else None
    found = self_search_pairs(index, queries, ViewPreset(config.descriptor_lce), config.candidates, order, ranks,
                              collection.alpha)
    seconds["self-search"] = time.perf_counter() - start
    normalised = ""
    if ranks is not None:
        values = list(found.background.values())
        normalised = (f"; collection-normalised: each image's background is its mean cosine to its neighbours of "
                      f"ranks {ranks[0]}-{ranks[1]}" + (f", median {np.median(values):.3f}, largest "
                                                        f"{max(values):.3f}" if values else " (too few images)"))
    log(f"{name}: {len(found.pairs)} candidate pairs among {readable} images (the {config.candidates} best other "
        f"images of each{normalised})")
    return found
