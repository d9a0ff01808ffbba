"""More instances from few photos (copynce_hf.data.instances): grid cells, mixes, procedural images, the folder.

Tiny photos (flat colours and noise, 40-130 pixels) are written into tmp folders; no benchmark data is read.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from PIL import Image

from copynce_hf.data import load_image_dataset
from copynce_hf.data.instances import (
    MANIFEST,
    InstancePlan,
    collage,
    cutmix,
    grid_boxes,
    grid_cells,
    list_photos,
    make_instances,
    mix_groups,
    procedural_image,
    read_manifest,
)
from copynce_hf.data.instances.__main__ import main
from copynce_hf.modeling.errors import ConfigError

COLOURS = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (250, 250, 10), (10, 250, 250), (250, 10, 250)]


def _photos(folder, count=6, size=(130, 100), names=None):
    """``count`` noise photos (PNG, lossless) named ``names`` (default p00.png, p01.png, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for name in names or [f"p{i:02d}.png" for i in range(count)]:
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / name)
        paths.append(folder / name)
    return paths


# ------------------------------------------------------------------------------------------------ grid
def test_grid_cells_partition_the_photo_or_leave_gaps_between_them():
    coverage = np.zeros((67, 101), dtype=int)
    cells = grid_boxes((101, 67), 3, min_side=16)
    for _, _, (left, top, right, bottom) in cells:
        coverage[top:bottom, left:right] += 1
    assert len(cells) == 9 and (coverage == 1).all()  # every pixel in exactly one cell
    assert {right - left for _, _, (left, _, right, _) in cells} <= {33, 34}
    assert [(row, column) for row, column, _ in cells] == list(itertools.product(range(3), range(3)))

    coverage[:] = 0
    gapped = grid_boxes((101, 67), 3, gap=0.1, min_side=16)
    for _, _, (left, top, right, bottom) in gapped:
        coverage[top:bottom, left:right] += 1
    assert coverage.max() == 1 and 0 < coverage.mean() < 0.8  # no pixel shared, bands left out
    lefts = sorted({box[0] for _, _, box in gapped})
    rights = sorted({box[2] for _, _, box in gapped})
    assert [lefts[i + 1] - rights[i] for i in range(2)] == [10, 10]  # round(0.1 * 101) pixels between columns


def test_grid_cells_hold_the_photos_pixels_and_refuse_small_cells():
    image = Image.fromarray(np.arange(80 * 60 * 3, dtype=np.uint32).reshape(60, 80, 3).astype(np.uint8))
    for (_, _, box), cell in grid_cells(image, 2, min_side=16):
        assert np.array_equal(np.asarray(cell), np.asarray(image)[box[1]:box[3], box[0]:box[2]])
    with pytest.raises(ConfigError, match=r"photo.png \(80x60\) is too small for a 2x2 grid.*30 pixels.*min_side 64"):
        grid_boxes(image.size, 2, min_side=64, name="photo.png")
    for bad, match in [({"cells": 1}, "integer >= 2"), ({"gap": 0.5}, r"\[0, 0.5\)"), ({"min_side": 8}, "at least 16")]:
        with pytest.raises(ConfigError, match=match):
            grid_boxes(image.size, **{"cells": 2, "min_side": 16, **bad})


# ------------------------------------------------------------------------------------------------ mixes
def test_mix_groups_use_distinct_photos_evenly_and_follow_the_seed():
    groups = mix_groups(40, 13, (2, 3, 4), np.random.default_rng(5))
    assert all(len(set(group)) == len(group) and 2 <= len(group) <= 4 for group in groups)
    uses = np.bincount([index for group in groups for index in group], minlength=13)
    assert uses.max() - uses.min() <= 1
    assert groups == mix_groups(40, 13, (2, 3, 4), np.random.default_rng(5))
    assert groups != mix_groups(40, 13, (2, 3, 4), np.random.default_rng(6))
    with pytest.raises(ConfigError, match=r"collage: 40 mixes of 2-4 photos use a photo \d+ times .* max_uses 3"):
        mix_groups(40, 13, (2, 3, 4), np.random.default_rng(5), max_uses=3, kind="collage")
    with pytest.raises(ConfigError, match="at least 2 different photos; 1 given"):
        mix_groups(3, 1, (2,), np.random.default_rng(0))


