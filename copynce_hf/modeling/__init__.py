"""CopyNCE models for ``transformers``: ViT backbone, descriptor and matcher, image processor, pipeline.

The modules of this package are the whole implementation and import each other relatively
only, so ``save_pretrained`` copies exactly what a model needs (``configuration_copynce.py``,
``modeling_copynce.py``, ``losses_copynce.py``, ``errors.py``, ...) into the folder and writes
``auto_map``: ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` then works where
copynce_hf is not installed.

Names are imported on first access (``copynce_hf.modeling.CopyNCEDescriptorModel``), so that
``copynce_hf.modeling.errors`` and the command line start without ``torch``. :func:`register_auto_classes`
registers the classes with ``AutoConfig``, ``AutoModel`` and ``AutoImageProcessor`` (model types
``copynce-vit``, ``copynce-descriptor`` and ``copynce-matcher``); ``import copynce_hf`` has it
run as soon as ``transformers``' Auto classes are imported.
"""

from __future__ import annotations

import importlib

__all__ = [
    "CopyNCEDescriptorConfig",
    "CopyNCEDescriptorModel",
    "CopyNCEDescriptorOutput",
    "CopyNCEImageProcessor",
    "CopyNCEMatcherConfig",
    "CopyNCEMatcherModel",
    "CopyNCEMatcherOutput",
    "CopyNCEPreTrainedModel",
    "CopyNCEViTConfig",
    "CopyNCEViTModel",
    "DinoLoadReport",
    "interpolate_position_embeddings",
    "register_auto_classes",
]

_SOURCES = {
    "CopyNCEDescriptorConfig": "configuration_copynce",
    "CopyNCEMatcherConfig": "configuration_copynce",
    "CopyNCEViTConfig": "configuration_copynce",
    "CopyNCEImageProcessor": "image_processing_copynce",
    "DinoLoadReport": "convert_dino",
    "interpolate_position_embeddings": "convert_dino",
    **{name: "modeling_copynce" for name in ("CopyNCEDescriptorModel", "CopyNCEDescriptorOutput",
                                              "CopyNCEMatcherModel", "CopyNCEMatcherOutput",
                                              "CopyNCEPreTrainedModel", "CopyNCEViTModel")},
}

_registered = False


def __getattr__(name: str):
    if name in _SOURCES:
        value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def register_auto_classes() -> None:
    """Register the configurations, models and image processor with the Auto classes (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoImageProcessor, AutoModel
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor  # needs no torchvision

    from .configuration_copynce import CopyNCEDescriptorConfig, CopyNCEMatcherConfig, CopyNCEViTConfig
    from .image_processing_copynce import CopyNCEImageProcessor
    from .modeling_copynce import CopyNCEDescriptorModel, CopyNCEMatcherModel, CopyNCEViTModel

    for config_class, model_class in (
        (CopyNCEViTConfig, CopyNCEViTModel),
        (CopyNCEDescriptorConfig, CopyNCEDescriptorModel),
        (CopyNCEMatcherConfig, CopyNCEMatcherModel),
    ):
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModel.register(config_class, model_class, exist_ok=True)
        AutoImageProcessor.register(config_class, image_processor_classes={"pil": CopyNCEImageProcessor},
                                    exist_ok=True)
        # No video processor: said explicitly, or AutoVideoProcessor (which pipelines such as the stock
        # image-feature-extraction try) reads the image processor's auto_map as remote video code and
        # stops at an interactive "run the custom code?" prompt.
        AutoVideoProcessor.register(config_class, video_processor_classes={}, exist_ok=True)
        # save_pretrained then writes auto_map and copies the code into the folder (Hub custom code).
        config_class.register_for_auto_class("AutoConfig")
        model_class.register_for_auto_class("AutoModel")
    CopyNCEImageProcessor.register_for_auto_class("AutoImageProcessor")
    _registered = True
