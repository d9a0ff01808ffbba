"""``copynce calibrate``: score thresholds at 90/95/99 % precision from known copies of the user's own references
(no labels), for ``copynce detect --calibration`` and ``copynce dedup --calibration``."""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, build, given_options
from ..runs.calibrate import CalibrateRequest
from . import options
from .console import progress_log

DESCRIPTION = (
    "Edit a sample of REFERENCES with the calibration's own copy recipe (everyday edits drawn by no benchmark "
    "and no training recipe) and edit distractor images (--distractors, or references held out of the index), run the detect "
    "pipeline on these copies and write OUTPUT (JSON): per stage (descriptor, matcher), the score threshold "
    "at precision 0.9, 0.95 and 0.99 with the recall expected at each, and what reproduces it (models, "
    "preset, recipe, seed, sample ids, counts). Needs no labels. Use the same models and preset in "
    "`copynce detect --calibration OUTPUT`."
)
EPILOG = (
    "The precision promised holds for queries that hold copies and non-copies in about the ratio "
    "--sample : --num-distractors, with edits like the recipe's: fewer copies among real queries mean a lower "
    "precision at the same threshold."
)


def register(commands) -> argparse.ArgumentParser:
    """Add ``calibrate`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser(
        "calibrate", help="score thresholds at 90/95/99 %% precision from known copies of your own references",
        description=DESCRIPTION, epilog=EPILOG,
    )
    add_options(p, CalibrateRequest, ("references", "output", "sample", "distractors", "num_distractors", "seed"))
    options.add_pipeline_options(p)
    options.add_model_loading(p)
    options.add_runtime(p)
    options.add_image_input(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..runs.calibrate import calibrate_to_file, format_calibration, skip_reasons
    from .console import report_counts

    request = build(CalibrateRequest, given_options(CalibrateRequest, args), pipeline=options.pipeline_settings(args),
                    images=options.image_input(args), progress=not args.quiet, log=progress_log("calibrate", args.quiet))
    calibration, references = calibrate_to_file(request)
    print(format_calibration(calibration))
    counts = calibration.provenance["counts"]
    print(f"wrote {args.output} ({counts['copies']} copies, {counts['distractors']} distractors, seed {args.seed}); "
          f"use it with: copynce detect ... --calibration {args.output} --precision 0.9")
    report_counts("calibrate", f"{references} reference images", skip_reasons(calibration), "wrote 1 file")
    return 0
