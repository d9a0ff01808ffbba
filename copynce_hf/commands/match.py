"""``copynce match``: re-score the candidate pairs of a predictions CSV with the matcher (optionally with local
crops ensembling), resumably."""

from __future__ import annotations

import argparse

from ..configuration.fields import positive_int
from ..runtime.loading import DEFAULT_MATCHER
from . import options
from .console import progress_log

DESCRIPTION = (
    "Score every pair of a predictions CSV with the matcher (copy probability = sigmoid of "
    "its logit) and write them as a new predictions CSV. Images are found by id (file name without "
    "extension) in the query and reference folders."
)


def rotations(text: str) -> tuple[int, ...]:
    """``--rotations``: comma-separated degrees, or ``none``."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated degrees such as 90,180,270, got {text!r}") from None


def _add_local_crops(p: argparse.ArgumentParser) -> None:
    lce = p.add_argument_group("local crops ensembling (supplementary 'Local Crops Ensembling')")
    options.add_matcher_lce(lce)
    lce.add_argument(
        "--local-crops", action="store_true",
        help="compare query views (whole, grid crops, rotations) with reference views (whole, grid crops) "
        "and keep the maximum score",
    )
    lce.add_argument("--query-grid", type=positive_int, default=2, help="query crops per side (default 2)")
    lce.add_argument("--reference-grid", type=positive_int, default=1,
                     help="reference crops per side (default 1)")
    lce.add_argument(
        "--crop-scale", type=float, default=1.5, help="a crop spans crop-scale/grid of each side (default 1.5)"
    )
    lce.add_argument(
        "--rotations", type=rotations, default=(90, 180, 270),
        help="rotations of the whole query, degrees (default 90,180,270; 'none' for no rotation)",
    )


def register(commands) -> argparse.ArgumentParser:
    """Add ``match`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("match", help="re-score candidate pairs with the matcher", description=DESCRIPTION)
    p.add_argument("predictions", help="candidate pairs (query_id,reference_id,score CSV)")
    p.add_argument("--queries", required=True, help="folder of query images")
    p.add_argument("--references", required=True, help="folder of reference images")
    p.add_argument("--matcher", help=f"matcher model folder or Hub id (default: {DEFAULT_MATCHER})")
    p.add_argument("--output", required=True, help="predictions CSV to write")
    p.add_argument("--top", type=positive_int, help="only re-score each query's TOP best candidates")
    _add_local_crops(p)
    options.add_chunk_size(p)
    options.add_model_loading(p, batch_size=32, unit="image pairs (view pairs with --local-crops)")
    options.add_runtime(p)
    options.add_image_input(p)
    p.set_defaults(handler=run, resumes=kept_work)
    return p


def kept_work(args) -> str:
    """What a run stopped by Ctrl-C keeps for the next (:func:`~copynce_hf.commands.console.interrupted_line`)."""
    from ..runs.match import rescoring_folder

    return f"the scored chunks kept in {rescoring_folder(args.output)}"


def run(args) -> int:
    from ..runs.match import MatchRequest, match_pairs
    from .console import report_counts

    request = MatchRequest(
        args.predictions, args.queries, args.references, args.output, matcher=args.matcher, runtime=args.runtime,
        top=args.top, matcher_lce=args.matcher_lce, local_crops=args.local_crops, query_grid=args.query_grid,
        reference_grid=args.reference_grid, crop_scale=args.crop_scale, rotations=args.rotations,
        chunk_size=args.chunk_size, batch_size=args.batch_size, num_workers=args.num_workers,
        input=options.image_input(args), progress=not args.quiet, log=progress_log("match", args.quiet),
    )
    done = match_pairs(request)
    if done is None:  # another process of `accelerate launch`: the main one writes
        return 0
    print(f"re-scored {done.count} pairs into {args.output}")
    top = f" (re-scoring the top {args.top} per query: {done.rescored})" if args.top is not None else ""
    report_counts("match", f"{done.read} candidate pairs{top}", done.skip_reasons, f"wrote {done.count} pairs")
    return 0
