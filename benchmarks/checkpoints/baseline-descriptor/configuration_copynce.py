"""Configurations of the CopyNCE backbone, descriptor and matcher.

All three models are Vision Transformers; their architecture hyper-parameters use the names of
``transformers.ViTConfig`` (``hidden_size``, ``num_hidden_layers``, ...), with ViT-S/16 defaults
as in DINO (the paper's default backbone, supplementary table "All detailed settings").
Every loss weight and temperature of the paper lives here with the paper's default, so a
saved model folder records exactly how it was trained.

Like every module of this package, it imports its siblings relatively and otherwise only
``transformers``, so a saved model folder carries it as Hub custom code.
"""

from __future__ import annotations

import math

from transformers import PretrainedConfig

from .errors import ConfigError

__all__ = [
    "EARLIER_DESCRIPTOR_ARCHITECTURE",
    "EARLIER_MATCHER_ARCHITECTURE",
    "CopyNCEDescriptorConfig",
    "CopyNCEMatcherConfig",
    "CopyNCEViTConfig",
]

COPYNCE_WEIGHTINGS = ("paper", "authors_code")
#: Option values renamed since folders were saved, {option: {earlier value: current value}}; read from a saved
#: ``config.json`` only (a new configuration refuses the earlier value).
RENAMED_VALUES = {"copynce_weighting": {"reference": "authors_code"}}
#: InfoNCE negatives (``copynce_hf.modeling.losses_copynce.info_nce_loss``) and KoLeo scopes of the descriptor.
INFONCE_NEGATIVES = ("cross_view", "all_embeddings")
KOLEO_SCOPES = ("per_view", "all_embeddings")
#: Pairs CopyNCE's batch loss is averaged over (``copynce_hf.modeling.losses_copynce.copynce_loss``).
COPYNCE_AVERAGES = ("overlap_pairs", "all_pairs")
#: How the descriptor head's batch norm sees a training batch of copy pairs.
HEAD_BATCH_NORMS = ("joint", "per_side")

#: LayerNorm epsilon of the authors' descriptor and matcher (``norm_layer`` of their ``build_encoder``).
AUTHORS_LAYER_NORM_EPS = 1e-4


#: The architecture options of folders saved before the authors' architecture became the default.
EARLIER_DESCRIPTOR_ARCHITECTURE = {"final_layer_norm": True, "freeze_patch_embeddings": False,
                                   "head_batch_norm": "joint", "sync_batch_norm": False, "layer_norm_eps": 1e-6}
EARLIER_MATCHER_ARCHITECTURE = {"keep_image_cls_tokens": False, "segment_embeddings": True,
                                "classifier_layer_norm": False, "patch_token_layer_norm": False, "layer_norm_eps": 1e-6}


def _architecture_field(kwargs: dict, value, authors, before):
    """Value of an architecture option added with the authors' architecture.

    An explicit ``value`` wins. Otherwise a new configuration gets the authors' form
    (``authors``), and a configuration read from a folder saved before the option existed (its
    ``config.json`` has ``transformers_version`` but not the option) gets ``before``, the form it
    was trained with, so such folders keep giving the same outputs.
    """
    if value is not None:
        return value
    return before if "transformers_version" in kwargs else authors


def _saved_value(kwargs: dict, key: str, value):
    """``value``, or its current name when the configuration is read from a folder saved with an earlier one
    (its ``config.json`` has ``transformers_version``, as in :func:`_architecture_field`)."""
    if "transformers_version" in kwargs:
        return RENAMED_VALUES.get(key, {}).get(value, value)
    return value


def _check(condition: bool, key: str, value, requirement: str) -> None:
    if not condition:
        raise ConfigError(f"invalid configuration value {key}={value!r}: {requirement}")


def _check_non_negative(key: str, value) -> None:
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0,
        key,
        value,
        "must be a finite number >= 0",
    )


def _check_positive_int(key: str, value) -> None:
    _check(isinstance(value, int) and not isinstance(value, bool) and value > 0, key, value, "must be an integer > 0")


