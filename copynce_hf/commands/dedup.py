"""``copynce dedup``: every group of copies inside one folder or dataset (self-search, matcher verification,
collection normalisation, groups that do not chain), with a group gallery."""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, build, given_options
from ..retrieval.deduplication.settings import DedupSettings
from ..runs.dedup import DedupRequest
from ..runtime.embedding_declaration import OPTION_HELP
from . import options
from .console import progress_log

DESCRIPTION = (
    "Search every image of IMAGES (or of --dataset) among the others (itself left out) with the descriptor, verify "
    "each candidate pair once with the matcher, and join the pairs scored at or above the threshold into "
    "groups: a pair joins a group only if it clears the threshold against the group's first member (--grouping). "
    "By default both stages discount what many images of the collection share (a screenshot frame, a meme band: "
    "--collection-normalisation), and an image whose own content is a small part of it (a photo in a frame) is "
    "also searched and verified as that part, cut from its pixels (--content-crops), as is one whose layout shows a "
    "frame around a photo that no other image shares (--layout-crops). Writes OUTPUT/groups.csv (group_id,image_id,score_to_first,joined_by,"
    "joined_score,rule: each member's score with the group's first image and how it joined), OUTPUT/pairs.csv "
    "(every verified pair, its decision score, its raw score and the views scored), OUTPUT/scores.json (what the "
    "decision score is and where the threshold comes from), OUTPUT/content_crops.csv (the crops' boxes), "
    "OUTPUT/layout_crops.csv (the layout crops that decided a pair), "
    "OUTPUT/report.html (a gallery of the largest groups), OUTPUT/indexes, OUTPUT/tokens (the matcher's encoder "
    "tokens, each image encoded once) and OUTPUT/rescoring (reused by the next run: a run cut short resumes, from "
    "the last complete chunk of descriptors, tokens or matcher pairs). Under `accelerate launch` the processes "
    "share them."
)
EPILOG = (
    "Scores are copy probabilities with the matcher, cosines with --matcher none. Without --threshold or "
    "--calibration the threshold is self-calibrated on the collection: the dedup pipeline itself runs on "
    "--self-calibration-sample of its images, each with one planted PixTrace copy (plain, put into a template shared "
    "with other images, or two copies without the original); its verified pairs are labelled by where their images "
    "came from (two images of the collection that score as copies of each other count as neither) and the threshold "
    "is the lowest decision score reaching --precision (default 0.9) over them, unweighted. One line says the "
    "precision and recall it measured; where that recall is below 0.25 a warning says so and the run falls back to "
    "the matcher's threshold at precision 0.9 from its model card. The self-calibration resumes after Ctrl-C as the "
    "run does; OUTPUT/self_calibration/ keeps its pairs and scores, and report.html says where the threshold came "
    "from and what it took (with collection normalisation, thresholds apply to the normalised scores; a calibration file holds raw scores and needs --collection-normalisation off). Cost: a "
    "descriptor pass per image, the matcher's encoder once per image and its fusion blocks per candidate pair (twice "
    "where both orders are scored, --matcher-orders); the time of each pass: docs/detection.md, 'Local crops and what they cost'."
)


def register(commands) -> argparse.ArgumentParser:
    """Add ``dedup`` and its options to the ``copynce`` subcommands."""
    from ..runtime.loading import DEFAULT_DESCRIPTOR

    p = commands.add_parser("dedup", help="find every group of copies inside one folder or dataset",
                            description=DESCRIPTION, epilog=EPILOG)
    add_options(p, DedupRequest, ("images",))
    options.add_dataset_input(p, "dataset", "images", settings=DedupRequest)
    add_options(p, DedupRequest, ("output",))
    p.add_argument("--model", help=f"descriptor model folder or Hub id, {OPTION_HELP} (default: {DEFAULT_DESCRIPTOR})")
    options.add_matcher(p)
    add_options(p, DedupRequest, ("threshold",))
    options.add_calibration(p, DedupRequest)
    add_options(p, DedupRequest, ("self_calibration_sample",))
    options.add_dedup_options(p)
    add_options(p, DedupRequest, ("gallery",))
    options.add_chunk_size(p)
    options.add_whitening(p)
    options.add_model_loading(p)
    options.add_runtime(p)
    options.add_image_input(p)
    p.set_defaults(handler=run, resumes=kept_work)
    return p


def kept_work(args) -> str:
    """What a run stopped by Ctrl-C keeps for the next (:func:`~copynce_hf.commands.console.interrupted_line`)."""
    return (f"the indexes, matcher tokens and scored chunks kept in {args.output} (the self-calibration's in its "
            "self_calibration folder)")


def request_of(args):
    """The :class:`~copynce_hf.runs.dedup.DedupRequest` of a ``copynce dedup`` command line: the models, the
    ``dedup`` preset with the pipeline settings given over it, and its own settings."""
    from ..runs.settings import PipelineModels

    models = PipelineModels([args.model], args.matcher, args.runtime, "--model")
    pipeline = options.pipeline_settings(args, models, "dedup", options.DEDUP_SETTINGS)
    return build(DedupRequest, given_options(DedupRequest, args), pipeline=pipeline,
                 settings=build(DedupSettings, given_options(DedupSettings, args)), input=options.image_input(args),
                 progress=not args.quiet, log=progress_log("dedup", args.quiet))


def run(args) -> int:
    import time
    from pathlib import Path

    from ..runs.folders import write_dedup_folder
    from .console import report_counts

    start = time.perf_counter()
    found = write_dedup_folder(request_of(args))
    if found is None:  # another process of `accelerate launch`: the main one writes
        return 0
    output, result = Path(args.output), found.result
    print(f"wrote {len(result.groups)} groups of copies ({found.rows} images) to {output / 'groups.csv'}, "
          f"{len(result.pairs)} verified pairs to {output / 'pairs.csv'} and the group gallery to {found.report} "
          f"({time.perf_counter() - start:.0f} s)")
    print(found.meaning.line())
    report_counts("dedup", f"{len(found.source)} images", result.skipped.values(), f"wrote {found.rows} group rows")
    return 0
