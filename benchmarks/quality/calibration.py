"""Is calibration honest? Thresholds calibrated on mini-DISC's references alone, measured on its real queries.

    python -m benchmarks.quality.calibration --layout outputs/calibration     # folders, then the two commands it prints:
    copynce calibrate outputs/calibration/references --distractors outputs/calibration/distractors \\
        --aux outputs/calibration/auxiliary --preset fast --candidates 10 --output outputs/calibration/calibration.json
    python -m benchmarks.quality.calibration --measure outputs/calibration   # the table of BENCHMARKS.md

The layout: ``references/`` (mini-DISC's 300 references), ``queries/`` and ``ground_truth.csv`` (its 250
queries), ``auxiliary/`` (the first 500 ``train`` images, for score normalisation) and ``distractors/``
(the last 100 ``train`` images: calibration's distractor sources; never mini-DISC's distractor images,
and not in ``auxiliary/``, so that score normalisation does not meet a distractor's own original).
``copynce calibrate`` sees no ground truth: it copies a sample of the references and the distractor
images with the calibration's own recipe (``CopyRecipe.calibration_copies()``; mini-DISC's queries come from
another recipe, ``CopyRecipe.minidisc_queries()``). ``--measure`` runs the same pipeline (embedded models, the
calibration's preset) on mini-DISC's queries once, and reports per stage, for each calibrated threshold, the
precision and recall it gives on mini-DISC's ground truth, and the threshold mini-DISC's own ground truth puts at
90 % precision (the figure of the model cards). It writes ``<folder>/honesty.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.minidisc import MiniDiscConfig, build_minidisc
from copynce_hf.evaluation.minidisc import _link, read_splits

#: ``train`` images used for score normalisation; the rest of the split are calibration's distractor sources.
AUXILIARY_IMAGES = 500


def layout(folder: Path) -> dict[str, Path]:
    """Write the folders described in the module docstring; returns name -> path."""
    task = build_minidisc()
    paths = task.export(folder, auxiliary_split=None)
    config = MiniDiscConfig()
    train = read_splits(config.splits_csv, config.image_folder)["train"]
    for name, files in (("auxiliary", train[:AUXILIARY_IMAGES]), ("distractors", train[AUXILIARY_IMAGES:])):
        paths[name] = folder / name
        for path in files:
            _link(path, paths[name] / path.name)
    return paths


def measure(folder: Path, threads: int = 1) -> dict:
    """Run the calibrated pipeline on mini-DISC's queries and compare each threshold with what it gives."""
    import torch

    from copynce_hf.calibration.thresholds import (
        Calibration,
        decision_rates,
        model_identity,
        operating_points,
        pipeline_identity,
    )
    from copynce_hf.metrics.copy_detection.formulas import read_ground_truth_csv
    from copynce_hf.retrieval import Descriptor, DetectConfig, ImageFolderSource, detect, top_per_query
    from copynce_hf.runtime.loading import DEFAULT_DESCRIPTOR, load_model

    torch.set_num_threads(threads)
    calibration = Calibration.load(folder / "calibration.json")
    preset = calibration.pipeline["preset"]
    recorded = calibration.provenance.get("detect_config", {})  # the calibration's own settings (--candidates, --k)
    config = DetectConfig.from_preset(preset, **{name: recorded[name] for name in ("candidates", "k") if name in recorded})
    calibration.check_pipeline(pipeline_identity([model_identity(None, "descriptor")], model_identity(None, "matcher"),
                                                 preset, config, score_normalisation=True))
    ground_truth = read_ground_truth_csv(folder / "ground_truth.csv")
    num_copies = sum(1 for refs in ground_truth.values() if refs)
    descriptor = Descriptor("embedded-descriptor", *load_model(None, "descriptor"), source=str(DEFAULT_DESCRIPTOR))
    result = detect(ImageFolderSource(folder / "queries"), ImageFolderSource(folder / "references"), [descriptor],
                    load_model(None, "matcher"), ImageFolderSource(folder / "auxiliary"), config,
                    index_folder=folder / "indexes")
    stages = {"descriptor": top_per_query(result.candidates, config.k), "matcher": result.predictions}
    rows, on_minidisc = [], {}
    for stage, predictions in stages.items():
        is_copy = [p.reference_id in ground_truth.get(p.query_id, ()) for p in predictions]
        scores = [p.score for p in predictions]
        for point in calibration.stages[stage]:
            precision, recall = decision_rates(is_copy, scores, num_copies, point.threshold)
            rows.append({"stage": stage, "target_precision": point.precision, "threshold": point.threshold,
                         "expected_recall": point.recall, "measured_precision": precision, "measured_recall": recall})
        on_minidisc[stage] = [vars(p) for p in operating_points(is_copy, scores, num_copies)]
    report = {"calibration": str(folder / "calibration.json"), "preset": preset, "rows": rows,
              "minidisc_ground_truth_thresholds": on_minidisc, "seconds": result.seconds,
              "calibration_counts": calibration.provenance.get("counts"), "calibration_seed": calibration.provenance.get("seed"),
              "calibration_recipe": calibration.provenance.get("recipe_name")}
    (folder / "honesty.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def table(report: dict) -> str:
    """The markdown table of BENCHMARKS.md."""
    def number(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = ["| stage | target precision | threshold | expected recall | measured precision | measured recall |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in report["rows"]:
        lines.append(f"| {row['stage']} | {row['target_precision']:g} | {number(row['threshold'], 4)} | "
                     f"{number(row['expected_recall'])} | {number(row['measured_precision'])} | "
                     f"{number(row['measured_recall'])} |")
    lines.append("")
    lines.append("mini-DISC's own ground truth, threshold at precision 0.9: " + ", ".join(
        f"{stage} {number(points[0]['threshold'], 4)} (recall {number(points[0]['recall'])})"
        for stage, points in report["minidisc_ground_truth_thresholds"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.calibration", description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--layout", type=Path, metavar="FOLDER", help="write the folders and print the commands")
    action.add_argument("--measure", type=Path, metavar="FOLDER", help="measure FOLDER/calibration.json on mini-DISC")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if args.layout:
        paths = layout(args.layout)
        print(f"copynce calibrate {paths['references']} --distractors {paths['distractors']} --aux {paths['auxiliary']} "
              f"--preset fast --candidates 10 --output {args.layout / 'calibration.json'}")
        print(f"python -m benchmarks.quality.calibration --measure {args.layout}")
        return 0
    print(table(measure(args.measure, args.threads)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
