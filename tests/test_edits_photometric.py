"""Photometric edits: the table is returned unchanged and each edit does what it says to the pixels."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from copynce_hf.modeling.errors import EditParameterError
from copynce_hf.pixtrace import CoordinateTable
from copynce_hf.pixtrace.edits import (
    Blur,
    Brightness,
    ColorJitter,
    Contrast,
    EdgeEnhance,
    Grayscale,
    JpegQuality,
    Noise,
    Pixelization,
    Posterize,
    Saturation,
    Sharpen,
    ShufflePixels,
    Solarize,
    edit_from_dict,
)

HEIGHT, WIDTH = 96, 128

EDITS = [
    ColorJitter(brightness=1.3, contrast=0.8, saturation=1.4, hue=0.1),
    Brightness(factor=1.4),
    Contrast(factor=0.5),
    Saturation(factor=0.3),
    Grayscale(),
    Grayscale(mode="average"),
    Blur(radius=2.0),
    Sharpen(factor=3.0),
    JpegQuality(quality=20),
    Noise(std=0.05, seed=7),
    Pixelization(ratio=0.25),
    ShufflePixels(factor=0.3, seed=2),
    Solarize(threshold=100),
    Posterize(bits=2),
    EdgeEnhance(),
    EdgeEnhance(more=True),
]


@pytest.fixture(scope="module")
def image() -> Image.Image:
    """Smooth colourful content plus texture, so every edit has something to change."""
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    red = 128 + 100 * np.sin(xs / 9.0)
    green = 128 + 100 * np.cos(ys / 7.0)
    blue = 128 + 60 * np.sin((xs + ys) / 5.0)
    texture = np.random.default_rng(0).normal(0, 12, (HEIGHT, WIDTH, 1))
    pixels = np.stack([red, green, blue], axis=-1) + texture
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def warped_table() -> CoordinateTable:
    matrix = np.array([[0.9, 0.1, 5.0], [-0.05, 1.1, 2.0], [0.0005, 0.0, 1.0]])
    return CoordinateTable.identity(120, 150).warp(matrix, (HEIGHT, WIDTH))


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.float64)


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: e.name)
def test_table_is_unchanged_and_pixels_change(edit, image):
    table = warped_table()
    coords_before = table.coords.copy()
    edited, new_table = edit(image, table)
    assert new_table is table
    np.testing.assert_array_equal(new_table.coords, coords_before)
    assert edited.mode == "RGB" and edited.size == image.size
    assert np.abs(pixels(edited) - pixels(image)).mean() > 1.0


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: e.name)
def test_replay_from_json_is_exact(edit, image):
    replayed = edit_from_dict(json.loads(json.dumps(edit.to_dict())))
    assert replayed == edit
    table = CoordinateTable.identity(HEIGHT, WIDTH)
    np.testing.assert_array_equal(np.asarray(edit(image, table)[0]), np.asarray(replayed(image, table)[0]))


@pytest.mark.parametrize(
    "edit", [ColorJitter(), Brightness(1.0), Contrast(1.0), Saturation(1.0), Sharpen(1.0), Blur(0.0),
             Pixelization(1.0), ShufflePixels(0.0), Noise(0.0), Solarize(256), Posterize(8)],
    ids=lambda e: e.name,
)
def test_neutral_parameters_leave_the_image_unchanged(edit, image):
    edited, _ = edit(image, CoordinateTable.identity(HEIGHT, WIDTH))
    np.testing.assert_array_equal(np.asarray(edited), np.asarray(image))


def test_each_edit_has_its_effect(image):
    identity = CoordinateTable.identity(HEIGHT, WIDTH)
    source = pixels(image)

    def run(edit):
        return pixels(edit(image, identity)[0])

    grey = run(Grayscale())
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 1], grey[..., 2])
    assert run(Brightness(0.0)).max() == 0
    assert run(Contrast(0.0)).std(axis=(0, 1)).max() < 1.0
    desaturated = run(Saturation(0.0))
    assert np.abs(desaturated[..., 0] - desaturated[..., 2]).max() <= 1
    np.testing.assert_array_equal(run(Solarize(0)), 255 - source)
    assert set(np.unique(run(Posterize(1)))) <= {0, 128}
    assert run(Blur(3.0)).std() < source.std()
    # Sharpening amplifies the pixel-to-pixel differences.
    assert np.abs(np.diff(run(Sharpen(3.0)), axis=1)).mean() > 1.2 * np.abs(np.diff(source, axis=1)).mean()
    # Lower JPEG quality, larger error.
    assert np.abs(run(JpegQuality(5)) - source).mean() > np.abs(run(JpegQuality(95)) - source).mean()
    # Pixelisation: the down-up resample loses detail, more at lower ratios.
    assert np.abs(run(Pixelization(0.1)) - source).mean() > np.abs(run(Pixelization(0.5)) - source).mean()
    # A hue rotation moves colours but keeps their luma; a third of a turn sends red to green.
    rotated = run(ColorJitter(hue=0.5))
    assert np.abs(rotated - source).mean() > 20
    luma = np.array([0.299, 0.587, 0.114])
    unclipped = np.all((rotated > 0) & (rotated < 255), axis=-1)
    assert np.abs((rotated - source) @ luma)[unclipped].max() < 1.5
    red = Image.new("RGB", (4, 4), (200, 30, 30))
    green = np.asarray(ColorJitter(hue=1 / 3)(red, CoordinateTable.identity(4, 4))[0])[0, 0]
    assert green[1] > 100 and green[0] < 30 and green[2] < 30


def test_noise_has_the_requested_strength_and_follows_its_seed():
    flat = Image.new("RGB", (200, 150), (128, 128, 128))
    identity = CoordinateTable.identity(150, 200)
    first = pixels(Noise(std=0.04, seed=3)(flat, identity)[0])
    assert abs((first - 128).std() - 0.04 * 255) < 0.3
    assert abs((first - 128).mean()) < 0.2
    assert np.array_equal(first, pixels(Noise(std=0.04, seed=3)(flat, identity)[0]))
    assert not np.array_equal(first, pixels(Noise(std=0.04, seed=4)(flat, identity)[0]))


def test_shuffle_moves_the_requested_fraction_and_keeps_the_pixels(image):
    identity = CoordinateTable.identity(HEIGHT, WIDTH)
    shuffled = np.asarray(ShufflePixels(factor=0.25, seed=5)(image, identity)[0]).reshape(-1, 3)
    original = np.asarray(image).reshape(-1, 3)
    # Same multiset of pixel values ...
    np.testing.assert_array_equal(np.unique(shuffled, axis=0, return_counts=True)[1],
                                  np.unique(original, axis=0, return_counts=True)[1])
    # ... a quarter of them moved (a few may land on their own place or on an equal value).
    moved = np.any(shuffled != original, axis=1).mean()
    assert 0.2 < moved <= 0.25
    again = np.asarray(ShufflePixels(factor=0.25, seed=5)(image, identity)[0]).reshape(-1, 3)
    np.testing.assert_array_equal(shuffled, again)


def test_tiny_image_pixelization_keeps_one_pixel():
    tiny = Image.new("RGB", (16, 16), (10, 200, 30))
    edited, _ = Pixelization(0.01)(tiny, CoordinateTable.identity(16, 16))
    assert edited.size == (16, 16)


@pytest.mark.parametrize(
    "cls, params, bad",
    [
        (ColorJitter, {"brightness": -0.1}, "brightness"),
        (ColorJitter, {"hue": 0.7}, "hue"),
        (ColorJitter, {"saturation": float("nan")}, "saturation"),
        (Brightness, {"factor": 11.0}, "factor"),
        (Contrast, {"factor": float("inf")}, "factor"),
        (Saturation, {"factor": "1.0"}, "factor"),
        (Grayscale, {"mode": "red"}, "mode"),
        (Blur, {"radius": -1.0}, "radius"),
        (Sharpen, {"factor": -2.0}, "factor"),
        (JpegQuality, {"quality": 0}, "quality"),
        (JpegQuality, {"quality": 50.5}, "quality"),
        (Noise, {"std": 2.0}, "std"),
        (Noise, {"seed": -1}, "seed"),
        (Pixelization, {"ratio": 0.0}, "ratio"),
        (ShufflePixels, {"factor": 1.5}, "factor"),
        (ShufflePixels, {"seed": 1.5}, "seed"),
        (Solarize, {"threshold": 300}, "threshold"),
        (Posterize, {"bits": 0}, "bits"),
        (EdgeEnhance, {"more": 1}, "more"),
    ],
)
def test_bad_parameters_are_refused_at_construction(cls, params, bad):
    with pytest.raises(EditParameterError, match=bad):
        cls(**params)
