"""A straightforward full-resolution coordinate-table pipeline, written only for the speed comparison.

This is how the paper's reference code traces a copy (paper, section "PixTrace Pipeline" and
supplementary "Reverse Operation of Table"): a dense table of shape (H, W, 2) holding, for every
pixel of the current image, its (y, x) position in the original; every edit *warps the whole
table* at the resolution of its output with nearest-neighbour sampling; the pair correspondence is
obtained by rescaling the original's coordinates to the reference's size, inverting the reference's
table by scattering it into that frame (where several pixels land on one cell, the last in
row-major order wins), composing, and counting per patch.

It shares no code with :mod:`copynce_hf.pixtrace` beyond reading each catalogue edit's backward
matrices (``edit.stages(size)``), so that both implementations trace *the same* edit chain.

Array conventions: tables are float32 (H, W, 2) arrays of ``(y, x)`` with pixel centres at integer
coordinates, NaN where the pixel comes from nowhere.
"""

from __future__ import annotations

import numpy as np

__all__ = ["identity", "warp_nearest", "trace_chain", "rescale_source", "invert_scatter", "compose",
           "overlap_counts", "pair_priors"]


def identity(height: int, width: int) -> np.ndarray:
    """(H, W, 2) table of an unedited image: pixel (r, c) holds (r, c)."""
    rows, cols = np.meshgrid(np.arange(height, dtype=np.float32), np.arange(width, dtype=np.float32), indexing="ij")
    return np.stack([rows, cols], axis=-1)


def warp_nearest(table: np.ndarray, matrix: np.ndarray, output_size: tuple[int, int]) -> np.ndarray:
    """Table of an image resampled from ``table``'s image by a projective map.

    Args:
        table: (H, W, 2) table of the input image.
        matrix: (3, 3) backward map from an output pixel ``(x, y, 1)`` to the input position it samples.
        output_size: (H_out, W_out).

    Returns:
        (H_out, W_out, 2): each output pixel takes the entry of the input pixel *nearest* to the
        position it samples (NaN when that position falls outside the input image).
    """
    out_h, out_w = output_size
    height, width = table.shape[:2]
    m = np.asarray(matrix, dtype=np.float32)
    xs = np.arange(out_w, dtype=np.float32)[None, :]
    ys = np.arange(out_h, dtype=np.float32)[:, None]
    x_in = m[0, 0] * xs + m[0, 1] * ys + m[0, 2]  # (H_out, W_out) by broadcasting
    y_in = m[1, 0] * xs + m[1, 1] * ys + m[1, 2]
    inside = np.ones((out_h, out_w), dtype=bool)
    if m[2, 0] != 0 or m[2, 1] != 0 or m[2, 2] != 1:  # projective: divide by w, keep w > 0
        w = m[2, 0] * xs + m[2, 1] * ys + m[2, 2]
        inside &= w > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            x_in /= w
            y_in /= w
    col = np.floor(x_in + 0.5)
    row = np.floor(y_in + 0.5)
    inside &= (col >= 0) & (col < width) & (row >= 0) & (row < height)
    flat = (np.clip(row, 0, height - 1).astype(np.intp) * width + np.clip(col, 0, width - 1).astype(np.intp))
    out = table.reshape(-1, 2)[flat.reshape(-1)].reshape(out_h, out_w, 2)
    out[~inside] = np.nan
    return out


def trace_chain(edits, source_size: tuple[int, int]) -> np.ndarray:
    """Dense table of an image made from an original of (H, W) ``source_size`` by catalogue ``edits``.

    Every stage of every geometric edit warps the full table (:func:`warp_nearest`).
    """
    table = identity(*source_size)
    size = tuple(source_size)
    for edit in edits:
        for matrix, stage_size in edit.stages(size):
            table = warp_nearest(table, np.asarray(matrix, dtype=np.float64), stage_size)
            size = tuple(stage_size)
    return table


