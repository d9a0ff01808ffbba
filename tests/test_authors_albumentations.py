"""The authors' "additional" operations run with albumentations 1.3.1's defaults (their pinned version),
given explicitly to the installed albumentations 2.x (issue 40, item 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import requires_extra
from PIL import Image

from copynce_hf.pixtrace.edits import ALBUMENTATIONS_OPS, Albumentation
from copynce_hf.pixtrace.edits.albumentations_defaults import AUTHORS_PARAMETERS, authors_parameters
from copynce_hf.pixtrace.table import CoordinateTable

requires_extra("albumentations", "train")

#: albumentations 1.3.1's defaults (its source), in 2.x's names: the pin.
PINNED = {
    "CLAHE": {"clip_limit": (1.0, 4.0), "tile_grid_size": (8, 8)},
    "ChannelDropout": {"channel_drop_range": (1, 1), "fill": 0},
    "ChannelShuffle": {},
    "Equalize": {"mode": "cv", "by_channels": True},
    "FancyPCA": {"alpha": 0.1},
    "GaussNoise": {"mean_range": (0.0, 0.0), "per_channel": True, "noise_scale_factor": 1},
    "HueSaturationValue": {"hue_shift_limit": (-20, 20), "sat_shift_limit": (-30, 30), "val_shift_limit": (-20, 20)},
    "ISONoise": {"color_shift": (0.01, 0.05), "intensity": (0.1, 0.5)},
    "ImageCompression": {"compression_type": "jpeg", "quality_range": (99, 100)},
    "InvertImg": {},
    "MedianBlur": {"blur_limit": (3, 7)},
    "MotionBlur": {"blur_limit": (3, 7), "allow_shifted": True, "angle_range": (0, 360), "direction_range": (-1.0, 1.0)},
    "MultiplicativeNoise": {"multiplier": (0.9, 1.1), "per_channel": False, "elementwise": False},
    "Posterize": {"num_bits": (4, 4)},
    "RGBShift": {"r_shift_limit": (-20, 20), "g_shift_limit": (-20, 20), "b_shift_limit": (-20, 20)},
    "RandomBrightnessContrast": {"brightness_limit": (-0.2, 0.2), "contrast_limit": (-0.2, 0.2),
                                 "brightness_by_max": True, "ensure_safe_range": False},
    "RandomFog": {"fog_coef_range": (0.3, 1.0), "alpha_coef": 0.08},
    "RandomGamma": {"gamma_limit": (80, 120)},
    "RandomRain": {"slant_range": (-10, 10), "drop_length": 20, "drop_width": 1, "drop_color": (200, 200, 200),
                   "blur_value": 7, "brightness_coefficient": 0.7, "rain_type": "default"},
    "RandomSnow": {"snow_point_range": (0.1, 0.3), "brightness_coeff": 2.5, "method": "bleach"},
    "RandomToneCurve": {"scale": 0.1, "per_channel": False},
    "Sharpen": {"alpha": (0.2, 0.5), "lightness": (0.5, 1.0), "method": "kernel"},
    "Solarize": {"threshold_range": (0.5, 0.5)},
    "ToSepia": {},
}


def _as_tuples(value):
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("op", ALBUMENTATIONS_OPS)
def test_each_operation_runs_with_the_pinned_parameters(op):
    import albumentations

    assert AUTHORS_PARAMETERS[op] == PINNED[op]
    transform = getattr(albumentations, op)(p=1.0, **authors_parameters(op, seed=4))
    for name, value in PINNED[op].items():  # the installed version holds every one (none ignored or renamed)
        held = getattr(transform, name)
        held = held.value if hasattr(held, "value") else held
        assert _as_tuples(held) == pytest.approx(_as_tuples(value)) if not isinstance(value, str) else held == value


def test_gauss_noise_has_the_authors_noise_level():
    """1.3.1 draws a variance in [10, 50]: a standard deviation of 3.2-7.1 grey levels (2.x's default: 51-112)."""
    grey = Image.new("RGB", (96, 96), (128, 128, 128))
    deviations = []
    for seed in range(24):
        edited, table = Albumentation(op="GaussNoise", seed=seed)(grey, CoordinateTable.identity(96, 96))
        noise = np.asarray(edited, dtype=np.float64) - 128.0
        assert abs(noise.mean()) < 0.3 and np.array_equal(table.coords, CoordinateTable.identity(96, 96).coords)
        deviations.append(noise.std())
        expected = authors_parameters("GaussNoise", seed)["std_range"][0] * 255
        assert noise.std() == pytest.approx(expected, abs=0.6)  # 2.x's 8-bit rounding: about 0.4 levels lower
    assert math.sqrt(10) - 0.6 <= min(deviations) and max(deviations) <= math.sqrt(50) + 0.6
    assert max(deviations) - min(deviations) > 2.0  # drawn per edit over the range
