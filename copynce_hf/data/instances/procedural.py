"""Formula-driven images: training instances drawn from a seed, no photo needed.

Formula-driven supervised learning pre-trains vision transformers on generated images (FractalDB:
Kataoka et al., ACCV 2020; Nakashima et al., AAAI 2022); here such images are extra identities for the
copy detector, each one different. Three styles, taken in turn (image ``i`` has style ``i % 3``):

* ``fractal``: the attractor of an iterated function system of 2 to 4 random contractive affine maps,
  drawn by the chaos game, coloured by the map that placed each point, over a dark gradient; systems
  whose attractor covers under 4 % of the canvas (a line, a dot) are drawn again;
* ``shapes``: 6 to 15 ellipses, polygons and smooth strokes in random colours, partly transparent,
  over a noise or gradient background;
* ``noise``: 3 to 5 octaves of smooth noise (optionally bent into marble-like bands) coloured with a
  random cosine palette (``a + b cos(2 pi (c t + d))`` per channel).

The backgrounds and noise fields are the edits' own generated images
(:mod:`copynce_hf.pixtrace.edits.sources`: ``gradient`` and ``noise`` specs). Image ``i`` of seed ``s`` is
drawn from ``numpy.random.default_rng([s, i])`` alone: the same pair gives the same pixels, any other
pair an unrelated image.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ...modeling.errors import ConfigError
from ...pixtrace.edits.sources import noise_grid, resolve_image

__all__ = ["PROCEDURAL_STYLES", "procedural_image"]

PROCEDURAL_STYLES = ("fractal", "shapes", "noise")


def procedural_image(index: int, seed: int, size: tuple[int, int] = (384, 384),
                     style: str | None = None) -> Image.Image:
    """Procedural image ``index`` of ``seed``: an RGB image of ``size`` = (H, W) in style
    ``PROCEDURAL_STYLES[index % 3]`` (or ``style``)."""
    style = PROCEDURAL_STYLES[index % len(PROCEDURAL_STYLES)] if style is None else style
    if style not in PROCEDURAL_STYLES:
        raise ConfigError(f"procedural style {style!r} is not one of {PROCEDURAL_STYLES}")
    height, width = (int(side) for side in size)
    if min(height, width) < 16:
        raise ConfigError(f"procedural images need sides of at least 16 pixels, got {height}x{width}")
    rng = np.random.default_rng([int(seed), int(index)])
    draw = {"fractal": _fractal, "shapes": _shapes, "noise": _noise}[style]
    return draw(rng, height, width)


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))


def _palette(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    """``t`` in [0, 1] (any shape) -> RGB floats in [0, 1] (shape + (3,)) through a random cosine palette."""
    a, b = rng.uniform(0.35, 0.65, 3), rng.uniform(0.25, 0.5, 3)
    c, d = rng.uniform(0.5, 2.0, 3), rng.uniform(0.0, 1.0, 3)
    return np.clip(a + b * np.cos(2 * np.pi * (c * t[..., None] + d)), 0.0, 1.0)


def _affine_maps(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """2 to 4 contractive affine maps ``x -> A x + b``: ``A`` (k, 2, 2) = rotation @ diag(scales) @ rotation,
    scales 0.25 to 0.85 in size (so the attractor exists), ``b`` (k, 2) in [-1, 1]."""
    count = int(rng.integers(2, 5))
    angles = rng.uniform(0, 2 * np.pi, (count, 2))
    scales = rng.uniform(0.25, 0.85, (count, 2)) * rng.choice([-1.0, 1.0], (count, 2))

    def rotation(theta):
        return np.stack([np.stack([np.cos(theta), -np.sin(theta)], -1), np.stack([np.sin(theta), np.cos(theta)], -1)], -2)

    matrices = rotation(angles[:, 0]) @ (scales[:, :, None] * np.eye(2)) @ rotation(angles[:, 1])
    return matrices, rng.uniform(-1, 1, (count, 2))


def _chaos_game(rng: np.random.Generator, matrices: np.ndarray, offsets: np.ndarray,
                walkers: int = 4096, steps: int = 45, burn_in: int = 15) -> tuple[np.ndarray, np.ndarray]:
    """Points (n, 2) of the attractor and the map (n,) that placed each: ``walkers`` random starts, each
    moved ``steps`` times by a map drawn with probability proportional to its area scale (``|det A|``)."""
    weights = np.maximum(np.abs(np.linalg.det(matrices)), 0.01)
    choices = rng.choice(len(matrices), size=(steps, walkers), p=weights / weights.sum())
    x = rng.uniform(-1, 1, (walkers, 2))
    points, labels = [], []
    for step in range(steps):
        x = np.einsum("nij,nj->ni", matrices[choices[step]], x) + offsets[choices[step]]
        if step >= burn_in:
            points.append(x)
            labels.append(choices[step])
    return np.concatenate(points), np.concatenate(labels)


def _fractal(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """An IFS attractor coloured by map, over a darkened gradient (redrawn while it covers < 4 % of the canvas)."""
    for _ in range(50):
        matrices, offsets = _affine_maps(rng)
        points, labels = _chaos_game(rng, matrices, offsets)
        low, high = np.percentile(points, 0.5, axis=0), np.percentile(points, 99.5, axis=0)
        scale = 0.84 * min(width / max(high[0] - low[0], 1e-6), height / max(high[1] - low[1], 1e-6))
        centre = (low + high) / 2
        columns = np.round(width / 2 + (points[:, 0] - centre[0]) * scale).astype(np.int64)
        rows = np.round(height / 2 + (points[:, 1] - centre[1]) * scale).astype(np.int64)
        inside = (columns >= 0) & (columns < width) & (rows >= 0) & (rows < height)
        colours = _palette(rng, np.linspace(0, 1, len(matrices)))[labels[inside]]
        layer, hits = np.zeros((height, width, 3)), np.zeros((height, width))
        np.add.at(layer, (rows[inside], columns[inside]), colours)
        np.add.at(hits, (rows[inside], columns[inside]), 1.0)
        if (hits > 0).mean() >= 0.04:
            break
    colour = layer / np.maximum(hits, 1.0)[..., None]
    alpha = (np.log1p(hits) / max(np.log1p(hits).max(), 1e-6))[..., None] ** 0.5
    background = np.asarray(resolve_image({"kind": "gradient", "seed": _seed(rng), "size": [height, width]}),
                            dtype=np.float64) / 255 * 0.35
    pixels = Image.fromarray(np.uint8(np.round(255 * (background * (1 - alpha) + colour * alpha))), "RGB")
    return pixels.filter(ImageFilter.GaussianBlur(0.6))


def _shapes(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """6 to 15 translucent ellipses, polygons and smooth strokes over a noise or gradient background."""
    kind = "noise" if rng.random() < 0.5 else "gradient"
    canvas = resolve_image({"kind": kind, "seed": _seed(rng), "size": [height, width]}).convert("RGBA")
    side = min(height, width)
    for _ in range(int(rng.integers(6, 16))):
        layer = Image.new("RGBA", (width, height), (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        colour = (*(int(v) for v in rng.integers(0, 256, 3)), int(rng.integers(150, 256)))
        centre = rng.uniform(0, 1, 2) * (width, height)
        shape = rng.choice(["ellipse", "polygon", "stroke"])
        if shape == "ellipse":
            radii = rng.uniform(0.05, 0.3, 2) * side
            draw.ellipse([*(centre - radii), *(centre + radii)], fill=colour)
        elif shape == "polygon":
            corners = int(rng.integers(3, 8))
            angles = np.sort(rng.uniform(0, 2 * np.pi, corners))
            radii = rng.uniform(0.05, 0.3, corners) * side
            draw.polygon([(float(x), float(y)) for x, y in
                          zip(centre[0] + radii * np.cos(angles), centre[1] + radii * np.sin(angles))], fill=colour)
        else:  # a smooth stroke: a random walk of headings, integrated
            headings = np.cumsum(rng.normal(0, 0.25, 40)) + rng.uniform(0, 2 * np.pi)
            path = centre + np.cumsum(np.stack([np.cos(headings), np.sin(headings)], 1), 0) * side * 0.02
            draw.line([(float(x), float(y)) for x, y in path], fill=colour,
                      width=int(rng.integers(2, max(3, side // 16))), joint="curve")
        canvas.alpha_composite(layer)
    return canvas.convert("RGB")


def _noise(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """3 to 5 octaves of the edits' smooth noise, optionally bent into bands, through a cosine palette."""
    field = np.zeros((height, width))
    for octave in range(int(rng.integers(3, 6))):
        cells = 2 ** (octave + 1) + 1
        grid = noise_grid({"seed": _seed(rng), "size": [16 * cells, 16 * cells]})[..., 0]
        smooth = Image.fromarray(grid.astype(np.float32), "F").resize((width, height), Image.Resampling.BICUBIC)
        field += np.asarray(smooth, dtype=np.float64) / 255 * 0.55 ** octave
    field = (field - field.min()) / max(float(np.ptp(field)), 1e-6)
    if rng.random() < 0.5:  # marble: bands along a random direction, bent by the noise
        ys, xs = np.mgrid[0:height, 0:width] / max(height, width)
        angle, frequency = rng.uniform(0, np.pi), rng.uniform(1.5, 5)
        bands = xs * np.cos(angle) + ys * np.sin(angle)
        field = 0.5 + 0.5 * np.sin(2 * np.pi * frequency * bands + rng.uniform(4, 12) * field)
    return Image.fromarray(np.uint8(np.round(255 * _palette(rng, field))), "RGB")
