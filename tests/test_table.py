"""CoordinateTable algebra and patch_overlap, checked against brute force and round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from copynce_hf.modeling.errors import TableError
from copynce_hf.pixtrace import CoordinateTable, pair_overlaps, pair_tables, patch_overlap


def translate(dx: float, dy: float) -> np.ndarray:
    return np.array([[1.0, 0.0, dx], [0.0, 1.0, dy], [0.0, 0.0, 1.0]])


def crop(table: CoordinateTable, top: int, left: int, height: int, width: int) -> CoordinateTable:
    return table.warp(translate(left, top), (height, width))


def rotate(table: CoordinateTable, degrees: float) -> CoordinateTable:
    height, width = table.size
    centre = np.array([(width - 1) / 2, (height - 1) / 2])
    angle = math.radians(degrees)
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    matrix = np.eye(3)
    matrix[:2, :2] = rotation
    matrix[:2, 2] = centre - rotation @ centre
    return table.warp(matrix, table.size)


def perspective(table: CoordinateTable, strength: float) -> CoordinateTable:
    matrix = np.array([[1.0, 0.05, 2.0], [0.02, 1.0, -3.0], [strength, -strength / 2, 1.0]])
    return table.warp(matrix, table.size)


def test_identity_maps_every_pixel_to_itself():
    table = CoordinateTable.identity(5, 7)
    rows, cols = np.mgrid[0:5, 0:7]
    np.testing.assert_array_equal(table.coords[..., 0], rows)
    np.testing.assert_array_equal(table.coords[..., 1], cols)
    np.testing.assert_array_equal(table.lookup(4, 6), [4, 6])
    with pytest.raises(TableError):
        table.lookup(5, 0)


def test_warp_matches_dense_remap_and_marks_outside_untraced():
    source = CoordinateTable.identity(60, 80)
    analytic = rotate(crop(source, 5, 10, 40, 50), 25).resize(32, 48)
    # The same chain evaluated densely, step by step, through remap (pixel-exact pull-backs).
    dense = CoordinateTable(source.coords, source.source_size)
    dense = crop(dense, 5, 10, 40, 50)
    dense = rotate(dense, 25).resize(32, 48)
    assert not dense.is_analytic and analytic.is_analytic
    # Dense pull-backs round to the nearest pixel at each step, so positions differ by < 1 pixel...
    both = analytic.valid & dense.valid
    assert both.mean() > 0.6
    error = np.abs(analytic.coords[both] - dense.coords[both])
    assert error.max() < 1.5 and error.mean() < 0.5  # two nearest-pixel roundings of at most sqrt(2)/2
    # ...and validity differs only on the border of the traced region.
    disagreement = analytic.valid ^ dense.valid
    assert disagreement.mean() < 0.05
    # Rotated corners came from outside the crop.
    assert not analytic.valid[0, 0] and analytic.valid[16, 24]


def test_occlusion_follows_later_geometry():
    table = CoordinateTable.identity(40, 40)
    covered = np.zeros((40, 40), dtype=bool)
    covered[:, :20] = True  # left half overlaid
    flipped = table.occlude(covered).warp(np.array([[-1.0, 0, 39], [0, 1, 0], [0, 0, 1]]), (40, 40))
    assert flipped.valid[:, :20].all() and not flipped.valid[:, 20:].any()
    np.testing.assert_allclose(flipped.coords[3, 0], [3, 39])


def test_inverse_round_trip_is_identity_on_traced_pixels():
    source = CoordinateTable.identity(90, 120)
    copy = perspective(rotate(crop(source, 10, 20, 60, 80), 15), 1e-4).resize(64, 64)
    round_trip = copy.compose(copy.inverse())
    valid = copy.valid
    rows, cols = np.mgrid[0:64, 0:64]
    np.testing.assert_allclose(round_trip.coords[valid][:, 0], rows[valid], atol=1e-3)
    np.testing.assert_allclose(round_trip.coords[valid][:, 1], cols[valid], atol=1e-3)
    # The analytic inverse of a 2x downscale is dense, not one pixel in four.
    shrunk = source.resize(45, 60)
    assert shrunk.inverse().traced_fraction == 1.0


def test_dense_inverse_last_writer_wins_row_major():
    # Two pixels of a 1x3 table map to source pixel (0, 1); the later (col 2) wins.
    coords = np.array([[[0, 0], [0, 1], [0, 1.2]]], dtype=np.float32)
    inverse = CoordinateTable(coords, (1, 3)).inverse()
    np.testing.assert_array_equal(inverse.coords[0, 1], [0, 2])
    np.testing.assert_array_equal(inverse.coords[0, 0], [0, 0])
    assert np.isnan(inverse.coords[0, 2]).all()


def test_compose_rejects_mismatched_sizes():
    with pytest.raises(TableError):
        CoordinateTable.identity(10, 10).compose(CoordinateTable.identity(10, 11))


def test_unedited_query_overlap_rows_sum_to_one():
    original = CoordinateTable.identity(375, 500)
    query, reference = original.resize(224, 224), original.resize(224, 224)
    overlap_qr, overlap_rq = pair_overlaps(query, reference, 16)
    np.testing.assert_allclose(overlap_qr.sum(1), 1.0)
    np.testing.assert_allclose(overlap_qr, np.eye(196), atol=1e-6)
    np.testing.assert_allclose(overlap_rq.sum(1), 1.0)


@pytest.mark.parametrize("dense", [False, True])
def test_crop_query_traces_its_area_fraction(dense):
    original = CoordinateTable.identity(375, 500)
    reference = original.resize(224, 224)
    query = crop(original, 40, 60, 250, 300).resize(224, 224)
    if dense:  # the scatter-inverse path must not leave the downscaled reference sparse
        query = query.apply(lambda coords: coords)
        reference = reference.apply(lambda coords: coords)
    overlap_qr, overlap_rq = pair_overlaps(query, reference, 16)
    area = 250 * 300 / (375 * 500)
    np.testing.assert_allclose(overlap_qr.sum(1), 1.0, atol=1e-6)  # every query pixel is in the reference
    assert abs(overlap_rq.sum() / overlap_rq.shape[0] - area) < 0.02
    table_qr, _ = pair_tables(query, reference)
    assert table_qr.traced_fraction > 0.99


def brute_force_overlap(table: CoordinateTable, patch: int, target_size) -> np.ndarray:
    height, width = table.size
    grid_w, target_grid_w = width // patch, target_size[1] // patch
    out = np.zeros(((height // patch) * grid_w, (target_size[0] // patch) * target_grid_w))
    for row in range(height):
        for col in range(width):
            y, x = table.coords[row, col]
            if np.isnan(y):
                continue
            ty, tx = math.floor(y + 0.5), math.floor(x + 0.5)
            if not (0 <= ty < target_size[0] and 0 <= tx < target_size[1]):
                continue
            i = (row // patch) * grid_w + col // patch
            j = (ty // patch) * target_grid_w + tx // patch
            out[i, j] += 1
    return out / patch**2


def test_patch_overlap_matches_brute_force():
    source = CoordinateTable.identity(70, 90)
    covered = np.zeros((70, 90), dtype=bool)
    covered[30:45, 10:60] = True
    table = perspective(rotate(source.occlude(covered), 20), 2e-4).resize(32, 48)
    for target_size in [(70 - 70 % 8, 88), (48, 32)]:
        expected = brute_force_overlap(table, 8, target_size)
        np.testing.assert_allclose(patch_overlap(table, 8, target_size), expected, atol=1e-6)
    assert patch_overlap(table, 8, (64, 88)).sum(1).max() <= 1.0 + 1e-6


def test_patch_overlap_refuses_sizes_not_multiple_of_patch():
    with pytest.raises(TableError, match="multiple of patch_size"):
        patch_overlap(CoordinateTable.identity(30, 32), 16, (32, 32))


def test_pair_tables_are_mutually_inverse():
    original = CoordinateTable.identity(200, 300)
    query = rotate(crop(original, 20, 30, 150, 200), 10).resize(64, 64)
    reference = crop(original, 0, 50, 200, 250).resize(64, 64)
    table_qr, table_rq = pair_tables(query, reference)
    back = table_qr.compose(table_rq)
    shared = back.valid
    assert 0.3 < shared.mean() < 1.0
    rows, cols = np.mgrid[0:64, 0:64]
    np.testing.assert_allclose(back.coords[shared][:, 0], rows[shared], atol=1e-3)
    np.testing.assert_allclose(back.coords[shared][:, 1], cols[shared], atol=1e-3)
    overlap_qr, overlap_rq = pair_overlaps(query, reference, 16)
    # A query patch overlaps a reference patch iff some reference pixels trace back into it.
    assert ((overlap_qr > 0.1) <= (overlap_rq.T > 0)).all()


def test_fused_pair_overlaps_equal_compose_then_count():
    rng = np.random.default_rng(3)
    original = CoordinateTable.identity(150, 200)
    for _ in range(6):
        covered = np.zeros((120, 160), dtype=bool)
        top, left = rng.integers(0, 80, size=2)
        covered[top : top + 40, left : left + 60] = True
        query = crop(original, int(rng.integers(0, 30)), int(rng.integers(0, 40)), 120, 160).occlude(covered)
        query = perspective(rotate(query, float(rng.uniform(-40, 40))), float(rng.uniform(-3e-4, 3e-4)))
        query = query.resize(64, 48)
        reference = rotate(original, float(rng.uniform(-10, 10))).resize(48, 64)
        fused = pair_overlaps(query, reference, 16)
        table_qr, table_rq = pair_tables(query, reference)
        np.testing.assert_array_equal(fused[0], patch_overlap(table_qr, 16, reference.size))
        np.testing.assert_array_equal(fused[1], patch_overlap(table_rq, 16, query.size))
        assert fused[0].sum() > 0
