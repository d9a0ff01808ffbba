"""Lone framed queries: is a copy found when its query's frame appears nowhere else?

    python -m benchmarks.templates.lone --output outputs/lone --seeds 0 1 2              # the reported draws
    python -m benchmarks.templates.lone --output outputs/lone-dev --dev --seeds 100 101  # development draws
    python -m benchmarks.templates.lone --output W --seeds 0 --run no-crops query_crops=False   # another system

A moderation query arrives alone: a phone screenshot of a photo, a poster, a print on a desk. Every query of a draw
is a photo put into a frame drawn for it alone (:mod:`.lone_designs`: designs no training draw and no other
benchmark uses, each frame drawn anew from the query's own generator), after one or two photometric edits of the
mini-DISC query recipe (brightness, contrast, saturation, sharpening, solarisation, posterisation, edge enhancement).
No frame is shared by two queries, so nothing in the collection can reveal a frame.

**Reported draws** (the default): the 300 ``reference`` photos of ``../shared/data`` are the references; the queries
are ``--copies-per-design`` framed copies of references per design (seven designs) and ``--distractors`` framed
``distractor`` photos (no original among the references); the ``photo backdrop`` design's backdrops are other
``distractor`` photos, each used once. **Development draws** (``--dev``): the same from the ``train`` split only,
the copies from its last 40 photos (which no shipped model trained on), the other references, distractors and
backdrops from the rest; only the designs of :data:`~.lone_designs.DEV_DESIGNS`. Settings are chosen on
development draws, never on the reported ones.

Each system (``--presets``: ``copynce detect`` with that preset and nothing else; ``--run NAME KEY=VALUE``: other
fields, as :mod:`.systems` takes them) runs on each draw: the share of copies whose reference comes first (overall and
per design), muAP, RP90, recall@1 over all queries, the seconds and CPU seconds per query. Written to ``--output``:
one folder per draw (``references/``, ``queries/``, ``ground_truth.csv``, ``truth.json``, ``runs/``) and
``lone.json`` (every row, written as each finishes); the Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from copynce_hf.pixtrace import CoordinateTable, CopyRecipe
from copynce_hf.pixtrace.steps import (
    BrightnessStep,
    ContrastStep,
    EdgeEnhanceStep,
    PosterizeStep,
    SaturationStep,
    SharpenStep,
    SolarizeStep,
    SomeOf,
)

from ..common import command_line, fresh_folder, limit_threads, machine_info, now, write_json
from ..minidisc import SHARED_DATA
from .lone_designs import DEV_DESIGNS, LONE_DESIGNS, draw_lone_frame
from .systems import detect_request, parse_options

logger = logging.getLogger("benchmarks.templates.lone")

__all__ = ["LonePlan", "photometric_recipe", "lone_photos", "build_lone_task", "found_first", "main"]

#: The held-out photos of the ``train`` split: its last 40 by name (no shipped model trained on them).
HELD_OUT = 40
#: The design of ``--plain`` draws: copies made with the whole mini-DISC query recipe, no frame (what layout crops
#: must not hurt).
PLAIN = "plain"


@dataclasses.dataclass(frozen=True)
class LonePlan:
    """One draw: framed copies per design, framed distractors, the designs, the references (``None``: every
    ``reference`` photo; development draws: 300 ``train`` photos)."""

    copies_per_design: int = 8
    distractors: int = 24
    designs: tuple[str, ...] = tuple(LONE_DESIGNS)
    references: int = 300


#: The development draws' plan: 30 copies of held-out photos among 300 train references.
DEV_PLAN = LonePlan(copies_per_design=6, distractors=15, designs=DEV_DESIGNS)


def photometric_recipe() -> CopyRecipe:
    """One or two photometric edits of :meth:`CopyRecipe.minidisc_queries` (same weights and ranges)."""
    weights = (("brightness", 1.0), ("contrast", 1.0), ("saturation", 1.0), ("sharpen", 0.5), ("solarize", 0.3),
               ("posterize", 0.5), ("edge_enhance", 0.5))
    steps = (("photometric", SomeOf(count=(1, 2), weights=weights)), ("brightness", BrightnessStep()),
             ("contrast", ContrastStep()), ("saturation", SaturationStep()), ("sharpen", SharpenStep()),
             ("solarize", SolarizeStep()), ("posterize", PosterizeStep()), ("edge_enhance", EdgeEnhanceStep()))
    return CopyRecipe(steps=steps, before_resize=("photometric",), shared_generator=True)


def lone_photos(data: Path, seed: int, plan: LonePlan, dev: bool) -> dict[str, list[Path]]:
    """The photos of one draw: ``references``, ``copied`` (the references copied, one per copy query),
    ``distractors`` and ``backdrops`` (one per ``photo backdrop`` query), drawn with ``seed``."""
    from copynce_hf.evaluation.minidisc import read_splits

    splits_csv = Path(data) / "imagenet-sample-splits.csv"
    if not splits_csv.is_file():
        raise FileNotFoundError(f"{splits_csv} not found: the shared benchmark data (imagenet-sample) is only present "
                                "in CI and dev sessions")
    splits = read_splits(splits_csv, Path(data) / "imagenet-sample")
    rng = np.random.default_rng([seed, 53])
    copies = plan.copies_per_design * len(plan.designs)
    backdrops = plan.copies_per_design + plan.distractors
    if dev:
        held_out, rest = splits["train"][-HELD_OUT:], splits["train"][:-HELD_OUT]
        rest = [rest[int(i)] for i in rng.permutation(len(rest))]
        copied = [held_out[int(i)] for i in rng.permutation(len(held_out))[:copies]]
        extra = plan.references - len(held_out)
        references, others = held_out + rest[:extra], rest[extra:]
        distractors, backdrop_photos = others[:plan.distractors], others[plan.distractors:][:backdrops]
    else:
        references = list(splits["reference"])[:plan.references]
        copied = [references[int(i)] for i in rng.permutation(len(references))[:copies]]
        others = [splits["distractor"][int(i)] for i in rng.permutation(len(splits["distractor"]))]
        distractors, backdrop_photos = others[:plan.distractors], others[plan.distractors:][:backdrops]
    if len(copied) < copies or len(backdrop_photos) < backdrops or len(distractors) < plan.distractors:
        raise ValueError(f"the splits are too small for {copies} copies, {plan.distractors} distractors and "
                         f"{backdrops} backdrops")
    return {"references": references, "copied": copied, "distractors": distractors, "backdrops": backdrop_photos}



def _frame_query(photo: Path, design: str, rng: np.random.Generator, backdrop: Path | None) -> tuple[Image.Image, dict]:
    """``photo`` edited by :func:`photometric_recipe` and put into a new frame of ``design`` (:data:`PLAIN`: edited by
    the whole mini-DISC query recipe, no frame): the query and its record (the edits, the design, the photo's box and
    its share of the query)."""
    image = Image.open(photo).convert("RGB")
    table = CoordinateTable.identity(image.height, image.width)
    edits = []
    recipe = CopyRecipe.minidisc_queries() if design == PLAIN else photometric_recipe()
    for edit in recipe.draw(rng, (image.height, image.width)):
        image, table = edit(image, table)
        edits.append(edit.to_dict())
    backdrop_image = Image.open(backdrop).convert("RGB") if backdrop is not None else None
    if design == PLAIN:
        framed, box = image, (0, 0, image.width, image.height)
    else:
        framed, box = draw_lone_frame(design, rng, image, backdrop_image)
    share = (box[2] - box[0]) * (box[3] - box[1]) / (framed.width * framed.height)
    return framed, {"photo": photo.stem, "design": design, "box": list(box), "photo_share": round(share, 4),
                    "size": [framed.height, framed.width], "edits": edits,
                    "backdrop": backdrop.stem if backdrop is not None else None}


def build_lone_task(folder: Path, data: Path, seed: int, plan: LonePlan, dev: bool) -> dict:
    """Write one draw into ``folder``: ``references/`` (ids ``R000``, ... shuffled), ``queries/`` (``Q000``, ...
    shuffled), ``ground_truth.csv`` and ``truth.json``; returns the truth."""
    photos = lone_photos(data, seed, plan, dev)
    references_folder, queries_folder = fresh_folder(folder / "references"), fresh_folder(folder / "queries")
    order = np.random.default_rng([seed, 54]).permutation(len(photos["references"]))
    reference_of = {}
    for number, position in enumerate(order):
        photo = photos["references"][int(position)]
        reference_of[photo] = f"R{number:03d}"
        Image.open(photo).convert("RGB").save(references_folder / f"R{number:03d}.png")
    sources = [(photo, plan.designs[n % len(plan.designs)]) for n, photo in enumerate(photos["copied"])]
    sources += [(photo, plan.designs[n % len(plan.designs)]) for n, photo in enumerate(photos["distractors"])]
    backdrops = iter(photos["backdrops"])
    queries = {}
    for number, position in enumerate(np.random.default_rng([seed, 55]).permutation(len(sources))):
        photo, design = sources[int(position)]
        backdrop = next(backdrops) if design == "photo backdrop" else None
        image, record = _frame_query(photo, design, np.random.default_rng([seed, 56, int(position)]), backdrop)
        query_id = f"Q{number:03d}"
        image.save(queries_folder / f"{query_id}.png")
        queries[query_id] = {**record, "reference": reference_of.get(photo) if int(position) < len(photos["copied"])
                             else None}
    with (folder / "ground_truth.csv").open("w", encoding="utf-8") as handle:
        handle.write("query_id,reference_id\n")
        handle.writelines(f"{q},{record['reference'] or ''}\n" for q, record in sorted(queries.items()))
    truth = {"seed": seed, "dev": dev, "plan": dataclasses.asdict(plan), "queries": queries,
             "references": {reference_id: photo.stem for photo, reference_id in sorted(reference_of.items(),
                                                                                        key=lambda item: item[1])}}
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


def found_first(predictions, truth: dict) -> dict:
    """Of the copy queries: how many rank their reference first, overall and per design."""
    best = {}
    for p in sorted(predictions, key=lambda p: -p.score):
        best.setdefault(p.query_id, p.reference_id)
    copies = {q: record for q, record in truth["queries"].items() if record["reference"]}
    per_design: dict[str, list[int]] = {}
    for query_id, record in copies.items():
        per_design.setdefault(record["design"], []).append(int(best.get(query_id) == record["reference"]))
    return {"copies": len(copies), "found_first": sum(map(sum, per_design.values())),
            "per_design": {design: [sum(found), len(found)] for design, found in sorted(per_design.items())}}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_system(folder: Path, truth: dict, name: str, options: dict) -> dict:
    """Run ``copynce detect`` (its library call) on one draw with ``options``: its row."""
    from copynce_hf.runs.detect import run_detect

    output = folder / "runs" / name
    if output.exists():
        shutil.rmtree(output)
    start, cpu = time.perf_counter(), _cpu_seconds()
    run = run_detect(detect_request(folder, "references", output, options))
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    queries, metrics = len(truth["queries"]), run.metrics
    found = found_first(run.result.predictions, truth)
    return {"system": name, "options": options, "seed": truth["seed"], "micro_ap": metrics["micro_ap"],
            "recall_at_p90": metrics["recall_at_p90"], "recall_at_rank1": metrics["recall_at_rank1"],
            "candidate_recall": metrics.get("candidate_recall"), **found,
            "share_found_first": found["found_first"] / max(1, found["copies"]), "seconds": seconds,
            "seconds_per_query": seconds / queries, "cpu_seconds_per_query": cpu / queries,
            "cropped_queries": len(run.result.crop_boxes), "load": os.getloadavg()[0]}


def table(rows: list[dict]) -> str:
    """The Markdown table of the rows (one per system and draw), then each system's mean and spread."""
    lines = ["| system | seed | found first | share | muAP | RP90 | recall@1 | cropped queries | s / query | CPU s / "
             "query |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['system']} | {row['seed']} | {row['found_first']}/{row['copies']} | "
                     f"{row['share_found_first']:.3f} | {row['micro_ap']:.4f} | {row['recall_at_p90']:.3f} | "
                     f"{row['recall_at_rank1']:.3f} | {row['cropped_queries']} | {row['seconds_per_query']:.2f} | "
                     f"{row['cpu_seconds_per_query']:.2f} |")
    for system in dict.fromkeys(row["system"] for row in rows):
        mine = [row for row in rows if row["system"] == system]
        share, muap = (np.array([row[key] for row in mine]) for key in ("share_found_first", "micro_ap"))
        designs: dict[str, list[int]] = {}
        for row in mine:
            for design, (found, count) in row["per_design"].items():
                designs.setdefault(design, [0, 0])
                designs[design] = [designs[design][0] + found, designs[design][1] + count]
        lines.append(f"\n{system}: share found first {share.mean():.3f} (min {share.min():.3f}, max {share.max():.3f}), "
                     f"muAP {muap.mean():.4f} (min {muap.min():.4f}, max {muap.max():.4f}) over {len(mine)} draws; "
                     "per design: " + ", ".join(f"{d} {f}/{c}" for d, (f, c) in designs.items()))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.templates.lone", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="folder of the draws, runs and results")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one draw per seed")
    parser.add_argument("--dev", action="store_true", help="development draws, from the train split only")
    parser.add_argument("--presets", nargs="*", default=["fast", "accurate"], help="copynce detect presets run")
    parser.add_argument("--run", action="append", nargs="+", default=[], metavar="NAME [KEY=VALUE]",
                        help="add a `copynce detect` system NAME with these fields (repeatable)")
    parser.add_argument("--copies-per-design", type=int, default=None, help="framed copies per design")
    parser.add_argument("--distractors", type=int, default=None, help="framed distractor queries")
    parser.add_argument("--plain", action="store_true",
                        help="plain copies (the mini-DISC query recipe, no frame) instead of framed ones")
    parser.add_argument("--build-only", action="store_true", help="write the draws and stop")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="folder holding imagenet-sample")
    parser.add_argument("--threads", type=int, default=None, help="torch/faiss threads (default: library default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if not (args.data / "imagenet-sample-splits.csv").is_file():
        print(f"skipped: {args.data / 'imagenet-sample-splits.csv'} not found (the shared benchmark data)",
              file=sys.stderr)
        return 0
    limit_threads(args.threads)
    plan = DEV_PLAN if args.dev else LonePlan()
    plan = dataclasses.replace(plan, designs=(PLAIN,)) if args.plain else plan
    plan = dataclasses.replace(plan, **{key: value for key, value in (("copies_per_design", args.copies_per_design),
                                                                      ("distractors", args.distractors)) if value is not None})
    systems = [(preset, {"preset": preset}) for preset in args.presets]
    systems += [(name, parse_options(items, "--run")) for name, *items in args.run]
    record = {"kind": "plain copies" if args.plain else "lone framed queries", "dev": args.dev, "plan": dataclasses.asdict(plan),
              "machine": machine_info(), "command": command_line(), "created": now(), "rows": []}
    for seed in args.seeds:
        folder = args.output / f"{'dev' if args.dev else 'draw'}{seed}"
        truth = build_lone_task(folder, args.data, seed, plan, args.dev)
        logger.info("draw %s: %d queries, %d references", seed, len(truth["queries"]), len(truth["references"]))
        for name, options in [] if args.build_only else systems:
            record["rows"].append(run_system(folder, truth, name, options))
            write_json(args.output / "lone.json", record)
            logger.info("%s", table(record["rows"][-1:]))
    if record["rows"]:
        print("\n" + table(record["rows"]))
    print(f"\nresults: {args.output / 'lone.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
