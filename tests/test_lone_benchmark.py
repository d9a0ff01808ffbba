"""The lone framed query benchmark (benchmarks/templates/lone.py, lone_designs.py): every design puts the photo where
it says, a frame is drawn anew from its generator, and a copy counts as found only when its own reference is first."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from benchmarks.templates.lone import found_first
from benchmarks.templates.lone_designs import DEV_DESIGNS, LONE_DESIGNS, draw_lone_frame
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.retrieval import Prediction


@pytest.mark.parametrize("design", list(LONE_DESIGNS))
def test_each_design_frames_the_photo_at_its_box_and_draws_anew_from_its_generator(design):
    photo = Image.open(ASSET_IMAGES / "rocket.jpg").convert("RGB").resize((160, 120))
    backdrop = Image.open(ASSET_IMAGES / "coffee.jpg").convert("RGB")
    framed, box = draw_lone_frame(design, np.random.default_rng(3), photo, backdrop)
    again, same_box = draw_lone_frame(design, np.random.default_rng(3), photo, backdrop)
    other, _ = draw_lone_frame(design, np.random.default_rng(4), photo, backdrop)
    assert np.array_equal(np.asarray(framed), np.asarray(again)) and box == same_box
    assert np.asarray(framed).shape != np.asarray(other).shape or not np.array_equal(np.asarray(framed),
                                                                                       np.asarray(other))
    left, top, right, bottom = box
    assert 0 <= left < right <= framed.width and 0 <= top < bottom <= framed.height
    assert (right - left) * (bottom - top) < framed.width * framed.height  # a frame around it, not the photo alone
    inside = np.asarray(framed.crop(box).resize((40, 30)), dtype=float)
    assert np.abs(inside - np.asarray(photo.resize((40, 30)), dtype=float)).mean() < 40  # the photo is in its box


def test_unknown_designs_and_a_backdrop_design_without_one_are_refused():
    photo = Image.new("RGB", (64, 48), "grey")
    with pytest.raises(ValueError, match="unknown lone frame design 'poster'"):
        draw_lone_frame("poster", np.random.default_rng(0), photo)
    with pytest.raises(ValueError, match="needs a backdrop photo"):
        draw_lone_frame("photo backdrop", np.random.default_rng(0), photo)
    assert set(DEV_DESIGNS) < set(LONE_DESIGNS)  # designs kept out of the development draws


def test_a_copy_is_found_only_when_its_own_reference_is_ranked_first():
    truth = {"queries": {"Q0": {"reference": "R0", "design": "polaroid"},
                         "Q1": {"reference": "R1", "design": "polaroid"},
                         "Q2": {"reference": "R2", "design": "phone note"},
                         "Q3": {"reference": None, "design": "phone note"}}}
    predictions = [Prediction("Q0", "R0", 0.9), Prediction("Q0", "R5", 0.2), Prediction("Q1", "R4", 0.8),
                   Prediction("Q1", "R1", 0.7), Prediction("Q3", "R0", 0.99)]
    found = found_first(predictions, truth)
    assert found == {"copies": 3, "found_first": 1, "per_design": {"phone note": [0, 1], "polaroid": [1, 2]}}
