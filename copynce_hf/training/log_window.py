"""The values a run logs every ``logging_steps``: means of the window since the last log, over all processes.

Logged as ``train/<name>``: the loss and its parts the model returns, the gradient norm, the learning
rate, pairs per second, the fraction of time spent waiting for data, images skipped so far and the
epoch. They go to the trackers (``accelerator.log``), the run's history (the summary) and the progress bar.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import torch
from accelerate import Accelerator

from .checkpoints import TrainingProgress

logger = logging.getLogger(__name__)

__all__ = ["LOSS_PARTS", "LogWindow"]

#: Loss parts logged when the model returns them.
LOSS_PARTS = ("loss", "infonce_loss", "koleo_loss", "copynce_loss", "bce_loss")


class LogWindow:
    """Values gathered between two logs (this process), reduced over the processes by :meth:`log`.

    Args:
        accelerator: the run's accelerator (reductions, trackers).
        steps_per_epoch: optimiser steps per epoch (``None``: a stream of unknown length; the epoch
            logged is then the streamed epochs completed).
        accumulation: gradient accumulation steps (micro-batches per optimiser step).
    """

    def __init__(self, accelerator: Accelerator, steps_per_epoch: float | None, accumulation: int):
        self.accelerator = accelerator
        self.steps_per_epoch = steps_per_epoch
        self.accumulation = accumulation
        self._reset()

    def _reset(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)
        self.pairs, self.skipped, self.data_wait = 0, 0, 0.0
        self.started = time.perf_counter()

    def add_grad_norm(self, grad_norm) -> None:
        self.values["grad_norm"].append(float(grad_norm))

    def add_batch(self, outputs, pairs: int, skipped: int, waited: float) -> None:
        """One micro-batch: the model's loss parts, its pairs, the images its workers skipped, the data wait."""
        self.pairs += pairs
        self.skipped += skipped
        self.data_wait += waited
        for name in LOSS_PARTS:
            value = getattr(outputs, name, None)
            if value is not None:
                self.values[name].append(float(value.detach()))

    def log(self, progress: TrainingProgress, learning_rate: float) -> dict[str, float]:
        """Reduce the window over the processes, log it at ``progress.step``, add it to the history, start
        a new window; returns the logged values (every process calls it at the same step)."""
        accelerator = self.accelerator
        means = torch.tensor([sum(v) / len(v) for v in self.values.values()], device=accelerator.device)
        means = accelerator.reduce(means, reduction="mean")
        counts = accelerator.reduce(torch.tensor([self.pairs, self.skipped], device=accelerator.device),
                                    reduction="sum")
        elapsed = time.perf_counter() - self.started
        logs = {f"train/{name}": float(v) for name, v in zip(self.values, means.tolist())}
        progress.skipped_images += int(counts[1])
        logs.update({
            "train/learning_rate": learning_rate,
            "train/pairs_per_second": float(counts[0]) / max(elapsed, 1e-9),
            "train/data_wait_fraction": self.data_wait / max(elapsed, 1e-9),
            "train/skipped_images": progress.skipped_images,
            "train/epoch": progress.micro_batches / self.accumulation / self.steps_per_epoch
            if self.steps_per_epoch else progress.epoch,
        })
        accelerator.log(logs, step=progress.step)
        progress.history.append({"step": progress.step, **logs})
        if int(counts[1]) and accelerator.is_main_process:
            logger.warning("%d images skipped so far (each named once with its reason when first met)",
                           progress.skipped_images)
        self._reset()
        return logs

    def close(self, progress: TrainingProgress) -> None:
        """Count the skipped images of a window the run left between two logs (``max_train_seconds``)."""
        leftover = self.accelerator.reduce(torch.tensor([self.skipped], device=self.accelerator.device),
                                           reduction="sum")
        progress.skipped_images += int(leftover[0])
        self.skipped = 0
