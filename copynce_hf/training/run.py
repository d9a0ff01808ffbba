"""The training run: a CopyNCE descriptor or matcher trained with Accelerate.

    python -m copynce_hf.training                                        # tiny default run on bundled images
    python -m copynce_hf.training --config tiny_cpu.yaml --max_steps 20 --model.hidden_size 32
    accelerate launch --num_processes 8 -m copynce_hf.training --config configs/descriptor_vits16_224.yaml \\
        --dataset /data/disc21 --knn_graph /data/disc21/knn.safetensors --output_dir outputs/descriptor

(``scripts/train.py`` in a source checkout is the same command.) Options are the keys of
:class:`copynce_hf.training.TrainingConfig` (``--help`` lists them), given in a YAML file (``--config``;
a path, or the name of a configuration shipped in ``copynce_hf/configs/``, the repository's
``configs/``; default: ``tiny_cpu.yaml``) and overridden as ``--key value`` (model configuration keys as
``--model.<key> value``). The flow:

    images (datasets) -> PixTrace copy pairs (DataLoader workers) -> PixTraceCollator (uint8 pixels)
      -> normalised on the device -> model(**batch).loss -> Accelerate (DDP, mixed precision, accumulation, checkpoints)
      -> save_pretrained (model, image processor, card) -> push_to_hub

Paper settings (supplementary table "All detailed settings in our training pipeline"): AdamW (0.9,
0.999), weight decay 0.04, lr = base * sqrt(global batch / 1024), one warm-up epoch then cosine to
2e-6, gradient clipping 3.0.

Interruptions: checkpoints are written into a hidden temporary folder and renamed to
``checkpoints/step_XXXXXXXX`` only when complete, so a run killed at any moment (``kill -9``
included) leaves only complete checkpoints; ``--resume latest`` continues from the newest one with
the same data and the same loss curve, skipping (with a warning) any incomplete leftover (a streamed
dataset continues from its data loader's saved iteration state, reading no consumed row again). Ctrl-C
stops with one line naming the last checkpoint and the command that continues; a configuration
error stops with one line and exit status 2 (run through ``accelerate launch``, the launcher adds its
own report of the failed process after that line).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, broadcast, set_seed
from tqdm.auto import tqdm

from copynce_hf.data import (
    CopyPairBatchSampler,
    CopyPairDataset,
    CopyPairMaker,
    GroundTruthPairDataset,
    ImageDecoder,
    KNNGraph,
    PixTraceCollator,
    StreamingCopyPairDataset,
    load_disc21_ground_truth,
    load_image_dataset,
)
from copynce_hf.errors import ConfigError
from copynce_hf.modeling import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)
from copynce_hf.outputs import OutputPathError, StagedFile, check_output_folder
from copynce_hf.training import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    WITHOUT_EMA_FOLDER,
    TrainingConfig,
    build_copy_detection_task,
    build_optimizer,
    build_scheduler,
    build_weight_ema,
    evaluate_copy_detection,
    load_config,
    parse_overrides,
    save_trained_model,
    warmup_steps_for,
)

logger = logging.getLogger("copynce_hf.train")

_MODELS = {
    "descriptor": (CopyNCEDescriptorConfig, CopyNCEDescriptorModel),
    "matcher": (CopyNCEMatcherConfig, CopyNCEMatcherModel),
}
#: Batch keys that are not model inputs.
_NOT_MODEL_INPUTS = ("num_skipped_images",)
#: Loss parts logged when the model returns them.
_LOSS_PARTS = ("loss", "infonce_loss", "koleo_loss", "copynce_loss", "bce_loss")


# ---------------------------------------------------------------------------------------------- options
def parse_args(argv: list[str] | None = None) -> TrainingConfig:
    """``--config <yaml>`` (default ``configs/tiny_cpu.yaml``) and ``--key value`` overrides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        print("Configuration keys (defaults; see copynce_hf/training/config.py for their meaning):")
        for field in dataclasses.fields(TrainingConfig):
            default = field.default_factory() if field.default is dataclasses.MISSING else field.default
            print(f"  --{field.name} (default {default!r})")
        raise SystemExit(0)
    config_path = DEFAULT_CONFIG
    if "--config" in argv:
        position = argv.index("--config")
        if position + 1 >= len(argv):
            raise ConfigError("--config needs a YAML file")
        config_path = argv[position + 1]
        del argv[position: position + 2]
        shipped = CONFIG_DIR / config_path
        if not Path(config_path).is_file() and Path(config_path).name == config_path and shipped.is_file():
            config_path = shipped  # the name of a shipped configuration (works in a regular install too)
    return load_config(config_path, parse_overrides(argv))


