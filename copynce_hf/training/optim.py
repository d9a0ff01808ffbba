"""Optimiser and learning-rate schedule of the paper (supplementary table "All detailed settings").

AdamW with betas (0.9, 0.999) and weight decay 0.04 (not applied to biases, normalisation weights,
position embeddings, class tokens and the InfoNCE log-scale, as in DINO's parameter groups); the
learning rate rises linearly for one warm-up epoch, then follows a cosine down to ``min_lr`` (2e-6).
"""

from __future__ import annotations

import math

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

__all__ = ["build_optimizer", "build_scheduler", "warmup_steps_for"]

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


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup: int, min_lr: float):
    """Linear warm-up then cosine from the optimiser's learning rate to ``min_lr``.

    ``transformers.get_cosine_with_min_lr_schedule_with_warmup``; one ``step()`` per optimiser step.
    """
    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=warmup, num_training_steps=max(total_steps, 1), min_lr=min_lr
    )
