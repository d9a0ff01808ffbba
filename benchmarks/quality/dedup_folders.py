"""``copynce dedup`` with every default on folders shaped like a user's: photos, some of them with a planted copy.

    python -m benchmarks.quality.dedup_folders --pool dev --draws 1 2 3         # design: held-out train photos
    python -m benchmarks.quality.dedup_folders --pool evaluation --draws 1 2 3  # the reported draws, 55 images
    python -m benchmarks.quality.dedup_folders --pool evaluation --draws 1 --photos 140 --copies 60  # 200 images

A folder (:func:`build_folder`, seeded, reused when its ``truth.json`` is there): ``--photos`` photos (40), of which
``--copies`` (15) get one copy each, made with :func:`everyday_recipe`: a recipe of this benchmark only, not the one
``copynce dedup``'s self-calibration plants (``CopyRecipe.calibration_copies()`` and its templates), so that the
self-calibration is measured on copies it never saw. The photos come from ``../shared/data/imagenet-sample``:

* ``--pool dev``: the last 40 of the ``train`` split, the photos no embedded model trained on (the training runs'
  held-out images); every draw holds all of them, the draw's seed chooses the copied ones and their edits. The
  rule of the self-calibration was designed on these draws only;
* ``--pool evaluation``: the ``reference`` and ``distractor`` splits (400 photos), in one seeded order; draw ``d``
  of a size takes the ``--photos`` photos after those of draws ``1..d-1`` of that size (the draws share no photo),
  the 200-image draws starting after the first 200 photos (those of the 55-image draws 1-5). Evaluated on only.

Each folder runs ``copynce dedup FOLDER --output OUT`` (:func:`~copynce_hf.runs.dedup.run_dedup`, the embedded
models, no option given). Measured: the pair precision and recall of ``groups.csv`` against the planted pairs (every
two images sharing a group are a pair), the pair AP of ``pairs.csv``'s decision scores over every true pair (one
never verified counts as missed), the threshold and the line saying where it came from (what the self-calibration
measured), the seconds of each stage of the report's table and of the whole run (wall and CPU seconds of the
process, with the 1-minute load average at its end: on a shared machine the CPU seconds are the figure to compare).
Written to
``<output-dir>/dedup_folders/<pool>-<photos>+<copies>.json`` (one entry per draw) and a Markdown table on stdout
with the mean and the spread (population standard deviation) of the draws.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from copynce_hf.pixtrace import CopyRecipe
from copynce_hf.pixtrace.steps import (
    BlurStep,
    BrightnessStep,
    ContrastStep,
    GrayscaleStep,
    HorizontalFlipStep,
    JpegStep,
    OverlayEmojiStep,
    OverlayTextStep,
    PadStep,
    RandomResizedCropStep,
    RotateStep,
    SaturationStep,
    SomeOf,
)

from ..common import DEFAULT_OUTPUT_DIR, command_line, machine_info, now, read_json, write_json
from ..minidisc import SHARED_DATA

#: The photos of the dev pool: the last 40 of the train split, held out of every training run.
HELD_OUT = 40
#: The evaluation pool's photos that the 55-image draws take from (draws 1-5); larger draws start after them.
SMALL_DRAWS_PHOTOS = 200


def everyday_recipe() -> CopyRecipe:
    """The copies of this benchmark: the edits of a photo passed around (one or two of a crop keeping 35-85 % of the
    area, a mirror, a tilt of 3-15 degrees, a border of 3-15 %, a caption, an emoji; then one or two of brightness,
    contrast, saturation, greyscale, JPEG at quality 25-75, a slight blur), at most 640 pixels. Fixed before any draw
    was measured; ``copynce dedup``'s self-calibration never draws it (it plants ``calibration_copies`` copies)."""
    structural = (("crop", 2.0), ("mirror", 1.0), ("tilt", 0.7), ("border", 0.7), ("caption", 1.0), ("emoji", 0.7))
    photometric = (("brightness", 1.0), ("contrast", 1.0), ("saturation", 1.0), ("greyscale", 0.5), ("jpeg", 1.0),
                   ("blur", 0.5))
    steps = (
        ("structural", SomeOf(count=(1, 2), weights=structural, in_order=True)),
        ("photometric", SomeOf(count=(1, 2), weights=photometric)),
        ("crop", RandomResizedCropStep(p=1.0, scale=(0.35, 0.85), ratio=(0.6, 1.6))),
        ("mirror", HorizontalFlipStep(p=1.0)),
        ("tilt", RotateStep(degrees=(3.0, 15.0))),
        ("border", PadStep(p=1.0, fraction=(0.03, 0.15))),
        ("caption", OverlayTextStep(p=1.0, length=(4, 16), font_size=(0.06, 0.14))),
        ("emoji", OverlayEmojiStep(p=1.0, size=(0.1, 0.3))),
        ("brightness", BrightnessStep(factor=(0.6, 1.5))),
        ("contrast", ContrastStep(factor=(0.6, 1.6))),
        ("saturation", SaturationStep(factor=(0.3, 1.8))),
        ("greyscale", GrayscaleStep(p=1.0)),
        ("jpeg", JpegStep(p=1.0, quality=(25, 75))),
        ("blur", BlurStep(p=1.0, radius=(0.001, 0.004))),
    )
    return CopyRecipe(steps=steps, before_resize=("structural", "photometric"), shared_generator=True, max_side=640)


