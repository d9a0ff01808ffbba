"""The repository is self-contained: no reference to files outside it, no internal work-item wording.

Scans every text file git tracks (source, comments, docs, configs, cards):

- a path to a Markdown document (``docs/X.md``, ``NOTES.md``, ``../../BENCHMARKS.md``) must exist
  in the repository, relative to the repository root, to the file's folder, or to the package
  folders that ship documents (``copynce_hf/``, ``model_cards/``);
- ``../shared`` and ``/work/`` paths are refused, except ``../shared/data``, the optional sample
  data that tests and benchmarks read (and skip without), outside the package's code;
- wording about the project's internal work items ("the PixTrace issue", "deliverable 2",
  "issue #12", "item 6 of the ...") is refused: a reader has no access to them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".safetensors", ".faiss", ".bin", ".pkl", ".npz", ".ttf", ".pt", ".ico"}
#: Folders searched, besides the file's own folder, for a referenced document.
DOCUMENT_ROOTS = (REPO, REPO / "copynce_hf", REPO / "model_cards")
#: Examples of output names in tests and report code (files those programs create), not references.
GENERATED = {"B.md", "tmp/B.md", "gpu_throughput.md",  # benchmarks.scale.gpu_throughput's tables
             "report.md", "outputs/benchmarks/report.md"}  # benchmarks.report's tables

MARKDOWN_PATH = re.compile(r"(?<![\w/.-])((?:\.\./|\./)*[A-Za-z0-9_-][\w.-]*(?:/[\w.-]+)*\.md)\b")
OUTSIDE = re.compile(r"(\.\./)+shared(/[\w-]+)?|/work/[\w-]+")
WORK_ITEMS = re.compile(
    r"\b(?:the|this|that|our|package's|benchmark|benchmarks|pixtrace)\s+issue\b(?!s? (?:tracker|with|of|in|is|was))"
    r"|\bissue\s*#\s*\d+|\bissue\s+\"|\bdeliverable\s+\d+|\b(?:issue|issues)\b[^.\n]{0,40}\bitem\s+\d+",
    re.IGNORECASE,
)


def _tracked_text_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    files = []
    for name in listed.decode().split("\0"):
        path = REPO / name
        if name and path.suffix.lower() not in BINARY and path.is_file():
            try:
                files.append((path, path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                continue
    return files


#: Installed layout -> repository folder of the package data that setup.py maps (see its package_dir).
PACKAGE_DATA = {"copynce_hf/model_cards/": "model_cards/", "copynce_hf/configs/": "configs/"}


def _document_exists(reference: str, source: Path) -> bool:
    for installed, folder in PACKAGE_DATA.items():
        if reference.startswith(installed):
            reference = folder + reference[len(installed):]
    candidates = [source.parent / reference] + [root / reference for root in DOCUMENT_ROOTS]
    return any(candidate.resolve().is_file() and candidate.resolve().is_relative_to(REPO) for candidate in candidates)


def _violations() -> list[str]:
    found = []
    me = Path(__file__).resolve()
    for path, text in _tracked_text_files():
        if path.resolve() == me:
            continue
        relative = path.relative_to(REPO).as_posix()
        package_code = relative.startswith("copynce_hf/") and path.suffix == ".py"
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{relative}:{number}"
            for match in MARKDOWN_PATH.finditer(line):
                reference = match.group(1)
                if reference in GENERATED or "{" in line[max(0, match.start() - 2): match.start()]:
                    continue
                if not _document_exists(reference, path):
                    found.append(f"{where}: refers to {reference!r}, which is not in the repository")
            for match in OUTSIDE.finditer(line):
                allowed_data = match.group(0).endswith("shared/data") and not package_code
                if not allowed_data:
                    found.append(f"{where}: refers to {match.group(0)!r}, outside the repository")
            for match in WORK_ITEMS.finditer(line):
                found.append(f"{where}: internal work-item wording {match.group(0)!r}")
    return found


def test_no_references_outside_the_repository_and_no_work_item_wording():
    violations = _violations()
    assert not violations, "\n".join(violations)


def test_the_checks_catch_what_they_are_for(tmp_path):
    # The refused examples are put together at run time, so that this file names no place outside
    # the repository itself (it is scanned like every other file).
    outside_folder = "../" + "shared/elsewhere"
    assert MARKDOWN_PATH.search("see docs/ARCHITECTURE.md for the flows").group(1) == "docs/ARCHITECTURE.md"
    assert not _document_exists("NOT_IN_THIS_REPOSITORY.md", REPO / "Makefile")
    assert not _document_exists(f"{outside_folder}/ARCHITECTURE.md", REPO / "README.md")
    assert _document_exists("docs/ARCHITECTURE.md", REPO / "README.md")
    assert _document_exists("../../BENCHMARKS.md", REPO / "copynce_hf" / "pretrained" / "README.md")
    assert OUTSIDE.search(f"See `{outside_folder}/ARCHITECTURE.md`").group(0) == outside_folder
    for text in ("the package's PixTrace issue", "BENCHMARKS issue, item 6", 'issue "Benchmark", deliverable 2',
                 "see issue #12", "in the benchmark issue;"):
        assert WORK_ITEMS.search(text), text
    for text in ("a known issue with Pillow", "issues with the stream", "this is not an issue of speed"):
        assert not WORK_ITEMS.search(text), text


#: ``python -m benchmarks.<...>`` and ``benchmarks/<...>.py`` in any tracked file but the dated log (whose history
#: keeps the module names of its day).
BENCHMARK_COMMAND = re.compile(r"\bpython3? -m (benchmarks(?:\.\w+)+)")
BENCHMARK_FILE = re.compile(r"(?<![\w/.-])benchmarks/[\w/]+\.py\b")


def benchmark_references(text: str) -> list[str]:
    """The benchmark modules ``text`` tells a reader to run and the benchmark files it names, that do not exist:
    a module to run is a file (a package runs only with a ``__main__``)."""
    missing = []
    for match in BENCHMARK_COMMAND.finditer(text):
        path = REPO / Path(*match.group(1).split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
            missing.append(match.group(0))
    missing += [match.group(0) for match in BENCHMARK_FILE.finditer(text) if not (REPO / match.group(0)).is_file()]
    return missing


def test_benchmark_commands_and_files_named_exist():
    found = {path.relative_to(REPO).as_posix(): benchmark_references(text) for path, text in _tracked_text_files()
             if path.relative_to(REPO).as_posix() not in ("benchmarks/LOG.md", "tests/test_repository_references.py")}
    assert {name: missing for name, missing in found.items() if missing} == {}


def test_the_benchmark_check_finds_a_package_run_and_a_missing_file():
    assert benchmark_references("python -m benchmarks.quality.systems --systems pdq; benchmarks/speed/parts.py") == []
    assert benchmark_references("`python3 -m benchmarks.quality --skip-existing`, see benchmarks/quality.py") == [
        "python3 -m benchmarks.quality", "benchmarks/quality.py"]
