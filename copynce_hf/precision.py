"""The Accelerator every command runs in, with a warning where its precision is slow on its device.

bf16 autocast on a CPU without native bf16 matrix support (no AVX-512, e.g. an AVX2-only machine) makes
PyTorch fall back to a reference bf16 matrix product about ten times slower than float32: a training run
or an extraction that asked for bf16 "to be fast" is then many times slower than with ``--mixed_precision
no``. :func:`make_accelerator` builds the ``Accelerator`` and says so in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import torch
from accelerate import Accelerator

logger = logging.getLogger(__name__)

__all__ = ["CommandAccelerator", "accelerate_precision", "cpu_has_native_bf16", "make_accelerator", "native_bf16",
           "slow_precision_warning"]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products in oneDNN's fast kernels (AVX-512 and later)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def native_bf16(device_type: str) -> bool:
    """Whether a device of ``device_type`` multiplies bfloat16 natively: a CUDA device that supports it, a CPU with
    :func:`cpu_has_native_bf16`; no other kind."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device_type == "cpu" and cpu_has_native_bf16()


def slow_precision_warning(accelerator: Accelerator) -> str | None:
    """The warning for ``accelerator``'s precision on its device, or ``None`` when it is not slow there."""
    if accelerator.device.type != "cpu" or accelerator.mixed_precision != "bf16" or cpu_has_native_bf16():
        return None
    return (f"mixed precision bf16 on a CPU without native bf16 matrix support (torch CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}): matrix products run about 10x slower than in float32; "
            "use --mixed_precision no (or `accelerate launch --mixed_precision no`) on this machine")


def accelerate_precision(precision: str) -> str | None:
    """Accelerate's ``mixed_precision`` for a command's ``precision`` (``float32``, ``bfloat16`` or ``auto``): ``no``,
    ``bf16``, or for ``auto`` ``None`` where ``accelerate launch`` or ``ACCELERATE_MIXED_PRECISION`` chose one (it
    stands), else ``bf16`` where the device the run will use multiplies bfloat16 natively (a CUDA device that
    supports it; a CPU with AVX-512 bfloat16 kernels) and ``no`` elsewhere."""
    if precision not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"precision must be auto, float32 or bfloat16, got {precision!r}")
    if precision != "auto":
        return {"float32": "no", "bfloat16": "bf16"}[precision]
    if os.environ.get("ACCELERATE_MIXED_PRECISION"):
        return None
    return "bf16" if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else "no"


class CommandAccelerator(Accelerator):
    """An ``Accelerator`` whose :meth:`autocast` and :attr:`mixed_precision` are its command's own: ``no`` (autocast
    off) or ``bf16`` (bfloat16 autocast on its device); ``None``: accelerate's (``accelerate launch``'s).

    Accelerate keeps its mixed precision process-wide and refuses another once set, so that one process could not run
    a command in float32 after one in bfloat16 (a benchmark's runs, a test's, a notebook's); this keeps the choice per
    accelerator and leaves accelerate's state as ``accelerate launch`` made it.
    """

    def __init__(self, mixed: str | None, **kwargs):
        super().__init__(**kwargs)
        self._mixed = mixed

    @property
    def mixed_precision(self) -> str:
        return self._mixed or super().mixed_precision

    @contextlib.contextmanager
    def autocast(self, autocast_handler=None):
        if self._mixed is None:
            with super().autocast(autocast_handler):
                yield
        else:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._mixed == "bf16"):
                yield


def make_accelerator(precision: str | None = None, **kwargs) -> Accelerator:
    """``Accelerator(**kwargs)``, with a logged warning where its precision is slow on its device; with
    ``precision`` (``float32``, ``bfloat16`` or ``auto``, :func:`accelerate_precision`) a :class:`CommandAccelerator`
    computing in it."""
    if precision is not None:
        accelerator = CommandAccelerator(accelerate_precision(precision), **kwargs)
    else:
        accelerator = Accelerator(**kwargs)
    warning = slow_precision_warning(accelerator)
    if warning and accelerator.is_main_process:
        logger.warning(warning)
    return accelerator


def release_process_group() -> None:
    """Destroy the process group of a multi-process run (training, or a command under ``accelerate launch``) once no
    collective's tensors are held by its threads; nothing without one.

    gloo's worker thread drops a finished collective (and the tensors it holds, e.g. the last evaluation's
    gather) under the group's lock, and needs the GIL to do so. If the main thread frees the DDP model, and
    with it the group, first, it waits for that lock while holding the GIL: the process hangs at exit. A
    last barrier and a short pause (the GIL released) let the worker threads drop their work first. Left to the
    interpreter's exit, the group's threads can also be torn down while still joinable: ``terminate called without
    an active exception``, the process aborted.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    torch.distributed.barrier()
    time.sleep(0.5)
    torch.distributed.destroy_process_group()
