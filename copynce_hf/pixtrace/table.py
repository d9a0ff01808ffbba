"""Coordinate tables: for every pixel of an edited image, where in the source it came from.

Paper, section "PixTrace Pipeline": a table T maps each pixel (m, n) of an edited image
to the coordinate of the source pixel it was copied from; every edit updates it with a
coordinate function f (T <- f(T)); reversing a table swaps keys and values (T^-1).

Conventions
-----------
* ``coords[row, col] = (y, x)``: source position of the pixel's centre, pixel centres at
  integer coordinates, ``NaN`` where the pixel came from nowhere (overlay, padding,
  background, erased area).
* Homography matrices act on homogeneous column vectors ``(x, y, 1)`` of pixel centres,
  the order PIL uses, and always map *output* pixels to *input* positions ("backward").

Exact and fast
--------------
Every geometric edit of the catalogue (crop, resize, flips, rotation, affine,
perspective, skew, padding, pasting) is a projective map of the plane. A table built
from such edits is therefore kept *analytically*: one 3x3 matrix from this image to the
source, the half-planes outside which a pixel fell off some intermediate image, and the
masks of occluding edits with the matrix that brings this image's pixels to that stage.
Nothing is warped at full resolution; ``coords`` is materialised once, at this image's
size, when first asked for. The inverse of such a table is analytic too, and so dense:
inverting a table that downscales does not leave three pixels in four empty, which a
pixel-scatter inverse would (the trap described in the package's PixTrace issue).

Tables made by an arbitrary coordinate function (:meth:`CoordinateTable.apply`) are
dense; their :meth:`inverse` follows the paper's supplement ("Reverse Operation of
Table"): scatter row by row, the later pixel overwriting the earlier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import TableError

__all__ = ["CoordinateTable"]

_EPS = 1e-9


@dataclass(frozen=True)
class _StageMask:
    """A boolean mask over an intermediate image, and the map from the table's pixels to it.

    ``matrix`` (3, 3) maps this table's pixel ``(x, y, 1)`` to the stage's pixel;
    ``keep`` (H_k, W_k) is True where the stage's pixel still carries source content.
    """

    matrix: np.ndarray
    keep: np.ndarray


class CoordinateTable:
    """Dense map from the pixels of an image (H, W) to positions in a source image.

    Build one with :meth:`identity`, update it with the edits of
    :mod:`copynce_hf.pixtrace.edits` (or :meth:`warp`, :meth:`occlude`, :meth:`apply`),
    combine tables with :meth:`inverse` and :meth:`compose`.

    Attributes:
        coords: float32 array (H, W, 2) of source positions ``(y, x)``, NaN where untraced.
        source_size: ``(H_src, W_src)`` of the source image.
        size: ``(H, W)`` of the image the table describes.
    """

    def __init__(self, coords: np.ndarray, source_size: tuple[int, int]):
        coords = np.asarray(coords, dtype=np.float32)
        if coords.ndim != 3 or coords.shape[2] != 2:
            raise TableError(f"coords must have shape (H, W, 2), got {coords.shape}")
        self._coords: np.ndarray | None = coords
        self._valid: np.ndarray | None = None
        self.size = (int(coords.shape[0]), int(coords.shape[1]))
        self.source_size = _check_size(source_size, "source_size")
        self._matrix: np.ndarray | None = None
        self._halfplanes = np.zeros((0, 3))
        self._masks: tuple[_StageMask, ...] = ()
        self._mapped_cache = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def identity(cls, height: int, width: int) -> CoordinateTable:
        """The table of an unedited image: every pixel maps to itself."""
        size = _check_size((height, width), "size")
        return cls._analytic(np.eye(3), size, size, np.zeros((0, 3)), ())

    @classmethod
    def _analytic(cls, matrix, size, source_size, halfplanes, masks) -> CoordinateTable:
        table = cls.__new__(cls)
        table._coords = None
        table._valid = None
        table.size = size
        table.source_size = source_size
        table._matrix = _normalise(np.asarray(matrix, dtype=np.float64))
        table._halfplanes = _drop_redundant(np.asarray(halfplanes, dtype=np.float64).reshape(-1, 3), size)
        table._masks = tuple(masks)
        table._mapped_cache = None
        return table

    @property
    def matrix(self) -> np.ndarray | None:
        """(3, 3) projective map from this image's pixel ``(x, y, 1)`` to the source, or None if dense.

        Valid only where :attr:`valid` is True; read-only.
        """
        if self._matrix is None:
            return None
        view = self._matrix.view()
        view.flags.writeable = False
        return view

    @property
    def is_analytic(self) -> bool:
        """True while the table is a projective map with masks (every catalogue edit keeps it so)."""
        return self._matrix is not None

    # ------------------------------------------------------------------ read access
    @property
    def coords(self) -> np.ndarray:
        """float32 (H, W, 2): source ``(y, x)`` of every pixel, NaN where untraced."""
        if self._coords is None:
            x, y = self._mapped()
            coords = np.stack([y, x], axis=-1)
            coords[~self.valid] = np.nan
            self._coords = coords
        return self._coords

    @property
    def valid(self) -> np.ndarray:
        """bool (H, W): True where the pixel is traced to the source."""
        if self._valid is None:
            if self._matrix is None:
                self._valid = ~np.isnan(self._coords[..., 0])
            else:
                self._valid = self._analytic_valid()
        return self._valid

    def positions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(y, x, valid)``, each (H, W): source positions and the traced mask.

        Where ``valid`` is False the positions are meaningless (NaN for dense tables, the
        unmasked projective map for analytic ones). Cheaper than :attr:`coords`, which
        stacks and masks them.
        """
        if self._matrix is None:
            return self._coords[..., 0], self._coords[..., 1], self.valid
        x, y = self._mapped()
        return y, x, self.valid

    def _mapped(self) -> tuple[np.ndarray, np.ndarray]:
        """Analytic tables: source (x, y) of every pixel, validity not applied; cached."""
        if self._mapped_cache is None:
            self._mapped_cache = _apply_matrix(self._matrix, self.size)
        return self._mapped_cache

    @property
    def traced_fraction(self) -> float:
        """Fraction of this image's pixels that are traced to the source."""
        return float(self.valid.mean())

    def lookup(self, rows, cols) -> np.ndarray:
        """Source ``(y, x)`` of the pixels at integer ``rows`` and ``cols`` (broadcast), shape (..., 2).

        Out-of-image pixels raise :class:`TableError`; untraced pixels give NaN.
        """
        rows = np.asarray(rows)
        cols = np.asarray(cols)
        height, width = self.size
        if np.any((rows < 0) | (rows >= height) | (cols < 0) | (cols >= width)):
            raise TableError(f"lookup outside the table of size {self.size}")
        return self.coords[rows, cols]

    # ------------------------------------------------------------------ updates (the paper's F(T))
    def warp(self, matrix: np.ndarray, output_size: tuple[int, int]) -> CoordinateTable:
        """Table of an image made from this one by a projective resampling.

        Args:
            matrix: (3, 3) backward map from output pixel ``(x, y, 1)`` to the position in
                this image that output pixel samples.
            output_size: ``(H_out, W_out)``.

        Output pixels that sample outside this image become untraced; traced ones take
        the source position of the sampled point (exactly, not rounded to a pixel).
        """
        output_size = _check_size(output_size, "output_size")
        matrix = _normalise(np.asarray(matrix, dtype=np.float64))
        if self._matrix is None:
            x, y = _apply_matrix(matrix, output_size)
            return self.remap(np.stack([y, x], axis=-1))
        # This image's bounds and the earlier half-planes, pulled back to the new pixels
        # (a line maps to a line under a homography; w > 0 is kept as its own half-plane).
        planes = np.concatenate([self._halfplanes, _bounds_halfplanes(self.size)]) @ matrix
        planes = np.concatenate([planes, matrix[2:3]])
        masks = [_StageMask(m.matrix @ matrix, m.keep) for m in self._masks]
        return CoordinateTable._analytic(self._matrix @ matrix, output_size, self.source_size, planes, masks)

    def resize(self, height: int, width: int) -> CoordinateTable:
        """Table of this image resized to ``(height, width)`` (e.g. the model input size)."""
        return self.warp(_resize_matrix(self.size, (height, width)), (height, width))

    def occlude(self, covered: np.ndarray) -> CoordinateTable:
        """Mark the pixels where ``covered`` (bool, shape (H, W)) is True as untraced."""
        covered = np.asarray(covered, dtype=bool)
        if covered.shape != self.size:
            raise TableError(f"occlusion mask of shape {covered.shape} does not match table size {self.size}")
        if self._matrix is None:
            coords = self.coords.copy()
            coords[covered] = np.nan
            return CoordinateTable(coords, self.source_size)
        masks = list(self._masks) + [_StageMask(np.eye(3), ~covered)]
        return CoordinateTable._analytic(self._matrix, self.size, self.source_size, self._halfplanes, masks)

    def remap(self, positions: np.ndarray) -> CoordinateTable:
        """Table of an image whose pixel p samples this image at ``positions[p]`` (y, x).

        The general (dense) pull-back for warps that are not projective: ``positions``
        is (H_out, W_out, 2) in this image's pixel coordinates, NaN for "nowhere". Each
        output pixel takes the source position of the nearest pixel of this image.
        """
        positions = np.asarray(positions, dtype=np.float32)
        rows, cols, inside = _nearest_pixel(positions[..., 0], positions[..., 1], self.size)
        coords = self.coords[rows, cols]
        coords[~inside] = np.nan
        return CoordinateTable(coords, self.source_size)

    def apply(self, function: Callable[[np.ndarray], np.ndarray]) -> CoordinateTable:
        """Update by a coordinate function, the paper's F(T): ``function(coords) -> coords``.

        ``function`` receives the (H, W, 2) float32 array and returns a new (H', W', 2)
        array of source positions (NaN allowed). The result is a dense table.
        """
        new = np.asarray(function(self.coords.copy()), dtype=np.float32)
        return CoordinateTable(new, self.source_size)

    def with_source_size(self, height: int, width: int) -> CoordinateTable:
        """The same table with source positions expressed in a source frame resized to (height, width)."""
        new_size = _check_size((height, width), "source size")
        to_new = np.linalg.inv(_resize_matrix(self.source_size, new_size))
        if self._matrix is not None:
            return CoordinateTable._analytic(to_new @ self._matrix, self.size, new_size, self._halfplanes, self._masks)
        coords = self.coords
        scaled = np.stack(
            [coords[..., 0] * to_new[1, 1] + to_new[1, 2], coords[..., 1] * to_new[0, 0] + to_new[0, 2]], axis=-1
        )
        return CoordinateTable(scaled, new_size)

    def source_pixels_per_pixel(self) -> float:
        """Median largest stretch of the map: source pixels per pixel of this image along the
        direction where the map stretches most (the Jacobian's largest singular value)."""
        coords = self.coords.astype(np.float64)
        dy = np.diff(coords, axis=0)[:, :-1]  # d(source)/d(row)
        dx = np.diff(coords, axis=1)[:-1, :]  # d(source)/d(col)
        squares = (dy**2).sum(-1) + (dx**2).sum(-1)
        det = dy[..., 0] * dx[..., 1] - dy[..., 1] * dx[..., 0]
        largest = np.sqrt(0.5 * (squares + np.sqrt(np.maximum(squares**2 - 4 * det**2, 0.0))))
        largest = largest[np.isfinite(largest)]
        return float(np.median(largest)) if largest.size else 1.0

    # ------------------------------------------------------------------ algebra
    def inverse(self) -> CoordinateTable:
        """Table from the source's pixels back to this image's pixels (size = ``source_size``).

        Analytic tables invert exactly: a source pixel maps to the position in this image
        that shows it, if that pixel is traced. Dense tables follow the paper's reverse
        operation: each traced pixel writes its own position at the rounded source pixel,
        row by row, so where several pixels land on one source pixel the last one wins.
        """
        if self._matrix is not None:
            matrix = _normalise(np.linalg.inv(self._matrix))
            planes = np.concatenate([_bounds_halfplanes(self.size) @ matrix, matrix[2:3]])
            masks = [_StageMask(matrix, self.valid)]
            return CoordinateTable._analytic(matrix, self.source_size, self.size, planes, masks)
        return self._scatter_inverse()

    def compose(self, other: CoordinateTable) -> CoordinateTable:
        """For this table A -> O and ``other`` O -> B, the table A -> B.

        ``other.size`` must be this table's ``source_size``. The query-to-reference
        table of two copies of one original is ``t_qo.compose(t_ro.inverse())``.
        """
        if other.size != self.source_size:
            raise TableError(
                f"cannot compose: this table's source is {self.source_size} but the other table "
                f"describes an image of size {other.size}"
            )
        if self._matrix is not None and other._matrix is not None:
            first = self._matrix
            planes = np.concatenate(
                [
                    self._halfplanes,
                    np.concatenate([_bounds_halfplanes(other.size), other._halfplanes]) @ first,
                    first[2:3],
                ]
            )
            masks = list(self._masks) + [_StageMask(m.matrix @ first, m.keep) for m in other._masks]
            return CoordinateTable._analytic(other._matrix @ first, self.size, other.source_size, planes, masks)
        coords = self.coords
        rows, cols, inside = _nearest_pixel(coords[..., 0], coords[..., 1], other.size)
        out = other.coords[rows, cols]
        out[~inside] = np.nan
        return CoordinateTable(out, other.source_size)

    def _scatter_inverse(self) -> CoordinateTable:
        coords = self.coords
        rows, cols, inside = _nearest_pixel(coords[..., 0], coords[..., 1], self.source_size)
        flat_target = (rows * self.source_size[1] + cols)[inside]  # row-major order of this image
        own_rows, own_cols = np.nonzero(inside)
        # Keep the last writer of every target: unique over the reversed order keeps first hits.
        reversed_target = flat_target[::-1]
        unique_target, first_in_reversed = np.unique(reversed_target, return_index=True)
        last = len(flat_target) - 1 - first_in_reversed
        out = np.full((self.source_size[0] * self.source_size[1], 2), np.nan, dtype=np.float32)
        out[unique_target, 0] = own_rows[last]
        out[unique_target, 1] = own_cols[last]
        return CoordinateTable(out.reshape(self.source_size + (2,)), self.size)

    # ------------------------------------------------------------------ internals
    def _analytic_valid(self) -> np.ndarray:
        valid = _halfplane_mask(self._halfplanes, self.size)
        for mask in self._masks:
            if not valid.any():
                break
            if mask.keep.shape == self.size and np.array_equal(mask.matrix, np.eye(3)):
                valid &= mask.keep
                continue
            if np.array_equal(mask.matrix, self._matrix):
                x, y = self._mapped()  # the stage is the source frame: reuse the coordinates
            else:
                x, y = _apply_matrix(mask.matrix, self.size)
            rows, cols, inside = _nearest_pixel(y, x, mask.keep.shape)
            valid &= inside & mask.keep[rows, cols]
        return valid

    def __repr__(self) -> str:
        kind = "analytic" if self.is_analytic else "dense"
        return f"CoordinateTable(size={self.size}, source_size={self.source_size}, {kind})"


