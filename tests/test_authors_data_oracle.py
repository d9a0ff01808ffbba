"""The data oracle's parts, without the authors' code: the torchvision stand-ins their augmentation calls
(against Pillow), the torchvision forms of this package's edits (against those stand-ins), and the measures
the oracle compares maps and priors with (on maps whose answer is known)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from copynce_hf.data import ASSET_IMAGES
from copynce_hf.fidelity import data_oracle
from copynce_hf.fidelity import functional_standins as F
from copynce_hf.pixtrace import CoordinateTable
from copynce_hf.pixtrace.edits import Affine, ColorJitter, Perspective, Resize

PHOTO = Image.open(ASSET_IMAGES / "chelsea.jpg").convert("RGB").resize((96, 64))
IDENTITY = CoordinateTable.identity(64, 96)
BICUBIC = F.InterpolationMode.BICUBIC


def _pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float64)


def test_geometry_standins_are_pillows_operations():
    assert F.get_image_size(PHOTO) == [96, 64] and F.get_dimensions(PHOTO) == [3, 64, 96]
    assert np.array_equal(_pixels(F.resize(PHOTO, [32, 48], BICUBIC)), _pixels(PHOTO.resize((48, 32), Image.BICUBIC)))
    assert F.resize(PHOTO, 32, BICUBIC).size == (48, 32)  # an int matches the shorter side
    crop = F.resized_crop(PHOTO, 5, 7, 20, 30, [16, 16], BICUBIC)
    assert np.array_equal(_pixels(crop), _pixels(PHOTO.crop((7, 5, 37, 25)).resize((16, 16), Image.BICUBIC)))
    assert np.array_equal(_pixels(F.hflip(PHOTO)), _pixels(PHOTO)[:, ::-1])
    assert np.array_equal(_pixels(F.vflip(PHOTO)), _pixels(PHOTO)[::-1])
    padded = _pixels(F.pad(PHOTO, [3, 4, 5, 6], fill=0))
    assert padded.shape == (74, 104, 3) and padded[:4].max() == 0 and np.array_equal(padded[4:68, 3:99], _pixels(PHOTO))
    with pytest.raises(TypeError):
        F.hflip(np.zeros((4, 4, 3)))


def test_affine_and_perspective_standins_follow_torchvisions_geometry():
    square = PHOTO.crop((0, 0, 64, 64))
    # A half turn about the centre (W / 2, H / 2) in Pillow's area coordinates: both flips, exactly.
    turned = F.affine(square, 180.0, [0, 0], 1.0, [0.0, 0.0], F.InterpolationMode.NEAREST, fill=0)
    assert np.array_equal(_pixels(turned), _pixels(square)[::-1, ::-1])
    shifted = F.affine(square, 0.0, [5, 0], 1.0, [0.0, 0.0], F.InterpolationMode.NEAREST, fill=0)
    assert np.array_equal(_pixels(shifted)[:, 5:], _pixels(square)[:, :-5]) and _pixels(shifted)[:, :5].max() == 0
    corners = [[0, 0], [63, 0], [63, 63], [0, 63]]
    assert F.perspective_coefficients(corners, corners) == pytest.approx([1, 0, 0, 0, 1, 0, 0, 0], abs=1e-6)
    moved = [[4, 2], [60, 5], [58, 61], [3, 59]]
    a, b, c, d, e, f, g, h = F.perspective_coefficients(corners, moved)
    for (x, y), (u, v) in zip(moved, corners):  # each end point goes back to its start point
        w = g * x + h * y + 1
        assert (a * x + b * y + c) / w == pytest.approx(u, abs=1e-3) and (d * x + e * y + f) / w == pytest.approx(v, abs=1e-3)


def test_colour_standins_are_pillows_enhancers_and_an_hsv_hue_shift():
    assert np.array_equal(_pixels(F.adjust_contrast(PHOTO, 0.7)), _pixels(ImageEnhance.Contrast(PHOTO).enhance(0.7)))
    assert np.array_equal(_pixels(F.adjust_saturation(PHOTO, 1.3)), _pixels(ImageEnhance.Color(PHOTO).enhance(1.3)))
    hue, _, _ = PHOTO.convert("HSV").split()
    shifted_hue, _, _ = F.adjust_hue(PHOTO, 0.1).convert("HSV").split()
    # one HSV round trip moves few hues by more than a level; the shift is int(0.1 * 255) = 25 levels, wrapping
    change = (_pixels(shifted_hue) - _pixels(hue)) % 256
    assert np.median(change) == 25
    grey = _pixels(F.rgb_to_grayscale(PHOTO, 3))
    assert np.array_equal(grey[..., 0], _pixels(PHOTO.convert("L"))) and np.array_equal(grey[..., 0], grey[..., 2])


def test_torchvision_forms_of_the_edits_render_as_the_standins():
    affine = Affine(angle=117.0, shear=(20.0, 0.0), fill=(0, 0, 0), resample="bicubic", form="torchvision")
    expected = F.affine(PHOTO, 117.0, [0, 0], 1.0, [20.0, 0.0], BICUBIC, fill=[0.0, 0.0, 0.0])
    assert np.array_equal(_pixels(affine(PHOTO, IDENTITY)[0]), _pixels(expected))
    exact = Affine(angle=117.0, shear=(20.0, 0.0), fill=(0, 0, 0), resample="bicubic")
    assert 0.1 < np.abs(_pixels(exact(PHOTO, IDENTITY)[0]) - _pixels(expected)).mean() < 1.0  # Pillow truncates
    start, end = [[0, 0], [95, 0], [95, 63], [0, 63]], [[9, 4], [90, 2], [93, 60], [2, 57]]
    perspective = Perspective(start, end, fill=(0, 0, 0), resample="bicubic", form="torchvision")
    edited, table = perspective(PHOTO, IDENTITY)
    assert np.array_equal(_pixels(edited), _pixels(F.perspective(PHOTO, start, end, BICUBIC, fill=[0.0, 0.0, 0.0])))
    # The table follows that map: the end corner (area coordinates) comes from the start corner.
    assert table.coords[4, 9] == pytest.approx([-0.5 + 0.5 * 1, -0.5 + 0.5 * 1], abs=0.6)
    jitter = ColorJitter(0.7, 1.2, 0.8, -0.05, form="torchvision", order=(3, 0, 2, 1))
    chain = F.adjust_contrast(F.adjust_saturation(F.adjust_brightness(F.adjust_hue(PHOTO, -0.05), 0.7), 0.8), 1.2)
    assert np.array_equal(_pixels(jitter(PHOTO, IDENTITY)[0]), _pixels(chain))
    assert ColorJitter(0.7).to_dict()["params"] == {"brightness": 0.7, "contrast": 1.0, "saturation": 1.0, "hue": 0.0}


def _shifted_map(rows: int, cols: int, shift: float) -> np.ndarray:
    """Their kind of map (2, H, W), integer source positions, every pixel moved by ``shift`` source pixels."""
    ys, xs = np.meshgrid(np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64), indexing="ij")
    return np.floor(np.stack([ys + shift, xs + shift]) + 0.5)


def test_map_measures_tell_a_shifted_map_apart():
    table = Resize(32, 48)(PHOTO, IDENTITY)[1]  # a copy at half the source's scale
    exact = np.floor(table.coords.transpose(2, 0, 1) + 0.5)
    same = data_oracle._map_agreement(table, exact, (64, 96))
    assert same == {"apart": 0.0, "stray": 0.0, "same": 1.0}
    near = data_oracle._map_agreement(table, exact + 4, (64, 96))  # 4 source pixels = 2 copy pixels
    assert near["apart"] == 0.0 and near["same"] == 0.0
    far = data_oracle._map_agreement(table, exact + 8, (64, 96))  # 4 copy pixels: beyond the tolerance
    assert far["apart"] == 1.0
    cut = exact.copy()
    cut[:, 5:25, 10:30] = -1  # a hole in the traced region: its pixels more than 3 px from its edge are stray
    assert data_oracle._map_agreement(table, cut, (64, 96))["stray"] == pytest.approx(14 * 14 / 400)
    border = exact.copy()
    border[:, :, :3] = -1  # a border 3 pixels wider: no pixel stray
    assert data_oracle._map_agreement(table, border, (64, 96))["stray"] == 0.0
    reference = Resize(32, 48)(PHOTO, IDENTITY)[1]
    assert data_oracle._prior_difference(table, table, reference) == 0.0
    assert data_oracle._prior_difference(table, data_oracle._their_table(exact + 8, (64, 96)), reference) > 0.2
    source = _pixels(PHOTO)
    copy = _pixels(Resize(32, 48, "bicubic")(PHOTO, IDENTITY)[0])
    assert data_oracle._content_error(copy, source, table) < data_oracle._content_error(
        copy, source, data_oracle._their_table(exact + 8, (64, 96)))
