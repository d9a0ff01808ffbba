"""The copy-detection systems compared on mini-DISC, each giving its top-k references per query.

* :class:`HashSystem`: perceptual hashes, the tools people use today without a GPU or training:
  PDQ (``pdqhash``, 256 bits) and pHash (``imagehash``, 64 bits). Score = 1 - Hamming distance /
  bits; the k nearest references come from an exact faiss binary index (``IndexBinaryFlat``).
* :class:`DescriptorSystem`: a descriptor model (a saved CopyNCE folder, or a randomly initialised
  ViT of the same size): :func:`copynce_hf.retrieval.extract_descriptors`, exact inner-product
  search (:class:`copynce_hf.retrieval.DescriptorIndex`, cosine on unit vectors).
* :class:`MatcherRescoring`: a CopyNCE matcher re-scoring a descriptor system's candidates
  (:func:`copynce_hf.retrieval.rescore_predictions`), paper section "Matcher".

Every system returns :class:`Predictions`; :func:`score_predictions` turns them into the
project's metrics (muAP, RP90, recall at rank 1/10, mAP) and the precision-recall curve.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import torch
from PIL import Image

from copynce_hf.errors import ConfigError
from copynce_hf.metrics.core import copy_detection_metrics, precision_recall_curve
from copynce_hf.retrieval import (
    DescriptorIndex,
    IndexConfig,
    Prediction,
    extract_descriptors,
    rescore_predictions,
)

from .minidisc import MiniDisc

logger = logging.getLogger(__name__)

__all__ = [
    "Predictions",
    "HashSystem",
    "pdq_bits",
    "phash_bits",
    "DescriptorSystem",
    "MatcherRescoring",
    "score_predictions",
]


@dataclasses.dataclass
class Predictions:
    """Scored candidate pairs of one system: P rows, at most k per query.

    Attributes:
        query_ids, reference_ids: (P,) ids.
        scores: (P,) float64, higher means more likely a copy.
        seconds: wall time the system took (hashing / embedding, search, re-scoring).
    """

    query_ids: list[str]
    reference_ids: list[str]
    scores: np.ndarray
    seconds: float = 0.0

    def __post_init__(self):
        self.scores = np.asarray(self.scores, dtype=np.float64).reshape(-1)
        if not len(self.query_ids) == len(self.reference_ids) == len(self.scores):
            raise ValueError(f"predictions of unequal lengths: {len(self.query_ids)}, {len(self.reference_ids)}, "
                             f"{len(self.scores)}")

    def __len__(self) -> int:
        return len(self.scores)

    @classmethod
    def from_rows(cls, rows: list[Prediction], seconds: float = 0.0) -> Predictions:
        return cls([r.query_id for r in rows], [r.reference_id for r in rows], [r.score for r in rows], seconds)

    def rows(self) -> list[Prediction]:
        return [Prediction(q, r, float(s)) for q, r, s in zip(self.query_ids, self.reference_ids, self.scores)]

    def to_dict(self) -> dict:
        return {"query_id": list(self.query_ids), "reference_id": list(self.reference_ids),
                "score": [float(s) for s in self.scores]}


def score_predictions(predictions: Predictions, ground_truth: dict[str, list[str]]) -> tuple[dict, dict]:
    """The project's copy-detection metrics and PR curve of a set of predictions.

    Returns:
        ``(metrics, curve)``: the dict of :func:`copynce_hf.metrics.core.copy_detection_metrics`
        and ``{"precision": [...], "recall": [...], "thresholds": [...]}`` (P points, rank order).
    """
    metrics = copy_detection_metrics(predictions.query_ids, predictions.reference_ids, predictions.scores,
                                     ground_truth)
    precision, recall, thresholds = precision_recall_curve(predictions.query_ids, predictions.reference_ids,
                                                           predictions.scores, ground_truth)
    curve = {"precision": precision.tolist(), "recall": recall.tolist(), "thresholds": thresholds.tolist()}
    return metrics, curve


# ---------------------------------------------------------------------------------------------- hashes


def pdq_bits(image: Image.Image) -> np.ndarray:
    """PDQ hash of an RGB image: bool (256,). Facebook's PDQ via ``pdqhash.compute``."""
    import pdqhash

    bits, _quality = pdqhash.compute(np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8)))
    return np.asarray(bits, dtype=bool)


def phash_bits(image: Image.Image) -> np.ndarray:
    """pHash (DCT hash, 8x8) of an image: bool (64,), ``imagehash.phash``."""
    import imagehash

    return np.asarray(imagehash.phash(image).hash, dtype=bool).reshape(-1)


