"""Copy-detection metrics of the DISC21 protocol, in plain numpy.

This file is the single implementation of the formulas. It depends on numpy and the
standard library only, so that it ships unchanged inside the ``copy_detection`` evaluate
metric Space (``copy_detection.py`` imports it with a relative import, the way evaluate
modules bundle helper files) and is imported by the package (``copynce_hf.metrics``)
without the slow ``evaluate`` import.

Definitions (paper, supplementary "More about Evaluation Protocols"; DISC21, Douze et al.
2021, whose official evaluation these functions reproduce):

* A prediction is a triple (query id, reference id, score); higher scores mean "more
  likely a copy". A prediction is a *positive* when the pair is in the ground truth.
* All predictions of all queries are pooled and sorted by decreasing score; among equal
  scores the negatives come first (the pessimistic order, so that constant scores cannot
  buy a good AP).
* At every rank n of that list: precision = TP(n) / n and recall = TP(n) / N_gt, where
  N_gt is the total number of ground-truth pairs, retrieved or not (ground-truth pairs with
  no prediction cap the recall).
* micro AP (muAP) = sum over ranks of (recall(n) - recall(n - 1)) * precision(n).
* RP90 = the highest recall among the ranks whose precision is at least 0.9; the
  threshold at P90 is the score at the first rank reaching that recall.
* Rank of a ground-truth pair (q, r): the number of predictions of query q whose score is
  at least the score of (q, r), minus one (ties count against the true match, other true
  matches of q included). Recall at rank k = fraction of ground-truth pairs of rank < k;
  pairs without a prediction are never found.
* mAP (paper, supplementary eq. for mAP): the AP of each query that has a copy, computed on
  that query's own predictions in the same pessimistic order with recall over that query's
  ground-truth pairs, averaged over all queries that have a copy (a query with a copy and
  no prediction has AP 0).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "NOT_FOUND",
    "GROUND_TRUTH_COLUMNS",
    "read_csv_rows",
    "read_ground_truth_csv",
    "normalize_ground_truth",
    "ground_truth_pairs",
    "pessimistic_order",
    "precision_recall",
    "precision_recall_curve",
    "micro_average_precision",
    "recall_at_precision",
    "true_match_ranks",
    "mean_average_precision",
    "copy_detection_metrics",
    "check_id_overlap",
]

#: Rank given to a ground-truth pair that has no prediction (never counted as found).
NOT_FOUND = np.iinfo(np.int64).max

#: Columns of a DISC21 ground-truth CSV file (header row required).
GROUND_TRUTH_COLUMNS = ("query_id", "reference_id")


# --------------------------------------------------------------------------- ground truth


def read_csv_rows(path: str | os.PathLike, what: str = "CSV file") -> list[list[str]]:
    """The rows of a CSV file of UTF-8 text; the byte-order mark that Excel writes ("CSV UTF-8") is dropped.

    Args:
        what: how the file is named in error messages (``"predictions file"``).

    Raises:
        ValueError: the file is not UTF-8 text (UTF-16, Latin-1 with accents, a binary file), naming the
            file and how to fix it.
    """
    path = os.fspath(path)
    with open(path, "rb") as handle:
        start = handle.read(2)
    if start in (b"\xff\xfe", b"\xfe\xff"):
        raise ValueError(f"{what} {path} is UTF-16 text; save it as UTF-8 CSV (Excel: 'CSV UTF-8')")
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return list(csv.reader(handle))
    except UnicodeDecodeError as error:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {error.start} is {error.object[error.start]:#04x}); "
                         "save it as UTF-8 CSV (Excel: 'CSV UTF-8')") from None


def read_ground_truth_csv(path: str | os.PathLike) -> dict[str, list[str]]:
    """Read a DISC21 ground-truth CSV file into ``{query_id: [reference_id, ...]}``.

    The file must start with the header row ``query_id,reference_id`` (columns in any
    order). A row with an empty ``reference_id`` marks a distractor query (no copy): it is
    kept with an empty list. A query copying several references appears on several rows.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not UTF-8 text (a UTF-8 byte-order mark is accepted); the header is
            missing, names unknown columns or lacks a required one; a row has the wrong number of
            fields or an empty ``query_id``; a pair is repeated.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ground-truth file {path!r} does not exist")
    reader = iter(read_csv_rows(path, "ground-truth file"))
    header = next(reader, None)
    if header is None:
        raise ValueError(
            f"ground-truth file {path} is empty; expected the header 'query_id,reference_id'"
        )
    header = [name.strip() for name in header]
    unknown = [name for name in header if name not in GROUND_TRUTH_COLUMNS]
    if unknown:
        raise ValueError(
            f"ground-truth file {path}: unknown column(s) {', '.join(repr(n) for n in unknown)}; "
            f"the first row must be the header 'query_id,reference_id'"
        )
    missing = [name for name in GROUND_TRUTH_COLUMNS if name not in header]
    if missing or len(set(header)) != len(header):
        raise ValueError(
            f"ground-truth file {path}: header {header} must hold the columns query_id and reference_id once each"
        )
    q_col, r_col = header.index("query_id"), header.index("reference_id")
    mapping: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for line_number, row in enumerate(reader, start=2):
        if not row or all(not field.strip() for field in row):
            continue  # blank line
        if len(row) != len(header):
            raise ValueError(
                f"ground-truth file {path}, line {line_number}: expected {len(header)} fields, got {len(row)}"
            )
        query, reference = row[q_col].strip(), row[r_col].strip()
        if not query:
            raise ValueError(f"ground-truth file {path}, line {line_number}: empty query_id")
        references = mapping.setdefault(query, [])
        if reference:
            if (query, reference) in seen:
                raise ValueError(
                    f"ground-truth file {path}, line {line_number}: pair ({query!r}, {reference!r}) is repeated"
                )
            seen.add((query, reference))
            references.append(reference)
    return mapping


