"""Copy-detection metric for 🤗 Evaluate: muAP, RP90, recall at rank 1 / 10 and mAP (DISC21 protocol).

Load it with ``evaluate.load("path/to/copynce_hf/metrics/copy_detection")`` or, once pushed
as a metric Space, with ``evaluate.load("<user>/copy_detection")``. The formulas live in the
sibling file ``formulas.py`` (numpy only), which evaluate copies along with this script and
which the package imports directly where it must not import evaluate.
"""

import datasets
import evaluate

from .formulas import copy_detection_metrics

_CITATION = """\
@inproceedings{lu2025copynce,
  title     = {Tracing Copied Pixels and Regularizing Patch Affinity in Copy Detection},
  author    = {Lu, Yichen and Nie, Siwei and Lu, Minlong and Yang, Xudong and Zhang, Xiaobo and Zhang, Peng},
  booktitle = {Proceedings of the IEEE/CVF International Conference on Computer Vision (ICCV)},
  year      = {2025}
}
@article{douze2021isc,
  title   = {The 2021 Image Similarity Dataset and Challenge},
  author  = {Douze, Matthijs and Tolias, Giorgos and Pizzi, Ed and Papakipos, Zo{\\"e} and Chanussot, Lowik
             and Radenovic, Filip and Jenicek, Tomas and Maximov, Maxim and Leal-Taix{\\'e}, Laura
             and Elezi, Ismail and Chum, Ond{\\v{r}}ej and Canton Ferrer, Cristian},
  journal = {arXiv preprint arXiv:2106.09672},
  year    = {2021}
}
"""

_DESCRIPTION = """\
Image copy detection metrics of the DISC21 protocol. Every prediction is a (query id,
reference id, score) triple; all predictions of all queries are pooled and sorted by
decreasing score, with non-copies first among equal scores (the pessimistic order of the
official evaluation). micro AP (muAP) sums, over the ranks, the recall increment times the
precision, with recall counted over all ground-truth pairs (pairs that were never predicted
cap the recall). RP90 is the highest recall reached at a precision of at least 90%.
Recall at rank 1 / 10 counts, for each ground-truth pair, every prediction of the same query
scored at least as high as the true match as ranked before it. mAP is the per-query AP
averaged over the queries that have a copy (the paper's mAP, an optimistic, per-query view).
"""

_KWARGS_DESCRIPTION = """
Args:
    query_id (`list` of `str`): query image id of each predicted pair.
    reference_id (`list` of `str`): reference image id of each predicted pair.
    score (`list` of `float`): score of each pair, higher means more likely a copy. NaN is refused.
    ground_truth (`dict` or `str`): mapping from query id to the list of reference ids it copies
        (queries absent from the mapping, or with an empty list, are distractors), or the path of
        a DISC21 ground-truth CSV file with header `query_id,reference_id` (an empty
        `reference_id` marks a distractor query).
Returns:
    micro_ap (`float`): muAP over all pooled predictions.
    recall_at_p90 (`float`): highest recall with precision >= 0.9 (0.0 when never reached).
    threshold_at_p90 (`float` or `None`): score at that operating point, None when precision never reaches 0.9.
    recall_at_rank1 (`float`): fraction of ground-truth pairs ranked first (ties count against them).
    recall_at_rank10 (`float`): fraction of ground-truth pairs ranked in the first ten.
    mean_ap (`float`): per-query AP averaged over queries with a copy (queries with a copy and no prediction count 0).
    num_predictions (`int`), num_ground_truth_pairs (`int`), num_queries_with_copy (`int`): counts.
Raises:
    ValueError: a (query, reference) pair predicted twice, a NaN score, a ground truth without
        any copy, or a ground-truth CSV with unknown or missing columns.
Examples:
    >>> metric = evaluate.load("copynce_hf/metrics/copy_detection")
    >>> results = metric.compute(
    ...     query_id=["q1", "q1", "q2"], reference_id=["r1", "r7", "r2"], score=[0.9, 0.3, 0.6],
    ...     ground_truth={"q1": ["r1"], "q2": ["r2"], "q3": []},
    ... )
    >>> results["micro_ap"], results["recall_at_rank1"]
    (1.0, 1.0)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CopyDetection(evaluate.Metric):
    """Image copy detection: muAP, RP90, recall at rank 1 and 10, and mAP."""

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "query_id": datasets.Value("string"),
                    "reference_id": datasets.Value("string"),
                    "score": datasets.Value("float64"),
                }
            ),
            homepage="https://github.com/facebookresearch/isc2021",
            reference_urls=["https://arxiv.org/abs/2106.09672"],
        )

    def _compute(self, query_id, reference_id, score, ground_truth=None):
        if ground_truth is None:
            raise ValueError(
                "copy_detection needs the keyword ground_truth: a mapping {query_id: [reference_id, ...]} "
                "or the path of a ground-truth CSV file with header query_id,reference_id"
            )
        return copy_detection_metrics(query_id, reference_id, score, ground_truth)
