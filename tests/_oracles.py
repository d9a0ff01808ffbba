"""Oracles that judge a coordinate table against the pixels of the edited image.

Ramp oracle: the source is :func:`conftest.ramp_image`, whose red
channel is ``x * 255 / (W - 1)`` and green channel ``y * 255 / (H - 1)``. A pixel traced to
``(y, x)`` must then show that colour, up to resampling and rounding, wherever its
neighbours are traced too (pixels on the border of the traced region blend with fill).

Each resampling of a chain widens that blended band by about one pixel (a pixel next to
a blended one interpolates it). For chains, :func:`ramp_check` can excuse a pixel within
``blend_band`` pixels of the traced region's border, but only if it is *provably* blended
with something that is not the source: the ramp's blue channel is 128 everywhere and any
interpolation of it stays 128, so a pixel whose blue is not 128 mixed in fill, padding or
background (whose blue is not 128 either).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from copynce_hf.pixtrace import CoordinateTable


def erode(mask: np.ndarray) -> np.ndarray:
    """bool (H, W): ``mask`` eroded by one pixel (3x3), pixels off the image counting as False."""
    padded = np.pad(mask, 1, constant_values=False)
    height, width = mask.shape
    out = np.ones_like(mask)
    for dy in range(3):
        for dx in range(3):
            out &= padded[dy : dy + height, dx : dx + width]
    return out


@dataclass
class RampCheck:
    """Result of :func:`ramp_check`: ``agreement`` is the share of interior traced pixels within tolerance."""

    agreement: float
    bias_red: float
    bias_green: float
    interior: int
    traced: int
    excused: int = 0

    @property
    def max_abs_bias(self) -> float:
        return max(abs(self.bias_red), abs(self.bias_green))


def ramp_expected(coords: np.ndarray, source_size: tuple[int, int]) -> np.ndarray:
    """float (..., 2): the ramp's (red, green) at source positions ``coords`` (..., 2) = (y, x)."""
    height, width = source_size
    red = np.clip(coords[..., 1] * (255.0 / (width - 1)), 0.0, 255.0)
    green = np.clip(coords[..., 0] * (255.0 / (height - 1)), 0.0, 255.0)
    return np.stack([red, green], axis=-1)


def border_distance(mask: np.ndarray, limit: int) -> np.ndarray:
    """int (H, W): 1 on the mask's border pixels, 2 on the next ring, ..., ``limit + 1`` deeper; 0 off the mask."""
    distance = np.zeros(mask.shape, dtype=np.int32)
    current = mask.copy()
    for ring in range(1, limit + 2):
        distance[current] = ring
        current = erode(current)
    return distance


def ramp_check(
    image: Image.Image, table: CoordinateTable, tolerance: float = 2.0, blend_band: int = 1
) -> RampCheck:
    """Compare ``image`` (an edit of a ramp image) with the ramp sampled at ``table``'s positions.

    Traced pixels on the border of the traced region are ignored; with ``blend_band`` k > 1
    so are traced pixels of the next k - 1 rings whose blue channel shows a blend with
    non-source content. ``agreement`` is the share of the remaining pixels whose red and
    green are within ``tolerance`` of the ramp at their traced position; the biases are
    the mean signed errors over them.
    """
    valid = table.valid
    interior = erode(valid)
    pixels = np.asarray(image, dtype=np.float64)
    excused = np.zeros_like(interior)
    if blend_band > 1:
        blended = pixels[..., 2] != 128.0
        excused = interior & blended & (border_distance(valid, blend_band) <= blend_band)
    judged = interior & ~excused
    expected = ramp_expected(table.coords[judged].astype(np.float64), table.source_size)
    error = pixels[..., :2][judged] - expected
    if len(error) == 0:
        return RampCheck(0.0, 0.0, 0.0, 0, int(valid.sum()), int(excused.sum()))
    agreement = float(np.mean(np.abs(error).max(axis=1) <= tolerance))
    bias = error.mean(axis=0)
    return RampCheck(
        agreement, float(bias[0]), float(bias[1]), int(judged.sum()), int(valid.sum()), int(excused.sum())
    )


def nan_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Arrays equal, NaN matching NaN."""
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def bilinear(image: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float: the single-channel ``image`` (H, W) sampled bilinearly at positions ``y``, ``x`` (clipped into it)."""
    height, width = image.shape
    y = np.clip(y, 0, height - 1)
    x = np.clip(x, 0, width - 1)
    y0 = np.minimum(np.floor(y).astype(int), height - 2)
    x0 = np.minimum(np.floor(x).astype(int), width - 2)
    fy, fx = y - y0, x - x0
    top = image[y0, x0] * (1 - fx) + image[y0, x0 + 1] * fx
    bottom = image[y0 + 1, x0] * (1 - fx) + image[y0 + 1, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy
