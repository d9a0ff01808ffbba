"""The authors' released CopyNCE checkpoints as ``transformers`` model folders.

The authors of CopyNCE (GitHub ``eddielyc/CopyNCE``) released two ViT-S/16 checkpoints at 224 px,
``descriptor_vits_224.pth.tar`` and ``matcher_vits_224.pth.tar``. Their training code saves
``{"model": state_dict, "epoch": int}`` (their ``Checkpointer``); the state dict names the parts
of their model:

* descriptor: ``encoder.*`` (a ViT without final LayerNorm), ``heads.linear_head.{fc1, bn}.*``
  (linear without bias, batch norm) and ``infonce_log_scale`` (InfoNCE's learnable log-scale);
* matcher: ``encoder.*`` (the per-image blocks), ``fusion.{cls_token, blocks.*, norm.*}``,
  ``heads.cls_head.{norm, classifier}.*`` and ``heads.fusion_head.norm.*``; a matcher trained with their
  ``train/matching/finetune.yaml`` (``fusion_head: null``) has no ``heads.fusion_head.*`` and no CopyNCE
  loss: it converts to a matcher without the patch-token LayerNorm (``patch_token_layer_norm=False``)
  and with ``copynce_weight=0``.

:func:`convert_authors_checkpoint` maps every tensor to :class:`CopyNCEDescriptorModel` /
:class:`CopyNCEMatcherModel` in the authors' architecture (the default configuration), refuses a
checkpoint with missing or unexpected tensors (naming them), and writes a folder that
``AutoModel.from_pretrained`` and ``AutoImageProcessor.from_pretrained`` load: safetensors
weights, the configuration with the authors' loss settings, an image processor equal to their
evaluation transform (bicubic resize to 224 x 224, ImageNet normalisation), the Hub custom code
and a model card that names the source checkpoint and cites the authors' reported results.
"""

from __future__ import annotations

import math
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .modeling import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)
from .modeling.errors import CopyNCEError

__all__ = [
    "AUTHORS_REPOSITORY",
    "RELEASES",
    "authors_config",
    "convert_authors_checkpoint",
    "convert_authors_state_dict",
    "read_authors_checkpoint",
]

AUTHORS_REPOSITORY = "https://github.com/eddielyc/CopyNCE"


@dataclass(frozen=True)
class Release:
    """One released checkpoint and the results its authors report for it (DISC21 dev, 224 px)."""

    filename: str
    micro_ap: float
    recall_at_p90: float


#: The authors' releases (their README, "Models"); the numbers are theirs, not measured here.
RELEASES = {
    "descriptor": Release("descriptor_vits_224.pth.tar", 0.705, 0.636),
    "matcher": Release("matcher_vits_224.pth.tar", 0.835, 0.754),
}

MODEL_TYPES = ("descriptor", "matcher")

#: The authors' loss settings (their ``*_default_config.yaml`` and loss code), kept in the converted
#: configuration so that fine-tuning a converted model trains as they did: their InfoNCE scale is
#: unbounded (``infonce_max_scale=None``) and their all-gather carries no gradient (``gather_gradients=False``).
_AUTHORS_OBJECTIVE = {
    "descriptor": {"copynce_weighting": "authors_code", "copynce_average": "all_pairs",
                   "infonce_negatives": "all_embeddings", "koleo_scope": "all_embeddings",
                   "infonce_max_scale": None, "gather_gradients": False},
    "matcher": {"copynce_weighting": "authors_code", "copynce_average": "all_pairs"},
}

#: The tensor of the authors' CopyNCE head (their ``heads.fusion_head``), absent from a finetuned matcher.
_FUSION_HEAD_NORM = "heads.fusion_head.norm.weight"

