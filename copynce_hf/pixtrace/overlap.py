"""Patch overlap priors: the paper's q-hat, from a pixel correspondence table.

Paper, section "CopyNCE Loss": q-hat(R_j^r | R_i^q) = |{T[c] in R_j^r : c in R_i^q}| / |R_i^q|,
the share of query patch i's pixels whose traced position falls inside reference patch j.
"""

from __future__ import annotations

import numpy as np

from ..modeling.errors import TableError
from .projective import apply_matrix
from .table import CoordinateTable

__all__ = ["patch_overlap", "pair_tables", "pair_overlaps", "scatter_reverse_overlap", "REVERSE_PRIORS"]

#: How the reference -> query prior is made: ``exact`` (the inverse table) or ``scatter`` (the authors').
REVERSE_PRIORS = ("exact", "scatter")

_PATCH_INDEX_CACHE: dict[tuple, np.ndarray] = {}


def patch_overlap(table: CoordinateTable, patch_size: int, target_size: tuple[int, int]) -> np.ndarray:
    """Overlap prior of the patches of image A (the table's image) with those of image B.

    Args:
        table: maps image A (H, W), both multiples of ``patch_size``, into image B.
        patch_size: side of a square patch in pixels (16 for ViT-S/16).
        target_size: ``(H_B, W_B)`` of image B, multiples of ``patch_size``.

    Returns:
        float32 (L_A, L_B), patches numbered row-major: entry (i, j) is the number of
        pixels of A-patch i whose traced position lies in B-patch j, over ``patch_size**2``.
        Untraced and out-of-bounds pixels count nowhere, so rows sum to at most 1.
    """
    height, width = table.size
    target_h, target_w = _patch_grids(table, patch_size, target_size)
    grid_a = (height // patch_size) * (width // patch_size)
    grid_b_w = target_w // patch_size
    grid_b = (target_h // patch_size) * grid_b_w

    y, x, valid = table.positions()
    size = np.float32(patch_size)
    with np.errstate(invalid="ignore"):
        # Patch of the nearest target pixel, floor((v + 0.5) / patch), kept in float32: keys
        # stay exact integers far beyond L_A * L_B. Division (not a reciprocal product) keeps
        # exact patch borders exact.
        patch_row = np.floor((y + np.float32(0.5)) / size)
        patch_col = np.floor((x + np.float32(0.5)) / size)
        inside = valid & (patch_row >= 0) & (patch_row < np.float32(target_h // patch_size))
        inside &= (patch_col >= 0) & (patch_col < np.float32(grid_b_w))
        patch_row *= np.float32(grid_b_w)
        patch_row += patch_col
        patch_row += _patch_index(height, width, patch_size, grid_b)
    counts = np.bincount(patch_row[inside].astype(np.intp), minlength=grid_a * grid_b)
    return (counts.astype(np.float32) / np.float32(patch_size * patch_size)).reshape(grid_a, grid_b)


def _patch_grids(table: CoordinateTable, patch_size: int, target_size) -> tuple[int, int]:
    """``(H_B, W_B)`` as ints, after checking that both images' sides are multiples of ``patch_size``."""
    height, width = table.size
    target_h, target_w = (int(v) for v in target_size)
    for name, value in (("table height", height), ("table width", width), ("target height", target_h),
                        ("target width", target_w)):
        if value % patch_size:
            raise TableError(f"{name} {value} is not a multiple of patch_size {patch_size}")
    return target_h, target_w


def pair_tables(table_a: CoordinateTable, table_b: CoordinateTable) -> tuple[CoordinateTable, CoordinateTable]:
    """Tables A -> B and B -> A of two copies of one source, through the source (the paper's bridge).

    Both tables must share a source. For tables made by the catalogue's edits the result
    is exact and dense (analytic inverse); for dense tables the paper's scatter inverse is
    used, at the source's resolution.
    """
    if table_a.source_size != table_b.source_size:
        raise TableError(
            f"the two tables trace to different sources: {table_a.source_size} and {table_b.source_size}"
        )
    if not (table_a.is_analytic and table_b.is_analytic):
        table_a, table_b = _common_dense_frame(table_a, table_b)
    return table_a.compose(table_b.inverse()), table_b.compose(table_a.inverse())


#: Largest side of the source frame used to invert dense tables.
MAX_DENSE_FRAME_SIDE = 4096


def _common_dense_frame(table_a: CoordinateTable, table_b: CoordinateTable):
    """Express both tables' source positions in a frame at least as fine as either copy.

    A scatter inverse at the source's resolution is sparse wherever a copy shows the source
    at a finer scale than the source grid: a reference shrunk 2x from its original gives
    only one source pixel in four a value. The reference code rescales the source to the
    copy's size before inverting; here the frame is scaled so that one pixel of either copy
    covers at least one frame pixel, which every scatter then reaches.
    """
    scale = max(table_a.source_pixels_per_pixel(), table_b.source_pixels_per_pixel())
    factor = 1.0 / max(scale, 1e-6)
    height, width = table_a.source_size
    factor = min(factor, MAX_DENSE_FRAME_SIDE / max(height, width))
    frame = (max(1, int(np.ceil(height * factor))), max(1, int(np.ceil(width * factor))))
    return table_a.with_source_size(*frame), table_b.with_source_size(*frame)


def scatter_reverse_overlap(table_ab: CoordinateTable, patch_size: int, target_size: tuple[int, int]) -> np.ndarray:
    """The B -> A prior made from the A -> B table with the authors' scatter inverse, float32 (L_B, L_A).

    Every traced pixel of A writes its own position into the B pixel nearest to its traced
    position (rounded, as ``torch.round``; when several land on one B pixel the last in row-major
    order wins); each B pixel then counts for the A patch of the pixel it holds. B pixels that no
    A pixel lands on hold nothing: where A shows B shrunk (fewer A pixels than the B pixels they
    cover) the inverse has holes, and the prior's rows sum to less than the traced share.

    Args:
        table_ab: maps image A (H_A, W_A) into image B.
        patch_size: side of a square patch; both sizes are multiples of it.
        target_size: ``(H_B, W_B)``.
    """
    height, width = table_ab.size
    target_h, target_w = _patch_grids(table_ab, patch_size, target_size)
    y, x, valid = table_ab.positions()
    with np.errstate(invalid="ignore"):
        row, col = np.rint(y.astype(np.float64)), np.rint(x.astype(np.float64))
        inside = valid & (row >= 0) & (row < target_h) & (col >= 0) & (col < target_w)
    source_pixels = np.flatnonzero(inside)
    holder = np.full(target_h * target_w, -1, dtype=np.int64)
    holder[(row.ravel()[source_pixels] * target_w + col.ravel()[source_pixels]).astype(np.int64)] = source_pixels
    filled = np.flatnonzero(holder >= 0)
    grid_a_w, grid_b_w = width // patch_size, target_w // patch_size
    a_pixels = holder[filled]
    a_patch = (a_pixels // width) // patch_size * grid_a_w + (a_pixels % width) // patch_size
    b_patch = (filled // target_w) // patch_size * grid_b_w + (filled % target_w) // patch_size
    grid_a = (height // patch_size) * grid_a_w
    grid_b = (target_h // patch_size) * grid_b_w
    counts = np.bincount(b_patch * grid_a + a_patch, minlength=grid_a * grid_b)
    return (counts.astype(np.float32) / np.float32(patch_size * patch_size)).reshape(grid_b, grid_a)


def pair_overlaps(
    table_q: CoordinateTable, table_r: CoordinateTable, patch_size: int, reverse: str = "exact"
) -> tuple[np.ndarray, np.ndarray]:
    """Both overlap priors of a copy pair: ``(overlap_qr (L_q, L_r), overlap_rq (L_r, L_q))``.

    Equal to ``patch_overlap`` on the two :func:`pair_tables`; for analytic tables (every
    catalogue edit) the composition and the count are fused, which halves the work. With
    ``reverse="scatter"`` the reference -> query prior is instead made from the query ->
    reference table by the authors' scatter inverse (:func:`scatter_reverse_overlap`).
    """
    if table_q.source_size != table_r.source_size:
        raise TableError(
            f"the two tables trace to different sources: {table_q.source_size} and {table_r.source_size}"
        )
    if reverse not in REVERSE_PRIORS:
        raise TableError(f"reverse={reverse!r} must be one of {REVERSE_PRIORS}")
    if reverse == "scatter":
        table_qr = pair_tables(table_q, table_r)[0]
        return (patch_overlap(table_qr, patch_size, table_r.size),
                scatter_reverse_overlap(table_qr, patch_size, table_r.size))
    if table_q.is_analytic and table_r.is_analytic:
        return (
            _analytic_pair_overlap(table_q, table_r, patch_size),
            _analytic_pair_overlap(table_r, table_q, patch_size),
        )
    table_qr, table_rq = pair_tables(table_q, table_r)
    return (
        patch_overlap(table_qr, patch_size, table_r.size),
        patch_overlap(table_rq, patch_size, table_q.size),
    )


def _analytic_pair_overlap(table_a: CoordinateTable, table_b: CoordinateTable, patch_size: int) -> np.ndarray:
    """``patch_overlap(table_a.compose(table_b.inverse()), patch_size, table_b.size)``, fused.

    A pixel of A counts in B's patch j when it is traced in A, its source point maps (by
    B's inverse projective map) into B's pixel area, w > 0, and B's nearest pixel there is
    traced: exactly the validity of the composed table. Positions in B use the composed
    table's float32 arithmetic (:func:`~.projective.apply_matrix`), so the counts equal those of
    the unfused path bit for bit.

    Per pixel of A: its position in B (a projective map), the index of B's nearest pixel in
    a grid padded by one pixel on every side, one gather from a look-up table over that
    grid (1 + B's patch number; 0 on the padding and at untraced pixels, so one gather does
    the bounds and the validity tests), and one ``bincount`` of
    ``(L_B + 1) * patch_A + lookup``, whose column 0 collects what counts nowhere.
    """
    height, width = table_a.size
    target_h, target_w = _patch_grids(table_a, patch_size, table_b.size)
    grid_a = (height // patch_size) * (width // patch_size)
    grid_b = (target_h // patch_size) * (target_w // patch_size)
    if grid_a * (grid_b + 1) >= 2**31 or (target_h + 2) * (target_w + 2) >= 2**24:
        # int32 keys and float32 indices would not be exact: compose, then count.
        return patch_overlap(table_a.compose(table_b.inverse()), patch_size, table_b.size)
    to_b = np.linalg.inv(table_b.matrix) @ table_a.matrix
    to_b /= to_b[2, 2] if abs(to_b[2, 2]) > 1e-12 else 1.0
    x, y, w = apply_matrix(to_b, table_a.size, with_w=True)
    behind = w is not None and not _clearly_positive_w(to_b, table_a.size)  # pixels may have w <= 0
    # NaN positions come only from w = 0 or from a map too large for float32.
    index = _padded_index(y, x, table_b.size, nan_safe=behind or not np.abs(to_b).max() < 1e30)
    if not table_a.fully_traced:
        index *= table_a.valid  # untraced in A -> index 0, a padding pixel
    if behind:
        index *= w > 0
    key = _b_lookup(table_b, patch_size).take(index)
    key += _pixel_patch(height, width, patch_size, grid_b + 1).reshape(height, width)
    counts = np.bincount(key.ravel(), minlength=grid_a * (grid_b + 1)).reshape(grid_a, grid_b + 1)
    overlap = counts[:, 1:].astype(np.float32)
    overlap /= np.float32(patch_size * patch_size)
    return overlap


def _clearly_positive_w(matrix: np.ndarray, size) -> bool:
    """True if the homogeneous w of ``matrix`` (3, 3) is positive, with a margin far above float32
    rounding, at the four corner pixel centres of an image of ``size``, and so (w being affine in
    the pixel) at every pixel."""
    height, width = size
    w0, w1, w2 = matrix[2].tolist()
    lowest = w2 + min(0.0, w0 * (width - 1)) + min(0.0, w1 * (height - 1))
    return lowest > 1e-4 * (abs(w0) * width + abs(w1) * height + abs(w2))


def _padded_index(y: np.ndarray, x: np.ndarray, size, nan_safe: bool) -> np.ndarray:
    """int32 (H, W): flat index of the nearest pixel, ``floor(v + 0.5)``, of an image of ``size``
    in its grid padded by one pixel on every side; positions off the pixel area land on the
    padding. ``y`` and ``x`` (float32 (H, W)) are overwritten.

    ``v + 0.5`` is the unfused path's value bit for bit; clipping the floored value into
    [-1, size] keeps the index in the padded grid (``nan_safe`` also sends NaN there).
    """
    height, width = size
    for values, high in ((y, height), (x, width)):
        values += np.float32(0.5)
        np.floor(values, out=values)
        if nan_safe:
            np.fmax(values, np.float32(-1), out=values)
            np.fmin(values, np.float32(high), out=values)
        else:
            np.clip(values, np.float32(-1), np.float32(high), out=values)
    y *= np.float32(width + 2)  # float32 arithmetic on integers below 2**24 is exact
    y += x
    y += np.float32(width + 3)
    return y.astype(np.int32)


def _b_lookup(table: CoordinateTable, patch_size: int) -> np.ndarray:
    """int32 ((H + 2) * (W + 2),): 1 + the patch number of every pixel of ``table``'s image, in
    its grid padded by one pixel on every side; 0 on the padding and at untraced pixels."""
    height, width = table.size
    patch = _pixel_patch(height, width, patch_size, 1, plus=1).reshape(height, width)
    if table.fully_traced:  # depends on the size only: cached
        key = (height, width, patch_size, "lookup")
        lookup = _PATCH_INDEX_CACHE.get(key)
        if lookup is None:
            lookup = np.zeros((height + 2, width + 2), dtype=np.int32)
            lookup[1:-1, 1:-1] = patch
            lookup = lookup.ravel()
            lookup.setflags(write=False)
            _PATCH_INDEX_CACHE[key] = lookup
        return lookup
    lookup = np.zeros((height + 2, width + 2), dtype=np.int32)
    np.multiply(patch, table.valid, out=lookup[1:-1, 1:-1])
    return lookup.ravel()


def _pixel_patch(height: int, width: int, patch_size: int, stride: int, plus: int = 0) -> np.ndarray:
    """int32 (H * W,): ``stride`` times the row-major patch number of every pixel, plus ``plus``,
    flat (cached, read-only)."""
    key = (height, width, patch_size, -stride, plus)
    index = _PATCH_INDEX_CACHE.get(key)
    if index is None:
        index = _patch_index(height, width, patch_size, 1).astype(np.int32).ravel() * np.int32(stride)
        index += np.int32(plus)
        index.setflags(write=False)
        _PATCH_INDEX_CACHE[key] = index
    return index


def _patch_index(height: int, width: int, patch_size: int, stride: int) -> np.ndarray:
    """float32 (H, W): ``stride`` times the row-major patch number of every pixel (cached)."""
    key = (height, width, patch_size, stride)
    index = _PATCH_INDEX_CACHE.get(key)
    if index is None:
        rows = np.arange(height) // patch_size
        cols = np.arange(width) // patch_size
        index = ((rows[:, None] * (width // patch_size) + cols[None, :]) * stride).astype(np.float32)
        index.setflags(write=False)
        _PATCH_INDEX_CACHE[key] = index
    return index