def input_side(config) -> int:
    """The side of the square images a model takes from its image processor: the largest of a descriptor's
    ``inference_sizes`` (its multi-size descriptors read every other size from it), else ``image_size``."""
    sides = getattr(config, "inference_sizes", None)
    return max(sides) if sides else config.image_size


def model_kind(model) -> str:
    """``"matcher"`` or ``"descriptor"``, from the ``model_type`` of a model's config (or of a config)."""
    model_type = getattr(getattr(model, "config", model), "model_type", "") or ""
    if "matcher" in model_type:
        return "matcher"
    if "descriptor" in model_type:
        return "descriptor"
    raise ConfigError(f"model type {model_type!r} is neither a CopyNCE matcher nor a CopyNCE descriptor")


class CustomPipelines(dict):
    """A saved folder's ``custom_pipelines`` (task -> the pipeline code the folder carries) where some
    tasks are also registered with ``transformers`` from the installed package.

    ``transformers.pipeline`` looks a task up in the folder's entries first and then demands
    ``trust_remote_code=True``, even for code that is installed and registered. For the registered tasks,
    membership (``task in entries``) is therefore false, so the registration runs them; the entries
    themselves are kept (iteration, ``len``, saving), so a pipeline without a task still infers it from
    the folder and the folder saves unchanged.
    """

    def __init__(self, entries, registered_tasks):
        super().__init__(entries)
        self.registered_tasks = frozenset(registered_tasks)

    def __contains__(self, task) -> bool:
        return task not in self.registered_tasks and super().__contains__(task)

    def __deepcopy__(self, memo):
        import copy

        return CustomPipelines(copy.deepcopy(dict(self), memo), self.registered_tasks)

    def __reduce__(self):
        return CustomPipelines, (dict(self), self.registered_tasks)


