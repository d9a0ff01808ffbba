"""Initialise CopyNCE models from DINO ViT weights (paper: "both models are based on ViT-S
pretrained by DINO").

Accepted sources:

* a ``transformers`` ViT checkpoint (folder or Hub id, e.g. ``facebook/dino-vits16``): keys
  ``embeddings.*``, ``encoder.layer.N.attention.attention.{query,key,value}.*``,
  ``...attention.output.dense.*``, ``layernorm_before/after``, ``intermediate.dense``,
  ``output.dense``, ``layernorm`` (and the ``layers.N.attention.{q,k,v,o}_proj`` names of
  transformers 5 modules, and a ``vit.`` prefix);
* an original DINO state dict (``.pth``): ``cls_token``, ``pos_embed``, ``patch_embed.proj.*``,
  ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*``, ``norm.*``, possibly wrapped
  in a training checkpoint (``teacher`` / ``student`` / ``model`` / ``state_dict``) with
  ``module.`` / ``backbone.`` prefixes.

Both are first brought to the DINO key layout ("canonical" keys, q/k/v fused into ``qkv``),
then mapped onto the model: the descriptor takes every block; the matcher's encoder takes the
first ``num_hidden_layers - num_fusion_layers`` blocks and its fusion the last ones, and its
fusion CLS token starts as DINO's CLS token plus its position embedding. Position
embeddings are interpolated (bicubic over the patch grid) when the target ``image_size``
differs. Every key that is missing, unused or newly initialised is reported, never dropped
silently.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.utils import logging

from .losses_copynce import CopyNCEError
from .modeling_copynce import interpolate_position_embeddings

logger = logging.get_logger(__name__)

__all__ = ["DinoLoadReport", "build_from_dino", "canonical_dino_state_dict", "infer_vit_config",
           "load_dino_weights", "read_dino_source"]

#: ViTConfig keys read from a transformers checkpoint's config.json.
VIT_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                   "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps", "image_size",
                   "patch_size", "num_channels", "qkv_bias")

_WRAPPER_KEYS = ("model", "state_dict", "model_state_dict")
_PREFIXES = ("module.", "backbone.", "vit.")

_BLOCK_PARTS = {
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "attention.output.dense": "attn.proj",
    "attention.o_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_QKV_PARTS = {"attention.attention.query": 0, "attention.attention.key": 1, "attention.attention.value": 2,
              "attention.q_proj": 0, "attention.k_proj": 1, "attention.v_proj": 2}
_DINO_BLOCK = re.compile(r"^blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)$")
_HF_BLOCK = re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias)$")
_TOP_LEVEL = {
    "cls_token": "cls_token",
    "pos_embed": "pos_embed",
    "patch_embed.proj.weight": "patch_embed.proj.weight",
    "patch_embed.proj.bias": "patch_embed.proj.bias",
    "norm.weight": "norm.weight",
    "norm.bias": "norm.bias",
    "embeddings.cls_token": "cls_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
}
_BACKBONE_PREFIXES = ("embeddings.", "blocks.", "encoder_blocks.", "fusion_blocks.", "norm.")


@dataclass
class DinoLoadReport:
    """What :func:`load_dino_weights` did.

    Attributes:
        source: description of the source.
        loaded: model keys set from the source.
        missing: backbone keys of the model (embeddings, blocks, final norm) the source lacked.
        unexpected: source keys that were not used (e.g. a DINO projection head, a pooler).
        initialised: model keys DINO has no counterpart for (descriptor head, InfoNCE scale,
            matcher classifier, segment embeddings), left at their fresh initialisation.
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
        changed = True
        while changed:
            changed = False
            for prefix in _PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix):], True
        unwrapped[key] = value
    return unwrapped


def _load_file(path: Path) -> dict:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as first_error:  # DINO training checkpoints pickle their argparse.Namespace
        try:
            with torch.serialization.safe_globals([argparse.Namespace]):
                return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise CopyNCEError(f"cannot read {path} as a PyTorch state dict: {error}") from first_error


def _load_transformers_folder(folder: Path) -> tuple[dict, dict]:
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").exists():
        state_dict = _load_file(folder / "model.safetensors")
    elif index.exists():
        state_dict = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state_dict.update(_load_file(folder / shard))
    elif (folder / "pytorch_model.bin").exists():
        state_dict = _load_file(folder / "pytorch_model.bin")
    else:
        raise CopyNCEError(f"{folder} has a config.json but no model.safetensors or pytorch_model.bin")
    return state_dict, config


