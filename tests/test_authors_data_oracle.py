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
    # torchvision 0.16 solves the system in float32 (entries up to 63 x 63): the identity to about 1e-5
    assert F.perspective_coefficients(corners, corners) == pytest.approx([1, 0, 0, 0, 1, 0, 0, 0], abs=1e-4)
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


def test_map_measures_tell_a_shifted_map_apart():
    """Their map rounded to whole source pixels passes; a convention-free map one copy pixel off fails."""
    table = Resize(224, 224)(PHOTO, IDENTITY)[1]  # 64 x 96 source: 3.5 and 2.33 copy pixels per source pixel
    exact = table.coords.transpose(2, 0, 1).astype(np.float64)
    rounded = np.floor(exact + 0.5)
    same = data_oracle.map_measures(table, np.stack([rounded, exact]), (64, 96))
    assert same["apart"] == same["stray"] == same["exact_far"] == same["exact_stray"] == 0.0
    assert same["exact_p99"] < 1e-4 and 0.2 < same["largest"] <= 1.75  # rounding: up to half a source pixel
    two_rows = rounded + np.array([2.0, 0.0])[:, None, None]  # 7 copy pixels, beyond the 3 of their conventions
    assert data_oracle.map_measures(table, np.stack([two_rows, exact]), (64, 96))["apart"] == 1.0
    shifted = np.full_like(exact, -1.0)
    shifted[:, :, 1:] = exact[:, :, :-1]  # each pixel claims its left neighbour's position: one copy pixel off
    moved = data_oracle.map_measures(table, np.stack([rounded, shifted]), (64, 96))
    assert moved["exact_p99"] == pytest.approx(1.0, abs=1e-4) and moved["exact_p99"] > data_oracle.EXACT_P99
    cut = rounded.copy()
    cut[:, 20:120, 30:130] = -1  # a hole in their traced region: its pixels more than 3 px from its edge are stray
    assert data_oracle.map_measures(table, np.stack([cut, exact]), (64, 96))["stray"] == pytest.approx(94 * 94 / 10_000)
    ours = data_oracle._their_table(exact, (64, 96))
    assert data_oracle._prior_difference(table, ours) == 0.0
    off = data_oracle._prior_difference(table, data_oracle._their_table(shifted, (64, 96)))
    assert off > data_oracle.EXACT_PRIOR_LIMIT  # a one-pixel shift moves a column of each patch: 1 / 16
    source = _pixels(PHOTO)
    copy = _pixels(Resize(224, 224, "bicubic")(PHOTO, IDENTITY)[0])
    far = data_oracle._their_table(rounded + 2, (64, 96))
    assert data_oracle._content_error(copy, source, table) < data_oracle._content_error(copy, source, far)


def test_resized_reference_prior_is_the_package_prior_of_a_resized_reference():
    """The oracle's prior, computed from positions alone, is pair_overlaps' for a reference resized from the original."""
    from copynce_hf.pixtrace import CopyEditor, CopyRecipe, pair_overlaps

    image = Image.open(ASSET_IMAGES / "chelsea.jpg").convert("RGB")
    identity = CoordinateTable.identity(image.height, image.width)
    reference = Resize(224, 224, "bicubic")(image, identity)[1]
    editor = CopyEditor(seed=1, recipe=CopyRecipe.paper_matcher(), output_size=(224, 224))
    for k in range(4):
        table = editor(image, seed=k).table
        package = pair_overlaps(table, reference, 16)[0]
        oracle = data_oracle.resized_reference_prior(table)
        assert 0.5 * np.abs(package - oracle).sum() <= 1e-3 * max(package.sum(), 1.0)


def test_convention_free_sampling_is_exact_on_linear_maps_and_half_a_pixel_beyond():
    """The convention-free map samples a map at float positions: linear maps come back exactly, including half a
    pixel beyond the traced region (continued from inside), and nothing where the nearest pixel is untraced."""
    from copynce_hf.fidelity.authors_chain import _sample_map

    mapping = -np.ones((2, 20, 30))
    rows, cols = np.meshgrid(np.arange(20.0), np.arange(30.0), indexing="ij")
    region = (slice(4, 16), slice(5, 25))
    mapping[0][region], mapping[1][region] = 3.0 * rows[region] + 1.0, 0.5 * cols[region] + 7.0
    at_r = np.array([[4.0, 3.6, 15.4, 9.25, 3.4, 10.0]])
    at_c = np.array([[5.0, 4.6, 24.4, 11.75, 10.0, 25.6]])
    sampled = _sample_map(mapping, at_r, at_c)
    expected = np.stack([3.0 * at_r + 1.0, 0.5 * at_c + 7.0])
    np.testing.assert_allclose(sampled[:, :, :4], expected[:, :, :4], atol=1e-12)
    assert (sampled[:, :, 4:] == -1).all()  # nearest pixel (3, 10) and (10, 26) untraced
