"""The compute-scaling curve: mini-DISC quality of descriptors trained for 1x, 2x, 4x ... the budget.

    python -m benchmarks.training.scaling outputs/scaling/steps324 outputs/scaling/steps648 outputs/scaling/steps1296 \\
        --figure benchmarks/figures/scaling.png          # prints the Markdown table, writes the figure

Each positional argument is the ``--output-dir`` of one ``python -m benchmarks.training.train`` call
(``runs/<kind>-<variant>-seed<k>/``) whose descriptors have been scored by ``python -m
benchmarks.quality.systems --systems descriptors --runs-dir DIR/runs --output-dir DIR/quality``. Nothing is
recomputed: the rows come from the quality records (``DIR/quality/<run>.json``: muAP, RP90,
recall@1) and the runs' own files (``training_summary.json``: steps, pairs per process (gradient accumulation included), warm-up, precision,
the held-out train-split muAP; ``run.json``: the command and the wall time).

A *series* is one training setting: the variant (``baseline`` / ``copynce``), the query recipe
(read from the run's command, ``training`` when the command does not set it), the mixed
precision, any other training option the run's command sets (``--learning_rate 2e-3``,
``--model.koleo_scope all_embeddings``, a warm-up that is not the stretched schedule's: a probe is its own
series) and, for the weight average of a
run trained with ``ema_decay``, that decay. Such a run's
trained weights (the ``<run>-without-ema`` record) belong to the series without EMA: the average
does not change the training. The figure has one panel per metric (muAP, RP90, recall@1) with training pairs seen on
a log-2 axis and one line per series (mean over seeds, each seed drawn as a dot).

Two more sources of rows, for runs whose folders are gone or that did not come from the driver::

    python -m benchmarks.training.scaling --table BENCHMARKS.md \
        --continued outputs/gpu/descriptor-run/without_ema outputs/cards/descriptor-copynce-seed0.json 82944 \
        --figure benchmarks/figures/scaling.png

``--table FILE`` reads the rows of a table this module printed before (BENCHMARKS.md keeps it; mean rows are
recomputed, not read); a run read from its folder replaces the table's row of the same series, steps and
seed. ``--continued FOLDER QUALITY PAIRS_BEFORE`` adds a run that continued a model already trained on
``PAIRS_BEFORE`` pairs (``python -m benchmarks.training.gpu``'s descriptor): its point sits at the pairs of
both runs together, in a series of its own (``continued from N pairs, batch B``), with its steps, wall time
and held-out score from ``FOLDER``'s (or, for ``<run>/without_ema``, the run's) ``training_summary.json``
and its mini-DISC scores from the ``python -m benchmarks.quality.systems`` record ``QUALITY``.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from copynce_hf.training.ema import SUMMARY_FILE, run_folder_of
from copynce_hf.training.options import command_option
from copynce_hf.training.saving import training_seconds_of

from ..common import read_json
from ..quality.systems import WITHOUT_EMA_SUFFIX
from ..report import save_png

__all__ = ["ScalingRow", "continued_row", "load_rows", "merge_rows", "scaling_table", "save_scaling_figure",
           "spaced_ticks", "table_rows", "main"]

_METRICS = (("micro_ap", "muAP"), ("recall_at_p90", "RP90"), ("recall_at_rank1", "recall@1"))


@dataclass(frozen=True)
class ScalingRow:
    """One trained descriptor scored on mini-DISC."""

    run: str
    variant: str
    recipe: str
    precision: str
    seed: int
    steps: int
    pairs: int
    wall_minutes: float | None
    metrics: dict
    held_out_micro_ap: float | None
    ema_decay: float | None = None  # set for a run's weight average
    options: str = ""  # the other training options the command sets, e.g. "learning_rate 2e-3"

    @property
    def series(self) -> str:
        ema = "" if self.ema_decay is None else f" / EMA {self.ema_decay:g}"
        options = f" / {self.options}" if self.options else ""
        return f"{self.variant} / {self.recipe} recipe / {self.precision}{options}{ema}"


#: Training options of a run's command that the table shows elsewhere (or that the driver sets per run).
_SHOWN_OPTIONS = {"config", "dataset", "output_dir", "seed", "max_steps", "warmup_steps", "mixed_precision",
                  "query_recipe", "ema_decay", "model.copynce_weight"}

#: Options that change how a run is kept and watched, not what it learns: never part of a series.
_BOOKKEEPING_OPTIONS = {"resume", "checkpointing_steps", "logging_steps", "eval_steps", "report_to"}


#: The curve's schedule shape: 40 warm-up steps per 324 optimiser steps, stretched with the run (80 for
#: 648, ...). A run whose warm-up has another share is a probe and gets its own series.
STRETCHED_WARMUP_SHARE = 40 / 324


def warmup_option(warmup_steps: int | None, steps: int) -> str:
    """``"warmup_steps W"`` when ``W`` is not the stretched schedule's warm-up for ``steps`` (within one
    step), else ``""``."""
    if warmup_steps is None or abs(warmup_steps - STRETCHED_WARMUP_SHARE * steps) <= 1:
        return ""
    return f"warmup_steps {warmup_steps}"


def other_options(command: str) -> str:
    """The ``--key value`` options of a training command (after ``train.py``) outside :data:`_SHOWN_OPTIONS`
    and :data:`_BOOKKEEPING_OPTIONS`, as ``"key value, key value"`` in command order ("" for none)."""
    words = shlex.split(command)
    start = next((i + 1 for i, word in enumerate(words) if word.endswith("train.py")), 0)
    found = []
    for index in range(start, len(words) - 1):
        word = words[index]
        key = word[2:]
        if word.startswith("--") and key not in _SHOWN_OPTIONS | _BOOKKEEPING_OPTIONS and not words[index + 1].startswith("--"):
            found.append(f"{key} {words[index + 1]}")
    return ", ".join(found)


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 60


def load_rows(budget_dirs: list[Path]) -> list[ScalingRow]:
    """Every scored descriptor run under the given ``benchmarks.training.train`` output folders.

    Raises:
        SystemExit: a folder has no ``quality/`` records, or a run lacks its training files.
    """
    rows = []
    for budget_dir in budget_dirs:
        quality_dir = Path(budget_dir) / "quality"
        records = [read_json(path) for path in sorted(quality_dir.glob("descriptor-*.json"))]
        records = [r for r in records if isinstance(r, dict) and r.get("kind") == "quality"]
        if not records:
            raise SystemExit(f"{quality_dir}: no descriptor quality records; run python -m benchmarks.quality.systems "
                             f"--systems descriptors --runs-dir {budget_dir}/runs --output-dir {quality_dir}")
        for record in records:
            trained_weights = record["system"].endswith(WITHOUT_EMA_SUFFIX)
            run_name = record["system"].removesuffix(WITHOUT_EMA_SUFFIX)
            folder = Path(budget_dir) / "runs" / run_name
            summary_path, run_path = folder / "training_summary.json", folder / "run.json"
            if not summary_path.is_file() or not run_path.is_file():
                raise SystemExit(f"{folder}: training_summary.json or run.json missing (not a benchmarks.training.train run)")
            summary, run = read_json(summary_path), read_json(run_path)
            command = run.get("command", "")
            ema_decay = None if trained_weights else summary.get("ema_decay")
            steps, processes = int(summary["steps"]), int(summary.get("num_processes", 1))
            # pairs_per_process counts every micro-batch (gradient accumulation included); a summary written
            # before it existed gives steps x the command's batch
            per_process = summary.get("pairs_per_process") or steps * int(
                command_option(command, "per_device_train_batch_size") or _config_batch(command))
            pairs = int(per_process) * processes
            options = ", ".join(o for o in (warmup_option(summary.get("warmup_steps"), steps), other_options(command)) if o)
            rows.append(ScalingRow(
                run=f"{Path(budget_dir).name}/{record['system']}",
                variant=record.get("variant") or run.get("variant", "?"),
                recipe=command_option(command, "query_recipe") or "training",
                precision={"no": "fp32", None: "fp32"}.get(summary.get("mixed_precision"), str(summary.get("mixed_precision"))),
                seed=int(record.get("seed") if record.get("seed") is not None else run["seed"]),
                steps=steps,
                pairs=pairs,
                wall_minutes=_minutes(training_seconds_of(summary, run.get("wall_seconds"))),
                metrics=record["metrics"],
                held_out_micro_ap=(summary.get("eval_without_ema" if trained_weights else "eval") or {}).get("micro_ap"),
                ema_decay=ema_decay,
                options=options,
            ))
    return sorted(rows, key=lambda r: (r.series, r.pairs, r.seed))


#: The header line :func:`scaling_table` prints; :func:`table_rows` reads the rows below it.
TABLE_HEADER = "| series | steps | pairs seen | seed | muAP | RP90 | recall@1 | held-out train muAP | wall (min) |"


def table_rows(path: Path) -> list[ScalingRow]:
    """The per-run rows of the scaling table in the text file ``path`` (as :func:`scaling_table` printed it),
    without its mean rows; for runs whose folders are gone.

    Raises:
        SystemExit: no such table in the file, or a row whose cells or series cannot be read back.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if TABLE_HEADER not in lines:
        raise SystemExit(f"{path}: no scaling table (a line {TABLE_HEADER!r})")
    rows = []
    for number, line in enumerate(lines[lines.index(TABLE_HEADER) + 2:], start=lines.index(TABLE_HEADER) + 3):
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0].startswith("**"):  # the mean of several seeds: recomputed from the runs' rows
            continue
        try:
            series, steps, pairs, seed, muap, rp90, recall1, held_out, wall = cells
            row = ScalingRow(run=f"{Path(path).name}:{number}", seed=int(seed), steps=int(steps), pairs=int(pairs),
                             wall_minutes=None if wall == "-" else float(wall),
                             metrics={"micro_ap": float(muap), "recall_at_p90": float(rp90),
                                      "recall_at_rank1": float(recall1)},
                             held_out_micro_ap=None if held_out == "-" else float(held_out), **_series_fields(series))
        except ValueError as error:
            raise SystemExit(f"{path}:{number}: not a row of the scaling table ({error}): {line}") from error
        if row.series != series:
            raise SystemExit(f"{path}:{number}: the series {series!r} does not read back (got {row.series!r})")
        rows.append(row)
    return rows


