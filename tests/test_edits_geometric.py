"""Geometric traced edits: the table must say exactly where every pixel came from.

The ramp oracle (see ``_oracles.py``) compares the edited image's colour with the ramp
sampled at the traced position; the mean signed error (bias) on a steep ramp catches
half-pixel and direction errors that a per-pixel tolerance would let through.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from _oracles import nan_equal, ramp_check
from conftest import ramp_image
from PIL import Image

from copynce_hf.modeling.errors import EditParameterError
from copynce_hf.pixtrace import CoordinateTable
from copynce_hf.pixtrace.edits import (
    EDIT_REGISTRY,
    Affine,
    ChangeAspectRatio,
    Crop,
    GeometricEdit,
    HorizontalFlip,
    MemeFormat,
    OverlayOntoBackground,
    OverlayOntoScreenshot,
    Pad,
    PasteIntoBox,
    PasteOnCanvas,
    Perspective,
    RandomResizedCrop,
    Resize,
    Rotate,
    Scale,
    Skew,
    VerticalFlip,
    edit_from_dict,
)

NOISE_BG = {"kind": "noise", "seed": 7, "size": [300, 420]}


def catalogue(size: tuple[int, int]) -> list[GeometricEdit]:
    """At least one instance of every geometric edit class (several settings for some), for an image of ``size``."""
    h, w = size
    return [
        Crop(w // 10, h // 8, w - w // 5, h - 3),
        Resize(h // 2 + 3, w - 17),
        Resize(h + 40, w + 9, resample="bicubic"),
        Scale(0.6),
        Scale(1.4),
        RandomResizedCrop(w // 5, h // 6, w // 5 + w // 2, h // 6 + h // 3, 96, 112),
        ChangeAspectRatio(1.7),
        HorizontalFlip(),
        VerticalFlip(),
        Rotate(30.0),
        Rotate(-73.0, expand=True, fill=(255, 0, 255)),
        Rotate(17.0, crop_to_content=True),
        Rotate(90.0, expand=True),
        Affine(angle=20.0, translate=(9.0, -5.0), scale=0.8, shear=(10.0, 5.0)),
        Perspective(
            ((0, 0), (w - 1, 0), (w - 1, h - 1), (0, h - 1)),
            ((w * 0.1, h * 0.05), (w * 0.95, h * 0.12), (w * 0.9, h * 0.9), (w * 0.02, h * 0.97)),
        ),
        Skew(0.3),
        Skew(-0.4, axis=1),
        Pad(0.1, 0.2, (255, 0, 0)),
        PasteOnCanvas(h + 50, w + 130, 50, -20, (0, 255, 0)),
        PasteIntoBox(NOISE_BG, h + 20, w + 30, 12, 7, h // 2, w - 40, resample="bicubic"),
        OverlayOntoBackground(NOISE_BG, overlay_size=0.5, x_pos=0.3, y_pos=0.2),
        OverlayOntoBackground(NOISE_BG, overlay_size=0.8, x_pos=0.7, y_pos=0.5, scale_bg=True),
        OverlayOntoScreenshot("web"),
        OverlayOntoScreenshot("mobile", crop_src_to_fit=True),
        OverlayOntoScreenshot("web", resize_src_to_match_template=False),
        OverlayOntoScreenshot("mobile", resize_src_to_match_template=False, max_image_size_pixels=120_000),
        MemeFormat("copy\ndetection", caption_height=40),
    ]


def _id(edit) -> str:
    return edit.name


@pytest.fixture(scope="module")
def ramp256() -> Image.Image:
    return ramp_image(256, 256)


def _run(edit, image):
    return edit(image, CoordinateTable.identity(image.height, image.width))


# ------------------------------------------------------------------ (e) every class exercised


def test_catalogue_covers_every_geometric_class():
    geometric = {cls for cls in EDIT_REGISTRY.values() if issubclass(cls, GeometricEdit)}
    covered = {type(edit) for edit in catalogue((256, 256))}
    assert geometric == covered
    assert len(geometric) >= 16
    assert all(cls.kind == "geometric" for cls in geometric)


# ------------------------------------------------------------------ (a) ramp oracle, one edit


@pytest.mark.parametrize("edit", catalogue((256, 256)), ids=_id)
def test_ramp_oracle_single_edit(edit, ramp256):
    image, table = _run(edit, ramp256)
    assert image.mode == "RGB" and (image.height, image.width) == table.size == edit.output_size((256, 256))
    check = ramp_check(image, table)
    assert check.interior > 1000
    assert check.agreement >= 0.99, check


@pytest.mark.parametrize("edit", catalogue((64, 64)), ids=_id)
def test_ramp_oracle_has_no_subpixel_bias(edit):
    """On a 64-pixel ramp (4 levels per pixel), half a pixel off is a 2-level bias."""
    image, table = _run(edit, ramp_image(64, 64))
    check = ramp_check(image, table, tolerance=3.0)
    # Pillow's bilinear resampling truncates (AugLy's skew uses it): -0.5 level at most.
    assert check.max_abs_bias <= 0.75, check
    assert check.agreement >= 0.97, check


def test_ramp_oracle_rejects_wrong_tables(ramp256):
    """The oracle is not vacuous: a half-pixel shift, a missing flip, a wrong rotation centre fail."""
    rotated, table = _run(Rotate(25.0), ramp256)
    assert ramp_check(rotated, table).agreement == 1.0
    small = ramp_image(64, 64)
    rotated_small, table_small = _run(Rotate(25.0), small)
    assert ramp_check(rotated_small, table_small, tolerance=3.0).max_abs_bias <= 0.75
    for shift in (0.5, -0.5):  # half a pixel either way: 2 levels on this ramp
        shifted = table_small.warp(np.array([[1.0, 0, shift], [0, 1, shift], [0, 0, 1]]), table_small.size)
        assert ramp_check(rotated_small, shifted, tolerance=3.0).max_abs_bias > 1.25
    flipped, _ = _run(HorizontalFlip(), ramp256)
    assert ramp_check(flipped, CoordinateTable.identity(256, 256)).agreement < 0.1
    # Rotation the wrong way round; the right way round as an affine map (clockwise angle).
    _, backwards = _run(Rotate(-25.0), ramp256)
    assert ramp_check(rotated, backwards).agreement < 0.5
    _, as_affine = _run(Affine(angle=-25.0), ramp256)
    assert np.array_equal(as_affine.valid, table.valid)
    assert np.allclose(as_affine.coords[table.valid], table.coords[table.valid], atol=1e-3)


# ------------------------------------------------------------------ (a) ramp oracle, chains


def _random_edit(rng: np.random.Generator, size: tuple[int, int]) -> GeometricEdit:
    h, w = size
    big = h * w > 300 * 300
    kinds = ["crop", "rrc", "hflip", "vflip", "rotate", "affine", "perspective", "skew", "aspect"]
    if not big:
        kinds += ["resize", "scale", "pad", "canvas", "background", "meme", "screenshot"]
    kind = kinds[rng.integers(len(kinds))]
    if kind == "crop":
        cw, ch = int(w * rng.uniform(0.5, 0.95)), int(h * rng.uniform(0.5, 0.95))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        return Crop(left, top, left + cw, top + ch)
    if kind == "rrc":
        return RandomResizedCrop.draw(
            rng, size, (int(rng.integers(96, 224)), int(rng.integers(96, 224))), (0.3, 1.0)
        )
    if kind == "resize":
        return Resize(int(h * rng.uniform(0.6, 1.5)), int(w * rng.uniform(0.6, 1.5)), resample="bicubic")
    if kind == "scale":
        return Scale(float(rng.uniform(0.7, 1.4)))
    if kind == "aspect":
        return ChangeAspectRatio(float(w / h * rng.uniform(0.7, 1.4)))
    if kind == "hflip":
        return HorizontalFlip()
    if kind == "vflip":
        return VerticalFlip()
    if kind == "rotate":
        return Rotate(float(rng.uniform(-180, 180)), expand=bool(rng.integers(2)))
    if kind == "affine":
        return Affine(
            angle=float(rng.uniform(-30, 30)),
            translate=(float(rng.uniform(-0.1, 0.1) * w), float(rng.uniform(-0.1, 0.1) * h)),
            scale=float(rng.uniform(0.75, 1.25)),
            shear=(float(rng.uniform(-10, 10)), float(rng.uniform(-10, 10))),
        )
    if kind == "perspective":
        start = ((0, 0), (w - 1, 0), (w - 1, h - 1), (0, h - 1))
        jitter = rng.uniform(0, 0.2, size=(4, 2)) * (w, h) * ((1, 1), (-1, 1), (-1, -1), (1, -1))
        end = tuple((float(x + dx), float(y + dy)) for (x, y), (dx, dy) in zip(start, jitter))
        return Perspective(start, end)
    if kind == "skew":
        return Skew(float(rng.uniform(-0.4, 0.4)), axis=int(rng.integers(2)))
    if kind == "pad":
        return Pad(float(rng.uniform(0, 0.2)), float(rng.uniform(0, 0.2)))
    if kind == "canvas":
        return PasteOnCanvas(h + 40, w + 60, int(rng.integers(0, 60)), int(rng.integers(0, 40)))
    if kind == "background":  # blue far from the ramp's 128 (see _oracles.ramp_check)
        spec = {
            "kind": "solid",
            "color": [int(rng.integers(256)), int(rng.integers(256)), 0],
            "size": [h + 60, w + 80],
        }
        return OverlayOntoBackground(
            spec, float(rng.uniform(0.5, 0.9)), float(rng.uniform(0, 0.3)), float(rng.uniform(0, 0.3))
        )
    if kind == "meme":
        return MemeFormat("LOL", caption_height=int(rng.integers(20, 60)))
    return OverlayOntoScreenshot(["web", "mobile"][int(rng.integers(2))])


def _magnification(edit: GeometricEdit, size: tuple[int, int]) -> float:
    """Output pixels per input pixel of ``edit`` (linear, at the image centre)."""
    total = np.eye(3)
    for matrix, _ in edit.stages(size):
        total = total @ matrix
    return 1.0 / math.sqrt(abs(np.linalg.det(total[:2, :2] / total[2, 2])))


#: Edits that move whole pixels (no resampling, so no blending with fill).
_EXACT = {"crop", "hflip", "vflip", "pad", "paste_on_canvas", "meme_format"}


@pytest.mark.parametrize("seed", range(16))
def test_ramp_oracle_random_chains(seed):
    """Chains of 3 to 6 random geometric edits, oracle as for one edit.

    Every resampling blends pixels next to untraced ones with fill, and the next resampling
    spreads that blend one pixel further (an enlargement by its factor). So beyond the
    one-pixel border band, pixels within one ring per resampling edit so far are excused,
    but only where the blue channel proves a blend with non-source content.
    """
    rng = np.random.default_rng(seed)
    image = ramp_image(256, 256)
    table = CoordinateTable.identity(256, 256)
    chain, band = [], 1
    for _ in range(int(rng.integers(3, 7))):
        for _ in range(50):
            edit = _random_edit(rng, table.size)
            magnification = _magnification(edit, table.size)
            if magnification <= 1.6 and edit.trace(table).valid.sum() >= 3000:
                break
        chain.append(edit.name)
        band += 0 if edit.name in _EXACT else math.ceil(magnification)
        image, table = edit(image, table)
    assert table.is_analytic  # geometric chains never densify the table
    check = ramp_check(image, table, blend_band=band)
    assert check.interior > 2000, (chain, check)
    assert check.excused < 0.1 * check.interior, (chain, check)
    assert check.agreement >= 0.99, (chain, check)
    assert check.max_abs_bias <= 0.6, (chain, check)


def test_dense_and_analytic_tables_agree(ramp256):
    """The same edits applied to a dense identity table give the same positions (to the nearest pixel)."""
    dense = CoordinateTable(CoordinateTable.identity(256, 256).coords.copy(), (256, 256))
    analytic = CoordinateTable.identity(256, 256)
    image = ramp256
    for edit in (Crop(10, 20, 250, 240), HorizontalFlip(), Rotate(90.0, expand=True), Pad(0.1, 0.05)):
        image, analytic = edit(image, analytic)
        dense = edit.trace(dense)
    assert not dense.is_analytic
    assert np.array_equal(dense.valid, analytic.valid)
    assert np.allclose(dense.coords[dense.valid], analytic.coords[analytic.valid], atol=1e-4)


# ------------------------------------------------------------------ traced fractions


def test_size_preserving_edits_trace_everything(ramp256):
    for edit in (
        Crop(3, 5, 200, 111),
        Resize(77, 300),
        Scale(0.5),
        HorizontalFlip(),
        VerticalFlip(),
        RandomResizedCrop(0, 0, 100, 100, 224, 224),
        ChangeAspectRatio(0.5),
        Rotate(180.0),
        Rotate(33.0, crop_to_content=True),
    ):
        _, table = _run(edit, ramp256)
        assert table.traced_fraction == 1.0, edit


def test_crop_table_is_a_translation(ramp256):
    image, table = _run(Crop(10, 20, 110, 70), ramp256)
    assert table.size == (50, 100)
    assert np.array_equal(table.lookup(0, 0), [20, 10]) and np.array_equal(table.lookup(49, 99), [69, 109])
    assert np.array_equal(np.asarray(image), np.asarray(ramp256)[20:70, 10:110])


def test_flips_reverse_rows_and_columns(ramp256):
    _, table = _run(HorizontalFlip(), ramp256)
    assert np.array_equal(table.lookup(7, 0), [7, 255]) and np.array_equal(table.lookup(7, 255), [7, 0])
    _, table = _run(VerticalFlip(), ramp256)
    assert np.array_equal(table.lookup(0, 7), [255, 7])


def test_rotations_lose_corners_and_keep_area(ramp256):
    _, table = _run(Rotate(30.0), ramp256)
    # Independent count: points of a 4x finer grid over the output whose rotation back by
    # 30 degrees about the centre lands inside the 256 x 256 square.
    fine = (np.arange(1024) + 0.5) / 4 - 128
    fy, fx = np.meshgrid(fine, fine, indexing="ij")
    cos, sin = math.cos(math.radians(30)), math.sin(math.radians(30))
    inside = (np.abs(cos * fx - sin * fy) <= 128) & (np.abs(sin * fx + cos * fy) <= 128)
    assert abs(table.valid.sum() - inside.sum() / 16) < 2 * 256
    assert not table.valid[0, 0] and not table.valid[-1, -1] and table.valid[128, 128]
    _, table = _run(Rotate(30.0, expand=True), ramp256)
    side = 256 * (math.cos(math.radians(30)) + math.sin(math.radians(30)))
    assert table.size == (math.ceil(128 + side / 2) - math.floor(128 - side / 2),) * 2
    assert abs(table.valid.sum() - 256 * 256) < 4 * 256  # a rotation keeps the area
    assert np.allclose(table.lookup(table.size[0] // 2, table.size[1] // 2), [127.5, 127.5], atol=0.75)


def test_affine_and_perspective_traced_area(ramp256):
    _, table = _run(Affine(angle=15.0, scale=0.7, shear=(8.0, -6.0)), ramp256)
    assert abs(table.valid.sum() - 0.49 * 256 * 256) < 4 * 256  # determinant scale^2
    end = np.array([(30.0, 20.0), (230.0, 40.0), (240.0, 200.0), (10.0, 250.0)])
    edit = Perspective(((0, 0), (255, 0), (255, 255), (0, 255)), tuple(map(tuple, end)))
    _, table = _run(edit, ramp256)
    x, y = end[:, 0], end[:, 1]
    quad_area = 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))
    # The start corners are pixel centres: the traced area reaches half a pixel beyond them.
    assert abs(table.valid.sum() - quad_area) < 3 * 256
    for (sx, sy), (ex, ey) in zip(edit.startpoints, edit.endpoints):
        assert np.allclose(table.lookup(round(ey), round(ex)), [sy, sx], atol=1.5)


def test_skew_traced_area(ramp256):
    _, table = _run(Skew(0.3), ramp256)
    expected = 256 * 256 - 0.3 * 256 * 256 / 4  # each row loses |skew * (y - H / 2)| columns
    assert abs(table.valid.sum() - expected) < 2 * 256


def test_canvas_edits_trace_exactly_the_pasted_area(ramp256):
    _, table = _run(Pad(0.1, 0.25), ramp256)
    assert table.size == (256 + 2 * 64, 256 + 2 * 25) and table.valid.sum() == 256 * 256
    assert table.valid[64:320, 25:281].all()
    _, table = _run(PasteOnCanvas(300, 400, 50, -20), ramp256)
    assert table.valid.sum() == 236 * 256 and table.valid[0:236, 50:306].all()

    edit = OverlayOntoBackground(NOISE_BG, overlay_size=0.5, x_pos=0.3, y_pos=0.2)
    image, table = _run(edit, ramp256)
    assert table.size == (300, 420) and table.valid.sum() == 150 * 150  # int(300 * 0.5), square input
    top, left = int(300 * 0.2), int(420 * 0.3)
    assert table.valid[top : top + 150, left : left + 150].all()
    background = np.asarray(_background())
    outside = ~table.valid
    assert np.array_equal(np.asarray(image)[outside], background[outside])  # the background is untouched

    image, table = _run(MemeFormat("LOL", caption_height=40), ramp256)
    assert table.size == (296, 256) and not table.valid[:40].any() and table.valid[40:].all()
    band = np.asarray(image)[:40]
    assert (band == 255).all(axis=-1).mean() > 0.5  # a white band ...
    assert (band < 60).all(axis=-1).any()  # ... with black text
    assert np.array_equal(np.asarray(image)[40:], np.asarray(ramp256))


def _background():
    from copynce_hf.pixtrace.edits import resolve_image

    return resolve_image(NOISE_BG)


@pytest.mark.parametrize(
    "edit",
    [
        OverlayOntoScreenshot("web"),
        OverlayOntoScreenshot("mobile"),
        OverlayOntoScreenshot(crop_src_to_fit=True),
        OverlayOntoScreenshot(resize_src_to_match_template=False),
    ],
    ids=lambda e: f"{e.template}-crop{e.crop_src_to_fit}-resize{e.resize_src_to_match_template}",
)
def test_screenshot_traces_a_rectangle_inside_the_template_box(edit):
    image = ramp_image(128, 200)
    result, table = _run(edit, image)
    rows, cols = np.nonzero(table.valid)
    box = (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1)
    assert table.valid.sum() == (box[2] - box[0]) * (box[3] - box[1])  # one full rectangle
    if not edit.crop_src_to_fit:  # the whole input is visible: the rectangle keeps its aspect ratio
        assert abs((box[3] - box[1]) / (box[2] - box[0]) - 200 / 128) < 0.05
    if edit.resize_src_to_match_template:
        from copynce_hf.pixtrace.edits.geometric import _screenshot_template

        _, (th, tw), (left, top, right, bottom) = _screenshot_template(edit.template)
        assert table.size == (th, tw)
        assert top <= box[0] and left <= box[1] and box[2] <= bottom and box[3] <= right
    check = ramp_check(result, table)
    assert check.agreement >= 0.99


# ------------------------------------------------------------------ (e) replay


@pytest.mark.parametrize("edit", catalogue((96, 128)), ids=_id)
def test_replay_from_dict(edit):
    image = ramp_image(96, 128)
    description = json.loads(json.dumps(edit.to_dict()))
    replayed = edit_from_dict(description)
    assert replayed == edit and type(replayed) is type(edit)
    first, table_a = _run(edit, image)
    second, table_b = _run(replayed, image)
    assert np.array_equal(np.asarray(first), np.asarray(second))
    assert nan_equal(table_a.coords, table_b.coords)


# ------------------------------------------------------------------ (f) bad parameters


@pytest.mark.parametrize(
    "build, parameter",
    [
        (lambda: Rotate(float("nan")), "degrees"),
        (lambda: Rotate(10.0, fill=(0, 0, 300)), "fill"),
        (lambda: Rotate(10.0, resample="lanczos"), "resample"),
        (lambda: Affine(angle=float("nan")), "angle"),
        (lambda: Affine(scale=0.0), "scale"),
        (lambda: Affine(shear=(90.0, 0.0)), "shear"),
        (lambda: Affine(translate=(float("inf"), 0.0)), "translate"),
        (lambda: Crop(10, 10, 10, 50), "zero area"),
        (lambda: Crop(10, 10, 50, 5), "zero area"),
        (lambda: Crop(-1, 0, 10, 10), "left"),
        (lambda: Crop(0.5, 0, 10, 10), "left"),
        (lambda: Resize(-4, 10), "height"),
        (lambda: Resize(10, 0), "width"),
        (lambda: Scale(0.0), "factor"),
        (lambda: RandomResizedCrop(0, 0, 10, 10, 0, 5), "height"),
        (lambda: RandomResizedCrop(5, 0, 5, 10, 8, 8), "zero area"),
        (lambda: ChangeAspectRatio(0.0), "ratio"),
        (lambda: ChangeAspectRatio(float("nan")), "ratio"),
        (
            lambda: Perspective(((0, 0), (1, 0), (1, 1), (0, 1)), ((0, 0), (1, 1), (2, 2), (3, 3))),
            "endpoints",
        ),
        (
            lambda: Perspective(
                ((0, 0), (1, 0), (1, 1)),
                ((0, 0), (1, 0), (1, 1)),
            ),
            "startpoints",
        ),
        (lambda: Skew(0.2, axis=2), "axis"),
        (lambda: Skew(float("nan")), "skew_factor"),
        (lambda: Pad(-0.1, 0.1), "w_factor"),
        (lambda: Pad(0.1, 0.1, color=(1, 2)), "color"),
        (lambda: PasteOnCanvas(0, 10), "canvas_height"),
        (lambda: OverlayOntoBackground("not a spec"), "background"),
        (lambda: OverlayOntoBackground(NOISE_BG, overlay_size=1.5), "overlay_size"),
        (lambda: OverlayOntoBackground(NOISE_BG, x_pos=-0.1), "x_pos"),
        (lambda: OverlayOntoScreenshot("tablet"), "template"),
        (lambda: MemeFormat(caption_height=5), "caption_height"),
        (lambda: MemeFormat(text=3), "text"),
    ],
)
def test_bad_parameters_refused_at_construction(build, parameter):
    with pytest.raises(EditParameterError, match=parameter):
        build()


def test_parameters_that_depend_on_the_image_are_refused_at_call_time(ramp256):
    table = CoordinateTable.identity(256, 256)
    for edit in (Crop(0, 0, 257, 10), Crop(100, 250, 120, 300), RandomResizedCrop(200, 0, 300, 100, 64, 64)):
        with pytest.raises(EditParameterError, match="outside"):
            edit(ramp256, table)
    with pytest.raises(EditParameterError, match="misses"):
        PasteOnCanvas(100, 100, 100, 0)(ramp256, table)
    with pytest.raises(EditParameterError, match="nothing"):
        Scale(0.001)(ramp256, table)
    with pytest.raises(EditParameterError, match="horizon"):
        Perspective(
            ((0, 0), (255, 0), (255, 255), (0, 255)), ((100, 100), (120, 100), (140, 255), (80, 255))
        )(ramp256, table)


def test_edits_are_frozen_and_normalised():
    edit = Rotate(15, fill=[1, 2, 3])
    assert edit.fill == (1, 2, 3) and isinstance(edit.degrees, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        edit.degrees = 3.0
    assert Crop.from_fractions(0.25, 0.25, 0.75, 0.75, (375, 500)) == Crop(125, 93, 375, 281)
