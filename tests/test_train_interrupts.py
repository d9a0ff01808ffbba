"""Interrupted training: Ctrl-C, configuration errors and ``kill -9`` at several moments, then resume.

Every run is a real ``python -m copynce_hf.training`` process on a tiny model (32x32 inputs, two
layers) and a dozen small images, so that killing it is what a user's ``kill -9`` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import shrunk_asset_images, tiny_model_options
from safetensors.torch import load_file

from copynce_hf.training.checkpoints import CHECKPOINT_MARKER

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return shrunk_asset_images(tmp_path_factory.mktemp("images"), 64)


def _options(images, output, *extra) -> list[str]:
    return [
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"), "--dataset", str(images), "--output_dir", str(output),
        *tiny_model_options(descriptor_dim=32),
        "--dataloader_num_workers", "0", "--num_eval_images", "0", "--per_device_train_batch_size", "4",
        "--report_to", "none", "--logging_steps", "1", "--max_steps", "8", "--warmup_steps", "2",
        "--checkpointing_steps", "2", "--checkpoints_total_limit", "10", *extra,
    ]


def _environment(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1", **extra}


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and an ignored
    # signal stays ignored across exec: a test suite launched that way would hand the run a Ctrl-C
    # it cannot receive. Give the run the default disposition, as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(options, log: Path, pause_in_checkpoint: int | None = None) -> subprocess.Popen:
    """The run as a process; ``pause_in_checkpoint``: the step whose checkpoint pauses for a minute after its
    files are written, before it is completed (tests/_paused_training.py)."""
    handle = log.open("w")
    command = ["-m", "copynce_hf.training"] if pause_in_checkpoint is None else [
        str(REPO / "tests" / "_paused_training.py"), str(pause_in_checkpoint)]
    return subprocess.Popen([sys.executable, *command, *options], stdout=handle,
                            stderr=subprocess.STDOUT, env=_environment(), cwd=REPO,
                            preexec_fn=_default_sigint)


def _wait_for(condition, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended (status {process.returncode}) before the moment to kill it:\n"
                                 + log.read_text()[-3000:])
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for the moment to kill the run:\n" + log.read_text()[-3000:])
        time.sleep(0.05)


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


def _run(options, log: Path) -> subprocess.CompletedProcess:
    with log.open("w") as handle:
        result = subprocess.run([sys.executable, "-m", "copynce_hf.training", *options], stdout=handle,
                                stderr=subprocess.STDOUT, env=_environment(), cwd=REPO, timeout=600)
    assert result.returncode == 0, log.read_text()[-3000:]
    return result


def test_sigkill_at_several_moments_then_resume_gives_the_uninterrupted_weights(images, tmp_path):
    full = tmp_path / "full"
    _run(_options(images, full), tmp_path / "full.log")

    run = tmp_path / "killed"
    checkpoints = run / "checkpoints"
    options = _options(images, run, "--resume", "latest")
    # 1. killed while the step-4 checkpoint is being written (its files are on disk, not yet completed)
    partial = checkpoints / ".step_00000004.partial"
    process = _start(options, tmp_path / "kill1.log", pause_in_checkpoint=4)
    _wait_for(lambda: partial.is_dir() and any(partial.glob("random_states_*")), process, tmp_path / "kill1.log")
    time.sleep(0.5)
    _kill(process)
    assert partial.is_dir() and not (checkpoints / "step_00000004").exists()
    assert (checkpoints / "step_00000002" / CHECKPOINT_MARKER).is_file()

    # 2. resumed (skipping the incomplete checkpoint), then killed in the middle of training, right after step 6's
    log = tmp_path / "kill2.log"
    process = _start(options, log)
    _wait_for(lambda: (checkpoints / "step_00000006" / CHECKPOINT_MARKER).is_file(), process, log)
    _kill(process)
    text = log.read_text()
    assert "skipping 1 incomplete checkpoint" in text and "resumed from" in text and "step_00000002" in text

    # 3. resumed again: finishes from step 6
    _run(options, tmp_path / "final.log")
    assert "resumed from" in (tmp_path / "final.log").read_text()
    expected = load_file(str(full / "model.safetensors"))
    resumed = load_file(str(run / "model.safetensors"))
    assert expected.keys() == resumed.keys()
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=0, atol=1e-6, msg=name)


def test_ctrl_c_stops_with_one_line_naming_the_checkpoint_and_the_resume_command(images, tmp_path):
    output = tmp_path / "run"
    log = tmp_path / "run.log"
    # Far more steps than the run can make before the signal, even when a loaded machine starves
    # this test process between polls (400 steps once finished before the signal was sent).
    process = _start(_options(images, output, "--max_steps", "1000000"), log)
    _wait_for(lambda: (output / "checkpoints" / "step_00000002" / CHECKPOINT_MARKER).is_file(), process, log)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    text = log.read_text()
    assert process.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("training interrupted; last checkpoint: ") and "checkpoints/step_" in last
    assert last.endswith("--resume latest") and "python -m copynce_hf.training" in last


def test_configuration_error_is_one_line_and_status_2(tmp_path, capsys):
    from copynce_hf.training.run import cli

    assert cli(["--learning_rate", "-1", "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: invalid configuration value learning_rate=-1: must be > 0"
    ]
    assert not (tmp_path / "out").exists()
