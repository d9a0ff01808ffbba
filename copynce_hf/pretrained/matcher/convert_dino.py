"""Initialise CopyNCE models from DINO ViT weights (paper: "both models are based on ViT-S
pretrained by DINO").

The backbone (:class:`CopyNCEViTModel`) keeps DINO's block layout (``blocks.N.{norm1,
attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}``, final ``norm``) and ``transformers``' ViT
embeddings (``embeddings.{cls_token, position_embeddings, patch_embeddings.projection}``), so
loading DINO weights is a renaming, plus fusing ``q``/``k``/``v`` for a ``transformers`` ViT:

* a ``transformers`` ViT checkpoint (folder or Hub id, e.g. ``facebook/dino-vits16``) is read
  with ``transformers.ViTModel.from_pretrained`` (which also converts older key names);
* an original DINO state dict (``.pth``), possibly wrapped in a training checkpoint
  (``teacher`` / ``student`` / ``model`` / ``state_dict``) with ``module.`` / ``backbone.``
  prefixes, is read with ``torch.load``.

The descriptor's backbone takes every block; the matcher's encoder the first
``num_hidden_layers - num_fusion_layers`` blocks and its fusion the last ones (they are one
block list), and its fusion CLS token starts as DINO's CLS token plus its position
embedding. Position embeddings are interpolated when the target ``image_size`` differs
(:func:`interpolate_position_embeddings`, DINO's bicubic resizing, which the model's embeddings also
use for inputs of another size).
Every key that is missing, unused or newly initialised is reported, never dropped silently.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.utils import logging

from .errors import CopyNCEError, ShapeError

logger = logging.get_logger(__name__)

__all__ = ["DinoLoadReport", "backbone_state_dict", "build_from_dino", "interpolate_position_embeddings",
           "read_dino_source"]

#: ViTConfig keys carried over from a transformers checkpoint's configuration.
VIT_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                   "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps", "image_size",
                   "patch_size", "num_channels", "qkv_bias")

_WRAPPER_KEYS = ("model", "state_dict", "model_state_dict")
_PREFIXES = ("module.", "backbone.", "vit.")
#: Top-level keys of DINO and of transformers' ViTModel -> backbone keys.
_TOP_LEVEL = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
}
#: Block parts of transformers' ViTModel (``layers.N.<part>``) -> DINO's names.
_VIT_BLOCK_PARTS = {"layernorm_before": "norm1", "layernorm_after": "norm2", "attention.o_proj": "attn.proj",
                    "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_BLOCK = re.compile(r"^blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)$")
_VIT_BLOCK = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
_QKV = {"attention.q_proj": 0, "attention.k_proj": 1, "attention.v_proj": 2}
_BACKBONE_KEYS = {"embeddings.cls_token", "embeddings.position_embeddings", "norm.weight", "norm.bias",
                  "embeddings.patch_embeddings.projection.weight", "embeddings.patch_embeddings.projection.bias"}


def interpolate_position_embeddings(position_embeddings: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Resize ViT position embeddings to another patch grid (bicubic over the grid, as DINO does; used
    when DINO weights meet another input size and by the embeddings of an input of another size).

    Args:
        position_embeddings: (1, 1 + N, C), the CLS position first, then a square grid of
            ``N = n * n`` patch positions in row-major order.
        grid: target (rows, columns) of patches.

    Returns:
        (1, 1 + rows * columns, C); the input itself when the grid is unchanged. The CLS
        position is kept as is.
    """
    num_positions = position_embeddings.shape[1] - 1
    side = int(round(math.sqrt(num_positions)))
    if side * side != num_positions:
        raise ShapeError(f"position embeddings of {num_positions} patches are not a square grid")
    rows, columns = grid
    if (rows, columns) == (side, side):
        return position_embeddings
    cls_position, patch_positions = position_embeddings[:, :1], position_embeddings[:, 1:]
    dim = position_embeddings.shape[-1]
    patch_positions = patch_positions.reshape(1, side, side, dim).permute(0, 3, 1, 2)
    patch_positions = F.interpolate(
        patch_positions.float(), size=(rows, columns), mode="bicubic", align_corners=False
    ).to(position_embeddings.dtype)
    patch_positions = patch_positions.permute(0, 2, 3, 1).reshape(1, rows * columns, dim)
    return torch.cat([cls_position, patch_positions], dim=1)


@dataclass
class DinoLoadReport:
    """What :func:`build_from_dino` did (keys of the backbone, e.g. ``blocks.3.attn.qkv.weight``).

    Attributes:
        source: description of the source.
        loaded: backbone keys set from the source.
        missing: backbone keys the source lacked (left at random initialisation).
        unexpected: source keys that were not used (e.g. a DINO projection head, a pooler).
        initialised: model keys outside the backbone, which DINO has no counterpart for
            (descriptor head, InfoNCE scale, matcher classifier, segment embeddings).
        interpolated: ``(source grid, target grid)`` when position embeddings were resized.
    """

    source: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    initialised: list[str] = field(default_factory=list)
    interpolated: tuple[int, int] | None = None