# ---------------------------------------------------------------------- helpers


def _check_size(size, name: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in size)
    except (TypeError, ValueError) as error:
        raise TableError(f"{name} must be (height, width), got {size!r}") from error
    if height <= 0 or width <= 0:
        raise TableError(f"{name} must be positive, got {size!r}")
    return height, width


def _normalise(matrix: np.ndarray) -> np.ndarray:
    if matrix.shape != (3, 3) or not np.all(np.isfinite(matrix)):
        raise TableError(f"a projective map must be a finite 3x3 matrix, got {matrix!r}")
    scale = matrix[2, 2] if abs(matrix[2, 2]) > _EPS else np.abs(matrix).max()
    return matrix / scale


def _resize_matrix(old_size, new_size) -> np.ndarray:
    """Backward map of a resize: output pixel centre -> input position (area-aligned)."""
    sy = old_size[0] / new_size[0]
    sx = old_size[1] / new_size[1]
    return np.array([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5], [0.0, 0.0, 1.0]])


def _bounds_halfplanes(size) -> np.ndarray:
    """Half-planes (4, 3) of the pixel area [-0.5, W - 0.5] x [-0.5, H - 0.5]: a*x + b*y + c >= 0."""
    height, width = size
    return np.array(
        [
            [1.0, 0.0, 0.5],
            [-1.0, 0.0, width - 0.5],
            [0.0, 1.0, 0.5],
            [0.0, -1.0, height - 0.5],
        ]
    )


