"""The evaluation query recipe: one type, two presets, families as data."""

import json

import numpy as np
import pytest

from copynce_hf.demo import DemoRecipe
from copynce_hf.errors import ConfigError
from copynce_hf.evaluation.minidisc import EvaluationRecipe
from copynce_hf.evaluation.recipes import PHOTOMETRIC_FAMILIES, STRUCTURAL_FAMILIES, QueryRecipe


def test_presets_and_aliases():
    assert DemoRecipe() == QueryRecipe.demo() and EvaluationRecipe() == QueryRecipe.minidisc() == QueryRecipe()
    assert QueryRecipe.demo() != QueryRecipe.minidisc()
    assert QueryRecipe.demo(max_side=64).max_side == 64 and EvaluationRecipe(max_side=64).crop_min_side == 1
    for recipe in (QueryRecipe.demo(), QueryRecipe.minidisc()):
        described = recipe.to_dict()
        assert json.loads(json.dumps(described)) == described
        assert {name for name, _ in recipe.structural_weights} <= set(STRUCTURAL_FAMILIES)
        assert {name for name, _ in recipe.photometric_weights} <= set(PHOTOMETRIC_FAMILIES)


@pytest.mark.parametrize("field, value, message", [
    ("structural_weights", (("melt", 1.0),), "structural_weights: unknown family 'melt'"),
    ("photometric_weights", (("brightness", -1.0),), "weight of 'brightness' must be >= 0"),
    ("num_structural", (1, 9), "num_structural"),
    ("crop_min_side", 0, "crop_min_side=0"),
    ("max_side", 8, "max_side=8"),
])
def test_bad_fields_are_named(field, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        QueryRecipe(**{field: value})


@pytest.mark.parametrize("preset, floor", [(QueryRecipe.demo, 16), (QueryRecipe.minidisc, 1)])
def test_crop_floor_is_a_parameter(preset, floor):
    # Only the heavy crop on a 24 x 20 image: the kept box is never smaller than the preset's floor.
    recipe = preset(structural_weights=(("heavy_crop_overlays", 1.0),), num_structural=(1, 1),
                    photometric_weights=(("brightness", 1.0),), num_photometric=(0, 0), crop_area=(0.01, 0.02))
    sides = set()
    for k in range(30):
        crop = recipe.draw(np.random.default_rng(k), (24, 20))[0].to_dict()["params"]
        sides |= {crop["right"] - crop["left"], crop["bottom"] - crop["top"]}
    assert sides <= set(range(floor, 25))
    assert min(sides) == floor if floor > 1 else min(sides) < 16  # the demo's floor binds; mini-DISC's crops are tiny
