"""The documents say what is true: the README, BENCHMARKS.md, the log and the guides in docs/.

* Every ```python block of README.md and docs/*.md runs **on its own**, in a fresh offline process, from a
  folder that holds the package where the repository root has it, and writes nothing outside a temporary
  folder or ``outputs/`` (nor into the repository: ``git status`` is compared before and after). A block
  preceded by ``<!-- not run by tests/test_readme.py: REASON -->`` is skipped (an upload to the Hub, the
  authors' checkpoint that is downloaded by hand).
* Every ```python block can also be pasted into the interactive interpreter: fed line by line to the compiler
  ``code.InteractiveConsole`` uses, no line is refused (an indented block is closed by a blank line before
  the next statement).
* What a block prints is what the ```text block right under it shows: the same words, and each number
  within one unit of the last digit shown (the blocks round what they print; another CPU or thread count
  may move the last digit of a rounded float). A block that prints must be followed by its output.
* Every ``copynce`` command of a ```bash block parses with the command line's own parser, every
  ``make`` target exists and every ``python -m`` module can be found.
* Every relative link (and its ``#anchor``) resolves; README.md stays under 250 lines and BENCHMARKS.md
  under 400, its numbers copied from the dated log, whose scaling table ``benchmarks.training.scaling --table``
  reads back from both.
"""

from __future__ import annotations

import codeop
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BENCHMARKS = REPO / "BENCHMARKS.md"
LOG = REPO / "benchmarks/LOG.md"
GUIDES = ("detection", "models", "training", "pixtrace", "space", "scale")
#: Documents whose Python blocks run and whose shell commands are checked.
RUN_DOCUMENTS = [README, *sorted((REPO / "docs").glob("*.md"))]
#: Documents whose links are checked.
LINK_DOCUMENTS = [*RUN_DOCUMENTS, BENCHMARKS, LOG]
SKIP = re.compile(r"<!-- not run by tests/test_readme\.py: (.+?) -->\s*$")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclasses.dataclass(frozen=True)
class Block:
    """A ```python block: where it is, its code, the output shown under it, why it is skipped."""

    document: Path
    line: int
    code: str
    expected: str | None
    skipped: str | None

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(REPO)}:{self.line}"


def _fence_end(lines: list[str], start: int) -> int:
    return next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")


def python_blocks(document: Path) -> list[Block]:
    """The ```python blocks of ``document``, each with the ```text block that follows it (if any)."""
    lines = document.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = lines[index].strip()
        if fence.startswith("```") and fence != "```python":
            index = _fence_end(lines, index) + 1  # another kind of block (bash, text, ...)
            continue
        if fence != "```python":
            index += 1
            continue
        end = _fence_end(lines, index)
        previous = next((text for text in reversed(lines[:index]) if text.strip()), "")
        reason = SKIP.match(previous.strip())
        following = next((i for i in range(end + 1, len(lines)) if lines[i].strip()), None)
        expected = None
        if following is not None and lines[following].strip() == "```text":
            expected = "\n".join(lines[following + 1:_fence_end(lines, following)])
        blocks.append(Block(document, index + 1, "\n".join(lines[index + 1:end]), expected,
                            reason.group(1) if reason else None))
        index = end + 1
    return blocks


BLOCKS = [block for document in RUN_DOCUMENTS for block in python_blocks(document)]
RUN = [block for block in BLOCKS if block.skipped is None]


def same_output(expected: str, actual: str) -> str | None:
    """``None`` when ``actual`` prints what ``expected`` shows, else the first difference in words.

    Lines and words must be equal; a number may differ by at most one unit of the last digit ``expected``
    shows (``0.735`` accepts 0.734 to 0.736; ``256`` only 256).
    """
    want, got = expected.strip("\n").splitlines(), actual.strip("\n").splitlines()
    if len(want) != len(got):
        return f"{len(got)} lines printed, {len(want)} shown:\n{actual}"
    for shown, printed in zip(want, got):
        if NUMBER.sub("#", shown) != NUMBER.sub("#", printed):
            return f"printed {printed!r}, shown {shown!r}"
        for number, value in zip(NUMBER.findall(shown), NUMBER.findall(printed)):
            decimals = len(number.partition(".")[2])  # an integer (a count, a shape) must be equal
            allowed = 10.0 ** -decimals * 1.000001 if decimals else 0.0
            if abs(float(number) - float(value)) > allowed:
                return f"printed {value} where {number} is shown, in {printed!r}"
    return None


