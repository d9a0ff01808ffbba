"""The paper presets follow what the authors' code does where it differs from what their configuration says
(docs/FIDELITY.md), each through a named option that leaves this package's own recipes as they were.

Each test fails if a preset goes back to the other choice: text on ``p`` of the copies instead of ``1 - p``,
a blur radius or smearing width relative to the image, covered pixels untraced, erased values clipped in the
model input, pixel shuffling by a seed drawn per copy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_editor import textured_image

from copynce_hf.data import CopyPair, PixTraceCollator
from copynce_hf.modeling.errors import ConfigError, EditParameterError
from copynce_hf.pixtrace import CopyEditor, CopyRecipe, replay
from copynce_hf.pixtrace.edits import (
    OverlayEmoji,
    OverlayText,
    RandomErasing,
    ShufflePixels,
    Smear,
    erasing_noise,
)
from copynce_hf.pixtrace.steps import DrawContext

PAPER = {"descriptor": CopyRecipe.paper_descriptor, "matcher": CopyRecipe.paper_matcher}


def _scheduled_share(recipe: CopyRecipe, name: str, draws: int) -> float:
    """Share of ``draws`` copies whose schedule holds the step ``name`` (no pixel work)."""
    step, hits = getattr(recipe, name), 0
    for k in range(draws):
        before, after = recipe.schedule(np.random.default_rng([7, k]))
        hits += any(scheduled is step for scheduled, _ in before + after)
    return hits / draws


@pytest.mark.parametrize("preset, configured_p", [("descriptor", 0.25), ("matcher", 0.35)])
def test_text_lands_on_one_minus_p_of_the_paper_copies(preset, configured_p):
    """Their RandomOverlayText returns the image unchanged when random() < p: text on 1 - p of their copies."""
    recipe, draws = PAPER[preset](), 3000
    assert recipe.overlay_text.p == configured_p and recipe.overlay_text.p_means == "skip"
    expected = 1 - configured_p
    assert abs(_scheduled_share(recipe, "overlay_text", draws) - expected) < 4 * np.sqrt(expected * (1 - expected) / draws)
    training = CopyRecipe.training()  # the package's recipe: text on p of the copies
    assert abs(_scheduled_share(training, "overlay_text", draws) - training.overlay_text.p) < 0.04
    with pytest.raises(ConfigError, match="p_means"):
        dataclasses.replace(recipe.overlay_text, p_means="sometimes")


def _draw(step, size, draws=400, seed=0):
    rng = np.random.default_rng(seed)
    return [edit for _ in range(draws) for edit in step.draw(DrawContext(rng, size))]


def test_blur_radius_and_smearing_width_are_pixels_of_the_image_the_edit_runs_on():
    """AugLy's RandomBlur draws 0-10 pixels, their RandomSmearing 1-5 whole pixels, at whatever resolution."""
    for preset in PAPER.values():
        recipe = preset()
        for size in ((224, 224), (900, 1400)):
            radii = np.array([edit.radius for edit in _draw(recipe.blur, size)])
            assert radii.min() >= 0 and radii.max() <= 10 and abs(radii.mean() - 5) < 0.5, size
            widths = [edit.width for edit in _draw(recipe.smearing, size)]
            assert set(widths) == {1, 2, 3, 4, 5}, size
    training = CopyRecipe.training().blur  # the package's: a fraction of the shorter side
    small, large = (np.mean([e.radius for e in _draw(training, size)]) for size in ((100, 100), (1000, 1000)))
    assert large == pytest.approx(10 * small, rel=1e-9)
    with pytest.raises(ConfigError, match="whole pixels"):
        dataclasses.replace(CopyRecipe.paper_descriptor().smearing, width=(0.5, 2.0))


def test_pixels_under_text_emoji_smearing_and_erasing_keep_their_trace_in_the_paper_presets():
    """Their MaskMapper records nothing for these edits: the pixels they cover stay mapped to their source."""
    image = textured_image(80, 96)
    overlays = [
        OverlayText(text="COPY", font_size=0.4, x=0.1, y=0.2, opacity=1.0),
        OverlayEmoji(emoji="smileys/smiling_face_with_heart_eyes.png", size=0.6, x=0.3, y=0.2, opacity=1.0),
        Smear(points=((0.1, 0.1), (0.9, 0.5), (0.2, 0.9)), width=9),
        RandomErasing(x=0.2, y=0.3, width=0.5, height=0.4, noise_seed=3),
    ]
    for edit in overlays:
        untraced = replay(image, [edit.to_dict()])
        mapped = replay(image, [dataclasses.replace(edit, covered="mapped").to_dict()])
        assert (~untraced.table.valid).sum() > 100, edit.name  # the package's rule: covered pixels untraced
        assert mapped.table.valid.all() and np.array_equal(np.asarray(mapped.image), np.asarray(untraced.image))
        assert "covered" not in edit.to_dict()["params"]  # lists recorded before the option replay as they were
    for preset in PAPER.values():
        recipe = preset()
        assert {recipe.overlay_text.covered, recipe.overlay_emoji.covered, recipe.smearing.covered,
                recipe.random_erasing.covered} == {"mapped"}
        everything = recipe.with_probability(1.0).replace(overlay_text=dataclasses.replace(recipe.overlay_text, p=0.0))
        editor = CopyEditor(seed=4, recipe=everything, output_size=(64, 64))
        names = set()
        for k in range(6):
            result = editor(image, seed=k)
            names |= {edit["name"] for edit in result.edits}
            occluders = [edit for edit in result.edits if edit["name"] in ("overlay_text", "overlay_emoji", "smear",
                                                                           "random_erasing")]
            assert all(edit["params"]["covered"] == "mapped" for edit in occluders)
        assert {"overlay_text", "overlay_emoji", "smear", "random_erasing"} <= names
    training = CopyRecipe.training()
    assert {training.overlay_text.covered, training.overlay_emoji.covered, training.random_erasing.covered} == {
        "untraced"}


