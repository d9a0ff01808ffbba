"""Wall time of ``copynce detect`` and ``copynce dedup`` with their defaults, end to end, before and after a change.

    python -m benchmarks.speed.pipeline                                 # this working tree, both tasks, 2 repeats
    python -m benchmarks.speed.pipeline --revision b8ddd33 --repeats 3  # and the package of b8ddd33, same run
    python -m benchmarks.speed.pipeline --tasks dedup --profile         # where the time goes, by stage
    python -m benchmarks.speed.pipeline --env ACCELERATE_MIXED_PRECISION=bf16 --detect-options '--batch-size 8'

Each run starts the command as a fresh process (``python -m copynce_hf.cli``, the embedded models, every default)
into a fresh output folder (nothing resumed, no index reused), and times it end to end: the wall time, the CPU
time of the process and its children, and its peak resident memory. The code measured is this working tree and,
for each ``--revision REV``, the package of that git revision, checked out with ``git worktree add`` under the
work folder (removed at the end) and put first on the ``PYTHONPATH`` of its runs (the run's folder is its working
directory, so no other copy of ``copynce_hf`` is imported; the file imported is recorded). The runs alternate the
codes and the tasks repeat by repeat, so that a change of the machine's load hits each of them. Threads:
``--threads`` (default 2, both cores of the development machine) through ``COPYNCE_THREADS`` and
``OMP_NUM_THREADS``; the load average before and after each run is recorded beside it: on a shared machine the
CPU seconds move less than the wall seconds. What-ifs: ``--env NAME=VALUE`` sets the environment of every run,
``--detect-options`` / ``--dedup-options`` add options to every command.

Tasks, built once from ``../shared/data/imagenet-sample`` (the command says so and stops where it is absent) into
``--task-dir`` (default ``<output-dir>/pipeline_speed/tasks``):

* ``detect``: the 300 ``reference`` images; queries: mini-DISC's copies of the first ``--copies`` copied references
  (references 0, 2, 4, ...; 120 by default) and its first ``--distractors`` distractors (100): 220 queries with
  mini-DISC's own edits and ids (:mod:`benchmarks.minidisc`). ``copynce detect QUERIES --references REFERENCES
  --ground-truth ground_truth.csv --output OUT``; quality: muAP, RP90 and recall@1 of ``OUT/metrics.json``.
* ``dedup``: the first ``--originals`` ``reference`` images (90) and a copy of each made with the mini-DISC query
  recipe (``CopyRecipe.minidisc_queries()``, ``--seed``), two copies for the first ``--twice`` (20): 200 images,
  110 copies. ``copynce dedup FOLDER --output OUT``; quality: the pair AP of ``OUT/pairs.csv`` over every true pair
  (:func:`benchmarks.templates.pair_average_precision`; a true pair: two images of one original, 130 here) and the
  pair precision and recall of ``OUT/groups.csv`` (:func:`copynce_hf.retrieval.pair_precision_recall`).

Written to ``<output-dir>/pipeline_speed.json`` (after every run): the machine, the tasks, the codes, every run
(times, load, the command's log lines: the passes each stage ran, the times per stage of its ``report.html``,
quality) and the median of each code and task; each run's output folder and log stay under
``<output-dir>/pipeline_speed/runs``. Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import csv
import html
import importlib.util
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..common import DEFAULT_OUTPUT_DIR, REPO_ROOT, command_line, machine_info, now, read_json, write_json
from ..minidisc import SHARED_DATA

__all__ = ["TASKS", "build_detect_task", "build_dedup_task", "checkout_revision", "run_command", "detect_quality",
           "dedup_quality", "main"]

TASKS = ("detect", "dedup")
#: Environment variables the package's thread policy and the numerical runtimes read (``copynce_hf/threads.py``).
THREAD_VARIABLES = ("COPYNCE_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# ---------------------------------------------------------------------------------------------- tasks


def _splits(data: Path) -> Path:
    splits = Path(data) / "imagenet-sample-splits.csv"
    if not splits.is_file():
        raise FileNotFoundError(f"{splits} not found: the shared benchmark data (imagenet-sample) is only present in "
                                "CI and dev sessions")
    return splits


def build_detect_task(folder: Path, data: Path = SHARED_DATA, copies: int = 120, distractors: int = 100) -> dict:
    """The detect task in ``folder/detect-<fingerprint>`` (``queries/``, ``references/``, ``ground_truth.csv``): every
    reference, mini-DISC's copies of its first ``copies`` copied references and its first ``distractors`` distractor
    queries (their edits and ids as in mini-DISC). Returns its description, with the folders."""
    from copynce_hf.evaluation.minidisc import MiniDisc, MiniDiscConfig, build_minidisc

    config = MiniDiscConfig(image_folder=Path(data) / "imagenet-sample", splits_csv=_splits(data))
    whole = build_minidisc(config)
    copied = [path.stem for path in list(whole.reference_files.values())[:: config.query_every]]
    if copies > len(copied):
        raise SystemExit(f"--copies {copies}: mini-DISC has {len(copied)} copies")
    kept_references = set(copied[:copies])
    distractor_queries = [q for q in whole.queries if q.reference_id is None]
    distractor_queries.sort(key=lambda q: q.source_path.name)
    kept = {q.query_id for q in whole.queries if q.reference_id in kept_references}
    kept |= {q.query_id for q in distractor_queries[:distractors]}
    task = MiniDisc(config, whole.reference_files, [q for q in whole.queries if q.query_id in kept])
    target = Path(folder) / f"detect-{task.fingerprint}"
    layout = task.export(target, auxiliary_split=None)
    return {"fingerprint": task.fingerprint, "queries": len(task.queries), "references": len(task.reference_ids),
            "copies": sum(1 for q in task.queries if q.reference_id),
            "distractors": sum(1 for q in task.queries if q.reference_id is None),
            "folders": {name: str(path) for name, path in layout.items()}}


def build_dedup_task(folder: Path, data: Path = SHARED_DATA, originals: int = 90, twice: int = 20,
                     seed: int = 0) -> dict:
    """The dedup task in ``folder/dedup-o<originals>-t<twice>-s<seed>/collection``: the first ``originals``
    ``reference`` images (links) and a copy of each (mini-DISC's query recipe, PNG), two for the first ``twice``;
    ``truth.json`` beside it holds the groups (each original with its copies). Built once: a folder whose
    ``truth.json`` is complete is reused. Returns its description, with the truth."""
    import numpy as np
    from PIL import Image

    from copynce_hf.evaluation.minidisc import read_splits
    from copynce_hf.pixtrace import CopyRecipe

    if not 0 <= twice <= originals:
        raise SystemExit(f"--twice {twice} must be between 0 and --originals {originals}")
    target = Path(folder) / f"dedup-o{originals}-t{twice}-s{seed}"
    truth_file = target / "truth.json"
    if truth_file.is_file():
        return read_json(truth_file)
    references = read_splits(_splits(data), Path(data) / "imagenet-sample").get("reference", [])[:originals]
    if len(references) < originals:
        raise SystemExit(f"--originals {originals}: the reference split has {len(references)} images")
    shutil.rmtree(target, ignore_errors=True)
    collection = target / "collection"
    collection.mkdir(parents=True)
    rng, recipe, groups = np.random.default_rng(seed), CopyRecipe.minidisc_queries(), []
    for number, path in enumerate(references):
        (collection / path.name).symlink_to(path.resolve())
        groups.append([path.stem])
        image = Image.open(path).convert("RGB")
        for copy in range(2 if number < twice else 1):
            recipe.apply(image, rng)[0].save(collection / f"{path.stem}_copy{copy}.png")
            groups[-1].append(f"{path.stem}_copy{copy}")
    pairs = sum(len(group) * (len(group) - 1) // 2 for group in groups)
    task = {"images": sum(map(len, groups)), "originals": originals, "copies": sum(map(len, groups)) - originals,
            "true_pairs": pairs, "seed": seed, "recipe": "CopyRecipe.minidisc_queries()",
            "folders": {"collection": str(collection)}, "groups": groups}
    write_json(truth_file, task)
    return task


# ---------------------------------------------------------------------------------------------- codes


def _git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def checkout_revision(revision: str, folder: Path) -> Path:
    """The package of git ``revision`` checked out (``git worktree add --detach``) as ``folder/<commit>``; a
    checkout already there at that commit is reused."""
    try:
        commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}")
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"--revision {revision}: not a commit of this repository ({error.stderr.strip()})") from None
    target = Path(folder) / commit[:12]
    if (target / "copynce_hf").is_dir() and _git("rev-parse", "HEAD", cwd=target) == commit:
        return target
    if target.exists():
        _git("worktree", "remove", "--force", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    _git("worktree", "add", "--detach", str(target), commit)
    return target


def working_tree_label() -> str:
    """``working tree <commit>`` (``+changes`` when it differs from that commit)."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"working tree {commit}" + ("+changes" if changed else "")


def code_environment(code_root: Path, threads: int, extra: dict | None = None) -> dict:
    """The environment of a run of the package in ``code_root``: it first on ``PYTHONPATH``, ``threads`` threads,
    and ``extra`` (``--env``: e.g. ``ACCELERATE_MIXED_PRECISION=bf16``)."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(code_root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                            if p])
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name not in (extra or {}):
            env.pop(name, None)  # the package's own policy (a passive wait after a short spin)
    return env


def imported_from(code_root: Path, threads: int) -> str:
    """The ``copynce_hf`` a run in ``code_root`` imports (checked: it must be that of ``code_root``)."""
    found = subprocess.run([sys.executable, "-c", "import copynce_hf; print(copynce_hf.__file__)"], cwd=code_root,
                           env=code_environment(code_root, threads), check=True, capture_output=True,
                           text=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(Path(code_root).resolve()):
        raise SystemExit(f"a run in {code_root} imports {found}, not the package there")
    return found


# ---------------------------------------------------------------------------------------------- runs


def run_command(argv: list[str], code_root: Path, threads: int, log: Path, profile: Path | None = None,
                extra: dict | None = None) -> dict:
    """Run ``python -m copynce_hf.cli ARGV`` with the package of ``code_root`` (stdout and stderr into ``log``;
    under pyinstrument, its session saved as ``profile``, when given): wall and CPU seconds (the process and its
    children), peak resident MiB, the load average before and after."""
    profiler = ["-m", "pyinstrument", "-i", "0.002", "-r", "pyisession", "-o", str(profile)] if profile else []
    command = [sys.executable, *profiler, "-m", "copynce_hf.cli", *argv]
    load_before = os.getloadavg()[0]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as handle:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=code_root, env=code_environment(code_root, threads, extra),
                                   stdout=handle, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{shlex.join(command)} exited {process.returncode} (log {log}):\n{tail}")
    text = log.read_text(encoding="utf-8", errors="replace")
    return {"wall_seconds": round(wall, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2), "log": str(log), "profile": str(profile) if profile else None,
            "log_lines": [line.strip() for line in re.split(r"[\r\n]", text) if line.startswith("copynce ")]}


def task_command(task: str, description: dict, output: Path, options: str = "") -> list[str]:
    """The ``copynce`` arguments of ``task`` writing into ``output``: every default, unless ``options`` (more options
    of the command, one string: ``--detect-options`` / ``--dedup-options``) says otherwise. The paths are absolute:
    a run's working directory is its code's folder."""
    folders = {name: str(Path(folder).resolve()) for name, folder in description["folders"].items()}
    if task == "detect":
        return ["detect", folders["queries"], "--references", folders["references"], "--ground-truth",
                folders["ground_truth"], "--output", str(Path(output).resolve()), *shlex.split(options)]
    return ["dedup", folders["collection"], "--output", str(Path(output).resolve()), *shlex.split(options)]


def detect_quality(output: Path) -> dict:
    """muAP, RP90, recall@1 and candidate recall of a detect run (its ``metrics.json``)."""
    metrics = read_json(Path(output) / "metrics.json")
    return {"muAP": metrics["micro_ap"], "RP90": metrics["recall_at_p90"], "recall@1": metrics["recall_at_rank1"],
            "candidate_recall": metrics.get("candidate_recall")}


def dedup_quality(output: Path, groups: list[list[str]]) -> dict:
    """Pair AP of a dedup run's verified pairs (``pairs.csv``, decision scores) over the true pairs of ``groups``,
    and the pair precision / recall and count of its groups (``groups.csv``)."""
    from copynce_hf.retrieval import Prediction, group_pairs, pair_precision_recall

    from ..templates.systems import pair_average_precision

    with (Path(output) / "pairs.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))[1:]
    scored = [Prediction(a, b, float(score)) for a, b, score, *_ in rows]
    found: dict[str, list[str]] = {}
    with (Path(output) / "groups.csv").open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            found.setdefault(row["group_id"], []).append(row["image_id"])
    precision, recall = pair_precision_recall(found.values(), groups)
    return {"pair_AP": pair_average_precision(scored, group_pairs(groups)), "group_precision": precision,
            "group_recall": recall, "groups": len(found), "verified_pairs": len(scored)}


def stage_seconds(output: Path) -> dict[str, float]:
    """The "Time per stage" table of a run's ``report.html`` (stage -> seconds, as the command measured them)."""
    page = (Path(output) / "report.html").read_text(encoding="utf-8")
    table = page.partition("Time per stage")[2].partition("</table>")[0]
    return {html.unescape(stage): float(seconds)
            for stage, seconds in re.findall(r"<tr><td>(.*?)</td><td>([0-9.]+)</td></tr>", table)}


def measure(task: str, description: dict, label: str, code_root: Path, work: Path, repeat: int, args) -> dict:
    """One timed run of ``task`` with the code ``label`` (in ``code_root``) into a fresh output folder."""
    folder = work / "runs" / re.sub(r"[^\w.]+", "-", label).strip("-") / f"{task}-{repeat}"
    shutil.rmtree(folder, ignore_errors=True)
    output = folder / "output"
    profile = folder / "profile.pyisession" if args.profile else None
    run = run_command(task_command(task, description, output, getattr(args, f"{task}_options")), code_root, args.threads, folder / "log.txt", profile,
                      parse_env(args.env))
    quality = detect_quality(output) if task == "detect" else dedup_quality(output, description["groups"])
    found = {"code": label, "task": task, "repeat": repeat, "profiled": bool(profile), **run,
             "stage_seconds": stage_seconds(output), "quality": quality}
    if profile is not None:
        from .profile import print_tables, stage_tables

        found["profile_tables"] = stage_tables(profile)
        print_tables(found["profile_tables"])
    return found


# ---------------------------------------------------------------------------------------------- summary


def summarise(runs: list[dict]) -> dict:
    """Per code and task: the median, the least and the largest wall time, the median CPU time and peak memory, and
    the quality of each run (a deterministic pipeline gives the same figures every run)."""
    summary: dict[str, dict] = {}
    for run in runs:
        summary.setdefault(run["code"], {}).setdefault(run["task"], []).append(run)
    for tasks in summary.values():
        for task, found in tasks.items():
            walls = [run["wall_seconds"] for run in found]
            tasks[task] = {"runs": len(found), "wall_seconds": walls, "median_wall_seconds": statistics.median(walls),
                           "median_cpu_seconds": statistics.median(run["cpu_seconds"] for run in found),
                           "peak_rss_mib": max(run["peak_rss_mib"] for run in found),
                           "load": [run["load_before"] for run in found],
                           "median_stage_seconds": {stage: statistics.median(run["stage_seconds"].get(stage, 0.0)
                                                                             for run in found)
                                                    for stage in found[0].get("stage_seconds", {})},
                           "quality": [run["quality"] for run in found]}
    return summary


def print_table(summary: dict) -> None:
    print("| code | task | wall s (each run) | median wall s | median CPU s | peak RSS MiB | load before | quality |")
    print("|---|---|---|---|---|---|---|---|")
    for code, tasks in summary.items():
        for task, entry in tasks.items():
            quality = "; ".join(", ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                                          for key, value in found.items()) for found in
                                {repr(q): q for q in entry["quality"]}.values())
            print(f"| {code} | {task} | {', '.join(f'{w:.1f}' for w in entry['wall_seconds'])} | "
                  f"{entry['median_wall_seconds']:.1f} | {entry['median_cpu_seconds']:.1f} | {entry['peak_rss_mib']:.0f} "
                  f"| {', '.join(f'{load:.2f}' for load in entry['load'])} | {quality} |")
    print("\n| code | task | median seconds per stage (the command's report.html) |\n|---|---|---|")
    for code, tasks in summary.items():
        for task, entry in tasks.items():
            stages = ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in entry["median_stage_seconds"].items())
            print(f"| {code} | {task} | {stages} |")