class HashSystem:
    """A perceptual hash with exact Hamming search.

    Args:
        name: system name (``pdq``, ``phash``).
        hash_function: RGB PIL image -> bool (bits,) array.
    """

    def __init__(self, name: str, hash_function: Callable[[Image.Image], np.ndarray]):
        self.name = name
        self.hash_function = hash_function

    @classmethod
    def pdq(cls) -> HashSystem:
        return cls("pdq", pdq_bits)

    @classmethod
    def phash(cls) -> HashSystem:
        return cls("phash", phash_bits)

    def hashes(self, source) -> np.ndarray:
        """bool (N, bits): the hash of every image of ``source`` (``ids`` + ``load(i)``)."""
        rows = [self.hash_function(source.load(i)) for i in range(len(source))]
        bits = {row.size for row in rows}
        if len(bits) != 1 or next(iter(bits)) % 8:
            raise ConfigError(f"{self.name}: hashes must all have the same multiple of 8 bits, got {sorted(bits)}")
        return np.stack(rows)

    def predict(self, task: MiniDisc, k: int = 10) -> Predictions:
        """Top-``k`` references per query by Hamming distance; score = 1 - distance / bits."""
        start = time.perf_counter()
        references = self.hashes(task.reference_source())
        queries = self.hashes(task.query_source())
        num_bits = references.shape[1]
        index = faiss.IndexBinaryFlat(num_bits)
        index.add(np.packbits(references, axis=1))
        k = min(k, len(references))
        distances, indices = index.search(np.packbits(queries, axis=1), k)
        query_ids, reference_ids, scores = [], [], []
        for query_id, row_distances, row_indices in zip(task.query_ids, distances, indices):
            for distance, index_ in zip(row_distances, row_indices):
                if index_ >= 0:
                    query_ids.append(query_id)
                    reference_ids.append(task.reference_ids[index_])
                    scores.append(1.0 - float(distance) / num_bits)
        return Predictions(query_ids, reference_ids, scores, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- models


class DescriptorSystem:
    """A descriptor model: embed references and queries, exact cosine k-NN.

    Args:
        name: system name.
        model: a model whose output has unit-norm ``descriptors`` (B, D).
        image_processor: the model's image processor.
        batch_size: images per forward pass.
    """

    def __init__(self, name: str, model, image_processor, batch_size: int = 64):
        self.name = name
        self.model = model.eval()
        self.image_processor = image_processor
        self.batch_size = batch_size

    @classmethod
    def from_folder(cls, name: str, folder: str | Path, batch_size: int = 64) -> DescriptorSystem:
        """Load a saved descriptor folder with ``AutoModel`` / ``AutoImageProcessor``."""
        from transformers import AutoImageProcessor, AutoModel

        import copynce_hf  # noqa: F401  (registers the CopyNCE classes with the Auto classes)

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{name}: {str(folder)!r} is not a saved model folder (no config.json)")
        return cls(name, AutoModel.from_pretrained(folder, dtype=torch.float32), AutoImageProcessor.from_pretrained(folder), batch_size)

    @classmethod
    def random(cls, name: str, model_config: dict, seed: int = 0, batch_size: int = 64) -> DescriptorSystem:
        """A CopyNCE descriptor with randomly initialised weights (``torch.manual_seed(seed)``).

        Args:
            model_config: ``CopyNCEDescriptorConfig`` keyword arguments (e.g. the ``model`` section
                of ``configs/bench_descriptor.yaml``).
        """
        from copynce_hf.modeling import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor

        config = CopyNCEDescriptorConfig(**model_config)
        torch.manual_seed(seed)
        model = CopyNCEDescriptorModel(config)
        processor = CopyNCEImageProcessor(size={"height": config.image_size, "width": config.image_size})
        return cls(name, model, processor, batch_size)

    def embed(self, source, description: str):
        return extract_descriptors(self.model, self.image_processor, source, batch_size=self.batch_size,
                                   progress=False, description=description)

    def predict(self, task: MiniDisc, k: int = 10) -> Predictions:
        start = time.perf_counter()
        references = self.embed(task.reference_source(), f"{self.name} references")
        queries = self.embed(task.query_source(), f"{self.name} queries")
        index = DescriptorIndex.build(references, IndexConfig(kind="flat"))
        scores, indices = index.search(queries.descriptors, k)
        query_ids, reference_ids, flat_scores = [], [], []
        for query_id, row_scores, row_indices in zip(queries.ids, scores, indices):
            for score, index_ in zip(row_scores, row_indices):
                if index_ >= 0:
                    query_ids.append(query_id)
                    reference_ids.append(references.ids[index_])
                    flat_scores.append(float(score))
        return Predictions(query_ids, reference_ids, flat_scores, time.perf_counter() - start)


class MatcherRescoring:
    """A matcher re-scoring candidate pairs (typically a descriptor's top-10).

    Args:
        name: system name.
        model: a ``CopyNCEMatcherModel`` (score: sigmoid of its logit).
        image_processor: its image processor.
        batch_size: pairs per forward pass.
    """

    def __init__(self, name: str, model, image_processor, batch_size: int = 32):
        self.name = name
        self.model = model.eval()
        self.image_processor = image_processor
        self.batch_size = batch_size

    @classmethod
    def from_folder(cls, name: str, folder: str | Path, batch_size: int = 32) -> MatcherRescoring:
        from transformers import AutoImageProcessor, AutoModel

        import copynce_hf  # noqa: F401

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{name}: {str(folder)!r} is not a saved model folder (no config.json)")
        return cls(name, AutoModel.from_pretrained(folder, dtype=torch.float32), AutoImageProcessor.from_pretrained(folder), batch_size)

    def predict(self, task: MiniDisc, candidates: Predictions, query_files: dict[str, Path]) -> Predictions:
        """Re-score ``candidates``; ``query_files`` are the task's materialised queries (id -> path)."""
        start = time.perf_counter()
        result = rescore_predictions(candidates.rows(), self.model, self.image_processor, query_files,
                                     task.reference_files, batch_size=self.batch_size, progress=False)
        if result.skipped:
            raise ConfigError(f"{self.name}: {len(result.skipped)} candidate pairs could not be scored, "
                              f"e.g. {result.skipped[0]}")
        rescored = Predictions.from_rows(result.predictions)
        rescored.seconds = time.perf_counter() - start
        return rescored