def test_erased_values_reach_the_model_input_unclipped():
    """Their RandomErasing fills the tensor with N(0, 1) before normalisation: values beyond [0, 1] stay."""
    size = 32
    erasing = RandomErasing(x=0.25, y=0.125, width=0.5, height=0.375, noise_seed=11, values="unclipped")
    image = textured_image(size, size)
    erased = replay(image, [erasing.to_dict()])
    noise = erasing_noise(11, 12, 16)
    box = np.asarray(erased.image)[4:16, 8:24].astype(np.float64)
    np.testing.assert_array_equal(box, np.clip(np.rint(noise * 255), 0, 255))  # the 8-bit image: clipped
    pair = CopyPair(erased.image, image, erased.table, None, 1, edits={"query": [erasing.to_dict()], "reference": []})
    plain = CopyPair(image, image, None, None, 0, edits={"query": [], "reference": []})
    collator = PixTraceCollator(size, 16, compute_overlaps=False)
    batch = collator([pair, plain])
    assert batch["pixel_values_erasing"].tolist() == [[4, 8, 16, 24, 11], [-1] * 5]
    assert "reference_pixel_values_erasing" not in batch
    model_input = collator.normalize(batch)
    assert "pixel_values_erasing" not in model_input
    mean = torch.tensor(collator.image_mean).view(3, 1, 1)
    std = torch.tensor(collator.image_std).view(3, 1, 1)
    expected = (torch.from_numpy(noise).float().permute(2, 0, 1) - mean) / std
    torch.testing.assert_close(model_input["pixel_values"][0, :, 4:16, 8:24], expected)
    assert float(model_input["pixel_values"][0, :, 4:16, 8:24].min()) < float(((0 - mean) / std).min()) - 1
    outside = collator.normalize(collator([CopyPair(erased.image, image, None, None, 0)]))["pixel_values"][0]
    outside[:, 4:16, 8:24] = model_input["pixel_values"][0, :, 4:16, 8:24]
    torch.testing.assert_close(model_input["pixel_values"][0], outside)  # the rest as the 8-bit image
    for preset in PAPER.values():
        step = preset().random_erasing
        drawn = _draw(step, (224, 224), draws=20)
        assert drawn and all(edit.values == "unclipped" for edit in drawn)
    assert CopyRecipe.training().random_erasing.values == "clipped"
    with pytest.raises(EditParameterError, match="noise_seed"):
        RandomErasing(values="unclipped")


def test_pixel_shuffling_uses_auglys_fixed_seed_pixel_for_pixel():
    """Their AugLy ShufflePixels(factor=0.1) keeps its default seed 10: every copy of a size shuffles the same
    pixels. The edit's augly form is AugLy's shuffle_pixels exactly (without reseeding NumPy's global generator)."""
    import augly.image.functional as augly_image

    for preset in PAPER.values():
        step = preset().shuffle_pixels
        drawn = _draw(step, (60, 80), draws=5)
        assert {(edit.seed, edit.form, edit.factor) for edit in drawn} == {(10, "augly", 0.1)}
    image = textured_image(37, 53)
    state = np.random.get_state()
    try:
        theirs = np.asarray(augly_image.shuffle_pixels(image, factor=0.1, seed=10))
    finally:
        np.random.set_state(state)
    ours = ShufflePixels(factor=0.1, seed=10, form="augly").transform(image)
    assert np.array_equal(np.asarray(ours), theirs) and (theirs != np.asarray(image)).any()
    before = np.random.get_state()[1].copy()
    ShufflePixels(factor=0.5, seed=3, form="augly").transform(image)
    assert np.array_equal(np.random.get_state()[1], before)  # NumPy's global generator untouched
    seeds = {edit.seed for edit in _draw(CopyRecipe.training().shuffle_pixels, (60, 80), draws=5)}
    assert len(seeds) == 5  # the package's recipe: a seed per copy
