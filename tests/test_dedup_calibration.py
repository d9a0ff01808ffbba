"""``copynce dedup``'s self-calibrated default threshold: the calibration collection made from the collection, the dedup
run's verified pairs labelled by provenance, the threshold rule (checked again from the saved file), where the threshold comes from in the log and the report, the options
that override it, determinism, reuse, and collections smaller than the sample."""

from __future__ import annotations

import csv
import dataclasses
import html
import json
import re
import shutil

import numpy as np
import pytest
from conftest import run_cli, save_tiny_models, tiny_models
from PIL import Image

from copynce_hf.calibration.collection import FILE_NAME, FOLDER, self_calibrate
from copynce_hf.calibration.self_threshold import RECALL_FLOOR, Fallback, choose_threshold, self_threshold
from copynce_hf.calibration.synthetic import (
    COPY_KINDS,
    NON_COPY_KINDS,
    PAIRED,
    ROLE_CYCLE,
    SyntheticPair,
    SyntheticSet,
    mark_paired,
    pair_kind,
    roles,
    synthetic_set,
)
from copynce_hf.modeling.errors import PredictionsError
from copynce_hf.retrieval import (
    Descriptor,
    DetectConfig,
    ImageFolderSource,
    ImageListSource,
    connected_groups,
)
from copynce_hf.retrieval.deduplication.collection import dedup
from copynce_hf.retrieval.deduplication.settings import DedupSettings


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """10 random 64x72 images, of which R1 is copied byte for byte once (R1_again)."""
    folder = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(0)
    for i in range(9):
        Image.fromarray(rng.integers(0, 255, (64, 72, 3), dtype=np.uint8)).save(folder / f"R{i}.png")
    shutil.copy(folder / "R1.png", folder / "R1_again.png")
    return folder


def test_choose_threshold_takes_the_lowest_score_reaching_the_weighted_precision():
    is_copy = [True, True, False, True, False, True]
    scores = [0.9, 0.8, 0.75, 0.7, 0.3, 0.2]
    # at 0.7: 3 copies, 1 non-copy: precision 3/4 with weight 1, 3/5 with weight 2
    choice = choose_threshold(is_copy, scores, 1.0, 0.75)
    assert (choice.threshold, choice.precision, choice.recall, choice.reached) == (0.7, 0.75, 0.75, True)
    assert choose_threshold(is_copy, scores, 2.0, 0.75).threshold == 0.8
    assert choose_threshold(is_copy, scores, 1.0, 1.0).threshold == 0.8
    assert choose_threshold(is_copy, scores, 0.0, 0.9).threshold == 0.2  # no weight: every copy kept
    # unreachable: the non-copy outscores every copy; the best precision (0.5, then the most recall) is taken
    choice = choose_threshold([False, True, True], [0.9, 0.5, 0.5], 1.0, 0.9)
    assert (choice.threshold, choice.precision, choice.recall, choice.reached) == (0.5, pytest.approx(2 / 3), 1.0,
                                                                                   False)
    # a tie between a copy and a non-copy is one threshold, both kept
    tie = choose_threshold([True, False, False], [0.6, 0.6, 0.1], 1.0, 0.9)
    assert (tie.threshold, tie.precision, tie.reached) == (0.6, 0.5, False)
    # copies never scored count in the recall only
    missed = choose_threshold(is_copy, scores, 1.0, 0.75, positives=8)
    assert (missed.threshold, missed.precision, missed.recall) == (0.7, 0.75, 3 / 8)
    with pytest.raises(PredictionsError, match="no copy pair"):
        choose_threshold([False], [0.3], 1.0, 0.9)


