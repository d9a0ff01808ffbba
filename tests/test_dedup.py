"""``copynce dedup``: self-search, matcher verification and groups of copies, on tiny random models (the
mechanics) and on planted copies with the embedded models (pair precision and recall)."""

from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest
from conftest import run_cli, save_tiny_models, tiny_models
from PIL import Image

from copynce_hf.retrieval import (
    Descriptor,
    DetectConfig,
    ImageFolderSource,
    connected_groups,
    dedup,
    pair_precision_recall,
)


def test_connected_groups_are_components_in_collection_order():
    ids = ["a", "b", "c", "d", "e", "f"]
    groups = connected_groups(ids, [("e", "c"), ("d", "b"), ("c", "a"), ("f", "f")])
    assert groups == [["a", "c", "e"], ["b", "d"]]  # f alone is no group
    assert connected_groups(ids, []) == []
    assert pair_precision_recall([["a", "c", "e"]], [["a", "c"], ["e", "f"]]) == (pytest.approx(1 / 3), 0.5)
    assert pair_precision_recall([], [["a", "b"]]) == (1.0, 0.0)


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """8 random images, of which R1 is copied byte for byte twice (R1_again, R1_third); the tiny random
    descriptor gives any two of these images a cosine above 0.97, identical files 1."""
    folder = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"R{i}.png")
    shutil.copy(folder / "R1.png", folder / "R1_again.png")
    shutil.copy(folder / "R1.png", folder / "R1_third.png")
    return folder


@pytest.mark.parametrize("with_matcher", [False, True])
def test_identical_images_form_one_group_and_no_image_is_its_own_pair(collection, tmp_path, with_matcher):
    descriptor, matcher, processor = tiny_models(0)
    source = ImageFolderSource(collection)
    lines: list[str] = []
    result = dedup(source, Descriptor("tiny", descriptor, processor), (matcher, processor) if with_matcher else None,
                   threshold=0.9999 if not with_matcher else 0.0, config=DetectConfig(candidates=9 if with_matcher else 1),
                   index_folder=tmp_path / "idx", progress=False, log=lines.append)
    order = {image_id: i for i, image_id in enumerate(source.ids)}
    assert result.pairs and all(order[p.query_id] < order[p.reference_id] for p in result.pairs)  # never (x, x)
    assert len({(p.query_id, p.reference_id) for p in result.pairs}) == len(result.pairs)
    if with_matcher:
        # a threshold of 0 joins every verified pair: every image is in the one group, each scored to R0
        assert [image for image, _ in result.groups[0]] == source.ids and len(result.groups) == 1
        assert result.groups[0][0] == ("R0", None) and all(0 <= s <= 1 for _, s in result.groups[0][1:])
        assert result.matcher_cost["fused_pairs"] >= len(result.pairs)
    else:
        # the three identical files, scored 1 to the first (a member found only through another is scored too)
        assert [[image for image, _ in group] for group in result.groups] == [["R1", "R1_again", "R1_third"]]
        assert [score for _, score in result.groups[0][1:]] == [pytest.approx(1.0, abs=1e-5)] * 2
    assert any("candidate pairs among 10 images" in line for line in lines)
    assert (tmp_path / "idx" / "tiny" / "references" / "identity.json").is_file()  # detect's index cache


def test_copynce_dedup_writes_groups_pairs_and_gallery(collection, tmp_path, capsys):
    models = save_tiny_models(tmp_path / "models", seed=0)
    output = tmp_path / "found"
    code, out, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                         "--threshold", 0.9999, "--candidates", 2, "--output", output)
    assert code == 0, err
    assert "wrote 1 groups of copies (3 images)" in out and "dedup: read 10 images, skipped 0" in out
    with (output / "groups.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["group_id", "image_id", "score_to_first"]
    assert [row[:2] for row in rows[1:]] == [["0", "R1"], ["0", "R1_again"], ["0", "R1_third"]]
    assert rows[1][2] == "" and float(rows[2][2]) == pytest.approx(1.0, abs=1e-5)
    assert (output / "pairs.csv").read_text().startswith("query_id,reference_id,score\n")
    report = (output / "report.html").read_text()
    assert "Group 0: 3 images" in report and "R1_again" in report

    code, _, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                       "--output", tmp_path / "x")
    assert code == 2 and "--matcher none decides by descriptor cosine" in err and "--threshold" in err
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(collection / "R0.png", single / "R0.png")
    code, _, err = run_cli(capsys, "dedup", single, "--model", models["descriptor"], "--matcher", "none",
                       "--threshold", 0.9, "--output", tmp_path / "y")
    assert code == 2 and "needs at least 2 images, got 1" in err


