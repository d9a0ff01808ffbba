"""The training configuration: every option of a run, its default, its help text and its checks.

Options follow the names of ``transformers.TrainingArguments`` where one exists (``output_dir``,
``max_steps``, ``per_device_train_batch_size``, ``learning_rate``, ``seed``, ``push_to_hub``, ...).
A run is configured by a YAML file (``--config``) and ``--key value`` overrides on the command line
(:mod:`.options`); unknown keys and invalid values stop the run at start-up with a :class:`ConfigError`
naming the key.

Defaults of options left ``null`` depend on ``model_type``, following the paper's supplementary
table "All detailed settings in our training pipeline":

============================  ===========  ========
option                        descriptor   matcher
============================  ===========  ========
positive_rate                 1.0          0.3
hard_negative_k               8            128
hard_negative_prob            1.0          0.5
hard_negative_mining          ghnm (batch) pairs
============================  ===========  ========
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..configuration.field_checks import Check, CheckedFields, invalid_value, number, one_of, satisfies
from ..data.pairs import NEGATIVE_ROLES, OTHER_IMAGES, RECIPES
from ..modeling.errors import ConfigError
from ..pixtrace.overlap import REVERSE_PRIORS
from ..pixtrace.templates import TEMPLATE_KINDS, TemplateRecipe
from ..runtime.loading import saved_model_kind
from .optim import COSINE_SPANS

__all__ = ["TrainingConfig", "load_config", "parse_value", "read_config_file", "CONFIG_DIR", "DEFAULT_CONFIG",
           "DEFAULT_CONFIGS"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: Folder of the shipped training configurations: the repository's ``configs/`` in a source checkout;
#: an installed package carries the same files as ``copynce_hf/configs/`` (package data, see setup.py).
CONFIG_DIR = next(
    (folder for folder in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs")
     if (folder / "tiny_cpu.yaml").is_file()),
    _PACKAGE_DIR / "configs",
)
#: The configuration used when ``scripts/train.py`` is run without ``--config``.
DEFAULT_CONFIG = CONFIG_DIR / "tiny_cpu.yaml"
#: The configuration of a run without ``--config`` that starts from a saved model, by the model's type (the
#: file's ``model`` keys left out: the architecture is the folder's).
DEFAULT_CONFIGS = {"descriptor": DEFAULT_CONFIG, "matcher": CONFIG_DIR / "tiny_cpu_matcher.yaml"}

_MODEL_TYPES = ("descriptor", "matcher")
_PAIR_SOURCES = ("edits", "ground_truth")
_MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
_HNM = ("ghnm", "pairs", "off")
#: Recipe names that older saved configurations used, and their current names.
_OLD_RECIPE_NAMES = {"light": "off"}

_MODEL_DEFAULTS = {
    "descriptor": {"positive_rate": 1.0, "hard_negative_k": 8, "hard_negative_prob": 1.0, "hard_negative_mining": "ghnm"},
    "matcher": {"positive_rate": 0.3, "hard_negative_k": 128, "hard_negative_prob": 0.5, "hard_negative_mining": "pairs"},
}


def _option(default: Any = None, help: str = "", factory=None, checks: Check | tuple[Check, ...] = ()):
    """A configuration field with its ``--help`` text (``metadata["help"]``, as in ``transformers.TrainingArguments``)
    and the checks of its value (``metadata["checks"]``, run by :class:`~copynce_hf.configuration.field_checks.CheckedFields`)."""
    metadata = {"help": help, "checks": checks if isinstance(checks, tuple) else (checks,)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------------- checks of one field
_POSITIVE = number(positive=True)
_NON_NEGATIVE = number(low=0)
_FRACTION = number(low=0, high=1)
_BETA = number(low=0, high=0.999999)
_COUNT = number(integer=True, positive=True)
_OPTIONAL_COUNT = number(optional=True, integer=True, positive=True)
_NON_NEGATIVE_INTEGER = number(integer=True, low=0)
_BELOW_ONE = satisfies(lambda value: value is None or value < 1, "must be < 1 (or null for no weight average)")
_MAPPING = satisfies(lambda value: isinstance(value, dict), "must be a mapping of model configuration keys")
_BOOLEAN = satisfies(lambda value: isinstance(value, bool), "must be true or false")
_FOLDER = satisfies(lambda value: isinstance(value, str) and value, "must be a folder path")
_PRECISION = one_of(_MIXED_PRECISION, optional=True, requirement=(
    f"must be null (accelerate launch / accelerate config decides) or one of {_MIXED_PRECISION}"))
_TRACKER = one_of(("tensorboard", "none", "all", "wandb", "mlflow", "comet_ml", "aim", "clearml"),
                  requirement="must be an Accelerate tracker name or 'none'")


def _recipe(value: Any) -> str | None:
    """An edit recipe name (:data:`copynce_hf.data.pairs.RECIPES`); YAML reads a bare ``off`` as false."""
    if value in RECIPES:
        return None
    yaml_note = " (in YAML, write \"off\" in quotes: bare off is false)" if value is False else ""
    return f"must be one of {RECIPES}{yaml_note}"


def _template_weights(value: Any) -> str | None:
    """``null`` or a mapping of template kinds to weights that :class:`TemplateRecipe` accepts."""
    if value is None:
        return None
    requirement = f"must be null or a mapping of template kinds {TEMPLATE_KINDS} to weights >= 0 with a positive sum"
    if not isinstance(value, dict) or any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in value.values()):
        return requirement
    try:
        TemplateRecipe(dict(value))
    except ConfigError:
        return requirement
    return None


# ---------------------------------------------------------------------- checks across fields
def _ground_truth_named(config: TrainingConfig) -> None:
    if config.pair_source == "ground_truth" and not config.ground_truth:
        raise invalid_value("ground_truth", config.ground_truth,
                            "must name the ground-truth CSV when pair_source is ground_truth")


def _mix_dataset_fits_sampling(config: TrainingConfig) -> None:
    if config.mix_sampling_rate and not config.mix_dataset:
        raise invalid_value("mix_dataset", config.mix_dataset, (
            f"must name the training images to mix in when mix_sampling_rate={config.mix_sampling_rate} "
            "(or set mix_sampling_rate 0 for ground-truth pairs only)"))
    if config.mix_dataset and (config.pair_source != "ground_truth" or not config.mix_sampling_rate):
        raise invalid_value("mix_dataset", config.mix_dataset,
                            "is only used by pair_source ground_truth with mix_sampling_rate > 0")


def _schedule_ends_below_start(config: TrainingConfig) -> None:
    if config.min_learning_rate > config.learning_rate:
        raise invalid_value("min_learning_rate", config.min_learning_rate,
                            f"must not exceed learning_rate={config.learning_rate}")


def _mining_fits_model(config: TrainingConfig) -> None:
    allowed = {"descriptor": ("ghnm", "off"), "matcher": ("pairs", "off")}[config.model_type]
    if config.resolved("hard_negative_mining") not in allowed:
        raise invalid_value("hard_negative_mining", config.hard_negative_mining, (
            f"must be one of {allowed} for the {config.model_type} (the descriptor mines negatives for its "
            "batches, GHNM; the matcher for its negative pairs)"))


def _descriptor_trains_on_copies(config: TrainingConfig) -> None:
    if config.model_type == "descriptor" and config.resolved("positive_rate") != 1.0:
        raise invalid_value("positive_rate", config.positive_rate, (
            "must be 1.0 for the descriptor: it trains on copy pairs only, its negatives are the other pairs "
            "of the batch"))


def _slots_need_ghnm(config: TrainingConfig) -> None:
    if config.hard_negative_slots and (config.model_type != "descriptor" or config.hard_negative_mining == "off"):
        raise invalid_value("hard_negative_slots", config.hard_negative_slots,
                            "needs the descriptor with hard_negative_mining ghnm (or null)")


def _ghnm_batch_pairs_up(config: TrainingConfig) -> None:
    if config.model_type == "descriptor" and config.resolved("hard_negative_mining") == "ghnm":
        if config.per_device_train_batch_size % 2 and not config.hard_negative_slots:
            raise invalid_value("per_device_train_batch_size", config.per_device_train_batch_size,
                                "must be even for GHNM (an image and its neighbour)")


def _mining_has_graph(config: TrainingConfig) -> None:
    if config.hard_negative_mining in ("ghnm", "pairs") and not config.knn_graph and config.pair_source == "edits":
        raise invalid_value("knn_graph", config.knn_graph, (
            f"hard_negative_mining={config.hard_negative_mining!r} needs the k-NN graph of the training images "
            "(build it with scripts/build_knn.py and pass --knn_graph <file>); for random negatives set "
            "hard_negative_mining: null"))


def _templates_need_copies(config: TrainingConfig) -> None:
    if config.template_share and config.pair_source != "edits":
        raise invalid_value("template_share", config.template_share,
                            "needs pair_source edits (shared-template groups are made of PixTrace copies); set it to 0")


def _one_of_resume_and_overwrite(config: TrainingConfig) -> None:
    if config.overwrite_output_dir and config.resume:
        raise invalid_value("overwrite_output_dir", config.overwrite_output_dir,
                            f"starts a new run, while resume={config.resume!r} continues the earlier one: give one")


def _frozen_encoder_is_the_matchers(config: TrainingConfig) -> None:
    if config.freeze_encoder and config.model_type != "matcher":
        raise invalid_value("freeze_encoder", config.freeze_encoder,
                            "is for the matcher (its encoder blocks come before the fusion blocks); the descriptor is "
                            "all encoder")


def _sizes_fit_model(config: TrainingConfig) -> None:
    if config.model_name_or_path:  # the sizes not given are the folder's: checked when the model is loaded
        size, patch = config.model.get("image_size"), config.model.get("patch_size")
    else:
        size, patch = config.model.get("image_size", 224), config.model.get("patch_size", 16)
    if config.max_source_side and isinstance(size, int) and config.max_source_side < size:
        raise invalid_value("max_source_side", config.max_source_side,
                            f"must be 0 (off) or at least the model's image_size={size}")
    if isinstance(size, int) and isinstance(patch, int) and patch > 0 and size % patch:
        raise invalid_value("model.image_size", size, f"must be a multiple of model.patch_size={patch}")


@dataclass
class TrainingConfig(CheckedFields):
    """All options of a training run (see ``configs/*.yaml`` for the paper's settings).

    Each field's ``metadata["help"]`` says what it does (``python -m copynce_hf.training --help`` lists
    them with their types and defaults), its ``metadata["checks"]`` what a valid value is; the rules that
    relate fields are ``cross_field_checks``, run after them (:class:`~copynce_hf.configuration.field_checks.CheckedFields`). Options left ``null`` whose default depends on ``model_type``
    follow the table of the module docstring. The optimisation defaults are the paper's supplementary
    table: AdamW (0.9, 0.999), weight decay 0.04, lr = base * sqrt(global batch / 1024), one warm-up
    epoch, cosine to 2e-6, gradient clipping 3.0.
    """

    # model
    model_type: str = _option("descriptor", "descriptor or matcher.", checks=one_of(_MODEL_TYPES))
    model: dict = _option(factory=dict, help=(
        "Overrides of the model configuration (CopyNCEDescriptorConfig / CopyNCEMatcherConfig keys: hidden_size, "
        "num_hidden_layers, image_size, patch_size, descriptor_dim, copynce_weight, ...); on the command line "
        "one key at a time as --model.<key> value."), checks=_MAPPING)
    model_name_or_path: str | None = _option(None, (
        "A saved CopyNCE model (folder or Hub id) to start from (finetuning, second stage): its architecture and "
        "weights; model keys given explicitly override its configuration (image_size: the position embeddings are "
        "interpolated). Without --config, the run takes the other options from the tiny configuration of the "
        "folder's model type, with none of that file's model keys and a learning rate of 1e-4."))
    ignore_mismatched_sizes: bool = _option(False, (
        "With model_name_or_path: re-initialise the weights whose shape a model key changes (transformers' "
        "ignore_mismatched_sizes; e.g. a finetuning's new descriptor_dim head). false: such a key is refused, naming "
        "it with the folder's value."), checks=_BOOLEAN)
    init_from_dino: str | None = _option(None, (
        "A DINO ViT to initialise the encoder from: facebook/dino-vits16, a local ViT folder or a DINO .pth file."))
    freeze_encoder: bool = _option(False, (
        "Beyond the paper, matcher only: the patch embedding, position embeddings and encoder blocks take no gradient; "
        "the fusion blocks, the fusion CLS, the segment embeddings and the classifier train. A continuation that "
        "keeps every image's encoder tokens (the content tokens and token stores of earlier runs stay valid)."))
    # data
    dataset: str | None = _option(None, (
        "null (the bundled sample images), a DISC21 folder, an image folder, a folder saved with save_to_disk, "
        "a Parquet file or folder of Parquet shards, a Hub dataset snapshot folder or a Hub dataset id."))
    dataset_split: str = _option("train", "The split of the dataset to train on.")
    dataset_config: str | None = _option(None, "The configuration of a Hub dataset (or snapshot).")
    dataset_revision: str | None = _option(None, "The revision (branch, tag or commit) of a Hub dataset.")
    dataset_token: str | None = _option(None, (
        "An access token for a Hub dataset (null: the token of huggingface-cli login / HF_TOKEN; prefer those "
        "to a token in a file)."))
    image_column: str | None = _option(None, "The column holding the images (null: found from the features).")
    id_column: str | None = _option(None, "The column holding the image ids (null: file names or row numbers).")
    streaming: bool | None = _option(None, "Stream the dataset (null: Hub ids stream, local sources are indexed).")
    shuffle_buffer_size: int = _option(1000, "The shuffle buffer of a streamed dataset.", checks=number(integer=True, low=0))
    pair_source: str = _option("edits", (
        "edits (PixTrace copies of each original) or ground_truth (finetuning on DISC21 dev queries and their "
        "references from ground_truth)."), checks=one_of(_PAIR_SOURCES))
    ground_truth: str | None = _option(None, "The DISC21 ground-truth CSV (pair_source ground_truth).")
    mix_dataset: str | None = _option(None, (
        "pair_source ground_truth: training images (a source as for dataset, split dataset_split) whose copy pairs "
        "are mixed with the pairs of ground_truth, as the authors' finetuning (the DISC21 training set); null: "
        "the pairs of ground_truth only (the paper's form)."))
    mix_sampling_rate: float = _option(0.0, (
        "The fraction of mix_dataset's images that make one copy pair each per epoch, a new sample every epoch (the "
        "authors' sampling_rate 0.0833); 0: no mix. The pairs follow mix_query_recipe and mix_positive_rate, their "
        "references are only resized, their negatives use knn_graph (of mix_dataset), hard_negative_k, "
        "hard_negative_prob and negative_query_resize_prob."), checks=_FRACTION)
    mix_query_recipe: str = _option("paper_matcher", "The edit recipe of the mixed training pairs' queries.", checks=_recipe)
    mix_positive_rate: float = _option(0.3, "The fraction of the mixed training pairs that are copies (authors: 0.3).", checks=_FRACTION)
    query_recipe: str = _option("training", (
        "The edit recipe of the queries: training, paper_descriptor, paper_matcher, off (no random edit: resized to "
        "the model input; quote it in YAML) or resize (copynce_hf.data.pairs.RECIPES)."), checks=_recipe)
    reference_recipe: str = _option("off", "The edit recipe of the references (same names as query_recipe).", checks=_recipe)
    other_images: str = _option("training_images", (
        "The other image of the crop group's pastes (paper recipes): training_images (another image of the training "
        "data, as the authors' code; a streamed dataset draws it from its last 256 images; the copy's recipe names it "
        "by id) or procedural (noise or gradient images, no second image read)."), checks=one_of(OTHER_IMAGES))
    max_source_side: int | None = _option(None, (
        "Originals are shrunk to this longer side before editing (null: 4 x the model's image size; 0: never)."), checks=number(optional=True, integer=True, low=0))
    positive_rate: float | None = _option(None, (
        "The fraction of pairs that are copies (null: 1.0 for the descriptor, 0.3 for the matcher)."), checks=number(optional=True, low=0, high=1))
    hard_negative_mining: str | None = _option(None, (
        "ghnm (the descriptor's batches, GHNM) or pairs (the matcher's negative pairs) need knn_graph; off never "
        "mines; null gives random negatives without a graph and the model type's mining with one."), checks=one_of(_HNM, optional=True))
    hard_negative_k: int | None = _option(None, "Neighbours a hard negative is drawn from (null: 8 / 128).", checks=_OPTIONAL_COUNT)
    hard_negative_prob: float | None = _option(None, (
        "The probability that a negative is a hard one (null: 1.0 for the descriptor, 0.5 for the matcher)."), checks=number(optional=True, low=0, high=1))
    negative_query_resize_prob: float = _option(0.0, (
        "The matcher's negative pairs: the probability that the query is only resized to the model input instead of "
        "copy-edited with query_recipe (the authors' code: 0.5; the paper states none: 0.0)."), checks=_FRACTION)
    negative_roles: str = _option("package", (
        "The matcher's negative pairs: package (the image a pair is drawn for is the query, its neighbour or a random "
        "other image the reference) or authors (their copy_dataset.py: the image drawn is the reference, only resized, "
        "and its neighbour or a random other image the query)."), checks=one_of(NEGATIVE_ROLES))
    knn_graph: str | None = _option(None, "The k-NN graph of the training images (from scripts/build_knn.py).")
    hard_negative_slots: bool = _option(False, (
        "The descriptor's batch structure: false, per_device_train_batch_size pairs per process (half anchors, half "
        "their hard negatives); true (the authors' code), that many slots, each an anchor's pair and its hard "
        "negative's pair (twice as many pairs; the learning-rate scaling counts slots)."), checks=_BOOLEAN)
    copy_to_copy_share: float = _option(0.0, (
        "Beyond the paper: the fraction of pairs whose reference is an edited copy too, made with "
        "reference_copy_recipe instead of reference_recipe (copy-to-copy positives; CopyNCE's prior comes from both "
        "tables; the matcher's negatives draw it too). 0.0: the paper's pairs."), checks=_FRACTION)
    reference_copy_recipe: str = _option("light_copy", (
        "The edit recipe of the references drawn for copy_to_copy_share (light_copy: a few mild edits, "
        "CopyRecipe.light_copy)."), checks=_recipe)
    template_share: float = _option(0.0, (
        "Beyond the paper: the fraction of a batch's slots that form shared-template groups (the first "
        "round(share x batch) slots, in groups of template_group_size): every slot of a group puts its query into the "
        "group's one template (an app frame, a meme band, a background photo, an overlay), so different images in the "
        "same template are negatives of each other (copynce_hf.data.templated). 0.0: the paper's batches."),
        checks=_FRACTION)
    template_group_size: int = _option(3, "Slots per shared-template group (at least 2).",
                                       checks=number(integer=True, low=2))
    template_reference_prob: float = _option(0.5, (
        "The probability that a templated slot's positive reference is put into the template too (a matcher "
        "negative's reference, another image of the group, always is)."), checks=_FRACTION)
    template_weights: dict | None = _option(None, (
        f"The weights of the template kinds {TEMPLATE_KINDS} (a kind of weight 0 is never drawn; null: "
        "TemplateRecipe's defaults, frame 0.35, meme 0.25, background 0.25, overlay 0.15)."), checks=_template_weights)
    copynce_reverse_prior: str = _option("exact", (
        "How the collator makes the reference -> query overlap prior: exact (the inverse table) or scatter (the "
        "authors' scatter inverse of the query's table), see PixTraceCollator."), checks=one_of(REVERSE_PRIORS))
    dataloader_num_workers: int = _option(0, "Data-loader worker processes per training process.", checks=_NON_NEGATIVE_INTEGER)
    max_image_pixels: int | None = _option(None, (
        "The largest accepted image (width x height); larger ones are skipped and counted with the other skipped "
        "images (null: copynce_hf.images.MAX_IMAGE_PIXELS)."), checks=_OPTIONAL_COUNT)
    num_eval_images: int = _option(0, "Images held out of the training set for the periodic evaluation.", checks=_NON_NEGATIVE_INTEGER)
    # optimisation
    seed: int = _option(0, "The seed of the pairs, the sampler and the model's initialisation.", checks=_NON_NEGATIVE_INTEGER)
    max_steps: int | None = _option(None, "Optimiser steps of the run (null: num_train_epochs decides).", checks=_OPTIONAL_COUNT)
    num_train_epochs: float = _option(30.0, "Epochs of the run when max_steps is null.", checks=_POSITIVE)
    per_device_train_batch_size: int = _option(96, "Pairs (or slots, see hard_negative_slots) per process and batch.", checks=_COUNT)
    gradient_accumulation_steps: int = _option(1, "Batches accumulated into one optimiser step.", checks=_COUNT)
    learning_rate: float = _option(6e-4, (
        "The base learning rate; the optimiser uses learning_rate x sqrt(global batch / lr_reference_batch_size), "
        "global batch = per_device x processes x accumulation (see scale_learning_rate)."), checks=_POSITIVE)
    scale_learning_rate: bool = _option(True, "Scale the learning rate with the global batch (false: use it as is).")
    lr_reference_batch_size: int = _option(1024, "The batch size at which the learning rate is used unscaled.", checks=_COUNT)
    min_learning_rate: float = _option(2e-6, "The end of the cosine schedule.", checks=_NON_NEGATIVE)
    weight_decay: float = _option(0.04, "AdamW weight decay (not applied to biases, norms, position embeddings).", checks=_NON_NEGATIVE)
    adam_beta1: float = _option(0.9, "AdamW beta1.", checks=_BETA)
    adam_beta2: float = _option(0.999, "AdamW beta2.", checks=_BETA)
    adam_epsilon: float = _option(1e-8, "AdamW epsilon.", checks=_POSITIVE)
    warmup_epochs: float = _option(1.0, "Epochs of linear warm-up (capped at a fifth of the run).", checks=_NON_NEGATIVE)
    warmup_start_factor: float = _option(0.0, (
        "The warm-up starts at this fraction of the learning rate (0.0: from zero; the authors' code: 0.01)."), checks=_FRACTION)
    cosine_span: str = _option("after_warmup", (
        "The length of the cosine that follows the warm-up: after_warmup (it ends at min_learning_rate at the last "
        "step) or run (the authors' code, timm's warmup_prefix: the cosine lasts as long as the whole run, so the run "
        "stops when (run - warm-up) / run of it has passed, 29/30 for 30 epochs with one of warm-up)."), checks=one_of(COSINE_SPANS))
    warmup_steps: int | None = _option(None, "Optimiser steps of linear warm-up (null: warmup_epochs decides).", checks=number(optional=True, integer=True, low=0))
    max_grad_norm: float = _option(3.0, "Gradient clipping (the global norm).", checks=_POSITIVE)
    ema_decay: float | None = _option(None, (
        "Keep an exponential moving average of the weights with this decay (null: none; 0.99 averages about the "
        "last hundred steps). The evaluation scores both; the model folder holds the average and its without_ema/ "
        "subfolder the trained weights (copynce_hf.training.ema). Not in the paper."), checks=(number(optional=True, positive=True), _BELOW_ONE))
    mixed_precision: str | None = _option(None, (
        "null: what accelerate launch --mixed_precision or accelerate config chose (no without either); no, fp16, "
        "bf16 or fp8 override them. The training log and summary state the precision in effect."), checks=_PRECISION)
    max_train_seconds: float | None = _option(None, (
        "A wall-time budget for the optimisation loop (null: none): the run stops at the first optimiser step past "
        "it, then evaluates and saves as at max_steps (the schedule keeps its max_steps length). All processes stop "
        "at the same step."), checks=number(optional=True, positive=True))
    # outputs
    output_dir: str = _option("outputs/copynce", "The run's folder: model, checkpoints/, logs/, training_summary.json.", checks=_FOLDER)
    logging_steps: int = _option(10, "Log the training values every this many optimiser steps.", checks=_COUNT)
    eval_steps: int | None = _option(None, "Evaluate on the held-out images every this many steps (and at the end).", checks=_OPTIONAL_COUNT)
    checkpointing_steps: int | None = _option(None, "Write a checkpoint every this many steps (null: none).", checks=_OPTIONAL_COUNT)
    checkpoints_total_limit: int | None = _option(3, "Checkpoints kept (the newest); null keeps all.", checks=_OPTIONAL_COUNT)
    resume: str | None = _option(None, "A checkpoint folder to continue from, or latest (the newest complete one).")
    overwrite_output_dir: bool = _option(False, (
        "Start a new run in an output_dir that holds an earlier run (its model, summary or checkpoints; the "
        "earlier checkpoints are deleted at the start). false: such a folder is refused unless resume continues "
        "the earlier run."), checks=_BOOLEAN)
    report_to: str = _option("tensorboard", "An Accelerate tracker (tensorboard, wandb, mlflow, ..., all) or none.", checks=_TRACKER)
    push_to_hub: str | None = _option(None, "A Hub repository id to upload the trained model to.")
    hub_private_repo: bool = _option(False, "Create the Hub repository as private.")

    cross_field_checks = (_ground_truth_named, _mix_dataset_fits_sampling, _schedule_ends_below_start,
                          _mining_fits_model, _descriptor_trains_on_copies, _slots_need_ghnm, _ghnm_batch_pairs_up,
                          _mining_has_graph, _templates_need_copies, _sizes_fit_model, _frozen_encoder_is_the_matchers,
                          _one_of_resume_and_overwrite)

    # ------------------------------------------------------------------ derived values
    def resolved(self, key: str):
        """The value of a model-type dependent option (its explicit value, else the paper's default)."""
        value = getattr(self, key)
        return _MODEL_DEFAULTS[self.model_type][key] if value is None else value

    def effective_learning_rate(self, num_processes: int) -> float:
        """Paper: lr = base_lr * sqrt(batch / 1024), with the global batch of one optimiser step."""
        if not self.scale_learning_rate:
            return self.learning_rate
        batch = self.per_device_train_batch_size * num_processes * self.gradient_accumulation_steps
        return self.learning_rate * math.sqrt(batch / self.lr_reference_batch_size)

    @property
    def pairs_per_batch(self) -> int:
        """Pairs in one batch of one process: ``per_device_train_batch_size``, twice that with
        ``hard_negative_slots`` (each slot an anchor pair and its hard negative's pair)."""
        return self.per_device_train_batch_size * (2 if self.hard_negative_slots else 1)

    def to_dict(self) -> dict[str, Any]:
        """The settings, as logged and tracked; an access token is replaced by ``"***"``."""
        settings = dataclasses.asdict(self)
        if settings.get("dataset_token"):
            settings["dataset_token"] = "***"
        return settings


_FIELDS = {f.name: f for f in dataclasses.fields(TrainingConfig)}


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads exponent floats without a dot (``1e-4``) as numbers.

    PyYAML follows YAML 1.1, where ``1e-4`` is a string; in a configuration file or on a command
    line it means a number (YAML 1.2 reads it so).
    """


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789.")
)


def parse_value(option: str, text: str) -> Any:
    """A command-line string as the YAML value a configuration file would hold (true, null, [1, 2], 64,
    0.5, 1e-4); ``option`` names it in the error."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"cannot parse --{option} {text!r}: {error}") from error


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping of keys a YAML configuration file holds (not checked yet)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {str(path)!r} does not exist")
    loaded = yaml.load(path.read_text(), Loader=_ConfigLoader) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"configuration file {str(path)!r} must hold a mapping of keys")
    return loaded


def load_config(path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> TrainingConfig:
    """Read a YAML configuration, apply overrides, check every value.

    ``model`` overrides are merged into the file's ``model`` mapping key by key. Without ``model_type``, a run
    from a saved model (``model_name_or_path``) trains one of that model's kind.
    """
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        values.update(read_config_file(path))
    for key, value in (overrides or {}).items():
        if key == "model" and isinstance(value, dict):
            values["model"] = {**(values.get("model") or {}), **value}
        else:
            values[key] = value
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"unknown configuration key(s) {unknown} in {str(path) if path else 'overrides'}")
    if values.get("model") is None:
        values["model"] = {}
    if values.get("model_name_or_path") and "model_type" not in values:  # the kind of the model it continues
        values["model_type"] = saved_model_kind(values["model_name_or_path"])
    for key in ("query_recipe", "reference_recipe"):  # a configuration saved before a recipe was renamed
        if isinstance(values.get(key), str) and values[key] in _OLD_RECIPE_NAMES:
            values[key] = _OLD_RECIPE_NAMES[values[key]]
    return TrainingConfig(**values)
