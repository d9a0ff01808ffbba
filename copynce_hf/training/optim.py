"""Optimiser and learning-rate schedule of the paper (supplementary table "All detailed settings").

AdamW with betas (0.9, 0.999) and weight decay 0.04 (not applied to biases, normalisation weights,
position embeddings, class tokens and the InfoNCE log-scale, as in DINO's parameter groups); the
learning rate rises linearly for one warm-up epoch, then follows a cosine down to ``min_lr`` (2e-6).
The authors' code starts the warm-up at 0.01 x lr and lets the cosine span the whole run after the
warm-up (``warmup_start_factor``, ``cosine_span``).
"""

from __future__ import annotations

import functools
import math

import torch

from ..modeling.errors import ConfigError

__all__ = ["COSINE_SPANS", "build_optimizer", "build_scheduler", "learning_rate_factor", "warmup_steps_for"]

#: Parameter names (substrings) never decayed, besides every parameter with fewer than 2 dimensions.
_NO_DECAY = ("position_embeddings", "cls_token", "logit_scale", "mask_token")


def build_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over two parameter groups: decayed weights (matrices) and the rest (weight decay 0)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if parameter.ndim < 2 or any(key in name for key in _NO_DECAY):
            no_decay.append(parameter)
        else:
            decay.append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=learning_rate, betas=betas, eps=eps)


def warmup_steps_for(total_steps: int, steps_per_epoch: float | None, warmup_epochs: float,
                     warmup_steps: int | None) -> int:
    """Warm-up length in optimiser steps.

    ``warmup_steps`` when given; otherwise ``warmup_epochs`` epochs (the paper: one), capped at a fifth
    of the run so that short ``max_steps`` runs still anneal.
    """
    if warmup_steps is not None:
        return min(int(warmup_steps), total_steps)
    if steps_per_epoch is None:
        return max(0, total_steps // 20)
    return min(int(math.ceil(warmup_epochs * steps_per_epoch)), total_steps // 5)


#: How long the cosine after the warm-up lasts (``TrainingConfig.cosine_span``).
COSINE_SPANS = ("after_warmup", "run")


def learning_rate_factor(step: int, total_steps: int, warmup: int, min_lr_ratio: float,
                         warmup_start_factor: float = 0.0, cosine_span: str = "after_warmup") -> float:
    """The learning rate at optimiser step ``step`` as a fraction of the peak learning rate.

    Warm-up (steps ``0 .. warmup - 1``): linear from ``warmup_start_factor`` towards 1. Then a cosine from
    1 to ``min_lr_ratio`` whose length is ``total_steps - warmup`` (``after_warmup``: it ends at the last
    step) or ``total_steps`` (``run``, the authors' timm ``CosineLRScheduler`` with ``warmup_prefix``:
    ``t_initial`` is the whole run and the warm-up comes before it, so the run stops when
    ``(total - warmup) / total`` of the cosine has passed). Past its end the cosine stays at ``min_lr_ratio``.
    """
    if cosine_span not in COSINE_SPANS:
        raise ConfigError(f"cosine_span={cosine_span!r} must be one of {COSINE_SPANS}")
    if step < warmup:
        return warmup_start_factor + (1.0 - warmup_start_factor) * step / warmup
    length = max(1, total_steps - warmup) if cosine_span == "after_warmup" else max(1, total_steps)
    progress = min(1.0, (step - warmup) / length)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup: int, min_lr: float,
                    warmup_start_factor: float = 0.0, cosine_span: str = "after_warmup"):
    """Linear warm-up then cosine from the optimiser's learning rate to ``min_lr`` (:func:`learning_rate_factor`).

    A ``LambdaLR``; one ``step()`` per optimiser step. With the defaults it gives the values of
    ``transformers.get_cosine_with_min_lr_schedule_with_warmup``.
    """
    min_lr_ratio = min_lr / optimizer.defaults["lr"]
    factor = functools.partial(learning_rate_factor, total_steps=max(total_steps, 1), warmup=warmup,
                               min_lr_ratio=min_lr_ratio, warmup_start_factor=warmup_start_factor,
                               cosine_span=cosine_span)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
