"""Render the benchmark results (saved JSON) as Markdown tables and PNG plots for BENCHMARKS.md.

    python -m benchmarks.report                  # -> outputs/benchmarks/report.md + benchmarks/figures/
    python -m benchmarks.report --output /tmp/B.md --figures-dir /tmp/figs

Reads what the other entry points wrote (nothing is recomputed):

* ``<results-dir>/<system>.json`` from ``python -m benchmarks.quality.systems`` (metrics, PR curves);
* ``<results-dir>/runs/*/training_summary.json`` and ``run.json`` from ``python -m benchmarks.training.train``
  (loss history, steps, wall time, command) and ``<results-dir>/training_plan.json``;
* ``<results-dir>/speed.json`` from ``python -m benchmarks.speed.parts``.

Writes the quality table (every seed and the per-variant mean), the precision-recall curves of
all systems in one PNG (:func:`copynce_hf.metrics.plots.save_pr_curves`), the training loss
curves in one PNG, the speed tables, the commands and the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import defaultdict
from pathlib import Path

from .common import DEFAULT_OUTPUT_DIR, REPO_ROOT, read_json

__all__ = ["load_quality", "load_runs", "quality_table", "data_section", "speed_section", "save_loss_curves", "save_png", "render", "main"]

_FAMILY_ORDER = {"hash": 0, "random": 1, "descriptor": 2, "matcher": 3}
_LOSS_KEYS = ("train/loss", "train/infonce_loss", "train/copynce_loss", "train/koleo_loss", "train/bce_loss",
              "eval/micro_ap")


def load_quality(results_dir: Path) -> list[dict]:
    """Every quality record in ``results_dir`` (files whose ``kind`` is ``quality``), in table order."""
    records = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            record = read_json(path)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "quality":
            records.append(record)
    fingerprints = {r["task"]["fingerprint"] for r in records}
    if len(fingerprints) > 1:
        raise SystemExit(f"results in {results_dir} come from different mini-DISC tasks {sorted(fingerprints)}: "
                         "re-run the systems on one task (or move the stale files away)")
    return sorted(records, key=lambda r: (_FAMILY_ORDER.get(r.get("family"), 9), r.get("variant") or "",
                                          r.get("seed") if r.get("seed") is not None else -1, r["system"]))


def load_runs(runs_dir: Path) -> dict[str, dict]:
    """``{run name: {"summary": training_summary.json, "run": run.json}}`` of the training runs."""
    runs = {}
    if not Path(runs_dir).is_dir():
        return runs
    for folder in sorted(Path(runs_dir).iterdir()):
        summary = folder / "training_summary.json"
        if summary.is_file():
            runs[folder.name] = {"summary": read_json(summary),
                                 "run": read_json(folder / "run.json") if (folder / "run.json").is_file() else {}}
    return runs


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _group_name(record: dict) -> str:
    """Systems that differ only by seed share a group (``descriptor-copynce``)."""
    if record.get("seed") is not None and record.get("variant"):
        return f"{record['family']}-{record['variant']}"
    return record["system"]


def quality_table(records: list[dict], runs: dict[str, dict]) -> str:
    """Markdown table: one row per system (each seed), plus a mean row per multi-seed group."""
    header = ("| system | seed | muAP | RP90 | recall@1 | recall@10 | mAP | training steps | training wall (min) "
              "| eval wall (s) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[_group_name(record)].append(record)
    for group, members in groups.items():
        for record in members:
            m = record["metrics"]
            run = runs.get(record["system"], {})
            summary = run.get("summary", {})
            wall = run.get("run", {}).get("wall_seconds")
            lines.append(f"| {record['system']} | {_fmt(record.get('seed'))} | {_fmt(m['micro_ap'])} | "
                         f"{_fmt(m['recall_at_p90'])} | {_fmt(m['recall_at_rank1'])} | {_fmt(m['recall_at_rank10'])} | "
                         f"{_fmt(m['mean_ap'])} | {_fmt(summary.get('steps'))} | "
                         f"{_fmt(None if wall is None else wall / 60, 1)} | {_fmt(record['wall_seconds'], 1)} |")
        if len(members) > 1:
            keys = ("micro_ap", "recall_at_p90", "recall_at_rank1", "recall_at_rank10", "mean_ap")
            means = {k: statistics.mean(r["metrics"][k] for r in members) for k in keys}
            spread = statistics.stdev(r["metrics"]["micro_ap"] for r in members)
            lines.append(f"| **{group} (mean of {len(members)})** | - | **{_fmt(means['micro_ap'])}** "
                         f"(sd {spread:.4f}) | **{_fmt(means['recall_at_p90'])}** | **{_fmt(means['recall_at_rank1'])}** "
                         f"| {_fmt(means['recall_at_rank10'])} | {_fmt(means['mean_ap'])} | | | |")
    return header + "\n".join(lines) + "\n"


def save_loss_curves(runs: dict[str, dict], path: Path, dpi: int = 110) -> Path | None:
    """One PNG: a panel per logged loss part (and the held-out muAP), a line per run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    present = [key for key in _LOSS_KEYS
               if any(key in h for run in runs.values() for h in run["summary"].get("history", []))]
    if not present:
        return None
    columns = min(3, len(present))
    rows = (len(present) + columns - 1) // columns
    figure = Figure(figsize=(5 * columns, 3.6 * rows), dpi=dpi)
    FigureCanvasAgg(figure)
    for index, key in enumerate(present):
        axes = figure.add_subplot(rows, columns, index + 1)
        for name, run in runs.items():
            points = [(h["step"], h[key]) for h in run["summary"].get("history", []) if key in h]
            if points:
                steps, values = zip(*points)
                axes.plot(steps, values, linewidth=1.2, marker="o" if len(points) < 8 else None, label=name)
        axes.set_title(key.replace("train/", "training ").replace("eval/micro_ap", "held-out train images, muAP"))
        axes.set_xlabel("step")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="x-small")
    return save_png(figure, path)


