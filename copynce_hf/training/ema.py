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
:data:`WITHOUT_EMA_FOLDER` subfolder.
"""

from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel

__all__ = ["WITHOUT_EMA_FOLDER", "build_weight_ema", "ema_decay_at"]

#: Subfolder of a run's output folder with the trained weights when the model folder holds their average.
WITHOUT_EMA_FOLDER = "without_ema"


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
