"""``copynce detect``: the whole pipeline in one go (descriptors, merged candidates, matcher verification),
with evaluation against a ground truth, calibrated decisions and a match gallery."""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, build, given_options
from ..retrieval.presets import DEFAULT_CANDIDATES
from ..runs.detect import DetectRequest
from . import options
from .console import progress_log

DESCRIPTION = (
    "Search the references of every query image with one or more descriptors (optionally with "
    "local crops ensembling and score normalisation), merge their candidates, verify them with the matcher "
    "(optionally with local crops ensembling), search and verify again each query's own content cut from its frame "
    "where it is a small part of the query (--query-crops: a copy pasted into a screenshot or a meme) and write "
    "OUTPUT/predictions.csv (query_id,reference_id,score), OUTPUT/report.html (a gallery of the top and borderline "
    "matches with heatmaps), OUTPUT/query_crops.csv (the boxes of the query crops) and, with --ground-truth, "
    "OUTPUT/metrics.json; OUTPUT/scores.json says what the scores are and which threshold, if any, decides (without "
    "--calibration none does: the scores rank pairs; `copynce calibrate` makes a threshold for a precision). "
    "Reference indexes are kept in OUTPUT/indexes and reused by the next run, the matcher's "
    "scores in OUTPUT/rescoring (chunks of --chunk-size pairs: a run cut short resumes)."
)
EPILOG = (
    f"Presets (explicit options override them): fast (the default; whole-image descriptors, {DEFAULT_CANDIDATES} "
    "candidates, 1 matcher pass per candidate, content tokens, query crops, auxiliary ranks 0-9) suits a CPU. "
    "accurate (--descriptor-lce matcher-views --candidates 2 "
    "--matcher-lce paper, auxiliary ranks 0-9) scores more views of fewer candidates. paper (the authors' inference: "
    "--descriptor-lce authors, "
    "--candidates 400, --matcher-lce paper, --k 10, --k-start 1 --k-end 4) suits a GPU: it "
    "costs about 45 descriptor passes + 26 encoder passes + 35 fusion passes per merged candidate per query, "
    "and 9 descriptor passes per reference. Matcher passes: --matcher-lce none: 1 fusion per candidate; paper: "
    "26 query views encoded once, then 35 "
    "fusions per candidate; all: 260 per candidate. What they cost on a CPU: docs/detection.md ('Presets', "
    "'Local crops and what they cost') and BENCHMARKS.md."
)


def register(commands) -> argparse.ArgumentParser:
    """Add ``detect`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser(
        "detect", help="the whole pipeline: find which reference each query copies, evaluate, draw a match gallery",
        description=DESCRIPTION, epilog=EPILOG,
    )
    add_options(p, DetectRequest, ("queries", "references", "output"))
    options.add_pipeline_options(p)
    options.add_dataset_input(p, "query_dataset", "query images", settings=DetectRequest)
    add_options(p, DetectRequest, ("ground_truth", "gallery"))
    options.add_chunk_size(p)
    options.add_calibration(p, DetectRequest)
    options.add_whitening(p)
    options.add_model_loading(p)
    options.add_runtime(p)
    options.add_image_input(p)
    p.set_defaults(handler=run, resumes=kept_work)
    return p


def kept_work(args) -> str:
    """What a run stopped by Ctrl-C keeps for the next (:func:`~copynce_hf.commands.console.interrupted_line`)."""
    return f"the indexes, matcher tokens and scored chunks kept in {args.output}"


def request_of(args):
    """The :class:`~copynce_hf.runs.detect.DetectRequest` of a ``copynce detect`` command line."""
    return build(DetectRequest, given_options(DetectRequest, args), pipeline=options.pipeline_settings(args),
                 images=options.image_input(args), progress=not args.quiet, log=progress_log("detect", args.quiet))


def run(args) -> int:
    import time
    from pathlib import Path

    from ..runs.folders import write_detect_folder
    from .console import report_counts

    start = time.perf_counter()
    found = write_detect_folder(request_of(args))
    if found is None:  # another process of `accelerate launch`: the main one writes
        return 0
    output, result, decision = Path(found.request.output), found.result, found.inputs.decision
    queries = len({p.query_id for p in result.predictions})
    print(f"wrote {found.count} predictions for {queries} queries to {output / 'predictions.csv'}, the match gallery "
          f"to {found.report}" + (f" and {output / 'metrics.json'}" if found.metrics else "")
          + f" ({time.perf_counter() - start:.0f} s)")
    print(found.meaning.line())
    if decision is not None:
        print(f"{len(found.copies)} pairs at or above the threshold {decision.threshold:.4f} (precision "
              f"{decision.point.precision:g} by {args.calibration}) written to {output / 'copies.csv'}")
    if found.metrics:
        metrics, recall = found.metrics, found.metrics["candidate_recall"]
        print(f"muAP {metrics['micro_ap']:.4f}  RP90 {metrics['recall_at_p90']:.4f}  recall@1 "
              f"{metrics['recall_at_rank1']:.4f}  candidate recall " + ("-" if recall is None else f"{recall:.4f}"))
    unscored = len(result.skipped) - len(result.skipped_queries)
    report_counts("detect", f"{len(found.inputs.queries)} query and {len(found.inputs.references)} reference images",
                  [*result.skipped_queries.values(), *result.skipped_references.values()],
                  f"wrote {found.count} predictions" + (f" ({unscored} candidate pairs unscored)" if unscored else ""))
    return 0