def test_output_comparison_tolerates_only_the_last_digit():
    assert same_output("(1, 256) 0.735 0.007", "(1, 256) 0.736 0.006\n") is None
    assert same_output("0.735", "0.737") and same_output("256", "255") and same_output("0.9995", "0.9993")
    assert same_output("copy probability 0.9995", "copy score 0.9995")
    assert same_output("True", "True\nFalse") and same_output("['a', 'b']", "['a', 'c']")


def test_blocks_are_found_and_only_what_needs_the_network_is_left_out():
    assert {block.document.stem for block in RUN} >= {"README", "models", "detection", "pixtrace", "space"}
    assert len(RUN) >= 6
    assert len([block for block in RUN if block.document == README]) == 3
    assert sorted(block.skipped for block in BLOCKS if block.skipped) == [
        "it needs the authors' checkpoint, downloaded by hand", "it uploads to the Hub"]
    for block in RUN:
        assert block.expected is not None or "print(" not in block.code, f"{block.name} prints without output"


def refused_by_the_interpreter(code: str) -> str | None:
    """The first line the interactive interpreter refuses when ``code`` is pasted into it, or ``None``.

    The lines go one by one to ``codeop.CommandCompiler`` in ``"single"`` mode, as ``code.InteractiveConsole.push``
    sends them: the buffer grows while the compiler asks for more, and is run and emptied once a statement
    is complete; a blank line ends an indented block there, so a statement right after a block (no blank
    line between) or a blank line inside a function is a syntax error. One blank line ends the paste.
    """
    compiler, buffer = codeop.CommandCompiler(), []
    for number, line in enumerate([*code.splitlines(), ""], start=1):
        buffer.append(line)
        try:
            complete = compiler("\n".join(buffer), "<stdin>", "single")
        except (SyntaxError, OverflowError, ValueError) as error:
            return f"line {number} {line.strip()!r}: {getattr(error, 'msg', error)}"
        if complete is not None:
            buffer = []
    return None


def test_the_interpreter_check_refuses_a_statement_right_after_an_indented_block():
    loop = "for x in range(2):\n    y = x\n"
    assert refused_by_the_interpreter(loop + "print(y)").startswith("line 3 'print(y)'")
    assert refused_by_the_interpreter("def f():\n    a = 1\n\n    return a\n").startswith("line 4")
    assert refused_by_the_interpreter(loop + "\nprint(y)\nvalues = (x\n          for x in (1, 2))") is None


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_python_block_can_be_pasted_into_the_interpreter(block):
    refused = refused_by_the_interpreter(block.code)
    assert refused is None, f"{block.name}: the interactive interpreter refuses {refused} (a blank line is missing?)"


def _git_status() -> set[str]:
    found = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                           capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip("not a git checkout: the repository's status cannot be read")
    return set(found.stdout.splitlines())


