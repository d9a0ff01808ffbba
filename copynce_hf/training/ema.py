"""Weight EMA: an exponential moving average of the trained weights, evaluated and saved beside them.

The average is ``torch.optim.swa_utils.AveragedModel`` over the unwrapped model (parameters and
buffers), updated once per optimiser step. Its decay warms up as in common EMA practice,

    decay_n = min(ema_decay, (1 + n) / (10 + n)),   n = updates already in the average,

so that the average does not drag the first, random weights through a short run: after ``n`` updates
it weighs recent weights over a window of about ``1 / (1 - decay_n)`` steps. The paper trains without a
weight EMA (its teacher-free objective needs none); it is offered as an option (``ema_decay`` in the
training configuration). Measured on the benchmark descriptor, the average leads the trained weights
while the learning rate is high and ties with them once a cosine schedule has annealed, so it helps a
run stopped or read before its end.

A run with ``ema_decay`` saves the average as its model folder and the trained weights in its
:data:`WITHOUT_EMA_FOLDER` subfolder; :func:`run_folder_of` finds a model folder's run (its summary).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel

__all__ = ["SUMMARY_FILE", "WITHOUT_EMA_FOLDER", "build_weight_ema", "ema_decay_at", "run_folder_of"]

#: Subfolder of a run's output folder with the trained weights when the model folder holds their average.
WITHOUT_EMA_FOLDER = "without_ema"
#: The run summary's file name in the run's output folder (written by :mod:`.summary`).
SUMMARY_FILE = "training_summary.json"


def run_folder_of(model_folder: str | os.PathLike) -> tuple[Path, bool]:
    """``(run folder, trained_of_averaged)`` of a saved model folder: the folder whose ``training_summary.json``
    describes its weights, and whether they are the trained weights of a run whose model folder holds their
    average. A :data:`WITHOUT_EMA_FOLDER` subfolder beside its run's summary gives ``(its parent, True)``; any
    other folder (a run's model folder, an exported one) gives ``(itself, False)``. The summary need not exist."""
    model_folder = Path(model_folder)
    if model_folder.name == WITHOUT_EMA_FOLDER and (model_folder.parent / SUMMARY_FILE).is_file():
        return model_folder.parent, True
    return model_folder, False


def ema_decay_at(ema_decay: float, updates: int) -> float:
    """The decay of the update that follows ``updates`` earlier ones: ``min(ema_decay, (1 + n) / (10 + n))``."""
    return min(ema_decay, (1.0 + updates) / (10.0 + updates))


def build_weight_ema(model: torch.nn.Module, ema_decay: float) -> AveragedModel:
    """An ``AveragedModel`` copy of ``model`` (same device) whose ``update_parameters(model)`` applies
    ``average = decay * average + (1 - decay) * weights`` with the warmed-up decay of :func:`ema_decay_at`.

    Floating-point buffers (batch-norm running statistics) are averaged like the weights, integer ones
    (batch counters) copied. Its first update copies everything (``AveragedModel``'s rule); its
    ``state_dict`` holds the update count, so a checkpoint restores the average and its decay exactly.
    """

    @torch.no_grad()
    def average(averaged: list[torch.Tensor], current: list[torch.Tensor], updates: torch.Tensor) -> None:
        # one call per (device, dtype) group; ``updates`` is AveragedModel's n_averaged (>= 1 here)
        if not averaged[0].is_floating_point():
            torch._foreach_copy_(averaged, current)
            return
        torch._foreach_lerp_(averaged, current, 1.0 - ema_decay_at(ema_decay, int(updates)))

    ema = AveragedModel(model, multi_avg_fn=average, use_buffers=True)
    ema.requires_grad_(False)
    ema.eval()
    return ema
