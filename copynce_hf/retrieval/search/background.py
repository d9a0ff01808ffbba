"""Collection-normalised scores: what many images of a collection share is discounted from their pairs' scores.

Two unrelated photos in the same template (a screenshot frame, a meme caption band, a background photo) get a
high descriptor cosine and a high matcher probability, as true copies do. What tells them apart is that a template
image resembles *many* images of the collection, a copy one or a few. Each image's **background** measures it:
its mean score to its neighbours of 0-based ranks ``k_start..k_end`` among the other images (the ranks start
after the first few, so that a small true group of two or three copies does not count itself as background).

* Descriptor scores (``copynce dedup``'s self-search): a pair's score is lowered by the mean of its two
  backgrounds, the symmetric correction of cross-domain similarity local scaling (CSLS: Conneau et al., "Word
  translation without parallel data", ICLR 2018, eq. 6, with ranks k_start..k_end in place of the top K):
  ``s(a, b) = cos(a, b) - alpha * (bg(a) + bg(b)) / 2`` (:func:`pair_background`).
* Reference-side (``copynce detect``): each reference's background among the other references (or among the
  auxiliary images) is subtracted from every query->reference score, ``s(q, r) = cos(q, r) - alpha * bg(r)``
  (:func:`reference_background`); it composes with the query-side score normalisation of :mod:`.postprocess`.
* Matcher scores (:func:`matcher_backgrounds`, :func:`normalised_probability`): the same correction on the logit
  of the matcher's probability, counting only the part of a background above an anchor logit (see there).

The dedup apps pass the neighbours they already searched; nothing here loads a model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..predictions import Prediction
from ..presets import check_ranks
from .index import DescriptorIndex
from .view_search import search_views, view_preset_of

#: Probabilities are clipped to ``[PROBABILITY_EPSILON, 1 - PROBABILITY_EPSILON]`` before their logit is taken
#: (a float32 sigmoid reads 1.0 from logit 17 on): logits stay within +-13.8.
PROBABILITY_EPSILON = 1e-6


def neighbour_background(neighbour_scores: Mapping[str, Sequence[float]], k_start: int,
                         k_end: int) -> dict[str, float]:
    """Each image's background: the mean of its neighbours' scores of 0-based ranks ``k_start..k_end`` (inclusive).

    Args:
        neighbour_scores: image id -> its scores to the *other* images, best first (the image itself left out).
        k_start, k_end: the ranks averaged; an image with fewer neighbours averages the ranks it has from
            ``k_start`` on, and one with ``k_start`` neighbours or fewer gets no background (left out: its
            scores are not corrected).
    """
    check_ranks(k_start, k_end)
    return {image_id: float(np.mean(scores[k_start:k_end + 1]))
            for image_id, scores in neighbour_scores.items() if len(scores) > k_start}


def pair_background(background: Mapping[str, float], a: str, b: str) -> float:
    """The symmetric CSLS correction of the pair ``(a, b)``: the mean of the two backgrounds, an image without
    one (:func:`neighbour_background`) counting 0."""
    return (background.get(a, 0.0) + background.get(b, 0.0)) / 2


def reference_background(index: DescriptorIndex, k_start: int, k_end: int,
                         auxiliary: DescriptorIndex | None = None) -> dict[str, float]:
    """Each indexed image's background for reference-side normalisation (``copynce detect``).

    Args:
        index: the reference index (of whole images or of reference views; whitened when it whitens).
        k_start, k_end: the 0-based ranks averaged (:func:`neighbour_background`).
        auxiliary: ``None``: the neighbours are the *other* references (one self-search of ``index``, each
            reference's views against every reference view, a pair scoring its best view pair); an index of
            auxiliary images (searched with the same views): the neighbours are auxiliary images.

    Returns:
        reference id -> background (references with too few neighbours are left out).
    """
    check_ranks(k_start, k_end)
    preset = view_preset_of(index)
    searched = index if auxiliary is None else auxiliary
    extra = 1 if auxiliary is None else 0  # the reference itself comes first in its own self-search
    query_ids, ranked = search_views(searched, index.references, preset, k_end + 1 + extra)
    neighbours = {query_id: [score for other, score in row if auxiliary is not None or other != query_id]
                  for query_id, row in zip(query_ids, ranked)}
    return neighbour_background(neighbours, k_start, k_end)


def normalised_reference_scores(found: Iterable[Prediction], background: Mapping[str, float], alpha: float,
                                top: int) -> list[Prediction]:
    """``found`` (:class:`~.predictions.Prediction` rows, query -> reference) with ``alpha`` times each reference's
    background subtracted from its score, then the ``top`` best per query (ties by reference id)."""
    per_query: dict[str, list[Prediction]] = {}
    for p in found:
        per_query.setdefault(p.query_id, []).append(
            p._replace(score=float(p.score - alpha * background.get(p.reference_id, 0.0))))
    return [p for rows in per_query.values() for p in sorted(rows, key=lambda p: (-p.score, p.reference_id))[:top]]


def probability_logit(probability: float) -> float:
    """``log(p / (1 - p))`` of ``p`` clipped to ``[PROBABILITY_EPSILON, 1 - PROBABILITY_EPSILON]``."""
    p = min(max(float(probability), PROBABILITY_EPSILON), 1.0 - PROBABILITY_EPSILON)
    return math.log(p / (1.0 - p))


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))


def mean_logit_probability(first: float, second: float) -> float:
    """``sigmoid((logit(first) + logit(second)) / 2)``: one probability from the matcher's two scores of a pair
    (each image the query once), averaged as evidence (logits) rather than as probabilities."""
    return sigmoid((probability_logit(first) + probability_logit(second)) / 2)


def matcher_backgrounds(pairs: Iterable[tuple[str, str, float]], k_start: int, k_end: int) -> dict[str, float]:
    """Each image's matcher background: the mean *logit* of its verified pairs of ranks ``k_start..k_end``
    (0-based, by decreasing probability, over every verified pair the image is in, either side).

    Args:
        pairs: ``(image a, image b, matcher probability)`` of every verified pair.
        k_start, k_end: the ranks averaged; its best ``k_start`` pairs (its likely copies) are left out.
    """
    scores: dict[str, list[float]] = {}
    for a, b, probability in pairs:
        logit = probability_logit(probability)
        scores.setdefault(a, []).append(logit)
        scores.setdefault(b, []).append(logit)
    return neighbour_background({image: sorted(logits, reverse=True) for image, logits in scores.items()},
                                k_start, k_end)


def normalised_probability(probability: float, background_a: float | None, background_b: float | None,
                           alpha: float = 1.0, anchor: float = 0.0) -> float:
    """The matcher's decision score of a pair, normalised over the collection.

    ``sigmoid(logit(p) - alpha * (excess(a) + excess(b)) / 2)`` with ``excess(x) = max(bg(x) - anchor, 0)`` and
    ``bg`` the image's :func:`matcher_backgrounds` (``None``: no background, excess 0).

    Why logits: the matcher calls a template pair and a true copy both near-certain (0.999 and 0.99999); as
    probabilities the two differ by 0.001 and a subtraction leaves nothing between them, as logits (6.9 and 11.5)
    the copy keeps its margin over what the template gives every pair. Why an anchor (default 0, the logit of
    probability 0.5): an image whose other candidates the matcher already calls non-copies has nothing to
    discount, so a collection without templates keeps its raw probabilities and a threshold (0.5, or a
    calibrated one) its meaning; only the part of a background that the matcher itself would call a copy is
    removed. Without the anchor every pair of an ordinary image would be lifted by its (very negative) background.
    """
    excess = sum(max(background - anchor, 0.0) for background in (background_a, background_b) if background is not None)
    if excess == 0.0:
        return float(probability)  # nothing to discount: the raw probability, unclipped
    return sigmoid(probability_logit(probability) - alpha * excess / 2)