def _leftovers(folder: Path) -> list[str]:
    """What a block left in its working folder besides the package link and ``outputs/``."""
    return sorted(p.name for p in folder.iterdir() if p.name not in {"copynce_hf", "outputs"})


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[block.name for block in RUN])
def test_python_block_runs_alone_and_prints_what_is_shown(block, tmp_path):
    work = tmp_path / "checkout"  # the package where the repository root has it, nothing else
    work.mkdir()
    (work / "copynce_hf").symlink_to(REPO / "copynce_hf", target_is_directory=True)
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               HF_MODULES_CACHE=str(tmp_path / "modules"), TMPDIR=str(tmp_path / "tmp"),
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
    before = _git_status()
    result = subprocess.run([sys.executable, "-c", block.code], cwd=work, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{block.name} failed:\n{result.stdout[-2000:]}{result.stderr[-4000:]}"
    difference = same_output(block.expected or "", result.stdout)
    assert difference is None, f"{block.name}: {difference}"
    assert _leftovers(work) == [], f"{block.name} wrote into the repository root: {_leftovers(work)}"
    assert _git_status() == before, f"{block.name} changed the repository: {_git_status() ^ before}"


# ------------------------------------------------------------------------------------ shell commands
def shell_commands(document: Path) -> list[tuple[int, list[str]]]:
    """``(line, words)`` of every command in the ```bash blocks of ``document``, continuations joined and
    comments dropped."""
    lines = document.read_text(encoding="utf-8").splitlines()
    commands, index = [], 0
    while index < len(lines):
        if lines[index].strip() != "```bash":
            index += 1
            continue
        end = _fence_end(lines, index)
        pending, start = "", None
        for number in range(index + 1, end):
            text = lines[number]
            start = number + 1 if not pending else start
            pending += " " + text.rstrip().removesuffix("\\")
            if not text.rstrip().endswith("\\"):
                words = shlex.split(pending, comments=True)
                if words:
                    commands.append((start, words))
                pending = ""
        index = end + 1
    return commands


def _program_words(words: list[str]) -> list[str]:
    """The words from the program on: environment assignments and ``nice -n N`` dropped."""
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
    if words[:2] == ["nice", "-n"]:
        words = words[3:]
    return words


COMMANDS = [(document, line, words) for document in RUN_DOCUMENTS + [BENCHMARKS]
            for line, words in shell_commands(document)]


def test_shell_commands_name_real_commands_targets_and_modules():
    from copynce_hf.cli import build_parser

    makefile = (REPO / "Makefile").read_text()
    checked = {"copynce": 0, "make": 0, "python": 0}
    for document, line, words in COMMANDS:
        where = f"{document.relative_to(REPO)}:{line}: {' '.join(words)}"
        words = _program_words(words)
        if "copynce_hf.cli" in words:  # accelerate launch ... -m copynce_hf.cli COMMAND ...
            words = ["copynce", *words[words.index("copynce_hf.cli") + 1:]]
        if words[0] == "copynce":
            try:
                build_parser().parse_args(words[1:])
            except SystemExit as error:  # --version and --help exit with 0 after printing
                assert error.code == 0, f"{where}: the command line refuses it"
            checked["copynce"] += 1
        elif words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.MULTILINE), f"{where}: no such target"
            checked["make"] += 1
        elif words[0] in ("python", "python3") and words[1] == "-m":
            assert runnable_module(words[2]), f"{where}: no module {words[2]} to run"
            checked["python"] += 1
    assert min(checked.values()) >= 3, checked


def runnable_module(name: str) -> bool:
    """Whether ``python -m name`` runs something: a module, or a package with a ``__main__`` (a package alone
    would only fail there)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return spec is not None
    return importlib.util.find_spec(f"{name}.__main__") is not None


def test_the_checks_refuse_a_wrong_command():
    assert runnable_module("benchmarks.quality.systems") and runnable_module("copynce_hf.training")
    assert not runnable_module("benchmarks.quality") and not runnable_module("benchmarks.no_such_module")

    from copynce_hf.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["detect", "q/", "--references", "r/", "--output", "o/", "--no-such-option"])
    assert _program_words(["OMP_NUM_THREADS=1", "nice", "-n", "5", "copynce", "dedup"]) == ["copynce", "dedup"]


# --------------------------------------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> list[tuple[int, str]]:
    lines, kept, fenced = text.splitlines(), [], False
    for number, line in enumerate(lines, start=1):
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append((number, re.sub(r"`[^`]*`", "", line)))
    return kept


def heading_anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``document`` (duplicates get ``-1``, ``-2``, ...)."""
    anchors: set[str] = set()
    for _, line in _outside_code(document.read_text(encoding="utf-8").replace("`", "")):
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchor, count = slug, 0
            while anchor in anchors:
                count += 1
                anchor = f"{slug}-{count}"
            anchors.add(anchor)
    return anchors


