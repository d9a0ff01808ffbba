"""CopyNCE descriptor and matcher: Vision Transformers with the paper's objectives in ``forward``.

Paper: "CopyNCE" (ICCV 2025), supplementary "More about Model Arch":

* descriptor: ViT; CLS token -> linear (no bias) -> batch norm -> L2 normalisation gives the
  descriptor; loss ``InfoNCE + KoLeo`` (baseline) ``+ w_NCE * CopyNCE`` on the last layer's
  patch tokens;
* matcher: the first ``num_hidden_layers - num_fusion_layers`` blocks encode query and
  reference with shared weights; the remaining blocks fuse ``[CLS; query patches; reference
  patches]``; a linear head on the fused CLS gives a copy logit; loss ``BCE + w_NCE *
  CopyNCE`` on the fused patch tokens of positive pairs.

The ViT is written here (pre-norm blocks with a fused ``qkv`` projection, final LayerNorm, as
DINO's ``vision_transformer.py``), so that parameter names do not depend on the installed
``transformers`` version and DINO weights load exactly (see :mod:`convert_dino`).

This file is copied into saved model folders (Hub custom code): it imports only
``torch``, ``transformers`` and its sibling modules.
"""

from __future__ import annotations

import inspect
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput, logging

from .configuration_copynce import CopyNCEDescriptorConfig, CopyNCEMatcherConfig
from .losses_copynce import (
    CopyNCEError,
    copy_bce_loss,
    copynce_loss,
    info_nce_loss,
    koleo_loss,
    paired_koleo_loss,
)

try:  # transformers >= 5: initialisers that leave weights loaded from a checkpoint untouched
    from transformers import initialization as init
except ImportError:  # older transformers
    from torch.nn import init

logger = logging.get_logger(__name__)

__all__ = [
    "CopyNCEDescriptorModel",
    "CopyNCEDescriptorOutput",
    "CopyNCEMatcherModel",
    "CopyNCEMatcherOutput",
    "CopyNCEPreTrainedModel",
    "interpolate_position_embeddings",
]

#: Name of the losses module inside a saved model folder (see ``_bundle_losses``).
LOSSES_MODULE_FILE = "losses_copynce.py"


def interpolate_position_embeddings(position_embeddings: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Resize ViT position embeddings to another patch grid (bicubic over the grid, as DINO).

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
        raise CopyNCEError(f"position embeddings of {num_positions} patches are not a square grid")
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


class CopyNCEPatchEmbeddings(nn.Module):
    """Non-overlapping ``patch_size`` convolution: (B, 3, H, W) -> (B, H/p * W/p, C), row-major."""

    def __init__(self, config):
        super().__init__()
        self.patch_size = config.patch_size
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.projection(pixel_values).flatten(2).transpose(1, 2)


class CopyNCEEmbeddings(nn.Module):
    """CLS token, patch embeddings and learned position embeddings (interpolated for other sizes)."""

    def __init__(self, config):
        super().__init__()
        self.patch_size = config.patch_size
        self.num_channels = config.num_channels
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.patch_embeddings = CopyNCEPatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(torch.zeros(1, config.num_patches + 1, config.hidden_size))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool | None = None) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 1 + L, C) with ``L = (H / p) * (W / p)``.

        ``interpolate_pos_encoding``: None (default) interpolates the position embeddings
        whenever the patch grid differs from the configured one, as DINO does; False refuses
        other sizes; True always goes through the interpolation.
        """
        if pixel_values.dim() != 4 or pixel_values.shape[1] != self.num_channels:
            raise CopyNCEError(
                f"pixel_values must be (B, {self.num_channels}, H, W), got {tuple(pixel_values.shape)}"
            )
        height, width = pixel_values.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise CopyNCEError(
                f"pixel_values of size {height}x{width} are not a multiple of patch_size={self.patch_size}"
            )
        grid = (height // self.patch_size, width // self.patch_size)
        num_positions = self.position_embeddings.shape[1] - 1
        if grid[0] * grid[1] != num_positions or grid[0] != grid[1] or interpolate_pos_encoding:
            if interpolate_pos_encoding is False:
                side = int(round(math.sqrt(num_positions))) * self.patch_size
                raise CopyNCEError(
                    f"input size {height}x{width} differs from the model's {side}x{side}; "
                    "pass interpolate_pos_encoding=None or True to interpolate the position embeddings"
                )
            positions = interpolate_position_embeddings(self.position_embeddings, grid)
        else:
            positions = self.position_embeddings
        tokens = self.patch_embeddings(pixel_values.to(self.patch_embeddings.projection.weight.dtype))
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        return self.dropout(tokens + positions)


class CopyNCEAttention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection (DINO layout)."""

    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N, C)."""
        batch, length, channels = hidden_states.shape
        qkv = self.qkv(hidden_states).reshape(batch, length, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, head_dim)
        attended = F.scaled_dot_product_attention(
            query, key, value, dropout_p=self.attention_dropout if self.training else 0.0
        )
        return self.proj(attended.transpose(1, 2).reshape(batch, length, channels))


class CopyNCEMLP(nn.Module):
    """Two-layer MLP of a transformer block: C -> intermediate_size -> C."""

    def __init__(self, config):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(hidden_states)))


class CopyNCELayer(GradientCheckpointingLayer):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, config):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = CopyNCEAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CopyNCEMLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N, C)."""
        hidden_states = hidden_states + self.dropout(self.attn(self.norm1(hidden_states)))
        return hidden_states + self.dropout(self.mlp(self.norm2(hidden_states)))