def rescale_source(table: np.ndarray, source_size: tuple[int, int], frame_size: tuple[int, int]) -> np.ndarray:
    """Express the original's coordinates in a frame of (H_f, W_f) pixels (area-aligned rescale)."""
    scale = np.array([frame_size[0] / source_size[0], frame_size[1] / source_size[1]], dtype=np.float32)
    return (table + 0.5) * scale - 0.5


def invert_scatter(table: np.ndarray, frame_size: tuple[int, int]) -> np.ndarray:
    """(H_f, W_f, 2) inverse of ``table`` (whose entries are frame coordinates) by scattering.

    Each frame cell nearest to a table entry receives that table pixel's (row, col); the last
    pixel in row-major order wins (NumPy assigns repeated indices in order); cells no entry
    reaches stay NaN.
    """
    height, width = table.shape[:2]
    frame_h, frame_w = frame_size
    rows, cols = np.meshgrid(np.arange(height, dtype=np.float32), np.arange(width, dtype=np.float32), indexing="ij")
    with np.errstate(invalid="ignore"):
        target_row = np.floor(table[..., 0] + 0.5)
        target_col = np.floor(table[..., 1] + 0.5)
        ok = (target_row >= 0) & (target_row < frame_h) & (target_col >= 0) & (target_col < frame_w)
    inverse = np.full((frame_h, frame_w, 2), np.nan, dtype=np.float32)
    inverse[target_row[ok].astype(np.intp), target_col[ok].astype(np.intp)] = np.stack([rows[ok], cols[ok]], -1)
    return inverse


def compose(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Table A -> C from A -> B (``first``, entries in B's pixels) and B -> C (``second``), nearest look-up."""
    height, width = second.shape[:2]
    with np.errstate(invalid="ignore"):
        row = np.floor(first[..., 0] + 0.5)
        col = np.floor(first[..., 1] + 0.5)
        ok = (row >= 0) & (row < height) & (col >= 0) & (col < width)
    out = np.full(first.shape, np.nan, dtype=np.float32)
    out[ok] = second[row[ok].astype(np.intp), col[ok].astype(np.intp)]
    return out


def overlap_counts(table: np.ndarray, patch_size: int, target_size: tuple[int, int]) -> np.ndarray:
    """(L_A, L_B) share of each A-patch's pixels whose entry lies in each B-patch (rows sum to <= 1)."""
    height, width = table.shape[:2]
    grid_a_w = width // patch_size
    grid_b_h, grid_b_w = target_size[0] // patch_size, target_size[1] // patch_size
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    source_patch = (rows // patch_size) * grid_a_w + cols // patch_size
    with np.errstate(invalid="ignore"):
        row = np.floor(table[..., 0] + 0.5)
        col = np.floor(table[..., 1] + 0.5)
        ok = (row >= 0) & (row < target_size[0]) & (col >= 0) & (col < target_size[1])
    target_patch = (row[ok].astype(np.intp) // patch_size) * grid_b_w + col[ok].astype(np.intp) // patch_size
    num_a, num_b = (height // patch_size) * grid_a_w, grid_b_h * grid_b_w
    counts = np.bincount(source_patch[ok] * num_b + target_patch, minlength=num_a * num_b)
    return (counts.reshape(num_a, num_b) / float(patch_size * patch_size)).astype(np.float32)


def pair_priors(query_edits, reference_edits, source_size: tuple[int, int], patch_size: int):
    """Both overlap priors of a pair, the reference code's way.

    Returns:
        ``(overlap_qr (L_q, L_r), overlap_rq (L_r, L_q))`` float32.
    """
    query = trace_chain(query_edits, source_size)
    reference = trace_chain(reference_edits, source_size)
    frame = reference.shape[:2]  # the original rescaled to the reference's size
    query = rescale_source(query, source_size, frame)
    reference = rescale_source(reference, source_size, frame)
    query_to_reference = compose(query, invert_scatter(reference, frame))
    reference_to_query = compose(reference, invert_scatter(query, frame))
    return (overlap_counts(query_to_reference, patch_size, reference.shape[:2]),
            overlap_counts(reference_to_query, patch_size, query.shape[:2]))
