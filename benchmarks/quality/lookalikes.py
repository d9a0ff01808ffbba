"""Look-alike negatives: how high do unrelated images that look alike score, against true copies, and how many pass
the thresholds a user meets?

    python -m benchmarks.quality.lookalikes --output outputs/lookalikes --draws 0 1 2   # build, score, measure
    python -m benchmarks.quality.lookalikes --output outputs/lookalikes --table           # the tables of the draws
    python -m benchmarks.quality.lookalikes --output W --descriptors a=DIR b=DIR         # trained descriptors compared

Per draw ``d`` (``OUTPUT/draw-d/``), everything drawn from seeds ``[20251128, d, ...]``:

1. **images** (:mod:`.lookalike_images`): 6 images of each of the 12 look-alike families (procedural textures, photo
   textures, same-style drawings), 24 plain photos of the ``reference`` split and 12 of the ``distractor`` split (none
   of a photo-texture class); every family image and plain photo gets one copy edited with the evaluation recipe
   (``CopyRecipe.minidisc_queries()``, which training never draws), each distractor photo one edited version.
2. **pairs**, scored on the whole images as ``copynce match`` scores them, by the embedded descriptor (cosine) and
   the embedded matcher (copy probability): each family's 15 look-alike pairs (the later image as the query), each
   procedural texture against the image of the same number of every other procedural texture (grass against
   gravel, ...) and every copy against its original.
3. **``copynce detect`` with every default**: ``references/`` = the first 3 images of each family and the 24
   photos; ``queries/`` = their copies, the other 3 images of each family unedited (look-alikes: any match is
   false) and the distractors; ``copynce calibrate references/`` (every default) first, and detect decides with it
   (``--calibration``, precision 0.9).

Measured: each score's distribution on copies and on look-alikes, the share of look-alikes at or above each
threshold a user meets (false-match rate) and of copies (recall): 0.5 (a probability's natural cut, the Space's
verdict before), the model cards' thresholds at precision 0.9 on mini-DISC, and the draw's calibrated thresholds
(the matcher stage's for detect, the descriptor stage's, raw cosines, for the descriptor's pairs).
For ``detect`` a query's score is its best prediction's; a copy counts as found when its own reference is ranked
first at or above the threshold. Results: ``OUTPUT/draw-d/result.json``, the tables with ``--table``.

``--descriptors NAME=MODEL ...`` compares descriptors (a trained model folder, ``onnx:PATH``, or ``embedded``) on
the same draws: steps 1-2 only, each pair scored by each model's cosine, and per model and kind the chance that a copy
outscores a look-alike, with the look-alike and copy medians (``OUTPUT/draw-d/descriptors.json``; no thresholds: a
trained model has no card or calibration of its own here).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import REPO_ROOT, fresh_folder, now, write_json
from benchmarks.minidisc import SHARED_DATA

from .lookalike_images import FAMILIES, KINDS, PHOTO_GROUPS, draw_image, family_kind, photo_group_files

SEED = 20251128
PER_FAMILY, IN_REFERENCES, PHOTOS, DISTRACTORS = 6, 3, 24, 12
#: The thresholds a user meets, by system (``card``: the model card's at precision 0.9; ``calibrated``: the draw's
#: ``copynce calibrate`` threshold at precision 0.9, of its descriptor stage for the descriptor). The matcher's
#: whole-image pairs have no calibrated threshold: a calibration's matcher stage holds detect's scores (content
#: tokens, query crops), not these.
THRESHOLDS = {"descriptor": ("card", "calibrated"), "matcher": ("0.5", "card"),
              "detect": ("0.5", "card", "calibrated")}



def _edited(image, rng: np.random.Generator):
    """``image`` edited by one draw of the evaluation recipe, and the edits' names."""
    from copynce_hf.pixtrace import CoordinateTable, CopyRecipe

    table, names = CoordinateTable.identity(image.height, image.width), []
    for edit in CopyRecipe.minidisc_queries().draw(rng, (image.height, image.width)):
        image, table = edit(image, table)
        names.append(type(edit).__name__)
    return image, names


