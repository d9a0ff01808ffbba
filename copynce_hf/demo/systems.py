"""The systems the demo compares, and how their predictions are scored.

* perceptual hashes (PDQ through ``pdqhash``, pHash through ``imagehash``): exact Hamming search,
  score ``1 - distance / bits``; a hash whose library is not installed is skipped with a note;
* the CopyNCE descriptor: cosine k-NN over the references (:func:`copynce_hf.retrieval.extract_descriptors`,
  :class:`copynce_hf.retrieval.DescriptorIndex`);
* the CopyNCE matcher re-scoring the descriptor's top-k candidates (``sigmoid(logit)``,
  :func:`copynce_hf.retrieval.rescore_predictions`).

Every system returns up to ``k`` (query, reference, score) predictions per query, scored with the
package's copy-detection metric (µAP, RP90, recall@1; :func:`copynce_hf.metrics.core.copy_detection_metrics`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import ConfigError
from ..images import load_image
from ..metrics.core import copy_detection_metrics, precision_recall_curve
from ..retrieval import (
    DescriptorIndex,
    IndexConfig,
    Prediction,
    extract_descriptors,
    knn_predictions,
    model_kind,
)
from ..retrieval import rescore_predictions as _rescore
from .task import DemoTask

__all__ = [
    "HASHES",
    "ImageListSource",
    "SystemResult",
    "descriptor_predictions",
    "hash_predictions",
    "load_model",
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
    query_ids = [p.query_id for p in predictions]
    reference_ids = [p.reference_id for p in predictions]
    scores = [p.score for p in predictions]
    metrics = copy_detection_metrics(query_ids, reference_ids, scores, ground_truth)
    precision, recall, _ = precision_recall_curve(query_ids, reference_ids, scores, ground_truth)
    return SystemResult(name, predictions, seconds, metrics, (precision, recall))


# ---------------------------------------------------------------------------------------------- models


def load_model(path: str | Path, kind: str, option: str):
    """``(model, image_processor)`` of a saved CopyNCE ``kind`` folder, in float32 on the CPU.

    The embedded models are stored in float16 (``scripts/export_embedded.py``); they are loaded in
    float32 (``dtype=torch.float32``) because float16 arithmetic on a CPU is slow and less exact.

    Raises:
        ConfigError: the folder does not exist (the embedded models have not been exported yet),
            cannot be loaded, or holds the wrong kind of model.
    """
    # importing copynce_hf (this package's parent) registered the CopyNCE classes with the Auto classes
    from transformers import AutoImageProcessor, AutoModel

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"the CopyNCE {kind} model folder {folder} does not exist. The embedded default models are made from "
            f"trained benchmark runs by `python scripts/export_embedded.py` (see copynce_hf/pretrained/README.md); "
            f"the demo never trains. Pass {option} PATH to use another saved model folder."
        )
    try:
        model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
        processor = AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(f"cannot load the {kind} model {folder} ({option}): {first_line}") from error
    if model_kind(model) != kind:
        raise ConfigError(f"{option} {folder} holds a {model_kind(model)}; a {kind} is needed here")
    return model, processor


class ImageListSource:
    """Image source over ``ids`` and in-memory or on-disk images (``ids`` + ``load(i)``)."""

    def __init__(self, ids: list[str], images: list[Image.Image | Path]):
        if len(ids) != len(images):
            raise ConfigError(f"{len(ids)} ids for {len(images)} images")
        self.ids = list(ids)
        self.images = list(images)

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, index: int) -> Image.Image:
        image = self.images[index]
        return image if isinstance(image, Image.Image) else load_image(image)


def _top_k(query_ids: list[str], similarity: np.ndarray, reference_ids: list[str], k: int) -> list[Prediction]:
    """Top-``k`` references of every query from a (Nq, Nr) similarity matrix (higher is better)."""
    k = min(k, similarity.shape[1])
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    scores = np.take_along_axis(similarity, order, axis=1)
    return knn_predictions(query_ids, scores, order, reference_ids)


@torch.inference_mode()
def descriptor_predictions(model, processor, task: DemoTask, k: int) -> list[Prediction]:
    """Cosine k-NN of the queries' descriptors among the references' (exact faiss inner product)."""
    references = extract_descriptors(model, processor, ImageListSource(task.reference_ids,
                                     list(task.reference_files.values())), progress=False)
    queries = extract_descriptors(model, processor, ImageListSource([q.query_id for q in task.queries],
                                  [q.image for q in task.queries]), progress=False)
    index = DescriptorIndex.build(references, IndexConfig(kind="flat"))
    scores, indices = index.search(queries.descriptors, min(k, len(references)))
    return knn_predictions(queries.ids, scores, indices, references.ids)


def matcher_predictions(model, processor, candidates: list[Prediction], query_files: dict[str, Path],
                        reference_files: dict[str, Path], batch_size: int = 32) -> list[Prediction]:
    """The matcher's copy probability ``sigmoid(logit)`` of every candidate pair (descriptor scores dropped)."""
    result = _rescore(candidates, model, processor, query_files, reference_files, batch_size=batch_size,
                      progress=False)
    if result.skipped:
        raise ConfigError(f"the matcher could not score {len(result.skipped)} pairs, e.g. {result.skipped[0]}")
    return result.predictions


# ---------------------------------------------------------------------------------------------- hashes


def pdq_bits(image: Image.Image) -> np.ndarray:
    """PDQ hash (Facebook's ``pdqhash``): bool (256,)."""
    import pdqhash

    bits, _quality = pdqhash.compute(np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8)))
    return np.asarray(bits, dtype=bool).reshape(-1)


def phash_bits(image: Image.Image) -> np.ndarray:
    """pHash (``imagehash.phash``, 8x8 DCT): bool (64,)."""
    import imagehash

    return np.asarray(imagehash.phash(image).hash, dtype=bool).reshape(-1)


#: name -> (module that must be importable, hash function).
HASHES: dict[str, tuple[str, Callable[[Image.Image], np.ndarray]]] = {
    "PDQ": ("pdqhash", pdq_bits),
    "pHash": ("imagehash", phash_bits),
}


def hash_predictions(hash_function: Callable[[Image.Image], np.ndarray], task: DemoTask, k: int) -> list[Prediction]:
    """Top-``k`` references per query by Hamming distance of the hashes; score ``1 - distance / bits``."""
    references = np.stack([hash_function(load_image(path)) for path in task.reference_files.values()])
    queries = np.stack([hash_function(query.image) for query in task.queries])
    # Hamming distance of every (query, reference) pair: (Nq, Nr)
    distance = (queries[:, None, :] != references[None, :, :]).sum(axis=-1)
    similarity = 1.0 - distance / references.shape[1]
    return _top_k([q.query_id for q in task.queries], similarity, task.reference_ids, k)


def timed(function: Callable, *args, **kwargs):
    """``(result, seconds)`` of one call."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start