def _series_fields(series: str) -> dict:
    """``variant``, ``recipe``, ``precision``, ``options`` and ``ema_decay`` of a series name."""
    parts = series.split(" / ")
    if len(parts) < 3 or not parts[1].endswith(" recipe"):
        raise ValueError(f"series {series!r} is not 'variant / <recipe> recipe / precision[ / ...]'")
    ema_decay = float(parts.pop().removeprefix("EMA ")) if parts[-1].startswith("EMA ") else None
    return {"variant": parts[0], "recipe": parts[1].removesuffix(" recipe"), "precision": parts[2],
            "options": " / ".join(parts[3:]), "ema_decay": ema_decay}


def continued_row(folder: Path, quality_path: Path, pairs_before: int) -> ScalingRow:
    """The row of a descriptor run that continued a model trained on ``pairs_before`` pairs: pairs seen are both
    runs' together, and the series names the continuation and its batch (see the module docstring).

    Raises:
        SystemExit: the summary or the quality record is missing, or the record is not a descriptor's.
    """
    folder = Path(folder)
    run, trained_weights = run_folder_of(folder)
    summary_path = run / SUMMARY_FILE
    record = read_json(Path(quality_path)) if Path(quality_path).is_file() else None
    if not summary_path.is_file():
        raise SystemExit(f"{summary_path}: missing (the continued run's training_summary.json)")
    if not isinstance(record, dict) or record.get("kind") != "quality" or "metrics" not in record:
        raise SystemExit(f"{quality_path}: not a python -m benchmarks.quality.systems record")
    summary = read_json(summary_path)
    seed = summary.get("seed", record.get("seed"))
    if seed is None:  # summaries written before they recorded the seed, scored under a system name without one
        raise SystemExit(f"{summary_path}: no seed (a summary older than its 'seed' key): add the run's seed there")
    steps, processes = int(summary["steps"]), int(summary.get("num_processes", 1))
    pairs = int(summary["pairs_per_process"]) * processes
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    return ScalingRow(
        run=f"{run.name}/{record['system']}",
        variant="baseline" if config.get("copynce_weight", 1.0) == 0 else "copynce",
        recipe=summary.get("query_recipe") or "training",
        precision={"no": "fp32", None: "fp32"}.get(summary.get("mixed_precision"), str(summary.get("mixed_precision"))),
        seed=int(seed),
        steps=steps,
        pairs=int(pairs_before) + pairs,
        wall_minutes=_minutes(training_seconds_of(summary, summary.get("wall_seconds"))),
        metrics=record["metrics"],
        held_out_micro_ap=(summary.get("eval_without_ema" if trained_weights else "eval") or {}).get("micro_ap"),
        ema_decay=None if trained_weights else summary.get("ema_decay"),
        options=f"continued from {int(pairs_before)} pairs, batch {pairs // (steps * processes)}",
    )