def test_the_synthetic_set_plants_one_copy_per_sampled_image_in_three_roles(collection):
    """Each sampled image's content appears twice, as a copy pair of a collection holds it: with one copy, in a
    template shared with other sampled images, or as two copies without the original."""
    source = ImageFolderSource(collection)
    made = synthetic_set(source, 8, seed=0)
    assert len(made.sample) == 8 and len(set(made.sample)) == 8 and set(made.sample) <= set(source.ids)
    given = roles(8, 0)
    assert sorted(given) == sorted(ROLE_CYCLE * 2)  # the cycle's proportions: 4 copy, 2 template, 2 copies
    kinds = [pair.kind for pair in made.pairs]
    assert {kind: kinds.count(kind) for kind in COPY_KINDS} == {"copy": 4, "template copy": 2, "copy of copy": 2}
    for i, role in enumerate(given):
        images = sorted(image.split(":")[1] for image in made.images if image.startswith(f"{i:04d}:"))
        assert images == {"copy": ["copy1", "original"], "template": ["original", "template"],
                          "copies": ["copy1", "copy2"]}[role]
        assert all(made.records[f"{i:04d}:{image}"] == {**made.records[f"{i:04d}:{image}"], "role": role,
                                                        "of": made.sample[i]} for image in images)
    assert len(made.images) == 16 and len(made.pairs) == 8 + sum(kind == "shared template" for kind in kinds)
    templated = [i for i, role in enumerate(given) if role == "template"]
    assert [pair.kind for pair in made.pairs if pair.kind == "shared template"] == ["shared template"]
    a, b = (made.records[f"{i:04d}:template"] for i in templated)  # two images of one group share the template
    assert a["of"] != b["of"] and a["template"] == b["template"] and a["edits"] and b["edits"]
    for pair in made.pairs:
        assert pair_kind(made.records, pair.query, pair.reference) == pair.kind
        if pair.kind in COPY_KINDS:  # both sides made from the same sampled image
            assert made.records[pair.query]["of"] == made.records[pair.reference]["of"]
    copies = given.index("copies")
    assert made.representatives()[made.sample[copies]] == f"{copies:04d}:copy1"  # its original is left out
    assert made.representatives()[made.sample[templated[0]]] == f"{templated[0]:04d}:original"
    other = given.index("copy")
    assert pair_kind(made.records, f"{other:04d}:copy1", f"{copies:04d}:copy2") == "other image"
    again = synthetic_set(source, 8, seed=0)
    assert again.sample == made.sample and again.records == made.records
    assert synthetic_set(source, 8, seed=1).sample != made.sample
    assert len(synthetic_set(source, 64, seed=0).sample) == len(source)  # a collection smaller than the sample


def _pair(query: str, reference: str, records: dict, score: float) -> SyntheticPair:
    return SyntheticPair(query, reference, pair_kind(records, query, reference), score)


def test_images_of_the_collection_that_score_as_copies_of_each_other_count_as_neither():
    """Two sampled images whose own pair scores at least as high as one of their planted copies and as half the
    planted copies may be copies of each other in the collection: every pair made from them is left out of the
    labels; a pair of two edited images alone (a shared planted frame) links nothing, nor do images whose planted
    pairs were never verified, nor a pair below the median planted copy."""
    records = {f"{i:04d}:{image}": {"of": of, "role": role} for i, of, role, images in (
        (0, "a", "copy", ("original", "copy1")), (1, "b", "copy", ("original", "copy1")),
        (2, "c", "copies", ("copy1", "copy2")), (3, "d", "copy", ("original", "copy1")),
        (4, "e", "copy", ("original", "copy1")), (5, "f", "copy", ("original", "copy1"))) for image in images}
    made = SyntheticSet(["a", "b", "c", "d", "e", "f"], {}, records, [])
    pairs = [_pair("0000:copy1", "0000:original", records, 0.95), _pair("0001:copy1", "0001:original", records, 0.9),
             _pair("0002:copy1", "0002:copy2", records, 0.99), _pair("0005:copy1", "0005:original", records, 0.1),
             _pair("0000:original", "0001:original", records, 0.97),
             _pair("0000:copy1", "0001:copy1", records, 0.4), _pair("0001:copy1", "0002:copy2", records, 0.999),
             _pair("0002:copy2", "0003:copy1", records, 0.999), _pair("0003:original", "0004:original", records, 0.99),
             _pair("0000:original", "0003:original", records, 0.5), _pair("0005:original", "0000:original", records,
                                                                          0.6)]
    assert mark_paired(pairs, made) == 1
    assert [pair.kind for pair in pairs] == ["copy", "copy", "copy of copy", "copy", PAIRED, PAIRED, "other image",
                                             "other image", "other image", "other image", "other image"]
    # a and b: 0.97 is at least b's planted 0.9 and the median planted 0.925, so every pair of theirs (0.4 too) is
    # neither; b and c's 0.999 is two edited images; d and e never had a planted pair verified; a and d at 0.5 are
    # below a's planted 0.95; f and a at 0.6 reach f's planted 0.1 but not the median
    chosen = self_threshold(pairs, made.sample, 6, 0.9)
    assert chosen.counts["paired_in_collection"] == 2 and chosen.counts["copy_pairs"] == 4


