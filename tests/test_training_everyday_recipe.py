"""The training recipe widened with the edit families users meet (``CopyRecipe.training_everyday``): the training
recipe's own steps unchanged and in order, each added family reachable with ranges and words of its own (no evaluation
or calibration recipe draws one of its steps), copies traced to the pixel, and a name the training accepts."""

from __future__ import annotations

import json

import pytest
from _oracles import ramp_check
from conftest import ramp_image

from copynce_hf.data.pairs import RECIPES, CopyPairMaker
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import CopyEditor, CopyRecipe
from copynce_hf.pixtrace.recipes import PRESETS
from copynce_hf.pixtrace.steps import DEMO_WORDS, MINIDISC_WORDS, TRAINING_MEME_WORDS
from copynce_hf.training.config import TrainingConfig

ADDED = {"rotate", "skew", "aspect_ratio", "solarize", "posterize", "edge_enhance", "sharpen", "small_paste",
         "meme_format"}
EVALUATION_AND_CALIBRATION = ("minidisc_queries", "demo_queries", "calibration_copies")
#: Edits that change a pixel's colour: a copy holding one cannot be judged by the ramp's colours.
COLOUR_EDITS = {"color_jitter", "grayscale", "solarize", "posterize", "edge_enhance", "sharpen", "blur", "jpeg_quality",
                "noise", "pixelization", "shuffle_pixels"}


def test_it_is_the_training_recipe_with_the_everyday_families_added():
    recipe = CopyRecipe.preset("training_everyday")
    assert "training_everyday" in PRESETS and "training_everyday" in RECIPES
    training = dict(CopyRecipe.training().steps)
    mine = dict(recipe.steps)
    assert set(mine) == set(training) | ADDED
    assert all(mine[name] == step for name, step in training.items())  # the training steps as they were
    names = recipe.step_names()
    assert [n for n in names if n in training] == list(training)  # in their order
    assert names.index("rotate") > names.index("perspective") and names.index("meme_format") > names.index("pad")
    assert all(0.0 < mine[name].p <= 0.2 for name in ADDED)  # each on a minority of the copies
    assert recipe.fused and not recipe.shared_generator


def test_no_evaluation_or_calibration_recipe_draws_one_of_its_added_steps():
    mine = CopyRecipe.training_everyday().to_dict()["steps"]
    added = {json.dumps(mine[name], sort_keys=True) for name in ADDED}
    for name in EVALUATION_AND_CALIBRATION:
        theirs = {json.dumps(step, sort_keys=True) for step in CopyRecipe.preset(name).to_dict()["steps"].values()}
        assert not added & theirs, name
    assert not set(TRAINING_MEME_WORDS) & (set(MINIDISC_WORDS) | set(DEMO_WORDS))


def test_every_added_family_is_drawn_and_copies_trace_to_the_pixel():
    """The ramp oracle (``_oracles.ramp_check``) on the copies whose colours no edit changed: each traced pixel
    shows the ramp's colour at the source position its table names."""
    editor = CopyEditor(seed=0, recipe=CopyRecipe.training_everyday(), output_size=(64, 64))
    drawn, traced, checked = set(), set(), []
    for seed in range(320):
        result = editor(ramp_image(90, 120), seed=seed)
        names = {edit["name"] for edit in result.edits}
        drawn |= names
        if names & COLOUR_EDITS:
            continue
        check = ramp_check(result.image, result.table)
        if check.interior < 50:
            continue
        assert check.agreement >= 0.99 and check.max_abs_bias <= 0.6, (seed, sorted(names), check)
        checked.append(seed)
        traced |= names
    assert {"rotate", "skew", "change_aspect_ratio", "solarize", "posterize", "edge_enhance", "sharpen", "meme_format",
            "overlay_onto_background"} <= drawn
    assert len(checked) >= 12
    # the added geometric families among the copies the oracle judged
    assert {"rotate", "skew", "change_aspect_ratio", "meme_format", "overlay_onto_background"} <= traced


def test_the_training_takes_it_by_name_and_refuses_a_misspelt_one():
    maker = CopyPairMaker(32, query_recipe="training_everyday")
    image, table, log = maker.copy(ramp_image(90, 120), "training_everyday", 3)
    assert image.size == (32, 32) and table.size == (32, 32) and log
    assert TrainingConfig(query_recipe="training_everyday").query_recipe == "training_everyday"
    with pytest.raises(ConfigError, match="training_everyday"):
        TrainingConfig(query_recipe="training-everyday")
