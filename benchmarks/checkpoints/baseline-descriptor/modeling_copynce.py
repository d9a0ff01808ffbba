"""CopyNCE models: a ViT backbone and the descriptor and matcher heads around it.

Paper: "CopyNCE" (ICCV 2025), supplementary "More about Model Arch":

* backbone (:class:`CopyNCEViTModel`): DINO's ViT (pre-norm blocks with a fused ``qkv``
  projection, final LayerNorm), held by both heads under ``base_model_prefix`` (``vit``), as
  ``ViTForImageClassification`` holds ``ViTModel``;
* descriptor: CLS token -> linear (no bias) -> batch norm -> L2 normalisation gives the
  descriptor; loss ``InfoNCE + KoLeo`` (baseline) ``+ w_NCE * CopyNCE`` on the last layer's
  patch tokens;
* matcher: the first ``num_hidden_layers - num_fusion_layers`` backbone blocks encode query
  and reference with shared weights; the remaining blocks fuse ``[CLS; query CLS; query patches;
  reference CLS; reference patches]``; a linear head on the fused CLS gives a copy logit; loss
  ``BCE + w_NCE * CopyNCE`` on the fused patch tokens of positive pairs.

The configuration options of :mod:`.configuration_copynce` select between the authors' released
architecture (the default for new models: no final LayerNorm in the descriptor, extra LayerNorms
before the matcher's classifier and CopyNCE, per-image CLS tokens kept in the fused sequence,
batch norm per side) and the form of folders saved before these options existed.

Attention runs through ``transformers``' attention interface: "sdpa" (default) or "eager",
chosen with ``attn_implementation=``; ``output_attentions=True`` computes that forward with
the eager path, which returns the attention maps.

Like every module of this package, it imports its siblings relatively and otherwise only
``torch`` and ``transformers``: ``save_pretrained`` copies exactly these files into a model
folder, which then loads with ``trust_remote_code=True`` where copynce_hf is not installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput, logging

from .configuration_copynce import CopyNCEDescriptorConfig, CopyNCEMatcherConfig, CopyNCEViTConfig
from .convert_dino import build_from_dino, interpolate_position_embeddings
from .errors import ConfigError, ShapeError
from .losses_copynce import copy_bce_loss, copynce_loss, info_nce_loss, koleo_loss, paired_koleo_loss

try:  # a transformers 5 module (4.x has none): say which version is needed rather than "cannot import"
    from transformers import initialization as init  # leaves weights loaded from a checkpoint untouched
except ImportError as error:
    from .errors import transformers_too_old

    raise transformers_too_old(error) from error

logger = logging.get_logger(__name__)

__all__ = [
    "CopyNCEDescriptorModel",
    "CopyNCEDescriptorOutput",
    "CopyNCEMatcherModel",
    "CopyNCEMatcherOutput",
    "CopyNCEPreTrainedModel",
    "CopyNCEViTModel",
]


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
            raise ShapeError(
                f"pixel_values must be (B, {self.num_channels}, H, W), got {tuple(pixel_values.shape)}"
            )
        height, width = pixel_values.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ShapeError(
                f"pixel_values of size {height}x{width} are not a multiple of patch_size={self.patch_size}"
            )
        grid = (height // self.patch_size, width // self.patch_size)
        num_positions = self.position_embeddings.shape[1] - 1
        if grid[0] * grid[1] != num_positions or grid[0] != grid[1] or interpolate_pos_encoding:
            if interpolate_pos_encoding is False:
                side = int(round(math.sqrt(num_positions))) * self.patch_size
                raise ShapeError(
                    f"input size {height}x{width} differs from the model's {side}x{side}; "
                    "pass interpolate_pos_encoding=None or True to interpolate the position embeddings"
                )
            positions = interpolate_position_embeddings(self.position_embeddings, grid)
        else:
            positions = self.position_embeddings
        tokens = self.patch_embeddings(pixel_values.to(self.patch_embeddings.projection.weight.dtype))
        tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        return self.dropout(tokens + positions)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention written out (the "eager" backend).

    Args:
        query, key, value: (B, heads, N, head_dim).
        attention_mask: additive (B, 1, N, N) mask or None (ViT attends everywhere).

    Returns:
        ``(output (B, N, heads, head_dim), weights (B, heads, N, N))``.
    """
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class CopyNCEAttention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection (DINO layout)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_probs_dropout_prob

    def forward(self, hidden_states: torch.Tensor, output_attentions: bool = False):
        """(B, N, C) -> ``(output (B, N, C), weights (B, heads, N, N) or None)``.

        The backend is ``config._attn_implementation`` ("sdpa" or "eager"); with
        ``output_attentions`` the eager path runs, since SDPA does not return the weights.
        """
        batch, length, channels = hidden_states.shape
        qkv = self.qkv(hidden_states).reshape(batch, length, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, head_dim)
        implementation = self.config._attn_implementation
        if output_attentions or implementation in (None, "eager"):
            attention = eager_attention_forward
        else:  # the lookup transformers looks for before it lets set_attn_implementation switch backends
            attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        attended, weights = attention(
            self, query, key, value, None,
            dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling,
        )
        output = self.proj(attended.reshape(batch, length, channels))
        return output, (weights if output_attentions else None)

    def first_position(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, 1, C): :meth:`forward`'s output at position 0 alone (its query against every key and
        value), for a caller that reads only the first token (a classifier on the CLS token): the other positions'
        queries and outputs are not computed."""
        batch, length, channels = hidden_states.shape
        key_value = F.linear(hidden_states, self.qkv.weight[channels:],
                             None if self.qkv.bias is None else self.qkv.bias[channels:])
        key, value = key_value.reshape(batch, length, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        query = F.linear(hidden_states[:, :1], self.qkv.weight[:channels],
                         None if self.qkv.bias is None else self.qkv.bias[:channels])
        query = query.reshape(batch, 1, self.num_heads, self.head_dim).transpose(1, 2)  # (B, heads, 1, head_dim)
        implementation = self.config._attn_implementation
        attention = eager_attention_forward if implementation in (None, "eager") else \
            ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        attended, _ = attention(self, query, key, value, None, dropout=0.0, scaling=self.scaling)
        return self.proj(attended.reshape(batch, 1, channels))


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

    def forward(self, hidden_states: torch.Tensor, output_attentions: bool = False):
        """(B, N, C) -> ``((B, N, C), attention weights or None)``."""
        attended, weights = self.attn(self.norm1(hidden_states), output_attentions=output_attentions)
        hidden_states = hidden_states + self.dropout(attended)
        return hidden_states + self.dropout(self.mlp(self.norm2(hidden_states))), weights

    def first_position(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, C): the block's output at position 0 alone (see :meth:`CopyNCEAttention.first_position`;
        in eval mode equal to ``forward(hidden_states)[0][:, 0]``)."""
        first = hidden_states[:, :1] + self.dropout(self.attn.first_position(self.norm1(hidden_states)))
        return (first + self.dropout(self.mlp(self.norm2(first))))[:, 0]