def _apply_matrix(matrix: np.ndarray, size, with_w: bool = False):
    """Apply a (3, 3) map to every pixel centre of an image of ``size``; returns x, y (H, W) float32.

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


def _drop_redundant(planes: np.ndarray, size) -> np.ndarray:
    """The half-planes that cut the pixel area of an image of ``size``.

    A half-plane holding at the four corners of the area [-0.5, W - 0.5] x [-0.5, H - 0.5]
    holds on all of it (convexity), so it excludes no pixel of this image; and a later
    image only reaches this one through pixels inside its area (each warp adds the bounds
    of the image it samples). Dropping it keeps chains of edits from piling up tests.
    """
    if len(planes) == 0:
        return planes
    height, width = size
    corners = np.array([[-0.5, -0.5, 1.0], [width - 0.5, -0.5, 1.0], [-0.5, height - 0.5, 1.0],
                        [width - 0.5, height - 0.5, 1.0]])
    holds_everywhere = (planes @ corners.T >= 0).all(axis=1)
    return planes[~holds_everywhere]


def _halfplane_mask(planes: np.ndarray, size) -> np.ndarray:
    """bool (H, W): pixel centres satisfying every half-plane ``a*x + b*y + c >= 0``.

    Per row the half-planes cut an interval of x, so the mask costs two comparisons per
    pixel whatever the number of half-planes.
    """
    height, width = size
    cols = np.arange(width, dtype=np.float64)
    if len(planes) == 0:
        return np.ones(size, dtype=bool)
    rows = np.arange(height, dtype=np.float64)
    a = planes[:, 0:1]
    offset = planes[:, 1:2] * rows + planes[:, 2:3]  # (K, H)
    flat = np.abs(a[:, 0]) <= _EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = -offset / a
    low = np.max(np.where(a > _EPS, bound, -np.inf), axis=0, initial=-np.inf)
    high = np.min(np.where(a < -_EPS, bound, np.inf), axis=0, initial=np.inf)
    if flat.any():
        row_ok = np.all(offset[flat] >= -_EPS, axis=0)
        high = np.where(row_ok, high, -np.inf)
    return (cols >= low[:, None] - 1e-7) & (cols <= high[:, None] + 1e-7)


def _nearest_pixel(y: np.ndarray, x: np.ndarray, size):
    """Nearest pixel of an image of ``size`` to positions (y, x); returns rows, cols, inside.

    Rows and cols are clipped into the image so they can index it; ``inside`` is False
    for NaN positions and positions off the pixel area [-0.5, size - 0.5).
    """
    height, width = size
    with np.errstate(invalid="ignore"):
        inside = (y >= -0.5) & (y < height - 0.5) & (x >= -0.5) & (x < width - 0.5)
        # Clipped into [0, size - 1] (fmax/fmin send NaN to the bound), truncation of
        # v + 0.5 is then the nearest pixel.
        half = np.float32(0.5)
        rows = np.fmin(np.fmax(y + half, np.float32(0)), np.float32(height - 1)).astype(np.intp)
        cols = np.fmin(np.fmax(x + half, np.float32(0)), np.float32(width - 1)).astype(np.intp)
    return rows, cols, inside
