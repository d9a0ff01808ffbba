"""Shared helpers of the benchmark scripts: result files, the machine description, the command line."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

#: Repository root (the folder holding ``benchmarks/`` and ``scripts/``).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Default folder of every benchmark output (git-ignored ``outputs/``).
DEFAULT_OUTPUT_DIR = REPO_ROOT / "outputs" / "benchmarks"

__all__ = ["REPO_ROOT", "DEFAULT_OUTPUT_DIR", "machine_info", "command_line", "write_json", "read_json",
           "limit_threads", "now", "fresh_folder"]


def machine_info() -> dict[str, Any]:
    """CPU model, core counts, memory and library versions of this machine."""
    import faiss
    import numpy
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo") as handle:
            total_kib = next(int(line.split()[1]) for line in handle if line.startswith("MemTotal"))
        memory_gib = round(total_kib / 2**20, 1)
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": memory_gib,
        "gpu": None if not torch.cuda.is_available() else torch.cuda.get_device_name(0),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "faiss": getattr(faiss, "__version__", "?"),
        "numpy": numpy.__version__,
    }


def command_line() -> str:
    """The command that started this process, as a user would type it (``python -m ...``)."""
    argv = list(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        argv = ["python", "-m", spec.name.removesuffix(".__main__")] + argv[1:]
    else:
        argv = ["python"] + argv
    return shlex.join(argv)


def limit_threads(threads: int | None) -> None:
    """Use ``threads`` intra-op threads in torch (and faiss / BLAS through OpenMP); None leaves the defaults."""
    if threads is None:
        return
    import faiss
    import torch

    torch.set_num_threads(int(threads))
    faiss.omp_set_num_threads(int(threads))


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write ``payload`` atomically (temporary file + rename), so that a killed run never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def read_json(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def fresh_folder(folder: Path) -> Path:
    """``folder``, emptied (removed with what it holds, then made again, parents too): a task written anew."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder
