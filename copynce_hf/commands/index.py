"""``copynce index``: embed a folder (or a dataset) of reference images and build a faiss index, resumably."""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, build, given_options
from ..runs.index import IndexRequest
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
    add_options(p, IndexRequest, ("references",))
    options.add_dataset_input(p, "dataset", "reference images", streaming=True, settings=IndexRequest)
    add_options(p, IndexRequest, ("chunk_size", "model", "output", "kind", "nlist", "pq_m", "descriptor_lce"))
    options.add_whitening(p, IndexRequest)
    options.add_search_knobs(p, IndexRequest)
    options.add_model_loading(p, IndexRequest)
    options.add_runtime(p, IndexRequest)
    options.add_image_input(p)
    p.set_defaults(handler=run, resumes=kept_work)
    return p


def kept_work(args) -> str:
    """What a run stopped by Ctrl-C keeps for the next (:func:`~copynce_hf.commands.console.interrupted_line`)."""
    from ..retrieval.descriptors.chunked_extraction import work_folder_of

    return f"the complete chunks of descriptors kept in {work_folder_of(args.output)}"


def run(args) -> int:
    from ..runs.index import build_index
    from .console import report_counts

    request = build(IndexRequest, given_options(IndexRequest, args), input=options.image_input(args),
                    progress=not args.quiet, log=print)
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
