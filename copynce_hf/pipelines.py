"""Registration of the ``image-copy-detection`` pipeline task with ``transformers``.

The pipeline itself is :class:`copynce_hf.modeling.pipeline_copynce.ImageCopyDetectionPipeline`
(in the modelling package, so that ``save_pretrained`` can copy it into a model folder). Importing
this module registers the task; ``import copynce_hf`` does that on the first import of
``transformers.pipelines`` (e.g. ``from transformers import pipeline``), not before.
"""

from __future__ import annotations

from transformers import AutoModel
from transformers.pipelines import PIPELINE_REGISTRY

from .modeling.configuration_copynce import CopyNCEViTConfig
from .modeling.pipeline_copynce import TASK, ImageCopyDetectionPipeline

__all__ = ["register_pipeline"]


def register_pipeline() -> None:
    """Register ``image-copy-detection`` (idempotent): ``pipeline(TASK, model=...)`` then builds
    :class:`ImageCopyDetectionPipeline` with ``AutoModel``.

    A second call, or a reload of this package's modules, replaces this package's own entry without
    transformers' "already registered. Overwriting" warning; another package's entry for the task is
    overwritten with that warning."""
    current = PIPELINE_REGISTRY.supported_tasks.get(TASK, {}).get("impl")
    if current is not None and _qualified_name(current) == _qualified_name(ImageCopyDetectionPipeline):
        del PIPELINE_REGISTRY.supported_tasks[TASK]
    PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=ImageCopyDetectionPipeline, pt_model=AutoModel,
                                        type="image")
    # Folders loaded with these classes then leave the task to this registration (their custom_pipelines
    # entry, for loads without copynce_hf, would make transformers ask for trust_remote_code=True).
    CopyNCEViTConfig.registered_pipeline_tasks = CopyNCEViTConfig.registered_pipeline_tasks | {TASK}


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


register_pipeline()
