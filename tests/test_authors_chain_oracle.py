"""The chain oracle's parts that need no authors' code: a recorded chain of theirs as this package's edits, and the
rows that must tell a wrong text rate or blur scale apart (scripts/check_against_authors.py runs them on their
chains; the self-check there proves the same on real chains)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from copynce_hf.fidelity import chain_oracle
from copynce_hf.pixtrace import CopyRecipe
from copynce_hf.pixtrace.edits import emoji_names
from copynce_hf.pixtrace.edits.occluding import _asset_dirs
from copynce_hf.pixtrace.steps import BlurStep, SmearingStep


def _event(op, size=(300, 200), changed=True, configs=(), **notes):
    return {"op": op, "size": list(size), "changed": changed, "configs": list(configs), **notes}


def test_a_recorded_chain_becomes_the_same_edits():
    """Each of their operations as the worker records it, and the edit this package replays it with."""
    emoji = os.path.join(_asset_dirs()[0], emoji_names()[0])
    crop = {"type": "CROP_RESIZE", "params": {"i": 10, "j": 20, "h": 100, "w": 150, "size": [224, 224]}}
    events = [
        _event("crop", inner=[_event("random_resized_crop", configs=[crop])], configs=[crop]),
        _event("geometric", size=(224, 224), inner=[_event("hflip", size=(224, 224), configs=[{"type": "FLIP", "params": {}}]),
                                                    _event("vflip", size=(224, 224), changed=False,
                                                           configs=[{"type": "NO_CHANGE", "params": None}])]),
        _event("appearance", size=(224, 224), inner=[
            _event("jpeg", size=(224, 224), inner=[_event("jpeg:20", size=(224, 224))]),
            _event("color_jitter", size=(224, 224), jitter=[[[2, 0, 1, 3], 1.1, 0.9, 1.2, 0.05]]),
            _event("text", size=(224, 224), font=["Pacifico.ttf"],
                   text=[{"xy": [10.5, 20.25], "text": "Copy", "fill": [1, 2, 3, 128], "pixels": 40}]),
            _event("emoji", size=(224, 224), draws=[["random", 0.1], ["choice", emoji], ["random", 0.5],
                                                    ["random", 0.2], ["random", 0.3], ["random", 0.4]]),
            _event("smearing", size=(224, 224), changed=False, bezier=[{"points": [[10, 20], [100, 50]], "segments": 500}],
                   line=[{"fill": [9, 8, 7], "width": 3}]),
            _event("blur", size=(224, 224), value=4.5),
            _event("pixelization", size=(224, 224), changed=False)]),
        _event("additional", size=(224, 224)),  # AlbumentationsTransform returns a new image, applied or not
        _event("padding", size=(224, 224), configs=[{"type": "PADDING", "params": {}}]),
        _event("resize", size=(314, 314), configs=[{"type": "RESIZE", "params": {}}]),
        _event("random_erasing", size=(224, 224), erasing=[[30, 40, 50, 60, -3.1, 2.9]]),
    ]
    replayed = chain_oracle.replay_chain({"events": events})
    names = [edit["name"] for edit in replayed.edits]
    assert names == ["random_resized_crop", "hflip", "jpeg_quality", "color_jitter", "overlay_text", "overlay_emoji",
                     "smear", "blur", "pad", "resize"]
    params = {edit["name"]: edit["params"] for edit in replayed.edits}
    assert params["random_resized_crop"] == {"left": 20, "top": 10, "right": 170, "bottom": 110, "height": 224,
                                             "width": 224, "resample": "bicubic", "form": "crop"}
    assert params["jpeg_quality"] == {"quality": 20} and params["blur"] == {"radius": 4.5}
    assert params["color_jitter"]["order"] == [2, 0, 1, 3] and params["color_jitter"]["form"] == "torchvision"
    text = params["overlay_text"]
    assert (text["x"], text["y"], text["opacity"], text["color"], text["covered"]) == (
        10.5 / 224, 20.25 / 224, 128 / 255, [1, 2, 3], "mapped")
    assert int(224 * text["font_size"]) == 40  # their pixel size
    assert params["smear"]["points"] == [[10 / 224, 20 / 224], [100 / 224, 50 / 224]] and params["smear"]["width"] == 3
    assert params["overlay_emoji"]["covered"] == "mapped" and params["overlay_emoji"]["form"] == "authors"
    assert params["pad"] == {"w_factor": 0.2, "h_factor": 0.2, "color": [0, 0, 0], "rounding": "round"}
    assert replayed.erasing.box(224, 224) == (40, 30, 100, 80) and replayed.erasing.values == "unclipped"
    assert replayed.applied == ["crop", "random_resized_crop", "hflip", "jpeg", "color_jitter", "text", "emoji",
                                "smearing", "blur", "padding", "resize", "random_erasing"]
    assert replayed.albumentation is None and replayed.drawn["blur"] == [(4.5, (224, 224))]
    with_albumentation = chain_oracle.replay_chain({"events": [_event("additional", albumentation=["CLAHE"])]})
    assert with_albumentation.albumentation == "CLAHE" and with_albumentation.applied == ["additional"]


def test_rate_rows_tell_a_text_rate_of_p_from_one_minus_p():
    """Their text on 75 % of 200 descriptor chains: the preset holds; text on 25 % of them fails the text row."""
    recipe = CopyRecipe.paper_descriptor()

    def text_row(share):
        applied = [["text"] if k < share * 200 else [] for k in range(200)]
        rows = chain_oracle.rate_rows("descriptor", applied, recipe, draws=1000)
        return next(row for row in rows if ": text " in row.check)

    assert text_row(0.75).holds and not text_row(0.25).holds


def test_radius_rows_tell_pixels_from_a_fraction_of_the_image():
    """Radii drawn as theirs (0-10 pixels at any size) hold against the preset and fail against a radius that is a
    fraction of the shorter side (2-10 pixels at 224)."""
    rng = np.random.default_rng(0)
    sizes = [(160, 240), (256, 384), (800, 1200)] * 20
    drawn = [(float(rng.uniform(0, 10)), size) for size in sizes]
    paper = CopyRecipe.paper_descriptor().blur
    assert chain_oracle.distribution_row("blur", drawn, paper, "radius").holds
    assert chain_oracle.support_row("blur", drawn, paper).holds
    relative = BlurStep(p=0.2, radius=(2 / 224, 10 / 224), units="fraction")
    assert not chain_oracle.distribution_row("blur", drawn, relative, "radius").holds
    assert not chain_oracle.support_row("blur", drawn, relative).holds
    widths = [(int(rng.integers(1, 6)), size) for size in sizes]
    assert chain_oracle.support_row("smearing", widths, CopyRecipe.paper_matcher().smearing).holds
    relative_width = SmearingStep()  # the package's default: 1-5 pixels at 224, a fraction of the shorter side
    assert not chain_oracle.support_row("smearing", widths, relative_width).holds


@pytest.mark.parametrize("kind", sorted(chain_oracle.CHAIN_KINDS))
def test_every_operation_of_theirs_has_a_preset_step(kind):
    recipe = chain_oracle.CHAIN_KINDS[kind]()
    assert set(chain_oracle.PRESET_STEPS.values()) <= set(recipe.step_names())