def draw_photos(data: Path, draw: int) -> dict:
    """The plain photos and distractors of ``draw`` (no photo-texture class among them) and the group files."""
    from copynce_hf.evaluation.minidisc import read_splits

    splits = read_splits(data / "imagenet-sample-splits.csv", data / "imagenet-sample")
    groups = photo_group_files(data / "imagenet-sample", splits["reference"] + splits["distractor"])
    used = {path for files in groups.values() for path in files}
    rng = np.random.default_rng([SEED, draw, 1])
    references = [path for path in splits["reference"] if path not in used]
    distractors = [path for path in splits["distractor"] if path not in used]
    return {"groups": groups,
            "photos": [references[int(i)] for i in rng.permutation(len(references))[:PHOTOS]],
            "distractors": [distractors[int(i)] for i in rng.permutation(len(distractors))[:DISTRACTORS]]}


def build(folder: Path, draw: int, data: Path = SHARED_DATA) -> dict:
    """Write ``images/``, ``copies/``, ``references/``, ``queries/``, ``ground_truth.csv`` and ``truth.json`` of a
    draw into ``folder``; returns the truth (each image's family or photo, each query's role and reference)."""
    from PIL import Image

    chosen = draw_photos(data, draw)
    images, copies, references, queries = (fresh_folder(folder / name) for name in ("images", "copies", "references",
                                                                              "queries"))
    truth = {"draw": draw, "images": {}, "queries": {}}
    for number, family in enumerate(FAMILIES):
        for index in range(PER_FAMILY):
            photo = chosen["groups"][family][index] if family in PHOTO_GROUPS else None
            image = draw_image(family, np.random.default_rng([SEED, draw, 2, number, index]), photo)
            image_id = f"{family}-{index}"
            image.save(images / f"{image_id}.png")
            truth["images"][image_id] = {"family": family, "kind": family_kind(family),
                                         "photo": photo.stem if photo else None}
    for path in chosen["photos"]:
        image_id = f"photo-{path.stem.split('_')[0]}"
        Image.open(path).convert("RGB").save(images / f"{image_id}.png")
        truth["images"][image_id] = {"family": None, "kind": "photo", "photo": path.stem}
    for number, image_id in enumerate(sorted(truth["images"])):
        copy, edits = _edited(Image.open(images / f"{image_id}.png").convert("RGB"),
                              np.random.default_rng([SEED, draw, 3, number]))
        copy.save(copies / f"{image_id}.png")
        truth["images"][image_id]["copy_edits"] = edits
    _detect_folders(folder, truth, chosen["distractors"], draw)
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


def _detect_folders(folder: Path, truth: dict, distractors: list[Path], draw: int) -> None:
    """``references/``, ``queries/`` (ids ``Q000``... shuffled) and ``ground_truth.csv`` of the detect run."""
    from PIL import Image

    in_references = [i for i, record in truth["images"].items()
                     if record["family"] is None or int(i.rsplit("-", 1)[1]) < IN_REFERENCES]
    for image_id in in_references:
        shutil.copyfile(folder / "images" / f"{image_id}.png", folder / "references" / f"{image_id}.png")
    sources = [("copy", folder / "copies" / f"{i}.png", i, truth["images"][i]["kind"]) for i in in_references]
    sources += [("look-alike", folder / "images" / f"{i}.png", None, record["kind"])
                for i, record in truth["images"].items() if record["family"] and i not in in_references]
    sources += [("distractor", path, None, "photo") for path in distractors]
    order = np.random.default_rng([SEED, draw, 4]).permutation(len(sources))
    for number, position in enumerate(order):
        role, path, reference, kind = sources[int(position)]
        query_id = f"Q{number:03d}"
        image = Image.open(path).convert("RGB")
        if role == "distractor":
            image, _ = _edited(image, np.random.default_rng([SEED, draw, 5, number]))
        image.save(folder / "queries" / f"{query_id}.png")
        truth["queries"][query_id] = {"role": role, "reference": reference, "kind": kind,
                                      "source": Path(path).stem}
    with (folder / "ground_truth.csv").open("w", encoding="utf-8") as handle:
        handle.write("query_id,reference_id\n")
        handle.writelines(f"{q},{record['reference'] or ''}\n" for q, record in sorted(truth["queries"].items()))


