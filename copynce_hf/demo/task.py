"""The demo task; it lives in :mod:`copynce_hf.evaluation.demo_task` (one evaluation engine), re-exported here."""

from ..evaluation.demo_task import (
    BUNDLED_IMAGES,
    DEFAULT_DISTRACTOR_SOURCES,
    DemoQuery,
    DemoRecipe,
    DemoTask,
    DemoTaskConfig,
    build_demo_task,
    input_overlap,
    probe_patch,
    traced_patches,
    true_pair_overlap,
)

__all__ = [
    "BUNDLED_IMAGES",
    "DEFAULT_DISTRACTOR_SOURCES",
    "DemoQuery",
    "DemoRecipe",
    "DemoTask",
    "DemoTaskConfig",
    "build_demo_task",
    "input_overlap",
    "probe_patch",
    "traced_patches",
    "true_pair_overlap",
]