# ---------------------------------------------------------------------------------------------- model
def build_model(config: TrainingConfig):
    """The model (fresh, from DINO or from a saved CopyNCE folder) and its image processor."""
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
    size = model.config.image_size
    processor = CopyNCEImageProcessor(size={"height": size, "width": size})
    return model, processor


def _out_of_time(accelerator, started: float, budget_seconds: float) -> bool:
    """Whether the main process has used its wall-time budget (one decision shared by all processes)."""
    over = torch.tensor([float(time.perf_counter() - started > budget_seconds)], device=accelerator.device)
    return bool(broadcast(over, from_process=0).item())


# ---------------------------------------------------------------------------------------------- data
def _hub_dataset_options(config: TrainingConfig) -> dict:
    """``load_image_dataset`` keywords for a Hub dataset: configuration, revision, token."""
    return {"config_name": config.dataset_config, "revision": config.dataset_revision, "token": config.dataset_token}


class TrainingData:
    """The training pairs and the loader positioned at any point of the run (for exact resume)."""

    def __init__(self, config: TrainingConfig, accelerator: Accelerator, image_size: int, patch_size: int):
        self.config = config
        self.accelerator = accelerator
        self.collator = PixTraceCollator(image_size, patch_size, reverse_prior=config.copynce_reverse_prior)
        maker = CopyPairMaker(image_size, config.query_recipe, config.reference_recipe, config.max_source_side)
        mining = config.resolved("hard_negative_mining")
        streaming = config.streaming
        if streaming is None:  # Hub ids stream; local sources are indexed (paths only) and read lazily
            streaming = config.dataset is not None and not Path(config.dataset).expanduser().exists()
        self.streaming = bool(streaming) and config.pair_source == "edits"
        self.eval_rows: list[dict] = []
        self.resume_state: dict | None = None  # a streamed loader's state to continue from
        self.steps_per_epoch: float | None = None
        per_process, processes = config.per_device_train_batch_size, accelerator.num_processes
        if config.pair_source == "ground_truth":
            queries = load_image_dataset(config.dataset, "query")
            references = load_image_dataset(config.dataset, "reference")
            truth = load_disc21_ground_truth(config.ground_truth)
            self.dataset = GroundTruthPairDataset(queries, references, truth, maker, config.seed,
                                                  config.resolved("positive_rate"), decoder=self.decoder())
            self.num_rows, knn = len(self.dataset), None
        elif not self.streaming:
            images = load_image_dataset(config.dataset, config.dataset_split, image_column=config.image_column,
                                        id_column=config.id_column, **_hub_dataset_options(config))
            held_out = min(config.num_eval_images, max(0, len(images) - 2))
            if held_out:
                self.eval_rows = [images[i] for i in range(len(images) - held_out, len(images))]
                images = images.select(range(len(images) - held_out))
            knn = None
            if config.knn_graph and mining != "off":
                knn = KNNGraph.load(config.knn_graph).aligned_to(images["image_id"])
            elif mining != "off" and accelerator.is_main_process:
                logger.info("hard_negative_mining null and no knn_graph: random negatives")
            self.dataset = CopyPairDataset(
                images, maker, seed=config.seed, positive_rate=config.resolved("positive_rate"),
                knn=knn if mining == "pairs" else None, hard_negative_k=config.resolved("hard_negative_k"),
                hard_negative_prob=config.resolved("hard_negative_prob"), decoder=self.decoder())
            self.num_rows = len(images)
        else:
            if config.knn_graph or config.hard_negative_slots:
                raise ConfigError("knn_graph and hard_negative_slots need random access to the images: set "
                                  "streaming false")
            images = load_image_dataset(config.dataset, config.dataset_split, streaming=True,
                                        image_column=config.image_column, id_column=config.id_column,
                                        **_hub_dataset_options(config))
            if config.num_eval_images:
                self.eval_rows = list(images.take(config.num_eval_images))
                images = images.skip(config.num_eval_images)
            self.dataset = StreamingCopyPairDataset(
                images, maker, per_process, seed=config.seed, positive_rate=config.resolved("positive_rate"),
                process_index=accelerator.process_index, num_processes=processes,
                shuffle_buffer_size=config.shuffle_buffer_size, decoder=self.decoder())
            info = getattr(images, "info", None)
            splits = getattr(info, "splits", None) or {}
            split = splits.get(config.dataset_split) if hasattr(splits, "get") else None
            self.num_rows = getattr(split, "num_examples", None)
            knn = None
        if not self.streaming:
            self.sampler = CopyPairBatchSampler(
                self.num_rows, per_process, seed=config.seed, num_processes=processes,
                process_index=accelerator.process_index, knn=knn if mining == "ghnm" else None,
                hard_negative_k=config.resolved("hard_negative_k"),
                hard_negative_prob=config.resolved("hard_negative_prob"), paired_slots=config.hard_negative_slots)
            self.steps_per_epoch = self.sampler.batches_per_epoch / config.gradient_accumulation_steps
        elif self.num_rows:
            self.steps_per_epoch = self.num_rows / (per_process * processes * config.gradient_accumulation_steps)

    def decoder(self) -> ImageDecoder:
        """An image decoder with the run's size limit (it counts the images it skips)."""
        return ImageDecoder(max_pixels=self.config.max_image_pixels)

    def loader(self, progress: TrainingProgress, total_micro_batches: int) -> torch.utils.data.DataLoader:
        """A DataLoader that continues from ``progress`` (map-style: global batch index; stream: epoch
        and batches consumed in it)."""
        workers = self.config.dataloader_num_workers
        extra = {"num_workers": workers, "collate_fn": self.collator,
                 "pin_memory": self.accelerator.device.type == "cuda"}
        if workers:
            extra.update(prefetch_factor=4, persistent_workers=False)
        if not self.streaming:
            self.sampler.set_start(progress.micro_batches)
            self.sampler.num_batches = total_micro_batches
            return torch.utils.data.DataLoader(self.dataset, batch_sampler=self.sampler, **extra)
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.dataset.set_epoch(progress.epoch)
        # Workers send their stream state (shard positions, shuffle buffer, negative pool) with the
        # batches on which a checkpoint falls: loader batch c is global micro-batch
        # micro_batches - batch_in_epoch + c, and checkpoints fall on multiples of ``every``.
        interval = None
        if self.config.checkpointing_steps:
            every = self.config.checkpointing_steps * self.config.gradient_accumulation_steps
            interval = math.gcd((progress.batch_in_epoch - progress.micro_batches) % every, every)
        with warnings.catch_warnings():  # torchdata calls torch.set_vital, deprecated in recent torch
            warnings.filterwarnings("ignore", message=".*set_vital.*deprecated")
            loader = StatefulDataLoader(self.dataset, batch_size=self.config.per_device_train_batch_size,
                                        drop_last=True, snapshot_every_n_steps=interval, **extra)
        if self.resume_state is not None:
            loader.load_state_dict(self.resume_state)
            self.resume_state = None
        return loader

    def load_loader_state(self, checkpoint: Path, progress: TrainingProgress) -> None:
        """Continue the stream where ``checkpoint`` left it (this process's data-loader state)."""
        path = checkpoint / LOADER_STATE.format(process=self.accelerator.process_index)
        if path.is_file():
            self.resume_state = torch.load(path, weights_only=False)
        elif progress.batch_in_epoch:
            raise ConfigError(f"invalid configuration value resume={self.config.resume!r}: {checkpoint} has no "
                              f"{path.name} (written by an older version), so the streamed run cannot continue "
                              "exactly; start a new run or set streaming false")


