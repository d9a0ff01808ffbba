"""``copynce dedup --dataset`` at scale: wall and CPU time per stage, peak resident memory, candidate and verified
pairs and the groups found, on a synthetic collection of N images written as a ``save_to_disk`` dataset.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.scale.dedup --images 2000              # a whole run
    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.scale.dedup --images 100000 --label descriptor \\
        -- --matcher none --threshold 0.9                                                     # descriptor stages
    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.scale.dedup --images 100000 --label matcher \\
        --matcher-minutes 30                           # the matcher stage, on the index of the run before
    python -m benchmarks.scale.dedup --table

The collection (:func:`build_collection`, seeded, reused when its manifest matches): N rows with the columns
``image_id`` (``img000000``, ...) and ``image`` (JPEG bytes), in a shuffled order:

* distinct synthetic images (:func:`synthetic_image`): a low-frequency colour field with 3-9 random ellipses,
  rectangles, polygons and lines and a little noise, 96-160 pixels a side, JPEG quality 60-95. No two are
  copies of each other (the ImageNet sample's 600 training photos would give 160 crops of each photo, which
  overlap: copies of one another). The costs per image and per pair do not depend on the content, and the
  candidate pairs are each image's nearest others whatever they look like; the groups do: the embedded matcher,
  trained on photographs, scores most candidate pairs of these synthetic images as copies, so that with it the
  groups chain into one (see the run's ``pair_precision``), a limit of the model on such images, not of the scale;
* ``--copy-fraction`` of them (1 %) with one planted copy each, made by the mini-DISC query recipe
  (``CopyRecipe.minidisc_queries()``): the true groups, kept in ``manifest.json``;
* ``--corrupt`` rows (10) that are not images (random bytes, or a JPEG cut after 200 bytes): skipped and counted.

Each run starts ``copynce dedup --dataset COLLECTION --output WORK/dedup-N`` (the embedded descriptor and
matcher unless options after ``--`` say otherwise) as a child process and reads its progress lines as they come,
each with the wall seconds since the start and the child's CPU seconds and peak memory (``VmHWM``) then. A stage
lasts from the line ending the one before to its own: ``load`` (the dataset opened, the models loaded),
``descriptors`` (the index of every image, embedded in chunks, and the self-search), ``matcher`` (verifying the
candidate pairs), ``groups`` (grouping, with the matcher's score of each member to its group's first image where
that pair was not a candidate) and ``write`` (``groups.csv``, ``pairs.csv``, ``report.html``); the report's own
table of stage seconds is kept too, and the machine's load average (on a shared machine the wall time depends on
it, the CPU time much less). ``--matcher-minutes M`` kills the run once its matcher stage has run M minutes: the
pairs its progress bar counted by then give its rate (per wall and per CPU second), and the whole matcher stage is
extrapolated from it, linearly, and recorded as extrapolated. A later run with the same output folder reuses the
index (and the scored chunks), as ``copynce dedup`` always does: run the descriptor-only run first and the matcher
run after it to measure the matcher without embedding the images twice.

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

from ..common import DEFAULT_OUTPUT_DIR, REPO_ROOT, command_line, machine_info, now, read_json, write_json

logger = logging.getLogger("benchmarks.scale.dedup")

__all__ = ["synthetic_image", "collection_plan", "build_collection", "run_dedup", "stage_times", "markdown_table",
           "main"]

#: What each progress line of ``copynce dedup`` ends (the stage that ends there), matched in order.
#: The self-calibration (without ``--threshold``) runs the same stages on its calibration collection first; its
#: lines say ``self-calibration:`` and end at ``self-calibrated on``, and the collection's own stages leave them out.
STAGE_LINES = (("load", re.compile(r"^copynce dedup: (\d+) images, descriptor: ")),
               ("self-calibration", re.compile(r"^copynce dedup: self-calibrated on (\d+) images")),
               ("descriptors", re.compile(r"^copynce dedup: (?!self-calibration: ).*: (\d+) candidate pairs among "
                                          r"(\d+) images")),
               ("matcher", re.compile(r"^copynce dedup: matcher: (\d+) pairs verified.*\((\d+) encoder passes, "
                                      r"(\d+) fusion passes\)")),
               ("layout crops", re.compile(r"^copynce dedup: layout crops: (\d+) of (\d+) images have layout boxes "
                                           r"\((\d+) crops\), (\d+) pairs verified on a crop, (\d+) of them")),
               ("groups", re.compile(r"^copynce dedup: (\d+) groups of copies \((\d+) images\)")),
               ("write", re.compile(r"^wrote \d+ groups of copies")))
#: An update of the matcher's progress bar: pairs scored and pairs in all.
MATCHER_BAR = re.compile(r"^matcher \(.*\):\s+\d+%\|.*\|\s*(\d+)/(\d+) ")
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


def _process_figures(pid: int) -> tuple[float | None, float | None]:
    """``(CPU seconds, user and system, peak resident memory in MiB (VmHWM))`` of process ``pid`` so far;
    ``(None, None)`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # from field 3 (state) on: utime is 14, stime 15
        with open(f"/proc/{pid}/status") as handle:
            peak = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration, ValueError, IndexError):
        return None, None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), peak


class _Progress:
    """The child's output lines as they arrive (a thread per stream), each with the wall seconds since the start,
    the child's CPU seconds and its peak memory then, copied to a log file."""

    def __init__(self, process: subprocess.Popen, log: Path):
        self.process, self.start, self.lines = process, time.monotonic(), []
        self.lock, self.log = threading.Lock(), log.open("w", encoding="utf-8")
        self.threads = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                        for stream in (process.stdout, process.stderr)]
        for thread in self.threads:
            thread.start()

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, ""):
            seconds = time.monotonic() - self.start
            cpu, peak = _process_figures(self.process.pid)
            for line in raw.rstrip("\n").split("\r"):  # a progress bar's updates end with \r
                if line.strip():
                    with self.lock:
                        self.lines.append((seconds, cpu, peak, line))
                        self.log.write(f"[{seconds:9.1f} s, cpu {cpu or 0:9.1f} s] {line}\n")
                        self.log.flush()

    def seen(self, stage: str) -> float | None:
        """The seconds at which ``stage`` ended (its line arrived); ``None`` before."""
        pattern = dict(STAGE_LINES)[stage]
        with self.lock:
            return next((seconds for seconds, _, _, line in self.lines if pattern.search(line)), None)

    def close(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)
        self.log.close()


def stage_times(lines: list[tuple[float, float | None, float | None, str]]) -> dict:
    """What each stage took, from the progress lines ``(wall seconds, CPU seconds, peak MiB, text)``: a stage lasts
    from the end of the one before (the start of the run for ``load``) to its own line (:data:`STAGE_LINES`).
    Returns ``{"seconds": ..., "cpu_seconds": ..., "peak_rss_mib": (at its end), "numbers": (its line's)}``."""
    found = {"seconds": {}, "cpu_seconds": {}, "peak_rss_mib": {}, "numbers": {}}
    wall_before, cpu_before = 0.0, 0.0
    for stage, pattern in STAGE_LINES:
        hit = next(((wall, cpu, peak, match) for wall, cpu, peak, line in lines if (match := pattern.search(line))),
                   None)
        if hit is None:
            continue
        wall, cpu, peak, match = hit
        found["seconds"][stage], found["numbers"][stage] = round(wall - wall_before, 1), [int(g) for g in match.groups()]
        found["cpu_seconds"][stage] = None if cpu is None else round(cpu - cpu_before, 1)
        found["peak_rss_mib"][stage] = None if peak is None else round(peak, 1)
        wall_before, cpu_before = wall, cpu if cpu is not None else cpu_before
    return found


def _matcher_bars(lines: list[tuple[float, float | None, float | None, str]]) -> tuple[tuple | None, list[tuple]]:
    """``(wall, CPU)`` of the collection's candidates' line (``None`` before it) and the updates of the matcher's
    progress bar after it and before the verified pairs' line, each ``(wall, CPU, pairs scored, bar total)``."""
    candidates, matcher = dict(STAGE_LINES)["descriptors"], dict(STAGE_LINES)["matcher"]
    start = next(((wall, cpu) for wall, cpu, _, line in lines if candidates.search(line)), None)
    bars = []
    for wall, cpu, _, line in lines:
        if matcher.search(line):
            break
        if start is not None and wall >= start[0] and (match := MATCHER_BAR.search(line)):
            bars.append((wall, cpu, int(match.group(1)), int(match.group(2))))
    return start, bars


def matcher_progress(lines: list[tuple[float, float | None, float | None, str]]) -> dict | None:
    """The matcher stage so far (from the candidates' line to the last update of its progress bar before the
    verified pairs' line): ``{"pairs": scored, "of": the bar's total (fusion passes: twice the pairs when each is
    scored in both orders), "seconds": wall, "cpu_seconds": ..., "first": (wall, CPU, pairs) of the bar's first
    line}``: what comes before the bar (content tokens, the work's identity) is the stage's setup. ``None`` before
    the stage or without an update."""
    start, bars = _matcher_bars(lines)
    if not bars or bars[-1][2] == 0:
        return None
    first, last = bars[0], bars[-1]

    def since_start(seconds, at_start):
        return None if seconds is None or at_start is None else round(seconds - at_start, 1)

    return {"pairs": last[2], "of": last[3], "seconds": round(last[0] - start[0], 1),
            "cpu_seconds": since_start(last[1], start[1]),
            "first": [since_start(first[0], start[0]), since_start(first[1], start[1]), first[2]]}


def matcher_started(lines: list[tuple[float, float | None, float | None, str]]) -> float | None:
    """The seconds at which the collection's matcher started scoring (its progress bar's first line after the
    candidates' line); ``None`` before."""
    _, bars = _matcher_bars(lines)
    return bars[0][0] if bars else None


def run_dedup(dataset: Path, output: Path, options: list[str], log: Path, matcher_minutes: float | None) -> dict:
    """Run ``copynce dedup --dataset DATASET --output OUTPUT OPTIONS`` in a child process (this process's
    environment: set ``OMP_NUM_THREADS``, ``nice`` the benchmark); its stages (wall and CPU seconds, peak memory),
    exit, and the machine's load average meanwhile (sampled once a minute: on a shared machine the wall time
    depends on it, the CPU time much less). With ``matcher_minutes`` the child is killed once its matcher stage has
    scored pairs that long (its setup before, content tokens and the work's identity, is not counted)."""
    command = [sys.executable, "-m", "copynce_hf.cli", "dedup", "--dataset", str(dataset), "--output", str(output),
               *options]
    environment = {**os.environ, "TQDM_MININTERVAL": "60", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    process = subprocess.Popen(command, env=environment, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, bufsize=1)
    progress, killed, loads = _Progress(process, log), False, []
    while process.poll() is None:
        time.sleep(1)
        if len(loads) < (time.monotonic() - start) / 60:
            loads.append(os.getloadavg()[0])  # the machine's load, once a minute: the run shares its cores
        with progress.lock:
            matcher_start = matcher_started(list(progress.lines))
        if (matcher_minutes is not None and matcher_start is not None
                and time.monotonic() - progress.start - matcher_start > 60 * matcher_minutes):
            process.send_signal(signal.SIGKILL)
            killed = True
            process.wait()
    wall = time.monotonic() - start
    progress.close()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"command": " ".join(command), "returncode": process.returncode, "killed_in_matcher_stage": killed,
            "wall_seconds": round(wall, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "stages": stage_times(progress.lines),
            "matcher_progress": matcher_progress(progress.lines),
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


def matcher_rate(run: dict, candidates: int) -> dict:
    """The matcher stage of a run killed in it: the pairs scored by its last progress update, their rate per wall
    second and per CPU second (between the bar's first and last lines), and the whole stage extrapolated: its
    setup (from the candidates' line to the bar's first line: content tokens, the work's identity) plus the bar's
    total at that rate, both ways. ``candidates`` is recorded beside (the bar counts both orders of a pair)."""
    done = run.get("matcher_progress")
    if done is None:
        return {"pairs_scored": 0}
    first_wall, first_cpu, first_pairs = done.get("first") or (0.0, 0.0, 0)
    scored = done["pairs"] - first_pairs
    if scored <= 0:
        first_wall, first_cpu, first_pairs, scored = 0.0, 0.0, 0, done["pairs"]

    def extrapolated(seconds_at_first, seconds_at_last):
        return round(seconds_at_first + (done["of"] - first_pairs) * (seconds_at_last - seconds_at_first) / scored)

    rate = {"pairs_scored": done["pairs"], "bar_total": done["of"], "candidate_pairs": candidates,
            "seconds": done["seconds"], "setup_seconds": first_wall, "cpu_seconds": done["cpu_seconds"],
            "pairs_per_second": round(scored / (done["seconds"] - first_wall), 3),
            "extrapolated_matcher_seconds": extrapolated(first_wall, done["seconds"]),
            "note": "extrapolated: the setup, then the bar's total at the rate of the updates before the kill"}
    if done["cpu_seconds"] and first_cpu is not None:
        rate["pairs_per_cpu_second"] = round(scored / (done["cpu_seconds"] - first_cpu), 3)
        rate["extrapolated_matcher_cpu_seconds"] = extrapolated(first_cpu, done["cpu_seconds"])
    return rate


def _stage_cell(stages: dict, stage: str) -> str:
    """``wall s (CPU s)`` of one stage, or empty."""
    if stage not in stages["seconds"]:
        return ""
    cpu = stages["cpu_seconds"].get(stage)
    return f"{stages['seconds'][stage]:.0f}" + ("" if cpu is None else f" ({cpu:.0f})")


def markdown_table(record: dict) -> str:
    """The runs of ``dedup_scale.json`` as a Markdown table (seconds: wall, CPU in parentheses)."""
    lines = ["| images | run | load s | self-calibration s | descriptors s | matcher s | layout crops s | groups s | write s "
             "| whole run s | peak RSS MiB | load average | candidate pairs | pairs verified | groups (pair P / R) |",
             "|" + " --- |" * 15]
    for _, entry in sorted(record.get("runs", {}).items(), key=lambda item: (item[1]["images"], item[0])):
        run, found, rate = entry["run"], entry.get("found") or {}, entry.get("matcher_rate") or {}
        stages = run["stages"]
        cells = {stage: _stage_cell(stages, stage) for stage, _ in STAGE_LINES}
        if rate.get("extrapolated_matcher_seconds"):
            cpu = (f" ({rate['extrapolated_matcher_cpu_seconds']})" if rate.get("extrapolated_matcher_cpu_seconds")
                   else "")
            cells["matcher"] = (f"**extrapolated** {rate['extrapolated_matcher_seconds']}{cpu} from "
                                f"{rate['pairs_scored']} pairs in {rate['seconds']:.0f} s")
        groups = f"{found['groups']} ({found['pair_precision']:.2f} / {found['pair_recall']:.2f})" if found else ""
        verified = found.get("pairs_verified", f"{rate['pairs_scored']} (killed)" if rate else "")
        load = run.get("load_average_1min") or {}
        lines.append(f"| {entry['images']} | {entry['label']} | {cells['load']} | {cells['self-calibration']} | "
                     f"{cells['descriptors']} | "
                     f"{cells['matcher']} | {cells['layout crops']} | {cells['groups']} | {cells['write']} | "
                     f"{run['wall_seconds']:.0f} "
                     f"({run['cpu_seconds']:.0f}) | {run['peak_rss_mib']:.0f} | {load.get('mean', '')} | "
                     f"{stages['numbers'].get('descriptors', [''])[0]} | {verified} | {groups} |")
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
                        help="where the collections and the dedup output folders go (dedup-N-LABEL, emptied "
                        "before each run)")
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
    output = args.work_dir / f"dedup-{args.images}-{args.label}"
    shutil.rmtree(output, ignore_errors=True)  # a whole run, timed: nothing resumed from an earlier run
    log = args.work_dir / f"dedup-{args.images}-{args.label}.log"
    run = run_dedup(collection, output, args.dedup_options, log, args.matcher_minutes)
    entry = {"images": args.images, "label": args.label, "when": now(), "benchmark": command_line(),
             "machine": machine_info(), "niceness": os.nice(0), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
             "collection": {key: manifest[key] for key in ("arguments", "build_seconds", "bytes")}, "run": run}
    if run["returncode"] == 0:
        entry["found"] = found_groups(output, manifest["truth"])
    elif run["killed_in_matcher_stage"]:
        entry["matcher_rate"] = matcher_rate(run, run["stages"]["numbers"]["descriptors"][0])
    record["runs"][f"{args.images}:{args.label}"] = entry
    write_json(results, record)
    logger.info("%s", json.dumps(entry["run"], indent=1))
    print(markdown_table(record))
    return record


if __name__ == "__main__":
    main()
