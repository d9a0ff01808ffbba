"""The one descriptor search: the top-``k`` references of every query, with the paper's post-processing.

Used by ``copynce search``, the descriptor systems of :mod:`copynce_hf.evaluation` (the demo, the
benchmarks, the training run's evaluation) and :func:`~copynce_hf.retrieval.detection`. Three cases:

* local crops views (queries cut into views, or an index of reference views): the best view pair's
  cosine per (query, reference) (:func:`~.view_search.view_predictions`);
* feature stretching (supplementary "Feature Stretching"): the queries are stretched with the
  auxiliary images, then ranked by euclidean distance, scores ``-||q - r||^2``;
* otherwise the cosine (of the whitened descriptors when the index whitens, :mod:`.whitening`), minus
  ``alpha`` times each query's mean similarity to its auxiliary neighbours ``k_start..k_end`` when
  auxiliary images are given (supplementary "Score Normalization").
"""

from __future__ import annotations

import numpy as np

from ...modeling.errors import ConfigError
from ..descriptors.sets import DescriptorSet
from ..descriptors.views import ViewPreset
from ..predictions import Prediction
from .index import DescriptorIndex, knn_predictions
from .postprocess import euclidean_scores, normalize_scores, score_normalization_bias, stretch_features
from .view_search import view_predictions, view_preset_of

__all__ = ["search_references"]


def search_references(index: DescriptorIndex, queries: DescriptorSet, k: int, *,
                      query_views: ViewPreset | None = None, auxiliary: DescriptorSet | DescriptorIndex | None = None,
                      stretch: bool = False, alpha: float = 1.0, k_start: int = 0, k_end: int = 9,
                      beta: float = 2.5, stretch_k: int = 5) -> list[Prediction]:
    """Top-``k`` references of every query of ``queries`` in ``index``, one :class:`Prediction` per pair.

    Args:
        index: the reference index (of whole images, or of views: :func:`view_preset_of`).
        queries: query descriptors (N, D), or query view descriptors cut with ``query_views``.
        k: references kept per query.
        query_views: the views the queries were cut into (``None``: whole images).
        auxiliary: descriptors (or an index) of images without copies of the queries, for score
            normalisation, or for feature stretching with ``stretch``; ``None``: the plain cosine.
        stretch: stretch the query features with ``auxiliary`` (whole images only).
        alpha, k_start, k_end: score normalisation ``s - alpha * mean(cos to auxiliary neighbours
            k_start..k_end)`` (0-based ranks, inclusive).
        beta, stretch_k: feature stretching's exponent and neighbours.

    Raises:
        ConfigError: ``stretch`` without ``auxiliary``, with views, or with an index that whitens.

    With an index that whitens, queries and auxiliary descriptors are given as the model gives them and
    compared whitened, as the references are.
    """
    query_views = query_views or ViewPreset("none")
    if stretch and auxiliary is None:
        raise ConfigError("feature stretching needs the descriptors of auxiliary images")
    if stretch and index.whitening is not None:
        raise ConfigError("feature stretching and whitening are alternatives: the index whitens its descriptors, "
                          "so search it without --stretch")
    if query_views.name != "none" or view_preset_of(index).name != "none":
        if stretch:
            raise ConfigError("feature stretching needs one descriptor per image, not local crops views")
        if isinstance(auxiliary, DescriptorIndex) and _fingerprint(auxiliary) != _fingerprint(index):
            auxiliary = auxiliary.references  # searched through the reference index's whitening below
        if isinstance(auxiliary, DescriptorSet):
            auxiliary = DescriptorIndex.build(auxiliary, whitening=index.whitening)
        return view_predictions(index, queries, query_views, k, auxiliary, alpha, k_start, k_end)
    auxiliary_vectors = None
    if auxiliary is not None:
        auxiliary_vectors = (auxiliary.references if isinstance(auxiliary, DescriptorIndex) else auxiliary).descriptors
    vectors = queries.descriptors
    if stretch:
        vectors = stretch_features(vectors, auxiliary_vectors, beta=beta, k=stretch_k)
    scores, indices = index.search(vectors, k)
    if stretch:
        reference_sq_norms = np.square(index.references.descriptors).sum(axis=1)[np.maximum(indices, 0)]
        scores = euclidean_scores(vectors, scores, reference_sq_norms)
    elif auxiliary_vectors is not None:
        bias = score_normalization_bias(index.transform(vectors), index.transform(auxiliary_vectors),
                                        k_start=k_start, k_end=k_end)
        scores = normalize_scores(scores, bias, alpha=alpha)
    return knn_predictions(queries.ids, scores, indices, index.references.ids)


def _fingerprint(index: DescriptorIndex) -> str | None:
    return index.whitening.fingerprint() if index.whitening is not None else None
