"""The settings several ``copynce`` runs share, each declared once with its command-line option
(:func:`~copynce_hf.configuration.fields.setting`): what runs the models and how many images a forward pass takes, the
approximate search knobs, the whitening sample, a dataset of images and a calibrated decision. A request holds them as fields of its own,
declared :func:`~copynce_hf.configuration.fields.setting_like` these (``MatchRequest.batch_size`` counts image pairs).

Nothing heavy is imported here: building a parser from these loads no torch, transformers or faiss.
"""

from __future__ import annotations

import dataclasses

from ..calibration.thresholds import PRECISIONS as CALIBRATED_PRECISIONS
from ..configuration.fields import positive_int, setting, setting_like
from ..retrieval.detection.config import DetectConfig


@dataclasses.dataclass
class ModelLoading:
    """What runs the models (``torch``, ``onnx``), images per forward pass, ``DataLoader`` workers."""

    runtime: str = setting(
        "torch", "what runs the models: torch (default) or onnx (ONNX Runtime; a model option then names a folder of "
        "copynce export-onnx, or a model folder exported once into ~/.cache/copynce_hf/onnx, $COPYNCE_ONNX_CACHE)",
        choices=("torch", "onnx"), default_text="")
    batch_size: int = setting(64, "images per forward pass", type=positive_int)
    num_workers: int = setting(0, "DataLoader worker processes reading images", type=int)


@dataclasses.dataclass
class SearchKnobs:
    """The approximate search knobs of an index (``None``: the index's own)."""

    ef_search: int | None = setting(None, "HNSW: beam width at search time (default 128; a search for k neighbours "
                                    "uses at least k)", type=positive_int)
    nprobe: int | None = setting(None, "IVF-PQ: inverted lists visited per query (default 32)", type=positive_int)
    k_factor: int | None = setting(None, "IVF-PQ: candidates re-ranked exactly per neighbour (default 8)",
                                   type=positive_int)


@dataclasses.dataclass
class Whitening:
    """The sample images a whitening is learned from (``None``: none), and the directions it keeps."""

    whiten_from: str | None = setting(
        None, "sample images of the collection (not the queries' copies) to learn centering + PCA whitening from; "
        "references and queries are whitened, then L2-normalised (stored with the index)", metavar="FOLDER")
    whiten_dim: int | None = setting_like(DetectConfig, "whiten_dim")


@dataclasses.dataclass
class DatasetInput:
    """Images from a dataset instead of a folder (``None``: a folder)."""

    dataset: str | None = setting(None, "a Hub dataset id, a Parquet file, a save_to_disk folder or a folder of images",
                                  metavar="NAME_OR_PATH")


@dataclasses.dataclass
class CalibratedDecision:
    """A ``copynce calibrate`` file and the calibrated precision copies are decided at (``detect``, ``dedup``)."""

    calibration: str | None = setting(
        None, "calibration.json written by `copynce calibrate` with this run's models and settings: pairs scored at or "
        "above its threshold at --precision are copies (detect: the column copy of predictions.csv and "
        "OUTPUT/copies.csv; dedup: the pairs joined into groups)", metavar="FILE")
    precision: float | None = setting(
        None, "the calibrated precision to decide at: a --calibration file's (it holds "
        f"{', '.join(f'{precision:g}' for precision in CALIBRATED_PRECISIONS)}), or, for dedup without --calibration "
        "or --threshold, the target of its self-calibration (default 0.9)", type=float, metavar="P")