class TrainingProgress:
    """Where the run is; saved in every checkpoint (``accelerator.register_for_checkpointing``)."""

    def __init__(self):
        self.step = 0  # optimiser steps
        self.micro_batches = 0  # batches consumed by each process
        self.epoch = 0  # streamed epochs completed
        self.batch_in_epoch = 0  # batches consumed in the current streamed epoch
        self.skipped_images = 0  # unreadable images skipped, all processes
        self.history: list[dict] = []  # logged values, for the summary

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("step", "micro_batches", "epoch", "batch_in_epoch", "skipped_images",
                                              "history")}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


# ---------------------------------------------------------------------------------------------- checkpoints
#: Written last into a checkpoint folder, before it is renamed into place: its presence marks a complete one.
CHECKPOINT_MARKER = "checkpoint_complete.json"
#: Fault injection for the tests only: ``<step>`` makes the save of that step's checkpoint pause for a
#: minute after its files are written and before it is completed, so that a test can kill the process there.
_PAUSE_IN_CHECKPOINT_ENV = "COPYNCE_TEST_PAUSE_IN_CHECKPOINT"


def checkpoint_folder(config: TrainingConfig) -> Path:
    return Path(config.output_dir) / "checkpoints"


def _step_of(path: Path) -> int:
    try:
        return int(path.name.split("_")[1])
    except (IndexError, ValueError):
        return -1


