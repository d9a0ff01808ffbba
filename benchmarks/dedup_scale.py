"""``copynce dedup --dataset`` at scale: wall time per stage, peak resident memory, candidate and verified pairs
and the groups found, on a synthetic collection of N images written as a ``save_to_disk`` dataset.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.dedup_scale --images 20000            # the whole run
    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.dedup_scale --images 100000 --label descriptor \\
        -- --matcher none --threshold 0.9                                                     # descriptor stages
    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.dedup_scale --images 100000 --matcher-minutes 30
    python -m benchmarks.dedup_scale --table

The collection (:func:`build_collection`, seeded, reused when its manifest matches): N rows with the columns
``image_id`` (``img000000``, ...) and ``image`` (JPEG bytes), in a shuffled order:

* distinct synthetic images (:func:`synthetic_image`): a low-frequency colour field with 3-9 random ellipses,
  rectangles, polygons and lines and a little noise, 96-160 pixels a side, JPEG quality 60-95. No two are
  copies of each other (the ImageNet sample's 600 training photos would give 160 crops of each photo, which
  overlap: copies of one another);
* ``--copy-fraction`` of them (1 %) with one planted copy each, made by the mini-DISC query recipe
  (``CopyRecipe.minidisc_queries()``): the true groups, kept in ``manifest.json``;
* ``--corrupt`` rows (10) that are not images (random bytes, or a JPEG cut after 200 bytes): skipped and counted.

Each run starts ``copynce dedup --dataset COLLECTION --output WORK/dedup-N`` (the embedded descriptor and
matcher unless options after ``--`` say otherwise) as a child process, reads its progress lines as they come and
timestamps them, which gives the wall time of each stage: ``load`` (the dataset opened, the models loaded),
``descriptors`` (the index of every image, embedded in chunks, and the self-search), ``matcher`` (verifying the
candidate pairs), ``groups`` (grouping, with the matcher's score of each member to its group's first image where
that pair was not a candidate) and ``write`` (``groups.csv``, ``pairs.csv``, ``report.html``); the report's own
table of stage seconds is kept too. Peak resident memory: the child's ``VmHWM`` as each stage ends and its
``getrusage`` maximum at the end. ``--matcher-minutes M`` kills the run once its matcher stage has run M minutes:
the pairs scored by then (the matcher's chunk files) give its rate, and the whole matcher stage is extrapolated
from it, linearly, and recorded as extrapolated. A later run with the same output folder reuses the index (and
the scored chunks), as ``copynce dedup`` always does: run the descriptor-only run first and the matcher run after
it to measure the matcher without embedding the images twice.

Results go to ``<output-dir>/dedup_scale.json`` (one entry per images and label).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .common import DEFAULT_OUTPUT_DIR, REPO_ROOT, command_line, machine_info, now, read_json, write_json

logger = logging.getLogger("benchmarks.dedup_scale")

__all__ = ["synthetic_image", "collection_plan", "build_collection", "run_dedup", "stage_times", "markdown_table",
           "main"]

#: What each progress line of ``copynce dedup`` ends (the stage that ends there), matched in order.
STAGE_LINES = (("load", re.compile(r"^copynce dedup: (\d+) images, descriptor: ")),
               ("descriptors", re.compile(r"^copynce dedup: .*: (\d+) candidate pairs among (\d+) images")),
               ("matcher", re.compile(r"^copynce dedup: matcher: (\d+) pairs verified.*\((\d+) encoder passes, "
                                      r"(\d+) fusion passes\)")),
               ("groups", re.compile(r"^copynce dedup: (\d+) groups of copies \((\d+) images\)")),
               ("write", re.compile(r"^wrote \d+ groups of copies")))
SIZES = (96, 160)


# ---------------------------------------------------------------------------------------------- the collection


def synthetic_image(rng: np.random.Generator) -> Image.Image:
    """A distinct synthetic RGB image, 96-160 pixels a side: a colour field of 2x2 to 6x6 random colours (bicubic),
    3-9 random shapes (ellipse, rectangle, polygon, line) in random colours, and Gaussian noise (sigma 0-12)."""
    width, height = (int(side) for side in rng.integers(SIZES[0], SIZES[1] + 1, size=2))
    grid = int(rng.integers(2, 7))
    image = Image.fromarray(rng.integers(0, 256, (grid, grid, 3), dtype=np.uint8)).resize((width, height),
                                                                                          Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 10))):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = float(rng.uniform(-0.2, 1.0) * width), float(rng.uniform(-0.2, 1.0) * height)
        box = [x, y, x + float(rng.uniform(0.1, 0.7) * width), y + float(rng.uniform(0.1, 0.7) * height)]
        kind = int(rng.integers(4))
        if kind == 0:
            draw.ellipse(box, fill=colour)
        elif kind == 1:
            draw.rectangle(box, fill=colour)
        else:
            points = [(float(rng.uniform(0, width)), float(rng.uniform(0, height)))
                      for _ in range(int(rng.integers(3, 7)))]
            if kind == 2:
                draw.polygon(points, fill=colour)
            else:
                draw.line(points, fill=colour, width=int(rng.integers(1, 8)))
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, rng.uniform(0, 12), (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def collection_plan(images: int, copy_fraction: float, corrupt: int, seed: int) -> list[tuple[str, int]]:
    """What each row of the collection is, in row order: ``("base", b)`` (distinct image ``b``), ``("copy", b)``
    (the planted copy of image ``b``) or ``("corrupt", k)``; ``round(images * copy_fraction)`` copies of as many
    distinct images drawn at random, shuffled with ``seed``."""
    copies = round(images * copy_fraction)
    bases = images - copies - corrupt
    if bases < copies or bases < 1:
        raise ValueError(f"{images} images cannot hold {copies} copies and {corrupt} corrupt rows")
    rng = np.random.default_rng([seed, 0])
    copied = rng.choice(bases, size=copies, replace=False)
    rows = [("base", b) for b in range(bases)] + [("copy", int(b)) for b in copied] + [("corrupt", k)
                                                                                        for k in range(corrupt)]
    return [rows[i] for i in rng.permutation(len(rows))]


def _row_bytes(kind: str, number: int, seed: int, recipe) -> bytes:
    """The JPEG (or corrupt) bytes of one row of :func:`collection_plan`."""
    if kind == "corrupt":
        rng = np.random.default_rng([seed, 2, number])
        if number % 2:
            return _jpeg(synthetic_image(rng), 90)[:200]  # a JPEG cut short
        return rng.integers(0, 256, 300, dtype=np.uint8).tobytes()  # not an image
    rng = np.random.default_rng([seed, 1, number])
    image, quality = synthetic_image(rng), int(rng.integers(60, 96))
    if kind == "copy":
        image = recipe.apply(image, np.random.default_rng([seed, 3, number]))[0]
        quality = 75
    return _jpeg(image, quality)


def build_collection(folder: Path, images: int, copy_fraction: float = 0.01, corrupt: int = 10,
                     seed: int = 0) -> dict:
    """Write the collection as a ``save_to_disk`` dataset into ``folder`` (reused when its ``manifest.json`` was
    written for the same arguments); returns the manifest: the arguments, the true groups (ids of each image and
    its copy), the corrupt ids, seconds to build and bytes on disk."""
    import datasets

    from copynce_hf.pixtrace import CopyRecipe

    arguments = {"images": images, "copy_fraction": copy_fraction, "corrupt": corrupt, "seed": seed,
                 "sizes": list(SIZES), "generator": "synthetic_image v1"}
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file() and read_json(manifest_path).get("arguments") == arguments:
        return read_json(manifest_path)
    shutil.rmtree(folder, ignore_errors=True)
    start, plan, recipe = time.perf_counter(), collection_plan(images, copy_fraction, corrupt, seed), \
        CopyRecipe.minidisc_queries()
    ids = [f"img{row:06d}" for row in range(len(plan))]

    def rows():
        for row, (kind, number) in enumerate(plan):
            yield {"image_id": ids[row], "image": {"bytes": _row_bytes(kind, number, seed, recipe), "path": None}}

    datasets.disable_progress_bars()
    features = datasets.Features({"image_id": datasets.Value("string"), "image": datasets.Image()})
    cache = folder.with_name(folder.name + ".cache")
    dataset = datasets.Dataset.from_generator(rows, features=features, cache_dir=str(cache))
    dataset.save_to_disk(str(folder))
    del dataset
    shutil.rmtree(cache, ignore_errors=True)
    first = {number: ids[row] for row, (kind, number) in enumerate(plan) if kind == "base"}
    truth = [[first[number], ids[row]] for row, (kind, number) in enumerate(plan) if kind == "copy"]
    manifest = {"arguments": arguments, "truth": truth,
                "corrupt": [ids[row] for row, (kind, _) in enumerate(plan) if kind == "corrupt"],
                "build_seconds": round(time.perf_counter() - start, 1),
                "bytes": sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())}
    write_json(manifest_path, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------- the run


def _peak_mib(pid: int) -> float | None:
    """``VmHWM`` (peak resident memory) of process ``pid`` in MiB; ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return None


