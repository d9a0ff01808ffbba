"""A command's wall and CPU time alone and beside busy processes: does its thread pool spin on cores it lacks?

Each run starts the command as a child process and reads its CPU time (user + system, children included)
from ``resource.getrusage``. First ``--repeats`` runs on an otherwise idle machine, then ``--repeats`` runs
beside ``--busy`` processes that each spin one core, started ``--settle`` seconds before (so that the load average
shows them, as it shows a user's other work). The ratio that matters
is the worst contended CPU time over the median idle CPU time: a thread pool that spins while it waits for
cores it does not get burns CPU time for nothing, so the ratio grows far above 1.

    python -m benchmarks.speed.contention --busy 2 --repeats 3 -- \\
        copynce detect copynce_hf/assets/images --references copynce_hf/assets/images --output DIR

``{run}`` in the command is replaced by the run's number (so that each run can write its own folder). Extra
environment for the command: ``--env NAME=VALUE`` (for example ``--env OMP_NUM_THREADS=2`` to see the
behaviour without the package's thread policy).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shlex
import statistics
import subprocess
import time

from benchmarks.common import DEFAULT_OUTPUT_DIR, command_line, machine_info, now, write_json

__all__ = ["main", "measure", "spin"]


def spin(stop, load: str = "python") -> None:
    """Keep the machine busy until ``stop`` is set: ``python``, one core with a pure-Python loop; ``blas``,
    numpy matrix products on BLAS's own thread pool (every core, as another numerical job would)."""
    if load == "blas":
        import numpy

        matrix = numpy.random.default_rng(0).standard_normal((384, 384))
        while not stop.is_set():
            matrix = numpy.tanh(matrix @ matrix.T / 384.0)
        return
    count = 0
    while not stop.is_set():
        for _ in range(100_000):
            count += 1


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: list[str], env: dict) -> dict:
    """Wall and CPU seconds of one run of ``command`` (its children's CPU time included)."""
    before, start = _children_cpu_seconds(), time.perf_counter()
    result = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall, cpu = time.perf_counter() - start, _children_cpu_seconds() - before
    if result.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return {"wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2)}


def measure(command: list[str], busy: int, repeats: int, env: dict, settle: float = 60.0,
            load: str = "python") -> dict:
    """``repeats`` idle runs, then ``repeats`` runs beside ``busy`` spinning processes, started ``settle`` seconds
    before the first contended run (the load a user's other work has built up, as the load average shows it)."""
    runs = {"idle": [], "contended": []}
    for index in range(repeats):
        runs["idle"].append(run_once([part.replace("{run}", f"idle{index}") for part in command], env))
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=spin, args=(stop, load), daemon=True) for _ in range(busy)]
    for process in spinners:
        process.start()
    try:
        time.sleep(settle)
        for index in range(repeats):
            runs["contended"].append(run_once([part.replace("{run}", f"busy{index}") for part in command], env))
    finally:
        stop.set()
        for process in spinners:
            process.join()
    idle_cpu = statistics.median(run["cpu_seconds"] for run in runs["idle"])
    worst = max(run["cpu_seconds"] for run in runs["contended"])
    return {**runs, "idle_cpu_median": idle_cpu, "contended_cpu_worst": worst,
            "cpu_ratio_worst": round(worst / idle_cpu, 3)}


def _parse_env(items: list[str]) -> dict:
    env = dict(os.environ)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env {item!r}: NAME=VALUE expected")
        env[name] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the command (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs idle and runs contended (default 3)")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds the busy processes run before the first contended run (default 60)")
    parser.add_argument("--load", choices=("python", "blas"), default="python",
                        help="what the busy processes run: a pure-Python loop (one core each) or numpy matrix "
                             "products on BLAS threads (default python)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment of the command")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT_DIR / "contention.json"), help="result file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.busy < 0 or args.repeats < 1:
        parser.error("a command (after --), --busy >= 0 and --repeats >= 1 are needed")
    result = {"created": now(), "machine": machine_info(), "command_line": command_line(), "command": command,
              "busy": args.busy, "repeats": args.repeats, "env": args.env,
              "settle_seconds": args.settle,
              "load": args.load, **measure(command, args.busy, args.repeats, _parse_env(args.env), args.settle,
                                           args.load)}
    write_json(args.output, result)
    print(f"idle CPU (median of {args.repeats}): {result['idle_cpu_median']:.1f} s; beside {args.busy} busy "
          f"processes, worst: {result['contended_cpu_worst']:.1f} s ({result['cpu_ratio_worst']:.2f}x); "
          f"wall idle {[run['wall_seconds'] for run in result['idle']]}, "
          f"contended {[run['wall_seconds'] for run in result['contended']]}; written to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
