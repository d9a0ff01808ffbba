"""Deduplication on planted copies: ``copynce dedup``'s pair precision and recall on a collection whose copies
are known.

    python -m benchmarks.dedup --output outputs/dedup   # 200 train-split images + planted copies

The collection: the first ``--images`` images of the ``train`` split of ``../shared/data/imagenet-sample`` (never
the reference or distractor splits), plus copies made with the mini-DISC query recipe
(``CopyRecipe.minidisc_queries()``, the evaluation recipe) of ``--copied`` of them, two copies each for the
first ``--twice`` of those. A true pair is two images of the same original (the original and a copy, or two
copies). The embedded models run :func:`copynce_hf.retrieval.apps.dedup` once with its defaults (its own groups are
the first row); the groups are then formed again, as connected components, from the verified pairs at several
thresholds (the matcher's decision scores) and from the descriptor candidates alone (their raw cosines). Each row
reports the pair precision and recall of its groups (every two images sharing a group
count as a pair), of its edges (the verified pairs at or above the threshold, before the groups join them),
the largest group, and how many false edges join two copies of different originals.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
from PIL import Image

from copynce_hf.model_loading import load_model
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

from .minidisc import SHARED_DATA

MATCHER_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
DESCRIPTOR_THRESHOLDS = (0.5, 0.6, 0.7, 0.8)


def plant_copies(folder: Path, images: int, copied: int, twice: int, seed: int) -> list[list[str]]:
    """Write the collection into ``folder``; returns the true groups (each original with its copies)."""
    with (SHARED_DATA / "imagenet-sample-splits.csv").open(newline="") as handle:
        train = sorted(row["filename"] for row in csv.DictReader(handle) if row["split"] == "train")[:images]
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    recipe = CopyRecipe.minidisc_queries()
    chosen = sorted(rng.choice(len(train), size=copied, replace=False).tolist())
    truth = []
    for number, name in enumerate(train):
        image = Image.open(SHARED_DATA / "imagenet-sample" / name).convert("RGB")
        stem = Path(name).stem
        image.save(folder / f"{stem}.png")
        if number in chosen:
            truth.append([stem])
            for copy in range(2 if chosen.index(number) < twice else 1):
                recipe.apply(image, rng)[0].save(folder / f"{stem}_copy{copy}.png")
                truth[-1].append(f"{stem}_copy{copy}")
    return truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dedup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="folder for the collection, indexes and results")
    parser.add_argument("--images", type=int, default=200, help="train-split originals (default 200)")
    parser.add_argument("--copied", type=int, default=60, help="originals given copies (default 60)")
    parser.add_argument("--twice", type=int, default=20, help="of those, given two copies (default 20)")
    parser.add_argument("--candidates", type=int, default=10, help="neighbours verified per image (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    truth = plant_copies(args.output / "collection", args.images, args.copied, args.twice, args.seed)
    source = ImageFolderSource(args.output / "collection")
    descriptor = Descriptor("embedded-descriptor", *load_model(None, "descriptor"))
    start = time.perf_counter()
    result = dedup(source, descriptor, load_model(None, "matcher"), threshold=0.5,
                   config=DetectConfig(candidates=args.candidates), index_folder=args.output / "indexes")
    seconds = time.perf_counter() - start
    true_pairs = group_pairs(truth)
    candidate_recall = len({frozenset((p.query_id, p.reference_id)) for p in result.candidates} & true_pairs)
    write_predictions(args.output / "pairs.csv", result.pairs)
    write_predictions(args.output / "candidates.csv", result.candidates)
    copies = {image for group in truth for image in group[1:]}
    dedup_groups = [[image for image, _ in group] for group in result.groups]
    precision, recall = pair_precision_recall(dedup_groups, truth)
    rows = [{"stage": "copynce dedup (its groups)", "threshold": result.threshold, "groups": len(dedup_groups),
             "images_in_groups": sum(map(len, dedup_groups)), "largest_group": max(map(len, dedup_groups), default=0),
             "pair_precision": precision, "pair_recall": recall}]
    cosines = [Prediction(a, b, score) for (a, b), score in result.raw_candidate_scores.items()]
    for stage, pairs, thresholds in (("descriptor (cosine)", cosines, DESCRIPTOR_THRESHOLDS),
                                     ("matcher", result.pairs, MATCHER_THRESHOLDS)):
        for threshold in thresholds:
            edges = [(p.query_id, p.reference_id) for p in pairs if p.score >= threshold]
            groups = connected_groups(source.ids, edges)
            precision, recall = pair_precision_recall(groups, truth)
            true_edges = [edge for edge in edges if frozenset(edge) in true_pairs]
            false_edges = [edge for edge in edges if frozenset(edge) not in true_pairs]
            rows.append({"stage": stage, "threshold": threshold, "groups": len(groups),
                         "images_in_groups": sum(map(len, groups)), "largest_group": max(map(len, groups), default=0),
                         "pair_precision": precision, "pair_recall": recall,
                         "edge_precision": len(true_edges) / len(edges) if edges else 1.0,
                         "edge_recall": len(true_edges) / len(true_pairs),
                         "false_edges_between_copies": sum(a in copies and b in copies for a, b in false_edges),
                         "false_edges": len(false_edges)})
    summary = {"images": len(source), "originals": args.images, "true_groups": len(truth),
               "true_pairs": len(true_pairs), "candidate_pairs": len(result.candidates),
               "candidate_recall": candidate_recall / len(true_pairs), "seconds": seconds,
               "stage_seconds": result.seconds, "matcher_cost": result.matcher_cost, "rows": rows}
    (args.output / "dedup.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"{len(source)} images ({args.images} originals, {len(truth)} copied, {len(true_pairs)} true pairs); "
          f"{len(result.candidates)} candidate pairs holding {summary['candidate_recall']:.3f} of the true pairs; "
          f"{seconds:.0f} s")
    print("| stage | threshold | groups | images in groups | largest group | pair precision | pair recall | "
          "edge precision | edge recall | false edges (between two copies) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        edges = (f"{row['edge_precision']:.3f} | {row['edge_recall']:.3f} | {row['false_edges']} "
                 f"({row['false_edges_between_copies']})" if "edge_precision" in row else "- | - | -")
        print(f"| {row['stage']} | {row['threshold']} | {row['groups']} | {row['images_in_groups']} | "
              f"{row['largest_group']} | {row['pair_precision']:.3f} | {row['pair_recall']:.3f} | {edges} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