class CopyNCEViTConfig(PretrainedConfig):
    """Configuration of :class:`CopyNCEViTModel`, the ViT backbone shared by the descriptor and
    the matcher (hyper-parameter names as in ``ViTConfig``, ViT-S/16 defaults as in DINO).

    Args:
        hidden_size: token width ``C`` (384 for ViT-S, 768 for ViT-B).
        num_hidden_layers: transformer blocks (12).
        num_attention_heads: attention heads (6 for ViT-S, 12 for ViT-B).
        intermediate_size: MLP width (4 * hidden_size).
        hidden_act: MLP activation, a key of ``transformers.activations.ACT2FN`` ("gelu", exact as in DINO).
        hidden_dropout_prob: dropout after attention and MLP.
        attention_probs_dropout_prob: dropout on attention weights.
        initializer_range: std of the truncated-normal initialisation of new weights.
        layer_norm_eps: LayerNorm epsilon (1e-6 as in DINO for the bare backbone; the descriptor and
            the matcher default to the authors' 1e-4).
        image_size: square input side in pixels; a multiple of ``patch_size``.
        patch_size: side of a patch in pixels (16).
        num_channels: input channels (3).
        qkv_bias: bias in the query/key/value projection.
        final_layer_norm: the backbone's output goes through a final LayerNorm (DINO, the matcher's
            fusion output); the authors' descriptor has none (their ``VisionTransformer`` with
            ``last_norm=False``), so its head and CopyNCE read the last block's raw output.
        freeze_patch_embeddings: the patch embedding takes no gradient (the authors' ``freeze_patch``,
            on for their descriptor, off for their matcher).

    The attention backend is chosen as for ``transformers`` models, with
    ``from_pretrained(..., attn_implementation="sdpa" | "eager")`` (default "sdpa").
    """

    model_type = "copynce-vit"
    #: Pipeline tasks registered with ``transformers`` from this very code (``import copynce_hf`` adds
    #: ``image-copy-detection`` when it registers the task, see ``copynce_hf.pipelines``); see
    #: :class:`CustomPipelines`. Empty in a class loaded from a folder's own code.
    registered_pipeline_tasks = frozenset()

    def __init__(
        self,
        hidden_size: int = 384,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 6,
        intermediate_size: int = 1536,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-6,
        image_size: int = 224,
        patch_size: int = 16,
        num_channels: int = 3,
        qkv_bias: bool = True,
        final_layer_norm: bool = True,
        freeze_patch_embeddings: bool = False,
        **kwargs,
    ):
        self.final_layer_norm = final_layer_norm
        self.freeze_patch_embeddings = freeze_patch_embeddings
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.qkv_bias = qkv_bias
        if kwargs.get("custom_pipelines") and self.registered_pipeline_tasks:
            kwargs["custom_pipelines"] = CustomPipelines(kwargs["custom_pipelines"], self.registered_pipeline_tasks)
        super().__init__(**kwargs)
        self._validate_vit()

    def _validate_vit(self) -> None:
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "image_size", "patch_size", "num_channels"):
            _check_positive_int(key, getattr(self, key))
        _check(self.hidden_size % self.num_attention_heads == 0, "num_attention_heads", self.num_attention_heads,
               f"must divide hidden_size={self.hidden_size}")
        _check(self.image_size % self.patch_size == 0, "image_size", self.image_size,
               f"must be a multiple of patch_size={self.patch_size}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, key)
            _check_non_negative(key, value)
            _check(value < 1, key, value, "must be < 1")
        _check(isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0, "layer_norm_eps",
               self.layer_norm_eps, "must be > 0")
        _check(isinstance(self.initializer_range, (int, float)) and self.initializer_range > 0,
               "initializer_range", self.initializer_range, "must be > 0")
        _check(isinstance(self.hidden_act, str), "hidden_act", self.hidden_act, "must be an activation name")
        for key in ("qkv_bias", "final_layer_norm", "freeze_patch_embeddings"):
            _check(isinstance(getattr(self, key), bool), key, getattr(self, key), "must be true or false")

    @property
    def grid_size(self) -> int:
        """Patches per side at ``image_size``."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        """Patch tokens per image at ``image_size`` (``L``)."""
        return self.grid_size**2

    def _validate_copynce(self) -> None:
        _check(isinstance(self.copynce_temperature, (int, float)) and self.copynce_temperature > 0,
               "copynce_temperature", self.copynce_temperature, "must be > 0")
        _check(isinstance(self.copynce_gamma, (int, float)) and self.copynce_gamma >= 0, "copynce_gamma",
               self.copynce_gamma, "must be >= 0 (or inf)")
        _check_non_negative("copynce_weight", self.copynce_weight)
        _check(self.copynce_weighting in COPYNCE_WEIGHTINGS, "copynce_weighting", self.copynce_weighting,
               f"must be one of {COPYNCE_WEIGHTINGS}")
        _check(self.copynce_average in COPYNCE_AVERAGES, "copynce_average", self.copynce_average,
               f"must be one of {COPYNCE_AVERAGES}")


class CopyNCEDescriptorConfig(CopyNCEViTConfig):
    """Configuration of :class:`CopyNCEDescriptorModel` (paper supplementary, "Model Arch").

    ViT encoder, then a head on the CLS token: linear (no bias) to ``descriptor_dim``, batch
    norm, L2 normalisation. The defaults build the authors' descriptor (their
    ``descriptor_default_config.yaml``): no final LayerNorm, LayerNorm epsilon 1e-4, batch norm
    run on the queries and the references separately (synchronised over processes), frozen patch
    embedding. Folders saved before these options existed keep the form they were trained with. Training loss (paper "Overall Objective" and "Implementation
    details"): ``infonce_weight * InfoNCE + koleo_weight * KoLeo + copynce_weight * CopyNCE``.

    Args (besides the ViT ones of ``ViTConfig``):
        descriptor_dim: descriptor size ``D`` (512; 256 for the DISC21 descriptor track).
        copynce_temperature: CopyNCE ``tau`` (1/16).
        copynce_weight: ``w_NCE`` (5 for the descriptor; 0 trains the InfoNCE + KoLeo baseline).
        copynce_gamma: confidence sharpening ``gamma`` of the prior (3 for the descriptor).
        copynce_layer: the layer whose patch tokens CopyNCE supervises, numbered as ``hidden_states``
            (1 = the first block's output, ``num_hidden_layers`` or -1 = the backbone's output, after its
            final LayerNorm if it has one; negative from the end); -1 as in the paper.
        copynce_weighting: "paper" (the paper's equations) or "authors_code" (the authors' code's form;
            "reference" in folders saved before the rename),
            see :func:`copynce_hf.modeling.losses_copynce.copynce_loss`.
        copynce_average: "overlap_pairs" (the batch loss is the mean over the copy pairs with
            overlap) or "all_pairs" (the authors' code: their sum over all pairs of the batch).
        logit_scale_init: initial value of InfoNCE's learnable log-scale (3.2, i.e. scale 24.5).
        infonce_max_scale: upper bound of InfoNCE's scale ``exp(logit_scale)`` (100, as CLIP), or
            ``None`` (the authors' code: unbounded).
        gather_gradients: on several processes, InfoNCE and the ``all_embeddings`` KoLeo gather the
            other processes' descriptors with gradients (``True``) or as constants (``False``, the
            authors' code: their ``all_gather``).
        infonce_weight: weight of InfoNCE (1).
        infonce_negatives: "cross_view" (each query against the batch's references and each
            reference against its queries) or "all_embeddings" (SSCD's form, the authors' code: each
            of the 2N descriptors against all others, its partner the positive).
        koleo_weight: weight of KoLeo (5).
        koleo_scope: "per_view" (KoLeo of the local queries and of the local references, averaged)
            or "all_embeddings" (the authors' code: over the 2N descriptors of all processes, each
            one's partner excluded from its neighbours), see :func:`copynce_hf.modeling.losses_copynce.paired_koleo_loss`.
        head_batch_norm: "per_side" (the authors: the head's batch norm normalises the queries and
            the references of a training batch in two passes) or "joint" (one pass over both).
        sync_batch_norm: training on several GPUs synchronises the head's batch-norm statistics
            over the processes (the authors' ``SyncBatchNorm``).
        final_layer_norm, freeze_patch_embeddings: see :class:`CopyNCEViTConfig` (False and True
            for the authors' descriptor).
        inference_sizes: beyond the paper, multi-size descriptors: input sides (multiples of ``patch_size``) at
            which an image is described when the model describes without references in eval mode; the descriptor
            is the L2-normalised sum of the unit descriptors at each side, the input resized (bicubic,
            antialiased) to each side it is not already at. ``None`` (default): the input's own size only. The
            image processor should give the largest side, so that no size is read from an enlarged image.
    """

    model_type = "copynce-descriptor"

    def __init__(
        self,
        descriptor_dim: int = 512,
        copynce_temperature: float = 1 / 16,
        copynce_weight: float = 5.0,
        copynce_gamma: float = 3.0,
        copynce_layer: int = -1,
        copynce_weighting: str = "paper",
        copynce_average: str = "overlap_pairs",
        logit_scale_init: float = 3.2,
        infonce_max_scale: float | None = 100.0,
        gather_gradients: bool = True,
        infonce_weight: float = 1.0,
        koleo_weight: float = 5.0,
        infonce_negatives: str = "cross_view",
        koleo_scope: str = "per_view",
        head_batch_norm: str | None = None,
        sync_batch_norm: bool | None = None,
        final_layer_norm: bool | None = None,
        freeze_patch_embeddings: bool | None = None,
        inference_sizes: list[int] | None = None,
        **kwargs,
    ):
        before = EARLIER_DESCRIPTOR_ARCHITECTURE
        self.head_batch_norm = _architecture_field(kwargs, head_batch_norm, "per_side", before["head_batch_norm"])
        self.sync_batch_norm = _architecture_field(kwargs, sync_batch_norm, True, before["sync_batch_norm"])
        kwargs["final_layer_norm"] = _architecture_field(kwargs, final_layer_norm, False, before["final_layer_norm"])
        kwargs["freeze_patch_embeddings"] = _architecture_field(kwargs, freeze_patch_embeddings, True,
                                                                before["freeze_patch_embeddings"])
        kwargs.setdefault("layer_norm_eps", AUTHORS_LAYER_NORM_EPS)
        self.descriptor_dim = descriptor_dim
        self.infonce_negatives = infonce_negatives
        self.koleo_scope = koleo_scope
        self.copynce_temperature = copynce_temperature
        self.copynce_weight = copynce_weight
        self.copynce_gamma = copynce_gamma
        self.copynce_layer = copynce_layer
        self.copynce_weighting = _saved_value(kwargs, "copynce_weighting", copynce_weighting)
        self.copynce_average = copynce_average
        self.logit_scale_init = logit_scale_init
        self.infonce_max_scale = infonce_max_scale
        self.gather_gradients = gather_gradients
        self.infonce_weight = infonce_weight
        self.koleo_weight = koleo_weight
        self.inference_sizes = list(inference_sizes) if isinstance(inference_sizes, (list, tuple)) else inference_sizes
        super().__init__(**kwargs)
        self._validate_descriptor()

    def _validate_descriptor(self) -> None:
        """The descriptor's own fields: its size, the CopyNCE, InfoNCE and KoLeo terms, and the head's batch norm."""
        _check_positive_int("descriptor_dim", self.descriptor_dim)
        self._validate_copynce()
        layer, layers = self.copynce_layer, self.num_hidden_layers
        _check(isinstance(layer, int) and layer != 0 and -layers <= layer <= layers, "copynce_layer", layer,
               f"must be a block index in 1..{layers} or -{layers}..-1")
        _check(isinstance(self.logit_scale_init, (int, float)) and math.isfinite(self.logit_scale_init),
               "logit_scale_init", self.logit_scale_init, "must be a finite number")
        scale = self.infonce_max_scale
        _check(scale is None or (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                 and math.isfinite(scale) and scale > 0),
               "infonce_max_scale", scale, "must be a positive number or null (unbounded)")
        _check(isinstance(self.gather_gradients, bool), "gather_gradients", self.gather_gradients,
               "must be true or false")
        _check_non_negative("infonce_weight", self.infonce_weight)
        _check_non_negative("koleo_weight", self.koleo_weight)
        _check(self.infonce_negatives in INFONCE_NEGATIVES, "infonce_negatives", self.infonce_negatives,
               f"must be one of {INFONCE_NEGATIVES}")
        _check(self.koleo_scope in KOLEO_SCOPES, "koleo_scope", self.koleo_scope, f"must be one of {KOLEO_SCOPES}")
        _check(self.head_batch_norm in HEAD_BATCH_NORMS, "head_batch_norm", self.head_batch_norm,
               f"must be one of {HEAD_BATCH_NORMS}")
        _check(isinstance(self.sync_batch_norm, bool), "sync_batch_norm", self.sync_batch_norm, "must be true or false")
        sizes = self.inference_sizes
        _check(sizes is None or (isinstance(sizes, list) and len(sizes) > 0 and all(
            isinstance(side, int) and not isinstance(side, bool) and side > 0 and side % self.patch_size == 0
            for side in sizes) and len(set(sizes)) == len(sizes)), "inference_sizes", sizes,
            f"must be null or a list of distinct positive multiples of patch_size ({self.patch_size})")


class CopyNCEMatcherConfig(CopyNCEViTConfig):
    """Configuration of :class:`CopyNCEMatcherModel` (paper supplementary, "Model Arch").

    The first ``num_hidden_layers - num_fusion_layers`` blocks encode query and reference
    separately (shared weights); the last ``num_fusion_layers`` blocks fuse
    ``[CLS; query CLS; query patches; reference CLS; reference patches]`` (the authors' form;
    without the per-image CLS tokens and with segment embeddings in folders saved before these
    options existed); a linear head on the fused CLS gives one copy logit. The defaults build
    the authors' matcher (their ``matching_default_config.yaml``). Training loss: ``bce_weight * BCE + copynce_weight * CopyNCE`` on the fused patch
    tokens of positive pairs.

    Args (besides the ViT ones of ``ViTConfig``):
        num_fusion_layers: fusion blocks (4 of 12: "enc-8-fus-4").
        copynce_temperature: CopyNCE ``tau`` (1/16).
        copynce_weight: ``w_NCE`` (3 for the matcher; 0 trains the BCE baseline).
        copynce_gamma: ``gamma`` (1 for the matcher).
        copynce_weighting: "paper" or "authors_code", see :func:`copynce_hf.modeling.losses_copynce.copynce_loss`.
        copynce_average: "overlap_pairs" or "all_pairs" (the authors' code: negatives count too),
            see :func:`copynce_hf.modeling.losses_copynce.copynce_loss`.
        bce_weight: weight of the binary cross-entropy (1).
        keep_image_cls_tokens: each image's CLS token from the encoder stays in the fused sequence
            (the authors) instead of being dropped.
        segment_embeddings: a learnable embedding per image is added to its tokens before fusion
            (not in the authors' matcher).
        classifier_layer_norm: the fused CLS goes through one more LayerNorm before the
            classifier (the authors' ``cls_head.norm``).
        patch_token_layer_norm: the fused patch tokens go through one more LayerNorm before
            CopyNCE reads them (the authors' ``fusion_head.norm``).
        freeze_patch_embeddings: see :class:`CopyNCEViTConfig` (False for the authors' matcher).
    """

    model_type = "copynce-matcher"

    def __init__(
        self,
        num_fusion_layers: int = 4,
        copynce_temperature: float = 1 / 16,
        copynce_weight: float = 3.0,
        copynce_gamma: float = 1.0,
        copynce_weighting: str = "paper",
        copynce_average: str = "overlap_pairs",
        bce_weight: float = 1.0,
        keep_image_cls_tokens: bool | None = None,
        segment_embeddings: bool | None = None,
        classifier_layer_norm: bool | None = None,
        patch_token_layer_norm: bool | None = None,
        **kwargs,
    ):
        before = EARLIER_MATCHER_ARCHITECTURE
        self.keep_image_cls_tokens = _architecture_field(kwargs, keep_image_cls_tokens, True,
                                                         before["keep_image_cls_tokens"])
        self.segment_embeddings = _architecture_field(kwargs, segment_embeddings, False, before["segment_embeddings"])
        self.classifier_layer_norm = _architecture_field(kwargs, classifier_layer_norm, True,
                                                         before["classifier_layer_norm"])
        self.patch_token_layer_norm = _architecture_field(kwargs, patch_token_layer_norm, True,
                                                          before["patch_token_layer_norm"])
        kwargs.setdefault("layer_norm_eps", AUTHORS_LAYER_NORM_EPS)
        self.num_fusion_layers = num_fusion_layers
        self.copynce_temperature = copynce_temperature
        self.copynce_weight = copynce_weight
        self.copynce_gamma = copynce_gamma
        self.copynce_weighting = _saved_value(kwargs, "copynce_weighting", copynce_weighting)
        self.copynce_average = copynce_average
        self.bce_weight = bce_weight
        super().__init__(**kwargs)
        _check_positive_int("num_fusion_layers", num_fusion_layers)
        _check(num_fusion_layers <= self.num_hidden_layers, "num_fusion_layers", num_fusion_layers,
               f"must be <= num_hidden_layers={self.num_hidden_layers}")
        self._validate_copynce()
        _check_non_negative("bce_weight", bce_weight)
        for key in ("keep_image_cls_tokens", "segment_embeddings", "classifier_layer_norm", "patch_token_layer_norm"):
            _check(isinstance(getattr(self, key), bool), key, getattr(self, key), "must be true or false")
        _check(self.final_layer_norm, "final_layer_norm", self.final_layer_norm,
               "must be true for the matcher (its fused tokens end with the backbone's final LayerNorm)")

    @property
    def num_encoder_layers(self) -> int:
        """Blocks of the shared per-image encoder."""
        return self.num_hidden_layers - self.num_fusion_layers
