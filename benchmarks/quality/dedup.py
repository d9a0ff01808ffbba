"""Deduplication on planted copies: ``copynce dedup``'s pair precision and recall on a collection whose copies
are known.

    python -m benchmarks.quality.dedup --output outputs/dedup   # 200 train-split images + planted copies

The collection: the first ``--images`` images of the ``train`` split of ``../shared/data/imagenet-sample`` (never
the reference or distractor splits), plus copies made with the mini-DISC query recipe
(``CopyRecipe.minidisc_queries()``, the evaluation recipe) of ``--copied`` of them, two copies each for the
first ``--twice`` of those. A true pair is two images of the same original (the original and a copy, or two
copies). The embedded models run :func:`copynce_hf.retrieval.deduplication.collection` once with its defaults (its own groups are
the first row); the groups are then formed again, as connected components, from the verified pairs at several
thresholds (the matcher's decision scores) and from the descriptor candidates alone (their raw cosines). Each row
reports the pair precision and recall of its groups (every two images sharing a group
count as a pair), of its edges (the verified pairs at or above the threshold, before the groups join them),
the largest group, and how many false edges join two copies of different originals.

With ``--self-calibrated`` the library's run takes the threshold ``copynce dedup`` self-calibrates when none is given
(:func:`copynce_hf.calibration.collection.self_calibrate`, on ``--self-calibration-sample`` images of the
collection, at ``--precision``) instead of 0.5, and the descriptor alone is self-calibrated too (as ``--matcher none``
would be): a row each at its threshold, the calibration lines and each pair kind's scores in ``dedup.json``. The
planted copies come from another recipe than the self-calibration's copies (``CopyRecipe.calibration_copies()``,
which no benchmark draws).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from PIL import Image

from copynce_hf.calibration.collection import self_calibrate
from copynce_hf.pixtrace import CopyRecipe
from copynce_hf.retrieval import (
    Descriptor,
    DetectConfig,
    ImageFolderSource,
    Prediction,
    connected_groups,
    dedup,
    group_pairs,
    pair_precision_recall,
    write_predictions,
)
from copynce_hf.runtime.loading import load_model

from ..minidisc import train_split_files

MATCHER_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
DESCRIPTOR_THRESHOLDS = (0.5, 0.6, 0.7, 0.8)


def plant_copies(folder: Path, images: int, copied: int, twice: int, seed: int) -> list[list[str]]:
    """Write the collection into ``folder``; returns the true groups (each original with its copies)."""
    train = train_split_files()[:images]
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    recipe = CopyRecipe.minidisc_queries()
    chosen = sorted(rng.choice(len(train), size=copied, replace=False).tolist())
    truth = []
    for number, name in enumerate(train):
        image = Image.open(name).convert("RGB")
        stem = name.stem
        image.save(folder / f"{stem}.png")
        if number in chosen:
            truth.append([stem])
            for copy in range(2 if chosen.index(number) < twice else 1):
                recipe.apply(image, rng)[0].save(folder / f"{stem}_copy{copy}.png")
                truth[-1].append(f"{stem}_copy{copy}")
    return truth


def group_row(stage: str, threshold: float, pairs, ids: list[str], truth: list[list[str]], copies: set[str]) -> dict:
    """The groups of ``pairs`` at or above ``threshold`` (connected components over ``ids``) against ``truth``: pair
    precision and recall of the groups and of their edges, the largest group, the false edges (between two copies)."""
    true_pairs = group_pairs(truth)
    edges = [(p.query_id, p.reference_id) for p in pairs if p.score >= threshold]
    groups = connected_groups(ids, edges)
    precision, recall = pair_precision_recall(groups, truth)
    true_edges = [edge for edge in edges if frozenset(edge) in true_pairs]
    false_edges = [edge for edge in edges if frozenset(edge) not in true_pairs]
    return {"stage": stage, "threshold": threshold, "groups": len(groups),
            "images_in_groups": sum(map(len, groups)), "largest_group": max(map(len, groups), default=0),
            "pair_precision": precision, "pair_recall": recall,
            "edge_precision": len(true_edges) / len(edges) if edges else 1.0,
            "edge_recall": len(true_edges) / len(true_pairs),
            "false_edges_between_copies": sum(a in copies and b in copies for a, b in false_edges),
            "false_edges": len(false_edges)}


def self_calibrations(args, source, descriptor, matcher, config) -> dict:
    """``{"matcher": ..., "descriptor": ...}``: the thresholds ``copynce dedup`` self-calibrates with the matcher and
    with the descriptor alone, each kept in ``OUTPUT/self_calibration_<stage>``."""
    return {stage: self_calibrate(source, descriptor, models, config, folder=args.output / f"self_calibration_{stage}",
                                  sample=args.self_calibration_sample, precision=args.precision, log=print)
            for stage, models in (("matcher", matcher), ("descriptor", None))}


def calibration_summary(calibration) -> dict:
    """A self-calibration's threshold, precision and recall on its synthetic pairs, counts, and each pair kind's
    score quartiles."""
    kinds = {}
    for pair in calibration.pairs:
        kinds.setdefault(pair.kind, []).append(pair.score)
    return {"origin": calibration.origin, "threshold": calibration.threshold, "counts": calibration.counts,
            "synthetic_precision": calibration.choice.precision, "synthetic_recall": calibration.choice.recall,
            "reached": calibration.choice.reached,
            "score_quartiles": {kind: [float(q) for q in np.quantile(scores, (0.0, 0.25, 0.5, 0.75, 1.0))]
                                for kind, scores in kinds.items()}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.dedup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for the collection, indexes and results")
    parser.add_argument("--images", type=int, default=200, help="train-split originals (default 200)")
    parser.add_argument("--copied", type=int, default=60, help="originals given copies (default 60)")
    parser.add_argument("--twice", type=int, default=20, help="of those, given two copies (default 20)")
    parser.add_argument("--candidates", type=int, default=10, help="neighbours verified per image (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--self-calibrated", action="store_true",
                        help="run at the self-calibrated threshold (copynce dedup's default) instead of 0.5")
    parser.add_argument("--self-calibration-sample", type=int, default=64, help="images sampled (default 64)")
    parser.add_argument("--precision", type=float, default=0.9, help="the self-calibration's target (default 0.9)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    truth = plant_copies(args.output / "collection", args.images, args.copied, args.twice, args.seed)
    source = ImageFolderSource(args.output / "collection")
    descriptor, matcher = Descriptor("embedded-descriptor", *load_model(None, "descriptor")), load_model(None, "matcher")
    config = DetectConfig(candidates=args.candidates)
    start = time.perf_counter()
    calibrations = self_calibrations(args, source, descriptor, matcher, config) if args.self_calibrated else {}
    calibration_seconds = time.perf_counter() - start
    threshold = calibrations["matcher"].threshold if calibrations else 0.5
    start = time.perf_counter()
    result = dedup(source, descriptor, matcher, threshold=threshold, config=config, index_folder=args.output / "indexes")
    seconds = time.perf_counter() - start
    true_pairs = group_pairs(truth)
    candidate_recall = len({frozenset((p.query_id, p.reference_id)) for p in result.candidates} & true_pairs)
    write_predictions(args.output / "pairs.csv", result.pairs)
    write_predictions(args.output / "candidates.csv", result.candidates)
    rows = result_rows(result, calibrations, threshold, source.ids, truth)
    summary = {"images": len(source), "originals": args.images, "true_groups": len(truth),
               "true_pairs": len(true_pairs), "candidate_pairs": len(result.candidates),
               "candidate_recall": candidate_recall / len(true_pairs), "seconds": seconds,
               "stage_seconds": result.seconds, "matcher_cost": result.matcher_cost, "rows": rows,
               "self_calibration": {stage: calibration_summary(calibration) for stage, calibration in calibrations.items()},
               "self_calibration_seconds": calibration_seconds if calibrations else None}
    (args.output / "dedup.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"{len(source)} images ({args.images} originals, {len(truth)} copied, {len(true_pairs)} true pairs); "
          f"{len(result.candidates)} candidate pairs holding {summary['candidate_recall']:.3f} of the true pairs; "
          f"{seconds:.0f} s")
    for stage, calibration in calibrations.items():
        print(f"{stage}: {calibration.origin}")
    print_rows(rows)
    return 0


def result_rows(result, calibrations: dict, threshold: float, ids: list[str], truth: list[list[str]]) -> list[dict]:
    """The table's rows: the library's own groups first, then the groups formed again from the descriptor's cosines
    and from the matcher's verified pairs at each fixed threshold, then at each self-calibrated one."""
    copies = {image for group in truth for image in group[1:]}
    dedup_groups = [[image for image, _ in group] for group in result.groups]
    precision, recall = pair_precision_recall(dedup_groups, truth)
    rows = [{"stage": "copynce dedup (its groups)", "threshold": result.threshold, "groups": len(dedup_groups),
             "images_in_groups": sum(map(len, dedup_groups)), "largest_group": max(map(len, dedup_groups), default=0),
             "pair_precision": precision, "pair_recall": recall}]
    cosines = [Prediction(a, b, score) for (a, b), score in result.raw_candidate_scores.items()]
    for stage, pairs, thresholds in (("descriptor (cosine)", cosines, DESCRIPTOR_THRESHOLDS),
                                     ("matcher", result.pairs, MATCHER_THRESHOLDS)):
        for fixed in thresholds:
            rows.append(group_row(stage, fixed, pairs, ids, truth, copies))
    for stage, pairs in (("descriptor (cosine)", result.candidates), ("matcher", result.pairs)):
        calibration = calibrations.get(stage.split()[0])
        if calibration is not None:
            rows.append(group_row(f"{stage}, self-calibrated", calibration.threshold, pairs, ids, truth, copies))
    if calibrations:  # the library's own groups, at the self-calibrated threshold, are those of that row
        assert dedup_groups == connected_groups(
            ids, [(p.query_id, p.reference_id) for p in result.pairs if p.score >= threshold])
    return rows


def print_rows(rows: list[dict]) -> None:
    """The rows as the Markdown table of BENCHMARKS.md."""
    print("| stage | threshold | groups | images in groups | largest group | pair precision | pair recall | "
          "edge precision | edge recall | false edges (between two copies) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        edges = (f"{row['edge_precision']:.3f} | {row['edge_recall']:.3f} | {row['false_edges']} "
                 f"({row['false_edges_between_copies']})" if "edge_precision" in row else "- | - | -")
        print(f"| {row['stage']} | {row['threshold']:.4g} | {row['groups']} | {row['images_in_groups']} | "
              f"{row['largest_group']} | {row['pair_precision']:.3f} | {row['pair_recall']:.3f} | {edges} |")


if __name__ == "__main__":
    raise SystemExit(main())
