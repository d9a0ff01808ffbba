"""Descriptor search with local crops ensembling: one descriptor per view, best view pair per image pair.

Supplementary "More about Candidates List for Matcher": "for each crop of query, we identify
k-NN in reference set"; the descriptor's LCE score of a (query, reference) pair is the maximum
cosine over their view pairs (supplementary "Local Crops Ensembling"), and score normalisation
applies after it (supplementary "Score Normalization": the bias is the mean LCE score of the query
to its auxiliary neighbours k_start..k_end, the auxiliary images seen through the same views).

Views are rows of an ordinary :class:`DescriptorIndex` (:mod:`.view_extraction`: row ``id#v``), so an index
over reference views maps every row back to its reference, and the preset name is kept in ``index.json``
(``info["views"]``). With the ``none`` preset there is one view per image, whose row id is the image id
itself, and everything below reduces to plain k-NN search.

The ``authors`` preset keeps neighbours per query view instead (supplementary "More about
Candidates List for Matcher": "for each crop of query, we identify k-NN in reference set and each
query recalls 390 candidates"): every query view keeps its own top ``k`` references, ``k`` set by
its view group (:attr:`ViewPreset.group_top_k`), a reference scoring its best view against that
query view; the lists of all views are joined and a reference found by several views keeps its
best score (:func:`search_view_groups`).
"""

from __future__ import annotations

import numpy as np

from ...modeling.errors import ConfigError
from ..descriptors.sets import DescriptorSet
from ..descriptors.view_extraction import VIEW_SEPARATOR, owner_of
from ..descriptors.views import ViewPreset
from ..predictions import Prediction
from .index import DescriptorIndex


def view_preset_of(index: DescriptorIndex) -> ViewPreset:
    """The view preset an index was built with (``info["views"]``, ``none`` for indexes without it)."""
    return ViewPreset(index.info.get("views", "none"))


def search_views(
    index: DescriptorIndex, queries: DescriptorSet, query_preset: ViewPreset, k: int, view_k: int | None = None
) -> tuple[list[str], list[list[tuple[str, float]]]]:
    """Per query image, its ``k`` best references by the maximum view-pair cosine.

    Args:
        index: an index over reference views (:func:`view_preset_of` tells its preset).
        queries: query view descriptors (rows ``id#v``, from :func:`extract_view_descriptors`).
        query_preset: the preset the query views were cut with.
        k: references kept per query.
        view_k: neighbours (reference views) searched per query view; ``None``: ``k`` times the
            number of reference views per image, so that ``k`` distinct references can be found.

    Returns:
        ``(query ids, per query [(reference id, score), ...] best first)``.
    """
    reference_preset = view_preset_of(index)
    row_owners = np.array([owner_of(row, reference_preset.name) for row in index.references.ids], dtype=object)
    view_k = view_k or k * reference_preset.num_reference_views
    scores, rows = index.search(queries.descriptors, view_k)
    query_owners = [owner_of(row, query_preset.name) for row in queries.ids]
    best: dict[str, dict[str, float]] = {}
    for owner, row_scores, row_indices in zip(query_owners, scores, rows):
        per_reference = best.setdefault(owner, {})
        for score, row in zip(row_scores.tolist(), row_indices.tolist()):
            if row < 0:
                continue
            reference = row_owners[row]
            if score > per_reference.get(reference, -np.inf):
                per_reference[reference] = score
    query_ids = list(best)
    ranked = [sorted(best[q].items(), key=lambda item: (-item[1], item[0]))[:k] for q in query_ids]
    return query_ids, ranked


def _view_of(row_id: str) -> int:
    return int(row_id.rsplit(VIEW_SEPARATOR, 1)[1])