_BLOCK_PART = r"(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)"
_ENCODER_RENAMES = {
    "encoder.cls_token": "vit.embeddings.cls_token",
    "encoder.pos_embed": "vit.embeddings.position_embeddings",
    "encoder.patch_embed.proj.weight": "vit.embeddings.patch_embeddings.projection.weight",
    "encoder.patch_embed.proj.bias": "vit.embeddings.patch_embeddings.projection.bias",
}
_DESCRIPTOR_RENAMES = {
    "heads.linear_head.fc1.weight": "head.projection.weight",
    "infonce_log_scale": "logit_scale",
    **{f"heads.linear_head.bn.{name}": f"head.batch_norm.{name}"
       for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")},
}
_MATCHER_RENAMES = {
    "fusion.cls_token": "fusion_cls_token",
    "fusion.norm.weight": "vit.norm.weight",
    "fusion.norm.bias": "vit.norm.bias",
    "heads.cls_head.norm.weight": "classifier_norm.weight",
    "heads.cls_head.norm.bias": "classifier_norm.bias",
    "heads.cls_head.classifier.weight": "classifier.weight",
    "heads.cls_head.classifier.bias": "classifier.bias",
    "heads.fusion_head.norm.weight": "patch_token_norm.weight",
    "heads.fusion_head.norm.bias": "patch_token_norm.bias",
}


def _check_model_type(model_type: str) -> None:
    if model_type not in MODEL_TYPES:
        raise CopyNCEError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")


def read_authors_checkpoint(path: str | Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The state dict of an authors' checkpoint file, ``module.`` prefixes removed.

    The file is read with ``torch.load(weights_only=True)``; ``allow_pickle=True`` reads a file
    that holds other Python objects too (only for a file you trust). The state dict is the
    ``model`` entry of their ``Checkpointer`` format, else ``state_dict``, else the file itself.
    """
    path = Path(path)
    if not path.is_file():
        raise CopyNCEError(f"checkpoint {path} not found")
    with path.open("rb") as handle:
        if handle.read(2) not in (b"PK", b"\x80\x02"):  # torch.save's zip archive or its legacy pickle
            raise CopyNCEError(f"{path} is not a PyTorch checkpoint")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as error:
        raise CopyNCEError(f"{path} holds objects other than tensors and numbers ({str(error).splitlines()[0]}); "
                           "if you trust the file, read it with allow_pickle=True (--allow-pickle)") from error
    except (RuntimeError, EOFError, OSError) as error:
        raise CopyNCEError(f"{path} is not a PyTorch checkpoint: {error}") from error
    if not isinstance(checkpoint, dict):
        raise CopyNCEError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    for key in ("model", "state_dict"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    state_dict = {}
    for key, value in checkpoint.items():
        if not isinstance(value, torch.Tensor):
            raise CopyNCEError(f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor")
        state_dict[key.replace("module.", "")] = value  # DistributedDataParallel's prefix, as their loader
    return state_dict


def _blocks(state_dict: dict, prefix: str) -> int:
    indices = {int(match.group(1)) for key in state_dict if (match := re.match(rf"^{prefix}\.(\d+)\.", key))}
    return 1 + max(indices) if indices else 0


def _tensor(state_dict: dict, key: str) -> torch.Tensor:
    if key not in state_dict:
        raise CopyNCEError(f"the checkpoint lacks {key!r}, which every authors' {key.split('.')[0]} has")
    return state_dict[key]


def authors_config(state_dict: dict[str, torch.Tensor], model_type: str):
    """The configuration of the authors' model whose tensors are ``state_dict`` (shapes read from it).

    The head count is not stored in the weights; ViT-S/16's 64 channels per head are assumed, as in
    their configurations (ViT-S: 6 heads, ViT-B: 12).
    """
    _check_model_type(model_type)
    cls_token = _tensor(state_dict, "encoder.cls_token")
    patch = _tensor(state_dict, "encoder.patch_embed.proj.weight")
    positions = _tensor(state_dict, "encoder.pos_embed").shape[1] - 1
    grid = math.isqrt(positions)
    if grid * grid != positions:
        raise CopyNCEError(f"encoder.pos_embed holds {positions} patch positions, not a square grid")
    hidden_size = cls_token.shape[-1]
    encoder_blocks = _blocks(state_dict, "encoder.blocks")
    architecture = {
        "hidden_size": hidden_size,
        "num_attention_heads": max(hidden_size // 64, 1),
        "intermediate_size": _tensor(state_dict, "encoder.blocks.0.mlp.fc1.weight").shape[0],
        "patch_size": patch.shape[-1],
        "num_channels": patch.shape[1],
        "image_size": grid * patch.shape[-1],
        "qkv_bias": "encoder.blocks.0.attn.qkv.bias" in state_dict,
        **_AUTHORS_OBJECTIVE[model_type],
    }
    if model_type == "descriptor":
        return CopyNCEDescriptorConfig(
            num_hidden_layers=encoder_blocks,
            descriptor_dim=_tensor(state_dict, "heads.linear_head.fc1.weight").shape[0], **architecture)
    fusion_blocks = _blocks(state_dict, "fusion.blocks")
    if fusion_blocks == 0:
        raise CopyNCEError("the checkpoint has no fusion.blocks.*: not an authors' matcher")
    if _FUSION_HEAD_NORM not in state_dict:  # ``fusion_head: null`` (their finetune.yaml): no CopyNCE head, no CopyNCE
        architecture.update(patch_token_layer_norm=False, copynce_weight=0.0)
    return CopyNCEMatcherConfig(num_hidden_layers=encoder_blocks + fusion_blocks, num_fusion_layers=fusion_blocks,
                                **architecture)


def _renamed(key: str, model_type: str, encoder_blocks: int) -> str | None:
    """Our name of the authors' tensor ``key``, or None when it has no place in our model."""
    if key in _ENCODER_RENAMES:
        return _ENCODER_RENAMES[key]
    if match := re.fullmatch(rf"encoder\.blocks\.(\d+)\.{_BLOCK_PART}", key):
        return f"vit.blocks.{match.group(1)}.{match.group(2)}.{match.group(3)}"
    if model_type == "descriptor":
        return _DESCRIPTOR_RENAMES.get(key)
    if match := re.fullmatch(rf"fusion\.blocks\.(\d+)\.{_BLOCK_PART}", key):
        return f"vit.blocks.{encoder_blocks + int(match.group(1))}.{match.group(2)}.{match.group(3)}"
    return _MATCHER_RENAMES.get(key)


def convert_authors_state_dict(state_dict: dict[str, torch.Tensor], model_type: str, config=None):
    """The authors' descriptor or matcher as our model, every tensor mapped.

    Args:
        state_dict: from :func:`read_authors_checkpoint`.
        model_type: "descriptor" or "matcher".
        config: the target configuration; by default :func:`authors_config`.

    Returns:
        The model in eval mode, float32.

    Raises:
        CopyNCEError: naming the tensors of the checkpoint that have no place in the model
            (unexpected), the model's tensors the checkpoint lacks (missing), or a shape mismatch.
    """
    _check_model_type(model_type)
    config = config if config is not None else authors_config(state_dict, model_type)
    model = (CopyNCEDescriptorModel if model_type == "descriptor" else CopyNCEMatcherModel)(config)
    encoder_blocks = _blocks(state_dict, "encoder.blocks")
    own = model.state_dict()
    mapped, unexpected = {}, []
    for key, value in state_dict.items():
        name = _renamed(key, model_type, encoder_blocks)
        if name is None or name not in own:
            unexpected.append(key)
        else:
            mapped[name] = value.reshape(own[name].shape) if name == "logit_scale" else value
    missing = sorted(set(own) - set(mapped))
    if unexpected or missing:
        raise CopyNCEError(f"the checkpoint does not match the authors' {model_type}: unexpected tensors "
                           f"{sorted(unexpected)}, missing tensors {missing}")
    for name, value in mapped.items():
        if value.shape != own[name].shape:
            raise CopyNCEError(f"tensor for {name} has shape {tuple(value.shape)}, the model expects "
                               f"{tuple(own[name].shape)}")
    model.load_state_dict({name: value.to(own[name].dtype) for name, value in mapped.items()}, strict=True)
    return model.eval()


def _card(model, model_type: str, model_id: str, source: str):
    from .hub import build_model_card

    release = RELEASES[model_type]
    settings = {
        "Weights": f"converted from the authors' checkpoint `{source}` ({AUTHORS_REPOSITORY}), not retrained",
        "Results": "reported by the authors for their checkpoint (DISC21 dev, 224 px); not re-measured after "
                   "conversion",
        "Equality with the authors' code": "proven on seeded random weights (docs/FIDELITY.md of copynce_hf)",
    }
    results = {"dataset_name": "DISC21 dev", "dataset_split": "dev", "micro_ap": release.micro_ap,
               "recall_at_p90": release.recall_at_p90, "source_name": "CopyNCE authors' README",
               "source_url": AUTHORS_REPOSITORY}
    return build_model_card(model, model_id=model_id, results=results, training_settings=settings,
                            base_model=None, license="apache-2.0")


_LICENSE = """The weights in this folder were released by the authors of CopyNCE (Lu et al., ICCV 2025) with
their code, {repository}, under the Apache License, Version 2.0
(https://www.apache.org/licenses/LICENSE-2.0). This folder holds them converted to the layout of the
copynce_hf models (tensor names only; values unchanged: {source}). The copynce_hf code is Apache-2.0 too.
"""


def convert_authors_checkpoint(checkpoint: str | Path, model_type: str, output: str | Path,
                               push_to_hub: str | None = None, allow_pickle: bool = False,
                               model_id: str | None = None) -> Path:
    """Convert an authors' checkpoint file into a model folder (and optionally push it to the Hub).

    Args:
        checkpoint: ``descriptor_vits_224.pth.tar`` or ``matcher_vits_224.pth.tar`` (or a checkpoint
            of their training code in the same format).
        model_type: "descriptor" or "matcher".
        output: the folder to write (checked first: :func:`~copynce_hf.outputs.check_output_folder`).
        push_to_hub: a Hub repository id to upload the folder to.
        allow_pickle: see :func:`read_authors_checkpoint`.
        model_id: the name in the model card (default: ``push_to_hub`` or the folder name).

    Returns:
        The folder.
    """
    from .hub import save_for_hub
    from .outputs import check_output_folder

    check_output_folder(output)  # before the checkpoint is read
    state_dict = read_authors_checkpoint(checkpoint, allow_pickle=allow_pickle)
    model = convert_authors_state_dict(state_dict, model_type)
    size = model.config.image_size
    processor = CopyNCEImageProcessor(size={"height": size, "width": size})  # their evaluation transform
    output = Path(output)
    model_id = model_id or push_to_hub or output.resolve().name
    card = _card(model, model_type, model_id, Path(checkpoint).name)
    save_for_hub(model, output, image_processor=processor, card=card)
    (output / "LICENSE").write_text(_LICENSE.format(repository=AUTHORS_REPOSITORY, source=Path(checkpoint).name),
                                    encoding="utf-8")
    if push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(repo_id=push_to_hub, repo_type="model", exist_ok=True)
        api.upload_folder(repo_id=push_to_hub, repo_type="model", folder_path=str(output),
                          commit_message=f"Convert the authors' {Path(checkpoint).name}")
    return output