def complete_checkpoints(folder: Path, warn: bool = False) -> list[Path]:
    """The complete ``step_*`` checkpoints of ``folder``, oldest first.

    Incomplete ones (a hidden ``.step_*.partial`` folder left by a process killed while writing, or a
    ``step_*`` folder without :data:`CHECKPOINT_MARKER`) are left out, with a warning if ``warn``.
    """
    if not folder.is_dir():
        return []
    complete, incomplete = [], []
    for path in sorted(folder.iterdir(), key=_step_of):
        if path.name.startswith(".step_") and path.name.endswith(".partial"):
            incomplete.append(path)
        elif path.name.startswith("step_") and path.is_dir() and _step_of(path) >= 0:
            (complete if (path / CHECKPOINT_MARKER).is_file() else incomplete).append(path)
    if warn and incomplete:
        logger.warning("skipping %d incomplete checkpoint(s) (the run was stopped while writing them): %s",
                       len(incomplete), ", ".join(str(p) for p in incomplete))
    return complete


def find_checkpoint(config: TrainingConfig) -> Path | None:
    """The folder ``--resume`` names (``latest``: the newest complete ``checkpoints/step_*``; none yet: start fresh)."""
    if not config.resume:
        return None
    if config.resume == "latest":
        found = complete_checkpoints(checkpoint_folder(config), warn=True)
        return found[-1] if found else None
    path = Path(config.resume)
    if not path.is_dir():
        raise ConfigError(f"invalid configuration value resume={config.resume!r}: no such checkpoint folder")
    if not (path / CHECKPOINT_MARKER).is_file():
        raise ConfigError(f"invalid configuration value resume={config.resume!r}: the checkpoint is incomplete "
                          f"(no {CHECKPOINT_MARKER}; the run was stopped while writing it)")
    return path


#: A streamed run's data-loader state (torchdata ``StatefulDataLoader``), one file per process.
LOADER_STATE = "data_loader_state_{process}.pt"