def test_the_median_a_pair_of_the_collection_must_reach_is_that_of_planted_pairs_scored_on_its_views():
    """A layout crop lifts the planted template copies it decides: two whole images of the collection are held to the
    median of the planted pairs scored on whole images, not to the crops' higher scores; views no planted pair was
    scored on are held to every planted pair's median."""
    records = {f"{i:04d}:{image}": {"of": of, "role": role} for i, of, role, images in (
        (0, "a", "copy", ("original", "copy1")), (1, "b", "copy", ("original", "copy1")),
        (2, "c", "template", ("original", "template")), (3, "d", "template", ("original", "template")),
        (4, "e", "template", ("original", "template"))) for image in images}
    made = SyntheticSet(["a", "b", "c", "d", "e"], {}, records, [])

    def scored(whole_whole: float, crop_whole: float) -> list[SyntheticPair]:
        pairs = [_pair("0000:copy1", "0000:original", records, 0.990), _pair("0001:copy1", "0001:original", records,
                                                                             0.991)]
        pairs += [dataclasses.replace(_pair(f"{i:04d}:original", f"{i:04d}:template", records, 0.999),
                                      views="whole/layout") for i in (2, 3, 4)]
        pairs += [_pair("0000:original", "0001:original", records, whole_whole),
                  dataclasses.replace(_pair("0002:original", "0003:original", records, crop_whole), views="crop/whole")]
        return pairs

    # a and b at 0.995: above both their planted pairs and the median of the whole-image planted pairs (0.9905),
    # below the median of every planted pair (0.999, the layout crops'); c and d on views no planted pair had: the
    # median of all (0.999) holds, and 0.995 is below it
    pairs = scored(0.995, 0.995)
    assert mark_paired(pairs, made) == 1
    assert [pair.kind for pair in pairs][-2:] == [PAIRED, "other image"]
    pairs = scored(0.9901, 0.9995)
    assert mark_paired(pairs, made) == 1  # 0.9901 is below b's own planted 0.991; c and d's 0.9995 reaches 0.999
    assert [pair.kind for pair in pairs][-2:] == ["other image", PAIRED]


def _precision(rows: list[dict], threshold: float) -> float:
    kept = [row for row in rows if row["score"] >= threshold]
    return sum(row["copy"] for row in kept) / len(kept)


