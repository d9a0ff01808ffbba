"""The template benchmark (benchmarks/templates/systems.py): the task's structure on a tiny build, and its pair metrics."""

from __future__ import annotations

import collections
import csv
import json

import numpy as np
import pytest
from conftest import SHARED_DATA, SPLITS_CSV
from PIL import Image

from benchmarks.templates.systems import (
    dedup_request,
    detect_request,
    main,
    neighbour_normalised,
    pair_average_precision,
    ranked_pairs,
    template_false_pairs,
)
from benchmarks.templates.task import (
    DEFAULT_DEDUP,
    DEFAULT_DETECT,
    DETECT_PLANS,
    DedupPlan,
    DetectPlan,
    build_dedup_collection,
    build_detect_task,
    draw_photos,
    pool_photos,
    true_pairs,
)
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.pixtrace import replay
from copynce_hf.retrieval import Prediction

TINY_DEDUP = DedupPlan(pairs=2, triples=1, absent=1, framed_copies=2, framed_originals=1, absent_framed=1,
                       strangers=4, singles=1, templates_per_kind=1)
TINY_DETECT = DetectPlan(references=6, strangers=4, framed_queries=2, plain_queries=1, distractors=1,
                         templates_per_kind=1)


def _train():
    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    from benchmarks.minidisc import train_split_files

    return train_split_files(SHARED_DATA)


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    folder = tmp_path_factory.mktemp("templates")
    return folder, build_dedup_collection(folder, _train(), 0, TINY_DEDUP, TINY_DETECT)


# ---------------------------------------------------------------------------------------------- the task


@pytest.mark.shared_data
def test_every_template_hosts_unrelated_photos(collection):
    folder, truth = collection
    assert len(truth["templates"]) == 4 and {t["kind"] for t in truth["templates"].values()} == {
        "screenshot", "meme", "background", "overlay"}
    for template_id, template in truth["templates"].items():
        photos = [truth["images"][i]["photo"] for i in template["members"]]
        assert len(set(photos)) == len(photos) >= 2, template_id  # two unrelated photos or more, none twice
        assert all(truth["images"][i]["template"] == template_id for i in template["members"])
    hosted = sorted(i for i, record in truth["images"].items() if record["template"])
    assert hosted == sorted(i for t in truth["templates"].values() for i in t["members"])
    assert len(hosted) == TINY_DEDUP.hosted == 8
    background = truth["templates"]["background-0"]["description"].removeprefix("pasted onto ")
    assert background not in {record["photo"] for record in truth["images"].values()}


@pytest.mark.shared_data
def test_truth_groups_are_the_images_of_one_photo(collection):
    folder, truth = collection
    images = truth["images"]
    assert sorted(p.stem for p in (folder / "collection").glob("*.png")) == sorted(images)
    assert len(images) == 22 and len({r["photo"] for r in images.values()}) == TINY_DEDUP.photos == 13
    grouped = [i for group in truth["groups"] for i in group]
    assert len(grouped) == len(set(grouped))  # disjoint
    for group in truth["groups"]:
        assert len({images[i]["photo"] for i in group}) == 1 and len(group) >= 2
    by_photo = collections.Counter(r["photo"] for r in images.values())
    assert {i for i, r in images.items() if by_photo[r["photo"]] > 1} == set(grouped)
    assert len(true_pairs(truth)) == 2 + 3 + 1 + 2 + 1 + 1
    for image_id, record in images.items():
        if record["derived_from"]:
            assert images[record["derived_from"]]["photo"] == record["photo"] and record["role"].endswith("of a copy")
        assert Image.open(folder / "collection" / f"{image_id}.png").size == tuple(record["size"][::-1])


@pytest.mark.shared_data
def test_groups_without_their_original_and_framed_copies_exist(collection):
    _, truth = collection
    roles = [[truth["images"][i]["role"] for i in group] for group in truth["groups"]]
    absent = [r for r in roles if "original" not in r]
    assert sorted(map(sorted, absent)) == [["copy", "copy"], ["copy", "framed copy of a copy"]]
    assert sum("framed copy" in r for r in roles) == 2 and sum("framed original" in r for r in roles) == 1


@pytest.mark.shared_data
def test_the_recorded_edits_replay_the_images(collection):
    """Every image is its photo edited by its recorded PixTrace edits (recipe, then template), pixel for pixel."""
    folder, truth = collection
    photos = {path.stem: path for path in _train()}
    for role in ("framed copy", "framed copy of a copy", "stranger"):
        image_id, record = next((i, r) for i, r in truth["images"].items() if r["role"] == role)
        replayed = replay(photos[record["photo"]], record["edits"], fuse=False)
        assert np.array_equal(np.asarray(replayed.image), np.asarray(Image.open(folder / "collection" / f"{image_id}.png")))
        assert replayed.table.traced_fraction == pytest.approx(record["traced_fraction"])
        assert 0.0 < record["traced_fraction"] < 1.0  # the template's pixels come from no photo