def normalize_ground_truth(ground_truth) -> dict[str, list[str]]:
    """Turn any accepted ground-truth form into ``{query_id: [reference_id, ...]}``.

    Args:
        ground_truth: a mapping from query id to the reference ids it copies (a list or other
            iterable of ids, a single id string, or ``None`` / ``""`` / ``[]`` for a distractor),
            or the path (``str`` or ``os.PathLike``) of a DISC21 ground-truth CSV file. Ids
            are compared as strings.

    Returns:
        A new dict; distractor queries map to an empty list.

    Raises:
        TypeError: ``ground_truth`` is neither a mapping nor a path.
        ValueError: a (query, reference) pair is listed twice.
    """
    if isinstance(ground_truth, (str, os.PathLike)):
        return read_ground_truth_csv(ground_truth)
    if not isinstance(ground_truth, Mapping):
        raise TypeError(
            "ground_truth must be a mapping {query_id: [reference_id, ...]} or the path of a "
            f"ground-truth CSV file, got {type(ground_truth).__name__}"
        )
    mapping: dict[str, list[str]] = {}
    for query, references in ground_truth.items():
        query = str(query)
        if references is None:
            references = []
        elif isinstance(references, (str, bytes)) or not isinstance(references, Iterable):
            references = [references]
        cleaned = [str(r) for r in references if r is not None and str(r) != ""]
        if len(set(cleaned)) != len(cleaned):
            repeated = next(r for r in cleaned if cleaned.count(r) > 1)
            raise ValueError(f"ground truth lists the pair ({query!r}, {repeated!r}) more than once")
        mapping.setdefault(query, []).extend(cleaned)
    return mapping


def ground_truth_pairs(ground_truth) -> list[tuple[str, str]]:
    """All (query id, reference id) copy pairs of ``ground_truth``, sorted.

    ``ground_truth`` takes any form accepted by :func:`normalize_ground_truth`.
    """
    mapping = normalize_ground_truth(ground_truth)
    return sorted((q, r) for q, refs in mapping.items() for r in refs)


# --------------------------------------------------------------------------- predictions


@dataclass
class _Labelled:
    """Predictions joined with the ground truth (internal).

    Shapes: ``query_codes``, ``scores`` and ``is_copy`` are (P,) for P predictions.
    """

    query_ids: list[str]
    reference_ids: list[str]
    query_codes: np.ndarray  # (P,) int64, index into ``query_names``
    query_names: list[str]
    scores: np.ndarray  # (P,) float
    is_copy: np.ndarray  # (P,) bool
    gt_pairs: list[tuple[str, str]]  # sorted ground-truth pairs, length N_gt
    gt_mapping: dict[str, list[str]]