def check_saved_choice(saved: dict) -> None:
    """The saved threshold follows the rule, recomputed from the saved pairs alone: the lowest decision score whose
    labelled verified pairs at or above it reach the target precision (no weighting; pairs of images the collection
    pairs itself count as neither), else the best precision reached; the recall counts the true pairs never verified
    too; the threshold used is that one where the recall reaches the floor, else the fallback (where one is
    offered)."""
    rows, target, counts = saved["pairs"], saved["target_precision"], saved["counts"]
    copies = sum(row["copy"] for row in rows)
    assert all(row["copy"] == (row["kind"] in COPY_KINDS) and row["kind"] in (*COPY_KINDS, *NON_COPY_KINDS, PAIRED)
               for row in rows)
    assert all(row["copy"] == (saved["images"][row["query"]]["of"] == saved["images"][row["reference"]]["of"])
               for row in rows)  # labelled by provenance
    labelled = [row for row in rows if row["kind"] != PAIRED]
    assert counts["copy_pairs"] == copies and counts["non_copy_pairs"] == len(labelled) - copies
    assert counts["paired_in_collection"] == len(rows) - len(labelled)
    assert counts["missed_true_pairs"] == counts["true_pairs"] - copies >= 0
    precisions = {score: _precision(labelled, score) for score in {row["score"] for row in labelled}
                  if any(r["copy"] and r["score"] >= score for r in labelled)}
    threshold = saved["self_calibrated_threshold"]
    assert threshold in precisions and saved["precision"] == pytest.approx(precisions[threshold])
    assert saved["recall"] == pytest.approx(sum(r["copy"] and r["score"] >= threshold for r in rows)
                                            / counts["true_pairs"])
    if saved["reached"]:
        assert precisions[threshold] >= target
        assert all(p < target for score, p in precisions.items() if score < threshold)
    else:
        assert all(p < target for p in precisions.values())
        assert precisions[threshold] == max(precisions.values())
    usable = saved["reached"] and saved["recall"] >= RECALL_FLOOR == saved["recall_floor"]
    assert saved["used"] == ("self-calibrated" if usable else "fallback" if saved["fallback"] else
                             "self-calibrated, below the recall floor")
    assert saved["threshold"] == (saved["fallback"]["threshold"] if saved["used"] == "fallback" else threshold)
    assert (saved["warning"] is None) == usable


@pytest.mark.parametrize("with_matcher", [False, True])
def test_the_self_calibrated_threshold_follows_its_rule_on_its_saved_pairs(collection, tmp_path, with_matcher):
    """The saved pairs are the verified pairs of a dedup run on the calibration collection, with that run's decision
    scores (collection-normalised, the scale the run thresholds), and the threshold follows its rule on them."""
    descriptor, matcher, processor = tiny_models(0)
    models = (Descriptor("tiny", descriptor, processor), (matcher, processor) if with_matcher else None)
    settings = DedupSettings(matcher_anchor=-20.0)  # every matcher background discounted: the tiny one scores low
    lines: list[str] = []
    made = self_calibrate(ImageFolderSource(collection), *models, DetectConfig(candidates=4), folder=tmp_path,
                          progress=False, log=lines.append, settings=settings)
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved["threshold"] == made.threshold and "unweighted" in saved["class_ratio"]
    check_saved_choice(saved)
    # the same pairs and decision scores as dedup itself on the calibration collection
    calibration = synthetic_set(ImageFolderSource(collection), 64, seed=0)
    images = ImageListSource(list(calibration.images), list(calibration.images.values()))
    found = dedup(images, *models, 0.5, DetectConfig(candidates=4), progress=False, log=lambda line: None,
                  settings=settings)
    assert {(p.query_id, p.reference_id): p.score for p in found.pairs} == pytest.approx(
        {(row["query"], row["reference"]): row["score"] for row in saved["pairs"]})
    assert any(row["score"] != row["raw_score"] for row in saved["pairs"])  # normalised, not raw
    # each pair names the views that decided it, as the run's pairs.csv does
    decided = {(pair.a, pair.b): f"{pair.view_a}/{pair.view_b}" for pair in found.crop_pairs}
    assert {(row["query"], row["reference"]): row["views"] for row in saved["pairs"]} == {
        (p.query_id, p.reference_id): decided.get((p.query_id, p.reference_id), "whole/whole") for p in found.pairs}
    assert not with_matcher or any(row["views"] != "whole/whole" for row in saved["pairs"])  # layout crops decided some
    counts = saved["counts"]
    assert counts["images"] == 10 and counts["true_pairs"] == 10  # one planted copy pair per sampled image
    assert counts["shared template"] == sum(row["kind"] == "shared template" for row in saved["pairs"])
    assert lines[-1] == made.origin == saved["origin"]
    assert lines[-1].startswith(f"self-calibrated on 10 images of this collection: threshold {made.threshold:.4g}")
    assert (f"precision {saved['precision']:.2f} and recall {saved['recall']:.2f} on 10 planted copy pairs and "
            f"{counts['non_copy_pairs']} non-copy pairs (target precision 0.9; the recall counts the "
            f"{counts['missed_true_pairs']} copy pairs never verified; {counts['shared template']} non-copies share "
            f"a template; {counts['linked_images']} pairs of this collection's images") in lines[-1]
    assert not any("groups of copies" in line for line in lines)  # its run scores pairs, it forms no group