class CopyNCEDescriptorHead(nn.Module):
    """Descriptor head on the CLS token: linear (no bias) -> BatchNorm1d -> L2 normalisation.

    In eval mode batch norm uses its running statistics, so any batch size (also 1) works.
    """

    def __init__(self, config):
        super().__init__()
        self.projection = nn.Linear(config.hidden_size, config.descriptor_dim, bias=False)
        self.batch_norm = nn.BatchNorm1d(config.descriptor_dim)

    def forward(self, cls_tokens: torch.Tensor) -> torch.Tensor:
        """(B, C) -> (B, D), unit L2 norm."""
        return F.normalize(self.batch_norm(self.projection(cls_tokens)), dim=-1)


@dataclass
class CopyNCEDescriptorOutput(ModelOutput):
    """Output of :class:`CopyNCEDescriptorModel`.

    Attributes:
        loss: scalar, ``infonce_weight * InfoNCE + koleo_weight * KoLeo + copynce_weight *
            CopyNCE``, when ``reference_pixel_values`` is given.
        descriptors: (B, D) unit-norm descriptors of ``pixel_values``.
        patch_tokens: (B, L, C) patch tokens of the layer CopyNCE supervises (``copynce_layer``).
        last_hidden_state: (B, 1 + L, C) output of the final LayerNorm (CLS first).
        reference_descriptors: (B, D) for ``reference_pixel_values``.
        reference_patch_tokens: (B, Lr, C) for ``reference_pixel_values``.
        infonce_loss, koleo_loss, copynce_loss: the unweighted parts of ``loss`` (CopyNCE only
            when the overlap priors were given and ``copynce_weight > 0``).
        hidden_states: with ``output_hidden_states``, the embeddings and every block's output
            for ``pixel_values``, each (B, 1 + L, C).
    """

    loss: torch.FloatTensor | None = None
    descriptors: torch.FloatTensor | None = None
    patch_tokens: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    reference_descriptors: torch.FloatTensor | None = None
    reference_patch_tokens: torch.FloatTensor | None = None
    infonce_loss: torch.FloatTensor | None = None
    koleo_loss: torch.FloatTensor | None = None
    copynce_loss: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CopyNCEMatcherOutput(ModelOutput):
    """Output of :class:`CopyNCEMatcherModel`.

    Attributes:
        loss: scalar, ``bce_weight * BCE + copynce_weight * CopyNCE`` (BCE when ``labels`` are
            given, CopyNCE when the overlap priors are given and ``copynce_weight > 0``).
        logits: (B,) copy logits; ``sigmoid(logits)`` is the copy probability.
        query_patch_tokens: (B, Lq, C) fused query patch tokens (after the final LayerNorm).
        reference_patch_tokens: (B, Lr, C) fused reference patch tokens.
        bce_loss, copynce_loss: the unweighted parts of ``loss``.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    query_patch_tokens: torch.FloatTensor | None = None
    reference_patch_tokens: torch.FloatTensor | None = None
    bce_loss: torch.FloatTensor | None = None
    copynce_loss: torch.FloatTensor | None = None


def _bundle_losses(folder: str | Path) -> list[Path]:
    """Write the real loss code into a saved model folder as ``losses_copynce.py``.

    ``transformers`` copies ``modeling_copynce.py`` and its relative imports into the folder;
    inside the package, ``losses_copynce.py`` only re-exports ``copynce_hf.losses``. This
    replaces that copy by the file that defines the loss functions (``copynce_hf/losses.py``,
    or the folder's own copy when the model was itself loaded from a folder), and copies the
    files that one imports relatively (``errors.py``), so the folder runs without copynce_hf.
    """
    folder = Path(folder)
    source = Path(inspect.getsourcefile(copynce_loss)).resolve()
    written = []
    for origin, name in [(source, LOSSES_MODULE_FILE)] + [
        (Path(path).resolve(), Path(path).name) for path in get_relative_import_files(source)
    ]:
        target = folder / name
        if not target.exists() or origin != target.resolve():
            shutil.copyfile(origin, target)
        written.append(target)
    return written


class CopyNCEPreTrainedModel(PreTrainedModel):
    """Weight initialisation, saving with Hub custom code, and DINO initialisation."""

    base_model_prefix = "copynce"
    main_input_name = "pixel_values"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CopyNCEEmbeddings", "CopyNCELayer"]

    def _init_weights(self, module: nn.Module) -> None:
        """Truncated-normal linear/conv weights (std ``initializer_range``), zero biases,
        unit norms; model-specific parameters in the subclasses' ``_init_extra``."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm1d)):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            if isinstance(module, nn.BatchNorm1d):
                init.zeros_(module.running_mean)
                init.ones_(module.running_var)
        elif isinstance(module, CopyNCEEmbeddings):
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
        elif module is self:
            self._init_extra()

    def _init_extra(self) -> None:
        """Initialise parameters owned directly by the model (overridden by subclasses)."""

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """``PreTrainedModel.save_pretrained``, plus the loss code for Hub custom code.

        When the class is registered for an auto class (``import copynce_hf`` does it), the
        folder receives ``auto_map`` and the modelling code; the loss code is then bundled
        (see ``_bundle_losses``) so that ``AutoModel.from_pretrained(folder,
        trust_remote_code=True)`` works without copynce_hf. With ``push_to_hub=True`` the
        folder is uploaded with :meth:`push_to_hub` after it is complete (``repo_id``,
        ``commit_message``, ``token``, ``private`` and ``create_pr`` are passed on).
        """
        hub_kwargs = {key: kwargs.pop(key) for key in ("repo_id", "commit_message", "token", "private",
                                                       "create_pr") if key in kwargs}
        result = super().save_pretrained(save_directory, *args, **kwargs)
        is_main_process = kwargs.get("is_main_process", args[0] if args else True)
        if is_main_process and self._auto_class is not None:
            _bundle_losses(save_directory)
        if push_to_hub and is_main_process:
            repo_id = hub_kwargs.pop("repo_id", Path(save_directory).name)
            self.push_to_hub(repo_id, **hub_kwargs)
        return result

    @classmethod
    def from_dino(cls, source, config=None, strict: bool = False, checkpoint_key: str = "teacher", **overrides):
        """Build this model with its ViT initialised from DINO weights.

        Args:
            source: a ``transformers`` ViT checkpoint (folder or Hub id such as
                ``facebook/dino-vits16``), an original DINO ``.pth`` file, or an already loaded
                state dict / checkpoint dict.
            config: the target configuration; by default the architecture is read from the
                source (its config.json, or the tensor shapes of a ``.pth``).
            strict: raise :class:`CopyNCEError` when backbone keys are missing from the source
                or the source has keys that were not used.
            checkpoint_key: entry of a DINO training checkpoint to read ("teacher", as DINO's
                evaluation scripts, or "student").
            **overrides: configuration values replacing the defaults or the source's ones, e.g.
                ``image_size=336`` (position embeddings are interpolated), ``descriptor_dim=256``
                or ``num_fusion_layers=4``.

        Returns:
            The model; its ``dino_load_report`` attribute lists the loaded, missing,
            unexpected and newly initialised keys (also logged).
        """
        from .convert_dino import build_from_dino

        return build_from_dino(cls, source, config=config, strict=strict, checkpoint_key=checkpoint_key,
                               **overrides)

    def set_image_size(self, image_size: int) -> None:
        """Change the configured input size, interpolating the position embeddings (e.g. 224 -> 336)."""
        if image_size % self.config.patch_size:
            raise CopyNCEError(f"image_size={image_size} is not a multiple of patch_size={self.config.patch_size}")
        grid = image_size // self.config.patch_size
        embeddings = self.embeddings
        with torch.no_grad():
            resized = interpolate_position_embeddings(embeddings.position_embeddings.data, (grid, grid))
        embeddings.position_embeddings = nn.Parameter(resized.contiguous())
        self.config.image_size = image_size


class CopyNCEDescriptorModel(CopyNCEPreTrainedModel):
    """CopyNCE descriptor: ViT encoder and a (linear, batch norm, L2) head on the CLS token.

    ``model(pixel_values).descriptors`` are unit-norm (B, D) descriptors; the cosine similarity
    of two descriptors is the copy score. Given copy pairs (``reference_pixel_values``) the
    forward also computes the training loss of the paper (section "Overall Objective",
    supplementary "All detailed settings"):

    ``loss = infonce_weight * InfoNCE(q, r) + koleo_weight * KoLeo + copynce_weight * CopyNCE``

    * InfoNCE (symmetric) between the query and reference descriptors, row ``b`` of each being
      the copy pair and every other row a negative, with the learnable log-scale
      ``logit_scale`` (initialised at ``logit_scale_init`` = 3.2);
    * KoLeo computed on the query descriptors and on the reference descriptors separately and
      averaged (each set holds one view per image, so a descriptor's nearest neighbour is
      another image, never its own copy); it needs B >= 2 and is 0 for a single pair;
    * CopyNCE (paper eq. "CopyNCE") on the patch tokens of ``copynce_layer`` with the PixTrace
      overlap priors ``overlap_qr`` (B, Lq, Lr) and ``overlap_rq`` (B, Lr, Lq), over the
      pairs selected by ``pair_mask`` (and ``labels == 1`` when labels are given).
    """

    config_class = CopyNCEDescriptorConfig

    def __init__(self, config: CopyNCEDescriptorConfig):
        super().__init__(config)
        self.embeddings = CopyNCEEmbeddings(config)
        self.blocks = nn.ModuleList([CopyNCELayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.head = CopyNCEDescriptorHead(config)
        # Learnable log of InfoNCE's inverse temperature (CLIP-style), initialised at 3.2.
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init)))
        self.post_init()

    def _init_extra(self) -> None:
        init.constant_(self.logit_scale, float(self.config.logit_scale_init))

    def encode(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool | None = None,
        output_hidden_states: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Run the ViT.

        Returns:
            ``(last_hidden_state, copynce_tokens, hidden_states)``: (B, 1 + L, C) after the
            final LayerNorm; (B, L, C) patch tokens of ``copynce_layer`` (the normed last
            layer for -1, otherwise that block's raw output); the embeddings and each block's
            output when ``output_hidden_states``, else None.
        """
        hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        all_states = [hidden_states] if output_hidden_states else None
        copynce_block = self.config.copynce_block_index
        copynce_tokens = None
        for index, block in enumerate(self.blocks):
            hidden_states = block(hidden_states)
            if all_states is not None:
                all_states.append(hidden_states)
            if index == copynce_block:
                copynce_tokens = hidden_states[:, 1:]
        last_hidden_state = self.norm(hidden_states)
        if copynce_block == len(self.blocks) - 1:
            copynce_tokens = last_hidden_state[:, 1:]
        return last_hidden_state, copynce_tokens, tuple(all_states) if all_states is not None else None

    def get_image_features(self, pixel_values: torch.Tensor, **kwargs) -> torch.Tensor:
        """(B, 3, H, W) -> (B, D) unit-norm descriptors."""
        last_hidden_state, _, _ = self.encode(pixel_values, **kwargs)
        return self.head(last_hidden_state[:, 0])

    def forward(
        self,
        pixel_values: torch.Tensor,
        reference_pixel_values: torch.Tensor | None = None,
        overlap_qr: torch.Tensor | None = None,
        overlap_rq: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        pair_mask: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CopyNCEDescriptorOutput | tuple:
        """Describe images; with reference images, also compute the training loss.

        Args:
            pixel_values: (B, 3, H, W) queries, normalised as :class:`CopyNCEImageProcessor` does.
            reference_pixel_values: (B, 3, H', W') references; row ``b`` is a copy pair of query ``b``.
            overlap_qr: (B, Lq, Lr) PixTrace prior, query patch -> reference patch.
            overlap_rq: (B, Lr, Lq) PixTrace prior, reference patch -> query patch.
            labels: (B,) optional; the descriptor trains on copy pairs only, so every label
                must be 1 (a 0 raises CopyNCEError); also used to mask CopyNCE.
            pair_mask: (B,) bool, pairs whose priors are valid for CopyNCE.
            output_hidden_states: also return every block's output for ``pixel_values``.
            interpolate_pos_encoding: see :class:`CopyNCEEmbeddings` (default: automatic).
            return_dict: return a tuple instead when False.
            kwargs: other batch keys are ignored.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        output_hidden_states = bool(output_hidden_states)
        batch = pixel_values.shape[0]
        pair_mode = reference_pixel_values is not None
        if pair_mode and reference_pixel_values.shape[0] != batch:
            raise CopyNCEError(
                f"pixel_values has {batch} images but reference_pixel_values has {reference_pixel_values.shape[0]}"
            )
        if pair_mode and reference_pixel_values.shape[1:] == pixel_values.shape[1:] and not output_hidden_states:
            # One pass over queries and references together (batch norm sees all 2B descriptors).
            last, tokens, _ = self.encode(torch.cat([pixel_values, reference_pixel_values]), interpolate_pos_encoding)
            descriptors_all = self.head(last[:, 0])
            descriptors, reference_descriptors = descriptors_all[:batch], descriptors_all[batch:]
            last_hidden_state = last[:batch]
            patch_tokens, reference_patch_tokens = tokens[:batch], tokens[batch:]
            hidden_states = None
        else:
            last_hidden_state, patch_tokens, hidden_states = self.encode(
                pixel_values, interpolate_pos_encoding, output_hidden_states
            )
            descriptors = self.head(last_hidden_state[:, 0])
            reference_descriptors = reference_patch_tokens = None
            if pair_mode:
                reference_last, reference_patch_tokens, _ = self.encode(
                    reference_pixel_values, interpolate_pos_encoding
                )
                reference_descriptors = self.head(reference_last[:, 0])

        loss = infonce = koleo = copynce = None
        if pair_mode:
            if labels is not None and bool((labels.reshape(-1) != 1).any()):
                raise CopyNCEError(
                    "the descriptor trains on copy pairs only (InfoNCE takes row b of the references as the "
                    "positive of query b), but labels contain non-copy pairs; use the matcher for labelled pairs"
                )
            infonce = info_nce_loss(descriptors, reference_descriptors, self.logit_scale,
                                    negatives=self.config.infonce_negatives)
            if self.config.koleo_scope == "all_embeddings":
                koleo = paired_koleo_loss(descriptors, reference_descriptors)
            elif batch >= 2:
                koleo = 0.5 * (koleo_loss(descriptors) + koleo_loss(reference_descriptors))
            else:
                koleo = descriptors.sum() * 0.0
            loss = self.config.infonce_weight * infonce + self.config.koleo_weight * koleo
            copynce = _configured_copynce(self.config, patch_tokens, reference_patch_tokens, overlap_qr, overlap_rq,
                                          pair_mask, labels)
            if copynce is not None:
                loss = loss + self.config.copynce_weight * copynce

        output = CopyNCEDescriptorOutput(
            loss=loss,
            descriptors=descriptors,
            patch_tokens=patch_tokens,
            last_hidden_state=last_hidden_state,
            reference_descriptors=reference_descriptors,
            reference_patch_tokens=reference_patch_tokens,
            infonce_loss=infonce,
            koleo_loss=koleo,
            copynce_loss=copynce,
            hidden_states=hidden_states,
        )
        return output if return_dict else output.to_tuple()


def _configured_copynce(config, query_tokens, reference_tokens, overlap_qr, overlap_rq, pair_mask, labels):
    """The CopyNCE loss with the model's settings (tau, gamma, weighting), or None when it is off.

    It is off without both overlap priors or with ``copynce_weight`` 0. Tokens are (B, L, C), priors
    (B, L, L); only the pairs :func:`_pair_selection` keeps (masked in, positive) count.
    """
    if overlap_qr is None or overlap_rq is None or not config.copynce_weight > 0:
        return None
    return copynce_loss(
        query_tokens,
        reference_tokens,
        overlap_qr,
        overlap_rq,
        temperature=config.copynce_temperature,
        gamma=config.copynce_gamma,
        weighting=config.copynce_weighting,
        average=getattr(config, "copynce_average", "overlap_pairs"),  # configs saved before the option
        pair_mask=_pair_selection(pair_mask, labels, query_tokens.shape[0], query_tokens.device),
    )


def _pair_selection(
    pair_mask: torch.Tensor | None, labels: torch.Tensor | None, batch: int, device: torch.device
) -> torch.Tensor | None:
    """(B,) bool: pairs allowed in CopyNCE, ``pair_mask & (labels == 1)``; None when neither is given."""
    selection = None
    if pair_mask is not None:
        selection = pair_mask.reshape(batch).to(device=device, dtype=torch.bool)
    if labels is not None:
        positive = labels.reshape(batch).to(device) == 1
        selection = positive if selection is None else selection & positive
    return selection


class CopyNCEMatcherModel(CopyNCEPreTrainedModel):
    """CopyNCE matcher: shared ViT encoder, fusion blocks, and a copy logit per image pair.

    Query and reference each pass through the first ``num_hidden_layers - num_fusion_layers``
    blocks (shared weights; each image keeps its own CLS token there, as in the pretrained
    ViT, and it is dropped afterwards). The fusion sequence is ``[CLS; query patches +
    segment_0; reference patches + segment_1]``: a learnable fusion CLS token and a learnable
    segment embedding per image (zero at initialisation, so a DINO-initialised matcher starts
    from the pretrained blocks' behaviour) that tells the fusion blocks which image a token
    comes from. After the fusion blocks and the final LayerNorm, ``classifier`` maps the fused
    CLS to one logit.

    Loss (paper eq. "Overall Objective" for the matcher): ``bce_weight * BCE(logits, labels) +
    copynce_weight * CopyNCE`` on the fused patch tokens, CopyNCE only over positive pairs
    (``labels == 1``) selected by ``pair_mask``.
    """

    config_class = CopyNCEMatcherConfig

    def __init__(self, config: CopyNCEMatcherConfig):
        super().__init__(config)
        self.embeddings = CopyNCEEmbeddings(config)
        self.encoder_blocks = nn.ModuleList([CopyNCELayer(config) for _ in range(config.num_encoder_layers)])
        self.fusion_cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.segment_embeddings = nn.Parameter(torch.zeros(2, config.hidden_size))
        self.fusion_blocks = nn.ModuleList([CopyNCELayer(config) for _ in range(config.num_fusion_layers)])
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def _init_extra(self) -> None:
        init.trunc_normal_(self.fusion_cls_token, mean=0.0, std=self.config.initializer_range)
        init.zeros_(self.segment_embeddings)

    def encode(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool | None = None) -> torch.Tensor:
        """Shared encoder: (B, 3, H, W) -> (B, 1 + L, C), the last encoder block's output (CLS first)."""
        hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        for block in self.encoder_blocks:
            hidden_states = block(hidden_states)
        return hidden_states

    def fuse(self, query_tokens: torch.Tensor, reference_tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Fusion of encoded patch tokens (B, Lq, C) and (B, Lr, C).

        Returns:
            ``(logits (B,), query_patch_tokens (B, Lq, C), reference_patch_tokens (B, Lr, C))``.
        """
        batch, query_length = query_tokens.shape[:2]
        sequence = torch.cat(
            [
                self.fusion_cls_token.expand(batch, -1, -1),
                query_tokens + self.segment_embeddings[0],
                reference_tokens + self.segment_embeddings[1],
            ],
            dim=1,
        )
        for block in self.fusion_blocks:
            sequence = block(sequence)
        sequence = self.norm(sequence)
        logits = self.classifier(sequence[:, 0]).squeeze(-1)
        return logits, sequence[:, 1 : 1 + query_length], sequence[:, 1 + query_length :]

    def forward(
        self,
        pixel_values: torch.Tensor,
        reference_pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        overlap_qr: torch.Tensor | None = None,
        overlap_rq: torch.Tensor | None = None,
        pair_mask: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CopyNCEMatcherOutput | tuple:
        """Score image pairs; with labels and/or priors, also compute the training loss.

        Args:
            pixel_values: (B, 3, H, W) queries.
            reference_pixel_values: (B, 3, H', W') references.
            labels: (B,) 1 for a copy pair, 0 otherwise.
            overlap_qr: (B, Lq, Lr) and overlap_rq: (B, Lr, Lq): PixTrace priors (zero for negatives).
            pair_mask: (B,) bool, pairs whose priors are valid.
            interpolate_pos_encoding: see :class:`CopyNCEEmbeddings` (default: automatic).
            return_dict: return a tuple instead when False.
            kwargs: other batch keys are ignored.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        batch = pixel_values.shape[0]
        if reference_pixel_values is None or reference_pixel_values.shape[0] != batch:
            raise CopyNCEError("the matcher needs reference_pixel_values with as many images as pixel_values")
        if reference_pixel_values.shape[1:] == pixel_values.shape[1:]:
            encoded = self.encode(torch.cat([pixel_values, reference_pixel_values]), interpolate_pos_encoding)
            query_encoded, reference_encoded = encoded[:batch], encoded[batch:]
        else:
            query_encoded = self.encode(pixel_values, interpolate_pos_encoding)
            reference_encoded = self.encode(reference_pixel_values, interpolate_pos_encoding)
        # The per-image CLS tokens of the encoder are dropped; fusion has its own CLS.
        logits, query_patch_tokens, reference_patch_tokens = self.fuse(query_encoded[:, 1:], reference_encoded[:, 1:])

        loss = bce = copynce = None
        if labels is not None:
            bce = copy_bce_loss(logits, labels.reshape(batch))
            loss = self.config.bce_weight * bce
        copynce = _configured_copynce(self.config, query_patch_tokens, reference_patch_tokens, overlap_qr, overlap_rq,
                                      pair_mask, labels)
        if copynce is not None:
            weighted = self.config.copynce_weight * copynce
            loss = weighted if loss is None else loss + weighted

        output = CopyNCEMatcherOutput(
            loss=loss,
            logits=logits,
            query_patch_tokens=query_patch_tokens,
            reference_patch_tokens=reference_patch_tokens,
            bce_loss=bce,
            copynce_loss=copynce,
        )
        return output if return_dict else output.to_tuple()