@pytest.mark.shared_data
def test_the_detection_task_frames_queries_and_strangers_alike(tmp_path):
    truth = build_detect_task(tmp_path, _train(), 0, TINY_DETECT, TINY_DEDUP)
    references, queries = truth["references"], truth["queries"]
    roles = collections.Counter(r["role"] for r in references.values())
    assert roles == {"reference": 6, "framed stranger": 4}
    assert sorted(p.name for p in (tmp_path / "references").iterdir()) == sorted(
        [p.name for p in (tmp_path / "references_plain").iterdir()] + [p.name for p in (tmp_path / "strangers").iterdir()])
    assert collections.Counter(q["role"] for q in queries.values()) == {"framed copy": 2, "copy": 1, "distractor": 1}
    for query in queries.values():
        if query["reference"]:
            assert references[query["reference"]]["role"] == "reference"
            assert references[query["reference"]]["photo"] == query["photo"]
    stranger_templates = {r["template"] for r in references.values() if r["template"]}
    assert {q["template"] for q in queries.values() if q["template"]} <= stranger_templates
    rows = (tmp_path / "ground_truth.csv").read_text().splitlines()
    assert rows[0] == "query_id,reference_id" and len(rows) == 1 + 4
    dedup_photos = {r["photo"] for r in build_dedup_collection(tmp_path / "dedup", _train(), 0, TINY_DEDUP,
                                                                TINY_DETECT)["images"].values()}
    assert not dedup_photos & {r["photo"] for r in [*references.values(), *queries.values()]}


# ---------------------------------------------------------------------------------------------- the metrics


def _pairs(*rows):
    return [Prediction(a, b, s) for a, b, s in rows]


def test_pair_average_precision_on_a_hand_made_case():
    truth = {frozenset("ab"), frozenset("cd"), frozenset("ef")}
    scored = _pairs(("a", "b", 0.9), ("x", "y", 0.8), ("d", "c", 0.7), ("c", "d", 0.1))
    # true at ranks 1 and 3 (c-d keeps its best score), e-f never scored: (1/1 + 2/3) / 3
    assert pair_average_precision(scored, truth) == pytest.approx(5 / 9)
    # a false pair tied with a true one ranks first: (1/2) / 1
    assert pair_average_precision(_pairs(("a", "b", 0.5), ("x", "y", 0.5)), {frozenset("ab")}) == pytest.approx(0.5)
    assert [sorted(p) for p, _ in ranked_pairs(scored, truth)] == [["a", "b"], ["x", "y"], ["c", "d"]]


def test_a_true_pair_never_scored_counts_as_missed():
    assert pair_average_precision(_pairs(("x", "y", 0.9)), {frozenset("ab")}) == 0.0
    assert pair_average_precision([], {frozenset("ab")}) == 0.0
    with pytest.raises(ValueError, match="true pair"):
        pair_average_precision(_pairs(("a", "b", 1.0)), set())


def test_template_false_pairs_share_a_template_but_not_a_photo():
    truth = {"images": {"a": {"photo": "p", "template": "t"}, "b": {"photo": "q", "template": "t"},
                        "c": {"photo": "p", "template": "t"}, "d": {"photo": "r", "template": None},
                        "e": {"photo": "s", "template": None}}, "groups": [["a", "c"]]}
    ranked = ranked_pairs(_pairs(("a", "b", 0.9), ("a", "c", 0.8), ("d", "e", 0.7), ("b", "c", 0.6)), true_pairs(truth))
    assert template_false_pairs(ranked, truth) == [("a", "b", 0.9), ("b", "c", 0.6)]
    assert template_false_pairs(ranked, truth, top=2) == [("a", "b", 0.9)]


def test_neighbour_normalisation_subtracts_the_mean_of_the_two_neighbour_means():
    cosines = np.array([[1.0, 0.9, 0.5, 0.1], [0.9, 1.0, 0.3, 0.2], [0.5, 0.3, 1.0, 0.4], [0.1, 0.2, 0.4, 1.0]])
    # ranks 2-3 among the others: image 0 -> (0.5 + 0.1) / 2, image 1 -> (0.3 + 0.2) / 2
    normalised = neighbour_normalised(cosines, 2, 3)
    assert normalised[0, 1] == pytest.approx(0.9 - (0.3 + 0.25) / 2)
    assert np.allclose(normalised, normalised.T)


# ---------------------------------------------------------------------------------------------- the command


def test_options_reach_the_requests_and_unknown_ones_are_refused(tmp_path):
    request = dedup_request(tmp_path / "images", tmp_path / "out", {"threshold": 0.7, "matcher": "none"})
    assert request.threshold == 0.7 and not request.pipeline.models.has_matcher
    assert request.pipeline.config().candidates == 10 and request.settings.collection.on
    request = dedup_request(tmp_path / "images", tmp_path / "out", {"collection_normalisation": False, "candidates": 4,
                                                                    "grouping": "connected", "batch_size": 8})
    assert (request.pipeline.config().candidates, request.pipeline.batch_size) == (4, 8)
    assert (request.settings.collection.on, request.settings.matcher_normalisation) == (False, False)
    assert request.settings.grouping == "connected"
    with pytest.raises(SystemExit, match="'no_such_field' is not a field of DedupRequest"):
        dedup_request(tmp_path / "images", tmp_path / "out", {"no_such_field": "x"})
    detect = detect_request(tmp_path, "references", tmp_path / "out", {"matcher": "none", "candidates": 20})
    assert detect.pipeline.config().candidates == 20 and not detect.pipeline.models.has_matcher
    assert detect.queries == str(tmp_path / "queries") and detect.references == str(tmp_path / "references")
    with pytest.raises(SystemExit, match="'colour'"):
        detect_request(tmp_path, "references", tmp_path / "out", {"colour": "red"})


