"""copynce_hf/precision.py: bf16 on a CPU without native bf16 matrix support is named in the log."""

from __future__ import annotations

import logging

import pytest
import torch

from copynce_hf import precision


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps its state process-wide: each case builds its accelerator from a clean one."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.parametrize("native, mixed, expected", [(False, "bf16", True), (True, "bf16", False),
                                                     (False, "no", False)])
def test_bf16_on_a_cpu_without_native_support_is_warned(monkeypatch, caplog, native, mixed, expected):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    with caplog.at_level(logging.WARNING, logger="copynce_hf.precision"):
        accelerator = precision.make_accelerator(mixed_precision=mixed)
    assert accelerator.device.type == "cpu" and accelerator.mixed_precision == mixed
    warned = [r.getMessage() for r in caplog.records if r.name == "copynce_hf.precision"]
    assert bool(warned) == expected
    if expected:
        assert "--mixed_precision no" in warned[0] and torch.backends.cpu.get_cpu_capability() in warned[0]

