"""The parameters the CopyNCE authors' "additional" operations run with, written for albumentations 2.x.

Their ``lyakaap`` recipe calls each albumentations operation with no argument, under their pinned
albumentations 1.3.1 (``conda.yaml``), so their parameters are 1.3.1's defaults. This package requires
albumentations >= 2.0, whose defaults changed for several of them (``GaussNoise``: 1.3.1 draws a variance
in [10, 50] grey levels squared, a standard deviation of 3.2-7.1 levels; 2.x draws a standard deviation
of 0.2-0.44 of the range, 51-112 levels). :data:`AUTHORS_PARAMETERS` states, for each operation, 1.3.1's
defaults in 2.x's parameter names (read from albumentations 1.3.1's source):

* ranges given by one number in 1.3.1 are the symmetric or ``(low, value)`` range 1.3.1 builds from it
  (``MedianBlur`` / ``MotionBlur`` ``blur_limit=7`` -> odd sizes 3 to 7, ``CLAHE`` ``clip_limit=4`` -> 1 to 4,
  ``HueSaturationValue`` 20 / 30 / 20 -> +-20 / +-30 / +-20, ``RGBShift`` 20 -> +-20,
  ``RandomBrightnessContrast`` 0.2 -> +-0.2);
* ``quality_lower, quality_upper`` -> ``quality_range``, ``fog_coef_lower, fog_coef_upper`` ->
  ``fog_coef_range``, ``snow_point_lower, snow_point_upper`` -> ``snow_point_range``, ``slant_lower,
  slant_upper`` -> ``slant_range``, ``fill_value`` -> ``fill``;
* ``Solarize`` ``threshold=128`` -> ``threshold_range=(0.5, 0.5)``: 2.x inverts values >= 0.5 x 255 = 127.5,
  the same 8-bit values as >= 128;
* ``RandomRain`` ``drop_length=20`` (2.x's default scales it with the image), ``rain_type=None`` ->
  ``"default"``; ``RandomSnow`` 1.3.1's only method -> ``method="bleach"``; ``Sharpen`` 1.3.1's 3x3 kernel
  -> ``method="kernel"``; ``GaussNoise`` at full resolution -> ``noise_scale_factor=1``;
* ``GaussNoise``'s variance is drawn as 1.3.1 draws it (uniform in [10, 50]) by :func:`authors_parameters`,
  and given to 2.x as a fixed standard deviation ``sqrt(variance) / 255``.

What 2.x does not express: ``MotionBlur`` draws its line kernel differently (1.3.1: a line between two
random points of the kernel; 2.x: an angle and a direction, here over all angles and directions), and
the weather operations (``RandomFog``, ``RandomRain``, ``RandomSnow``) were rewritten; the data oracle
(``scripts/check_against_authors.py``) measures each operation against 1.3.1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["AUTHORS_PARAMETERS", "GAUSS_NOISE_VARIANCE", "authors_parameters"]

#: 1.3.1's ``GaussNoise`` ``var_limit`` (grey levels squared, for 8-bit images).
GAUSS_NOISE_VARIANCE = (10.0, 50.0)

#: albumentations 2.x keyword arguments equal to albumentations 1.3.1's defaults, per operation
#: (``GaussNoise``'s standard deviation is drawn per edit: :func:`authors_parameters`).
AUTHORS_PARAMETERS: dict[str, dict[str, Any]] = {
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


def authors_parameters(op: str, seed: int) -> dict[str, Any]:
    """The 2.x keyword arguments of operation ``op`` for the edit seeded with ``seed``: :data:`AUTHORS_PARAMETERS`,
    and for ``GaussNoise`` the standard deviation of a variance drawn uniformly in :data:`GAUSS_NOISE_VARIANCE`
    (from a generator seeded by ``seed``, so the edit replays) on the 0-1 scale 2.x reads it on."""
    parameters = dict(AUTHORS_PARAMETERS[op])
    if op == "GaussNoise":
        variance = np.random.default_rng([int(seed), 0x6A55]).uniform(*GAUSS_NOISE_VARIANCE)
        deviation = math.sqrt(variance) / 255.0
        parameters["std_range"] = (deviation, deviation)
    return parameters
