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

from ..modeling.errors import ConfigError

__all__ = ["TrainingConfig", "load_config", "parse_value", "CONFIG_DIR", "DEFAULT_CONFIG"]

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


def _option(default: Any = None, help: str = "", factory=None):
    """A configuration field with its ``--help`` text (``metadata["help"]``, as in ``transformers.TrainingArguments``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainingConfig:
    """All options of a training run (see ``configs/*.yaml`` for the paper's settings).

    Each field's ``metadata["help"]`` says what it does (``python -m copynce_hf.training --help`` lists
    them with their types and defaults). Options left ``null`` whose default depends on ``model_type``
    follow the table of the module docstring. The optimisation defaults are the paper's supplementary
    table: AdamW (0.9, 0.999), weight decay 0.04, lr = base * sqrt(global batch / 1024), one warm-up
    epoch, cosine to 2e-6, gradient clipping 3.0.
    """

    # model
    model_type: str = _option("descriptor", "descriptor or matcher.")
    model: dict = _option(factory=dict, help=(
        "Overrides of the model configuration (CopyNCEDescriptorConfig / CopyNCEMatcherConfig keys: hidden_size, "
        "num_hidden_layers, image_size, patch_size, descriptor_dim, copynce_weight, ...); on the command line "
        "one key at a time as --model.<key> value."))
    model_name_or_path: str | None = _option(None, "A saved CopyNCE model to start from (finetuning, second stage).")
    init_from_dino: str | None = _option(None, (
        "A DINO ViT to initialise the encoder from: facebook/dino-vits16, a local ViT folder or a DINO .pth file."))
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
    shuffle_buffer_size: int = _option(1000, "The shuffle buffer of a streamed dataset.")
    pair_source: str = _option("edits", (
        "edits (PixTrace copies of each original) or ground_truth (finetuning on DISC21 dev queries and their "
        "references from ground_truth)."))
    ground_truth: str | None = _option(None, "The DISC21 ground-truth CSV (pair_source ground_truth).")
    mix_dataset: str | None = _option(None, (
        "pair_source ground_truth: training images (a source as for dataset, split dataset_split) whose copy pairs "
        "are mixed with the pairs of ground_truth, as the authors' finetuning (the DISC21 training set); null: "
        "the pairs of ground_truth only (the paper's form)."))
    mix_sampling_rate: float = _option(0.0, (
        "The fraction of mix_dataset's images that make one copy pair each per epoch, a new sample every epoch (the "
        "authors' sampling_rate 0.0833); 0: no mix. The pairs follow mix_query_recipe and mix_positive_rate, their "
        "references are only resized, their negatives use knn_graph (of mix_dataset), hard_negative_k, "
        "hard_negative_prob and negative_query_resize_prob."))
    mix_query_recipe: str = _option("paper_matcher", "The edit recipe of the mixed training pairs' queries.")
    mix_positive_rate: float = _option(0.3, "The fraction of the mixed training pairs that are copies (authors: 0.3).")
    query_recipe: str = _option("training", (
        "The edit recipe of the queries: training, paper_descriptor, paper_matcher, off (no random edit: resized to "
        "the model input; quote it in YAML) or resize (copynce_hf.data.pairs.RECIPES)."))
    reference_recipe: str = _option("off", "The edit recipe of the references (same names as query_recipe).")
    other_images: str = _option("training_images", (
        "The other image of the crop group's pastes (paper recipes): training_images (another image of the training "
        "data, as the authors' code; a streamed dataset draws it from its last 256 images; the copy's recipe names it "
        "by id) or procedural (noise or gradient images, no second image read)."))
    max_source_side: int | None = _option(None, (
        "Originals are shrunk to this longer side before editing (null: 4 x the model's image size; 0: never)."))
    positive_rate: float | None = _option(None, (
        "The fraction of pairs that are copies (null: 1.0 for the descriptor, 0.3 for the matcher)."))
    hard_negative_mining: str | None = _option(None, (
        "ghnm (the descriptor's batches, GHNM) or pairs (the matcher's negative pairs) need knn_graph; off never "
        "mines; null gives random negatives without a graph and the model type's mining with one."))
    hard_negative_k: int | None = _option(None, "Neighbours a hard negative is drawn from (null: 8 / 128).")
    hard_negative_prob: float | None = _option(None, (
        "The probability that a negative is a hard one (null: 1.0 for the descriptor, 0.5 for the matcher)."))
    negative_query_resize_prob: float = _option(0.0, (
        "The matcher's negative pairs: the probability that the query is only resized to the model input instead of "
        "copy-edited with query_recipe (the authors' code: 0.5; the paper states none: 0.0)."))
    knn_graph: str | None = _option(None, "The k-NN graph of the training images (from scripts/build_knn.py).")
    hard_negative_slots: bool = _option(False, (
        "The descriptor's batch structure: false, per_device_train_batch_size pairs per process (half anchors, half "
        "their hard negatives); true (the authors' code), that many slots, each an anchor's pair and its hard "
        "negative's pair (twice as many pairs; the learning-rate scaling counts slots)."))
    copynce_reverse_prior: str = _option("exact", (
        "How the collator makes the reference -> query overlap prior: exact (the inverse table) or scatter (the "
        "authors' scatter inverse of the query's table), see PixTraceCollator."))
    dataloader_num_workers: int = _option(0, "Data-loader worker processes per training process.")
    max_image_pixels: int | None = _option(None, (
        "The largest accepted image (width x height); larger ones are skipped and counted like unreadable ones "
        "(null: copynce_hf.images.MAX_IMAGE_PIXELS)."))
    num_eval_images: int = _option(0, "Images held out of the training set for the periodic evaluation.")
    # optimisation
    seed: int = _option(0, "The seed of the pairs, the sampler and the model's initialisation.")
    max_steps: int | None = _option(None, "Optimiser steps of the run (null: num_train_epochs decides).")
    num_train_epochs: float = _option(30.0, "Epochs of the run when max_steps is null.")
    per_device_train_batch_size: int = _option(96, "Pairs (or slots, see hard_negative_slots) per process and batch.")
    gradient_accumulation_steps: int = _option(1, "Batches accumulated into one optimiser step.")
    learning_rate: float = _option(6e-4, (
        "The base learning rate; the optimiser uses learning_rate x sqrt(global batch / lr_reference_batch_size), "
        "global batch = per_device x processes x accumulation (see scale_learning_rate)."))
    scale_learning_rate: bool = _option(True, "Scale the learning rate with the global batch (false: use it as is).")
    lr_reference_batch_size: int = _option(1024, "The batch size at which the learning rate is used unscaled.")
    min_learning_rate: float = _option(2e-6, "The end of the cosine schedule.")
    weight_decay: float = _option(0.04, "AdamW weight decay (not applied to biases, norms, position embeddings).")
    adam_beta1: float = _option(0.9, "AdamW beta1.")
    adam_beta2: float = _option(0.999, "AdamW beta2.")
    adam_epsilon: float = _option(1e-8, "AdamW epsilon.")
    warmup_epochs: float = _option(1.0, "Epochs of linear warm-up (capped at a fifth of the run).")
    warmup_start_factor: float = _option(0.0, (
        "The warm-up starts at this fraction of the learning rate (0.0: from zero; the authors' code: 0.01)."))
    cosine_span: str = _option("after_warmup", (
        "The length of the cosine that follows the warm-up: after_warmup (it ends at min_learning_rate at the last "
        "step) or run (the authors' code, timm's warmup_prefix: the cosine lasts as long as the whole run, so the run "
        "stops when (run - warm-up) / run of it has passed, 29/30 for 30 epochs with one of warm-up)."))
    warmup_steps: int | None = _option(None, "Optimiser steps of linear warm-up (null: warmup_epochs decides).")
    max_grad_norm: float = _option(3.0, "Gradient clipping (the global norm).")
    ema_decay: float | None = _option(None, (
        "Keep an exponential moving average of the weights with this decay (null: none; 0.99 averages about the "
        "last hundred steps). The evaluation scores both; the model folder holds the average and its without_ema/ "
        "subfolder the trained weights (copynce_hf.training.ema). Not in the paper."))
    mixed_precision: str | None = _option(None, (
        "null: what accelerate launch --mixed_precision or accelerate config chose (no without either); no, fp16, "
        "bf16 or fp8 override them. The training log and summary state the precision in effect."))
    max_train_seconds: float | None = _option(None, (
        "A wall-time budget for the optimisation loop (null: none): the run stops at the first optimiser step past "
        "it, then evaluates and saves as at max_steps (the schedule keeps its max_steps length). All processes stop "
        "at the same step."))
    # outputs
    output_dir: str = _option("outputs/copynce", "The run's folder: model, checkpoints/, logs/, training_summary.json.")
    logging_steps: int = _option(10, "Log the training values every this many optimiser steps.")
    eval_steps: int | None = _option(None, "Evaluate on the held-out images every this many steps (and at the end).")
    checkpointing_steps: int | None = _option(None, "Write a checkpoint every this many steps (null: none).")
    checkpoints_total_limit: int | None = _option(3, "Checkpoints kept (the newest); null keeps all.")
    resume: str | None = _option(None, "A checkpoint folder to continue from, or latest (the newest complete one).")
    report_to: str = _option("tensorboard", "An Accelerate tracker (tensorboard, wandb, mlflow, ..., all) or none.")
    push_to_hub: str | None = _option(None, "A Hub repository id to upload the trained model to.")
    hub_private_repo: bool = _option(False, "Create the Hub repository as private.")

    def __post_init__(self):
        self.validate()

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

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid key."""

        def fail(key: str, requirement: str):
            raise ConfigError(f"invalid configuration value {key}={getattr(self, key)!r}: {requirement}")

        def number(key, positive=False, allow_none=False, integer=False, low=None, high=None):
            value = getattr(self, key)
            if value is None:
                if not allow_none:
                    fail(key, "must be set")
                return
            kind = int if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
                fail(key, "must be an integer" if integer else "must be a finite number")
            if positive and value <= 0:
                fail(key, "must be > 0")
            if low is not None and value < low:
                fail(key, f"must be >= {low}")
            if high is not None and value > high:
                fail(key, f"must be <= {high}")

        if self.model_type not in _MODEL_TYPES:
            fail("model_type", f"must be one of {_MODEL_TYPES}")
        if not isinstance(self.model, dict):
            fail("model", "must be a mapping of model configuration keys")
        if self.pair_source not in _PAIR_SOURCES:
            fail("pair_source", f"must be one of {_PAIR_SOURCES}")
        if self.pair_source == "ground_truth" and not self.ground_truth:
            fail("ground_truth", "must name the ground-truth CSV when pair_source is ground_truth")
        number("mix_sampling_rate", low=0, high=1)
        number("mix_positive_rate", low=0, high=1)
        if self.mix_sampling_rate and not self.mix_dataset:
            fail("mix_dataset", f"must name the training images to mix in when mix_sampling_rate="
                 f"{self.mix_sampling_rate} (or set mix_sampling_rate 0 for ground-truth pairs only)")
        if self.mix_dataset and (self.pair_source != "ground_truth" or not self.mix_sampling_rate):
            fail("mix_dataset", "is only used by pair_source ground_truth with mix_sampling_rate > 0")
        from ..data.pairs import OTHER_IMAGES, RECIPES

        for key in ("query_recipe", "reference_recipe", "mix_query_recipe"):
            if getattr(self, key) not in RECIPES:
                fail(key, f"must be one of {RECIPES}" + (" (in YAML, write \"off\" in quotes: bare off is false)"
                                                          if getattr(self, key) is False else ""))
        if self.hard_negative_mining is not None and self.hard_negative_mining not in _HNM:
            fail("hard_negative_mining", f"must be one of {_HNM}")
        if self.mixed_precision is not None and self.mixed_precision not in _MIXED_PRECISION:
            fail("mixed_precision", f"must be null (accelerate launch / accelerate config decides) or one of "
                 f"{_MIXED_PRECISION}")
        from .optim import COSINE_SPANS

        if self.other_images not in OTHER_IMAGES:
            fail("other_images", f"must be one of {OTHER_IMAGES}")
        if self.cosine_span not in COSINE_SPANS:
            fail("cosine_span", f"must be one of {COSINE_SPANS}")
        number("positive_rate", allow_none=True, low=0, high=1)
        number("negative_query_resize_prob", low=0, high=1)
        number("warmup_start_factor", low=0, high=1)
        number("hard_negative_prob", allow_none=True, low=0, high=1)
        number("hard_negative_k", allow_none=True, integer=True, positive=True)
        number("shuffle_buffer_size", integer=True, low=0)
        number("max_source_side", allow_none=True, integer=True, low=0)
        number("dataloader_num_workers", integer=True, low=0)
        number("max_image_pixels", allow_none=True, integer=True, positive=True)
        number("num_eval_images", integer=True, low=0)
        number("seed", integer=True, low=0)
        number("max_steps", allow_none=True, integer=True, positive=True)
        number("max_train_seconds", allow_none=True, positive=True)
        number("num_train_epochs", positive=True)
        number("per_device_train_batch_size", integer=True, positive=True)
        number("gradient_accumulation_steps", integer=True, positive=True)
        number("learning_rate", positive=True)
        number("lr_reference_batch_size", integer=True, positive=True)
        number("min_learning_rate", low=0)
        if self.min_learning_rate > self.learning_rate:
            fail("min_learning_rate", f"must not exceed learning_rate={self.learning_rate}")
        number("weight_decay", low=0)
        number("adam_beta1", low=0, high=0.999999)
        number("adam_beta2", low=0, high=0.999999)
        number("adam_epsilon", positive=True)
        number("warmup_epochs", low=0)
        number("warmup_steps", allow_none=True, integer=True, low=0)
        number("max_grad_norm", positive=True)
        number("ema_decay", allow_none=True, positive=True)
        if self.ema_decay is not None and self.ema_decay >= 1:
            fail("ema_decay", "must be < 1 (or null for no weight average)")
        number("logging_steps", integer=True, positive=True)
        number("eval_steps", allow_none=True, integer=True, positive=True)
        number("checkpointing_steps", allow_none=True, integer=True, positive=True)
        number("checkpoints_total_limit", allow_none=True, integer=True, positive=True)
        if not isinstance(self.output_dir, str) or not self.output_dir:
            fail("output_dir", "must be a folder path")
        if self.report_to not in ("tensorboard", "none", "all", "wandb", "mlflow", "comet_ml", "aim", "clearml"):
            fail("report_to", "must be an Accelerate tracker name or 'none'")
        allowed = {"descriptor": ("ghnm", "off"), "matcher": ("pairs", "off")}[self.model_type]
        if self.resolved("hard_negative_mining") not in allowed:
            fail("hard_negative_mining", f"must be one of {allowed} for the {self.model_type} (the descriptor "
                 "mines negatives for its batches, GHNM; the matcher for its negative pairs)")
        if self.model_type == "descriptor" and self.resolved("positive_rate") != 1.0:
            fail("positive_rate", "must be 1.0 for the descriptor: it trains on copy pairs only, its negatives "
                 "are the other pairs of the batch")
        from ..pixtrace.overlap import REVERSE_PRIORS

        if self.copynce_reverse_prior not in REVERSE_PRIORS:
            fail("copynce_reverse_prior", f"must be one of {REVERSE_PRIORS}")
        if not isinstance(self.hard_negative_slots, bool):
            fail("hard_negative_slots", "must be true or false")
        if self.hard_negative_slots and (self.model_type != "descriptor" or self.hard_negative_mining == "off"):
            fail("hard_negative_slots", "needs the descriptor with hard_negative_mining ghnm (or null)")
        if self.model_type == "descriptor" and self.resolved("hard_negative_mining") == "ghnm":
            if self.per_device_train_batch_size % 2 and not self.hard_negative_slots:
                fail("per_device_train_batch_size", "must be even for GHNM (an image and its neighbour)")
        if self.hard_negative_mining in ("ghnm", "pairs") and not self.knn_graph and self.pair_source == "edits":
            raise ConfigError(
                f"invalid configuration value knn_graph={self.knn_graph!r}: hard_negative_mining="
                f"{self.hard_negative_mining!r} needs the k-NN graph of the training images (build it with "
                "scripts/build_knn.py and pass --knn_graph <file>); for random negatives set "
                "hard_negative_mining: null"
            )
        size = self.model.get("image_size", 224)
        patch = self.model.get("patch_size", 16)
        if self.max_source_side and isinstance(size, int) and self.max_source_side < size:
            fail("max_source_side", f"must be 0 (off) or at least the model's image_size={size}")
        if isinstance(size, int) and isinstance(patch, int) and patch > 0 and size % patch:
            raise ConfigError(
                f"invalid configuration value model.image_size={size!r}: must be a multiple of "
                f"model.patch_size={patch}"
            )


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


def load_config(path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> TrainingConfig:
    """Read a YAML configuration, apply overrides, check every value.

    ``model`` overrides are merged into the file's ``model`` mapping key by key.
    """
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"configuration file {str(path)!r} does not exist")
        loaded = yaml.load(path.read_text(), Loader=_ConfigLoader) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"configuration file {str(path)!r} must hold a mapping of keys")
        values.update(loaded)
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
    for key in ("query_recipe", "reference_recipe"):  # a configuration saved before a recipe was renamed
        if isinstance(values.get(key), str) and values[key] in _OLD_RECIPE_NAMES:
            values[key] = _OLD_RECIPE_NAMES[values[key]]
    return TrainingConfig(**values)
