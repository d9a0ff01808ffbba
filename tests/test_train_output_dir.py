"""A training run into an ``output_dir`` that holds an earlier run: refused with one line, continued with
``--resume`` or replaced with ``--overwrite_output_dir``, never overwritten silently; and a training log free
of a library's start-up chatter (faiss's loader)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, shrunk_asset_images, tiny_model_options

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.training.options import parse_args
from copynce_hf.training.run import _continue_command, cli


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return shrunk_asset_images(tmp_path_factory.mktemp("images"), 64)


def _options(images, output, *extra) -> list[str]:
    return ["--config", "tiny_cpu.yaml", "--dataset", str(images), "--output_dir", str(output),
            *tiny_model_options(descriptor_dim=32), "--dataloader_num_workers", "0", "--num_eval_images", "0",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--max_steps", "2", "--warmup_steps", "1",
            "--checkpointing_steps", "2", *extra]


def _error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _steps(output) -> int:
    return json.loads((output / "training_summary.json").read_text())["steps"]


def test_a_new_run_into_a_finished_run_is_refused_with_one_line_and_changes_nothing(images, tmp_path, capsys):
    output = tmp_path / "run"
    assert cli(_options(images, output)) == 0
    files = {path: path.read_bytes() for path in output.rglob("*") if path.is_file()}
    capsys.readouterr()
    assert cli(_options(images, output, "--seed", "1")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and f"output_dir='{output}'" in lines[0], lines
    assert "training_summary.json" in lines[0] and "checkpoints up to step 2" in lines[0]
    assert all(way in lines[0] for way in ("--resume latest", "--overwrite_output_dir", "another --output_dir"))
    assert {path: path.read_bytes() for path in output.rglob("*") if path.is_file()} == files


def test_overwrite_output_dir_replaces_the_earlier_run_and_deletes_its_checkpoints(images, tmp_path):
    output = tmp_path / "run"
    assert cli(_options(images, output, "--max_steps", "4")) == 0
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]
    assert cli(_options(images, output, "--overwrite_output_dir", "--seed", "1")) == 0
    # the earlier step-4 checkpoint is gone: a later --resume latest could have continued from it
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == ["step_00000002"]
    assert _steps(output) == 2 and json.loads((output / "training_summary.json").read_text())["seed"] == 1


def test_resume_continues_an_earlier_run_and_an_interrupted_one_is_not_restarted_unasked(images, tmp_path, capsys):
    finished = tmp_path / "finished"
    assert cli(_options(images, finished)) == 0
    assert cli(_options(images, finished, "--max_steps", "3", "--resume", "latest")) == 0  # one more step
    assert _steps(finished) == 3
    interrupted = tmp_path / "interrupted"  # a run stopped after its step-2 checkpoint
    shutil.copytree(finished / "checkpoints", interrupted / "checkpoints")
    capsys.readouterr()
    assert cli(_options(images, interrupted, "--max_steps", "3")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "checkpoints up to step" in lines[0] and "--resume latest" in lines[0], lines


def test_resume_latest_without_a_checkpoint_does_not_replace_a_finished_run(images, tmp_path, capsys):
    output = tmp_path / "run"
    assert cli(_options(images, output, "--checkpointing_steps", "null")) == 0
    capsys.readouterr()
    assert cli(_options(images, output, "--checkpointing_steps", "null", "--resume", "latest")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "a model folder" in lines[0] and "--resume latest" not in lines[0], lines


def test_overwrite_and_resume_together_are_refused_and_the_continue_command_drops_overwrite(tmp_path):
    with pytest.raises(ConfigError, match="overwrite_output_dir=True: starts a new run, while resume='latest'"):
        parse_args(["--overwrite_output_dir", "--resume", "latest", "--output_dir", str(tmp_path)])
    command = _continue_command(["--output_dir", "out", "--overwrite_output_dir", "--max_steps", "5",
                                 "--overwrite-output-dir", "true", "--resume", "x"])
    assert command.endswith("--output_dir out --max_steps 5 --resume latest"), command


def test_the_training_log_has_no_faiss_loader_lines(images, tmp_path):
    # The periodic evaluation imports faiss, whose loader logs at INFO every CPU-specific build it tries and
    # fails to load ("Could not load library with AVX512 support due to: ModuleNotFoundError(...)").
    output = tmp_path / "run"
    options = _options(images, output, "--num_eval_images", "4", "--max_steps", "1", "--checkpointing_steps", "null")
    result = subprocess.run([sys.executable, "-m", "copynce_hf.training", *options], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"})
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "eval: muAP" in log  # the evaluation ran (and imported faiss) ...
    assert "faiss.loader" not in log and "ModuleNotFoundError" not in log  # ... without its loader's lines
