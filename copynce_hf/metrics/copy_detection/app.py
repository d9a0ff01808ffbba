"""Hugging Face Space of the ``copy_detection`` metric: upload predictions and a ground truth, get the scores.

The stock evaluate widget (``evaluate.utils.launch_gradio_widget``) only fills the metric's features
(query_id, reference_id, score) and cannot pass the ``ground_truth`` keyword, so this app takes two
uploaded CSV files instead:

* predictions, header ``query_id,reference_id,score`` (one scored candidate pair per row);
* ground truth, header ``query_id,reference_id`` (an empty ``reference_id`` marks a distractor query),
  as the DISC21 ground-truth files.

:func:`compute_from_files` does the work (and is what the tests call); ``python app.py`` (what a Space
runs) builds the Gradio interface around it. The folder's ``requirements.txt`` lists what the Space
installs besides Gradio.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import evaluate

HERE = Path(__file__).resolve().parent
PREDICTION_COLUMNS = ("query_id", "reference_id", "score")


def read_predictions_csv(path: str | os.PathLike) -> dict[str, list]:
    """``{"query_id": [...], "reference_id": [...], "score": [...]}`` from a predictions CSV file.

    Raises:
        ValueError: a file that is not UTF-8 text, missing header columns, a row with the wrong number of
            fields, or a score that is not a finite number (the message names the file and the line).
    """
    columns: dict[str, list] = {name: [] for name in PREDICTION_COLUMNS}
    # utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark
    with open(path, newline="", encoding="utf-8-sig") as handle:
        try:
            rows = list(csv.reader(handle))
        except UnicodeDecodeError:
            raise ValueError(f"predictions file {path} is not UTF-8 text (UTF-16?); save it as UTF-8 CSV") from None
    reader = iter(rows)
    header = [name.strip() for name in next(reader, [])]
    missing = [name for name in PREDICTION_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"predictions file {path}: the header must hold the columns query_id, reference_id "
                         f"and score; missing {', '.join(missing)}")
    index = {name: header.index(name) for name in PREDICTION_COLUMNS}
    for line_number, row in enumerate(reader, start=2):
        if not row or all(not field.strip() for field in row):
            continue
        if len(row) != len(header):
            raise ValueError(f"predictions file {path}, line {line_number}: expected {len(header)} fields, "
                             f"got {len(row)}")
        try:
            score = float(row[index["score"]])
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise ValueError(f"predictions file {path}, line {line_number}: score {row[index['score']]!r} is "
                             "not a finite number")
        columns["query_id"].append(row[index["query_id"]].strip())
        columns["reference_id"].append(row[index["reference_id"]].strip())
        columns["score"].append(score)
    return columns


def compute_from_files(predictions_path: str | os.PathLike, ground_truth_path: str | os.PathLike) -> dict:
    """Score a predictions CSV against a ground-truth CSV with the ``copy_detection`` metric of this folder."""
    metric = evaluate.load(str(HERE / "copy_detection.py"))
    return metric.compute(**read_predictions_csv(predictions_path), ground_truth=os.fspath(ground_truth_path))


def _path(upload) -> str:
    """The local path of a Gradio upload (a path string, or a temporary-file object in older Gradio)."""
    return upload if isinstance(upload, str) else upload.name


def build_demo():
    import gradio as gr

    def score(predictions, ground_truth):
        if predictions is None or ground_truth is None:
            raise gr.Error("upload both the predictions and the ground-truth CSV files")
        try:
            return compute_from_files(_path(predictions), _path(ground_truth))
        except (ValueError, FileNotFoundError) as error:
            raise gr.Error(str(error)) from error

    return gr.Interface(
        fn=score,
        inputs=[gr.File(label="Predictions CSV (query_id,reference_id,score)"),
                gr.File(label="Ground-truth CSV (query_id,reference_id; empty reference_id = distractor)")],
        outputs=gr.JSON(label="copy_detection"),
        title="Copy Detection (muAP, RP90, recall@k)",
        description=(HERE / "README.md").read_text(encoding="utf-8").split("---", 2)[-1],
    )


if __name__ == "__main__":
    build_demo().launch()
