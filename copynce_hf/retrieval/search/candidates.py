"""Candidate lists: merging several descriptors' lists per query, keeping the best, measuring their recall.

Supplementary "More about Candidates List for Matcher": the candidate lists of two descriptors are
joined, duplicated candidates removed, and the top 400 per query form the fused list the matcher
re-scores; the recall of the list (the share of true pairs it holds) bounds what the matcher can
reach.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...modeling.errors import ConfigError
from ..predictions import Prediction


def top_per_query(predictions: Iterable[Prediction], k: int) -> list[Prediction]:
    """The ``k`` best-scored predictions of every query (ties broken by reference id), best first."""
    if k < 1:
        raise ConfigError(f"need at least 1 prediction per query, got {k}")
    grouped: dict[str, list[Prediction]] = {}
    for prediction in predictions:
        grouped.setdefault(prediction.query_id, []).append(prediction)
    return [p for rows in grouped.values() for p in sorted(rows, key=lambda p: (-p.score, p.reference_id))[:k]]


def merge_candidates(lists: Iterable[Iterable[Prediction]], top: int) -> list[Prediction]:
    """Union of candidate lists; a pair found by several lists keeps its best score; then the ``top`` per query.

    Scores of different descriptors are compared as they are: score-normalise them first
    (supplementary "Score Normalization") so that they share one scale.
    """
    best: dict[tuple[str, str], float] = {}
    for predictions in lists:
        for prediction in predictions:
            key = (prediction.query_id, prediction.reference_id)
            if key not in best or prediction.score > best[key]:
                best[key] = prediction.score
    return top_per_query((Prediction(q, r, s) for (q, r), s in best.items()), top)


def candidate_recall(predictions: Iterable[Prediction], ground_truth: dict[str, list[str]]) -> float | None:
    """Share of the ground-truth (query, reference) pairs present among ``predictions``; ``None`` if there is none."""
    truth = {(q, r) for q, references in ground_truth.items() for r in references}
    if not truth:
        return None
    found = {(p.query_id, p.reference_id) for p in predictions} & truth
    return len(found) / len(truth)