def _unwrap(checkpoint: dict, checkpoint_key: str) -> dict:
    """Pick the state dict out of a training checkpoint and strip wrapper prefixes."""
    state_dict = checkpoint
    for key in (checkpoint_key,) + _WRAPPER_KEYS:
        value = state_dict.get(key)
        if isinstance(value, dict) and not torch.is_tensor(value):
            logger.info(f"reading the '{key}' entry of the checkpoint")
            state_dict = value
            break
    unwrapped = {}
    for key, value in state_dict.items():
        if not torch.is_tensor(value):
            raise CopyNCEError(f"checkpoint entry {key!r} is not a tensor ({type(value).__name__}); "
                               f"pass checkpoint_key to pick the state dict of a training checkpoint")
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        unwrapped[key] = value
    return unwrapped


def _load_file(path: Path) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:  # DINO training checkpoints pickle their argparse.Namespace
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CopyNCEError(f"cannot read {path} as a PyTorch state dict: {error}") from error


def read_dino_source(source, checkpoint_key: str = "teacher") -> tuple[dict, dict | None, str]:
    """Read a DINO source (see the module docstring).

    Returns:
        ``(state_dict, vit_config, description)``: tensors with wrapper prefixes removed, the
        configuration of a transformers checkpoint as a dict (None for a ``.pth`` or a dict),
        and a description for reports.
    """
    if isinstance(source, dict):
        return _unwrap(source, checkpoint_key), None, "state dict"
    path = Path(os.fspath(source))
    if path.is_file():
        return _unwrap(_load_file(path), checkpoint_key), None, str(path)
    if path.is_dir() and not (path / "config.json").exists():
        raise CopyNCEError(f"{path} is a folder without config.json: not a transformers checkpoint")
    if not path.is_dir() and (path.suffix in (".pth", ".pt", ".bin", ".safetensors") or path.is_absolute()
                              or str(source).startswith(".")):
        raise CopyNCEError(f"DINO checkpoint {source} not found")
    from transformers import ViTModel

    vit = ViTModel.from_pretrained(os.fspath(source))
    return _unwrap(vit.state_dict(), checkpoint_key), vit.config.to_dict(), str(source)


def backbone_state_dict(state_dict: dict) -> tuple[dict, list[str]]:
    """DINO or ``transformers`` ViT tensors -> :class:`CopyNCEViTModel` keys (q, k, v fused into ``qkv``).

    Returns:
        ``(backbone, unused)``: the renamed tensors and the source keys that matched no
        backbone parameter (or an incomplete q/k/v triple).
    """
    backbone, unused = {}, []
    qkv_parts: dict[tuple[int, str], dict[int, tuple[str, torch.Tensor]]] = {}
    for key, value in state_dict.items():
        if key in _TOP_LEVEL or key in _BACKBONE_KEYS or _BLOCK.match(key):
            backbone[_TOP_LEVEL.get(key, key)] = value
            continue
        match = _VIT_BLOCK.match(key)
        if match and match.group(2) in _VIT_BLOCK_PARTS:
            backbone[f"blocks.{match.group(1)}.{_VIT_BLOCK_PARTS[match.group(2)]}.{match.group(3)}"] = value
        elif match and match.group(2) in _QKV:
            qkv_parts.setdefault((int(match.group(1)), match.group(3)), {})[_QKV[match.group(2)]] = (key, value)
        else:
            unused.append(key)
    for (index, kind), parts in qkv_parts.items():
        if sorted(parts) == [0, 1, 2]:
            backbone[f"blocks.{index}.attn.qkv.{kind}"] = torch.cat([parts[i][1] for i in range(3)], dim=0)
        else:
            unused.extend(name for name, _ in parts.values())
    return backbone, sorted(unused)