def pool_photos(pool: str, data: Path = SHARED_DATA) -> list[Path]:
    """The photos of ``pool`` (see the module): ``dev`` the held-out train photos, ``evaluation`` the reference and
    distractor photos in their seeded order."""
    from copynce_hf.evaluation.minidisc import read_splits

    splits_csv = Path(data) / "imagenet-sample-splits.csv"
    if not splits_csv.is_file():
        raise SystemExit(f"{splits_csv} not found: the shared benchmark data (imagenet-sample) is only present in CI "
                         "and dev sessions")
    splits = read_splits(splits_csv, Path(data) / "imagenet-sample")
    if pool == "dev":
        return splits["train"][-HELD_OUT:]
    photos = splits["reference"] + splits["distractor"]
    return [photos[i] for i in np.random.default_rng(20261128).permutation(len(photos))]


def draw_photos(pool: str, draw: int, photos: int, data: Path = SHARED_DATA) -> list[Path]:
    """The photos of draw ``draw`` (from 1) of ``photos`` photos (see the module)."""
    found = pool_photos(pool, data)
    if pool == "dev":
        if photos > len(found):
            raise SystemExit(f"--pool dev holds {len(found)} photos, not {photos}")
        return found[:photos]
    start = (draw - 1) * photos + (0 if photos * 5 <= SMALL_DRAWS_PHOTOS else SMALL_DRAWS_PHOTOS)
    if start + photos > len(found):
        raise SystemExit(f"draw {draw} of {photos} photos runs past the {len(found)} evaluation photos")
    return found[start:start + photos]


def build_folder(folder: Path, pool: str, draw: int, photos: int, copies: int, data: Path = SHARED_DATA) -> dict:
    """Write draw ``draw``'s folder into ``folder/collection`` (photos as PNG, ``<photo>_copy.png`` beside each copied
    one) and its ``truth.json``; reused when ``truth.json`` is there. Returns the truth: the groups (a photo and its
    copy), the photos, the edits of each copy."""
    truth_file = folder / "truth.json"
    if truth_file.is_file():
        return read_json(truth_file)
    chosen = draw_photos(pool, draw, photos, data)
    if not 0 < copies <= len(chosen):
        raise SystemExit(f"--copies {copies} must be between 1 and --photos {len(chosen)}")
    shutil.rmtree(folder, ignore_errors=True)
    collection = folder / "collection"
    collection.mkdir(parents=True)
    rng = np.random.default_rng([draw, copies, 7])
    copied = sorted(int(i) for i in rng.choice(len(chosen), size=copies, replace=False))
    recipe, groups, edits = everyday_recipe(), [], {}
    for number, path in enumerate(chosen):
        image = Image.open(path).convert("RGB")
        image.save(collection / f"{path.stem}.png")
        if number in copied:
            edited, _, made = recipe.apply(image, np.random.default_rng([draw, number, 11]))
            edited.save(collection / f"{path.stem}_copy.png")
            groups.append([path.stem, f"{path.stem}_copy"])
            edits[f"{path.stem}_copy"] = made
    truth = {"pool": pool, "draw": draw, "photos": [path.name for path in chosen], "groups": groups,
             "images": len(chosen) + copies, "true_pairs": copies, "recipe": "benchmarks.quality.dedup_folders."
             "everyday_recipe()", "edits": edits, "folder": str(collection)}
    write_json(truth_file, truth)
    return truth


