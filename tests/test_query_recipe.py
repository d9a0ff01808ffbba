"""The evaluation queries: two presets of the one copy recipe type, families as data."""

import dataclasses
import json

import numpy as np
import pytest

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import CopyRecipe


def test_the_two_query_presets():
    assert CopyRecipe.demo_queries() != CopyRecipe.minidisc_queries()
    assert dataclasses.replace(CopyRecipe.demo_queries(), max_side=64).max_side == 64
    assert CopyRecipe.minidisc_queries().heavy_crop_overlays.crop_min_side == 1
    for recipe in (CopyRecipe.demo_queries(), CopyRecipe.minidisc_queries()):
        described = recipe.to_dict()
        assert json.loads(json.dumps(described)) == described
        assert CopyRecipe.from_dict(json.loads(json.dumps(described))) == recipe
        assert set(recipe.structural.members) | set(recipe.photometric.members) <= set(recipe.step_names())


@pytest.mark.parametrize("change, message", [
    (lambda r: r.updated({"structural": {"weights": [["melt", 1.0]], "count": [1, 1]}}), "member .melt. is not a drawing step"),
    (lambda r: r.updated({"photometric": {"weights": [["brightness", -1.0]]}}), "weight of 'brightness' must be >= 0"),
    (lambda r: r.updated({"structural": {"count": [1, 9]}}), "structural.*count"),
    (lambda r: r.updated({"heavy_crop_overlays": {"crop_min_side": 0}}), "crop_min_side=0"),
    (lambda r: dataclasses.replace(r, max_side=8), "max_side=8"),
])
def test_bad_fields_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        change(CopyRecipe.minidisc_queries())


@pytest.mark.parametrize("preset, floor", [(CopyRecipe.demo_queries, 16), (CopyRecipe.minidisc_queries, 1)])
def test_crop_floor_is_a_parameter(preset, floor):
    # Only the heavy crop on a 24 x 20 image: the kept box is never smaller than the preset's floor.
    recipe = preset().updated({
        "structural": {"weights": [["heavy_crop_overlays", 1.0]], "count": [1, 1]},
        "photometric": {"weights": [["brightness", 1.0]], "count": [0, 0]},
        "heavy_crop_overlays": {"crop_area": [0.01, 0.02]},
    })
    sides = set()
    for k in range(30):
        crop = recipe.draw(np.random.default_rng(k), (24, 20))[0].to_dict()["params"]
        sides |= {crop["right"] - crop["left"], crop["bottom"] - crop["top"]}
    assert sides <= set(range(floor, 25))
    assert min(sides) == floor if floor > 1 else min(sides) < 16  # the demo's floor binds; mini-DISC's crops are tiny