def _label(query_ids, reference_ids, scores, ground_truth) -> _Labelled:
    """Validate predictions and mark which are ground-truth copies."""
    query_ids = [str(q) for q in query_ids]
    reference_ids = [str(r) for r in reference_ids]
    scores = np.asarray(scores)
    if scores.ndim != 1:
        scores = scores.reshape(-1)
    if scores.dtype.kind not in "fiu" and scores.size:
        raise ValueError(f"scores must be numbers, got an array of dtype {scores.dtype}")
    if scores.dtype.kind != "f":
        scores = scores.astype(np.float64)
    if not (len(query_ids) == len(reference_ids) == len(scores)):
        raise ValueError(
            f"query_id, reference_id and score must have one entry per prediction; got "
            f"{len(query_ids)}, {len(reference_ids)} and {len(scores)}"
        )
    if not len(scores):
        raise ValueError("there are no predictions to score (query_id, reference_id and score are empty)")
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        i = int(bad[0])
        kind = "NaN" if np.isnan(scores[i]) else "infinite"
        raise ValueError(
            f"{bad.size} prediction(s) have a non-finite score; the first is ({query_ids[i]!r}, "
            f"{reference_ids[i]!r}) with a {kind} score"
        )
    pairs = list(zip(query_ids, reference_ids))
    unique = set(pairs)
    if len(unique) != len(pairs):
        seen: set[tuple[str, str]] = set()
        for pair in pairs:
            if pair in seen:
                raise ValueError(
                    f"duplicate prediction for the pair (query {pair[0]!r}, reference {pair[1]!r}); "
                    "each (query, reference) pair may be predicted once"
                )
            seen.add(pair)
    gt_mapping = normalize_ground_truth(ground_truth)
    gt_pairs = sorted((q, r) for q, refs in gt_mapping.items() for r in refs)
    if not gt_pairs:
        raise ValueError("the ground truth holds no copy pair, so precision-recall metrics are undefined")
    check_id_overlap(query_ids, reference_ids, gt_mapping)
    gt_set = set(gt_pairs)
    is_copy = np.fromiter((pair in gt_set for pair in pairs), dtype=bool, count=len(pairs))
    query_names, query_codes = np.unique(np.asarray(query_ids, dtype=str), return_inverse=True)
    return _Labelled(
        query_ids=query_ids,
        reference_ids=reference_ids,
        query_codes=query_codes.astype(np.int64).reshape(-1),
        query_names=[str(q) for q in query_names],
        scores=scores,
        is_copy=is_copy,
        gt_pairs=gt_pairs,
        gt_mapping=gt_mapping,
    )


def _id_fixes(predicted: Sequence[str], expected: set[str]) -> list[str]:
    """Plain-words fixes that would make predicted ids match the ground truth's, found by trying them."""
    sample = list(dict.fromkeys(predicted))[:2000]
    fixes = []
    trials = (
        ("strip the file extensions from the predicted ids (q00.jpg -> q00)", lambda i: os.path.splitext(i)[0]),
        ("the ground truth's ids carry a file extension the predictions lack; strip it there", None),
        ("ids differ in letter case; write them in the same case", lambda i: i.lower()),
        ("the predicted ids carry folder prefixes; keep the file name only", lambda i: i.replace("\\", "/").rsplit("/", 1)[-1]),
    )
    lower = {e.lower() for e in expected}
    bare = {os.path.splitext(e)[0] for e in expected}
    for text, fix in trials:
        if fix is None:
            hit = any(i in bare for i in sample)
        elif "case" in text:
            hit = any(fix(i) in lower for i in sample)
        else:
            hit = any(fix(i) in expected for i in sample)
        if hit:
            fixes.append(text)
    if not fixes:
        # a common prefix or suffix on one side only (Q00001 vs 00001, img_1 vs 1)
        if any(any(i.endswith(e) or e.endswith(i) for e in list(expected)[:200]) for i in sample[:200]):
            fixes.append("ids differ by a prefix; remove it on one side")
    return fixes


