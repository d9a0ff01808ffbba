"""Every list of edits the data pipeline records replays through ``pixtrace.replay``: same pixels, same table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from copynce_hf.data.pairs import RECIPES, CopyPairMaker
from copynce_hf.pixtrace import CopyEditor, CopyRecipe, replay


def _original(width=96, height=72) -> Image.Image:
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def _assert_replays(source: Image.Image, image: Image.Image, table, edits: list, fuse: bool = True) -> None:
    edits = json.loads(json.dumps(edits))  # recorded edits are JSON: replay what a file would hold
    again = replay(source, edits, fuse=fuse)
    assert np.array_equal(np.asarray(again.image), np.asarray(image))
    assert np.array_equal(again.table.coords, table.coords, equal_nan=True)


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_copy_pair_maker_recipe_replays(recipe):
    maker = CopyPairMaker(32, query_recipe=recipe, reference_recipe=recipe, max_source_side=0)
    source = _original()
    for seed in (0, 1, 2):
        image, table, log = maker.copy(source, recipe, seed)
        assert image.size == (32, 32) and log, recipe
        _assert_replays(source, image, table, log, fuse=maker.fused(recipe))


def test_pairs_replay_from_the_shrunk_original():
    maker = CopyPairMaker(32, max_source_side=64)
    original = _original(200, 150)
    pair = maker(original, original, 1, 5, 6)
    source = maker.source(original)
    for side in ("query", "reference"):
        image = getattr(pair, side)
        table = getattr(pair, f"{side}_table")
        _assert_replays(source, image, table, pair.edits[side], fuse=maker.fused(getattr(maker, f"{side}_recipe")))


@pytest.mark.parametrize("preset", ["training", "paper_descriptor", "paper_matcher", "off"])
def test_copy_recipe_presets_replay(preset):
    editor = CopyEditor(seed=0, recipe=getattr(CopyRecipe, preset)(), output_size=(40, 40))
    source = _original()
    for seed in (0, 7):
        result = editor(source, seed=seed)
        _assert_replays(source, result.image, result.table, result.edits, fuse=editor.fuse)


def test_evaluation_recipe_of_the_demo_replays():
    source = _original(120, 90)
    for seed in range(3):
        image, table, log = CopyRecipe.demo_queries().apply(source, np.random.default_rng(seed))
        _assert_replays(source, image, table, log, fuse=False)  # the demo applies its edits one by one