def run_draw(truth: dict, output: Path, options: dict | None = None) -> dict:
    """Run ``copynce dedup`` with every default (``options``: fields of the request set as
    :func:`benchmarks.templates.systems.dedup_request` reads them, for what-ifs) on the draw's folder into ``output``
    (a fresh folder): its groups' pair precision and recall, its pairs' pair AP, the threshold and its log lines,
    the seconds of each stage and of the whole run."""
    from copynce_hf.runs.folders import write_dedup_folder

    from ..speed.pipeline import dedup_quality
    from ..templates.systems import dedup_request

    shutil.rmtree(output, ignore_errors=True)
    lines: list[str] = []
    request = dedup_request(Path(truth["folder"]), output, dict(options or {}))
    request.log = lines.append
    start, cpu = time.perf_counter(), time.process_time()
    run = write_dedup_folder(request)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    quality = dedup_quality(output, truth["groups"])
    return {"pool": truth["pool"], "draw": truth["draw"], "images": truth["images"], "true_pairs": truth["true_pairs"],
            **quality, "threshold": float(run.result.threshold), "origin": run.origin, "seconds": seconds,
            "cpu_seconds": cpu_seconds, "load": os.getloadavg()[0], "stage_seconds": run.result.seconds, "log": lines, "options": options or {}}


def summary_rows(rows: list[dict]) -> dict:
    """The mean and spread (population standard deviation) of each measure over the draws."""
    found = {}
    for key in ("group_precision", "group_recall", "pair_AP", "threshold", "seconds"):
        values = [row[key] for row in rows]
        found[key] = {"mean": statistics.fmean(values), "spread": statistics.pstdev(values)}
    return found


def print_table(rows: list[dict]) -> None:
    """The draws as the Markdown table of BENCHMARKS.md, then their mean and spread."""
    print("| draw | images | true pairs | threshold | groups | group precision | group recall | pair AP | seconds "
          "(self-calibration) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        calibration = row["stage_seconds"].get("self-calibration")
        print(f"| {row['pool']} {row['draw']} | {row['images']} | {row['true_pairs']} | {row['threshold']:.4g} | "
              f"{row['groups']} | {row['group_precision']:.3f} | {row['group_recall']:.3f} | {row['pair_AP']:.3f} | "
              f"{row['seconds']:.0f} ({'-' if calibration is None else f'{calibration:.0f}'}) |")
    summary = summary_rows(rows)
    print(" ".join(f"{key} {value['mean']:.3f} +- {value['spread']:.3f};" for key, value in summary.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.dedup_folders",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", choices=("dev", "evaluation"), required=True,
                        help="dev: held-out train photos (design); evaluation: reference and distractor photos")
    parser.add_argument("--draws", type=int, nargs="+", default=[1, 2, 3], help="draw numbers, from 1 (default 1 2 3)")
    parser.add_argument("--photos", type=int, default=40, help="photos per folder (default 40)")
    parser.add_argument("--copies", type=int, default=15, help="photos given a copy (default 15)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a dedup option for a what-if (e.g. threshold=0.99); the reported runs give none")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the folder holding imagenet-sample")
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..templates.systems import parse_options

    args = build_parser().parse_args(argv)
    options = parse_options(args.option, "--option")
    work = args.output_dir / "dedup_folders"
    label = f"{args.pool}-{args.photos}+{args.copies}" + ("" if not options else "-" + "-".join(
        f"{key}={value}" for key, value in sorted(options.items())))
    rows = []
    for draw in args.draws:
        truth = build_folder(work / "folders" / f"{args.pool}-{args.photos}+{args.copies}-d{draw}", args.pool, draw,
                             args.photos, args.copies, args.data)
        rows.append(run_draw(truth, work / "runs" / f"{label}-d{draw}", options))
        print(f"draw {draw}: {rows[-1]['origin']}", flush=True)
        write_json(work / f"{label}.json", {"command": command_line(), "when": now(), "machine": machine_info(),
                                            "rows": rows, "summary": summary_rows(rows)})
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
