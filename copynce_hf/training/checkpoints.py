"""Where a run is, and its checkpoints: written atomically, found again to resume.

A checkpoint is ``<output_dir>/checkpoints/step_XXXXXXXX``: Accelerate's ``save_state`` (model,
optimiser, random states and the objects registered for checkpointing: the schedule, the
:class:`TrainingProgress`, the weight average) plus, for a streamed dataset, each process's data-loader
state. Every process writes into a hidden ``.step_XXXXXXXX.partial`` folder; the main process then
writes :data:`CHECKPOINT_MARKER` (:func:`mark_complete`) and renames the folder, so that a run killed at
any moment (``kill -9`` included) leaves only complete ``step_*`` folders.

An ``output_dir`` that holds an earlier run (a model folder, ``training_summary.json``, complete
checkpoints) is never overwritten silently (:func:`check_earlier_run`): ``resume`` (``latest`` with a
checkpoint there, or a checkpoint folder) continues it; ``overwrite_output_dir`` starts a new run there (as
``transformers.TrainingArguments``'), whose start deletes the earlier checkpoints
(:func:`clear_earlier_checkpoints`: a later ``--resume latest`` could continue from one of them) and whose
model and summary replace the earlier ones when saved; otherwise the run stops at start-up, before any
work, with one line naming what the folder holds and the ways on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from accelerate import Accelerator

from ..modeling.errors import ConfigError
from ..outputs import give_default_mode
from .config import TrainingConfig
from .ema import SUMMARY_FILE

logger = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_MARKER", "LOADER_STATE", "TrainingProgress", "check_earlier_run", "checkpoint_folder",
           "clear_earlier_checkpoints", "complete_checkpoints", "earlier_run", "find_checkpoint", "load_loader_state",
           "mark_complete", "save_checkpoint", "step_of"]

#: Written last into a checkpoint folder, before it is renamed into place: its presence marks a complete one.
CHECKPOINT_MARKER = "checkpoint_complete.json"
#: A streamed run's data-loader state (torchdata ``StatefulDataLoader``), one file per process.
LOADER_STATE = "data_loader_state_{process}.pt"


class TrainingProgress:
    """Where the run is; saved in every checkpoint (``accelerator.register_for_checkpointing``).

    It also counts the seconds of the training loop behind the current weights, over every session of a
    resumed run (:meth:`training_seconds`): the loop time of the segments up to each one's last checkpoint
    plus the current segment's. Steps redone after a restart (those after the last checkpoint) count once.
    """

    def __init__(self):
        self.step = 0  # optimiser steps
        self.micro_batches = 0  # batches consumed by each process
        self.epoch = 0  # streamed epochs completed
        self.batch_in_epoch = 0  # batches consumed in the current streamed epoch
        self.skipped_images = 0  # images skipped (unreadable, too small, too large), all processes
        self.history: list[dict] = []  # logged values, for the summary
        # loop seconds of the segments before this one; None after resuming from a checkpoint that did not count them
        self.seconds_before: float | None = 0.0
        self._segment_started = time.perf_counter()

    def start_segment(self) -> None:
        """The training loop of this process starts (or resumes) now."""
        self._segment_started = time.perf_counter()

    def training_seconds(self) -> float | None:
        """Seconds of the training loop behind the current weights, all segments (``None``: unknown, the run
        resumed from a checkpoint written before this was counted)."""
        if self.seconds_before is None:
            return None
        return self.seconds_before + time.perf_counter() - self._segment_started

    def state_dict(self) -> dict:
        state = {k: getattr(self, k) for k in ("step", "micro_batches", "epoch", "batch_in_epoch", "skipped_images",
                                               "history")}
        return {**state, "training_seconds": self.training_seconds()}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.seconds_before = state.pop("training_seconds", None)
        for key, value in state.items():
            setattr(self, key, value)


def checkpoint_folder(config: TrainingConfig) -> Path:
    """``<output_dir>/checkpoints``."""
    return Path(config.output_dir) / "checkpoints"


def step_of(path: Path) -> int:
    """The step of a ``step_XXXXXXXX`` folder name (-1 for another name)."""
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
    for path in sorted(folder.iterdir(), key=step_of):
        if path.name.startswith(".step_") and path.name.endswith(".partial"):
            incomplete.append(path)
        elif path.name.startswith("step_") and path.is_dir() and step_of(path) >= 0:
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


def mark_complete(folder: Path, step: int) -> None:
    """Write :data:`CHECKPOINT_MARKER` into a checkpoint folder whose files are all written."""
    (folder / CHECKPOINT_MARKER).write_text(json.dumps({"step": step}) + "\n")


def save_checkpoint(accelerator: Accelerator, config: TrainingConfig, step: int,
                    loader_state: dict | None = None) -> Path:
    """Write the run's state as ``checkpoints/step_<step>``, atomically.

    Every process writes its part (with ``loader_state``, its streamed data loader's position) into
    the hidden ``checkpoints/.step_<step>.partial``; the main process then marks it complete
    (:func:`mark_complete`) and renames it, so that a ``step_*`` folder is always complete. Old
    checkpoints beyond ``checkpoints_total_limit`` are renamed away before being deleted.
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
        give_default_mode(partial)  # the weights are written 0600 by safetensors
        mark_complete(partial, step)
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


def load_loader_state(checkpoint: Path, accelerator: Accelerator, progress: TrainingProgress,
                      resume: str | None) -> dict | None:
    """This process's streamed data-loader state saved in ``checkpoint`` (``None`` at the start of an epoch).

    Raises :class:`ConfigError` when the checkpoint fell inside an epoch but holds no loader state (written
    by an older version): the stream could not continue exactly."""
    path = checkpoint / LOADER_STATE.format(process=accelerator.process_index)
    if path.is_file():
        return torch.load(path, weights_only=False)
    if progress.batch_in_epoch:
        raise ConfigError(f"invalid configuration value resume={resume!r}: {checkpoint} has no {path.name} "
                          "(written by an older version), so the streamed run cannot continue exactly; start a "
                          "new run or set streaming false")
    return None


# ---------------------------------------------------------------------------------------------- an earlier run
def earlier_run(config: TrainingConfig) -> list[str]:
    """What of an earlier run ``config.output_dir`` holds, in words (empty: nothing a run would overwrite)."""
    folder = Path(config.output_dir)
    held = []
    if (folder / SUMMARY_FILE).is_file():
        held.append(f"the {SUMMARY_FILE} of a finished run")
    if (folder / "config.json").is_file():
        held.append("a model folder")
    checkpoints = complete_checkpoints(checkpoint_folder(config))
    if checkpoints:
        held.append(f"checkpoints up to step {step_of(checkpoints[-1])}")
    return held


def check_earlier_run(config: TrainingConfig) -> None:
    """Raise :class:`ConfigError` (one line) when the run would overwrite an earlier run of ``output_dir``
    without being asked to (``overwrite_output_dir``) or continuing it (``resume`` with a checkpoint)."""
    if config.overwrite_output_dir:
        return
    held = earlier_run(config)
    checkpoints = complete_checkpoints(checkpoint_folder(config))
    # resume continues the earlier run: from a checkpoint folder it names (set_up checks it) or the newest one
    if not held or (config.resume and (config.resume != "latest" or checkpoints)):
        return
    ways = ["continue it with --resume latest"] if checkpoints else []
    ways += ["replace it with --overwrite_output_dir", "choose another --output_dir"]
    raise ConfigError(f"invalid configuration value output_dir={config.output_dir!r}: it holds an earlier run "
                      f"({', '.join(held)}) that this run would overwrite; {', '.join(ways[:-1])} or {ways[-1]}")


def clear_earlier_checkpoints(config: TrainingConfig) -> None:
    """With ``overwrite_output_dir``: delete the checkpoints an earlier run left in ``output_dir`` (main
    process only), so that the new run's are the only ones ``--resume latest`` can find."""
    folder = checkpoint_folder(config)
    if not config.overwrite_output_dir or not folder.is_dir() or not any(folder.iterdir()):
        return
    found = complete_checkpoints(folder)
    shutil.rmtree(folder)
    logger.warning("overwrite_output_dir: a new run in %s; deleted the earlier run's checkpoints (%s)",
                   config.output_dir, f"up to step {step_of(found[-1])}" if found else "incomplete ones")
