"""``copynce index``: embed a folder (or a dataset) of reference images and build a faiss index, resumably."""

from __future__ import annotations

import argparse

from ..configuration.fields import positive_int
from ..retrieval.descriptors.views import DESCRIPTOR_LCE_MODES
from ..retrieval.presets import DEFAULT_INDEX_CHUNK_SIZE
from ..runtime.loading import DEFAULT_DESCRIPTOR
from . import options

DESCRIPTION = (
    "Embed every image of REFERENCES (file name without extension = id) or of --dataset with "
    "the descriptor and write OUTPUT/descriptors.safetensors, OUTPUT/index.faiss and OUTPUT/index.json. "
    "Descriptors are written in chunks to .OUTPUT.chunks/ beside OUTPUT (removed at the end): the same "
    "command after an interruption resumes from the last complete chunk."
)


def register(commands) -> argparse.ArgumentParser:
    """Add ``index`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("index", help="embed a folder of reference images and build a faiss index",
                            description=DESCRIPTION)
    p.add_argument("references", nargs="?", help="folder of reference images (or --dataset)")
    options.add_dataset_input(p, "--dataset", "reference images", streaming=True)
    p.add_argument("--chunk-size", type=positive_int, default=DEFAULT_INDEX_CHUNK_SIZE, metavar="N",
                   help=f"images per chunk written (default {DEFAULT_INDEX_CHUNK_SIZE}); a resumed run keeps its "
                   "chunk size")
    p.add_argument("--model", help=f"descriptor model folder or Hub id (default: {DEFAULT_DESCRIPTOR})")
    p.add_argument("--output", required=True, help="index folder to write")
    p.add_argument(
        "--index-type", choices=("flat", "hnsw", "ivfpq"), default="flat",
        help="flat: exact inner product (default); hnsw: approximate graph search for millions of references; "
        "ivfpq: compressed inverted lists with exact re-ranking, for memory-limited collections",
    )
    p.add_argument("--nlist", type=positive_int, help="IVF-PQ: number of inverted lists (default 4*sqrt(N))")
    p.add_argument("--pq-m", type=positive_int, help="IVF-PQ: sub-quantisers (default D/2)")
    p.add_argument("--descriptor-lce", choices=DESCRIPTOR_LCE_MODES, default="none",
                   help="index views: none (whole images), matcher-views (10 views per reference: whole, five "
                   "one-third crops, four quarters) or authors (9 views: whole, five crops, three rotations) "
                   "(default none)")
    options.add_whitening(p)
    options.add_search_knobs(p)
    options.add_model_loading(p)
    options.add_runtime(p)
    options.add_image_input(p)
    p.set_defaults(handler=run, resumes=kept_work)
    return p


def kept_work(args) -> str:
    """What a run stopped by Ctrl-C keeps for the next (:func:`~copynce_hf.commands.console.interrupted_line`)."""
    from ..retrieval.descriptors.chunked_extraction import work_folder_of

    return f"the complete chunks of descriptors kept in {work_folder_of(args.output)}"


def run(args) -> int:
    from ..runs.index import IndexRequest, build_index
    from .console import report_counts

    request = IndexRequest(
        args.output, references=args.references, dataset=args.dataset, input=options.image_input(args),
        model=args.model, runtime=args.runtime, kind=args.index_type, nlist=args.nlist, pq_m=args.pq_m,
        ef_search=args.ef_search, nprobe=args.nprobe, k_factor=args.k_factor, descriptor_lce=args.descriptor_lce,
        whiten_from=args.whiten_from, whiten_dim=args.whiten_dim, chunk_size=args.chunk_size,
        batch_size=args.batch_size, num_workers=args.num_workers, progress=not args.quiet, log=print,
    )
    built = build_index(request)
    if built is None:  # another process of `accelerate launch`: the main one writes
        return 0
    views = f", {built.views.num_reference_views} views each" if built.views.name != "none" else ""
    whitened = (f", whitened to {built.whitening.dim}-d from {built.whitening.samples} sample views of "
                f"{args.whiten_from}" if built.whitening is not None else "")
    print(f"indexed {built.images - len(built.skip_reasons)} references{views} ({built.dim}-d{whitened}, "
          f"{built.kind}) into {args.output}")
    report_counts("index", f"{built.images} images", built.skip_reasons.values(), f"wrote {built.count} descriptors")
    return 0
