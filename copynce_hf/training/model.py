"""The model a run trains, and its image processor: fresh, initialised from DINO, or a saved CopyNCE folder."""

from __future__ import annotations

import torch

from ..modeling import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)
from ..modeling.errors import ConfigError
from .config import TrainingConfig

__all__ = ["build_model"]

_MODELS = {
    "descriptor": (CopyNCEDescriptorConfig, CopyNCEDescriptorModel),
    "matcher": (CopyNCEMatcherConfig, CopyNCEMatcherModel),
}


def build_model(config: TrainingConfig):
    """``(model, image processor)``: from ``model_name_or_path``, else ``init_from_dino``, else fresh, with the
    ``model`` overrides of the configuration (an unknown key is a :class:`ConfigError` naming it)."""
    config_class, model_class = _MODELS[config.model_type]
    overrides = dict(config.model)
    known = set(config_class().to_dict())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown model configuration key(s) {['model.' + k for k in unknown]} for "
                          f"{config_class.__name__}")
    if config.model_name_or_path:
        image_size = overrides.pop("image_size", None)
        # float32 master weights whatever the folder stores (the embedded models are float16 on disk):
        # a float16 model would train in half precision and fails under bf16 autocast on the CPU
        model = model_class.from_pretrained(config.model_name_or_path, dtype=torch.float32,
                                            ignore_mismatched_sizes="descriptor_dim" in overrides, **overrides)
        if image_size is not None and image_size != model.config.image_size:
            model.set_image_size(image_size)  # position embeddings interpolated (224 -> 336)
    elif config.init_from_dino:
        try:
            model = model_class.from_dino(config.init_from_dino, **overrides)
        except OSError as error:  # offline, unknown id, missing file: name the option and the way out
            raise ConfigError(
                f"invalid configuration value init_from_dino={config.init_from_dino!r}: cannot load it "
                f"({str(error).splitlines()[0]}). Without network access, pass a local ViT folder or a DINO "
                ".pth file, or init_from_dino null to train from scratch."
            ) from error
    else:
        model = model_class(config_class(**overrides))
    if config.freeze_encoder:
        model.freeze_encoder()
    size = model.config.image_size
    processor = CopyNCEImageProcessor(size={"height": size, "width": size})
    return model, processor
