"""CopyNCE models for ``transformers``: configurations, descriptor and matcher, image processor.

Importing this package registers the classes with ``AutoConfig``, ``AutoModel`` and
``AutoImageProcessor`` (model types ``copynce-descriptor`` and ``copynce-matcher``) and for
Hub custom code: a folder written by ``save_pretrained`` carries ``auto_map`` and the code
(``configuration_copynce.py``, ``modeling_copynce.py``, ``losses_copynce.py``, ...), so that
``AutoModel.from_pretrained(folder, trust_remote_code=True)`` works where copynce_hf is not
installed.
"""

from transformers import AutoConfig, AutoImageProcessor, AutoModel

from .configuration_copynce import CopyNCEDescriptorConfig, CopyNCEMatcherConfig
from .convert_dino import DinoLoadReport
from .image_processing_copynce import CopyNCEImageProcessor
from .modeling_copynce import (
    CopyNCEDescriptorModel,
    CopyNCEDescriptorOutput,
    CopyNCEMatcherModel,
    CopyNCEMatcherOutput,
    CopyNCEPreTrainedModel,
    interpolate_position_embeddings,
)

__all__ = [
    "CopyNCEDescriptorConfig",
    "CopyNCEDescriptorModel",
    "CopyNCEDescriptorOutput",
    "CopyNCEImageProcessor",
    "CopyNCEMatcherConfig",
    "CopyNCEMatcherModel",
    "CopyNCEMatcherOutput",
    "CopyNCEPreTrainedModel",
    "DinoLoadReport",
    "interpolate_position_embeddings",
    "register_auto_classes",
]


def register_auto_classes() -> None:
    """Register the configurations, models and image processor with the Auto classes (idempotent)."""
    for config_class, model_class in (
        (CopyNCEDescriptorConfig, CopyNCEDescriptorModel),
        (CopyNCEMatcherConfig, CopyNCEMatcherModel),
    ):
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModel.register(config_class, model_class, exist_ok=True)
        AutoImageProcessor.register(config_class, image_processor_classes={"pil": CopyNCEImageProcessor},
                                    exist_ok=True)
        # save_pretrained then writes auto_map and copies the code into the folder (Hub custom code).
        config_class.register_for_auto_class("AutoConfig")
        model_class.register_for_auto_class("AutoModel")
    CopyNCEImageProcessor.register_for_auto_class("AutoImageProcessor")


register_auto_classes()