# ---------------------------------------------------------------------------------------------- driver


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` items as a mapping (a malformed one ends the command, named)."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env {item!r}: NAME=VALUE expected")
        found[name] = value
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--revision", action="append", default=[], metavar="REV",
                        help="also run the package of this git revision (repeatable)")
    parser.add_argument("--no-working-tree", action="store_true", help="run the --revision codes only")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each code and task (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="threads of each run (default 2)")
    parser.add_argument("--copies", type=int, default=120, help="detect: copies among the queries (default 120)")
    parser.add_argument("--distractors", type=int, default=100, help="detect: distractor queries (default 100)")
    parser.add_argument("--originals", type=int, default=90, help="dedup: original photos (default 90)")
    parser.add_argument("--twice", type=int, default=20, help="dedup: originals with two copies (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="dedup: seed of the copies (default 0)")
    parser.add_argument("--detect-options", default="", metavar="'OPTIONS'",
                        help="more options of every detect run, e.g. '--batch-size 8' (default: none, every default)")
    parser.add_argument("--dedup-options", default="", metavar="'OPTIONS'", help="the same for dedup")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment of every run (repeatable; recorded), e.g. ACCELERATE_MIXED_PRECISION=bf16")
    parser.add_argument("--profile", action="store_true",
                        help="run each command under pyinstrument and sum its samples by stage and operation "
                             "(benchmarks.speed.profile; pip install pyinstrument; slower, the times are marked)")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="folder holding imagenet-sample")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--task-dir", type=Path, help="where the tasks are built and reused (default: "
                        "OUTPUT_DIR/pipeline_speed/tasks)")
    return parser


def build_tasks(args, folder: Path) -> dict:
    tasks = {}
    if "detect" in args.tasks:
        tasks["detect"] = build_detect_task(folder, args.data, args.copies, args.distractors)
    if "dedup" in args.tasks:
        tasks["dedup"] = build_dedup_task(folder, args.data, args.originals, args.twice, args.seed)
    return tasks


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or (args.no_working_tree and not args.revision):
        raise SystemExit("--repeats and --threads must be >= 1; --no-working-tree needs a --revision")
    if args.profile and importlib.util.find_spec("pyinstrument") is None:
        raise SystemExit("--profile needs pyinstrument: pip install pyinstrument")
    if not (Path(args.data) / "imagenet-sample-splits.csv").is_file():
        print(f"skipped: {args.data / 'imagenet-sample-splits.csv'} not found (the shared benchmark data is only "
              "present in CI and dev sessions)")
        return 0
    args.output_dir, args.data = Path(args.output_dir).resolve(), Path(args.data).resolve()  # runs start elsewhere
    work = args.output_dir / "pipeline_speed"
    tasks = build_tasks(args, Path(args.task_dir).resolve() if args.task_dir else work / "tasks")
    codes = {} if args.no_working_tree else {working_tree_label(): REPO_ROOT}
    try:
        for revision in args.revision:
            codes[f"{revision} ({_git('rev-parse', '--short=12', revision)})"] = checkout_revision(
                revision, work / "revisions")
        record = measure_all(args, tasks, codes, work)
    finally:  # the checkouts are registered in the repository: removed again
        for root in codes.values():
            if root != REPO_ROOT:
                _git("worktree", "remove", "--force", str(root))
    print_table(record["summary"])
    if args.profile:
        print("(every run under pyinstrument: its times include the profiler's overhead)")
    print(f"written to {Path(args.output_dir) / 'pipeline_speed.json'}")
    return 0


def measure_all(args, tasks: dict, codes: dict, work: Path) -> dict:
    """Every run, repeat by repeat, code by code, task by task (alternated: a change of load hits each of them);
    the record is written after every run."""
    record = {"kind": "pipeline_speed", "machine": machine_info(), "command": command_line(), "created": now(),
              "threads": args.threads, "env": parse_env(args.env),
              "tasks": {name: {k: v for k, v in task.items() if k != "groups"} for name, task in tasks.items()},
              "codes": {label: {"root": str(root), "imports": imported_from(root, args.threads)}
                        for label, root in codes.items()},
              "commands": {name: "copynce " + shlex.join(task_command(name, task, Path("OUT"),
                                                                    getattr(args, f"{name}_options")))
                           for name, task in tasks.items()}, "runs": []}
    path = Path(args.output_dir) / "pipeline_speed.json"
    for repeat in range(args.repeats):
        for label, root in codes.items():
            for name, task in tasks.items():
                run = measure(name, task, label, root, work, repeat, args)
                print(f"{label} {name} #{repeat}: {run['wall_seconds']:.1f} s wall, {run['cpu_seconds']:.1f} s CPU, "
                      f"load {run['load_before']:.2f} -> {run['load_after']:.2f}, {run['quality']}", flush=True)
                record["runs"].append(run)
                record["summary"] = summarise(record["runs"])
                write_json(path, record)
    return record


if __name__ == "__main__":
    raise SystemExit(main())
