"""Descriptor post-processing: score normalisation and feature stretching.

Both use an auxiliary image set that contains no copies of the queries (the paper uses
the DISC21 training set) to estimate, per query, how similar it is to unrelated images, and
correct its scores so that one global threshold fits every query. Queries that resemble
many images (plain textures, text, logos) get their scores lowered.

* Score normalisation (paper supplementary "Score Normalization", after SSCD):

      s_ij = cos(z_i, z_j) - alpha * 1 / (k_end - k_start + 1) * sum_{k=k_start}^{k_end} cos(z_i, z_kNN(i, k))

  with z_kNN(i, k) the auxiliary descriptor of rank k (0-based, 0 = nearest) of query i;
  defaults alpha = 1, k_start = 0, k_end = 9.
* Feature stretching (paper supplementary "Feature Stretching", from BoT, Wang et al. 2021):

      z_q_bar = beta * (1 / k) * sum_{i=1}^{k} s_i * z_q

  with s_1..s_k the inner products of query q with its k nearest auxiliary images;
  defaults beta = 2.5, k = 5. Queries and references are then ranked by euclidean distance
  between z_q_bar and z_r; as a score (higher = more likely a copy) we use the negative
  squared distance, as the DISC21 descriptor-track matching does with an L2 index.

Arrays are float32 numpy; descriptors (N, D) are expected L2-normalised.
"""

from __future__ import annotations

import numpy as np

from ...modeling.errors import ConfigError


def auxiliary_similarities(queries: np.ndarray, auxiliary: np.ndarray, k: int) -> np.ndarray:
    """Inner products of each query with its ``k`` nearest auxiliary descriptors (exact search).

    Args:
        queries: (Nq, D).
        auxiliary: (Na, D), Na >= k.
        k: neighbours.

    Returns:
        (Nq, k), sorted from nearest (column 0) to farthest.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    auxiliary = np.ascontiguousarray(auxiliary, dtype=np.float32)
    if auxiliary.ndim != 2 or auxiliary.shape[1] != queries.shape[1]:
        raise ConfigError(f"auxiliary descriptors {auxiliary.shape} do not match query descriptors {queries.shape}")
    if k < 1 or k > len(auxiliary):
        raise ConfigError(f"need between 1 and {len(auxiliary)} auxiliary neighbours (the auxiliary set size), got {k}")
    import faiss  # on first use: ``import copynce_hf`` needs no faiss

    index = faiss.IndexFlatIP(auxiliary.shape[1])
    index.add(auxiliary)
    similarities, _ = index.search(queries, k)
    return similarities


def score_normalization_bias(
    queries: np.ndarray, auxiliary: np.ndarray, k_start: int = 0, k_end: int = 9
) -> np.ndarray:
    """Per-query bias of score normalisation: the mean similarity to auxiliary neighbours k_start..k_end.

    This is the term ``1 / (k_end - k_start + 1) * sum_{k=k_start}^{k_end} cos(z_i, z_kNN)``
    of the supplementary's score normalisation equation (ranks are 0-based and inclusive).

    Args:
        queries: (Nq, D) query descriptors.
        auxiliary: (Na, D) auxiliary descriptors, Na > k_end.

    Returns:
        (Nq,) float32.
    """
    if not 0 <= k_start <= k_end:
        raise ConfigError(f"score normalisation needs 0 <= k_start <= k_end, got k_start={k_start}, k_end={k_end}")
    similarities = auxiliary_similarities(queries, auxiliary, k_end + 1)
    return similarities[:, k_start : k_end + 1].mean(axis=1).astype(np.float32)


def normalize_scores(scores: np.ndarray, bias: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """Apply score normalisation: ``s_ij = cos(z_i, z_j) - alpha * bias_i``.

    Args:
        scores: (Nq, k) cosine similarities of each query to its candidates.
        bias: (Nq,) from :func:`score_normalization_bias`.
        alpha: weight of the bias (paper: 1).

    Returns:
        (Nq, k) normalised scores; the order of candidates within a query is unchanged.
    """
    return (np.asarray(scores, dtype=np.float32) - alpha * np.asarray(bias, dtype=np.float32)[:, None]).astype(
        np.float32
    )


def stretch_features(queries: np.ndarray, auxiliary: np.ndarray, beta: float = 2.5, k: int = 5) -> np.ndarray:
    """Feature stretching: ``z_q_bar = beta * mean(s_1..s_k) * z_q``.

    Args:
        queries: (Nq, D) query descriptors.
        auxiliary: (Na, D) auxiliary descriptors, Na >= k.
        beta: stretching coefficient (paper and BoT: 2.5).
        k: auxiliary neighbours averaged (paper and BoT: 5).

    Returns:
        (Nq, D) stretched query descriptors; rank them against references with
        :func:`euclidean_scores`.
    """
    factor = beta * auxiliary_similarities(queries, auxiliary, k).mean(axis=1)
    return (np.asarray(queries, dtype=np.float32) * factor[:, None]).astype(np.float32)


def euclidean_scores(
    queries: np.ndarray, inner_products: np.ndarray, reference_sq_norms: np.ndarray
) -> np.ndarray:
    """Negative squared euclidean distances from inner products.

    ``-||z_q - z_r||^2 = 2 <z_q, z_r> - ||z_q||^2 - ||z_r||^2``. With an inner-product index
    searched with the stretched queries and unit-norm references, the best inner products
    are exactly the euclidean nearest neighbours, so this turns that search into the
    euclidean ranking that feature stretching prescribes.

    Args:
        queries: (Nq, D) (stretched) query descriptors.
        inner_products: (Nq, k) ``<z_q, z_r>`` of each query with its candidates.
        reference_sq_norms: (Nq, k) ``||z_r||^2`` of those candidates.

    Returns:
        (Nq, k) float32 scores, higher for closer pairs.
    """
    query_sq_norms = np.square(np.asarray(queries, dtype=np.float64)).sum(axis=1, keepdims=True)
    return (2.0 * inner_products - query_sq_norms - reference_sq_norms).astype(np.float32)
