"""The ``copynce`` command: detect copies in one go, or index, search, re-score, evaluate and visualise step by step.

The whole pipeline (descriptors with local crops ensembling and score normalisation, merged
candidates, matcher verification, evaluation and a match gallery)::

    copynce detect queries/ --references references/ --output found/ [--ground-truth gt.csv]

Score thresholds from known copies of the references (no labels), then decisions::

    copynce calibrate references/ --output calibration.json
    copynce detect queries/ --references references/ --output found/ --calibration calibration.json --precision 0.9

The same steps one at a time::

    copynce index references/ --output refs_index/
    copynce search queries/ --index refs_index/ --k 10 --output candidates.csv
    copynce match candidates.csv --queries queries/ --references references/ --output scored.csv
    copynce evaluate scored.csv --ground-truth ground_truth.csv --output report/
    copynce visualize queries/q1.jpg references/r7.jpg --patch 7,7 --output why/

This module is the entry point only: it registers the commands of :mod:`copynce_hf.commands` (one module each,
with its options and its ``run``) and turns the library's errors into one line and exit status 2.

Output paths are checked before any model is loaded or image read, and results are written to a
temporary file or folder and moved into place at the end, so a failure never leaves a partial or
damaged output. Bad input (a missing or empty folder, a malformed ground-truth or predictions file,
predicted ids that do not match the ground truth, an unusable output path, ...) ends the command with
exit status 2 and a one-line message on stderr, without traceback. Unreadable images (empty, not an
image, truncated, too small, above ``--max-pixels``) are skipped with a warning naming the file and
the reason, and every command ends with a line of counts (read, skipped with reasons, written).
Descriptor extraction and matcher re-scoring (``detect``, ``match``) run distributed when launched with
``accelerate launch -m copynce_hf.cli``; re-scoring is saved in chunks and resumed after a kill.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .commands import (
    calibrate,
    convert_original,
    dedup,
    detect,
    evaluate,
    export_onnx,
    index,
    match,
    options,
    search,
    visualize,
)
from .modeling.errors import CopyNCEError
from .threads import apply_thread_policy

#: The commands, in the order ``copynce --help`` lists them.
COMMANDS = (detect, calibrate, dedup, index, search, match, evaluate, visualize, export_onnx, convert_original)


def build_parser() -> argparse.ArgumentParser:
    """The ``copynce`` parser: the global options, then each command of :data:`COMMANDS` registered by its module."""
    parser = argparse.ArgumentParser(
        prog="copynce",
        description="CopyNCE image copy detection: index reference images, search edited copies of query "
        "images, re-score candidates with the matcher, evaluate (muAP, RP90) and visualise patch affinity.",
        epilog="Example: copynce detect queries/ --references refs/ --output found/; step by step: "
        "copynce index refs/ --output idx/ && copynce search queries/ --index idx/ "
        "--output candidates.csv && copynce match candidates.csv --queries queries/ --references refs/ "
        "--output scored.csv",
    )
    options.add_quiet(parser, False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parser = commands.add_parser

    def add_command(*args, **kwargs):
        """A subcommand that also accepts the global options after its name (``copynce index -q ...``)."""
        sub = add_parser(*args, **kwargs)
        options.add_quiet(sub, argparse.SUPPRESS)
        return sub

    commands.add_parser = add_command
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``copynce`` command; returns the exit status (0 on success, 2 on bad input).

    Run from the command line (``argv`` None), it first sets the thread policy of :mod:`copynce_hf.threads`
    (threads for the free cores, a passive wait); called with ``argv`` it leaves the caller's threads alone."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="copynce: %(levelname)s: %(message)s")
    if argv is None:  # a process of its own (the console script, python -m, accelerate launch), not a caller's
        apply_thread_policy()  # before the command loads torch (copynce_hf.threads)
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        status = args.handler(args)
    except (CopyNCEError, ImportError) as error:
        message = " ".join(str(error).split())
        print(f"copynce {args.command}: error: {message}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:  # another process may be gone: no last barrier
        from .commands.console import interrupted_line

        print(interrupted_line(args), file=sys.stderr)
        return 130
    if "torch" in sys.modules:  # under accelerate launch the processes end their group together
        from .precision import release_process_group

        release_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
