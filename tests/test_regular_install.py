"""A regular (non-editable) install works: the wheel carries every file the package reads at run time.

The wheel is built from the tracked files, installed with ``pip install --no-deps`` into a fresh
virtual environment that sees the already installed dependencies (those of the interpreter running
the tests, be it the system's or a virtual environment's: :mod:`_environments`) but not the source
tree, and then trains for two steps with the default configuration (the module entry
point, no ``--config``) and indexes the bundled images with the ``copynce`` command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _environments import environment_with_running_packages

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _tracked_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot tell the tracked files from build outputs")
    return [name for name in listed.decode().split("\0") if name and (REPO / name).is_file()]


def _run(command, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


def test_wheel_in_a_fresh_environment_trains_and_indexes(tmp_path):
    source = tmp_path / "source"
    for name in _tracked_files():  # a clean copy: no build outputs, no egg-info of the editable install
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
          str(source)], cwd=tmp_path, env=environment)
    (wheel,) = wheels.glob("copynce_hf-*.whl")

    environment_dir = tmp_path / "venv"
    python = environment_with_running_packages(environment_dir)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
         cwd=tmp_path, env=environment)

    work = tmp_path / "work"  # run away from the source tree, so that only the installed package can be imported
    work.mkdir()
    where = _run([str(python), "-c", "import copynce_hf, sys; print(copynce_hf.__file__); print(sys.prefix)"],
                 cwd=work, env=environment).stdout.split()
    assert Path(where[0]).resolve().is_relative_to(environment_dir.resolve()), where
    package = Path(where[0]).parent

    for shipped in ("configs/tiny_cpu.yaml", "model_cards/descriptor.md", "pretrained/descriptor/config.json",
                    "metrics/copy_detection/copy_detection.py", "assets/images"):
        assert (package / shipped).exists(), f"{shipped} is not in the installed package"

    named = _run([str(python), "-c", "from copynce_hf.training.run import parse_args; "
                  "print(parse_args(['--config', 'tiny_cpu_matcher.yaml']).model_type)"], cwd=work, env=environment)
    assert named.stdout.strip().splitlines()[-1] == "matcher"  # a shipped configuration by its name
    _run([str(python), "-m", "copynce_hf.training", "--max_steps", "2", "--output_dir", str(work / "run"),
          "--report_to", "none", "--dataloader_num_workers", "0", "--eval_steps", "1000", "--num_eval_images", "2"],
         cwd=work, env=environment)
    summary = json.loads((work / "run" / "training_summary.json").read_text())
    assert summary["steps"] == 2 and (work / "run" / "model.safetensors").is_file()

    copynce = environment_dir / "bin" / "copynce"
    result = _run([str(copynce), "index", str(package / "assets" / "images"), "--output", str(work / "index"), "-q"],
                  cwd=work, env=environment)
    assert "index: read 12 images, skipped 0, wrote 12 descriptors" in result.stdout
    assert (work / "index" / "index.faiss").is_file()


def test_the_fresh_environment_sees_the_packages_of_a_virtual_environment_running_the_tests(tmp_path):
    """``make test`` in a virtual environment: the packages are the venv's, not its base interpreter's."""
    import venv

    outer = tmp_path / "outer"  # stands for the user's virtual environment
    venv.EnvBuilder(with_pip=False).create(outer)
    outer_python = outer / "bin" / "python"
    purelib = subprocess.run([str(outer_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "only_in_the_outer_venv.py").write_text("WHERE = 'outer'\n")
    inner = tmp_path / "inner"
    make = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"from _environments import environment_with_running_packages as make; print(make({str(inner)!r}))")
    python = _run([str(outer_python), "-c", make], cwd=tmp_path, env=dict(os.environ)).stdout.strip()
    seen = _run([python, "-c", "import only_in_the_outer_venv as m, sys; print(m.WHERE, sys.prefix)"],
                cwd=tmp_path, env=dict(os.environ)).stdout.split()
    assert seen == ["outer", str(inner)]


def test_make_test_runs_every_test_before_failing():
    """CI runs ``make test``: a first failure must not hide the others (no ``-x`` / ``--maxfail``)."""
    recipe, inside = [], False
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("test:"):
            inside = True
        elif inside and line.startswith("\t"):
            recipe.append(line.split("#")[0])
        elif inside:
            break
    pytest_lines = [line for line in recipe if "pytest" in line]
    assert pytest_lines, recipe
    for line in pytest_lines:
        words = line.split()
        assert "-x" not in words and "--exitfirst" not in words and not any(w.startswith("--maxfail") for w in words)
