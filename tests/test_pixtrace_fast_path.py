"""The fused analytic overlap path equals the generic compose-then-count path, bit for bit.

``pair_overlaps`` on analytic tables counts, in one pass per direction, the pixels of one copy
that land in each patch of the other (the paper's q-hat, section "CopyNCE Loss", from the
tables of section "PixTrace Pipeline"). The generic path composes the tables
(``t_qo.compose(t_ro.inverse())``) and counts with ``patch_overlap``. On random chains of the
catalogue's geometric edits, with occlusions, flips, paddings, strong perspectives (pixels
beyond the horizon), several patch sizes and non-square images, both must agree exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from copynce_hf.pixtrace import CoordinateTable, pair_overlaps, pair_tables, patch_overlap
from copynce_hf.pixtrace.edits import (
    Affine,
    HorizontalFlip,
    Pad,
    Perspective,
    RandomResizedCrop,
    Resize,
    Rotate,
    Skew,
    VerticalFlip,
)


def _random_chain(rng: np.random.Generator, size: tuple[int, int], output: tuple[int, int]):
    """Three to six catalogue edits drawn at random, then the resize to ``output``."""
    edits = []
    for _ in range(int(rng.integers(3, 7))):
        kind = int(rng.integers(0, 8))
        if kind == 0:
            edits.append(RandomResizedCrop.draw(rng, size, (int(rng.integers(60, 200)), int(rng.integers(60, 200)))))
        elif kind == 1:
            edits.append(Rotate(float(rng.uniform(-60, 60)), expand=bool(rng.integers(0, 2))))
        elif kind == 2:
            edits.append(Affine(angle=float(rng.uniform(-20, 20)), scale=float(rng.uniform(0.7, 1.3)),
                                shear=(float(rng.uniform(-15, 15)), float(rng.uniform(-5, 5))),
                                translate=(float(rng.uniform(-10, 10)), float(rng.uniform(-10, 10)))))
        elif kind == 3:
            edits.append(Perspective.augly_like(size, sigma=0.08 * min(size), seed=int(rng.integers(1 << 30))))
        elif kind == 4:
            edits.append(HorizontalFlip() if rng.random() < 0.5 else VerticalFlip())
        elif kind == 5:
            edits.append(Pad(w_factor=float(rng.uniform(0, 0.3)), h_factor=float(rng.uniform(0, 0.3))))
        elif kind == 6:
            edits.append(Skew(float(rng.uniform(-0.4, 0.4)), axis=int(rng.integers(0, 2))))
        else:
            edits.append(Resize(int(rng.integers(80, 300)), int(rng.integers(80, 300))))
        size = edits[-1].output_size(size)
    return edits + [Resize(*output)]


def _trace(chain, table: CoordinateTable, rng: np.random.Generator, occlude: bool) -> CoordinateTable:
    for edit in chain:
        table = edit.trace(table)
        if occlude and rng.random() < 0.3:  # an occluding edit: a random box of the image untraced
            covered = np.zeros(table.size, dtype=bool)
            height, width = table.size
            top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
            covered[top : top + int(rng.integers(5, 60)), left : left + int(rng.integers(5, 60))] = True
            table = table.occlude(covered)
    return table


def _generic(table_a: CoordinateTable, table_b: CoordinateTable, patch: int):
    table_ab, table_ba = pair_tables(table_a, table_b)
    return patch_overlap(table_ab, patch, table_b.size), patch_overlap(table_ba, patch, table_a.size)


@pytest.mark.parametrize(
    ("seed", "original", "query_size", "reference_size", "patch", "occlude"),
    [
        (0, (375, 500), (224, 224), (224, 224), 16, False),
        (1, (375, 500), (224, 224), (224, 224), 16, True),
        (2, (300, 200), (112, 168), (140, 84), 14, True),
        (3, (120, 160), (64, 96), (96, 64), 8, True),
    ],
)
def test_fused_pair_overlaps_equal_generic_path_on_random_chains(
    seed, original, query_size, reference_size, patch, occlude
):
    rng = np.random.default_rng(seed)
    counted = 0.0
    for _ in range(8):
        query = _trace(_random_chain(rng, original, query_size), CoordinateTable.identity(*original), rng, occlude)
        reference = _trace(_random_chain(rng, original, reference_size), CoordinateTable.identity(*original), rng,
                           occlude)
        assert query.is_analytic and reference.is_analytic
        fused = pair_overlaps(query, reference, patch)
        expected = _generic(query, reference, patch)
        for got, want in zip(fused, expected):
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
        counted += fused[0].sum()
    assert counted > 0  # the chains overlap: the comparison is not between empty matrices


def test_fused_path_handles_pixels_beyond_the_horizon():
    """A reference warped by a strong perspective: some query pixels map behind its horizon
    (w <= 0, where positions are meaningless or NaN); they must count nowhere, as in the generic path."""
    original = CoordinateTable.identity(100, 120)
    query = original.resize(64, 64)
    seen_behind = 0
    for strength in (4e-3, 8e-3, 1.5e-2, -1e-2):
        matrix = np.array([[1.0, 0.1, 0.0], [0.05, 1.0, 0.0], [strength, strength / 2, 1.0]])
        reference = original.warp(matrix, (100, 120)).resize(48, 64)
        to_reference = np.linalg.inv(reference.matrix) @ query.matrix
        cols, rows = np.meshgrid(np.arange(64), np.arange(64))
        w = to_reference[2, 0] * cols + to_reference[2, 1] * rows + to_reference[2, 2]
        seen_behind += int((w * np.sign(to_reference[2, 2]) <= 0).any())
        fused = pair_overlaps(query, reference, 16)
        expected = _generic(query, reference, 16)
        np.testing.assert_array_equal(fused[0], expected[0])
        np.testing.assert_array_equal(fused[1], expected[1])
    assert seen_behind  # the case this test is about did occur


def test_fused_path_fully_traced_and_empty_overlaps():
    original = CoordinateTable.identity(96, 128)
    query = original.resize(64, 64)
    # Disjoint crops: nothing of one copy is in the other.
    left = original.warp(np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]), (96, 40)).resize(32, 32)
    right = original.warp(np.array([[1.0, 0, 80.0], [0, 1.0, 0], [0, 0, 1.0]]), (96, 40)).resize(32, 32)
    overlap_lr, overlap_rl = pair_overlaps(left, right, 16)
    assert not overlap_lr.any() and not overlap_rl.any()
    assert query.fully_traced and not left.inverse().fully_traced
    overlap_qq, _ = pair_overlaps(query, query, 16)
    np.testing.assert_array_equal(overlap_qq, np.eye(16, dtype=np.float32))
