"""What the ``copynce`` commands print besides their results: progress lines on stderr and the closing line of
counts on stdout."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable


def progress_log(command: str, quiet: bool) -> Callable[[str], None]:
    """The progress lines of ``command`` on stderr (``copynce detect: ...``); silent with ``--quiet``."""
    def say(line: str) -> None:
        if not quiet:
            print(f"copynce {command}: {line}", file=sys.stderr)

    return say


def interrupted_line(args) -> str:
    """The line of a command stopped by Ctrl-C, saying what running it again does (as training's says how to
    continue): a command that keeps its work as it goes (its parser sets ``resumes``: ``args -> what it keeps``)
    resumes from it; the others start again."""
    kept = getattr(args, "resumes", None)
    if kept is None:
        return f"copynce {args.command}: interrupted; it keeps no work to resume from: the same command starts again"
    return f"copynce {args.command}: interrupted; continue with the same command: it resumes from {kept(args)}"


def report_counts(command: str, read: str, skipped: Iterable[str], written: str) -> None:
    """The closing line of a command: ``index: read 12 images, skipped 2 (1 empty file, 1 too small), wrote ...``
    (``skipped``: the reason of each image left out)."""
    from ..retrieval.sources import count_text

    print(f"{command}: read {read}, skipped {count_text(skipped)}, {written}")