def test_the_threshold_reaches_the_precision_when_a_model_tells_copies_apart(tmp_path):
    """The embedded models on the bundled images: the target is reached on the calibration collection's verified
    pairs, checked again from the saved file."""
    from conftest import shrunk_asset_images

    from copynce_hf.runtime.loading import load_model

    folder = tmp_path / "images"
    folder.mkdir()
    shrunk_asset_images(folder, 160)
    descriptor = Descriptor("embedded", *load_model(None, "descriptor", "--model"))
    made = self_calibrate(ImageFolderSource(folder), descriptor, None, DetectConfig(candidates=5),
                          folder=tmp_path / "calibration", precision=0.8, progress=False)
    saved = json.loads((tmp_path / "calibration" / FILE_NAME).read_text())
    check_saved_choice(saved)
    assert made.choice.reached and saved["reached"] and saved["precision"] >= 0.8


def test_self_calibration_is_deterministic_with_its_seed(collection):
    descriptor, _, processor = tiny_models(0)
    runs = [self_calibrate(ImageFolderSource(collection), Descriptor("tiny", descriptor, processor), None,
                           DetectConfig(candidates=3), sample=6, seed=seed, progress=False, log=lambda line: None)
            for seed in (0, 0, 1)]
    same, other = ([(p.query, p.reference, p.kind, p.score) for p in run.pairs] for run in runs[1:])
    assert [(p.query, p.reference, p.kind, p.score) for p in runs[0].pairs] == same
    assert runs[0].sample == runs[1].sample and runs[0].threshold == runs[1].threshold
    assert runs[2].sample != runs[0].sample and other != same


def test_a_self_calibration_saved_with_another_copy_recipe_is_not_reused(collection, tmp_path):
    """The saved file's identity holds the copy recipe's name and steps: a file saved when the self-calibration planted
    mini-DISC's query copies (main's identity had the name only), or one whose recipe of the same name had other steps,
    is scored again, not reused."""
    from copynce_hf.calibration.synthetic import COPY_RECIPE
    from copynce_hf.pixtrace import CopyRecipe
    from copynce_hf.retrieval.work_folder import digest

    descriptor, _, processor = tiny_models(0)

    def run() -> list[str]:
        lines: list[str] = []
        self_calibrate(ImageFolderSource(collection), Descriptor("tiny", descriptor, processor), None,
                       DetectConfig(candidates=3), folder=tmp_path, sample=6, progress=False, log=lines.append)
        return lines

    run()
    file = tmp_path / FILE_NAME
    saved = json.loads(file.read_text())
    assert COPY_RECIPE == saved["recipe"] == saved["identity"]["recipe"] == "calibration_copies"
    assert saved["identity"]["recipe_steps"] == digest(CopyRecipe.calibration_copies().to_dict())
    assert any("reusing the verified pairs" in line for line in run())
    old_steps = digest(CopyRecipe.minidisc_queries().to_dict())
    stale_identities = ({key: value for key, value in saved["identity"].items() if key != "recipe_steps"}
                        | {"recipe": "minidisc_queries"}, saved["identity"] | {"recipe_steps": old_steps})
    for stale in stale_identities:
        file.write_text(json.dumps(saved | {"identity": stale}))
        assert not any("reusing" in line for line in run())
        assert json.loads(file.read_text())["identity"] == saved["identity"]