class _Progress:
    """The child's output lines, timestamped as they arrive (a thread per stream), copied to a log file."""

    def __init__(self, process: subprocess.Popen, log: Path):
        self.process, self.start, self.lines = process, time.monotonic(), []
        self.peaks: dict[str, float | None] = {}
        self.lock, self.log = threading.Lock(), log.open("w", encoding="utf-8")
        self.threads = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                        for stream in (process.stdout, process.stderr)]
        for thread in self.threads:
            thread.start()

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, ""):
            seconds = time.monotonic() - self.start
            for line in raw.rstrip("\n").split("\r"):  # a progress bar's updates end with \r
                if not line.strip():
                    continue
                with self.lock:
                    self.lines.append((seconds, line))
                    self.log.write(f"[{seconds:9.1f} s] {line}\n")
                    self.log.flush()
                    for stage, pattern in STAGE_LINES:
                        if pattern.search(line) and stage not in self.peaks:
                            self.peaks[stage] = _peak_mib(self.process.pid)

    def seen(self, stage: str) -> float | None:
        """The seconds at which ``stage`` ended (its line arrived); ``None`` before."""
        pattern = dict(STAGE_LINES)[stage]
        with self.lock:
            return next((seconds for seconds, line in self.lines if pattern.search(line)), None)

    def close(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)
        self.log.close()


