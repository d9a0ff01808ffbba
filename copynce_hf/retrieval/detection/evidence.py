"""The descriptors' evidence beside the matcher's (beyond the paper): ``DetectConfig.descriptor_weight``.

The matcher decides a copy from the two images' tokens, the descriptors from their global appearance; where the
descriptor is strong the two see different copies (a strong descriptor ranks copies the matcher doubts, the matcher
vetoes look-alikes the descriptor ranks high). A final pair's score becomes

    score(q, r) = logit(p(q, r)) + w * (cos(q, r) - bg(r))

with ``p`` the matcher's probability (its best view, as the pipeline keeps it), ``cos`` the cosine of the two whole
images' descriptors, ``bg(r)`` the reference's background (its mean cosine to its neighbours among the other
references, as collection normalisation measures it: high for a reference in a frame others share, whose cosine to a
query in that frame says nothing of their content), both averaged over the run's descriptors, and ``w`` the weight:
a score in logits, not a probability.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..descriptors.sets import DescriptorSet
from ..predictions import Prediction

#: Probabilities are clipped to ``[PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR]`` before their logit: float32's sigmoid
#: reaches 1.0 from a logit of about 17, so the matcher's surest pairs keep a finite logit (about 16.1).
PROBABILITY_FLOOR = 1e-7


def matcher_logits(probabilities: np.ndarray) -> np.ndarray:
    """(P,) copy probabilities -> (P,) float64 logits, the probabilities clipped (:data:`PROBABILITY_FLOOR`)."""
    clipped = np.clip(np.asarray(probabilities, dtype=np.float64), PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    return np.log(clipped) - np.log1p(-clipped)


def pair_evidence(pairs: Sequence[Prediction], wholes: Sequence[tuple[DescriptorSet, DescriptorSet]],
                 backgrounds: Sequence[Mapping[str, float] | None] | None = None) -> np.ndarray:
    """(P,) cosine of each pair's query and reference descriptors (whole images) less the reference's background in
    ``backgrounds`` (one mapping per descriptor, a reference missing from it or ``None``: 0), averaged over the
    descriptors ``wholes`` (each ``(queries, references)``) that hold both images; 0 for a pair none holds."""
    total, counted = np.zeros(len(pairs)), np.zeros(len(pairs))
    backgrounds = list(backgrounds) if backgrounds is not None else [None] * len(wholes)
    for (queries, references), background in zip(wholes, backgrounds, strict=True):
        query_rows = {image_id: row for row, image_id in enumerate(queries.ids)}
        reference_rows = {image_id: row for row, image_id in enumerate(references.ids)}
        held = np.array([p.query_id in query_rows and p.reference_id in reference_rows for p in pairs], dtype=bool)
        if not held.any():
            continue
        kept = [p for p, h in zip(pairs, held) if h]
        left = _unit(queries.descriptors[[query_rows[p.query_id] for p in kept]])
        right = _unit(references.descriptors[[reference_rows[p.reference_id] for p in kept]])
        less = np.array([(background or {}).get(p.reference_id, 0.0) for p in kept])
        total[held] += np.einsum("pd,pd->p", left, right, dtype=np.float64) - less
        counted[held] += 1
    return np.divide(total, counted, out=np.zeros_like(total), where=counted > 0)


def with_descriptor_evidence(pairs: Sequence[Prediction], wholes: Sequence[tuple[DescriptorSet, DescriptorSet]],
                             weight: float, backgrounds: Sequence[Mapping[str, float] | None] | None = None
                             ) -> list[Prediction]:
    """``pairs`` scored by the matcher (probabilities) rescored ``logit(p) + weight * (cos - bg)`` (module
    docstring; :func:`pair_evidence`)."""
    if not pairs:
        return []
    evidence = pair_evidence(pairs, wholes, backgrounds)
    scores = matcher_logits(np.array([p.score for p in pairs])) + float(weight) * evidence
    return [Prediction(p.query_id, p.reference_id, float(score)) for p, score in zip(pairs, scores)]


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)
