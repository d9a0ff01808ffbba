"""The model a run trains, and its image processor: fresh, initialised from DINO, or a saved CopyNCE folder.

A run that starts from a saved model (``model_name_or_path``: a folder written by ``save_pretrained``, a
converted checkpoint of the authors, a Hub id) trains that model: its architecture is the folder's, and
only the ``model`` keys the run gives override it. A key that would change the names or shapes of the
saved weights (``patch_size``, ``descriptor_dim``, ``hidden_size``, ...) is refused, naming it with the
folder's value, unless ``ignore_mismatched_sizes`` asks to re-initialise those weights; ``image_size`` is
the exception: the position embeddings are interpolated to it (224 -> 336), every weight is kept.
"""

from __future__ import annotations

import logging

import torch

from ..modeling import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)
from ..modeling.configuration_copynce import input_side
from ..modeling.errors import ConfigError
from ..runtime.loading import saved_model_kind
from .config import TrainingConfig

logger = logging.getLogger(__name__)

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
        model = _from_saved_model(config, overrides)
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
    if config.max_source_side and config.max_source_side < size:
        raise ConfigError(f"invalid configuration value max_source_side={config.max_source_side}: must be 0 (off) "
                          f"or at least the model's image_size={size}")
    side = input_side(model.config)  # the evaluation's and the saved folder's inputs
    processor = CopyNCEImageProcessor(size={"height": side, "width": side})
    return model, processor


def _from_saved_model(config: TrainingConfig, overrides: dict):
    """The saved model ``config.model_name_or_path`` with every weight kept (float32 master weights), the
    ``overrides`` applied; a key that would re-initialise weights is refused (see the module docstring)."""
    path = config.model_name_or_path
    kind = saved_model_kind(path)
    if kind != config.model_type:
        raise ConfigError(f"invalid configuration value model_type={config.model_type!r}: {path} holds a {kind} "
                          f"(leave model_type out, or set it to {kind})")
    config_class, model_class = _MODELS[kind]
    saved = config_class.from_pretrained(path)
    image_size = overrides.pop("image_size", None)
    conflicts = _shape_changing_keys(config_class, model_class, saved, overrides)
    if conflicts and not config.ignore_mismatched_sizes:
        raise ConfigError(
            f"{', '.join(conflicts)} would change the shapes of the weights of {path}, which would be "
            "re-initialised: leave these model keys out to train that model as it is, or set "
            "ignore_mismatched_sizes true to re-initialise those weights")
    # float32 master weights whatever the folder stores (the embedded models are float16 on disk):
    # a float16 model would train in half precision and fails under bf16 autocast on the CPU
    model, loading = model_class.from_pretrained(path, dtype=torch.float32, output_loading_info=True,
                                                 ignore_mismatched_sizes=config.ignore_mismatched_sizes, **overrides)
    _check_weights_kept(path, loading, config.ignore_mismatched_sizes)
    if image_size is not None and image_size != model.config.image_size:
        if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size % model.config.patch_size:
            raise ConfigError(f"invalid configuration value model.image_size={image_size!r}: must be a multiple of "
                              f"the patch_size={model.config.patch_size} of {path}")
        logger.info("image_size %d -> %d: the position embeddings of %s interpolated", model.config.image_size,
                    image_size, path)
        model.set_image_size(image_size)  # position embeddings interpolated (224 -> 336)
    return model


def _weight_shapes(model_class, model_config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight and buffer of ``model_class(model_config)``, built on the meta device (no
    memory, no initialisation)."""
    with torch.device("meta"):
        return {name: tuple(value.shape) for name, value in model_class(model_config).state_dict().items()}


def _shape_changing_keys(config_class, model_class, saved, overrides: dict) -> list[str]:
    """The keys of ``overrides`` that change the names or shapes of the weights of a model of the ``saved``
    configuration, as ``model.key=value (the folder's: value)``."""
    differing = {key: value for key, value in overrides.items() if getattr(saved, key, None) != value}
    if not differing:
        return []
    base, shapes = saved.to_dict(), _weight_shapes(model_class, saved)
    if _weight_shapes(model_class, config_class.from_dict({**base, **differing})) == shapes:
        return []

    def changes_shapes(key: str) -> bool:
        try:
            return _weight_shapes(model_class, config_class.from_dict({**base, key: differing[key]})) != shapes
        except ConfigError:  # valid only with the other keys given (e.g. hidden_size with its heads)
            return True

    named = [key for key in differing if changes_shapes(key)] or list(differing)
    return [f"model.{key}={differing[key]!r} (the folder's: {getattr(saved, key)!r})" for key in named]


def _check_weights_kept(path: str, loading: dict, re_initialise: bool) -> None:
    """Refuse a loaded model that does not use every weight of ``path`` as it is (``loading``: transformers'
    loading information); with ``re_initialise``, log the re-initialised weights instead."""
    lost = {"missing": sorted(loading.get("missing_keys") or ()),
            "unused": sorted(loading.get("unexpected_keys") or ()),
            "re-initialised (other shape)": sorted(str(item[0] if isinstance(item, tuple) else item)
                                                   for item in loading.get("mismatched_keys") or ())}
    lost = {what: names for what, names in lost.items() if names}
    if not lost:
        return
    text = "; ".join(f"{what}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''} ({len(names)})"
                     for what, names in lost.items())
    if re_initialise:
        logger.warning("ignore_mismatched_sizes: weights of %s not kept: %s", path, text)
        return
    raise ConfigError(f"invalid configuration value model_name_or_path={path!r}: the model built from it does not "
                      f"keep every weight of it ({text})")
