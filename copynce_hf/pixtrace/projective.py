"""Projective maths shared by tables, edits and fused rendering: PixTrace's matrix conventions.

Paper, section "PixTrace Pipeline": every geometric edit is a projective map of the plane,
written here as a (3, 3) matrix acting on homogeneous column vectors ``(x, y, 1)`` of pixel
centres (integer coordinates), always *backward*: output pixel -> input position. Pillow's
``Image.transform`` works in pixel-area coordinates (pixel centres at half-integers);
:func:`area_to_centre` / :func:`centre_to_area` convert between the two.
"""

from __future__ import annotations

import numpy as np

__all__ = ["apply_matrix", "area_to_centre", "centre_to_area", "homography", "resize_matrix", "translation_matrix"]

_SHIFT = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])  # centre -> area coordinates
_UNSHIFT = np.linalg.inv(_SHIFT)


def resize_matrix(old_size: tuple[int, int], new_size: tuple[int, int]) -> np.ndarray:
    """Backward map (3, 3) of an area-aligned resize from (H, W) ``old_size`` to ``new_size``:
    new pixel centre -> old position (the pixel areas, not the centres of the corner pixels, line up)."""
    sy = old_size[0] / new_size[0]
    sx = old_size[1] / new_size[1]
    return np.array([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5], [0.0, 0.0, 1.0]])


def translation_matrix(tx: float, ty: float) -> np.ndarray:
    """Backward map (3, 3) of content moved by (-tx, -ty): output (x, y) samples input (x + tx, y + ty)."""
    return np.array([[1.0, 0.0, tx], [0.0, 1.0, ty], [0.0, 0.0, 1.0]])


def area_to_centre(matrix_area: np.ndarray) -> np.ndarray:
    """A backward map in Pillow's pixel-area coordinates, in pixel-centre coordinates: S^-1 A S."""
    return _UNSHIFT @ np.asarray(matrix_area, dtype=np.float64) @ _SHIFT


def centre_to_area(matrix_centre: np.ndarray) -> np.ndarray:
    """Inverse of :func:`area_to_centre`: S M S^-1."""
    return _SHIFT @ np.asarray(matrix_centre, dtype=np.float64) @ _UNSHIFT


def homography(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(3, 3) projective map sending the four ``source`` points (4, 2) onto ``target`` (4, 2)."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(source, target):
        rows.append([x, y, 1.0, 0.0, 0.0, 0.0, -u * x, -u * y])
        rows.append([0.0, 0.0, 0.0, x, y, 1.0, -v * x, -v * y])
        rhs += [u, v]
    solution = np.linalg.solve(np.array(rows), np.array(rhs))
    return np.append(solution, 1.0).reshape(3, 3)


def apply_matrix(matrix: np.ndarray, size: tuple[int, int], with_w: bool = False):
    """Apply a (3, 3) map to every pixel centre of an image of (H, W) ``size``: x, y (H, W) float32.

    Each homogeneous component is an outer sum of a row and a column vector, so an affine
    map costs one addition per pixel and component, a projective one two more divisions.
    With ``with_w`` also returns the homogeneous w (H, W), or None for an affine map.
    """
    height, width = size
    cols = np.arange(width, dtype=np.float32)
    rows = np.arange(height, dtype=np.float32)[:, None]
    m = matrix.astype(np.float32)
    out_x = m[0, 0] * cols + (m[0, 1] * rows + m[0, 2])
    out_y = m[1, 0] * cols + (m[1, 1] * rows + m[1, 2])
    w = None
    if m[2, 0] != 0.0 or m[2, 1] != 0.0 or m[2, 2] != 1.0:
        w = m[2, 0] * cols + (m[2, 1] * rows + m[2, 2])
        out_x /= w
        out_y /= w
    return (out_x, out_y, w) if with_w else (out_x, out_y)