def test_the_command_skips_without_the_data(tmp_path, capsys):
    assert main(["--output", str(tmp_path / "out"), "--pool", "evaluation", "--data", str(tmp_path / "nothing")]) == 0
    assert "skipped" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_command_asks_for_a_pool(tmp_path, capsys):
    """No pool is assumed: a run says whether it is a reported (evaluation) or a development (dev) draw."""
    with pytest.raises(SystemExit):
        main(["--output", str(tmp_path / "out"), "--data", str(tmp_path / "nothing")])
    assert "--pool" in capsys.readouterr().err and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- the pools


@pytest.fixture
def data(tmp_path):
    """A data folder laid out as ``../shared/data``: 16 reference, 4 distractor and 20 train names, each a link
    to one of the bundled images (in turn)."""
    folder, assets = tmp_path / "data", sorted(ASSET_IMAGES.glob("*.jpg"))
    (folder / "imagenet-sample").mkdir(parents=True)
    splits = ["reference"] * 16 + ["distractor"] * 4 + ["train"] * 20
    with (folder / "imagenet-sample-splits.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["filename", "split"])
        for number, split in enumerate(splits):
            name = f"n{number:03d}_{split}.jpg"
            (folder / "imagenet-sample" / name).symlink_to(assets[number % len(assets)])
            writer.writerow([name, split])
    return folder


def _split(photo) -> str:
    return photo.stem.split("_")[1]


def test_the_evaluation_pool_never_yields_a_train_photo_nor_the_dev_pool_an_evaluation_one(data):
    evaluation, dev = pool_photos("evaluation", data), pool_photos("dev", data)
    assert len(evaluation) == 20 and {_split(p) for p in evaluation} == {"reference", "distractor"}
    assert len(dev) == 20 and {_split(p) for p in dev} == {"train"}
    for seed in range(5):
        for pool, splits in ((evaluation, {"reference", "distractor"}), (dev, {"train"})):
            drawn = draw_photos(pool, seed, TINY_DEDUP, TINY_DETECT)
            assert {_split(p) for photos in drawn.values() for p in photos} <= splits
    with pytest.raises(ValueError, match="'held-out' is none of evaluation, dev"):
        pool_photos("held-out", data)
    with pytest.raises(FileNotFoundError, match="imagenet-sample-splits.csv not found"):
        pool_photos("dev", data / "nothing")


def test_a_draw_records_its_pool(tmp_path, data):
    photos = pool_photos("evaluation", data)
    dedup = build_dedup_collection(tmp_path / "dedup", photos, 1, TINY_DEDUP, TINY_DETECT, "evaluation")
    detect = build_detect_task(tmp_path / "detect", photos, 1, TINY_DETECT, TINY_DEDUP, "evaluation")
    for folder, truth in (("dedup", dedup), ("detect", detect)):
        assert truth["pool"] == json.loads((tmp_path / folder / "truth.json").read_text())["pool"] == "evaluation"
    used = [r["photo"] for r in [*dedup["images"].values(), *detect["references"].values(), *detect["queries"].values()]]
    assert used and {photo.split("_")[1] for photo in used} <= {"reference", "distractor"}


@pytest.mark.shared_data
def test_the_default_tasks_fit_their_pools_and_stay_in_them():
    """The reported draws (seeds 0-2) take reference and distractor photos only, the dev draws train photos only;
    the 400 evaluation photos hold the detection task with 237 plain references, not with 300."""
    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    from copynce_hf.evaluation.minidisc import read_splits

    splits = {photo.name: split for split, photos in read_splits(SPLITS_CSV, SHARED_DATA / "imagenet-sample").items()
              for photo in photos}
    for pool, allowed in (("evaluation", {"reference", "distractor"}), ("dev", {"train"})):
        photos = pool_photos(pool, SHARED_DATA)
        assert {splits[p.name] for p in photos} == allowed
        for seed in range(4):
            drawn = draw_photos(photos, seed, DEFAULT_DEDUP, DETECT_PLANS[pool])
            assert {splits[p.name] for group in drawn.values() for p in group} <= allowed
    assert DETECT_PLANS["evaluation"].references == 237 and DETECT_PLANS["dev"] == DEFAULT_DETECT
    with pytest.raises(ValueError, match="the pool has 400 photos"):
        draw_photos(pool_photos("evaluation", SHARED_DATA), 0, DEFAULT_DEDUP, DEFAULT_DETECT)