def search_view_groups(
    index: DescriptorIndex, queries: DescriptorSet, query_preset: ViewPreset
) -> tuple[list[str], list[list[tuple[str, float]]]]:
    """Per query image, the union of its query views' own top-``k`` references, ``k`` set per view group.

    A reference's score against one query view is its best reference view's cosine; joined over the
    query's views, a reference keeps its best score. With the ``authors`` preset a query keeps at most
    100 + 10 * 10 + 9 * 10 + 25 * 4 = 390 references (fewer where views find the same ones).

    Args:
        index: an index over reference views.
        queries: query view descriptors (rows ``id#v``, from :func:`extract_view_descriptors`).
        query_preset: a preset with view groups (:attr:`ViewPreset.group_top_k` is not ``None``).

    Returns:
        ``(query ids, per query [(reference id, score), ...] best first)``.
    """
    if query_preset.group_top_k is None:
        raise ConfigError(f"the {query_preset.name!r} views keep no neighbours per view group")
    group_of_view = [g for g, size in enumerate(query_preset.group_sizes) for _ in range(size)]
    view_top_k = np.array([query_preset.group_top_k[group_of_view[_view_of(row)]] for row in queries.ids])
    reference_preset = view_preset_of(index)
    row_owners = np.array([owner_of(row, reference_preset.name) for row in index.references.ids], dtype=object)
    # the first k distinct owners among the best k * V rows are the k references of highest best-view cosine
    scores, rows = index.search(queries.descriptors, int(view_top_k.max()) * reference_preset.num_reference_views)
    best: dict[str, dict[str, float]] = {}
    for row_id, top_k, row_scores, row_indices in zip(queries.ids, view_top_k, scores, rows):
        per_reference = best.setdefault(owner_of(row_id, query_preset.name), {})
        kept: set[str] = set()
        for score, row in zip(row_scores.tolist(), row_indices.tolist()):
            if row < 0 or row_owners[row] in kept:
                continue
            reference = row_owners[row]
            kept.add(reference)
            per_reference[reference] = max(score, per_reference.get(reference, -np.inf))
            if len(kept) == top_k:
                break
    query_ids = list(best)
    return query_ids, [sorted(best[q].items(), key=lambda item: (-item[1], item[0])) for q in query_ids]


def lce_normalization_bias(
    auxiliary: DescriptorIndex, queries: DescriptorSet, query_preset: ViewPreset, k_start: int = 0, k_end: int = 9
) -> dict[str, float]:
    """Score normalisation bias per query image: the mean LCE score to its auxiliary neighbours k_start..k_end.

    The supplementary's ``1 / (k_end - k_start + 1) * sum_k cos(z_i, z_kNN(i, k))`` with the LCE score
    (best view pair) in place of the cosine; ranks are 0-based and inclusive.
    """
    if not 0 <= k_start <= k_end:
        raise ConfigError(f"score normalisation needs 0 <= k_start <= k_end, got k_start={k_start}, k_end={k_end}")
    auxiliary_images = len({owner_of(row, view_preset_of(auxiliary).name) for row in auxiliary.references.ids})
    if auxiliary_images <= k_end:
        raise ConfigError(f"score normalisation with k_end={k_end} needs more than {k_end} auxiliary images, "
                          f"got {auxiliary_images}")
    query_ids, ranked = search_views(auxiliary, queries, query_preset, k_end + 1)
    return {q: float(np.mean([s for _, s in row[k_start : k_end + 1]])) for q, row in zip(query_ids, ranked)}


def view_predictions(
    index: DescriptorIndex,
    queries: DescriptorSet,
    query_preset: ViewPreset,
    k: int,
    auxiliary: DescriptorIndex | None = None,
    alpha: float = 1.0,
    k_start: int = 0,
    k_end: int = 9,
) -> list[Prediction]:
    """Top-``k`` references per query by LCE score, score-normalised with ``auxiliary`` when given.

    ``s_ij = lce(i, j) - alpha * bias_i`` (supplementary "Score Normalization"); without
    ``auxiliary`` the score is the LCE cosine itself. With view groups (the ``authors`` preset) the
    references are those of :func:`search_view_groups`, then the best ``k`` of them.
    """
    if query_preset.group_top_k is not None:
        query_ids, ranked = search_view_groups(index, queries, query_preset)
        ranked = [row[:k] for row in ranked]
    else:
        query_ids, ranked = search_views(index, queries, query_preset, k)
    bias = lce_normalization_bias(auxiliary, queries, query_preset, k_start, k_end) if auxiliary is not None else {}
    return [
        Prediction(query_id, reference_id, float(score - alpha * bias.get(query_id, 0.0)))
        for query_id, row in zip(query_ids, ranked)
        for reference_id, score in row
    ]