def save_checkpoint(accelerator: Accelerator, config: TrainingConfig, step: int,
                    loader_state: dict | None = None) -> Path:
    """Write the run's state as ``checkpoints/step_<step>``, atomically.

    Every process writes its part (with ``loader_state``, its streamed data loader's position) into
    the hidden ``checkpoints/.step_<step>.partial``; the main process
    then adds :data:`CHECKPOINT_MARKER` and renames the folder, so that a ``step_*`` folder is always
    complete. Old checkpoints beyond ``checkpoints_total_limit`` are renamed away before being deleted.
    """
    folder = checkpoint_folder(config)
    final = folder / f"step_{step:08d}"
    partial = folder / f".step_{step:08d}.partial"
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    if loader_state is not None:
        torch.save(loader_state, partial / LOADER_STATE.format(process=accelerator.process_index))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if os.environ.get(_PAUSE_IN_CHECKPOINT_ENV) == str(step):
            time.sleep(60)
        (partial / CHECKPOINT_MARKER).write_text(json.dumps({"step": step}) + "\n")
        if final.exists():  # a checkpoint of the same step from an earlier attempt: replace it
            shutil.rmtree(final)
        os.replace(partial, final)
        if config.checkpoints_total_limit:
            for old in complete_checkpoints(folder)[: -config.checkpoints_total_limit]:
                doomed = old.with_name(f".{old.name}.deleting")
                os.replace(old, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


# ---------------------------------------------------------------------------------------------- loop
def _flat_hparams(config: TrainingConfig) -> dict:
    flat = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            flat.update({f"model.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flat.items()}


def _weights_checksum(model: torch.nn.Module) -> torch.Tensor:
    """(2,) float64: sum and sum of squares of every parameter (compared across processes)."""
    with torch.no_grad():
        values = [p.detach().double() for p in model.parameters()]
        return torch.stack([sum(v.sum() for v in values), sum((v * v).sum() for v in values)])


def main(argv: list[str] | None = None) -> dict:
    """Run training; returns the summary written to ``<output_dir>/training_summary.json``."""
    config = parse_args(argv)
    try:  # before any work: an output_dir that is a file or cannot be written stops the run at once
        check_output_folder(config.output_dir, "output_dir")
    except OutputPathError as error:
        raise ConfigError(f"invalid configuration value {error}") from None
    output_dir = Path(config.output_dir)
    log_with = None if config.report_to == "none" else config.report_to
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=config.mixed_precision,
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if not accelerator.is_main_process:
        logging.getLogger("copynce_hf").setLevel(logging.ERROR)
    # The precision in effect: the config's when it names one, else accelerate launch's / accelerate config's.
    logger.info("mixed precision: %s (%s)", accelerator.mixed_precision,
                "from the configuration" if config.mixed_precision else "from accelerate launch / accelerate config")
    config = dataclasses.replace(config, mixed_precision=str(accelerator.mixed_precision))
    set_seed(config.seed)
    started = time.perf_counter()

    model, processor = build_model(config)
    data = TrainingData(config, accelerator, model.config.image_size, model.config.patch_size)
    if config.max_steps:
        total_steps = config.max_steps
    elif data.steps_per_epoch:
        total_steps = max(1, math.ceil(config.num_train_epochs * data.steps_per_epoch))
    else:
        raise ConfigError("invalid configuration value max_steps=None: the streamed dataset's size is unknown, "
                          "so the run length must be given as max_steps")
    learning_rate = config.effective_learning_rate(accelerator.num_processes)
    optimizer = build_optimizer(model, learning_rate, config.weight_decay, (config.adam_beta1, config.adam_beta2),
                                config.adam_epsilon)
    warmup = warmup_steps_for(total_steps, data.steps_per_epoch, config.warmup_epochs, config.warmup_steps)
    scheduler = build_scheduler(optimizer, total_steps, warmup, config.min_learning_rate)
    # The weight average copies the plain model, before Accelerate wraps its forward (mixed precision).
    ema = build_weight_ema(model, config.ema_decay).to(accelerator.device) if config.ema_decay else None
    model, optimizer = accelerator.prepare(model, optimizer)
    # The scheduler is stepped once per optimiser step by this loop (not prepared: Accelerate would
    # step it once per process).
    progress = TrainingProgress()
    accelerator.register_for_checkpointing(scheduler, progress, *([ema] if ema is not None else []))
    checkpoint = find_checkpoint(config)
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        if data.streaming:
            data.load_loader_state(checkpoint, progress)
        logger.info("resumed from %s at step %d", checkpoint, progress.step)
    elif config.resume == "latest":
        logger.info("resume=latest: no checkpoint in %s yet, starting a new run", checkpoint_folder(config))

    if log_with:
        accelerator.init_trackers("copynce", config=_flat_hparams(config))
    task, eval_decoder = None, data.decoder()
    if data.eval_rows and accelerator.is_main_process:
        model_config = accelerator.unwrap_model(model).config
        task = build_copy_detection_task(data.eval_rows, model_config.image_size, model_config.patch_size,
                                         seed=config.seed + 7919, decoder=eval_decoder)
    if accelerator.is_main_process:
        logger.info(
            "training a %s for %d steps (warm-up %d) on %s: %d processes x %d %s x %d accumulation, "
            "lr %.3g (base %.3g)", config.model_type, total_steps, warmup, config.dataset or "the bundled images",
            accelerator.num_processes, config.per_device_train_batch_size,
            "slots of 2 pairs (anchor, hard negative)" if config.hard_negative_slots else "pairs",
            config.gradient_accumulation_steps, learning_rate, config.learning_rate)

    def evaluate() -> dict[str, dict[str, float]]:
        """``{"eval": metrics of the weights the run saves}`` (the average with ``ema_decay``, which adds
        ``"eval_without_ema"`` for the trained weights); empty without held-out images or off the main process."""
        scored = {}
        if task is not None and accelerator.is_main_process:
            scored["eval"] = evaluate_copy_detection(accelerator.unwrap_model(model), task, config.model_type)
            if ema is not None:
                scored["eval_without_ema"] = scored.pop("eval")
                with accelerator.autocast():  # the same precision as the trained weights' forward
                    scored["eval"] = evaluate_copy_detection(ema.module, task, config.model_type)
            values = {f"{prefix}/{k}": v for prefix, metrics in scored.items() for k, v in metrics.items()}
            accelerator.log(values, step=progress.step)
            for prefix, metrics in scored.items():
                logger.info("step %d %s: muAP %.4f, RP90 %.4f, recall@1 %.4f", progress.step,
                            prefix.replace("_", " "), metrics["micro_ap"], metrics["recall_at_p90"],
                            metrics["recall_at_rank1"])
            progress.history.append({"step": progress.step, **values})
        accelerator.wait_for_everyone()
        return scored

    total_micro = total_steps * config.gradient_accumulation_steps
    window: dict[str, list[float]] = defaultdict(list)
    window_pairs, window_skipped, data_wait = 0, 0, 0.0
    window_start = time.perf_counter()
    bar = tqdm(total=total_steps, initial=progress.step, disable=not accelerator.is_local_main_process,
               desc=f"training {config.model_type}", dynamic_ncols=True)
    model.train()
    loop_started = time.perf_counter()
    while progress.micro_batches < total_micro:
        loader = data.loader(progress, total_micro)
        iterator = iter(loader)
        while progress.micro_batches < total_micro:
            fetch = time.perf_counter()
            batch = next(iterator, None)
            if data.streaming and accelerator.num_processes > 1:  # an epoch ends when any process runs dry
                alive = torch.tensor([0 if batch is None else 1], device=accelerator.device)
                if int(accelerator.gather(alive).min()) == 0:
                    batch = None
            if batch is None:
                if not data.streaming:
                    raise RuntimeError("the pair sampler ended before the planned number of batches")
                progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
                break
            data_wait += time.perf_counter() - fetch
            window_skipped += int(batch.pop("num_skipped_images", torch.tensor(0)))
            batch = {key: value.to(accelerator.device, non_blocking=True) for key, value in batch.items()
                     if key not in _NOT_MODEL_INPUTS}
            batch = data.collator.normalize(batch)  # uint8 pixels -> normalised float32, on the device
            with accelerator.accumulate(model):
                outputs = model(**batch)
                accelerator.backward(outputs.loss)
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                    window["grad_norm"].append(float(grad_norm))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            progress.micro_batches += 1
            progress.batch_in_epoch += 1
            window_pairs += len(batch["labels"])
            for name in _LOSS_PARTS:
                value = getattr(outputs, name, None)
                if value is not None:
                    window[name].append(float(value.detach()))
            if not accelerator.sync_gradients:
                continue
            if not accelerator.optimizer_step_was_skipped:
                scheduler.step()
                if ema is not None:
                    ema.update_parameters(accelerator.unwrap_model(model))
            progress.step += 1
            bar.update(1)
            if config.max_train_seconds is not None and _out_of_time(accelerator, loop_started, config.max_train_seconds):
                if accelerator.is_main_process:
                    logger.warning("max_train_seconds=%s reached: stopping at step %d of %d", config.max_train_seconds,
                                   progress.step, total_steps)
                total_micro = progress.micro_batches
                break

            if progress.step % config.logging_steps == 0 or progress.step == total_steps:
                means = torch.tensor([sum(v) / len(v) for v in window.values()], device=accelerator.device)
                means = accelerator.reduce(means, reduction="mean")
                counts = accelerator.reduce(torch.tensor([window_pairs, window_skipped], device=accelerator.device),
                                            reduction="sum")
                elapsed = time.perf_counter() - window_start
                logs = {f"train/{name}": float(v) for name, v in zip(window, means.tolist())}
                progress.skipped_images += int(counts[1])
                logs.update({
                    "train/learning_rate": scheduler.get_last_lr()[0],
                    "train/pairs_per_second": float(counts[0]) / max(elapsed, 1e-9),
                    "train/data_wait_fraction": data_wait / max(elapsed, 1e-9),
                    "train/skipped_images": progress.skipped_images,
                    "train/epoch": progress.micro_batches / config.gradient_accumulation_steps
                    / data.steps_per_epoch if data.steps_per_epoch else progress.epoch,
                })
                accelerator.log(logs, step=progress.step)
                progress.history.append({"step": progress.step, **logs})
                bar.set_postfix(loss=f"{logs['train/loss']:.4f}", lr=f"{logs['train/learning_rate']:.2e}")
                if int(counts[1]) and accelerator.is_main_process:
                    logger.warning("%d unreadable images skipped so far", progress.skipped_images)
                window.clear()
                window_pairs, window_skipped, data_wait = 0, 0, 0.0
                window_start = time.perf_counter()
            if config.eval_steps and progress.step % config.eval_steps == 0 and progress.step < total_steps:
                evaluate()
            if config.checkpointing_steps and progress.step % config.checkpointing_steps == 0:
                save_checkpoint(accelerator, config, progress.step, loader.state_dict() if data.streaming else None)
    bar.close()
    # skips of the last window when the loop stopped between two logging steps (max_train_seconds)
    leftover = accelerator.reduce(torch.tensor([window_skipped], device=accelerator.device), reduction="sum")
    progress.skipped_images += int(leftover[0])
    eval_skipped = eval_decoder.skipped  # held-out images that could not be read (main process)

    scored = evaluate()
    last_metrics = scored.get("eval", {})
    accelerator.wait_for_everyone()
    checksums = accelerator.gather(_weights_checksum(accelerator.unwrap_model(model)).to(accelerator.device)[None])
    summary = {
        "model_type": config.model_type,
        "model_name_or_path": config.model_name_or_path,  # where the weights started (provenance for cards)
        "init_from_dino": None if config.model_name_or_path else config.init_from_dino,
        "steps": progress.step,
        "pairs_per_process": progress.micro_batches * config.pairs_per_batch,
        "num_processes": accelerator.num_processes,
        "mixed_precision": config.mixed_precision,
        "learning_rate": learning_rate,
        "warmup_steps": warmup,
        "skipped_images": progress.skipped_images + eval_skipped,
        "skipped_training_images": progress.skipped_images,
        "skipped_evaluation_images": eval_skipped,
        "final_train_loss": next((h["train/loss"] for h in reversed(progress.history) if "train/loss" in h), None),
        "eval": last_metrics,
        "ema_decay": config.ema_decay,
        "eval_without_ema": scored.get("eval_without_ema"),
        "weights_checksums": checksums.cpu().tolist(),
        "processes_agree": bool(torch.allclose(checksums, checksums[:1].expand_as(checksums), rtol=1e-12, atol=0)),
        "wall_seconds": time.perf_counter() - started,
        "history": progress.history,
    }
    if accelerator.is_main_process:
        if not summary["processes_agree"]:
            logger.error("the processes' weights differ: %s", summary["weights_checksums"])
        trained = accelerator.unwrap_model(model)
        folder = save_trained_model(trained if ema is None else ema.module, processor, config, output_dir, last_metrics,
                                    push_to_hub=config.push_to_hub, private=config.hub_private_repo)
        summary["model_folder"] = str(folder)
        if ema is not None:  # the trained weights too, to compare with their average
            summary["model_folder_without_ema"] = str(save_trained_model(
                trained, processor, config, output_dir / WITHOUT_EMA_FOLDER, scored.get("eval_without_ema"), averaged=False))
        with StagedFile(output_dir / "training_summary.json") as temporary:
            temporary.write_text(json.dumps(summary, indent=2))
        logger.info("saved the %s to %s (%.0f s)", config.model_type, folder, summary["wall_seconds"])
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return summary


def _continue_command(argv: list[str]) -> str:
    """The command line that continues an interrupted run: the same options with ``--resume latest``."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "--resume":
            skip = True
            continue
        if not item.startswith("--resume="):
            kept.append(item)
    script = sys.argv[0]
    module = not script.endswith(".py") or Path(script).name == "__main__.py"
    program = "python -m copynce_hf.training" if module else f"python {_quote(script)}"
    return " ".join([program, *map(_quote, kept), "--resume latest"])


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def cli(argv: list[str] | None = None) -> int:
    """Run :func:`main` as a command: returns the exit status.

    A configuration error prints one line (``error: ...``) and returns 2; Ctrl-C prints one line naming
    the last complete checkpoint and the command that continues the run, and returns 130.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        main(argv)
    except ConfigError as error:  # bad configuration: one clear line, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        for bar in list(getattr(tqdm, "_instances", ())):  # end the progress bar's line before the message
            bar.close()
        try:
            config = parse_args(list(argv))
            found = complete_checkpoints(checkpoint_folder(config))
        except Exception:  # the interruption came before the configuration was read
            found = None
        if found:
            where = f"last checkpoint: {found[-1]} (step {_step_of(found[-1])})"
        elif found is None:
            where = "no checkpoint"
        else:
            where = f"no checkpoint yet in {checkpoint_folder(config)} (checkpointing_steps={config.checkpointing_steps})"
        print(f"\ntraining interrupted; {where}; continue with: {_continue_command(argv)}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
