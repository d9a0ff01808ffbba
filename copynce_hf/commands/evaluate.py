"""``copynce evaluate``: score predictions CSVs against a ground truth (muAP, RP90, recall@1/10, mAP)."""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Compute the DISC21 metrics of one or more predictions CSVs, print them as a table and "
    "write OUTPUT/metrics.json ({file stem: metrics}) and OUTPUT/pr_curve.png."
)


def register(commands) -> argparse.ArgumentParser:
    """Add ``evaluate`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser(
        "evaluate", help="score predictions against a ground truth (muAP, RP90, recall@1/10, mAP)",
        description=DESCRIPTION,
    )
    p.add_argument("predictions", nargs="+", help="predictions CSV file(s) (query_id,reference_id,score)")
    p.add_argument("--ground-truth", required=True, help="ground-truth CSV with the header query_id,reference_id")
    p.add_argument("--output", required=True, help="folder for metrics.json and pr_curve.png")
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..runs.evaluate import evaluate_files, metrics_table
    from .console import report_counts

    evaluation = evaluate_files(args.predictions, args.ground_truth, args.output)
    print(metrics_table(evaluation.results))
    print(f"wrote {evaluation.metrics_file} and {evaluation.curve_file}")
    report_counts("evaluate", f"{evaluation.predictions} predictions in {len(evaluation.results)} file(s)", [],
                  "wrote 2 files")
    return 0
