"""Tests of the benchmark of ``copynce dedup``'s defaults on user-shaped folders (benchmarks/quality/dedup_folders.py):
its folders built from a tiny data folder of the bundled images, with copies the self-calibration never plants,
from disjoint photos per draw, and the table of its draws."""

from __future__ import annotations

import csv

import pytest

from benchmarks.quality.dedup_folders import (
    build_folder,
    draw_photos,
    everyday_recipe,
    print_table,
    summary_rows,
)
from copynce_hf.calibration.synthetic import COPY_RECIPE
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.pixtrace import CopyRecipe

ASSETS = sorted(ASSET_IMAGES.glob("*.jpg"))


@pytest.fixture
def data(tmp_path):
    """A data folder laid out as ``../shared/data``: the bundled images, 8 references, 3 distractors, the rest
    train."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "imagenet-sample").symlink_to(ASSET_IMAGES)
    with (folder / "imagenet-sample-splits.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["filename", "split"])
        for index, file in enumerate(ASSETS):
            writer.writerow([file.name, "reference" if index < 8 else "distractor" if index < 11 else "train"])
    return folder


def test_the_copies_are_made_with_a_recipe_the_self_calibration_never_plants():
    mine = everyday_recipe().to_dict()["steps"]
    planted = CopyRecipe.preset(COPY_RECIPE).to_dict()["steps"]
    assert COPY_RECIPE == "calibration_copies"
    assert not {"screenshot", "meme_format", "heavy_crop_overlays", "skew", "solarize"} & set(mine)  # nor mini-DISC's
    assert mine != planted and everyday_recipe().max_side == 640 != CopyRecipe.preset(COPY_RECIPE).max_side


def test_the_folders_hold_the_photos_of_their_pool_and_one_copy_of_some_of_them(tmp_path, data):
    first, second = (draw_photos("evaluation", draw, 4, data) for draw in (1, 2))
    assert not {p.name for p in first} & {p.name for p in second}  # the draws share no photo
    assert {p.name for p in first + second} <= {p.name for p in ASSETS[:11]}  # references and distractors only
    held_out = [p.name for p in draw_photos("dev", 1, 1, data)]
    assert held_out == [p.name for p in draw_photos("dev", 2, 1, data)] == [ASSETS[-1].name]  # the last train photo
    truth = build_folder(tmp_path / "d1", "evaluation", 1, 4, 2, data)
    made = sorted(path.stem for path in (tmp_path / "d1" / "collection").iterdir())
    assert truth["images"] == len(made) == 6 and truth["true_pairs"] == 2 and len(truth["groups"]) == 2
    assert sorted(image for group in truth["groups"] for image in group[1:]) == sorted(
        name for name in made if name.endswith("_copy"))
    assert all(group[1] == f"{group[0]}_copy" and truth["edits"][group[1]] for group in truth["groups"])
    assert truth["photos"] == [p.name for p in first]
    assert build_folder(tmp_path / "d1", "evaluation", 1, 4, 2, data) == truth  # reused
    again = build_folder(tmp_path / "again", "evaluation", 1, 4, 2, data)
    assert again["groups"] == truth["groups"] and again["edits"] == truth["edits"]  # seeded
    with pytest.raises(SystemExit, match="runs past"):
        draw_photos("evaluation", 3, 4, data)


def test_the_table_gives_each_draw_and_the_mean_and_spread(capsys):
    rows = [{"pool": "evaluation", "draw": draw, "images": 55, "true_pairs": 15, "threshold": threshold, "groups": 12,
             "group_precision": 1.0, "group_recall": recall, "pair_AP": 0.9, "seconds": 100.0,
             "stage_seconds": {"self-calibration": 60.0}} for draw, threshold, recall in ((1, 0.99, 0.8), (2, 0.98, 0.6))]
    summary = summary_rows(rows)
    assert summary["group_recall"] == {"mean": pytest.approx(0.7), "spread": pytest.approx(0.1)}
    print_table(rows)
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| evaluation 1 | 55 | 15 | 0.99 | 12 | 1.000 | 0.800 | 0.900 | 100 (60) |"
    assert "group_recall 0.700 +- 0.100;" in out[-1]