def broken_links(document: Path, root: Path = REPO) -> list[str]:
    """``line: target (why)`` for each relative link of ``document`` to a file missing from ``root`` or to a
    heading its target does not have."""
    found = []
    for number, line in _outside_code(document.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            if not file.is_file() or not file.is_relative_to(root.resolve()):
                found.append(f"{document.relative_to(root)}:{number}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
                found.append(f"{document.relative_to(root)}:{number}: {target} (no such heading)")
    return found


def test_every_relative_link_resolves():
    assert all(document.is_file() for document in LINK_DOCUMENTS)
    problems = [problem for document in LINK_DOCUMENTS for problem in broken_links(document)]
    assert not problems, "\n".join(problems)


def test_link_check_catches_missing_files_and_headings(tmp_path):
    md = ".md"  # the names are put together here: the repository's reference check scans this file too
    page = tmp_path / "docs" / f"page{md}"
    page.parent.mkdir()
    (tmp_path / f"other{md}").write_text("# Other\n\n## Twice\n\n## Twice\n")
    page.write_text(f"# A title, with `code`\n\n[ok](#a-title-with-code) [bad](#nothing) [gone](missing{md})\n"
                    f"![img](../other{md}) [ok](../other{md}#twice-1) [bad](../other{md}#twice-2)\n"
                    f"```\n[inside code](missing{md})\n```\n[outside the root](../../x{md})\n")
    assert heading_anchors(tmp_path / f"other{md}") == {"other", "twice", "twice-1"}
    assert broken_links(page, root=tmp_path) == [
        f"docs/page{md}:3: #nothing (no such heading)", f"docs/page{md}:3: missing{md} (no such file)",
        f"docs/page{md}:4: ../other{md}#twice-2 (no such heading)", f"docs/page{md}:8: ../../x{md} (no such file)"]


# ------------------------------------------------------------------------------------ the front door
def test_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    assert "make demo" in text and "`make test` is the test command" in text
    assert "make test" in (REPO / ".ci" / "run").read_text()
    for guide in GUIDES:
        assert f"(docs/{guide}.md)" in text, f"the README does not link docs/{guide}.md"
    assert "(BENCHMARKS.md)" in text and "(benchmarks/LOG.md)" in text


def _numbers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?!\w)", text)


def _figures(text: str) -> set[str]:
    """The measured figures of ``text``: its numbers with a decimal point or a thousands separator (not counts
    and labels such as "3 x CopyNCE" or "seed 0")."""
    return {number for number in _numbers(text) if "." in number or "," in number}


def rows_not_from_one_section(page: str, log: str) -> list[str]:
    """The table rows of ``page`` whose figures are not all in one section (``##`` to ``######``) of ``log``: a
    row is one record of the log, not figures gathered from anywhere in it."""
    sections = [_figures(section) for section in re.split(r"\n(?=#{2,6} )", log)]
    rows = [line for line in page.splitlines() if line.startswith("|") and _figures(line)]
    return [row for row in rows if not any(_figures(row) <= section for section in sections)]


def test_benchmarks_page_is_short_and_copies_its_numbers_from_the_log():
    page, log = BENCHMARKS.read_text(encoding="utf-8"), LOG.read_text(encoding="utf-8")
    assert len(page.splitlines()) < 400
    assert "(benchmarks/LOG.md)" in page
    logged = set(_numbers(log))
    assert not [number for number in _numbers(page) if number not in logged]
    assert rows_not_from_one_section(page, log) == []
    results = README.read_text(encoding="utf-8").split("## Results", 1)[1].split("\n## ", 1)[0]
    assert not [number for number in _numbers(results) if number not in logged]


def test_a_row_gathered_from_two_sections_of_the_log_is_refused():
    log = "# Log\n\n## First run\n\n| a | 0.512 | 1,024 |\n\n## Second run\n\n| a | 0.498 | 2,048 |\n"
    assert rows_not_from_one_section("| a, seed 3 | 0.512 | 1,024 |\n", log) == []
    assert rows_not_from_one_section("| a | 0.512 | 2,048 |\n| b | 0.7 | |\n", log) == [
        "| a | 0.512 | 2,048 |", "| b | 0.7 | |"]


def test_scaling_table_reads_back_from_the_page_and_the_log():
    from benchmarks.training.scaling import table_rows

    def key(rows):
        return [(r.series, r.steps, r.pairs, r.seed, r.metrics, r.held_out_micro_ap) for r in rows]

    on_page = table_rows(BENCHMARKS)
    assert len(on_page) >= 20 and key(on_page) == key(table_rows(LOG))
