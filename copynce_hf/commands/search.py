"""``copynce search``: the k nearest references of every query image in an index of ``copynce index``, with
score normalisation or feature stretching (paper supplementary)."""

from __future__ import annotations

import argparse

from ..configuration.fields import positive_int
from ..retrieval.descriptors.views import DESCRIPTOR_LCE_MODES
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
    post.add_argument(
        "--score-norm", metavar="AUX_DESCRIPTORS",
        help="score normalisation: subtract alpha * the mean similarity of the query to its auxiliary "
        "neighbours of rank k-start..k-end (a descriptors.safetensors file or an index folder)",
    )
    post.add_argument("--alpha", type=float, default=1.0, help="score normalisation weight (default 1)")
    post.add_argument("--k-start", type=int, default=0, help="first auxiliary rank, from 0 (default 0)")
    post.add_argument("--k-end", type=int, default=9, help="last auxiliary rank, inclusive (default 9)")
    post.add_argument(
        "--stretch", metavar="AUX_DESCRIPTORS",
        help="feature stretching: scale each query by beta * its mean top-k auxiliary similarity and score "
        "pairs by negative squared euclidean distance",
    )
    post.add_argument("--beta", type=float, default=2.5, help="stretching coefficient (default 2.5)")
    post.add_argument("--stretch-k", type=positive_int, default=5,
                      help="auxiliary neighbours averaged (default 5)")


def register(commands) -> argparse.ArgumentParser:
    """Add ``search`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("search", help="find the k nearest references of every query image",
                            description=DESCRIPTION)
    p.add_argument("queries", help="folder of query images")
    p.add_argument("--index", required=True, help="index folder written by `copynce index`")
    p.add_argument("--model", help="descriptor model (default: the one the index was built with)")
    p.add_argument("--k", type=positive_int, default=10, help="neighbours per query (default 10)")
    p.add_argument("--output", required=True, help="predictions CSV to write")
    p.add_argument("--descriptor-lce", choices=DESCRIPTOR_LCE_MODES, default="none",
                   help="query views: none, matcher-views (26 views; a pair scores its best view pair) or authors "
                   "(45 views in 4 groups, each view keeps its top 100/10/10/4 references by group, then the "
                   "best --k) (default none)")
    _add_post_processing(p)
    out = p.add_argument_group("extra outputs")
    out.add_argument("--save-descriptors", metavar="PATH", help="also write the query descriptors (safetensors)")
    out.add_argument(
        "--hdf5", metavar="PATH",
        help="also write query and reference descriptors in the DISC21 descriptor-track HDF5 layout (needs h5py)",
    )
    options.add_search_knobs(p)
    options.add_model_loading(p)
    options.add_runtime(p)
    options.add_image_input(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..runs.search import SearchRequest, search_queries
    from .console import report_counts

    request = SearchRequest(
        args.queries, args.index, args.output, model=args.model, runtime=args.runtime, k=args.k,
        descriptor_lce=args.descriptor_lce, score_norm=args.score_norm, alpha=args.alpha, k_start=args.k_start,
        k_end=args.k_end, stretch=args.stretch, beta=args.beta, stretch_k=args.stretch_k,
        save_descriptors=args.save_descriptors, hdf5=args.hdf5, ef_search=args.ef_search, nprobe=args.nprobe,
        k_factor=args.k_factor, batch_size=args.batch_size, num_workers=args.num_workers,
        input=options.image_input(args), progress=not args.quiet,
    )
    done = search_queries(request)
    if done is None:  # another process of `accelerate launch`: the main one writes
        return 0
    print(f"wrote {done.count} predictions for {done.searched} queries to {args.output}")
    report_counts("search", f"{done.images} query images", done.skip_reasons.values(), f"wrote {done.count} predictions")
    return 0
