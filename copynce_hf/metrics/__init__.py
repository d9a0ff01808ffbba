"""Copy-detection evaluation: muAP, RP90, recall at rank 1 / 10, mAP and precision-recall plots.

* ``copynce_hf.metrics.core``: the metric functions (numpy only, no ``evaluate`` import).
* ``copynce_hf/metrics/copy_detection/``: the same metric as an ``evaluate`` module, loaded with
  ``evaluate.load(copynce_hf.metrics.COPY_DETECTION_METRIC_PATH)``.
* ``copynce_hf.metrics.plots``: ``save_pr_curves`` (matplotlib, imported on demand).
"""

from .core import (
    COPY_DETECTION_METRIC_PATH,
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
