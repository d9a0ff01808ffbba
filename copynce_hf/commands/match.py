"""``copynce match``: re-score the candidate pairs of a predictions CSV with the matcher (optionally with local
crops ensembling), resumably."""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, build, given_options
from ..runs.match import MatchRequest
from . import options
from .console import progress_log

DESCRIPTION = (
    "Score every pair of a predictions CSV with the matcher (copy probability = sigmoid of "
    "its logit) and write them as a new predictions CSV. Images are found by id (file name without "
    "extension) in the query and reference folders."
)


def _add_local_crops(p: argparse.ArgumentParser) -> None:
    lce = p.add_argument_group("local crops ensembling (supplementary 'Local Crops Ensembling')")
    add_options(lce, MatchRequest, ("matcher_lce", "local_crops", "query_grid", "reference_grid", "crop_scale",
                                    "rotations"))


def register(commands) -> argparse.ArgumentParser:
    """Add ``match`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("match", help="re-score candidate pairs with the matcher", description=DESCRIPTION)
    add_options(p, MatchRequest, ("predictions", "queries", "references", "matcher", "output", "top"))
    _add_local_crops(p)
    add_options(p, MatchRequest, ("chunk_size", "fusion_precision"))
    options.add_model_loading(p, MatchRequest)
    options.add_runtime(p, MatchRequest)
    options.add_image_input(p)
    p.set_defaults(handler=run, resumes=kept_work)
    return p


def kept_work(args) -> str:
    """What a run stopped by Ctrl-C keeps for the next (:func:`~copynce_hf.commands.console.interrupted_line`)."""
    from ..runs.match import rescoring_folder

    return f"the scored chunks kept in {rescoring_folder(args.output)}"


def run(args) -> int:
    from ..runs.match import match_pairs
    from .console import report_counts

    request = build(MatchRequest, given_options(MatchRequest, args), input=options.image_input(args),
                    progress=not args.quiet, log=progress_log("match", args.quiet))
    done = match_pairs(request)
    if done is None:  # another process of `accelerate launch`: the main one writes
        return 0
    print(f"re-scored {done.count} pairs into {args.output}")
    print(done.meaning.line())
    top = f" (re-scoring the top {args.top} per query: {done.rescored})" if args.top is not None else ""
    report_counts("match", f"{done.read} candidate pairs{top}", done.skip_reasons, f"wrote {done.count} pairs")
    return 0
