"""Copy-detection evaluation: muAP, RP90, recall at rank 1 / 10, mAP and precision-recall plots.

* ``copynce_hf/metrics/copy_detection/``: the metric as an ``evaluate`` module, loaded with
  ``evaluate.load(copynce_hf.metrics.COPY_DETECTION_METRIC_PATH)``; its ``formulas.py`` (numpy only) is the one
  implementation, imported here without ``evaluate`` (``copy_detection_metrics``, ``micro_average_precision``, ...).
* ``copynce_hf.metrics.plots``: ``save_pr_curves`` (matplotlib, imported on demand).
"""

from pathlib import Path

from .copy_detection.formulas import (
    copy_detection_metrics,
    ground_truth_pairs,
    mean_average_precision,
    micro_average_precision,
    normalize_ground_truth,
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
    "copy_detection_metrics",
    "ground_truth_pairs",
    "mean_average_precision",
    "micro_average_precision",
    "normalize_ground_truth",
    "precision_recall",
    "precision_recall_curve",
    "read_ground_truth_csv",
    "recall_at_precision",
    "true_match_ranks",
]