def check_id_overlap(query_ids: Sequence[str], reference_ids: Sequence[str], gt_mapping: dict[str, list[str]]) -> None:
    """Refuse predictions whose ids cannot be those of the ground truth; warn on a partial overlap.

    The ids are compared as exact strings, so ``q00.jpg`` never matches ``q00``: without this
    check such predictions would score muAP 0 without a word. Raises :class:`ValueError` (with an
    example id of each side and the likely fix) when no predicted query id is in the ground truth,
    or when fewer than half are and either a simple fix (extension, case, folder prefix) would make
    them match or the ground truth lists every query (it has distractor queries, mapped to no
    reference, so an unlisted query is unknown). A smaller mismatch is a :class:`UserWarning` with
    the counts. When no predicted reference id is in the ground truth, the same fixes are tried: one
    that works is an error, else a :class:`UserWarning` (ids in a pattern no fix explains: the
    predictions may truly all be wrong, so this is not refused, but muAP 0 is no longer silent).
    """
    import warnings

    predicted = set(query_ids)
    expected = set(gt_mapping)
    known = predicted & expected
    complete = any(not references for references in gt_mapping.values())

    def example(ids) -> str:
        return repr(sorted(ids)[0]) if ids else "(none)"

    if len(known) < len(predicted):
        fixes = _id_fixes(sorted(predicted - expected), expected)
        share = len(known) / max(len(predicted), 1)
        if not known or (share < 0.5 and (fixes or complete)):
            raise ValueError(
                f"{len(predicted) - len(known)} of the {len(predicted)} predicted query ids are not in the ground "
                f"truth (which lists {len(expected)} queries): e.g. predicted {example(predicted - expected)}, "
                f"ground truth {example(expected)}. "
                + (f"Likely fix: {'; '.join(fixes)}." if fixes else
                   "Check that both files use the same ids (file names without extension, same case, no prefix).")
            )
        warnings.warn(
            f"{len(predicted) - len(known)} of the {len(predicted)} predicted query ids are not in the ground truth "
            f"(e.g. {example(predicted - expected)}); their predictions count as false positives",
            UserWarning, stacklevel=3,
        )
    gt_references = {r for references in gt_mapping.values() for r in references}
    predicted_references = set(reference_ids)
    if predicted_references and not predicted_references & gt_references:
        fixes = _id_fixes(sorted(predicted_references), gt_references)
        if fixes:
            raise ValueError(
                f"none of the {len(predicted_references)} predicted reference ids is in the ground truth: e.g. "
                f"predicted {example(predicted_references)}, ground truth {example(gt_references)}. "
                f"Likely fix: {'; '.join(fixes)}."
            )
        warnings.warn(
            f"none of the {len(predicted_references)} predicted reference ids is in the ground truth (e.g. "
            f"predicted {example(predicted_references)}, ground truth {example(gt_references)}): every "
            "prediction counts as a false positive, so muAP is 0; check that both use the same reference ids",
            UserWarning, stacklevel=3,
        )


def pessimistic_order(scores: np.ndarray, is_copy: np.ndarray) -> np.ndarray:
    """Indices sorting predictions by decreasing score, negatives first among equal scores.

    Args:
        scores: (P,) float scores.
        is_copy: (P,) bool, True for ground-truth copies.

    Returns:
        (P,) int64 permutation.
    """
    # np.lexsort sorts by the last key first: score descending, then is_copy ascending
    # (False, the negatives, first): the DISC21 worst-case order for ties.
    return np.lexsort((np.asarray(is_copy, dtype=np.int8), -np.asarray(scores))).astype(np.int64)


