"""The README's Python blocks run as written, in order, from a folder that holds the package as the
repository root does (shipped models, bundled images), in a fresh offline process.

A block preceded by ``<!-- not run by tests/test_readme.py: REASON -->`` is skipped (an upload to the Hub,
the authors' checkpoint that is downloaded by hand).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SKIP = re.compile(r"<!-- not run by tests/test_readme\.py: (.+?) -->\s*$")

RUNNER = textwrap.dedent(
    """
    import json, sys, traceback

    namespace = {"__name__": "__main__"}
    for line, code in json.load(open(sys.argv[1])):
        try:
            exec(compile(code, f"README.md, block at line {line}", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            sys.exit(f"README block at line {line} failed")
        print("RAN", line, flush=True)
    print("DESCRIPTOR_SHAPE", json.dumps(list(namespace["q"].shape)))
    """
)


def python_blocks() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``([(line, code)] to run, [(line, reason)] skipped)`` of the README's ```python blocks."""
    lines = README.read_text(encoding="utf-8").splitlines()
    run, skipped = [], []
    index = 0
    while index < len(lines):
        if lines[index].strip() == "```python":
            end = lines.index("```", index + 1)
            previous = next((text for text in reversed(lines[:index]) if text.strip()), "")
            reason = SKIP.match(previous.strip())
            if reason:
                skipped.append((index + 1, reason.group(1)))
            else:
                run.append((index + 1, "\n".join(lines[index + 1:end])))
            index = end
        index += 1
    return run, skipped


def test_only_what_needs_the_network_is_left_out():
    run, skipped = python_blocks()
    assert len(run) >= 6
    assert [reason for _, reason in skipped] == ["it uploads to the Hub",
                                                 "it needs the authors' checkpoint, downloaded by hand"]


@pytest.mark.slow
def test_readme_python_blocks_run_as_written(tmp_path):
    run, _ = python_blocks()
    (tmp_path / "blocks.json").write_text(json.dumps(run))
    (tmp_path / "runner.py").write_text(RUNNER)
    work = tmp_path / "checkout"  # the package where the repository root has it, nothing else
    work.mkdir()
    (work / "copynce_hf").symlink_to(REPO / "copynce_hf", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"),
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "blocks.json")], cwd=work,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert result.stdout.count("RAN ") == len(run)
    # what the README says of the shapes is what ran
    shape = json.loads(result.stdout.split("DESCRIPTOR_SHAPE", 1)[1].strip().splitlines()[0])
    said = re.search(r"q = descriptor\(query\)\.descriptors\s+# \((\d+), (\d+)\), unit norm", README.read_text())
    assert said and [int(said.group(1)), int(said.group(2))] == shape
    assert (work / "out" / "descriptor" / "README.md").is_file() and (work / "my-matcher" / "pipeline_copynce.py").is_file()