def test_collage_fills_each_part_with_its_photo_and_cutmix_pastes_over_the_first():
    photos = [Image.new("RGB", (90, 70), colour) for colour in COLOURS[:4]]
    image, parts = collage(photos, 120, np.random.default_rng(1))
    assert max(image.size) == 120 and sorted(position for position, _ in parts) == [0, 1, 2, 3]
    pixels, coverage = np.asarray(image), np.zeros(image.size[::-1], dtype=int)
    for position, (left, top, right, bottom) in parts:
        coverage[top:bottom, left:right] += 1
        assert (pixels[top:bottom, left:right] == COLOURS[position]).all()
    assert (coverage == 1).all()  # the parts tile the canvas
    again, _ = collage(photos, 120, np.random.default_rng(1))
    assert np.array_equal(np.asarray(again), pixels)

    mixed, parts = cutmix(photos[:3], 100, np.random.default_rng(2))
    assert parts[0] == (0, (0, 0, 100, 78)) and [position for position, _ in parts] == [0, 1, 2]
    last, (left, top, right, bottom) = parts[-1]
    assert (np.asarray(mixed)[top:bottom, left:right] == COLOURS[last]).all()
    assert (np.asarray(mixed) == COLOURS[0]).all(axis=-1).any()  # the first photo shows around the pastes
    with pytest.raises(ConfigError, match="collage: takes 2 to 4 photos, got 1"):
        collage(photos[:1], 100, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------------ procedural
def test_procedural_images_are_deterministic_differ_by_seed_and_are_not_near_duplicates():
    first = [np.asarray(procedural_image(index, 3, (48, 64))) for index in range(12)]
    assert all(image.shape == (48, 64, 3) for image in first)
    assert all(np.array_equal(a, np.asarray(procedural_image(i, 3, (48, 64)))) for i, a in enumerate(first[:3]))
    assert all(not np.array_equal(a, np.asarray(procedural_image(i, 4, (48, 64)))) for i, a in enumerate(first[:3]))
    thumbnails = [np.asarray(Image.fromarray(image).resize((16, 16), Image.Resampling.BILINEAR), dtype=float)
                  for image in first]
    # mean absolute difference out of 255: an image and a re-encoded or lightly edited copy of it differ by < 5
    assert min(np.abs(a - b).mean() for a, b in itertools.combinations(thumbnails, 2)) > 10
    with pytest.raises(ConfigError, match="'waves' is not one of"):
        procedural_image(0, 0, (32, 32), style="waves")
    with pytest.raises(ConfigError, match="at least 16 pixels, got 8x32"):
        procedural_image(0, 0, (8, 32))


# ------------------------------------------------------------------------------------------------ the folder
def test_plan_specs_read_every_kind_and_refuse_the_rest():
    plan = InstancePlan.parse("photos,grid3gap0.05,collage7,cutmix2,procedural11", side=64)
    assert (plan.photos, plan.grid, plan.gap, plan.collages, plan.cutmixes, plan.procedural, plan.side) == \
        (True, 3, 0.05, 7, 2, 11, 64)
    with pytest.raises(ConfigError, match="cannot read 'mixup5'"):
        InstancePlan.parse("grid2,mixup5")
    with pytest.raises(ConfigError, match="makes no instance"):
        InstancePlan()
    for bad, match in [({"grid": 1}, "grid must be 0"), ({"grid": 2, "gap": 0.7}, "gap must be"),
                       ({"procedural": 1, "small": "drop"}, "small must be"), ({"procedural": -1}, "procedural must")]:
        with pytest.raises(ConfigError, match=match):
            InstancePlan(**bad)


def test_the_folder_keeps_held_out_photos_whole_and_last_and_maps_every_file(tmp_path):
    photos = _photos(tmp_path / "photos", count=7)
    training, held_out = photos[:5], photos[5:]
    plan = InstancePlan(photos=True, grid=2, collages=3, cutmixes=2, procedural=4, side=48, min_side=32)
    records = make_instances(training, tmp_path / "out", plan, seed=1, held_out=held_out)
    files = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != MANIFEST)
    assert files == [record["file"] for record in records]  # the manifest lists the files in name order
    assert files[-2:] == ["p05.png", "p06.png"]  # held out: own names (they sort after the numbers), last
    assert all((tmp_path / "out" / name).read_bytes() == path.read_bytes() for name, path in zip(files[-2:], held_out))
    kinds = [record["kind"] for record in records]
    assert kinds == ["photo"] * 5 + ["grid"] * 20 + ["collage"] * 3 + ["cutmix"] * 2 + ["procedural"] * 4 + \
        ["held_out"] * 2
    sources = {source for record in records[:-2] for source in record["sources"]}
    assert sources == {str(path) for path in training}  # never a held-out photo
    assert all(2 <= len(set(r["sources"])) == len(r["sources"]) for r in records if r["kind"] in ("collage", "cutmix"))
    manifest = read_manifest(tmp_path / "out")
    assert manifest["instances"] == records and manifest["settings"]["seed"] == 1
    assert manifest["held_out_photos"] == [str(path) for path in held_out]
    # what training reads: the folder's last images are the held-out photos
    ids = load_image_dataset(str(tmp_path / "out"), "train")["image_id"]
    assert len(ids) == len(records) and ids[-2:] == ["p05", "p06"]


