"""The parameters the CopyNCE authors' "additional" operations run with, written for albumentations 2.x.

Their ``lyakaap`` recipe calls each albumentations operation with no argument, under their pinned
albumentations 1.3.1 (``conda.yaml``), so their parameters are 1.3.1's defaults. This package requires
albumentations >= 2.0, whose defaults changed for several of them (``GaussNoise``: 1.3.1 draws a variance
in [10, 50] grey levels squared, a standard deviation of 3.2-7.1 levels; 2.x draws a standard deviation
of 0.2-0.44 of the range, 51-112 levels). :data:`AUTHORS_PARAMETERS` states, for each operation 2.x runs,
1.3.1's defaults in 2.x's parameter names (read from albumentations 1.3.1's source):

* ranges given by one number in 1.3.1 are the symmetric or ``(low, value)`` range 1.3.1 builds from it
  (``MedianBlur`` ``blur_limit=7`` -> odd sizes 3 to 7, ``CLAHE`` ``clip_limit=4`` -> 1 to 4,
  ``HueSaturationValue`` 20 / 30 / 20 -> +-20 / +-30 / +-20, ``RGBShift`` 20 -> +-20,
  ``RandomBrightnessContrast`` 0.2 -> +-0.2, ``Posterize`` 4 -> (4, 4));
* ``quality_lower, quality_upper`` -> ``quality_range``, ``snow_point_lower, snow_point_upper`` ->
  ``snow_point_range``, ``fill_value`` -> ``fill``;
* ``Solarize`` ``threshold=128`` -> ``threshold_range=(0.5, 0.5)``: 2.x inverts values >= 0.5 x 255 = 127.5,
  the same 8-bit values as >= 128;
* ``RandomSnow`` 1.3.1's only method -> ``method="bleach"``; ``Sharpen`` 1.3.1's 3x3 kernel ->
  ``method="kernel"``.

The six operations whose algorithm 2.x changed (``GaussNoise``, ``FancyPCA``, ``ISONoise``, ``MotionBlur``,
``RandomFog``, ``RandomRain``) are computed as 1.3.1 computes them by :mod:`.albumentations_131`, not by
albumentations. The data oracle (``scripts/check_against_authors.py``) measures every operation against 1.3.1.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AUTHORS_PARAMETERS", "authors_parameters"]

#: albumentations 2.x keyword arguments equal to albumentations 1.3.1's defaults, per operation run by 2.x.
AUTHORS_PARAMETERS: dict[str, dict[str, Any]] = {
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


def authors_parameters(op: str) -> dict[str, Any]:
    """The 2.x keyword arguments of operation ``op`` (a copy of its :data:`AUTHORS_PARAMETERS` entry)."""
    return dict(AUTHORS_PARAMETERS[op])
