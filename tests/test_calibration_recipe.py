"""The calibrations' copy recipe (``CopyRecipe.calibration_copies``): a recipe of its own, unlike every other recipe of
the repository (the benchmarks' and the training's), seeded to the pixel, every step reachable, no copy blank."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from benchmarks.quality.dedup_folders import everyday_recipe
from benchmarks.templates.lone import photometric_recipe
from copynce_hf.calibration import planted, synthetic
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.pixtrace import CopyRecipe, replay
from copynce_hf.pixtrace.recipes import PRESETS
from copynce_hf.pixtrace.steps import OneOf, SomeOf

PHOTO = sorted(ASSET_IMAGES.glob("*.jpg"))[0]


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    image = Image.open(PHOTO).convert("RGB")
    image.thumbnail((160, 160))
    return image


def test_it_is_a_preset_of_its_own_and_the_calibrations_plant_it():
    recipe = CopyRecipe.preset("calibration_copies")
    assert "calibration_copies" in PRESETS and recipe == CopyRecipe.calibration_copies()
    assert synthetic.COPY_RECIPE == planted.COPY_RECIPE == "calibration_copies"
    others = {name: CopyRecipe.preset(name) for name in PRESETS if name != "calibration_copies"}
    others |= {"everyday_recipe": everyday_recipe(), "photometric_recipe": photometric_recipe()}
    assert set(others) >= {"training", "light_copy", "paper_descriptor", "paper_matcher", "minidisc_queries",
                           "demo_queries"}
    mine = recipe.to_dict()
    for name, other in others.items():
        assert other.to_dict() != mine, name
        # no other recipe holds one of its steps with the same ranges, under any name
        theirs = [json.dumps(step, sort_keys=True) for step in other.to_dict()["steps"].values()]
        shared = [key for key, step in mine["steps"].items() if json.dumps(step, sort_keys=True) in theirs
                  and step["type"] not in ("horizontal_flip", "grayscale")]  # steps without a range
        assert not shared, (name, shared)
    assert json.loads(json.dumps(mine)) == mine and CopyRecipe.from_dict(mine) == recipe
    assert recipe.shared_generator and recipe.max_side == 600


def test_the_same_seed_gives_the_same_pixels_and_another_seed_other_ones(photo):
    recipe = CopyRecipe.calibration_copies()
    copies = [recipe.apply(photo, np.random.default_rng([5, k])) for k in (0, 0, 1)]
    assert copies[0][2] == copies[1][2] != copies[2][2]
    assert np.array_equal(np.asarray(copies[0][0]), np.asarray(copies[1][0]))
    # copynce calibrate renders the recorded edits again with replay (edit by edit): the same pixels
    assert np.array_equal(np.asarray(replay(photo, copies[0][2], fuse=False).image), np.asarray(copies[0][0]))


def test_every_step_is_drawn_and_no_copy_is_blank(photo):
    recipe = CopyRecipe.calibration_copies()
    drawing = {name for name, step in recipe.steps if not isinstance(step, (OneOf, SomeOf))}
    assert drawing == set(recipe.structural.members) | set(recipe.photometric.members)
    scheduled, counts = set(), set()
    for k in range(120):
        before, after = recipe.schedule(np.random.default_rng(k))
        names = [next(name for name, s in recipe.steps if s is step) for step, _ in before + after]
        scheduled |= set(names)
        counts.add((sum(n in recipe.structural.members for n in names),
                    sum(n in recipe.photometric.members for n in names)))
    assert scheduled == drawing
    assert counts == {(1, 1), (1, 2), (2, 1), (2, 2)}  # one or two of each family
    for k in range(40):  # every copy keeps a picture: not one flat colour
        image, table, _ = recipe.apply(photo, np.random.default_rng([7, k]))
        assert min(image.size) >= 16 and np.asarray(image).std() > 5.0
        assert max(image.size) <= 600 and table.size == (image.height, image.width)