class CopyNCEDescriptorHead(nn.Module):
    """Descriptor head on the CLS token: linear (no bias) -> BatchNorm1d -> L2 normalisation.

    In eval mode batch norm uses its running statistics, so any batch size (also 1) works; in
    training mode a call needs at least two rows (the batch statistics of one row are undefined).
    """

    def __init__(self, config):
        super().__init__()
        self.projection = nn.Linear(config.hidden_size, config.descriptor_dim, bias=False)
        self.batch_norm = nn.BatchNorm1d(config.descriptor_dim)

    def forward(self, cls_tokens: torch.Tensor) -> torch.Tensor:
        """(B, C) -> (B, D), unit L2 norm."""
        if self.training and cls_tokens.shape[0] < 2:
            raise ShapeError(
                "the descriptor head's batch norm needs at least 2 rows per call in training mode; with "
                "head_batch_norm='per_side' each side of a batch of copy pairs is one call, so train on "
                ">= 2 pairs per batch (or per process)"
            )
        return F.normalize(self.batch_norm(self.projection(cls_tokens)), dim=-1)


@dataclass
class CopyNCEDescriptorOutput(ModelOutput):
    """Output of :class:`CopyNCEDescriptorModel`.

    Attributes:
        loss: scalar, ``infonce_weight * InfoNCE + koleo_weight * KoLeo + copynce_weight *
            CopyNCE``, when ``reference_pixel_values`` is given.
        descriptors: (B, D) unit-norm descriptors of ``pixel_values``.
        patch_tokens: (B, L, C) patch tokens of the layer CopyNCE supervises (``copynce_layer``).
        last_hidden_state: (B, 1 + L, C) output of the backbone (after the final LayerNorm when
            ``final_layer_norm``; CLS first).
        reference_descriptors: (B, D) for ``reference_pixel_values``.
        reference_patch_tokens: (B, Lr, C) for ``reference_pixel_values``.
        infonce_loss, koleo_loss, copynce_loss: the unweighted parts of ``loss`` (CopyNCE only
            when the overlap priors were given and ``copynce_weight > 0``).
        hidden_states: with ``output_hidden_states``, the embeddings and every block's output
            for ``pixel_values``, each (B, 1 + L, C).
        attentions: with ``output_attentions``, every block's attention weights for
            ``pixel_values``, each (B, heads, 1 + L, 1 + L).
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
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CopyNCEMatcherOutput(ModelOutput):
    """Output of :class:`CopyNCEMatcherModel`.

    Attributes:
        loss: scalar, ``bce_weight * BCE + copynce_weight * CopyNCE`` (BCE when ``labels`` are
            given, CopyNCE when the overlap priors are given and ``copynce_weight > 0``).
        logits: (B,) copy logits; ``sigmoid(logits)`` is the copy probability.
        query_patch_tokens: (B, Lq, C) fused query patch tokens (after the final LayerNorm and
            ``patch_token_norm``), the tokens CopyNCE reads.
        reference_patch_tokens: (B, Lr, C) fused reference patch tokens.
        bce_loss, copynce_loss: the unweighted parts of ``loss``.
        hidden_states: with ``output_hidden_states``, the fusion input and each fusion block's
            output, each (B, N, C) with ``N = 1 + Lq + Lr`` (``3 + Lq + Lr`` with the per-image
            CLS tokens kept).
        attentions: with ``output_attentions``, each fusion block's attention weights, each
            (B, heads, N, N).
        encoder_hidden_states, encoder_attentions: the same for the per-image encoder blocks,
            run on the queries and the references stacked along the batch (2B, 1 + L, C) when
            both have one size (queries first); otherwise the query pass's entries followed by
            the reference pass's.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    query_patch_tokens: torch.FloatTensor | None = None
    reference_patch_tokens: torch.FloatTensor | None = None
    bce_loss: torch.FloatTensor | None = None
    copynce_loss: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    encoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_attentions: tuple[torch.FloatTensor, ...] | None = None


