"""The training run: a CopyNCE descriptor or matcher trained with Accelerate.

    python -m copynce_hf.training                                        # tiny default run on bundled images
    python -m copynce_hf.training --config tiny_cpu.yaml --max_steps 20 --model.hidden_size 32
    accelerate launch --num_processes 8 -m copynce_hf.training --config configs/descriptor_vits16_224.yaml \\
        --dataset /data/disc21 --knn_graph /data/disc21/knn.safetensors --output_dir outputs/descriptor

(``scripts/train.py`` in a source checkout is the same command; ``--help`` lists every option.) A run
is :func:`set_up` (model, data, optimiser, schedule, weight average, resume), :func:`train` (the loop)
and :func:`finish` (the last evaluation, the model folder, ``training_summary.json``):

    images (datasets) -> PixTrace copy pairs (DataLoader workers) -> PixTraceCollator (uint8 pixels)
      -> normalised on the device -> model(**batch).loss -> Accelerate (DDP, mixed precision, accumulation, checkpoints)
      -> save_pretrained (model, image processor, card) -> push_to_hub

Paper settings (supplementary table "All detailed settings in our training pipeline"): AdamW (0.9,
0.999), weight decay 0.04, lr = base * sqrt(global batch / 1024), one warm-up epoch then cosine to
2e-6, gradient clipping 3.0.

Interruptions: checkpoints are complete or absent (:mod:`.checkpoints`), so a run killed at any moment
(``kill -9`` included) continues with ``--resume latest`` from the newest complete one with the same
data and the same loss curve (a streamed dataset continues from its data loader's saved state, reading
no consumed row again). Ctrl-C stops with one line naming the last checkpoint and the command that
continues; a configuration error stops with one line and exit status 2 (run through ``accelerate
launch``, the launcher adds its own report of the failed process after that line). An ``output_dir`` that
holds an earlier run is refused at start-up unless ``--resume`` continues it or ``--overwrite_output_dir``
replaces it (:func:`.checkpoints.check_earlier_run`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, broadcast, set_seed
from tqdm.auto import tqdm

from ..data import ImageDecoder
from ..modeling.errors import ConfigError
from ..outputs import OutputPathError, check_output_folder
from ..precision import make_accelerator, release_process_group
from .checkpoints import (
    TrainingProgress,
    check_earlier_run,
    checkpoint_folder,
    clear_earlier_checkpoints,
    complete_checkpoints,
    find_checkpoint,
    load_loader_state,
    save_checkpoint,
    step_of,
)
from .config import TrainingConfig
from .data import TrainingData, build_training_data
from .ema import build_weight_ema
from .evaluation import (
    CopyDetectionTask,
    PeriodicEvaluation,
    build_copy_detection_task,
    evaluate_copy_detection,
)
from .log_window import LogWindow
from .model import build_model
from .optim import build_optimizer, build_scheduler, warmup_steps_for
from .options import parse_args
from .saving import build_summary, save_run

logger = logging.getLogger("copynce_hf.train")

__all__ = ["TrainingRun", "cli", "finish", "held_out_score", "held_out_task", "main", "set_up", "train"]


@dataclass
class TrainingRun:
    """Everything the loop works with, made by :func:`set_up`."""

    config: TrainingConfig
    accelerator: Accelerator
    model: torch.nn.Module  # prepared by Accelerate
    processor: object
    data: TrainingData
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: torch.optim.swa_utils.AveragedModel | None
    progress: TrainingProgress
    evaluate: PeriodicEvaluation
    total_steps: int
    warmup_steps: int
    learning_rate: float
    skipped_evaluation_images: int


def main(argv: list[str] | None = None) -> dict:
    """Run training; returns the summary written to ``<output_dir>/training_summary.json``."""
    config = parse_args(sys.argv[1:] if argv is None else argv)
    try:  # before any work: an output_dir that is a file or cannot be written stops the run at once
        check_output_folder(config.output_dir, "output_dir")
    except OutputPathError as error:
        raise ConfigError(f"invalid configuration value {error}") from None
    check_earlier_run(config)  # an earlier run there is continued or replaced only when asked
    started = time.perf_counter()
    run = set_up(config)
    train(run)
    return finish(run, started)


def train(run: TrainingRun) -> None:
    """The optimisation loop (DINOv2's ``do_train`` order): batch, forward, backward, step, schedule and
    average, log, evaluate, checkpoint. Stops at ``total_steps`` or when the time budget is spent. A run from a
    saved model first evaluates that model (step 0), to compare the run with."""
    accelerator, config, progress, model = run.accelerator, run.config, run.progress, run.model
    total_micro = run.total_steps * config.gradient_accumulation_steps
    window = LogWindow(accelerator, run.data.steps_per_epoch, config.gradient_accumulation_steps)
    if config.model_name_or_path and progress.step == 0:
        run.evaluate()  # the saved model's own score on the held-out images: the run's starting point
    bar = tqdm(total=run.total_steps, initial=progress.step, disable=not accelerator.is_local_main_process,
               desc=f"training {config.model_type}", dynamic_ncols=True)
    model.train()
    budget = TimeBudget(accelerator, config.max_train_seconds)
    progress.start_segment()
    while progress.micro_batches < total_micro:  # one pass per streamed epoch (map-style: one pass)
        loader = run.data.loader(progress, total_micro)
        for inputs, skipped, waited in run.data.batches(loader, progress, total_micro):
            with accelerator.accumulate(model):
                outputs = model(**inputs)
                accelerator.backward(outputs.loss)
                if accelerator.sync_gradients:
                    window.add_grad_norm(accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm))
                run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
            progress.micro_batches += 1
            progress.batch_in_epoch += 1
            window.add_batch(outputs, len(inputs["labels"]), skipped, waited)
            if not accelerator.sync_gradients:
                continue
            if not accelerator.optimizer_step_was_skipped:  # the schedule and the average follow real steps
                run.scheduler.step()
                if run.ema is not None:
                    run.ema.update_parameters(accelerator.unwrap_model(model))
            progress.step += 1
            bar.update(1)
            if budget.spent(progress.step, run.total_steps):
                total_micro = progress.micro_batches
                break
            if progress.step % config.logging_steps == 0 or progress.step == run.total_steps:
                logs = window.log(progress, run.scheduler.get_last_lr()[0])
                bar.set_postfix(loss=f"{logs['train/loss']:.4f}", lr=f"{logs['train/learning_rate']:.2e}")
            if config.eval_steps and progress.step % config.eval_steps == 0 and progress.step < run.total_steps:
                run.evaluate()
            if config.checkpointing_steps and progress.step % config.checkpointing_steps == 0:
                save_checkpoint(accelerator, config, progress.step, loader.state_dict() if run.data.streaming else None)
    bar.close()
    window.close(progress)  # skips of a window the budget left between two logs


class TimeBudget:
    """``max_train_seconds`` of the loop, judged by the main process and shared by all (one stopping step)."""

    def __init__(self, accelerator: Accelerator, seconds: float | None):
        self.accelerator, self.seconds, self.started = accelerator, seconds, time.perf_counter()

    def spent(self, step: int, total_steps: int) -> bool:
        if self.seconds is None:
            return False
        over = torch.tensor([float(time.perf_counter() - self.started > self.seconds)], device=self.accelerator.device)
        if not bool(broadcast(over, from_process=0).item()):
            return False
        if self.accelerator.is_main_process:
            logger.warning("max_train_seconds=%s reached: stopping at step %d of %d", self.seconds, step, total_steps)
        return True


# ---------------------------------------------------------------------------------------------- before and after
def set_up(config: TrainingConfig) -> TrainingRun:
    """The accelerator, model, data, optimiser, schedule and weight average of ``config``, resumed from a
    checkpoint with ``resume``, and the held-out task of the periodic evaluation."""
    accelerator = _accelerator(config)
    config = dataclasses.replace(config, mixed_precision=str(accelerator.mixed_precision))
    if accelerator.is_main_process:
        clear_earlier_checkpoints(config)  # overwrite_output_dir: no checkpoint of the earlier run stays
    accelerator.wait_for_everyone()
    set_seed(config.seed)
    model, processor = build_model(config)
    data = build_training_data(config, accelerator, model.config.image_size, model.config.patch_size)
    task, eval_decoder = held_out_task(config, data, model.config.image_size)
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
    scheduler = build_scheduler(optimizer, total_steps, warmup, config.min_learning_rate,
                                config.warmup_start_factor, config.cosine_span)
    # The weight average copies the plain model, before Accelerate wraps its forward (mixed precision).
    ema = build_weight_ema(model, config.ema_decay).to(accelerator.device) if config.ema_decay else None
    model = model.with_synced_batch_norm(accelerator.num_processes, accelerator.device.type)
    model, optimizer = accelerator.prepare(model, optimizer)
    # The scheduler is stepped once per optimiser step by the loop (not prepared: Accelerate would
    # step it once per process).
    progress = TrainingProgress()
    accelerator.register_for_checkpointing(scheduler, progress, *([ema] if ema is not None else []))
    checkpoint = find_checkpoint(config)
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        if data.streaming:
            data.resume_state = load_loader_state(checkpoint, accelerator, progress, config.resume)
        logger.info("resumed from %s at step %d", checkpoint, progress.step)
    elif config.resume == "latest":
        logger.info("resume=latest: no checkpoint in %s yet, starting a new run", checkpoint_folder(config))
    if config.report_to != "none":
        accelerator.init_trackers("copynce", config=_flat_hparams(config))
    if accelerator.is_main_process:
        logger.info(
            "training a %s for %d steps (warm-up %d) on %s: %d processes x %d %s x %d accumulation, "
            "lr %.3g (base %.3g)", config.model_type, total_steps, warmup, config.dataset or "the bundled images",
            accelerator.num_processes, config.per_device_train_batch_size,
            "slots of 2 pairs (anchor, hard negative)" if config.hard_negative_slots else "pairs",
            config.gradient_accumulation_steps, learning_rate, config.learning_rate)
    return TrainingRun(config, accelerator, model, processor, data, optimizer, scheduler, ema, progress,
                       PeriodicEvaluation(accelerator, model, processor, ema, task, progress), total_steps, warmup,
                       learning_rate, eval_decoder.skipped)


def held_out_task(config: TrainingConfig, data: TrainingData, image_size: int
                  ) -> tuple[CopyDetectionTask | None, ImageDecoder]:
    """The task of the run's periodic evaluation, made from its held-out images with a seed of the run's
    (``None`` with fewer than two readable ones), and the decoder that read them (it counts the skipped)."""
    decoder = data.decoder()
    task = build_copy_detection_task(data.eval_rows, image_size, seed=config.seed + 7919,
                                     decoder=decoder) if data.eval_rows else None
    return task, decoder


def held_out_score(config: TrainingConfig) -> dict[str, float] | None:
    """The held-out numbers of the model a run of ``config`` starts from, before its first step: the task,
    precision and engine of the run's own ``eval`` (e.g. the current model beside a run continued from
    it with ``model_name_or_path``). ``None`` when the run would hold out too few images."""
    accelerator = make_accelerator(mixed_precision=config.mixed_precision)
    set_seed(config.seed)
    model, processor = build_model(config)
    data = build_training_data(config, accelerator, model.config.image_size, model.config.patch_size)
    task, _ = held_out_task(config, data, model.config.image_size)
    if task is None:
        return None
    with accelerator.autocast():
        return evaluate_copy_detection(model.to(accelerator.device), processor, task, accelerator)


def finish(run: TrainingRun, started: float) -> dict:
    """The last evaluation, the summary, the saved model folder(s); returns the summary."""
    accelerator = run.accelerator
    scored = run.evaluate()
    accelerator.wait_for_everyone()
    summary = build_summary(run.config, accelerator, run.model, run.progress, run.learning_rate, run.warmup_steps,
                            scored, run.skipped_evaluation_images, time.perf_counter() - started)
    if accelerator.is_main_process:
        save_run(summary, run.config, accelerator.unwrap_model(run.model), run.processor, run.ema)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    release_process_group()
    return summary


def _accelerator(config: TrainingConfig) -> Accelerator:
    """The run's accelerator (precision, accumulation, trackers, logging folder) and the run's log format."""
    output_dir = Path(config.output_dir)
    accelerator = make_accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=config.mixed_precision,
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    quiet_library_loggers()
    if not accelerator.is_main_process:
        logging.getLogger("copynce_hf").setLevel(logging.ERROR)
    # The precision in effect: the config's when it names one, else accelerate launch's / accelerate config's.
    logger.info("mixed precision: %s (%s)", accelerator.mixed_precision,
                "from the configuration" if config.mixed_precision else "from accelerate launch / accelerate config")
    return accelerator


#: Loggers of libraries whose INFO lines are no news of the run: faiss's loader reports each CPU-specific build it
#: tries (``Could not load library with AVX512 support due to: ModuleNotFoundError(...)``) before the one it loads.
QUIET_LOGGERS = ("faiss.loader",)


def quiet_library_loggers() -> None:
    """Show only warnings and errors of :data:`QUIET_LOGGERS` (their INFO lines stay at DEBUG logging: a logger
    whose level was set already keeps it)."""
    debugging = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    for name in QUIET_LOGGERS:
        library_logger = logging.getLogger(name)
        if library_logger.level == logging.NOTSET and not debugging:
            library_logger.setLevel(logging.WARNING)


def _flat_hparams(config: TrainingConfig) -> dict:
    """The settings as tracker hyper-parameters: ``model.<key>`` for the model's, non-scalars as text."""
    flat = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            flat.update({f"model.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flat.items()}


# ---------------------------------------------------------------------------------------------- the command
def _continue_command(argv: list[str]) -> str:
    """The command line that continues an interrupted run: the same options with ``--resume latest`` (and without
    ``--overwrite_output_dir``, which would start the run anew)."""
    kept, items = [], list(argv)
    while items:
        item = items.pop(0)
        name = item.split("=", 1)[0]
        if name == "--resume" and "=" not in item:
            items = items[1:]  # its value
        elif name in ("--overwrite_output_dir", "--overwrite-output-dir") and "=" not in item:
            if items and not items[0].startswith("--"):
                items = items[1:]  # its value (a bare flag has none)
        elif name not in ("--resume", "--overwrite_output_dir", "--overwrite-output-dir"):
            kept.append(item)
    try:
        if parse_args(kept).overwrite_output_dir:  # set by the --config file
            kept += ["--overwrite_output_dir", "false"]
    except ConfigError:
        pass
    script = sys.argv[0]
    module = not script.endswith(".py") or Path(script).name == "__main__.py"
    program = "python -m copynce_hf.training" if module else f"python {shlex.quote(script)}"
    return " ".join([program, *map(shlex.quote, kept), "--resume latest"])


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
            where = f"last checkpoint: {found[-1]} (step {step_of(found[-1])})"
        elif found is None:
            where = "no checkpoint"
        else:
            where = f"no checkpoint yet in {checkpoint_folder(config)} (checkpointing_steps={config.checkpointing_steps})"
        print(f"\ntraining interrupted; {where}; continue with: {_continue_command(argv)}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