def _download_transformers_checkpoint(repo_id: str) -> tuple[dict, dict]:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    config_path = Path(hf_hub_download(repo_id, "config.json"))
    for name in ("model.safetensors", "pytorch_model.bin"):
        try:
            hf_hub_download(repo_id, name)
            return _load_transformers_folder(config_path.parent)
        except EntryNotFoundError:
            continue
    raise CopyNCEError(f"Hub repository {repo_id} has neither model.safetensors nor pytorch_model.bin")


def read_dino_source(source, checkpoint_key: str = "teacher") -> tuple[dict, dict | None, str]:
    """Read a DINO source (see the module docstring).

    Returns:
        ``(state_dict, vit_config, description)``: tensors with wrapper prefixes removed, the
        ``config.json`` dict of a transformers checkpoint (None for a ``.pth`` or a dict), and
        a description for reports.
    """
    if isinstance(source, dict):
        return _unwrap(source, checkpoint_key), None, "state dict"
    path = Path(os.fspath(source))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise CopyNCEError(f"{path} is a folder without config.json: not a transformers checkpoint")
        state_dict, config = _load_transformers_folder(path)
        return _unwrap(state_dict, checkpoint_key), config, str(path)
    if path.is_file():
        return _unwrap(_load_file(path), checkpoint_key), None, str(path)
    if path.suffix in (".pth", ".pt", ".bin", ".safetensors") or path.is_absolute() or str(source).startswith("."):
        raise CopyNCEError(f"DINO checkpoint {source} not found")
    state_dict, config = _download_transformers_checkpoint(str(source))
    return _unwrap(state_dict, checkpoint_key), config, str(source)


def canonical_dino_state_dict(state_dict: dict) -> tuple[dict, list[str]]:
    """Bring DINO or transformers ViT keys to the DINO layout (q, k, v fused into ``qkv``).

    Returns:
        ``(canonical, unused)``: the canonical tensors and the source keys that matched no
        ViT parameter (or an incomplete q/k/v triple).
    """
    canonical, unused = {}, []
    qkv_parts: dict[tuple[int, str], dict[int, tuple[str, torch.Tensor]]] = {}
    for key, value in state_dict.items():
        if key in _TOP_LEVEL:
            canonical[_TOP_LEVEL[key]] = value
            continue
        if _DINO_BLOCK.match(key):
            canonical[key] = value
            continue
        match = _HF_BLOCK.match(key)
        if match:
            index, part, kind = int(match.group(1)), match.group(2), match.group(3)
            if part in _BLOCK_PARTS:
                canonical[f"blocks.{index}.{_BLOCK_PARTS[part]}.{kind}"] = value
                continue
            if part in _QKV_PARTS:
                qkv_parts.setdefault((index, kind), {})[_QKV_PARTS[part]] = (key, value)
                continue
        unused.append(key)
    for (index, kind), parts in qkv_parts.items():
        if sorted(parts) == [0, 1, 2]:
            canonical[f"blocks.{index}.attn.qkv.{kind}"] = torch.cat([parts[i][1] for i in range(3)], dim=0)
        else:
            unused.extend(name for name, _ in parts.values())
    return canonical, sorted(unused)