def score_pairs(folder: Path, truth: dict, batch_size: int = 32,
                models: dict[str, tuple[str | None, str]] | None = None) -> list[dict]:
    """Every pair of step 2 with a score per model (``copynce match``'s scoring path): ``models`` maps a key to
    ``(model, kind)`` as :func:`~copynce_hf.runtime.loading.load_model` takes them (default: the embedded descriptor's
    cosine as ``descriptor``, the embedded matcher's copy probability as ``matcher``)."""
    from copynce_hf.retrieval import Prediction
    from copynce_hf.retrieval.verify.rescoring import rescore_predictions
    from copynce_hf.runtime.loading import load_model

    models = models or {"descriptor": (None, "descriptor"), "matcher": (None, "matcher")}
    pairs = []
    for family in FAMILIES:
        for later in range(1, PER_FAMILY):
            pairs += [(f"{family}-{later}", f"{family}-{earlier}", "look-alike", family) for earlier in range(later)]
    textures = KINDS["procedural texture"]
    pairs += [(f"{a}-{i}", f"{b}-{i}", "cross-texture", f"{a}/{b}") for n, a in enumerate(textures)
              for b in textures[n + 1:] for i in range(PER_FAMILY)]
    files = {i: folder / "images" / f"{i}.png" for i in truth["images"]}
    queries = dict(files) | {f"copy:{i}": folder / "copies" / f"{i}.png" for i in truth["images"]}
    pairs += [(f"copy:{i}", i, "copy", record["family"] or "photo") for i, record in truth["images"].items()]
    candidates = [Prediction(q, r, 0.0) for q, r, *_ in pairs]
    scores = {}
    for system, (name, kind) in models.items():
        model, processor = load_model(name, kind)
        found = rescore_predictions(candidates, model, processor, queries, files, batch_size=batch_size,
                                    progress=False)
        scores[system] = {(p.query_id, p.reference_id): p.score for p in found.predictions}
    return [{"query": q, "reference": r, "role": role, "family": family,
             "kind": truth["images"][r]["kind"] if role != "cross-texture" else "cross-texture",
             **{system: scores[system][(q, r)] for system in scores}} for q, r, role, family in pairs]


