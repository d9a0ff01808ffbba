"""mini-DISC for the benchmarks: the task of :mod:`copynce_hf.evaluation.minidisc` on ``../shared/data``.

The task, its recipe and its query drawing live in the package (one evaluation engine for the demo,
the benchmarks and ``copynce detect``); this module only points it at the project's data folder,
``../shared/data`` beside the repository (absent outside dev sessions and CI).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from copynce_hf.evaluation.minidisc import (
    EvaluationRecipe,
    MiniDisc,
    QueryEntry,
    read_splits,
)
from copynce_hf.evaluation.minidisc import MiniDiscConfig as _MiniDiscConfig
from copynce_hf.evaluation.minidisc import build_minidisc as _build_minidisc
from copynce_hf.retrieval import ImageListSource

__all__ = ["EvaluationRecipe", "MiniDiscConfig", "MiniDisc", "QueryEntry", "ImageListSource", "build_minidisc",
           "read_splits", "SHARED_DATA"]

#: ``../shared/data`` next to the repository (absent outside dev sessions and CI).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclasses.dataclass(frozen=True)
class MiniDiscConfig(_MiniDiscConfig):
    """:class:`copynce_hf.evaluation.minidisc.MiniDiscConfig` with the project's data folder as default."""

    image_folder: Path | None = SHARED_DATA / "imagenet-sample"
    splits_csv: Path | None = SHARED_DATA / "imagenet-sample-splits.csv"


def build_minidisc(config: _MiniDiscConfig | None = None) -> MiniDisc:
    """Build the task (default: the whole mini-DISC on ``../shared/data``, fingerprint ``3ecfc93f771d``)."""
    return _build_minidisc(config or MiniDiscConfig())