def save_png(figure, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay out a matplotlib ``figure`` (its axes within ``rect``, figure fractions left, bottom, right, top:
    room for a figure legend) and write it to ``path`` as PNG (parent folders created)."""
    figure.tight_layout(rect=rect)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def data_section(d: dict) -> str:
    """Markdown of the data-pipeline part of ``speed.json``: per size and query recipe, fused rendering
    beside edit by edit (per-stage ms, pairs/s on one core), then the DataLoader rates (fused)."""
    rows, loader_rows = [], []
    for size, entry in d["sizes"].items():
        for recipe, paths in entry["split"].items():
            for path in ("fused", "edit_by_edit"):
                figures = paths[path]
                stages = ", ".join(f"{k} {figures['ms_per_pair'][k]:.2f}" for k in ("decode", "edit", "trace", "collate"))
                rows.append(f"| {size} | {recipe} | {path.replace('_', ' ')} | {stages} | {figures['total_ms']:.2f} | "
                            f"**{figures['pairs_per_second']:.1f}** |")
            rows.append(f"| {size} | {recipe} | fused / edit by edit | edit {100 * paths['edit_ratio']:.0f} %; "
                        f"without the draws {100 * paths['render_ratio']:.0f} % (draws "
                        f"{paths['fused']['ms_per_pair']['draw']:.2f} ms) | | |")
        rates = " / ".join(f"{float(v):.1f}" for v in entry["loader_pairs_per_second"].values())
        loader_rows.append(f"| {size} | {rates} |")
    workers = " / ".join(next(iter(d["sizes"].values()))["loader_pairs_per_second"])
    first = next(iter(d["sizes"].values()))["split"]
    collate = ", ".join(f"{size}: {next(iter(e['split'].values()))['fused']['ms_per_pair']['collate_float']:.2f} ms"
                        for size, e in d["sizes"].items())
    return ("### Training data pipeline\n\n"
            f"{d['source']}; {d['split_pairs']} pairs per round, {d['rounds']} alternated rounds of fused and "
            f"edit-by-edit rendering on the same pairs ({d['timing']}); `benchmarks/speed/dataloader.py` functions. "
            "Stages per pair: decode (JPEG in draft mode to the maker's max_source_side), edit (source shrink, "
            "query recipe, reference resize, tables; of which the chains' random draws, timed alone with "
            "`CopyEditor.draw`, are the same work in both paths), trace (both overlap priors), collate (uint8 batch "
            f"tensors; the previous float32 normalisation per pair took {collate}). Query recipes: "
            f"{', '.join(first)}.\n\n"
            "| image/patch | query recipe | rendering | ms per pair by stage | total ms | pairs/s, one core |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"DataLoader (training recipe, fused, batch {d['batch_size']}):\n\n"
            f"| image/patch | pairs/s ({workers} workers) |\n|---|---|\n" + "\n".join(loader_rows)
            + f"\n\nCommand: `{d['command']}`\n")


def speed_section(speed: dict) -> str:
    """Markdown of the speed parts present in ``speed.json``."""
    parts = speed.get("parts", {})
    out = []
    if "pixtrace" in parts:
        p = parts["pixtrace"]
        out.append("### PixTrace tables and priors per training pair\n\n"
                   f"{p['setting']}.\n\n| implementation | ms per pair | pairs timed |\n|---|---|---|\n"
                   f"| copynce_hf.pixtrace (analytic tables) | {p['pixtrace_ms_per_pair']:.2f} | {p['pairs']['pixtrace']} |\n"
                   f"| full-resolution dense table warping (benchmarks/speed/dense_tables.py) | {p['dense_ms_per_pair']:.2f} "
                   f"| {p['pairs']['dense']} |\n\nFastest of alternated rounds (median round: "
                   f"{p['median_ms_per_pair']['pixtrace']:.2f} and {p['median_ms_per_pair']['dense']:.2f} ms). "
                   f"Speed-up: **{p['speedup']:.1f}x**. Agreement on 20 pairs: mean L1 "
                   f"distance between the two q->r prior rows {p['mean_l1_row_difference_qr']:.4f}; mean traced share "
                   f"of a query patch {p['mean_traced_share_qr']['pixtrace']:.4f} (PixTrace) vs "
                   f"{p['mean_traced_share_qr']['dense']:.4f} (dense).\n\nCommand: `{p['command']}`\n")
    if "data" in parts:
        out.append(data_section(parts["data"]))
    if "extraction" in parts:
        e = parts["extraction"]
        rows = [f"| {label} | {m['copynce_images_per_second']:.1f} | {m['vit_images_per_second']:.1f} | "
                f"{m['overhead_percent']:+.1f} % | {m['end_to_end_images_per_second']:.1f} |"
                for label, m in e["models"].items()]
        out.append("### Descriptor extraction\n\n"
                   f"Batch {e['batch_size']}, {e['torch_threads']} torch threads, fastest of {e['repeats']} "
                   "alternated repetitions under `torch.inference_mode`. Overhead = bare `ViTModel` rate / our rate - 1 (negative: ours is faster). "
                   f"End to end: {e['end_to_end_setting']}.\n\n"
                   "| model | CopyNCEDescriptorModel img/s | transformers ViTModel img/s | our overhead | "
                   "extract_descriptors img/s |\n|---|---|---|---|---|\n" + "\n".join(rows)
                   + f"\n\nCommand: `{e['command']}`\n")
    if "faiss" in parts:
        f = parts["faiss"]
        rows = []
        for size, kinds in f["sizes"].items():
            for kind, entry in kinds.items():
                if "skipped" in entry:
                    rows.append(f"| {int(size):,} | {kind} | - | - | - | - ({entry['skipped']}) |")
                    continue
                rows.append(f"| {int(size):,} | {kind} (`{entry['factory']}` {entry['search_parameters']}) | "
                            f"{entry['build_seconds']:.1f} | {entry['queries_per_second']:.0f} | "
                            f"{entry['recall_at_10']:.3f} | {entry['found_at_1']:.3f} |")
        out.append("### faiss search\n\n"
                   f"{f['dim']}-d random unit vectors, {f['num_queries']} queries = {f['query_model']}, k = {f['k']}, "
                   f"{f['faiss_threads']} faiss threads. recall@10 = overlap with the exact top-10 (on random data "
                   "ranks 2-10 are near-ties, so this is harsh); found@1 = the query's source ranked first.\n\n"
                   "| database | index | build (s) | queries/s | recall@10 | found@1 |\n|---|---|---|---|---|---|\n"
                   + "\n".join(rows) + f"\n\nCommand: `{f['command']}`\n")
    return "\n".join(out)


def _machine(machine: dict) -> str:
    return (f"{machine.get('cpu')}, {machine.get('cores_available')} cores available "
            f"({machine.get('logical_cores')} logical), {machine.get('memory_gib')} GiB RAM, "
            f"GPU: {machine.get('gpu') or 'none'}; Python {machine.get('python')}, torch {machine.get('torch')}, "
            f"transformers {machine.get('transformers')}, faiss {machine.get('faiss')}")


def render(results_dir: Path, output: Path, figures_dir: Path, runs_dir: Path | None = None) -> str:
    """Write the Markdown report to ``output`` (figures into ``figures_dir``); returns the text."""
    results_dir, output, figures_dir = Path(results_dir), Path(output), Path(figures_dir)
    runs = load_runs(runs_dir or results_dir / "runs")
    records = load_quality(results_dir)
    link = Path(os.path.relpath(figures_dir, output.parent)).as_posix()
    text = ["<!-- generated by python -m benchmarks.report from saved results; edit the narrative around it -->\n"]
    if records:
        from copynce_hf.metrics.plots import save_pr_curves

        task = records[0]["task"]
        curves = {r["system"]: (r["pr_curve"]["precision"], r["pr_curve"]["recall"]) for r in records}
        save_pr_curves(curves, figures_dir / "pr_curves.png", title="mini-DISC precision-recall")
        text.append("## Quality on mini-DISC\n")
        text.append(f"{task['num_references']} references (`reference` split), {task['num_queries']} queries: "
                    f"{task['num_copies']} edited copies of references and {task['num_queries'] - task['num_copies']} "
                    "edited distractors, evaluation recipe `CopyRecipe.minidisc_queries()` (task "
                    f"`{task['fingerprint']}`, seed {task['config']['seed']}). Top-10 references per query, scored "
                    "with `copynce_hf.metrics` (muAP, RP90, recall@1).\n")
        text.append(quality_table(records, runs))
        text.append(f"\n![precision-recall curves]({link}/pr_curves.png)\n")
        loss_png = save_loss_curves(runs, figures_dir / "training_curves.png") if runs else None
        if loss_png is not None:
            text.append(f"\n![training curves]({link}/training_curves.png)\n")
        text.append("\n### Commands\n")
        commands = sorted({r["command"] for r in records})
        text.extend(f"- evaluation: `{c}`" for c in commands)
        plan_path = results_dir / "training_plan.json"
        if plan_path.is_file():
            plan = read_json(plan_path)
            text.append(f"- training driver: {len(plan.get('runs', []))} runs, seeds {plan.get('seeds')}, "
                        f"{plan.get('descriptor_max_steps')} descriptor steps, wall {plan.get('wall_seconds', 0) / 60:.0f} "
                        f"min in total, cores {plan.get('cores')}")
        for name, run in runs.items():
            if run["run"].get("command"):
                text.append(f"- `{name}`: `{run['run']['command']}` ({run['run']['wall_seconds'] / 60:.1f} min)")
        text.append(f"\nMachine: {_machine(records[0]['machine'])}.\n")
    speed_path = results_dir / "speed.json"
    if speed_path.is_file():
        speed = read_json(speed_path)
        text.append("## Speed\n")
        text.append(f"Machine: {_machine(speed['machine'])}.\n")
        text.append(speed_section(speed))
    markdown = "\n".join(text)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(markdown, encoding="utf-8")
    return markdown


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--runs-dir", type=Path, default=None, help="default: <results-dir>/runs")
    # not BENCHMARKS.md itself: the page is written by hand from such tables (and benchmarks/LOG.md keeps each run)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT_DIR / "report.md")
    parser.add_argument("--figures-dir", type=Path, default=REPO_ROOT / "benchmarks" / "figures")
    return parser


def main(argv: list[str] | None = None) -> str:
    args = build_parser().parse_args(argv)
    markdown = render(args.results_dir, args.output, args.figures_dir, args.runs_dir)
    print(f"wrote {args.output} and figures in {args.figures_dir}")
    return markdown


if __name__ == "__main__":
    main()