def copynce(*argv, log: Path) -> str:
    """Run ``copynce ARGV`` in a fresh process from the repository root; its command and output are appended to
    ``log``; returns its standard output."""
    command = [sys.executable, "-m", "copynce_hf.cli", *map(str, argv)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    with log.open("a", encoding="utf-8") as handle:
        handle.write(f"$ copynce {' '.join(map(str, argv))}\n{done.stdout}{done.stderr[-4000:]}"
                     f"(exit {done.returncode}, {time.perf_counter() - start:.0f} s)\n\n")
    if done.returncode != 0:
        raise RuntimeError(f"copynce {argv[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def planted_as_now(calibration: Path) -> bool:
    """Whether the calibration file's copies were planted with the recipe ``copynce calibrate`` plants now (its name
    and its steps)."""
    from copynce_hf.calibration.synthetic import COPY_RECIPE
    from copynce_hf.pixtrace import CopyRecipe

    provenance = json.loads(calibration.read_text(encoding="utf-8")).get("provenance", {})
    return (provenance.get("recipe_name") == COPY_RECIPE
            and provenance.get("recipe") == CopyRecipe.preset(COPY_RECIPE).to_dict())


def run_detect(folder: Path) -> dict:
    """``copynce calibrate`` then ``copynce detect`` with every default (step 3); returns the calibration's rows at
    precision 0.9 (stage -> row) and the commands' seconds."""
    log, seconds = folder / "commands.log", {}
    calibration = folder / "calibration.json"
    kept = calibration.is_file() and planted_as_now(calibration)  # a file planted with another recipe is made again
    if not kept:
        start = time.perf_counter()
        copynce("calibrate", folder / "references", "--output", calibration, "--quiet", log=log)
        seconds["calibrate"] = time.perf_counter() - start
    if not kept or not (folder / "detect" / "scores.json").is_file():
        start = time.perf_counter()
        copynce("detect", folder / "queries", "--references", folder / "references", "--output", folder / "detect",
                "--ground-truth", folder / "ground_truth.csv", "--calibration", calibration, "--quiet", log=log)
        seconds["detect"] = time.perf_counter() - start
    stages = json.loads(calibration.read_text(encoding="utf-8"))["stages"]
    rows = {stage: next(row for row in stages[stage] if abs(row["precision"] - 0.9) < 1e-9) for stage in stages}
    return {"calibrated": rows, "seconds": seconds}


def detect_scores(folder: Path, truth: dict) -> list[dict]:
    """Each query's best prediction of the detect run: its role, kind, score and whether it names its reference."""
    best: dict[str, tuple[float, str]] = {}
    with (folder / "detect" / "predictions.csv").open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            score = float(row["score"])
            if row["query_id"] not in best or score > best[row["query_id"]][0]:
                best[row["query_id"]] = (score, row["reference_id"])
    rows = []
    for query_id, record in sorted(truth["queries"].items()):
        score, reference = best.get(query_id, (float("-inf"), None))
        family = truth["images"].get(record["source"], {}).get("family") if record["role"] == "look-alike" else None
        rows.append({"query": query_id, **record, "family": family, "score": score, "top": reference,
                     "top_family": truth["images"].get(reference, {}).get("family"),
                     "correct": reference is not None and reference == record["reference"]})
    return rows


def thresholds_of(calibrated: dict) -> dict[str, dict[str, float]]:
    """The thresholds of :data:`THRESHOLDS`: the cards' (read as ``copynce`` reads them) and the draw's calibrated
    ones (``calibrated``: stage -> row): the matcher stage's for detect, the descriptor stage's (raw cosines of whole
    images, what ``detect --matcher none`` decides with) for the descriptor's pairs."""
    from copynce_hf.calibration.meaning import card_threshold

    found = {}
    for system, names in THRESHOLDS.items():
        kind = "descriptor" if system == "descriptor" else "matcher"
        values = {"0.5": 0.5, "card": card_threshold(None, kind).threshold,
                  "calibrated": calibrated[kind]["threshold"]}
        found[system] = {name: values[name] for name in names}
    return found


def auc(positives: list[float], negatives: list[float]) -> float | None:
    """The chance that a copy outscores a look-alike (ties count half); ``None`` without both."""
    if not positives or not negatives:
        return None
    p, n = np.asarray(positives)[:, None], np.asarray(negatives)[None, :]
    return float((p > n).mean() + 0.5 * (p == n).mean())


def _spread(scores: list[float], quantiles=(0.5, 0.9, 1.0)) -> list[float | None]:
    return [float(np.quantile(scores, q)) if scores else None for q in quantiles]


def scores_by_role(pairs: list[dict], score: str, kind: str) -> tuple[list[float], list[float]]:
    """The ``score`` of the pairs of one kind of image: the look-alike (and cross-texture) pairs', the copies'."""
    negatives = [p[score] for p in pairs if p["role"] != "copy" and p["kind"] == kind]
    positives = [p[score] for p in pairs if p["role"] == "copy" and p["kind"] == kind]
    return negatives, positives


def summarise(pairs: list[dict], detect: list[dict], thresholds: dict) -> dict:
    """Per system and kind: look-alike scores (median, p90, max), copy scores (median, p10, min), the chance a copy
    outscores a look-alike, and the share of look-alikes (false matches) and copies (found) at each threshold."""
    summary = {}
    for system in ("descriptor", "matcher"):
        for kind in (*KINDS, "cross-texture"):
            negatives, positives = scores_by_role(pairs, system, kind)
            summary[f"{system}/{kind}"] = _entry(negatives, positives, positives, thresholds[system])
        positives = scores_by_role(pairs, system, "photo")[1]
        summary[f"{system}/photo"] = _entry([], positives, positives, thresholds[system])
    for kind in (*KINDS, "photo"):
        role = "distractor" if kind == "photo" else "look-alike"
        negatives = [q["score"] for q in detect if q["role"] == role and q["kind"] == kind]
        copies = [q for q in detect if q["role"] == "copy" and q["kind"] == kind]
        found = [q["score"] if q["correct"] else float("-inf") for q in copies]
        entry = _entry(negatives, [q["score"] for q in copies], found, thresholds["detect"])
        entry["recall_at_1"] = float(np.mean([q["correct"] for q in copies])) if copies else None
        lookalikes = [q for q in detect if q["role"] == role and q["kind"] == kind]
        entry["top_in_family"] = (float(np.mean([q["top_family"] == q["family"] for q in lookalikes]))
                                  if lookalikes and kind != "photo" else None)
        summary[f"detect/{kind}"] = entry
    return summary


def _entry(negatives: list[float], positives: list[float], found: list[float], thresholds: dict) -> dict:
    """One row of :func:`summarise` (``found``: each copy's score where it counts as found, else -inf)."""
    return {"negatives": len(negatives), "positives": len(positives),
            "negative_scores": _spread(negatives), "positive_scores": _spread(positives, (0.5, 0.1, 0.0)),
            "auc": auc(positives, negatives),
            "false_match": {name: (float(np.mean(np.asarray(negatives) >= t)) if negatives else None)
                            for name, t in thresholds.items()},
            "found": {name: (float(np.mean(np.asarray(found) >= t)) if found else None)
                      for name, t in thresholds.items()}}


def run_draw(output: Path, draw: int, batch_size: int = 32) -> dict:
    """Build, score and measure one draw (steps 1-3; a rerun reuses the images, pairs and commands it finds)."""
    folder = output / f"draw-{draw}"
    truth_file = folder / "truth.json"
    truth = json.loads(truth_file.read_text()) if truth_file.is_file() else build(folder, draw)
    pairs_file = folder / "pairs.json"
    if pairs_file.is_file():
        pairs = json.loads(pairs_file.read_text())
    else:
        start = time.perf_counter()
        pairs = score_pairs(folder, truth, batch_size)
        write_json(pairs_file, pairs)
        print(f"draw {draw}: {len(pairs)} pairs scored in {time.perf_counter() - start:.0f} s", flush=True)
    detected = run_detect(folder)
    detect = detect_scores(folder, truth)
    thresholds = thresholds_of(detected["calibrated"])
    result = {"draw": draw, "date": now(), "thresholds": thresholds, "calibrated": detected["calibrated"],
              "seconds": detected["seconds"], "summary": summarise(pairs, detect, thresholds), "detect": detect}
    write_json(folder / "result.json", result)
    return result


def compare_descriptors(output: Path, draw: int, descriptors: dict[str, str], batch_size: int = 32) -> dict:
    """Steps 1-2 of one draw with each of ``descriptors`` (name -> model folder, ``onnx:PATH`` or ``embedded``): per
    model and kind of image, the look-alike and copy pairs' median cosines and the chance that a copy outscores a
    look-alike. Scores already in ``descriptors.json`` are reused."""
    folder = output / f"draw-{draw}"
    truth_file = folder / "truth.json"
    truth = json.loads(truth_file.read_text()) if truth_file.is_file() else build(folder, draw)
    scores_file = folder / "descriptors.json"
    scored = json.loads(scores_file.read_text()) if scores_file.is_file() else {}
    for name, model in descriptors.items():
        if scored.get(name, {}).get("model") != model:
            pairs = score_pairs(folder, truth, batch_size, {"cosine": (None if model == "embedded" else model,
                                                                         "descriptor")})
            scored[name] = {"model": model, "pairs": pairs}
            write_json(scores_file, scored)
    summary = {}
    for name in descriptors:
        pairs = scored[name]["pairs"]
        for kind in (*KINDS, "cross-texture", "photo"):
            negatives, positives = scores_by_role(pairs, "cosine", kind)
            summary[f"{name}/{kind}"] = {"auc": auc(positives, negatives),
                                         "negative_median": _spread(negatives, (0.5,))[0],
                                         "positive_median": _spread(positives, (0.5,))[0]}
    return {"draw": draw, "summary": summary}


def descriptor_table(results: list[dict], names: list[str]) -> str:
    """The Markdown table of :func:`compare_descriptors` over the draws: per model and kind, P(copy > look-alike) and
    the medians, mean (min-max) over the draws."""
    lines = [f"Draws {', '.join(str(r['draw']) for r in results)}; mean over the draws, (min-max) where they differ.",
             "", "| descriptor | images | P(copy > look-alike) | look-alike median cosine | copy median cosine |",
             "|---|---|---|---|---|"]
    for name in names:
        for kind in (*KINDS, "cross-texture", "photo"):
            entries = [r["summary"][f"{name}/{kind}"] for r in results]
            lines.append(f"| {name} | {kind} | " + " | ".join(_mean_range([e[field] for e in entries]) for field in
                                                             ("auc", "negative_median", "positive_median")) + " |")
    return "\n".join(lines)


#: The rows of the tables: (summary key, label).
ROWS = [(f"{system}/{kind}", f"{label}, {kind}" + (" (negatives: edited distractor photos)"
                                                     if system == "detect" and kind == "photo" else ""))
        for system, label in
        (("descriptor", "embedded descriptor (cosine)"), ("matcher", "embedded matcher (probability)"),
         ("detect", "`copynce detect` defaults"))
        for kind in (*KINDS, "cross-texture", "photo")
        if not (system == "detect" and kind == "cross-texture")]


def _number(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _mean_range(values: list) -> str:
    """``mean (min-max)`` over the draws of values that may be ``None``."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1 or max(values) - min(values) < 5e-4:
        return _number(float(np.mean(values)))
    return f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def table(results: list[dict]) -> str:
    """The Markdown tables over the draws: scores, then false matches and copies found at each threshold."""
    draws = ", ".join(str(r["draw"]) for r in results)
    names = THRESHOLDS["detect"]
    lines = [f"Draws {draws}; mean over the draws, (min-max) where they differ. Thresholds: " + "; ".join(
        f"{system}: " + ", ".join(f"{name} {_mean_range([r['thresholds'][system][name] for r in results])}"
                                  for name in THRESHOLDS[system] if name != "0.5") for system in THRESHOLDS), "",
             "| system, images | look-alikes (pairs or queries) | look-alike score median / p90 / max | copy score "
             "median / p10 / min | P(copy > look-alike) | " + " | ".join(
                 f"look-alikes >= {name}" for name in names) + " | " + " | ".join(
                 f"copies found >= {name}" for name in names) + " |",
             "|" + "---|" * (5 + 2 * len(names))]
    for key, label in ROWS:
        entries = [r["summary"][key] for r in results if key in r["summary"]]
        if not entries:
            continue
        spread = [" / ".join(_number(float(np.mean([e[field][i] for e in entries]))) if entries[0][field][i]
                             is not None else "-" for i in range(3)) for field in ("negative_scores", "positive_scores")]
        cells = [label, str(entries[0]["negatives"]), *spread, _mean_range([e["auc"] for e in entries])]
        cells += [_mean_range([e["false_match"].get(name) for e in entries]) for name in names]
        cells += [_mean_range([e["found"].get(name) for e in entries]) for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    detect = [r["summary"] for r in results]
    lines += ["", "`copynce detect` recall@1 of copies, by kind: " + ", ".join(
        f"{kind} {_mean_range([s[f'detect/{kind}']['recall_at_1'] for s in detect])}" for kind in (*KINDS, "photo")),
        "Look-alike queries whose best reference is of their own family: " + ", ".join(
        f"{kind} {_mean_range([s[f'detect/{kind}']['top_in_family'] for s in detect])}" for kind in KINDS)]
    return "\n".join(lines)


def _named(item: str) -> tuple[str, str]:
    name, separator, model = item.partition("=")
    if not separator or not name or not model:
        raise SystemExit(f"--descriptors: {item!r} is not NAME=MODEL (a model folder, onnx:PATH or embedded)")
    return name, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality.lookalikes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("outputs/lookalikes"), help="folder of the draws")
    parser.add_argument("--draws", type=int, nargs="+", default=[0, 1, 2], help="draws to run (default 0 1 2)")
    parser.add_argument("--table", action="store_true", help="only print the tables of the draws found in --output")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--descriptors", nargs="+", metavar="NAME=MODEL", default=None,
                        help="compare these descriptors (a model folder, onnx:PATH or embedded) on the draws' pairs "
                             "only: no detect, no thresholds")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.descriptors:
        descriptors = dict(_named(item) for item in args.descriptors)
        results = [compare_descriptors(args.output, draw, descriptors) for draw in args.draws]
        print(descriptor_table(results, list(descriptors)))
        return 0
    if not args.table:
        for draw in args.draws:
            run_draw(args.output, draw)
    results = [json.loads(path.read_text()) for path in sorted(args.output.glob("draw-*/result.json"))]
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
