"""Train the benchmark's models: baseline and CopyNCE descriptors (and matchers), identical budgets.

    python -m benchmarks.training.train --minutes 25                 # calibrate steps for 25 min, train all
    python -m benchmarks.training.train --max-steps 750 --seeds 0 1  # explicit step count
    python -m benchmarks.training.train --max-steps 750 --matchers copynce baseline --matcher-max-steps 600
    python -m benchmarks.training.train --dry-run ...                # print the commands only

What it does (paper Tables "Ablation studies" ask the same question at scale):

1. Makes ``<output-dir>/train_split/``: links to the ``train`` split of
   ``../shared/data/imagenet-sample`` (never the reference or distractor images); with
   ``--train-images N`` a seeded N of them; with ``--instances grid2`` (or ``photos,procedural560``, ...)
   instances made of them (``copynce_hf.data.instances``), the 40 held-out photos whole and last.
2. For every seed and variant, runs ``accelerate launch scripts/train.py --config
   configs/bench_descriptor.yaml`` with *the same* steps, batch, recipe and seed; the only
   difference between ``baseline`` and ``copynce`` is ``--model.copynce_weight 0``. Then the
   matchers (``configs/bench_matcher.yaml``) the same way, if asked.
3. Runs up to ``--parallel`` trainings at a time, each pinned to its own core (``taskset`` and
   ``OMP_NUM_THREADS=1``, so torch uses one thread), with data loading in the training process
   (``dataloader_num_workers: 0``).
4. With ``--minutes``, first measures the seconds per step of the slowest variant (the CopyNCE
   one) in a short calibration run under the same parallel load, and sets ``max_steps`` so that
   a run takes about that long; every variant then gets that same step count.

Each run writes its model folder to ``<output-dir>/runs/<kind>-<variant>-seed<k>/`` (what
``python -m benchmarks.quality.systems`` discovers), its log to ``train.log`` there, and ``run.json``
(command, start, end, wall time, return code) as soon as it ends. Finished runs are skipped
when the driver is started again (``--force`` retrains).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from copynce_hf.data.instances import InstancePlan, make_instances, read_manifest
from copynce_hf.evaluation.minidisc import read_splits
from copynce_hf.modeling.errors import ConfigError

from ..common import DEFAULT_OUTPUT_DIR, REPO_ROOT, machine_info, now, read_json, write_json
from ..minidisc import SHARED_DATA

logger = logging.getLogger("benchmarks.training.train")

__all__ = ["TrainingRun", "prepare_train_split", "instance_split", "plan_runs", "launch", "run_all", "calibrate", "main"]

#: Variant -> model overrides. Everything else is identical between the variants.
VARIANTS = {"copynce": {}, "baseline": {"copynce_weight": 0}}
CONFIGS = {"descriptor": REPO_ROOT / "configs" / "bench_descriptor.yaml",
           "matcher": REPO_ROOT / "configs" / "bench_matcher.yaml"}


@dataclass
class TrainingRun:
    """One training run: ``kind`` (descriptor / matcher), ``variant`` (copynce / baseline), ``seed``."""

    kind: str
    variant: str
    seed: int
    max_steps: int
    output_dir: Path
    dataset: Path
    config: Path
    extra: list[str] = field(default_factory=list)
    gpu: bool = False
    processes: int = 1
    resume: bool = False

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.variant}-seed{self.seed}"

    @property
    def folder(self) -> Path:
        return self.output_dir / self.name

    def command(self, port: int | None = None) -> list[str]:
        """``accelerate launch`` (``processes`` CPU processes, or one GPU with bf16) of ``scripts/train.py``.

        With ``resume``, the run continues from its newest complete checkpoint (``--resume latest``;
        none yet: it starts fresh), so a run cut short by the end of a session goes on where it stopped.
        Several CPU processes meet on ``port`` (``None``: a port free now, see :func:`free_port`).
        """
        if self.gpu:
            device = ["--mixed_precision", "bf16"]
        elif self.processes > 1:  # Accelerate runs several local CPU processes (gloo) through torchrun only
            device = ["--multi_gpu", "--mixed_precision", "no",  # with ACCELERATE_USE_CPU (environment())
                      "--main_process_port", str(port or free_port())]
        else:
            device = ["--mixed_precision", "no", "--cpu"]
        command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(self.processes),
                   "--num_machines", "1",
                   "--dynamo_backend", "no", *device,
                   str(REPO_ROOT / "scripts" / "train.py"), "--config", str(self.config),
                   "--dataset", str(self.dataset), "--output_dir", str(self.folder), "--seed", str(self.seed),
                   "--max_steps", str(self.max_steps)]
        for key, value in VARIANTS[self.variant].items():
            command += [f"--model.{key}", str(value)]
        return command + list(self.extra) + (["--resume", "latest"] if self.resume else [])

    def environment(self) -> dict[str, str]:
        """Variables the launch needs beyond the thread counts: ``ACCELERATE_USE_CPU`` for several CPU processes."""
        return {"ACCELERATE_USE_CPU": "true"} if self.processes > 1 and not self.gpu else {}

    def display_command(self, port: int | None = None) -> str:
        """:meth:`command` as a user would type it: ``accelerate launch``, paths relative to the repository."""
        command = ["accelerate", "launch"] + self.command(port)[3:]
        variables = " ".join(f"{name}={value}" for name, value in self.environment().items())
        return (variables + " " if variables else "") + shlex.join(_relative(part) for part in command)

    def finished(self) -> bool:
        record = self.folder / "run.json"
        if not record.is_file() or not (self.folder / "config.json").is_file():
            return False
        data = read_json(record)
        return data.get("returncode") == 0 and data.get("max_steps") == self.max_steps


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (bound to port 0, read back), where a multi-process run's processes meet:
    never a fixed one, which two runs on one machine (or torchrun's default 29500 of other jobs) would share."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _relative(part: str) -> str:
    try:
        return str(Path(part).resolve().relative_to(REPO_ROOT)) if part.startswith("/") else part
    except ValueError:
        return part


def prepare_train_split(output_dir: Path, image_folder: Path, splits_csv: Path, train_images: int | None = None,
                        held_out: int = 40, subset_seed: int = 0, instances: str | None = None,
                        instance_seed: int = 0) -> Path:
    """``<output_dir>/train_split/`` holding symbolic links to the ``train`` split's images only.

    With ``train_images``, only that many of the images the runs train on (all but the split's last
    ``held_out``, the runs' periodic evaluation) are linked, drawn with ``subset_seed``; the held-out images
    stay, last in name order, so every point of an instance-scaling curve is evaluated on the same photos.
    A smaller draw is a subset of a larger one (one seeded order, cut at ``train_images``).

    With ``instances`` (an :meth:`InstancePlan.parse <copynce_hf.data.instances.InstancePlan.parse>` spec such as
    ``"grid2"`` or ``"photos,procedural560"``), the folder holds instead the instances made of those training
    photos (seeded by ``instance_seed``; see :func:`instance_split`), and the held-out images, whole and last.
    """
    files = sorted(read_splits(splits_csv, image_folder).get("train", []), key=lambda path: path.name)
    if not files:
        raise SystemExit(f"no train image listed in {splits_csv}")
    training, evaluation = files[:len(files) - held_out], files[len(files) - held_out:]
    if train_images is not None:
        if not 2 <= train_images <= len(training):
            raise SystemExit(f"--train-images {train_images}: the split has {len(training)} training images "
                             f"(besides the {held_out} held out); choose 2 to {len(training)}")
        order = random.Random(subset_seed).sample(training, len(training))
        training = sorted(order[:train_images], key=lambda path: path.name)
    folder = Path(output_dir) / "train_split"
    if instances:
        return instance_split(folder, training, evaluation, instances, instance_seed)
    files = training + evaluation
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {path.name for path in files}
    for stale in folder.iterdir():  # an earlier split definition must not leak into training
        if stale.name not in wanted:
            stale.unlink()
    for path in files:
        link = folder / path.name
        if not link.exists():
            link.symlink_to(path.resolve())
    return folder


def instance_split(folder: Path, training: list[Path], evaluation: list[Path], spec: str, seed: int = 0,
                   link: bool = True) -> Path:
    """``folder`` holding the instances ``spec`` makes of the ``training`` photos (never of the ``evaluation``
    photos, linked whole after them in name order: the runs hold out the folder's last ``len(evaluation)``
    images, as without instances). A folder already made with the same spec, seed and photos is kept. ``link``:
    whole photos as symbolic links (``False``: copies, for a folder that travels)."""
    try:
        plan = InstancePlan.parse(spec)
    except ConfigError as error:
        raise SystemExit(f"--instances: {error}") from None
    made = read_manifest(folder) if folder.is_dir() else None
    settings = {**dataclasses.asdict(plan), "seed": seed, "held_out": len(evaluation), "link": link}
    if (made and made["settings"] == settings and made.get("photos") == [str(path) for path in training]
            and made.get("held_out_photos") == [str(path) for path in evaluation]
            and all((folder / record["file"]).exists() for record in made["instances"])):
        logger.info("train split: the %d files made before (%s, seed %d) kept", len(made["instances"]), spec, seed)
        return folder
    if folder.is_dir():  # links of an earlier split, or instances of another spec
        for stale in folder.iterdir():
            if stale.is_file() or stale.is_symlink():
                stale.unlink()
    try:
        make_instances(training, folder, plan, seed=seed, held_out=evaluation, link=link, progress=True)
    except ConfigError as error:
        raise SystemExit(f"--instances {spec}: {error}") from None
    return folder


def plan_runs(kind: str, variants: list[str], seeds: list[int], max_steps: int, runs_dir: Path, dataset: Path,
              extra: list[str] = (), gpu: bool = False, processes: int = 1,
              resume: bool = False) -> list[TrainingRun]:
    """Seed-major order (seed 0 of every variant first), so that a cut-short session still compares."""
    return [TrainingRun(kind, variant, seed, max_steps, runs_dir, dataset, CONFIGS[kind], list(extra), gpu,
                        processes, resume)
            for seed in seeds for variant in variants]


def ensure_knn_graph(kind: str, dataset: Path, dry_run: bool = False) -> Path | None:
    """Build the hard-negative k-NN graph that ``CONFIGS[kind]`` names, if it does not exist yet.

    The graph is computed on ``dataset`` (the train split) with the config's ``init_from_dino``
    model (the matcher's starting point) and ``hard_negative_k`` neighbours, by ``scripts/build_knn.py``.
    """
    import yaml

    config = yaml.safe_load(CONFIGS[kind].read_text())
    if not config.get("knn_graph"):
        return None
    graph = REPO_ROOT / config["knn_graph"]
    if graph.exists():
        return graph
    model = config.get("init_from_dino") or "facebook/dino-vits16"
    command = [sys.executable, str(REPO_ROOT / "scripts" / "build_knn.py"), "--dataset", str(dataset),
               "--model", str(REPO_ROOT / model) if (REPO_ROOT / model).exists() else model,
               "--k", str(config.get("hard_negative_k") or 8), "--output", str(graph)]
    logger.info("building the k-NN graph: %s", " ".join(command))
    if not dry_run:
        subprocess.run(command, check=True, cwd=REPO_ROOT, env=_environment(os.cpu_count() or 1))
    return graph


def _environment(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "OPENBLAS_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))})
    return env


def launch(run: TrainingRun, core: str | None, threads: int = 1, dry_run: bool = False):
    """Start ``run`` in the background (pinned to ``core``, e.g. ``"1"`` or ``"0,1"``, with ``taskset`` when available)."""
    port = free_port()
    command = run.command(port)
    if core is not None and shutil.which("taskset"):
        command = ["taskset", "-c", str(core)] + command
    logger.info("%s: %s", run.name, " ".join(command))
    if dry_run:
        return None
    if run.folder.exists() and not run.resume:  # never mix a new run with the checkpoints of an older one
        shutil.rmtree(run.folder)
    run.folder.mkdir(parents=True, exist_ok=True)
    log = open(run.folder / "train.log", "a" if run.resume else "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                               env={**_environment(threads), **run.environment()})
    display = ("taskset -c " + str(core) + " " if command[0] == "taskset" else "") + run.display_command(port)
    return process, log, time.time(), display


def core_groups(cores: list[int], parallel: int, processes: int = 1) -> list[str]:
    """The ``taskset`` core list of each of ``parallel`` runs of ``processes`` processes: ``processes`` cores each.

    >>> core_groups([0, 1], parallel=2)
    ['0', '1']
    >>> core_groups([0, 1], parallel=1, processes=2)
    ['0,1']
    """
    needed = parallel * processes
    if len(cores) < needed:
        logger.warning("fewer cores (%s) than runs x processes (%d): they will share cores", cores, needed)
        cores = (list(cores) * needed)[:needed]
    return [",".join(str(core) for core in cores[i * processes:(i + 1) * processes]) for i in range(parallel)]


def run_all(runs: list[TrainingRun], cores: list[str | None], threads: int = 1, dry_run: bool = False,
            force: bool = False) -> list[dict]:
    """Run ``runs``, ``len(cores)`` at a time; write ``run.json`` for each as it ends.

    Returns:
        One record per run: name, command, core, start/end, wall seconds, return code, max_steps.
    """
    pending = [run for run in runs if force or dry_run or not run.finished()]
    for run in runs:
        if run not in pending:
            logger.info("%s: already trained (%s), skipped", run.name, run.folder)
    free = list(cores)
    active: dict = {}
    records = []
    while pending or active:
        while pending and free:
            run, core = pending.pop(0), free.pop(0)
            started = launch(run, core, threads, dry_run)
            if started is None:
                free.append(core)
                continue
            active[run.name] = (run, core, *started)
        finished = []
        for name, (run, core, process, log, start, command) in active.items():
            if process.poll() is None:
                continue
            log.close()
            record = {"name": name, "kind": run.kind, "variant": run.variant, "seed": run.seed,
                      "max_steps": run.max_steps, "core": core, "command": command,
                      "start": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)), "end": now(),
                      "wall_seconds": time.time() - start, "returncode": process.returncode}
            write_json(run.folder / "run.json", record)
            records.append(record)
            level = logging.INFO if process.returncode == 0 else logging.ERROR
            logger.log(level, "%s: finished with code %d in %.0f s (log %s)", name, process.returncode,
                       record["wall_seconds"], run.folder / "train.log")
            finished.append(name)
            free.append(core)
        for name in finished:
            del active[name]
        if active:
            time.sleep(2.0)
    return records


def calibrate(kind: str, minutes: float, cores: list[str | None], dataset: Path, work_dir: Path,
              steps: int = 30, threads: int = 1) -> dict:
    """Seconds per optimiser step of the CopyNCE variant, under the parallel load of a real batch of runs.

    Runs ``len(cores)`` short trainings at once (``steps`` steps, logging every 5), reads the logged
    pairs per second of each window after the first (start-up and first batches excluded), and
    returns ``{"seconds_per_step", "max_steps"}`` with ``max_steps = minutes * 60 / seconds_per_step``
    (the periodic evaluation and checkpointing add a little on top).
    """
    import yaml

    batch = yaml.safe_load(CONFIGS[kind].read_text())["per_device_train_batch_size"]
    runs = [TrainingRun(kind, "copynce", index, steps, work_dir, dataset, CONFIGS[kind],
                        ["--logging_steps", "5", "--eval_steps", str(10 * steps), "--checkpointing_steps",
                         str(10 * steps), "--num_eval_images", "0", "--report_to", "none"])
            for index in range(len(cores))]
    records = {record["name"]: record for record in run_all(runs, cores, threads, force=True)}
    rates = []
    for run in runs:
        if records[run.name]["returncode"] != 0:
            raise SystemExit(f"calibration run failed, see {run.folder / 'train.log'}")
        history = read_json(run.folder / "training_summary.json")["history"]
        rates += [h["train/pairs_per_second"] for h in history if "train/pairs_per_second" in h][1:]
    if not rates:
        raise SystemExit("calibration logged no throughput; use more --calibration-steps")
    rates.sort()
    seconds_per_step = batch / rates[len(rates) // 2]
    shutil.rmtree(work_dir, ignore_errors=True)
    return {"seconds_per_step": seconds_per_step, "max_steps": max(1, int(minutes * 60 / seconds_per_step)),
            "minutes": minutes, "parallel_runs": len(cores)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--max-steps", type=int, help="optimiser steps of every descriptor run")
    budget.add_argument("--minutes", type=float, help="wall-time budget per descriptor run; steps calibrated")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=["baseline", "copynce"], choices=sorted(VARIANTS))
    parser.add_argument("--matchers", nargs="*", default=[], choices=sorted(VARIANTS),
                        help="matcher variants to train after the descriptors (default none)")
    parser.add_argument("--matcher-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--matcher-max-steps", type=int, default=None,
                        help="matcher steps (default: calibrated with --minutes, else --max-steps)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time, each on --processes-per-run cores")
    parser.add_argument("--processes-per-run", type=int, default=1,
                        help="CPU processes of each run (accelerate launch --num_processes), each pinned to a "
                             "core of its own; the global batch is --per_device_train_batch_size x this")
    parser.add_argument("--resume", action="store_true",
                        help="continue unfinished runs from their newest complete checkpoint instead of "
                             "starting them again (a run longer than a session)")
    parser.add_argument("--cores", type=int, nargs="+", default=None,
                        help="cores to pin the runs to, --processes-per-run per run (default: the first available)")
    parser.add_argument("--gpu", action="store_true",
                        help="train on the GPU (bf16, runs not pinned to cores); the matcher rows of BENCHMARKS.md")
    parser.add_argument("--calibration-steps", type=int, default=30)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--image-folder", type=Path, default=SHARED_DATA / "imagenet-sample")
    parser.add_argument("--splits-csv", type=Path, default=SHARED_DATA / "imagenet-sample-splits.csv")
    parser.add_argument("--force", action="store_true", help="retrain runs that already finished")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--train-images", type=int, default=None,
                        help="train on this many of the split's training photos (a seeded subset; the 40 held "
                             "out for the runs' evaluation stay): one point of an instance-scaling curve")
    parser.add_argument("--subset-seed", type=int, default=0, help="the draw of --train-images")
    parser.add_argument("--instances", default=None,
                        help="train on instances made of the training photos instead of the photos: a comma-separated "
                             "list of photos (the whole photos), grid<N> (N x N cells of each photo; grid2gap0.05: "
                             "5%% bands left out), collage<N>, cutmix<N>, procedural<N>, e.g. grid2 or "
                             "photos,procedural560 (copynce_hf.data.instances; the 40 held-out photos stay whole)")
    parser.add_argument("--instance-seed", type=int, default=0, help="the draws of --instances (mixes, procedural)")
    parser.epilog = "Arguments after -- are passed to every scripts/train.py run (e.g. -- --learning_rate 5e-4)."
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    cores = core_groups(args.cores or available, args.parallel, args.processes_per_run)
    if args.gpu:  # the runs share the GPU and all cores (their data-loader workers)
        cores = [None] * args.parallel
    output_dir = args.output_dir
    runs_dir = output_dir / "runs"
    dataset = prepare_train_split(output_dir, args.image_folder, args.splits_csv, args.train_images,
                                  subset_seed=args.subset_seed, instances=args.instances,
                                  instance_seed=args.instance_seed)
    started = time.perf_counter()
    plan = {"machine": machine_info(), "started": now(), "seeds": args.seeds, "variants": args.variants,
            "cores": cores, "extra": extra, "train_images": args.train_images, "subset_seed": args.subset_seed,
            "instances": args.instances, "instance_seed": args.instance_seed}
    if args.minutes is not None and not args.dry_run:
        plan["descriptor_calibration"] = calibrate("descriptor", args.minutes, cores, dataset,
                                                   output_dir / "calibration", args.calibration_steps)
        max_steps = plan["descriptor_calibration"]["max_steps"]
        logger.info("calibrated: %.2f s/step -> %d steps in %.1f min", plan["descriptor_calibration"]
                    ["seconds_per_step"], max_steps, args.minutes)
    else:
        max_steps = args.max_steps or 1
    plan["descriptor_max_steps"] = max_steps
    runs = plan_runs("descriptor", args.variants, args.seeds, max_steps, runs_dir, dataset, extra, args.gpu,
                     args.processes_per_run, args.resume)
    records = run_all(runs, cores, dry_run=args.dry_run, force=args.force)
    if args.matchers:
        matcher_steps = args.matcher_max_steps
        if matcher_steps is None and args.minutes is not None and not args.dry_run:
            plan["matcher_calibration"] = calibrate("matcher", args.minutes, cores, dataset,
                                                    output_dir / "calibration", args.calibration_steps)
            matcher_steps = plan["matcher_calibration"]["max_steps"]
        matcher_steps = matcher_steps or max_steps
        plan["matcher_max_steps"] = matcher_steps
        ensure_knn_graph("matcher", dataset, args.dry_run)
        runs = plan_runs("matcher", args.matchers, args.matcher_seeds, matcher_steps, runs_dir, dataset, extra,
                         args.gpu, args.processes_per_run, args.resume)
        records += run_all(runs, cores, dry_run=args.dry_run, force=args.force)
    plan.update({"finished": now(), "wall_seconds": time.perf_counter() - started, "runs": records})
    if not args.dry_run:
        write_json(output_dir / "training_plan.json", plan)
    failed = [r["name"] for r in records if r["returncode"] != 0]
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)} (see their train.log)")
    return records


if __name__ == "__main__":
    main()