def stage_times(lines: list[tuple[float, str]]) -> tuple[dict[str, float], dict[str, list[int]]]:
    """``(seconds of each stage, the numbers its line gave)`` from timestamped progress lines: a stage lasts from
    the end of the one before (the start of the run for ``load``) to its own line (:data:`STAGE_LINES`)."""
    seconds, numbers, previous = {}, {}, 0.0
    for stage, pattern in STAGE_LINES:
        found = next(((at, match) for at, line in lines if (match := pattern.search(line))), None)
        if found is None:
            continue
        seconds[stage], numbers[stage] = round(found[0] - previous, 1), [int(g) for g in found[1].groups()]
        previous = found[0]
    return seconds, numbers


def run_dedup(dataset: Path, output: Path, options: list[str], log: Path, matcher_minutes: float | None) -> dict:
    """Run ``copynce dedup --dataset DATASET --output OUTPUT OPTIONS`` in a child process (this process's
    environment: set ``OMP_NUM_THREADS``, ``nice`` the benchmark); its stages, memory, exit and the machine's load
    average meanwhile (sampled once a minute: the cores are shared on a busy machine). With
    ``matcher_minutes`` the child is killed once its matcher stage has run that long."""
    command = [sys.executable, "-m", "copynce_hf.cli", "dedup", "--dataset", str(dataset), "--output", str(output),
               *options]
    environment = {**os.environ, "TQDM_MININTERVAL": "60", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    start, started_at = time.monotonic(), time.time()
    process = subprocess.Popen(command, env=environment, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, bufsize=1)
    progress, killed, loads = _Progress(process, log), False, []
    while process.poll() is None:
        time.sleep(1)
        if len(loads) < (time.monotonic() - start) / 60:
            loads.append(os.getloadavg()[0])  # the machine's load, once a minute: the run shares its cores
        matcher_start = progress.seen("descriptors")
        if (matcher_minutes is not None and matcher_start is not None
                and time.monotonic() - progress.start - matcher_start > 60 * matcher_minutes):
            process.send_signal(signal.SIGKILL)
            killed = True
            process.wait()
    wall = time.monotonic() - start
    progress.close()
    seconds, numbers = stage_times(progress.lines)
    return {"command": " ".join(command), "returncode": process.returncode, "killed_in_matcher_stage": killed,
            "wall_seconds": round(wall, 1), "stage_seconds": seconds, "stage_numbers": numbers,
            "peak_rss_mib_at_stage_end": {k: None if v is None else round(v, 1) for k, v in progress.peaks.items()},
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "started_at": started_at, "matcher_start_seconds": progress.seen("descriptors"),
            "load_average_1min": {"mean": round(float(np.mean(loads)), 2), "max": round(max(loads), 2)}
            if loads else None}


# ---------------------------------------------------------------------------------------------- what it found


def _report_stages(report: Path) -> dict[str, float]:
    """The table of stage seconds of ``report.html`` (``index``, ``self-search``, ``matcher``, ``groups``)."""
    text = report.read_text(encoding="utf-8") if report.is_file() else ""
    table = text.split("Time per stage", 1)[-1] if "Time per stage" in text else ""
    return {name: float(value) for name, value in re.findall(r"<tr><td>([\w:-]+)</td><td>([\d.]+)</td></tr>", table)}


def found_groups(output: Path, truth: list[list[str]]) -> dict:
    """Groups, verified pairs and the pair precision / recall of the groups against the planted ones."""
    import csv

    from copynce_hf.retrieval import pair_precision_recall

    groups: dict[str, list[str]] = {}
    with (output / "groups.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            groups.setdefault(row["group_id"], []).append(row["image_id"])
    with (output / "pairs.csv").open(newline="") as handle:
        verified = sum(1 for _ in handle) - 1
    precision, recall = pair_precision_recall(groups.values(), truth)
    sizes = sorted((len(group) for group in groups.values()), reverse=True)
    return {"groups": len(groups), "images_in_groups": sum(sizes), "largest_groups": sizes[:5],
            "pairs_verified": verified, "pair_precision": round(precision, 4), "pair_recall": round(recall, 4),
            "report_stage_seconds": _report_stages(output / "report.html")}


def matcher_rate(output: Path, run: dict, candidates: int) -> dict:
    """The matcher stage of a run killed in it: pairs scored by then (its chunk files written in this run), their
    rate over the stage's seconds up to the last chunk written (from the candidates' line: the identity of the
    work is computed in them), and the whole stage extrapolated linearly to ``candidates`` pairs."""
    if run["matcher_start_seconds"] is None:
        return {"chunks": 0, "pairs_scored": 0}
    started = run["started_at"] + run["matcher_start_seconds"]  # the candidates' line: the stage starts
    chunks = [path for path in (output / "rescoring").glob("chunk-*.json") if path.stat().st_mtime > started]
    if not chunks:
        return {"chunks": 0, "pairs_scored": 0}
    scored = sum(len(json.loads(path.read_text())["scores"]) for path in chunks)
    elapsed = max(path.stat().st_mtime for path in chunks) - started
    rate = scored / elapsed
    return {"chunks": len(chunks), "pairs_scored": scored, "seconds_to_last_chunk": round(elapsed, 1),
            "pairs_per_second": round(rate, 3), "candidate_pairs": candidates,
            "extrapolated_matcher_seconds": round(candidates / rate, 0),
            "note": "extrapolated: candidate pairs / the rate of the chunks scored before the run was killed"}


def markdown_table(record: dict) -> str:
    """The runs of ``dedup_scale.json`` as a Markdown table."""
    lines = ["| images | run | load s | descriptors s | matcher s | groups s | write s | wall s | peak RSS MiB | "
             "candidate pairs | pairs verified | groups (pair P / R) |", "|" + " --- |" * 12]
    for _, entry in sorted(record.get("runs", {}).items(), key=lambda item: (item[1]["images"], item[0])):
        run, stages = entry["run"], entry["run"]["stage_seconds"]
        numbers, found = run["stage_numbers"], entry.get("found") or {}
        matcher = stages.get("matcher", "")
        if entry.get("matcher_rate", {}).get("extrapolated_matcher_seconds"):
            rate = entry["matcher_rate"]
            matcher = (f"{rate['extrapolated_matcher_seconds']:.0f} (extrapolated from {rate['pairs_scored']} pairs "
                       f"in {rate['seconds_to_last_chunk']:.0f} s)")
        groups = (f"{found['groups']} ({found['pair_precision']:.2f} / {found['pair_recall']:.2f})" if found else "")
        verified = found.get("pairs_verified", entry.get("matcher_rate", {}).get("pairs_scored", ""))
        lines.append(f"| {entry['images']} | {entry['label']} | {stages.get('load', '')} | "
                     f"{stages.get('descriptors', '')} | {matcher} | {stages.get('groups', '')} | "
                     f"{stages.get('write', '')} | {run['wall_seconds']} | {run['peak_rss_mib']} | "
                     f"{numbers.get('descriptors', [''])[0]} | {verified} | {groups} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=100_000, help="rows of the collection (default 100000)")
    parser.add_argument("--copy-fraction", type=float, default=0.01, help="share of planted copies (default 0.01)")
    parser.add_argument("--corrupt", type=int, default=10, help="rows that are not images (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="default", help="the run's name in the results (default: default)")
    parser.add_argument("--matcher-minutes", type=float,
                        help="kill the run once its matcher stage has run this long, and extrapolate the stage")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_OUTPUT_DIR / "dedup_scale",
                        help="where the collections and the dedup output folders go")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--table", action="store_true", help="print the Markdown table of the results and stop")
    parser.add_argument("dedup_options", nargs="*", help="after --: more copynce dedup options")
    return parser


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = build_parser().parse_args(argv)
    results = args.output_dir / "dedup_scale.json"
    record = read_json(results) if results.is_file() else {"runs": {}}
    if args.table:
        print(markdown_table(record))
        return record
    collection = args.work_dir / f"collection-{args.images}"
    manifest = build_collection(collection, args.images, args.copy_fraction, args.corrupt, args.seed)
    logger.info("collection %s: %d images (%d planted copies, %d corrupt), %.0f MB, built in %.0f s", collection,
                args.images, len(manifest["truth"]), len(manifest["corrupt"]), manifest["bytes"] / 1e6,
                manifest["build_seconds"])
    output = args.work_dir / f"dedup-{args.images}"
    log = args.work_dir / f"dedup-{args.images}-{args.label}.log"
    run = run_dedup(collection, output, args.dedup_options, log, args.matcher_minutes)
    entry = {"images": args.images, "label": args.label, "when": now(), "benchmark": command_line(),
             "machine": machine_info(), "niceness": os.nice(0), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
             "collection": {key: manifest[key] for key in ("arguments", "build_seconds", "bytes")}, "run": run}
    if run["returncode"] == 0:
        entry["found"] = found_groups(output, manifest["truth"])
    elif run["killed_in_matcher_stage"]:
        entry["matcher_rate"] = matcher_rate(output, run, run["stage_numbers"]["descriptors"][0])
    record["runs"][f"{args.images}:{args.label}"] = entry
    write_json(results, record)
    logger.info("%s", json.dumps(entry["run"], indent=1))
    print(markdown_table(record))
    return record


if __name__ == "__main__":
    main()