def precision_recall(
    is_copy: np.ndarray, scores: np.ndarray, num_positives: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision and recall at every rank of the pooled, pessimistically sorted predictions.

    Args:
        is_copy: (P,) bool labels of the predictions.
        scores: (P,) float scores.
        num_positives: N_gt, the number of ground-truth pairs (the recall denominator).

    Returns:
        ``(precision, recall, thresholds)``, each of shape (P,), in rank order (recall
        non-decreasing); ``thresholds[n]`` is the score of the prediction at rank n.
    """
    if num_positives <= 0:
        raise ValueError(f"num_positives must be positive, got {num_positives}")
    is_copy = np.asarray(is_copy, dtype=bool)
    scores = np.asarray(scores)
    order = pessimistic_order(scores, is_copy)
    true_positives = np.cumsum(is_copy[order], dtype=np.int64)  # TP(n)
    ranks = np.arange(1, len(order) + 1)  # n
    precision = true_positives / ranks
    recall = true_positives / num_positives
    return precision, recall, scores[order]


def precision_recall_curve(
    query_ids: Sequence[str], reference_ids: Sequence[str], scores, ground_truth
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision-recall curve of a set of predictions, ready for plotting.

    Args:
        query_ids, reference_ids: (P,) ids of the predicted pairs.
        scores: (P,) scores, higher means more likely a copy.
        ground_truth: mapping or CSV path, see :func:`normalize_ground_truth`.

    Returns:
        ``(precision, recall, thresholds)``, each (P,), one point per rank (see
        :func:`precision_recall`).
    """
    data = _label(query_ids, reference_ids, scores, ground_truth)
    return precision_recall(data.is_copy, data.scores, len(data.gt_pairs))


def micro_average_precision(precision: np.ndarray, recall: np.ndarray) -> float:
    """muAP = sum over ranks n of (recall(n) - recall(n - 1)) * precision(n), recall(0) = 0.

    Args:
        precision, recall: (P,) arrays in rank order, as returned by :func:`precision_recall`.
    """
    precision = np.asarray(precision, dtype=np.float64)
    recall = np.asarray(recall, dtype=np.float64)
    if precision.size == 0:
        return 0.0
    if np.any(recall[1:] < recall[:-1]):
        raise ValueError("recall must be given in rank order (non-decreasing)")
    increments = recall - np.concatenate(([0.0], recall[:-1]))
    return float((increments * precision).sum())


def recall_at_precision(
    precision: np.ndarray, recall: np.ndarray, thresholds: np.ndarray, min_precision: float = 0.9
) -> tuple[float, float | None]:
    """Highest recall among ranks whose precision is at least ``min_precision`` (RP90).

    Args:
        precision, recall, thresholds: (P,) arrays in rank order (:func:`precision_recall`).
        min_precision: the required precision, 0.9 for RP90.

    Returns:
        ``(recall, threshold)``: the threshold is the score at the first rank reaching that
        recall. When no rank reaches ``min_precision`` the result is ``(0.0, None)`` (the
        official script reports None for both; 0.0 keeps the result numeric).
    """
    valid = np.flatnonzero(np.asarray(precision) >= min_precision)
    if valid.size == 0:
        return 0.0, None
    best = valid[np.argmax(np.asarray(recall)[valid])]  # argmax: the first rank with that recall
    return float(recall[best]), float(thresholds[best])


def _group_sorted(data: _Labelled) -> tuple[np.ndarray, np.ndarray]:
    """Order by (query, decreasing score, negatives first) and each row's query-group start.

    Returns:
        ``order`` (P,) permutation and ``start`` (P,) position (in sorted order) of the
        first prediction of the row's query.
    """
    order = np.lexsort((data.is_copy.astype(np.int8), -data.scores, data.query_codes))
    codes = data.query_codes[order]
    n = len(order)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = codes[1:] != codes[:-1]
    group_first = np.flatnonzero(new_group)
    start = group_first[np.cumsum(new_group) - 1]
    return order, start


def _ranks_of_predictions(data: _Labelled) -> np.ndarray:
    """Pessimistic per-query rank of every prediction.

    Rank = (number of predictions of the same query with a score >= this one) - 1.

    Returns:
        (P,) int64 ranks, aligned with the input predictions.
    """
    order, start = _group_sorted(data)
    n = len(order)
    codes = data.query_codes[order]
    sorted_scores = data.scores[order]
    # Runs of equal (query, score); a row's ">=" count ends at the last row of its run.
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (codes[1:] != codes[:-1]) | (sorted_scores[1:] != sorted_scores[:-1])
    run_id = np.cumsum(new_run) - 1
    run_last = np.append(np.flatnonzero(new_run)[1:], n) - 1
    ranks_sorted = run_last[run_id] - start
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = ranks_sorted
    return ranks


def _true_match_ranks(data: _Labelled) -> np.ndarray:
    ranks = _ranks_of_predictions(data)
    found = {(data.query_ids[i], data.reference_ids[i]): int(ranks[i]) for i in np.flatnonzero(data.is_copy)}
    return np.array([found.get(pair, NOT_FOUND) for pair in data.gt_pairs], dtype=np.int64)


def true_match_ranks(query_ids, reference_ids, scores, ground_truth) -> np.ndarray:
    """Official pessimistic rank of every ground-truth pair within its query's predictions.

    Rank of (q, r) = (number of predictions of query q with a score >= the score of (q, r)) - 1,
    so 0 means "first with no tie"; pairs without a prediction get :data:`NOT_FOUND`.

    Returns:
        (N_gt,) int64, aligned with :func:`ground_truth_pairs` (sorted pairs).
    """
    return _true_match_ranks(_label(query_ids, reference_ids, scores, ground_truth))


def _mean_average_precision(data: _Labelled) -> float:
    queries_with_copy = [q for q, refs in data.gt_mapping.items() if refs]
    if len(data.is_copy) == 0:
        return 0.0
    order, start = _group_sorted(data)
    positives = data.is_copy[order]
    codes = data.query_codes[order]
    cumulative = np.cumsum(positives, dtype=np.int64)
    before_group = cumulative[start] - positives[start]
    true_positives = cumulative - before_group  # TP within the query, at each rank
    rank_in_query = np.arange(len(order)) - start + 1
    precision = true_positives / rank_in_query
    # AP_q = sum over the query's positives of precision / N_gt(q)  (recall increment 1 / N_gt(q)).
    name_to_count = {q: len(refs) for q, refs in data.gt_mapping.items()}
    gt_counts = np.array([name_to_count.get(q, 0) for q in data.query_names], dtype=np.float64)
    precision_sum = np.bincount(codes, weights=np.where(positives, precision, 0.0), minlength=len(gt_counts))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_query = np.where(gt_counts > 0, precision_sum / np.maximum(gt_counts, 1), 0.0)
    # Queries with a copy but no prediction have AP 0: they add to the count, not the sum.
    return float(per_query.sum() / len(queries_with_copy))


def mean_average_precision(query_ids, reference_ids, scores, ground_truth) -> float:
    """The paper's mAP: per-query AP averaged over the queries that have a copy.

    Each query's predictions are sorted by decreasing score with negatives first among
    ties; its AP is the sum over its ranks of (recall increment x precision) with recall over
    that query's ground-truth pairs. Queries with a copy but no prediction count as AP 0;
    distractor queries are ignored.
    """
    return _mean_average_precision(_label(query_ids, reference_ids, scores, ground_truth))


def copy_detection_metrics(query_ids, reference_ids, scores, ground_truth) -> dict:
    """All copy-detection numbers for one set of predictions.

    Args:
        query_ids, reference_ids: (P,) ids of the predicted pairs (compared as strings).
        scores: (P,) float scores; higher means more likely a copy. NaN and infinities are refused.
        ground_truth: mapping ``{query_id: [reference_id, ...]}`` or a DISC21 CSV path.

    Returns:
        dict with ``micro_ap``, ``recall_at_p90``, ``threshold_at_p90`` (None when precision
        never reaches 0.9, ``recall_at_p90`` is then 0.0), ``recall_at_rank1``, ``recall_at_rank10``,
        ``mean_ap``, ``num_predictions``, ``num_ground_truth_pairs``, ``num_queries_with_copy``.

    Raises:
        ValueError: no predictions, duplicate (query, reference) predictions, non-finite scores,
            inputs of unequal lengths, a ground truth without any copy pair, a malformed
            ground-truth file, or predicted ids that do not match the ground truth's (see
            :func:`check_id_overlap`, which warns on a partial mismatch).
    """
    data = _label(query_ids, reference_ids, scores, ground_truth)
    num_gt = len(data.gt_pairs)
    precision, recall, thresholds = precision_recall(data.is_copy, data.scores, num_gt)
    recall_p, threshold_p = recall_at_precision(precision, recall, thresholds, 0.9)
    ranks = _true_match_ranks(data)
    return {
        "micro_ap": micro_average_precision(precision, recall),
        "recall_at_p90": recall_p,
        "threshold_at_p90": threshold_p,
        "recall_at_rank1": float(np.count_nonzero(ranks < 1) / num_gt),
        "recall_at_rank10": float(np.count_nonzero(ranks < 10) / num_gt),
        "mean_ap": _mean_average_precision(data),
        "num_predictions": int(len(data.scores)),
        "num_ground_truth_pairs": int(num_gt),
        "num_queries_with_copy": int(sum(1 for refs in data.gt_mapping.values() if refs)),
    }
