"""``copynce search``: the k nearest references of every query image in an index of ``copynce index``, with
score normalisation or feature stretching (paper supplementary)."""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, build, given_options
from ..runs.search import SearchRequest
from . import options

DESCRIPTION = (
    "Embed the images of QUERIES, search the index and write the k-NN pairs as a DISC21 "
    "predictions CSV (query_id,reference_id,score; score = cosine similarity, or as post-processed)."
)


def _add_post_processing(p: argparse.ArgumentParser) -> None:
    post = p.add_argument_group(
        "post-processing (paper supplementary)",
        "Both need descriptors of an auxiliary image set without copies of the queries, e.g. training "
        "images: `copynce index AUX --output AUX_INDEX`, then pass AUX_INDEX.",
    )
    add_options(post, SearchRequest, ("score_norm", "alpha", "k_start", "k_end", "stretch", "beta", "stretch_k"))


def register(commands) -> argparse.ArgumentParser:
    """Add ``search`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("search", help="find the k nearest references of every query image",
                            description=DESCRIPTION)
    add_options(p, SearchRequest, ("queries", "index", "model", "k", "output", "descriptor_lce"))
    _add_post_processing(p)
    add_options(p.add_argument_group("extra outputs"), SearchRequest, ("save_descriptors", "hdf5"))
    options.add_search_knobs(p, SearchRequest)
    options.add_model_loading(p, SearchRequest)
    options.add_runtime(p, SearchRequest)
    options.add_image_input(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..runs.search import search_queries
    from .console import report_counts

    request = build(SearchRequest, given_options(SearchRequest, args), input=options.image_input(args),
                    progress=not args.quiet)
    done = search_queries(request)
    if done is None:  # another process of `accelerate launch`: the main one writes
        return 0
    print(f"wrote {done.count} predictions for {done.searched} queries to {args.output}")
    print(done.meaning.line())
    report_counts("search", f"{done.images} query images", done.skip_reasons.values(), f"wrote {done.count} predictions")
    return 0
