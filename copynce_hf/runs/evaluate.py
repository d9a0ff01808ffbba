"""``copynce evaluate`` as one call: predictions CSVs scored against a ground truth (the DISC21 metrics), written as
``metrics.json`` and ``pr_curve.png``, and the table the command prints."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ..outputs import StagedFolder, check_output_folder
from ..retrieval.predictions import metric_warnings_logged, read_ground_truth, read_predictions

#: The metrics the table shows, in order (then the numbers of predictions and of ground-truth pairs).
METRIC_NAMES = ("micro_ap", "recall_at_p90", "threshold_at_p90", "recall_at_rank1", "recall_at_rank10", "mean_ap")


@dataclasses.dataclass
class Evaluation:
    """What :func:`evaluate_files` found: the metrics of each predictions file (by name: its stem, or its path when
    two stems are alike), the predictions read, and the files written."""

    results: dict[str, dict]
    predictions: int
    metrics_file: Path
    curve_file: Path


def evaluate_files(predictions: list[str | os.PathLike], ground_truth: str | os.PathLike,
                   output: str | os.PathLike) -> Evaluation:
    """Score every predictions CSV against the ground-truth CSV and write ``OUTPUT/metrics.json`` (name ->
    metrics) and ``OUTPUT/pr_curve.png``; the output folder and every file are checked before anything is written."""
    from ..metrics.copy_detection.formulas import copy_detection_metrics, precision_recall_curve
    from ..metrics.plots import save_pr_curves

    check_output_folder(output)
    truth = read_ground_truth(ground_truth)
    systems = {}  # name -> (predictions file, its predictions)
    for path in predictions:
        name = Path(path).stem if Path(path).stem not in systems else str(path)
        systems[name] = (path, read_predictions(path))
    results, curves = {}, {}
    for name, (path, rows) in systems.items():
        columns = ([p.query_id for p in rows], [p.reference_id for p in rows], [p.score for p in rows])
        with metric_warnings_logged(path):  # a warning names the file whose predictions raised it
            results[name] = copy_detection_metrics(*columns, truth)
            curves[name] = precision_recall_curve(*columns, truth)
    output = Path(output)
    with StagedFolder(output) as staging:
        (staging / "metrics.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        save_pr_curves(curves, staging / "pr_curve.png", title=f"Precision-recall vs {Path(ground_truth).name}")
    return Evaluation(results, sum(len(rows) for _, rows in systems.values()), output / "metrics.json",
                      output / "pr_curve.png")


def metrics_table(results: dict[str, dict]) -> str:
    """The metrics as a text table: one row per metric of :data:`METRIC_NAMES` (then the counts), one column per
    predictions file; ``-`` where a metric is undefined."""
    rows = (*METRIC_NAMES, "num_predictions", "num_ground_truth_pairs")
    first = max(len(metric) for metric in rows) + 2
    width = max(10, *(len(name) for name in results))
    lines = ["metric".ljust(first) + "".join(name.rjust(width + 2) for name in results)]
    for metric in rows:
        cells = []
        for values in results.values():
            value = values[metric]
            text = "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
            cells.append(text.rjust(width + 2))
        lines.append(metric.ljust(first) + "".join(cells))
    return "\n".join(lines)