def merge_rows(recorded: list[ScalingRow], measured: list[ScalingRow]) -> list[ScalingRow]:
    """``recorded`` (a table's rows) and ``measured`` (read from the runs' files) in table order; a measured row
    replaces a recorded row of the same series, steps and seed."""
    keys = {(row.series, row.steps, row.seed) for row in measured}
    rows = [row for row in recorded if (row.series, row.steps, row.seed) not in keys] + measured
    return sorted(rows, key=lambda r: (r.series, r.pairs, r.seed))


def _config_batch(command: str) -> int:
    """The batch size of the YAML config named by ``--config`` in the command."""
    import yaml

    config = command_option(command, "config")
    if config is None or not Path(config).is_file():
        raise SystemExit(f"cannot tell the batch size of the run {command!r}: no --per_device_train_batch_size "
                         "and no readable --config")
    return int(yaml.safe_load(Path(config).read_text())["per_device_train_batch_size"])


def _mean(rows: list[ScalingRow], key: str) -> float:
    return statistics.mean(r.metrics[key] for r in rows)


def scaling_table(rows: list[ScalingRow]) -> str:
    """Markdown: one row per run, then per series and budget the mean when several seeds ran."""
    lines = ["| series | steps | pairs seen | seed | muAP | RP90 | recall@1 | held-out train muAP | wall (min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, int], list[ScalingRow]] = defaultdict(list)
    for row in rows:
        groups[(row.series, row.steps)].append(row)
    for (series, steps), members in groups.items():
        for row in members:
            held = "-" if row.held_out_micro_ap is None else f"{row.held_out_micro_ap:.3f}"
            wall = "-" if row.wall_minutes is None else f"{row.wall_minutes:.1f}"
            lines.append(f"| {series} | {steps} | {row.pairs} | {row.seed} | {row.metrics['micro_ap']:.4f} | "
                         f"{row.metrics['recall_at_p90']:.4f} | {row.metrics['recall_at_rank1']:.4f} | {held} | {wall} |")
        if len(members) > 1:
            lines.append(f"| **{series} (mean of {len(members)})** | {steps} | {members[0].pairs} | - | "
                         f"**{_mean(members, 'micro_ap'):.4f}** | {_mean(members, 'recall_at_p90'):.4f} | "
                         f"{_mean(members, 'recall_at_rank1'):.4f} | | |")
    return "\n".join(lines) + "\n"


def spaced_ticks(values: list[int], min_ratio: float = 1.25) -> list[int]:
    """The ascending ``values`` that get a labelled tick on a log axis: each at least ``min_ratio`` times the
    last one kept, so that two runs at nearly the same budget do not print their labels over each other."""
    kept: list[int] = []
    for value in values:
        if not kept or value >= min_ratio * kept[-1]:
            kept.append(value)
    return kept


def save_scaling_figure(rows: list[ScalingRow], path: Path, dpi: int = 110) -> Path:
    """One PNG, a panel per metric: the metric against training pairs seen (log 2), a line per series; a
    colour per series (up to 20) and one legend below the panels, long series names wrapped."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_series: dict[str, list[ScalingRow]] = defaultdict(list)
    for row in rows:
        by_series[row.series].append(row)
    names = sorted(by_series)
    labels = ["\n".join(textwrap.wrap(name, _LEGEND_WIDTH)) for name in names]
    column = math.ceil(len(labels) / 2)  # the legend's two columns, filled column by column
    legend_lines = sum(max(label.count("\n") + 1 for label in labels[i::column]) for i in range(column))
    legend_inches = 0.3 + 0.19 * legend_lines
    figure = Figure(figsize=(15, 4.4 + legend_inches), dpi=dpi)
    FigureCanvasAgg(figure)
    colours = colormaps["tab20" if len(names) > 10 else "tab10"].colors
    for index, (key, label) in enumerate(_METRICS):
        axes = figure.add_subplot(1, len(_METRICS), index + 1)
        for number, (series, legend_label) in enumerate(zip(names, labels)):
            members = by_series[series]
            colour = colours[number % len(colours)]
            budgets = sorted({r.pairs for r in members})
            means = [_mean([r for r in members if r.pairs == p], key) for p in budgets]
            axes.plot(budgets, means, marker="o", linewidth=1.5, label=legend_label, color=colour)
            axes.scatter([r.pairs for r in members], [r.metrics[key] for r in members], s=12, alpha=0.5,
                         color=colour)
        axes.set_xscale("log", base=2)
        budgets = spaced_ticks(sorted({r.pairs for r in rows}))
        axes.set_xticks(budgets, [f"{p:,}" for p in budgets])
        axes.minorticks_off()
        axes.set_xlabel("training pairs seen")
        axes.set_title(f"mini-DISC {label}")
        axes.grid(True, alpha=0.3)
    handles, legend_labels = figure.axes[0].get_legend_handles_labels()  # one legend for the panels, below them
    figure.legend(handles, legend_labels, loc="lower center", ncol=2, fontsize="small", frameon=False)
    return save_png(figure, path, rect=(0, legend_inches / (4.4 + legend_inches), 1, 1))


#: Characters per line of a series name in the figure's legend (two columns across a 15-inch figure).
_LEGEND_WIDTH = 95


def main(argv: list[str] | None = None) -> list[ScalingRow]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("budget_dirs", nargs="*", type=Path, help="benchmarks.training.train --output-dir folders")
    parser.add_argument("--table", type=Path, default=None,
                        help="also the rows of the scaling table in this file (e.g. BENCHMARKS.md)")
    parser.add_argument("--continued", nargs=3, action="append", default=[],
                        metavar=("FOLDER", "QUALITY_JSON", "PAIRS_BEFORE"),
                        help="a run continued from a model trained on PAIRS_BEFORE pairs (repeatable)")
    parser.add_argument("--figure", type=Path, default=None, help="write the scaling figure (PNG) here")
    args = parser.parse_args(argv)
    if not (args.budget_dirs or args.table or args.continued):
        parser.error("give benchmarks.training.train output folders, --table or --continued")
    measured = load_rows(args.budget_dirs) if args.budget_dirs else []
    for folder, quality, pairs_before in args.continued:
        if not pairs_before.isdigit():
            parser.error(f"--continued {folder} {quality} {pairs_before}: PAIRS_BEFORE must be a whole number")
        measured.append(continued_row(Path(folder), Path(quality), int(pairs_before)))
    rows = merge_rows(table_rows(args.table) if args.table else [], measured)
    print(scaling_table(rows), end="")
    if args.figure is not None:
        print(f"figure: {save_scaling_figure(rows, args.figure)}")
    return rows


if __name__ == "__main__":
    main()