def infer_vit_config(backbone: dict) -> dict:
    """ViT hyper-parameters from the tensor shapes of a backbone state dict.

    The number of heads is not stored in the weights; DINO's ViTs use 64 channels per head
    (ViT-S: 6, ViT-B: 12), which is assumed here; pass ``num_attention_heads`` to override.
    """
    required = ("embeddings.cls_token", "embeddings.position_embeddings",
                "embeddings.patch_embeddings.projection.weight", "blocks.0.mlp.fc1.weight")
    absent = [key for key in required if key not in backbone]
    if absent:
        raise CopyNCEError(f"not a ViT state dict: keys {absent} are missing")
    hidden_size = backbone["embeddings.cls_token"].shape[-1]
    patch_weight = backbone["embeddings.patch_embeddings.projection.weight"]
    num_positions = backbone["embeddings.position_embeddings"].shape[1] - 1
    grid = int(round(math.sqrt(num_positions)))
    if grid * grid != num_positions:
        raise ShapeError(f"the position embeddings hold {num_positions} patch positions, not a square grid")
    return {
        "hidden_size": hidden_size,
        "num_hidden_layers": 1 + max(int(match.group(1)) for key in backbone if (match := _BLOCK.match(key))),
        "num_attention_heads": max(hidden_size // 64, 1),
        "intermediate_size": backbone["blocks.0.mlp.fc1.weight"].shape[0],
        "patch_size": patch_weight.shape[-1],
        "num_channels": patch_weight.shape[1],
        "image_size": grid * patch_weight.shape[-1],
        "qkv_bias": "blocks.0.attn.qkv.bias" in backbone,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu",
    }


def load_dino_weights(model, backbone: dict, source: str = "state dict") -> DinoLoadReport:
    """Copy backbone tensors into ``model.base_model`` (position embeddings resized if needed)."""
    report = DinoLoadReport(source=source)
    vit = model.base_model
    positions = backbone.get("embeddings.position_embeddings")
    grid = model.config.image_size // model.config.patch_size
    if positions is not None:
        source_grid = int(round(math.sqrt(positions.shape[1] - 1)))
        if source_grid != grid:
            positions = interpolate_position_embeddings(positions, (grid, grid))
            backbone = {**backbone, "embeddings.position_embeddings": positions}
            report.interpolated = (source_grid, grid)
    if not getattr(model.config, "final_layer_norm", True):
        # The authors' descriptor has no final LayerNorm: DINO's is left out, as their loader does.
        backbone = {key: value for key, value in backbone.items() if not key.startswith("norm.")}
    own = vit.state_dict()
    for key in sorted(set(backbone) & set(own)):
        if own[key].shape != backbone[key].shape:
            raise ShapeError(f"DINO weight for {key} has shape {tuple(backbone[key].shape)} but the model expects "
                               f"{tuple(own[key].shape)}: check hidden_size / intermediate_size / patch_size")
    targets = {key: value.to(own[key].dtype) for key, value in backbone.items() if key in own}
    result = vit.load_state_dict(targets, strict=False)
    report.loaded = sorted(targets)
    report.missing = sorted(result.missing_keys)
    report.unexpected = sorted(set(backbone) - set(own))
    prefix = model.base_model_prefix + "."
    report.initialised = sorted(key for key in model.state_dict() if not key.startswith(prefix))
    if hasattr(model, "fusion_cls_token") and positions is not None and "embeddings.cls_token" in backbone:
        with torch.no_grad():  # the fusion CLS starts as DINO's CLS token at its position (what block 1 sees)
            model.fusion_cls_token.copy_(backbone["embeddings.cls_token"] + positions[:, :1])
        report.initialised.remove("fusion_cls_token")
        report.loaded.append("fusion_cls_token")
    return report


def build_from_dino(model_class, source, config=None, strict: bool = False, checkpoint_key: str = "teacher",
                    **overrides):
    """Implementation of ``CopyNCEDescriptorModel.from_dino`` / ``CopyNCEMatcherModel.from_dino``."""
    state_dict, source_config, description = read_dino_source(source, checkpoint_key)
    backbone, unused = backbone_state_dict(state_dict)
    if config is None:
        if source_config is not None:
            architecture = {key: source_config[key] for key in VIT_CONFIG_KEYS if key in source_config}
        else:
            architecture = infer_vit_config(backbone)
        if model_class.config_class.model_type != "copynce-vit":
            # The authors build their descriptor and matcher around DINO's weights with their own
            # LayerNorm epsilon (1e-4), the config's default; the bare backbone keeps DINO's.
            architecture.pop("layer_norm_eps", None)
        config = model_class.config_class(**{**architecture, **overrides})
    elif overrides:
        config = model_class.config_class(**{**config.to_dict(), **overrides})
    model = model_class(config)
    report = load_dino_weights(model, backbone, description)
    report.unexpected = sorted(report.unexpected + unused)
    if report.interpolated:
        logger.info(f"position embeddings interpolated from a {report.interpolated[0]}x{report.interpolated[0]} "
                    f"to a {report.interpolated[1]}x{report.interpolated[1]} patch grid")
    if report.missing:
        logger.warning(f"DINO source {description} lacks {len(report.missing)} backbone weights, left at random "
                       f"initialisation: {report.missing}")
    if report.unexpected:
        logger.warning(f"DINO source {description}: {len(report.unexpected)} keys not used: {report.unexpected}")
    if report.initialised:
        logger.info(f"newly initialised (no DINO counterpart): {report.initialised}")
    if strict and (report.missing or report.unexpected):
        raise CopyNCEError(f"DINO source {description} does not match the model: missing {report.missing}, "
                           f"unexpected {report.unexpected}")
    model.dino_load_report = report
    return model