def infer_vit_config(canonical: dict) -> dict:
    """ViT hyper-parameters from the tensor shapes of a canonical DINO state dict.

    The number of heads is not stored in the weights; DINO's ViTs use 64 channels per head
    (ViT-S: 6, ViT-B: 12), which is assumed here; pass ``num_attention_heads`` to override.
    """
    required = ("cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.mlp.fc1.weight")
    absent = [key for key in required if key not in canonical]
    if absent:
        raise CopyNCEError(f"not a ViT state dict: keys {absent} are missing")
    hidden_size = canonical["cls_token"].shape[-1]
    patch_weight = canonical["patch_embed.proj.weight"]
    patch_size = patch_weight.shape[-1]
    num_positions = canonical["pos_embed"].shape[1] - 1
    grid = int(round(math.sqrt(num_positions)))
    if grid * grid != num_positions:
        raise CopyNCEError(f"pos_embed holds {num_positions} patch positions, not a square grid")
    layers = {int(match.group(1)) for key in canonical if (match := _DINO_BLOCK.match(key))}
    return {
        "hidden_size": hidden_size,
        "num_hidden_layers": max(layers) + 1,
        "num_attention_heads": max(hidden_size // 64, 1),
        "intermediate_size": canonical["blocks.0.mlp.fc1.weight"].shape[0],
        "patch_size": patch_size,
        "num_channels": patch_weight.shape[1],
        "image_size": grid * patch_size,
        "qkv_bias": "blocks.0.attn.qkv.bias" in canonical,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu",
    }


def _targets(model, canonical: dict) -> tuple[dict, set]:
    """Model key -> tensor, and the canonical keys used."""
    targets, used = {}, set()

    def take(model_key: str, canonical_key: str) -> None:
        if canonical_key in canonical:
            targets[model_key] = canonical[canonical_key]
            used.add(canonical_key)

    take("embeddings.cls_token", "cls_token")
    take("embeddings.position_embeddings", "pos_embed")
    for kind in ("weight", "bias"):
        take(f"embeddings.patch_embeddings.projection.{kind}", f"patch_embed.proj.{kind}")
        take(f"norm.{kind}", f"norm.{kind}")
    if hasattr(model, "blocks"):
        block_names = [f"blocks.{index}" for index in range(len(model.blocks))]
    else:
        block_names = [f"encoder_blocks.{index}" for index in range(len(model.encoder_blocks))]
        block_names += [f"fusion_blocks.{index}" for index in range(len(model.fusion_blocks))]
    for index, name in enumerate(block_names):
        for part in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            for kind in ("weight", "bias"):
                take(f"{name}.{part}.{kind}", f"blocks.{index}.{part}.{kind}")
    if hasattr(model, "fusion_cls_token") and "cls_token" in canonical and "pos_embed" in canonical:
        # The fusion CLS starts as DINO's CLS token at its position (what block 1 of DINO sees).
        targets["fusion_cls_token"] = canonical["cls_token"] + canonical["pos_embed"][:, :1]
    return targets, used


def load_dino_weights(model, canonical: dict, source: str = "state dict") -> DinoLoadReport:
    """Copy canonical DINO tensors into a CopyNCE model (position embeddings resized if needed)."""
    report = DinoLoadReport(source=source)
    grid = model.config.image_size // model.config.patch_size
    if "pos_embed" in canonical:
        source_grid = int(round(math.sqrt(canonical["pos_embed"].shape[1] - 1)))
        if source_grid != grid:
            canonical = dict(canonical)
            canonical["pos_embed"] = interpolate_position_embeddings(canonical["pos_embed"], (grid, grid))
            report.interpolated = (source_grid, grid)
    targets, used = _targets(model, canonical)
    own = model.state_dict()
    for key, value in targets.items():
        if own[key].shape != value.shape:
            raise CopyNCEError(f"DINO weight for {key} has shape {tuple(value.shape)} but the model expects "
                               f"{tuple(own[key].shape)}: check hidden_size / intermediate_size / patch_size")
    result = model.load_state_dict({key: value.to(own[key].dtype) for key, value in targets.items()}, strict=False)
    report.loaded = sorted(targets)
    report.missing = sorted(key for key in result.missing_keys if key.startswith(_BACKBONE_PREFIXES))
    report.initialised = sorted(key for key in result.missing_keys if not key.startswith(_BACKBONE_PREFIXES))
    report.unexpected = sorted(set(canonical) - used)
    return report


def build_from_dino(model_class, source, config=None, strict: bool = False, checkpoint_key: str = "teacher",
                    **overrides):
    """Implementation of ``CopyNCEDescriptorModel.from_dino`` / ``CopyNCEMatcherModel.from_dino``."""
    state_dict, source_config, description = read_dino_source(source, checkpoint_key)
    canonical, unused = canonical_dino_state_dict(state_dict)
    if config is None:
        if source_config is not None:
            architecture = {key: source_config[key] for key in VIT_CONFIG_KEYS if key in source_config}
        else:
            architecture = infer_vit_config(canonical)
        config = model_class.config_class(**{**architecture, **overrides})
    elif overrides:
        config = model_class.config_class(**{**config.to_dict(), **overrides})
    model = model_class(config)
    report = load_dino_weights(model, canonical, description)
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
