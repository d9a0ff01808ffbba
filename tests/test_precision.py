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



@pytest.mark.parametrize("asked, env, native, expected", [
    ("float32", None, True, "no"), ("bfloat16", None, False, "bf16"), ("auto", None, True, "bf16"),
    ("auto", None, False, "no"), ("auto", "no", True, None), ("auto", "bf16", False, None)])
def test_a_commands_precision_becomes_accelerates(monkeypatch, asked, env, native, expected):
    """auto: bfloat16 where the CPU multiplies it natively, unless accelerate launch (its environment) chose."""
    if env is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert precision.accelerate_precision(asked) == expected
    with pytest.raises(ValueError, match="precision must be auto, float32 or bfloat16, got 'half'"):
        precision.accelerate_precision("half")


def test_commands_of_two_precisions_run_in_one_process(monkeypatch):
    """accelerate refuses a second mixed precision in a process; each command's accelerator keeps its own."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    layer = torch.nn.Linear(4, 4)
    rounded = precision.make_accelerator("bfloat16")
    exact = precision.make_accelerator("float32")
    assert (rounded.mixed_precision, exact.mixed_precision) == ("bf16", "no")
    with rounded.autocast():
        assert layer(torch.ones(2, 4)).dtype == torch.bfloat16
    with exact.autocast():
        assert layer(torch.ones(2, 4)).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16), exact.autocast():
        assert layer(torch.ones(2, 4)).dtype == torch.float32  # float32 even inside another autocast
    assert precision.make_accelerator().mixed_precision == "no"  # accelerate's own, untouched
