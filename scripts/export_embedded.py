"""Convert trained model folders into the embedded default models shipped with the package.

The benchmark runs (``python -m benchmarks.training.train``) write full-precision model folders into
``outputs/benchmarks/runs/<kind>-<variant>-seed<k>/``. This script turns the seed-0 CopyNCE
descriptor and matcher into the package's embedded defaults, and the seed-0 baseline descriptor
into the comparison checkpoint, with :func:`copynce_hf.export.export_model` (float16 weights, a
research-only card with the quality benchmark's numbers, checked before it replaces anything)::

    python scripts/export_embedded.py                                   # all three, default paths
    python scripts/export_embedded.py --parts descriptor matcher        # only the embedded models
    python scripts/export_embedded.py --parts descriptor \\
        --descriptor outputs/benchmarks/runs/descriptor-copynce-seed1 --descriptor-out /tmp/d
    python scripts/export_embedded.py --refresh     # re-save the shipped folders with the current code
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from copynce_hf.export import MAX_BYTES, Export, ExportReport, export_model, refresh_model
from copynce_hf.modeling.errors import CopyNCEError

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNS_DIR = REPO_ROOT / "outputs" / "benchmarks" / "runs"
RESULTS_DIR = REPO_ROOT / "outputs" / "benchmarks"
PRETRAINED_DIR = REPO_ROOT / "copynce_hf" / "pretrained"
BASELINE_DIR = REPO_ROOT / "benchmarks" / "checkpoints" / "baseline-descriptor"


def default_exports(runs_dir: Path = RUNS_DIR, seed: int = 0) -> dict[str, Export]:
    """The three conversions (descriptor, matcher, baseline descriptor) for the runs of ``seed``."""
    return {
        "descriptor": Export("descriptor", runs_dir / f"descriptor-copynce-seed{seed}", PRETRAINED_DIR / "descriptor",
                             "descriptor", f"descriptor-copynce-seed{seed}", "copynce-vit-tiny112-descriptor"),
        "matcher": Export("matcher", runs_dir / f"matcher-copynce-seed{seed}", PRETRAINED_DIR / "matcher",
                          "matcher", f"matcher-copynce-seed{seed}", "copynce-vit-tiny112-matcher",
                          candidates=f"descriptor-copynce-seed{seed}"),
        "baseline": Export("baseline", runs_dir / f"descriptor-baseline-seed{seed}", BASELINE_DIR,
                           "descriptor", f"descriptor-baseline-seed{seed}", "baseline-vit-tiny112-descriptor"),
    }


def build_parser() -> argparse.ArgumentParser:
    defaults = default_exports()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=sorted(defaults), default=["descriptor", "matcher", "baseline"],
                        help="which folders to export (default: all three)")
    for part, export in defaults.items():
        parser.add_argument(f"--{part}", type=Path, default=export.source, help=f"trained {part} folder "
                            f"(default: {export.source.relative_to(REPO_ROOT)})")
        parser.add_argument(f"--{part}-out", type=Path, default=export.target, help=f"where the {part} goes "
                            f"(default: {export.target.relative_to(REPO_ROOT)})")
        parser.add_argument(f"--{part}-system", default=export.system,
                            help=f"benchmark system whose numbers go in the card (default: {export.system})")
        parser.add_argument(f"--{part}-setting", action="append", default=[], metavar="ROW=VALUE",
                            help=f"a row of the {part} card's training settings that the run's files do not give "
                                 "(hardware, batch, training images) or give wrongly; replaces the row of that "
                                 "name (repeatable)")
    parser.add_argument("--matcher-candidates", default=None,
                        help="the descriptor system whose top-10 the matcher re-scores in its card's results "
                             "(default: descriptor-copynce-seed<k> of the matcher system's seed)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help="folder of the quality benchmark's <system>.json files")
    parser.add_argument("--max-mb", type=float, default=MAX_BYTES / 1e6, help="size limit per folder in MB (10^6)")
    parser.add_argument("--refresh", action="store_true",
                        help="re-save the existing target folders with the current code and layout (same weights "
                             "and card) instead of exporting training runs")
    return parser


def parse_settings(values: list[str], option: str) -> dict[str, str]:
    """``{row: value}`` of ``ROW=VALUE`` strings; a string without ``=`` or with an empty row is an error."""
    settings = {}
    for value in values:
        row, separator, text = value.partition("=")
        if not separator or not row.strip():
            raise CopyNCEError(f"{option} {value!r}: expected ROW=VALUE, e.g. \"hardware=one NVIDIA H200\"")
        settings[row.strip()] = text.strip()
    return settings


def main(argv: Sequence[str] | None = None) -> list[ExportReport]:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    reports = []
    for part in args.parts:
        export = dataclasses.replace(
            default_exports()[part],
            source=getattr(args, part),
            target=getattr(args, f"{part}_out"),
            system=getattr(args, f"{part}_system"),
            settings=parse_settings(getattr(args, f"{part}_setting"), f"--{part}-setting"),
        )
        if args.refresh:
            report = refresh_model(export.target, export.kind, max_bytes=int(args.max_mb * 1e6))
            print(report.summary())
            reports.append(report)
            continue
        if export.candidates is not None and args.matcher_candidates:
            export.candidates = args.matcher_candidates
        elif export.candidates is not None:  # a matcher re-scores the CopyNCE descriptor of its own seed
            seed = re.search(r"seed(\d+)$", export.system)
            export.candidates = f"descriptor-copynce-seed{seed.group(1)}" if seed else "a CopyNCE descriptor"
        report = export_model(export, results_dir=args.results_dir, max_bytes=int(args.max_mb * 1e6))
        print(report.summary())
        reports.append(report)
    return reports


if __name__ == "__main__":
    try:
        main()
    except CopyNCEError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