class CopyNCEPreTrainedModel(PreTrainedModel):
    """Weight initialisation, attention backends and DINO initialisation."""

    config_class = CopyNCEViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["CopyNCEEmbeddings", "CopyNCELayer"]
    _supports_sdpa = True

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

    def _output_options(self, output_attentions, output_hidden_states, return_dict) -> tuple[bool, bool, bool]:
        """The forward's output options, ``None`` meaning the config's value."""
        config = self.config
        return (bool(config.output_attentions if output_attentions is None else output_attentions),
                bool(config.output_hidden_states if output_hidden_states is None else output_hidden_states),
                bool(config.return_dict if return_dict is None else return_dict))

    @classmethod
    def from_dino(cls, source, config=None, strict: bool = False, checkpoint_key: str = "teacher", **overrides):
        """Build this model with its backbone initialised from DINO weights.

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
        return build_from_dino(cls, source, config=config, strict=strict, checkpoint_key=checkpoint_key,
                               **overrides)

    def with_synced_batch_norm(self, num_processes: int, device_type: str) -> CopyNCEPreTrainedModel:
        """This model with ``nn.SyncBatchNorm`` in place of its batch norms when ``config.sync_batch_norm``
        asks for it and training runs in several GPU processes (the authors convert their model so
        under DDP); otherwise the model unchanged. PyTorch synchronises batch norm on GPUs only, so
        several CPU processes keep per-process statistics (logged as a warning)."""
        if not getattr(self.config, "sync_batch_norm", False) or num_processes < 2:
            return self
        if device_type == "cpu":
            logger.warning("sync_batch_norm: SyncBatchNorm runs on GPUs only; the %d CPU processes keep "
                           "per-process batch-norm statistics", num_processes)
            return self
        return nn.SyncBatchNorm.convert_sync_batchnorm(self)

    def set_image_size(self, image_size: int) -> None:
        """Change the configured input size, interpolating the position embeddings (e.g. 224 -> 336)."""
        if image_size % self.config.patch_size:
            raise ConfigError(f"image_size={image_size} is not a multiple of patch_size={self.config.patch_size}")
        grid = image_size // self.config.patch_size
        embeddings = self.base_model.embeddings
        with torch.no_grad():
            resized = interpolate_position_embeddings(embeddings.position_embeddings.data, (grid, grid))
        embeddings.position_embeddings = nn.Parameter(resized.contiguous())
        self.config.image_size = image_size


class CopyNCEViTModel(CopyNCEPreTrainedModel):
    """The ViT backbone: embeddings, ``num_hidden_layers`` blocks and the final LayerNorm (an
    identity when ``config.final_layer_norm`` is False).

    ``model(pixel_values).last_hidden_state`` is (B, 1 + L, C) (CLS first, ``L = (H / p) * (W /
    p)`` patches in row-major order) and ``pooler_output`` the (B, C) CLS token. The descriptor
    and the matcher hold it as ``.vit``; the matcher runs its blocks in two parts with
    :meth:`run_blocks`.
    """

    def __init__(self, config: CopyNCEViTConfig):
        super().__init__(config)
        self.embeddings = CopyNCEEmbeddings(config)
        self.blocks = nn.ModuleList([CopyNCELayer(config) for _ in range(config.num_hidden_layers)])
        # The authors' descriptor has no final LayerNorm (``final_layer_norm=False``): no parameters.
        self.norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                     if getattr(config, "final_layer_norm", True) else nn.Identity())
        self.post_init()
        if getattr(config, "freeze_patch_embeddings", False):  # the authors' ``freeze_patch``
            self.embeddings.patch_embeddings.requires_grad_(False)

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def run_blocks(
        self,
        hidden_states: torch.Tensor,
        start: int = 0,
        stop: int | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        """Blocks ``start`` to ``stop - 1`` on (B, N, C) tokens.

        Returns:
            ``(hidden_states (B, N, C), states, attentions)``: the last block's output; with
            ``output_hidden_states`` the input and each block's output, with
            ``output_attentions`` each block's weights (B, heads, N, N); None otherwise.
        """
        states = (hidden_states,) if output_hidden_states else None
        attentions = () if output_attentions else None
        for block in self.blocks[start:stop]:
            hidden_states, weights = block(hidden_states, output_attentions=output_attentions)
            if states is not None:
                states += (hidden_states,)
            if attentions is not None:
                attentions += (weights,)
        return hidden_states, states, attentions

    def forward(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutputWithPooling | tuple:
        """(B, 3, H, W) -> ``last_hidden_state`` (B, 1 + L, C), ``pooler_output`` (B, C) (the CLS).

        Args:
            pixel_values: images normalised as :class:`CopyNCEImageProcessor` does.
            interpolate_pos_encoding: see :class:`CopyNCEEmbeddings` (default: automatic).
            output_attentions: also return each block's attention weights (eager path).
            output_hidden_states: also return the embeddings and each block's output.
            return_dict: return a tuple instead when False.
        """
        output_attentions, output_hidden_states, return_dict = self._output_options(
            output_attentions, output_hidden_states, return_dict)
        hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        hidden_states, states, attentions = self.run_blocks(
            hidden_states, output_attentions=output_attentions, output_hidden_states=output_hidden_states
        )
        last_hidden_state = self.norm(hidden_states)
        output = BaseModelOutputWithPooling(last_hidden_state=last_hidden_state, pooler_output=last_hidden_state[:, 0],
                                            hidden_states=states, attentions=attentions)
        return output if return_dict else output.to_tuple()


class CopyNCEDescriptorModel(CopyNCEPreTrainedModel):
    """CopyNCE descriptor: the ViT backbone and a (linear, batch norm, L2) head on the CLS token.

    ``model(pixel_values).descriptors`` are unit-norm (B, D) descriptors; the cosine similarity
    of two descriptors is the copy score. Given copy pairs (``reference_pixel_values``) the
    forward also computes the training loss of the paper (section "Overall Objective",
    supplementary "All detailed settings"):

    ``loss = infonce_weight * InfoNCE(q, r) + koleo_weight * KoLeo + copynce_weight * CopyNCE``

    * InfoNCE (symmetric) between the query and reference descriptors, row ``b`` of each being
      the copy pair and every other row a negative, with the learnable log-scale
      ``logit_scale`` (initialised at ``logit_scale_init`` = 3.2; its scale bounded by ``infonce_max_scale``,
      other processes' descriptors gathered with or without gradients by ``gather_gradients``);
    * KoLeo computed on the query descriptors and on the reference descriptors separately and
      averaged (each set holds one view per image, so a descriptor's nearest neighbour is
      another image, never its own copy); it needs B >= 2 and is 0 for a single pair;
    * CopyNCE (paper eq. "CopyNCE") on the patch tokens of ``copynce_layer`` with the PixTrace
      overlap priors ``overlap_qr`` (B, Lq, Lr) and ``overlap_rq`` (B, Lr, Lq), over the
      pairs selected by ``pair_mask`` (and ``labels == 1`` when labels are given).

    In training, the batch-norm head normalises the query and the reference descriptors of a
    batch in two passes (``head_batch_norm="per_side"``, the authors) or in one
    (``"joint"``), whatever output options are asked for, so they never change the loss or the
    running statistics. In eval mode it uses the running statistics and the two forms agree.
    """

    config_class = CopyNCEDescriptorConfig

    def __init__(self, config: CopyNCEDescriptorConfig):
        super().__init__(config)
        self.vit = CopyNCEViTModel(config)
        self.head = CopyNCEDescriptorHead(config)
        # Learnable log of InfoNCE's inverse temperature (CLIP-style), initialised at 3.2.
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init)))
        self.post_init()

    def _init_extra(self) -> None:
        init.constant_(self.logit_scale, float(self.config.logit_scale_init))

    def encode(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool | None = None) -> torch.Tensor:
        """The backbone's final output tokens: (B, 3, H, W) -> (B, 1 + L, C) (CLS first, after the final
        LayerNorm if there is one; the descriptor is ``head`` of the CLS)."""
        return self.vit(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding).last_hidden_state

    def get_image_features(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool | None = None
                           ) -> torch.Tensor:
        """(B, 3, H, W) -> (B, D) unit-norm descriptors (over ``config.inference_sizes`` in eval mode)."""
        descriptors = self.head(self.encode(pixel_values, interpolate_pos_encoding)[:, 0])
        return self._over_sizes(pixel_values, descriptors, interpolate_pos_encoding)

    def _over_sizes(self, pixel_values: torch.Tensor, descriptors: torch.Tensor,
                    interpolate_pos_encoding: bool | None) -> torch.Tensor:
        """Multi-size descriptors (``config.inference_sizes``, beyond the paper): images (B, 3, H, W) and their
        descriptors at their own size (B, D) -> the L2-normalised sum of the unit descriptors (B, D) at each side of
        ``inference_sizes``, the images resized (bicubic, antialiased) to each side they are not at. The descriptors
        as given in training mode or without ``inference_sizes``."""
        sides = getattr(self.config, "inference_sizes", None)  # configs saved before the option
        if self.training or not sides:
            return descriptors
        total = torch.zeros_like(descriptors)
        for side in sides:
            if tuple(pixel_values.shape[-2:]) == (side, side):
                total = total + descriptors
                continue
            resized = F.interpolate(pixel_values, size=(side, side), mode="bicubic", align_corners=False,
                                    antialias=True)
            total = total + self.head(self.encode(resized, interpolate_pos_encoding)[:, 0])
        return F.normalize(total, dim=-1)

    def _backbone(self, pixel_values, interpolate_pos_encoding, output_attentions, output_hidden_states):
        """``(last_hidden_state, copynce patch tokens (B, L, C), states, attentions)`` of one backbone pass."""
        layer = self.config.copynce_layer  # a hidden_states index: 1..N, or negative from the end
        intermediate = layer not in (-1, self.config.num_hidden_layers)
        output = self.vit(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding,
                          output_attentions=output_attentions,
                          output_hidden_states=output_hidden_states or intermediate, return_dict=True)
        tokens = (output.hidden_states[layer] if intermediate else output.last_hidden_state)[:, 1:]
        return output.last_hidden_state, tokens, output.hidden_states if output_hidden_states else None, output.attentions

    def forward(
        self,
        pixel_values: torch.Tensor,
        reference_pixel_values: torch.Tensor | None = None,
        overlap_qr: torch.Tensor | None = None,
        overlap_rq: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        pair_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
    ) -> CopyNCEDescriptorOutput | tuple:
        """Describe images; with reference images, also compute the training loss.

        Without reference images and in eval mode, ``descriptors`` are over ``config.inference_sizes`` when it is
        set (:class:`CopyNCEDescriptorConfig`); the other outputs are those of ``pixel_values``' own size.

        Args:
            pixel_values: (B, 3, H, W) queries, normalised as :class:`CopyNCEImageProcessor` does.
            reference_pixel_values: (B, 3, H', W') references; row ``b`` is a copy pair of query ``b``.
            overlap_qr: (B, Lq, Lr) PixTrace prior, query patch -> reference patch.
            overlap_rq: (B, Lr, Lq) PixTrace prior, reference patch -> query patch.
            labels: (B,) optional; the descriptor trains on copy pairs only, so every label
                must be 1 (a 0 raises ConfigError); also used to mask CopyNCE.
            pair_mask: (B,) bool, pairs whose priors are valid for CopyNCE.
            output_attentions: also return every block's attention weights for ``pixel_values``.
            output_hidden_states: also return every block's output for ``pixel_values``.
            interpolate_pos_encoding: see :class:`CopyNCEEmbeddings` (default: automatic).
            return_dict: return a tuple instead when False.
        """
        output_attentions, output_hidden_states, return_dict = self._output_options(
            output_attentions, output_hidden_states, return_dict)
        options = (interpolate_pos_encoding, output_attentions, output_hidden_states)
        (last_hidden_state, patch_tokens, states, attentions), (reference_last, reference_patch_tokens) = (
            self._encode_sides(pixel_values, reference_pixel_values, options))
        descriptors, reference_descriptors = self._describe(last_hidden_state, reference_last)
        loss = infonce = koleo = copynce = None
        if reference_pixel_values is None:
            descriptors = self._over_sizes(pixel_values, descriptors, interpolate_pos_encoding)
        else:
            loss, infonce, koleo, copynce = self._pair_loss(
                descriptors, reference_descriptors, patch_tokens, reference_patch_tokens, overlap_qr, overlap_rq,
                labels, pair_mask)
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
            hidden_states=states,
            attentions=attentions,
        )
        return output if return_dict else output.to_tuple()

    def _encode_sides(self, pixel_values: torch.Tensor, reference_pixel_values: torch.Tensor | None, options: tuple
                      ) -> tuple[tuple, tuple]:
        """The backbone passes of a forward: ``((last_hidden_state (B, 1 + L, C), patch tokens (B, L, C),
        states, attentions), (reference last hidden state, reference patch tokens))`` of the queries and, when
        given, the references (``None`` otherwise); ``options`` are ``(interpolate_pos_encoding,
        output_attentions, output_hidden_states)``, the states and attentions those of the queries."""
        batch = pixel_values.shape[0]
        if reference_pixel_values is None:
            return self._backbone(pixel_values, *options), (None, None)
        if reference_pixel_values.shape[0] != batch:
            raise ShapeError(
                f"pixel_values has {batch} images but reference_pixel_values has {reference_pixel_values.shape[0]}"
            )
        if reference_pixel_values.shape[1:] != pixel_values.shape[1:]:
            queries = self._backbone(pixel_values, *options)
            reference_last, reference_patch_tokens, _, _ = self._backbone(reference_pixel_values, options[0], False,
                                                                          False)
            return queries, (reference_last, reference_patch_tokens)
        # One backbone pass over queries and references together; the query rows are returned.
        last, tokens, states, attentions = self._backbone(torch.cat([pixel_values, reference_pixel_values]),
                                                          *options)
        states = tuple(state[:batch] for state in states) if states is not None else None
        attentions = tuple(weights[:batch] for weights in attentions) if attentions is not None else None
        return (last[:batch], tokens[:batch], states, attentions), (last[batch:], tokens[batch:])

    def _describe(self, last_hidden_state: torch.Tensor, reference_last: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(descriptors (B, D), reference descriptors (B, D) or None)``: the head on the CLS tokens
        (B, 1 + L, C) -> (B, D), one batch-norm pass per side or one for both (``head_batch_norm``)."""
        if reference_last is None:
            return self.head(last_hidden_state[:, 0]), None
        if self.config.head_batch_norm == "per_side":  # the authors: two batch-norm passes
            return self.head(last_hidden_state[:, 0]), self.head(reference_last[:, 0])
        # one batch-norm pass over every descriptor of the batch, queries then references
        descriptors_all = self.head(torch.cat([last_hidden_state[:, 0], reference_last[:, 0]]))
        batch = last_hidden_state.shape[0]
        return descriptors_all[:batch], descriptors_all[batch:]

    def _pair_loss(self, descriptors, reference_descriptors, patch_tokens, reference_patch_tokens, overlap_qr,
                   overlap_rq, labels, pair_mask) -> tuple[torch.Tensor, ...]:
        """``(loss, infonce, koleo, copynce)`` of B copy pairs: descriptors (B, D) of both sides, patch tokens
        (B, L, C) of both sides, priors (B, Lq, Lr) / (B, Lr, Lq); ``copynce`` is None when it is off."""
        if labels is not None and bool((labels.reshape(-1) != 1).any()):
            raise ConfigError(
                "the descriptor trains on copy pairs only (InfoNCE takes row b of the references as the "
                "positive of query b), but labels contain non-copy pairs; use the matcher for labelled pairs"
            )
        infonce = info_nce_loss(descriptors, reference_descriptors, self.logit_scale,
                                max_scale=self.config.infonce_max_scale, negatives=self.config.infonce_negatives,
                                gather_gradients=self.config.gather_gradients)
        if self.config.koleo_scope == "all_embeddings":
            koleo = paired_koleo_loss(descriptors, reference_descriptors,
                                      gather_gradients=self.config.gather_gradients)
        elif descriptors.shape[0] >= 2:
            koleo = 0.5 * (koleo_loss(descriptors) + koleo_loss(reference_descriptors))
        else:
            koleo = descriptors.sum() * 0.0
        loss = self.config.infonce_weight * infonce + self.config.koleo_weight * koleo
        copynce = _configured_copynce(self.config, patch_tokens, reference_patch_tokens, overlap_qr, overlap_rq,
                                      pair_mask, labels)
        if copynce is not None:
            loss = loss + self.config.copynce_weight * copynce
        return loss, infonce, koleo, copynce


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
    """CopyNCE matcher: the ViT backbone split into a shared per-image encoder and fusion blocks.

    Query and reference each pass through the first ``num_hidden_layers - num_fusion_layers``
    backbone blocks (shared weights, each image with its own CLS token): :meth:`pre_fusion_tokens`. The
    fusion sequence starts with a learnable fusion CLS token, then each image's tokens:
    ``[CLS; query CLS; query patches; reference CLS; reference patches]`` in the authors' form
    (``keep_image_cls_tokens``); folders saved before that option drop the per-image CLS tokens
    and add a learnable segment embedding per image (``segment_embeddings``, zero at
    initialisation) that tells the fusion blocks which image a token comes from. After the
    remaining blocks and the final LayerNorm, ``classifier`` maps the fused CLS to one logit
    (through one more LayerNorm, ``classifier_norm``, in the authors' form) and the fused patch
    tokens go through ``patch_token_norm`` (the authors' second LayerNorm, an identity
    otherwise): :meth:`fuse`. An encoded image can be fused with many others (its
    :meth:`pre_fusion_tokens` may be cached).

    Loss (paper eq. "Overall Objective" for the matcher): ``bce_weight * BCE(logits, labels) +
    copynce_weight * CopyNCE`` on the fused patch tokens, CopyNCE only over positive pairs
    (``labels == 1``) selected by ``pair_mask``.
    """

    config_class = CopyNCEMatcherConfig

    def __init__(self, config: CopyNCEMatcherConfig):
        super().__init__(config)
        self.vit = CopyNCEViTModel(config)
        self.fusion_cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        if config.segment_embeddings:
            self.segment_embeddings = nn.Parameter(torch.zeros(2, config.hidden_size))
        self.classifier_norm = self._optional_layer_norm(config.classifier_layer_norm)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.patch_token_norm = self._optional_layer_norm(config.patch_token_layer_norm)
        self.post_init()

    def _optional_layer_norm(self, present: bool) -> nn.Module:
        return nn.LayerNorm(self.config.hidden_size, eps=self.config.layer_norm_eps) if present else nn.Identity()

    def _init_extra(self) -> None:
        init.trunc_normal_(self.fusion_cls_token, mean=0.0, std=self.config.initializer_range)
        if self.config.segment_embeddings:
            init.zeros_(self.segment_embeddings)

    def _encode(self, pixel_values, interpolate_pos_encoding=None, output_attentions=False,
                output_hidden_states=False):
        hidden_states = self.vit.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        return self.vit.run_blocks(hidden_states, 0, self.config.num_encoder_layers, output_attentions,
                                   output_hidden_states)

    def freeze_encoder(self) -> None:
        """Stop the gradient of the per-image encoder (patch and position embeddings, the first
        ``num_encoder_layers`` blocks): only the fusion stage trains, and :meth:`pre_fusion_tokens` stays what it
        was."""
        self.vit.embeddings.requires_grad_(False)
        for block in self.vit.blocks[:self.config.num_encoder_layers]:
            block.requires_grad_(False)

    def pre_fusion_tokens(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool | None = None
                          ) -> torch.Tensor:
        """The per-image encoder pass: (B, 3, H, W) -> (B, 1 + L, C), the output of the last
        encoder block before the fusion blocks (CLS first, not normed), as :meth:`fuse` takes it.
        (The descriptor's :meth:`CopyNCEDescriptorModel.encode` is the backbone's final output.)"""
        return self._encode(pixel_values, interpolate_pos_encoding)[0]

    def _image_tokens(self, encoded: torch.Tensor, segment: int) -> torch.Tensor:
        """An image's part of the fusion sequence from its (B, 1 + L, C) encoder output."""
        tokens = encoded if self.config.keep_image_cls_tokens else encoded[:, 1:]
        return tokens + self.segment_embeddings[segment] if self.config.segment_embeddings else tokens

    def _fuse(self, query_encoded, reference_encoded, output_attentions=False, output_hidden_states=False):
        batch = query_encoded.shape[0]
        query_tokens = self._image_tokens(query_encoded, 0)
        sequence = torch.cat([self.fusion_cls_token.expand(batch, -1, -1), query_tokens,
                              self._image_tokens(reference_encoded, 1)], dim=1)
        sequence, states, attentions = self.vit.run_blocks(sequence, self.config.num_encoder_layers, None,
                                                           output_attentions, output_hidden_states)
        sequence = self.vit.norm(sequence)
        logits = self.classifier(self.classifier_norm(sequence[:, 0])).squeeze(-1)
        # Patch tokens only: the fused per-image CLS tokens (when kept) are left out.
        image_cls = 1 if self.config.keep_image_cls_tokens else 0
        query_end = 1 + query_tokens.shape[1]
        query_patches = self.patch_token_norm(sequence[:, 1 + image_cls : query_end])
        reference_patches = self.patch_token_norm(sequence[:, query_end + image_cls :])
        return logits, query_patches, reference_patches, states, attentions

    def fusion_logits(self, query_encoded: torch.Tensor, reference_encoded: torch.Tensor) -> torch.Tensor:
        """The copy logits (B,) of :meth:`fuse` alone, for scoring: the last fusion block computes only the fusion CLS
        token, which the classifier reads (its other positions' queries, attention rows and MLP are not computed; the
        logits equal :meth:`fuse`'s to float rounding). Under autocast the classifier still runs in float32, so that
        lower-precision fusion blocks do not round the logits themselves."""
        batch = query_encoded.shape[0]
        sequence = torch.cat([self.fusion_cls_token.expand(batch, -1, -1), self._image_tokens(query_encoded, 0),
                              self._image_tokens(reference_encoded, 1)], dim=1)
        last = self.config.num_hidden_layers - 1
        sequence = self.vit.run_blocks(sequence, self.config.num_encoder_layers, last)[0]
        first = self.vit.norm(self.vit.blocks[last].first_position(sequence))
        with torch.autocast(first.device.type, enabled=False):  # the logit itself in float32 under any autocast
            return self.classifier(self.classifier_norm(first.float())).squeeze(-1)

    def fuse(self, query_encoded: torch.Tensor, reference_encoded: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The per-pair fusion of encoded images (B, 1 + Lq, C) and (B, 1 + Lr, C), each the
        :meth:`pre_fusion_tokens` output (CLS first): fusion blocks, final LayerNorm and classifier.

        Returns:
            ``(logits (B,), query_patch_tokens (B, Lq, C), reference_patch_tokens (B, Lr, C))``.
        """
        return self._fuse(query_encoded, reference_encoded)[:3]

    def forward(
        self,
        pixel_values: torch.Tensor,
        reference_pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        overlap_qr: torch.Tensor | None = None,
        overlap_rq: torch.Tensor | None = None,
        pair_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
    ) -> CopyNCEMatcherOutput | tuple:
        """Score image pairs; with labels and/or priors, also compute the training loss.

        Args:
            pixel_values: (B, 3, H, W) queries.
            reference_pixel_values: (B, 3, H', W') references.
            labels: (B,) 1 for a copy pair, 0 otherwise.
            overlap_qr: (B, Lq, Lr) and overlap_rq: (B, Lr, Lq): PixTrace priors (zero for negatives).
            pair_mask: (B,) bool, pairs whose priors are valid.
            output_attentions: also return each block's attention weights (eager path).
            output_hidden_states: also return each block's output.
            interpolate_pos_encoding: see :class:`CopyNCEEmbeddings` (default: automatic).
            return_dict: return a tuple instead when False.
        """
        output_attentions, output_hidden_states, return_dict = self._output_options(
            output_attentions, output_hidden_states, return_dict)
        batch = pixel_values.shape[0]
        if reference_pixel_values is None or reference_pixel_values.shape[0] != batch:
            raise ShapeError("the matcher needs reference_pixel_values with as many images as pixel_values")
        options = (interpolate_pos_encoding, output_attentions, output_hidden_states)
        query_encoded, reference_encoded, encoder_states, encoder_attentions = self._encode_pair(
            pixel_values, reference_pixel_values, options)
        logits, query_patch_tokens, reference_patch_tokens, states, attentions = self._fuse(
            query_encoded, reference_encoded, output_attentions, output_hidden_states
        )
        loss, bce, copynce = self._pair_loss(logits, query_patch_tokens, reference_patch_tokens, labels, overlap_qr,
                                             overlap_rq, pair_mask)
        output = CopyNCEMatcherOutput(
            loss=loss,
            logits=logits,
            query_patch_tokens=query_patch_tokens,
            reference_patch_tokens=reference_patch_tokens,
            bce_loss=bce,
            copynce_loss=copynce,
            hidden_states=states,
            attentions=attentions,
            encoder_hidden_states=encoder_states,
            encoder_attentions=encoder_attentions,
        )
        return output if return_dict else output.to_tuple()

    def _encode_pair(self, pixel_values: torch.Tensor, reference_pixel_values: torch.Tensor, options: tuple
                     ) -> tuple[torch.Tensor, torch.Tensor, tuple | None, tuple | None]:
        """The per-image encoder passes of a forward: ``(query encoded (B, 1 + Lq, C), reference encoded
        (B, 1 + Lr, C), encoder states, encoder attentions)``, one pass over both sides when their shapes agree
        (the states and attentions then hold 2B rows, queries first), else one per side (the queries' tuple
        followed by the references'); ``options`` are ``(interpolate_pos_encoding, output_attentions,
        output_hidden_states)``."""
        batch = pixel_values.shape[0]
        if reference_pixel_values.shape[1:] == pixel_values.shape[1:]:
            encoded, encoder_states, encoder_attentions = self._encode(
                torch.cat([pixel_values, reference_pixel_values]), *options
            )
            return encoded[:batch], encoded[batch:], encoder_states, encoder_attentions
        query_encoded, query_states, query_attentions = self._encode(pixel_values, *options)
        reference_encoded, reference_states, reference_attentions = self._encode(reference_pixel_values, *options)
        encoder_states = query_states + reference_states if options[2] else None
        encoder_attentions = query_attentions + reference_attentions if options[1] else None
        return query_encoded, reference_encoded, encoder_states, encoder_attentions

    def _pair_loss(self, logits, query_patch_tokens, reference_patch_tokens, labels, overlap_qr, overlap_rq,
                   pair_mask) -> tuple[torch.Tensor | None, ...]:
        """``(loss, bce, copynce)`` of B pairs (paper eq. "Overall Objective" for the matcher): the (B,) logits
        against the (B,) labels, CopyNCE on the fused patch tokens (B, Lq, C) / (B, Lr, C) with the priors
        (B, Lq, Lr) / (B, Lr, Lq); each term None when its inputs are absent (the loss None when both are)."""
        loss = bce = None
        if labels is not None:
            bce = copy_bce_loss(logits, labels.reshape(logits.shape[0]))
            loss = self.config.bce_weight * bce
        copynce = _configured_copynce(self.config, query_patch_tokens, reference_patch_tokens, overlap_qr, overlap_rq,
                                      pair_mask, labels)
        if copynce is not None:
            weighted = self.config.copynce_weight * copynce
            loss = weighted if loss is None else loss + weighted
        return loss, bce, copynce
