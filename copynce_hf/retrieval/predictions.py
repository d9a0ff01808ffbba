"""Predictions in the DISC21 matching-track CSV format: ``query_id,reference_id,score``.

A prediction is one scored (query, reference) pair; higher scores mean "more likely a
copy". The file has a header line ``query_id,reference_id,score`` and one row per pair.
Every (query, reference) pair may appear at most once: the metric pools all predictions
together, so a duplicate would be counted twice; reading or writing one is an error
that names the pair.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from ..metrics.copy_detection.formulas import copy_detection_metrics, read_csv_rows, read_ground_truth_csv
from ..modeling.errors import PredictionsError
from ..outputs import StagedFile

logger = logging.getLogger(__name__)

#: Column names of the DISC21 matching-track CSV, in order.
PREDICTION_COLUMNS = ("query_id", "reference_id", "score")


class Prediction(NamedTuple):
    """One scored candidate pair."""

    query_id: str
    reference_id: str
    score: float


def prediction_metrics(predictions: Sequence[Prediction], ground_truth) -> dict:
    """:func:`~copynce_hf.metrics.copy_detection.formulas.copy_detection_metrics` of P predictions, pooled as on
    DISC21 (``ground_truth``: query id -> reference ids, or a DISC21 CSV path)."""
    return copy_detection_metrics([p.query_id for p in predictions], [p.reference_id for p in predictions],
                                  [float(p.score) for p in predictions], ground_truth)


def read_ground_truth(path: str | os.PathLike) -> dict[str, list[str]]:
    """A DISC21 ground-truth CSV (``query_id,reference_id``) as query id -> reference ids; a missing or malformed file
    is a :class:`PredictionsError` naming it."""
    try:
        return read_ground_truth_csv(path)
    except (OSError, ValueError) as error:  # the metric module is standalone and raises built-in types
        raise PredictionsError(str(error)) from error


@contextlib.contextmanager
def metric_warnings_logged(source: str | os.PathLike):
    """Around a metric call: its warnings become one logged line each, its ``ValueError`` a
    :class:`PredictionsError`; both name ``source`` (the file whose predictions or ground truth raised them)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    except ValueError as error:  # the metric module is standalone and raises built-in types
        raise PredictionsError(f"{source}: {error}") from error
    for message in dict.fromkeys(str(w.message) for w in caught):
        logger.warning("%s: %s", source, message)


def check_unique(predictions: Iterable[Prediction], source: str = "predictions") -> None:
    """Raise :class:`PredictionsError` naming the first (query, reference) pair seen twice."""
    seen: set[tuple[str, str]] = set()
    for prediction in predictions:
        key = (prediction.query_id, prediction.reference_id)
        if key in seen:
            raise PredictionsError(
                f"{source} has a duplicate prediction for query {key[0]!r} and reference {key[1]!r}; "
                "each pair may be scored once"
            )
        seen.add(key)


def write_predictions(path: str | os.PathLike, predictions: Iterable[Prediction],
                      decision_threshold: float | None = None) -> int:
    """Write predictions as ``query_id,reference_id,score`` CSV, sorted by decreasing score.

    With ``decision_threshold`` a fourth column, ``copy``, holds 1 for scores at or above it, else 0
    (:func:`read_predictions` reads such files too: it keeps the three columns it knows).

    Returns the number of rows written. Duplicate pairs and non-finite scores raise
    :class:`PredictionsError` before anything is written. The file is written to a temporary
    file beside ``path`` and renamed, so an existing file is replaced only by a complete one.
    """
    rows = [Prediction(str(q), str(r), float(s)) for q, r, s in predictions]
    check_unique(rows, source=f"predictions for {os.fspath(path)!r}")
    for row in rows:
        if not math.isfinite(row.score):
            raise PredictionsError(f"score {row.score} of pair ({row.query_id!r}, {row.reference_id!r}) is not finite")
    rows.sort(key=lambda row: (-row.score, row.query_id, row.reference_id))
    with StagedFile(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(PREDICTION_COLUMNS + (() if decision_threshold is None else ("copy",)))
        for row in rows:
            decision = () if decision_threshold is None else (int(row.score >= decision_threshold),)
            writer.writerow((row.query_id, row.reference_id, repr(row.score), *decision))
    return len(rows)


def read_predictions(path: str | os.PathLike) -> list[Prediction]:
    """Read a DISC21 matching-track CSV (header ``query_id,reference_id,score``, UTF-8; the byte-order
    mark of Excel's "CSV UTF-8" is accepted).

    Raises :class:`PredictionsError` for a missing file, a file that is not UTF-8 text, missing
    columns, a row with more or fewer fields than the header (``Q1,R1,0,90``: a decimal comma, which
    would otherwise turn the score into 0), a score that is not a finite number, or a (query,
    reference) pair that appears twice.
    """
    path = Path(path)
    name = f"predictions file {os.fspath(path)!r}"
    if not path.is_file():
        raise PredictionsError(f"{name} does not exist")
    try:
        rows = read_csv_rows(path, "predictions file")
    except ValueError as error:
        raise PredictionsError(str(error)) from None
    columns = [column.strip() for column in (rows[0] if rows else [])]
    missing = [column for column in PREDICTION_COLUMNS if column not in columns]
    if missing:
        raise PredictionsError(
            f"{name} has columns {columns}, expected {list(PREDICTION_COLUMNS)} (missing {missing})"
        )
    position = {column: columns.index(column) for column in PREDICTION_COLUMNS}
    predictions = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(field.strip() for field in row):
            continue  # a blank line
        if len(row) != len(columns):
            comma = " (a decimal comma in the score? write 0.90, not 0,90)" if len(row) > len(columns) else ""
            raise PredictionsError(
                f"{name} line {line}: {len(row)} fields, but the header has {len(columns)}{comma}"
            )
        text = row[position["score"]]
        try:
            score = float(text)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise PredictionsError(f"{name} line {line}: score {text!r} is not a finite number")
        predictions.append(Prediction(row[position["query_id"]].strip(), row[position["reference_id"]].strip(), score))
    check_unique(predictions, source=name)
    return predictions
