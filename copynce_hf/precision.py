"""The Accelerator every command runs in, with a warning where its precision is slow on its device.

bf16 autocast on a CPU without native bf16 matrix support (no AVX-512, e.g. an AVX2-only machine) makes
PyTorch fall back to a reference bf16 matrix product about ten times slower than float32: a training run
or an extraction that asked for bf16 "to be fast" is then many times slower than with ``--mixed_precision
no``. :func:`make_accelerator` builds the ``Accelerator`` and says so in the log.
"""

from __future__ import annotations

import logging

import torch
from accelerate import Accelerator

logger = logging.getLogger(__name__)

__all__ = ["cpu_has_native_bf16", "make_accelerator", "slow_precision_warning"]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products in oneDNN's fast kernels (AVX-512 and later)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def slow_precision_warning(accelerator: Accelerator) -> str | None:
    """The warning for ``accelerator``'s precision on its device, or ``None`` when it is not slow there."""
    if accelerator.device.type != "cpu" or accelerator.mixed_precision != "bf16" or cpu_has_native_bf16():
        return None
    return (f"mixed precision bf16 on a CPU without native bf16 matrix support (torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}): matrix products run about 10x slower than in float32; "
            "use --mixed_precision no (or `accelerate launch --mixed_precision no`) on this machine")


def make_accelerator(**kwargs) -> Accelerator:
    """``Accelerator(**kwargs)``, with a logged warning where its precision is slow on its device."""
    accelerator = Accelerator(**kwargs)
    warning = slow_precision_warning(accelerator)
    if warning and accelerator.is_main_process:
        logger.warning(warning)
    return accelerator
