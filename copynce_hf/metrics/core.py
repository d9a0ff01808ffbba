"""Copy-detection metric functions shared by the evaluate module, the CLI and the benchmarks.

There is one implementation of the formulas: ``copy_detection/formulas.py``, the numpy-only
file that also ships inside the ``copy_detection`` evaluate metric (loadable with
``evaluate.load`` on that folder and pushable as a Hub metric Space). This module re-exports
it so that code in the package can score predictions without importing ``evaluate``.

See ``copy_detection/formulas.py`` for the definitions (DISC21 protocol; paper,
supplementary "More about Evaluation Protocols").
"""

from pathlib import Path

from .copy_detection.formulas import (
    GROUND_TRUTH_COLUMNS,
    NOT_FOUND,
    copy_detection_metrics,
    ground_truth_pairs,
    mean_average_precision,
    micro_average_precision,
    normalize_ground_truth,
    pessimistic_order,
    precision_recall,
    precision_recall_curve,
    read_ground_truth_csv,
    recall_at_precision,
    true_match_ranks,
)

#: Path of the evaluate metric folder, for ``evaluate.load(COPY_DETECTION_METRIC_PATH)``.
COPY_DETECTION_METRIC_PATH = str(Path(__file__).with_name("copy_detection"))

__all__ = [
    "COPY_DETECTION_METRIC_PATH",
    "GROUND_TRUTH_COLUMNS",
    "NOT_FOUND",
    "copy_detection_metrics",
    "ground_truth_pairs",
    "mean_average_precision",
    "micro_average_precision",
    "normalize_ground_truth",
    "pessimistic_order",
    "precision_recall",
    "precision_recall_curve",
    "read_ground_truth_csv",
    "recall_at_precision",
    "true_match_ranks",
]