def test_dedup_threshold_from_a_calibration_file(collection, tmp_path, capsys):
    from copynce_hf.retrieval.apps.calibration import Calibration, OperatingPoint, model_identity

    models = save_tiny_models(tmp_path / "models", seed=0)
    pipeline = {"descriptors": [model_identity(models["descriptor"], "descriptor")], "matcher": None,
                "preset": "fast", "settings": {"descriptor_lce": "none", "matcher_lce": "none",
                                               "score_normalisation": False}}
    rows = [OperatingPoint(0.9, 0.9999, 0.5), OperatingPoint(0.99, None, 0.0)]
    Calibration(pipeline, {"descriptor": rows}).save(tmp_path / "calibration.json")
    dedup_args = ("dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                  "--calibration", tmp_path / "calibration.json")
    code, out, err = run_cli(capsys, *dedup_args, "--output", tmp_path / "found")
    assert code == 0, err
    assert "wrote 1 groups of copies (3 images)" in out
    assert "descriptor score 0.9999 at precision 0.9 in" in (tmp_path / "found" / "report.html").read_text()

    code, _, err = run_cli(capsys, *dedup_args, "--precision", 0.99, "--output", tmp_path / "x")
    assert code == 2 and "no descriptor score reached precision 0.99" in err
    code, _, err = run_cli(capsys, *dedup_args, "--threshold", 0.5, "--output", tmp_path / "x")
    assert code == 2 and "give --threshold or --calibration, not both" in err
    code, _, err = run_cli(capsys, *dedup_args, "--descriptor-lce", "matcher-views", "--output", tmp_path / "x")
    assert code == 2 and "made with descriptor_lce 'none', but this dedup run uses 'matcher-views'" in err
    Calibration({**pipeline, "descriptors": ["embedded:descriptor"]}, {"descriptor": rows}).save(tmp_path / "other.json")
    code, _, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                       "--calibration", tmp_path / "other.json", "--output", tmp_path / "x")
    assert code == 2 and "made with descriptor model(s) ['embedded:descriptor']" in err


def planted_collection(folder, copies: int = 2, side: int = 160, seed: int = 0) -> list[list[str]]:
    """The bundled images shrunk to ``side`` pixels, each with ``copies`` copies made with the ``demo_queries``
    recipe; returns the true groups (original and its copies)."""
    from copynce_hf.data import ASSET_IMAGES
    from copynce_hf.pixtrace import CopyRecipe

    recipe, rng, truth = CopyRecipe.preset("demo_queries"), np.random.default_rng(seed), []
    for path in sorted(ASSET_IMAGES.glob("*.jpg")):
        image = Image.open(path).convert("RGB")
        image.thumbnail((side, side))
        image.save(folder / f"{path.stem}.png")
        truth.append([path.stem])
        for copy in range(copies):
            recipe.apply(image, rng)[0].save(folder / f"{path.stem}_copy{copy}.png")
            truth[-1].append(f"{path.stem}_copy{copy}")
    return truth


# The floor is the promise (precision and recall 0.7 on 36 true pairs); the embedded models miss it today:
# precision 0.74, recall 0.69 on this set with content tokens (the default; without them precision 0.50, recall
# 0.69, seed 0; 0.77 / 0.83 and 0.32 / 0.78 with seeds 1 and 2 before content tokens): the matcher scores
# look-alike textures (grass, gravel, brick) and clock_motion against retina as copies at 0.99+, and connected
# components chain them: the models and the grouping, not this test, must change (content over frame; grouping
# that does not chain).
# strict: the day the models or the grouping reach the floor, this marker fails the run and must go.
@pytest.mark.xfail(strict=True, reason="a known shortfall of the embedded models: the matcher merges look-alike "
                                       "textures; measured precision 0.74 at recall 0.69 < 0.7 (seed 0)")
def test_planted_copies_are_grouped_with_the_embedded_models(tmp_path):
    from copynce_hf.model_loading import load_model

    truth = planted_collection(tmp_path)
    # 12 groups of an original and its 2 copies: 36 images, 36 true pairs. One false merge of two groups adds
    # 3 x 3 = 9 false pairs (precision 0.8 if nothing else is wrong): no single merge decides the floor.
    assert len(truth) == 12 and all(len(group) == 3 for group in truth)
    descriptor = Descriptor("embedded", *load_model(None, "descriptor", "--model"))
    result = dedup(ImageFolderSource(tmp_path), descriptor, load_model(None, "matcher", "--matcher"), threshold=0.5,
                   config=DetectConfig(candidates=5), progress=False)
    found = [[image for image, _ in group] for group in result.groups]
    precision, recall = pair_precision_recall(found, truth)
    assert precision >= 0.7 and recall >= 0.7, (precision, recall, found)
