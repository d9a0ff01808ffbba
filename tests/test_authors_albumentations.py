"""The authors' "additional" operations run with albumentations 1.3.1's defaults (their pinned version),
given explicitly to the installed albumentations 2.x (a requirement of the tests: the dev extra)."""

from __future__ import annotations

import math

import albumentations  # noqa: F401  (the dev extra: a missing one fails, as everywhere)
import numpy as np
import pytest
from PIL import Image

from copynce_hf.data import ASSET_IMAGES
from copynce_hf.pixtrace.edits import ALBUMENTATIONS_OPS, Albumentation
from copynce_hf.pixtrace.edits.albumentations_131 import DEFAULTS_1_3_1, REIMPLEMENTED
from copynce_hf.pixtrace.edits.albumentations_defaults import AUTHORS_PARAMETERS, authors_parameters
from copynce_hf.pixtrace.table import CoordinateTable

#: albumentations 1.3.1's defaults (its source), in 2.x's names, for the operations 2.x runs: the pin.
PINNED = {
    "CLAHE": {"clip_limit": (1.0, 4.0), "tile_grid_size": (8, 8)},
    "ChannelDropout": {"channel_drop_range": (1, 1), "fill": 0},
    "ChannelShuffle": {},
    "Equalize": {"mode": "cv", "by_channels": True},
    "HueSaturationValue": {"hue_shift_limit": (-20, 20), "sat_shift_limit": (-30, 30), "val_shift_limit": (-20, 20)},
    "ImageCompression": {"compression_type": "jpeg", "quality_range": (99, 100)},
    "InvertImg": {},
    "MedianBlur": {"blur_limit": (3, 7)},
    "MultiplicativeNoise": {"multiplier": (0.9, 1.1), "per_channel": False, "elementwise": False},
    "Posterize": {"num_bits": (4, 4)},
    "RGBShift": {"r_shift_limit": (-20, 20), "g_shift_limit": (-20, 20), "b_shift_limit": (-20, 20)},
    "RandomBrightnessContrast": {"brightness_limit": (-0.2, 0.2), "contrast_limit": (-0.2, 0.2),
                                 "brightness_by_max": True, "ensure_safe_range": False},
    "RandomGamma": {"gamma_limit": (80, 120)},
    "RandomSnow": {"snow_point_range": (0.1, 0.3), "brightness_coeff": 2.5, "method": "bleach"},
    "RandomToneCurve": {"scale": 0.1, "per_channel": False},
    "Sharpen": {"alpha": (0.2, 0.5), "lightness": (0.5, 1.0), "method": "kernel"},
    "Solarize": {"threshold_range": (0.5, 0.5)},
    "ToSepia": {},
}
#: 1.3.1's defaults of the six operations computed as 1.3.1 computes them (1.3.1's names): the pin.
PINNED_1_3_1 = {
    "GaussNoise": {"var_limit": (10.0, 50.0), "mean": 0, "per_channel": True},
    "FancyPCA": {"alpha": 0.1},
    "ISONoise": {"color_shift": (0.01, 0.05), "intensity": (0.1, 0.5)},
    "MotionBlur": {"blur_limit": (3, 7), "allow_shifted": True},
    "RandomFog": {"fog_coef_lower": 0.3, "fog_coef_upper": 1.0, "alpha_coef": 0.08},
    "RandomRain": {"slant_lower": -10, "slant_upper": 10, "drop_length": 20, "drop_width": 1,
                   "drop_color": (200, 200, 200), "blur_value": 7, "brightness_coefficient": 0.7},
}


def _as_tuples(value):
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def test_every_operation_is_pinned_once():
    assert set(PINNED) | set(PINNED_1_3_1) == set(ALBUMENTATIONS_OPS) and not set(PINNED) & set(PINNED_1_3_1)
    assert DEFAULTS_1_3_1 == PINNED_1_3_1 and set(REIMPLEMENTED) == set(PINNED_1_3_1)


@pytest.mark.parametrize("op", sorted(PINNED))
def test_each_operation_runs_with_the_pinned_parameters(op):

    assert AUTHORS_PARAMETERS[op] == PINNED[op]
    transform = getattr(albumentations, op)(p=1.0, **authors_parameters(op))
    for name, value in PINNED[op].items():  # the installed version holds every one (none ignored or renamed)
        held = getattr(transform, name)
        held = held.value if hasattr(held, "value") else held
        assert _as_tuples(held) == pytest.approx(_as_tuples(value)) if not isinstance(value, str) else held == value


@pytest.mark.parametrize("op", sorted(PINNED_1_3_1))
def test_reimplemented_operations_replay_and_change_the_photo(op):
    photo = Image.open(ASSET_IMAGES / "chelsea.jpg").convert("RGB").resize((96, 64))
    first = Albumentation(op=op, seed=3).transform(photo)
    assert np.array_equal(np.asarray(first), np.asarray(Albumentation(op=op, seed=3).transform(photo)))
    assert first.size == photo.size and np.abs(np.asarray(first, float) - np.asarray(photo, float)).mean() > 0.1


def test_gauss_noise_has_the_authors_noise_level():
    """1.3.1 draws a variance in [10, 50] (a standard deviation of 3.2-7.1 grey levels; 2.x's default: 51-112),
    adds the noise and truncates to 8 bits (half a level darker on average)."""
    grey = Image.new("RGB", (96, 96), (128, 128, 128))
    deviations = []
    for seed in range(24):
        edited, table = Albumentation(op="GaussNoise", seed=seed)(grey, CoordinateTable.identity(96, 96))
        noise = np.asarray(edited, dtype=np.float64) - 128.0
        assert -0.8 < noise.mean() < -0.2 and np.array_equal(table.coords, CoordinateTable.identity(96, 96).coords)
        deviations.append(noise.std())
    assert math.sqrt(10) - 0.3 <= min(deviations) and max(deviations) <= math.sqrt(50) + 0.3
    assert max(deviations) - min(deviations) > 2.0  # drawn per edit over the range