def test_the_folder_follows_its_seed(tmp_path):
    photos = _photos(tmp_path / "photos", count=4)
    plan = InstancePlan(collages=2, cutmixes=1, procedural=2, side=40)

    def written(folder, seed):
        make_instances(photos, folder, plan, seed=seed)
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != MANIFEST}

    first, again, other = written(tmp_path / "a", 0), written(tmp_path / "b", 0), written(tmp_path / "c", 1)
    assert first == again and len(first) == 5
    assert len(other) == 5 and set(first.values()).isdisjoint(other.values())  # another seed: other images


def test_small_photos_unsortable_held_out_names_and_bad_folders(tmp_path, caplog):
    photos = _photos(tmp_path / "photos", names=["b.png", "c.png", "0.png"])
    small = _photos(tmp_path / "small", size=(40, 40), names=["a.png"])[0]
    plan = InstancePlan(grid=2, min_side=32)
    records = make_instances([small, *photos[:2]], tmp_path / "out", plan, held_out=[photos[2]])
    assert [r["kind"] for r in records] == ["photo"] + ["grid"] * 8 + ["held_out"]
    assert "1 photo(s) too small for a 2x2 grid" in caplog.text
    assert records[-1]["file"] == "00009-0.png"  # "0.png" would sort first: numbered after the instances
    skipped = make_instances([small, *photos[:2]], tmp_path / "skip", InstancePlan(grid=2, min_side=32, small="skip"))
    assert [r["kind"] for r in skipped] == ["grid"] * 8
    with pytest.raises(ConfigError, match=r"a.png \(40x40\) is too small for a 2x2 grid"):
        make_instances([small], tmp_path / "error", InstancePlan(grid=2, min_side=32, small="error"))
    with pytest.raises(ConfigError, match="already holds images"):
        make_instances(photos[:2], tmp_path / "out", plan)
    assert len(make_instances(photos[:2], tmp_path / "out", plan, overwrite=True)) == 8
    with pytest.raises(ConfigError, match="both a training photo and a held-out one"):
        make_instances(photos[:2], tmp_path / "both", plan, held_out=photos[1:2])
    with pytest.raises(ConfigError, match="no training photo"):
        make_instances([], tmp_path / "none", plan)
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ConfigError, match="cannot make instances of .*broken.jpg"):
        make_instances([tmp_path / "broken.jpg"], tmp_path / "bad", plan)
    with pytest.raises(ConfigError, match="holds no images"):
        list_photos(tmp_path / "bad")
    with pytest.raises(ConfigError, match="does not exist"):
        list_photos(tmp_path / "missing")


def test_the_command_line_holds_out_the_folders_last_photos(tmp_path):
    _photos(tmp_path / "photos", count=5)
    records = main(["--dataset", str(tmp_path / "photos"), "--output", str(tmp_path / "out"), "--grid", "2",
                    "--procedural", "2", "--side", "32", "--min_side", "32", "--held_out", "1", "--seed", "3"])
    assert [r["kind"] for r in records] == ["grid"] * 16 + ["procedural"] * 2 + ["held_out"]
    assert records[-1]["file"] == "p04.png"
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["settings"]["seed"] == 3
    with pytest.raises(ConfigError, match="is inside --dataset"):
        main(["--dataset", str(tmp_path), "--output", str(tmp_path / "inside"), "--grid", "2"])
    with pytest.raises(ConfigError, match="--held_out 5: .* holds 5 photos"):
        main(["--dataset", str(tmp_path / "photos"), "--output", str(tmp_path / "o2"), "--grid", "2", "--held_out", "5"])
