"""The authors' "additional" operations whose algorithm albumentations 2.x changed, computed as 1.3.1 does.

The CopyNCE authors ran albumentations 1.3.1 (their ``conda.yaml``). For most of their 24 operations,
2.x with 1.3.1's default parameters behaves the same (:mod:`.albumentations_defaults`; the data oracle of
``scripts/check_against_authors.py`` measures each one against 1.3.1). Six differ in what they compute:
2.x draws ``FancyPCA``'s perturbation per channel and applies it differently, scales ``ISONoise``'s noise
otherwise, draws ``MotionBlur``'s line by angle and direction, rewrote ``RandomFog`` and ``RandomRain``,
and rounds ``GaussNoise`` where 1.3.1 truncates. This module computes those six as albumentations 1.3.1
does (this package's own code, written from 1.3.1's algorithm and defaults, :data:`DEFAULTS_1_3_1`), each
from a numpy generator (the draws follow 1.3.1's distributions; they are not 1.3.1's Python ``random``
sequence):

* ``GaussNoise``: a variance uniform in [10, 50], Gaussian noise of that variance added to every value
  (per channel), clipped to [0, 255] and truncated to 8 bits;
* ``FancyPCA``: one ``alpha`` ~ N(0, 0.1); the colour covariance's eigenvalues (descending) times ``alpha``,
  multiplied by the *transposed* eigenvector matrix (1.3.1 stacks the eigenvectors as rows), added to every
  pixel (x 255), clipped, truncated;
* ``ISONoise``: ``color_shift`` in [0.01, 0.05], ``intensity`` in [0.1, 0.5]; in float HLS, Poisson
  luminance noise of mean ``std(L) * intensity * 255`` (scaled by ``1 - L``) and Gaussian hue noise of
  standard deviation ``color_shift * 360 * intensity`` (wrapped to [0, 360]);
* ``MotionBlur``: an odd kernel size in [3, 7], a one-pixel line between two random points of the kernel
  (not centred: ``allow_shifted``), normalised, convolved;
* ``RandomFog``: ``fog_coef`` in [0.3, 1]; 1.3.1's rings of haze points around the centre, each a white
  disc of radius ``hw // 2`` blended with weight ``0.08 * fog_coef``, then a ``hw // 10`` box blur;
* ``RandomRain``: a slant in [-10, 10], ``area // 600`` drops of length 20 and width 1 in (200, 200, 200),
  a 7 x 7 box blur, the HSV value channel times 0.7.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import cv2
import numpy as np

__all__ = ["DEFAULTS_1_3_1", "REIMPLEMENTED", "apply_1_3_1"]

#: The albumentations 1.3.1 defaults the functions below use (1.3.1's names).
DEFAULTS_1_3_1 = {
    "GaussNoise": {"var_limit": (10.0, 50.0), "mean": 0, "per_channel": True},
    "FancyPCA": {"alpha": 0.1},
    "ISONoise": {"color_shift": (0.01, 0.05), "intensity": (0.1, 0.5)},
    "MotionBlur": {"blur_limit": (3, 7), "allow_shifted": True},
    "RandomFog": {"fog_coef_lower": 0.3, "fog_coef_upper": 1.0, "alpha_coef": 0.08},
    "RandomRain": {"slant_lower": -10, "slant_upper": 10, "drop_length": 20, "drop_width": 1,
                   "drop_color": (200, 200, 200), "blur_value": 7, "brightness_coefficient": 0.7},
}


def _gauss_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    values = DEFAULTS_1_3_1["GaussNoise"]
    sigma = math.sqrt(rng.uniform(*values["var_limit"]))
    noise = rng.normal(values["mean"], sigma, image.shape)
    return np.clip(image.astype(np.float32) + noise, 0, 255).astype(np.uint8)


def _fancy_pca(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    alpha = rng.normal(0.0, DEFAULTS_1_3_1["FancyPCA"]["alpha"])
    pixels = image.reshape(-1, 3) / 255.0
    covariance = np.cov(pixels - pixels.mean(axis=0), rowvar=False)
    values, vectors = np.linalg.eigh(covariance)  # ascending
    values, vectors = values[::-1], vectors[:, ::-1]  # descending, as 1.3.1 sorts them
    shift = vectors.T @ (alpha * values)  # 1.3.1 stacks the eigenvectors as rows
    return np.clip(image.astype(np.float64) + shift * 255, 0.0, 255.0).astype(np.uint8)


def _iso_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    values = DEFAULTS_1_3_1["ISONoise"]
    color_shift, intensity = rng.uniform(*values["color_shift"]), rng.uniform(*values["intensity"])
    hls = cv2.cvtColor(np.multiply(image, np.float32(1 / 255), dtype=np.float32), cv2.COLOR_RGB2HLS)
    luminance_std = float(hls[..., 1].std())
    luminance_noise = rng.poisson(luminance_std * intensity * 255, size=hls.shape[:2])
    color_noise = rng.normal(0, color_shift * 360 * intensity, size=hls.shape[:2])
    hue = hls[..., 0] + color_noise
    hue[hue < 0] += 360
    hue[hue > 360] -= 360
    hls[..., 0] = hue
    hls[..., 1] += (luminance_noise / 255) * (1.0 - hls[..., 1])
    return np.clip(cv2.cvtColor(hls, cv2.COLOR_HLS2RGB) * 255, 0, 255).astype(np.uint8)


def _motion_blur(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    low, high = DEFAULTS_1_3_1["MotionBlur"]["blur_limit"]
    size = int(rng.choice(np.arange(low, high + 1, 2)))
    x1, x2 = (int(v) for v in rng.integers(0, size, 2))
    if x1 == x2:  # a vertical line: two different rows
        y1, y2 = (int(v) for v in rng.choice(size, 2, replace=False))
    else:
        y1, y2 = (int(v) for v in rng.integers(0, size, 2))
    kernel = np.zeros((size, size), dtype=np.uint8)
    cv2.line(kernel, (x1, y1), (x2, y2), 1, thickness=1)
    return cv2.filter2D(image, -1, kernel.astype(np.float32) / kernel.sum())


def _haze_points(rng: np.random.Generator, size: tuple[int, int], fog_coef: float) -> list[tuple[int, int]]:
    """1.3.1's haze points: rings of ``hw // 10 * ring`` points, drawn in boxes that grow from the centre."""
    height, width = size
    hw = max(1, int(width // 3 * fog_coef))
    mid_x, mid_y, ring, points = width // 2 - 2 * hw, height // 2 - hw, 1, []
    while mid_x > -hw or mid_y > -hw:
        for _ in range(hw // 10 * ring):
            points.append((int(rng.integers(mid_x, width - mid_x - hw + 1)),
                           int(rng.integers(mid_y, height - mid_y - hw + 1))))
        mid_x -= 3 * hw * width // (height + width)
        mid_y -= 3 * hw * height // (height + width)
        ring += 1
    return points


def _random_fog(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    values = DEFAULTS_1_3_1["RandomFog"]
    fog_coef = rng.uniform(values["fog_coef_lower"], values["fog_coef_upper"])
    points = _haze_points(rng, image.shape[:2], fog_coef)
    hw = max(int(image.shape[1] // 3 * fog_coef), 10)
    alpha = values["alpha_coef"] * fog_coef
    fogged = image.copy()
    for x, y in points:
        overlay = fogged.copy()
        cv2.circle(overlay, (x + hw // 2, y + hw // 2), hw // 2, (255, 255, 255), -1)
        fogged = cv2.addWeighted(overlay, alpha, fogged, 1 - alpha, 0)
    return cv2.blur(fogged, (hw // 10, hw // 10))


def _random_rain(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    values = DEFAULTS_1_3_1["RandomRain"]
    slant = int(rng.uniform(values["slant_lower"], values["slant_upper"]))
    height, width = image.shape[:2]
    length = values["drop_length"]
    rained = image.copy()
    for _ in range(height * width // 600):
        x = int(rng.integers(slant, width + 1)) if slant < 0 else int(rng.integers(0, width - slant + 1))
        y = int(rng.integers(0, height - length + 1))
        cv2.line(rained, (x, y), (x + slant, y + length), values["drop_color"], values["drop_width"])
    rained = cv2.blur(rained, (values["blur_value"], values["blur_value"]))
    hsv = cv2.cvtColor(rained, cv2.COLOR_RGB2HSV).astype(np.float32)
    hsv[..., 2] *= values["brightness_coefficient"]
    return cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB)


#: The operations computed here, by name.
REIMPLEMENTED: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "GaussNoise": _gauss_noise, "FancyPCA": _fancy_pca, "ISONoise": _iso_noise, "MotionBlur": _motion_blur,
    "RandomFog": _random_fog, "RandomRain": _random_rain,
}


def apply_1_3_1(op: str, image: np.ndarray, seed: int) -> np.ndarray:
    """Operation ``op`` (of :data:`REIMPLEMENTED`) on the RGB uint8 ``image`` (H, W, 3), drawn from ``seed``."""
    return REIMPLEMENTED[op](np.ascontiguousarray(image), np.random.default_rng([int(seed), 0x131]))