def _groups(output) -> list[list[str]]:
    with (output / "groups.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["group_id"], []).append(row["image_id"])
    return list(found.values())


def test_copynce_dedup_without_a_threshold_self_calibrates_and_says_so(collection, tmp_path, capsys):
    from copynce_hf.cli import main

    before = sorted(path.name for path in collection.iterdir())
    models = save_tiny_models(tmp_path / "models", seed=0)
    args = ["dedup", str(collection), "--model", models["descriptor"], "--matcher", "none", "--candidates", "3",
            "--grouping", "connected"]  # the grouping does not change the self-calibration
    output = tmp_path / "found"
    assert main([*args, "--output", str(output)]) == 0  # --matcher none: no longer refused without a threshold
    err = capsys.readouterr().err
    saved = json.loads((output / FOLDER / FILE_NAME).read_text())
    check_saved_choice(saved)
    assert f"copynce dedup: {saved['origin']}" in err.splitlines()
    assert saved["origin"].startswith("self-calibrated on 10 images of this collection: threshold ")
    assert not any("groups of copies" in line for line in err.splitlines() if "self-calibration" in line)
    report = html.unescape((output / "report.html").read_text())
    assert saved["origin"] in report and str(output / FOLDER / FILE_NAME) in report
    assert "<tr><td>self-calibration</td><td>" in report  # the report's table of stage times
    with (output / "pairs.csv").open(newline="") as handle:  # the groups are those of the self-calibrated threshold
        edges = [(row["query_id"], row["reference_id"]) for row in csv.DictReader(handle)
                 if float(row["score"]) >= saved["threshold"]]
    assert _groups(output) == connected_groups(ImageFolderSource(collection).ids, edges)
    assert sorted(path.name for path in collection.iterdir()) == before  # nothing written into the collection

    # a rerun reuses the scored pairs; another --precision chooses again from them
    assert main([*args, "--precision", "0.5", "--output", str(output)]) == 0
    err = capsys.readouterr().err
    again = json.loads((output / FOLDER / FILE_NAME).read_text())
    assert "reusing the verified pairs" in err and again["pairs"] == saved["pairs"]
    assert again["target_precision"] == 0.5
    check_saved_choice(again)


def test_a_given_threshold_or_calibration_overrides_the_self_calibration(collection, tmp_path, capsys):
    from copynce_hf.calibration.thresholds import Calibration, OperatingPoint, model_identity

    models = save_tiny_models(tmp_path / "models", seed=0)
    args = ("dedup", collection, "--model", models["descriptor"], "--matcher", "none")
    code, _, err = run_cli(capsys, *args, "--threshold", 0.9999, "--output", tmp_path / "given")
    assert code == 0, err
    assert not (tmp_path / "given" / FOLDER).exists()
    assert "0.9999 (given)" in (tmp_path / "given" / "report.html").read_text()
    pipeline = {"descriptors": [model_identity(models["descriptor"], "descriptor")], "matcher": None,
                "preset": "fast", "settings": {"descriptor_lce": "none", "matcher_lce": "none",
                                               "score_normalisation": False}}
    Calibration(pipeline, {"descriptor": [OperatingPoint(0.9, 0.9999, 0.5)]}).save(tmp_path / "calibration.json")
    code, _, err = run_cli(capsys, *args, "--calibration", tmp_path / "calibration.json", "--collection-normalisation",
                           "off", "--output", tmp_path / "file")
    assert code == 0, err
    assert not (tmp_path / "file" / FOLDER).exists()
    assert "descriptor score 0.9999 at precision 0.9 in" in (tmp_path / "file" / "report.html").read_text()
    code, _, err = run_cli(capsys, *args, "--threshold", 0.5, "--precision", 0.9, "--output", tmp_path / "x")
    assert code == 2 and "give one of them" in err
    code, _, err = run_cli(capsys, *args, "--precision", 1.5, "--output", tmp_path / "x")
    assert code == 2 and "--precision must be in (0, 1], got 1.5" in err and not (tmp_path / "x").exists()


def test_a_collection_of_two_images_self_calibrates_with_the_matcher(collection, tmp_path, capsys):
    models = save_tiny_models(tmp_path / "models", seed=0)
    pair = tmp_path / "pair"
    pair.mkdir()
    for name in ("R0.png", "R2.png"):
        shutil.copy(collection / name, pair / name)
    code, _, err = run_cli(capsys, "dedup", pair, "--model", models["descriptor"], "--matcher", models["matcher"],
                           "--self-calibration-sample", 5, "--output", tmp_path / "found")
    assert code == 0, err
    saved = json.loads((tmp_path / "found" / FOLDER / FILE_NAME).read_text())
    assert saved["counts"]["images"] == 2 and saved["counts"]["true_pairs"] == 2
    check_saved_choice(saved)


def test_a_self_calibration_below_the_recall_floor_warns_in_one_line_and_falls_back():
    """The rule on pairs scored by hand: a threshold reaching the precision at a recall below the floor is not used;
    the fallback is, with one warning line; without a fallback the threshold stays, and the line says so."""
    def pairs(copies: list[float], others: list[float]) -> list[SyntheticPair]:
        return ([SyntheticPair(f"{i:04d}:copy1", f"{i:04d}:original", "copy", score) for i, score in enumerate(copies)]
                + [SyntheticPair(f"{i:04d}:copy1", f"{i + 1:04d}:original", "other image", score)
                   for i, score in enumerate(others)])

    few = pairs([0.99, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05], [0.9, 0.8, 0.3])
    fallback = Fallback(0.75, "the matcher's threshold at precision 0.9 on a task, from its model card")
    made = self_threshold(few, [str(i) for i in range(10)], 10, 0.9, fallback)
    assert (made.choice.threshold, made.choice.recall, made.choice.reached) == (0.99, 0.1, True)
    assert made.choice.recall < RECALL_FLOOR and not made.usable and made.threshold == 0.75
    assert made.warning == ("self-calibration: recall 0.10 of its planted copies at precision 1.00 is below the floor "
                            f"{RECALL_FLOOR:g}; this run uses threshold 0.75 instead, the matcher's threshold at "
                            "precision 0.9 on a task, from its model card; --threshold T sets one")
    assert "\n" not in made.warning and made.origin.startswith(
        "self-calibrated on 10 images of this collection: threshold 0.75, the matcher's threshold at precision 0.9")
    assert "the self-calibrated 0.99 measured precision 1.00 and recall 0.10 on 10 planted copy pairs" in made.origin
    alone = self_threshold(few, [str(i) for i in range(10)], 10, 0.9)
    assert alone.threshold == 0.99 and "no stated default for these scores: this run keeps 0.99" in alone.warning
    unreached = self_threshold(pairs([0.5, 0.4], [0.9, 0.8]), ["0", "1", "2"], 2, 0.9, fallback)
    assert not unreached.choice.reached and unreached.threshold == 0.75
    assert unreached.warning.startswith("self-calibration: no threshold reaches precision 0.9 on its planted pairs")
    kept = self_threshold(pairs([0.99, 0.95, 0.9, 0.2], [0.5, 0.3]), ["0", "1", "2", "3", "4"], 4, 0.9, fallback)
    assert kept.usable and kept.threshold == 0.9 and kept.warning is None and kept.choice.recall == 0.75
    assert kept.origin.startswith("self-calibrated on 5 images of this collection: threshold 0.9, where it measured "
                                  "precision 1.00 and recall 0.75 on 4 planted copy pairs and 2 non-copy pairs")


def _matcher_with_card(folder, threshold: float) -> None:
    """Give a saved matcher folder a model card stating ``threshold`` at precision 0.9, as an exported card does."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    data = ModelCardData(model_name="tiny", eval_results=[EvalResult(
        task_type="other", dataset_type="tiny", dataset_name="a tiny task (8 copies)", metric_type="copy_detection",
        metric_name="Score threshold at 90% precision", metric_config="threshold_at_p90", metric_value=threshold)])
    ModelCard(f"---\n{data.to_yaml()}\n---\n# tiny\n").save(f"{folder}/README.md")


def test_copynce_dedup_warns_in_one_line_and_uses_the_matchers_card_below_the_recall_floor(collection, tmp_path,
                                                                                          capsys, caplog):
    from copynce_hf.calibration.self_threshold import card_fallback

    models = save_tiny_models(tmp_path / "models", seed=0)
    assert card_fallback(models["matcher"]) is None  # no card: nothing to fall back to
    _matcher_with_card(models["matcher"], 0.6125)
    assert card_fallback(models["matcher"]) == Fallback(
        0.6125, "the matcher's threshold at precision 0.9 on a tiny task, from its model card")
    output = tmp_path / "found"
    code, _, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher",
                           models["matcher"], "--candidates", 3, "--precision", 1.0, "--output", output)
    assert code == 0, err
    saved = json.loads((output / FOLDER / FILE_NAME).read_text())
    check_saved_choice(saved)
    assert saved["recall"] < RECALL_FLOOR  # the random tiny models keep few of their planted copies
    assert saved["used"] == "fallback" and saved["threshold"] == 0.6125
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warnings == [saved["warning"]] and "\n" not in saved["warning"]  # one line (copynce: WARNING: ...)
    assert "this run uses threshold 0.6125 instead, the matcher's threshold at precision 0.9 on a tiny task" in (
        saved["warning"])
    assert saved["origin"] in html.unescape((output / "report.html").read_text())
    with (output / "pairs.csv").open(newline="") as handle:  # the groups are those of the fallback
        assert all(float(row["score"]) < 0.6125 for row in csv.DictReader(handle)) == (not _groups(output))


def test_a_self_calibration_stopped_by_ctrl_c_resumes_from_its_kept_chunks(collection, tmp_path, capsys,
                                                                          monkeypatch):
    """The self-calibration keeps its calibration collection's work as the run does: a Ctrl-C in its matcher stage
    leaves its scored chunks in OUTPUT/self_calibration/rescoring, and the same command goes on from them."""
    from copynce_hf.retrieval.verify import chunked_scoring

    save = chunked_scoring.ChunkFolder.save

    def saved_then_interrupted(self, index, chunk):  # Ctrl-C once the first chunk of matcher scores is kept
        save(self, index, chunk)
        raise KeyboardInterrupt

    models = save_tiny_models(tmp_path / "models", seed=0)
    output = tmp_path / "found"
    command = ["dedup", collection, "--model", models["descriptor"], "--matcher", models["matcher"],
               "--candidates", 3, "--chunk-size", 4, "--output", output]
    monkeypatch.setattr(chunked_scoring.ChunkFolder, "save", saved_then_interrupted)
    code, _, err = run_cli(capsys, *command)
    assert code == 130 and err.strip().splitlines()[-1].endswith("(the self-calibration's in its self_calibration "
                                                                 "folder)")
    assert not (output / FOLDER / FILE_NAME).exists() and list((output / FOLDER / "rescoring").rglob("chunk-*"))
    assert (output / FOLDER / "tokens").is_dir() and (output / FOLDER / "indexes").is_dir()
    monkeypatch.setattr(chunked_scoring.ChunkFolder, "save", save)
    from copynce_hf.cli import main

    assert main([*map(str, command)]) == 0  # not quiet: its log lines are read
    err = capsys.readouterr().err
    assert re.search(r"copynce dedup: self-calibration: .*resuming: 1 of \d+ chunks", err)
    assert re.search(r"copynce dedup: self-calibration: .*token store: resuming", err) or "0 encoder passes" in err
    resumed = json.loads((output / FOLDER / FILE_NAME).read_text())
    check_saved_choice(resumed)
    uninterrupted = tmp_path / "once"
    code, _, err = run_cli(capsys, *command[:-1], uninterrupted)
    assert code == 0, err
    once = json.loads((uninterrupted / FOLDER / FILE_NAME).read_text())["pairs"]
    scores = ("score", "raw_score")  # the same pairs, labels and scores (approx: pytest.approx takes no nested data)
    assert [{k: v for k, v in pair.items() if k not in scores} for pair in once] == [
        {k: v for k, v in pair.items() if k not in scores} for pair in resumed["pairs"]]
    assert [pair[k] for pair in once for k in scores] == pytest.approx(
        [pair[k] for pair in resumed["pairs"] for k in scores])


def test_the_help_and_the_docs_state_the_recall_floor_the_rule_uses():
    from conftest import REPO_ROOT

    from copynce_hf.commands.dedup import EPILOG

    assert f"where that recall is below {RECALL_FLOOR:g} a warning says so" in EPILOG
    docs = " ".join((REPO_ROOT / "docs/detection.md").read_text().split())
    assert f"Where that recall is below {RECALL_FLOOR:g} (half the share" in docs
