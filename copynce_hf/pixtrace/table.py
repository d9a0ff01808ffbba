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
size, when first asked for; so is the traced mask, row by row (the half-planes leave one
span of columns per row). The inverse of such a table is analytic too, and so dense:
inverting a table that downscales does not leave three pixels in four empty, which a
pixel-scatter inverse would.

Tables made by an arbitrary coordinate function (:meth:`CoordinateTable.apply`) are
dense; their :meth:`inverse` follows the paper's supplement ("Reverse Operation of
Table"): scatter row by row, the later pixel overwriting the earlier.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..modeling.errors import TableError
from .projective import apply_matrix, resize_matrix

__all__ = ["CoordinateTable"]

_EPS = 1e-9
#: Analytic tables prune their half-planes that cut nothing once they hold more than this many.
_KEEP_PLANES = 32


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
        self._spans: tuple[np.ndarray, np.ndarray] | None = None
        self._fully: bool | None = None
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
        return cls._analytic(np.eye(3), size, size, _NO_PLANES, (), check=False)

    @classmethod
    def _analytic(cls, matrix, size, source_size, halfplanes, masks, check: bool = True) -> CoordinateTable:
        """An analytic table. ``matrix`` (3, 3) float64 is normalised here (validated if ``check``);
        ``halfplanes`` (K, 3) float64 lose those that cut nothing of an image of ``size`` once there
        are more than ``_KEEP_PLANES`` of them (keeping a few such planes changes no pixel)."""
        table = cls.__new__(cls)
        table._coords = None
        table._valid = None
        table._spans = None
        table._fully = None
        table.size = size
        table.source_size = source_size
        table._matrix = _normalise(matrix, check)
        # Pruning the half-planes that cut nothing costs more per edit than carrying a few of them.
        table._halfplanes = halfplanes if len(halfplanes) <= _KEEP_PLANES else _drop_redundant(halfplanes, size)
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
            self._mapped_cache = apply_matrix(self._matrix, self.size)
        return self._mapped_cache

    @property
    def fully_traced(self) -> bool:
        """True when every pixel is traced (cached); for analytic tables without occlusion masks
        this is read off the half-planes' per-row spans, without building :attr:`valid`."""
        if self._fully is None:
            if self._valid is None and self._matrix is not None and not self._masks:
                if _clearly_hold(self._halfplanes, self.size):
                    self._fully = True
                else:
                    start, stop = self._plane_spans()
                    self._fully = bool((start == 0).all() and (stop == self.size[1]).all())
            else:
                self._fully = bool(self.valid.all())
        return self._fully

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
            x, y = apply_matrix(matrix, output_size)
            return self.remap(np.stack([y, x], axis=-1))
        # This image's bounds and the earlier half-planes, pulled back to the new pixels
        # (a line maps to a line under a homography; w > 0 is kept as its own half-plane,
        # needed only when the map is projective: an affine map has w = 1).
        planes = np.concatenate((self._halfplanes, _bounds_halfplanes(self.size))) @ matrix
        if matrix[2, 0] != 0.0 or matrix[2, 1] != 0.0:
            planes = np.concatenate((planes, matrix[2:3]))
        masks = [_StageMask(m.matrix @ matrix, m.keep) for m in self._masks]
        return CoordinateTable._analytic(
            self._matrix @ matrix, output_size, self.source_size, planes, masks, check=False
        )

    def resize(self, height: int, width: int) -> CoordinateTable:
        """Table of this image resized to ``(height, width)`` (e.g. the model input size)."""
        return self.warp(resize_matrix(self.size, (height, width)), (height, width))

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
        to_new = np.linalg.inv(resize_matrix(self.source_size, new_size))
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
    def _plane_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """Analytic tables: per row, the columns [start, stop) inside every half-plane (masks not
        applied); int64 (H,) each, cached."""
        if self._spans is None:
            self._spans = _halfplane_spans(self._halfplanes, self.size)
        return self._spans

    def _analytic_valid(self) -> np.ndarray:
        if len(self._halfplanes):
            valid = _spans_mask(*self._plane_spans(), self.size[1])
        else:
            valid = np.ones(self.size, dtype=bool)
        for mask in self._masks:
            if not valid.any():
                break
            if mask.keep.shape == self.size and np.array_equal(mask.matrix, np.eye(3)):
                valid &= mask.keep
                continue
            if np.array_equal(mask.matrix, self._matrix):
                x, y = self._mapped()  # the stage is the source frame: reuse the coordinates
            else:
                x, y = apply_matrix(mask.matrix, self.size)
            rows, cols, inside = _nearest_pixel(y, x, mask.keep.shape)
            valid &= inside & mask.keep[rows, cols]
        return valid

    def __repr__(self) -> str:
        kind = "analytic" if self.is_analytic else "dense"
        return f"CoordinateTable(size={self.size}, source_size={self.source_size}, {kind})"


# ---------------------------------------------------------------------- helpers


def _check_size(size, name: str) -> tuple[int, int]:
    if type(size) is tuple and len(size) == 2 and type(size[0]) is int and type(size[1]) is int:
        if size[0] > 0 and size[1] > 0:  # the common case, without conversions
            return size
    try:
        height, width = (int(v) for v in size)
    except (TypeError, ValueError) as error:
        raise TableError(f"{name} must be (height, width), got {size!r}") from error
    if height <= 0 or width <= 0:
        raise TableError(f"{name} must be positive, got {size!r}")
    return height, width


def _normalise(matrix: np.ndarray, check: bool = True) -> np.ndarray:
    """(3, 3) float64 map scaled to ``matrix[2, 2] == 1`` (or its largest entry to 1 when that is ~0).

    The scale is positive where ``matrix[2, 2] > 0``, so the w > 0 side is kept. ``check``
    refuses non-finite or non-3x3 input (maps given by callers; products of checked maps skip it).
    """
    if check and (matrix.shape != (3, 3) or not np.logical_and.reduce(np.isfinite(matrix), axis=None)):
        raise TableError(f"a projective map must be a finite 3x3 matrix, got {matrix!r}")
    scale = float(matrix[2, 2])
    if abs(scale) <= _EPS:
        scale = float(np.abs(matrix).max())
    return matrix if scale == 1.0 else matrix / scale


_NO_PLANES = np.zeros((0, 3))
_NO_PLANES.setflags(write=False)


@functools.lru_cache(maxsize=256)
def _bounds_halfplanes(size) -> np.ndarray:
    """Half-planes (4, 3) of the pixel area [-0.5, W - 0.5] x [-0.5, H - 0.5]: a*x + b*y + c >= 0.

    Cached per size (a chain of edits asks for the same few sizes); read-only.
    """
    height, width = size
    planes = np.array(
        [
            [1.0, 0.0, 0.5],
            [-1.0, 0.0, width - 0.5],
            [0.0, 1.0, 0.5],
            [0.0, -1.0, height - 0.5],
        ]
    )
    planes.setflags(write=False)
    return planes


@functools.lru_cache(maxsize=256)
def _area_corners(size) -> np.ndarray:
    """(3, 4): homogeneous corners ``(x, y, 1)`` of the pixel area of an image of ``size``, as columns."""
    height, width = size
    corners = np.array([[-0.5, width - 0.5, -0.5, width - 0.5], [-0.5, -0.5, height - 0.5, height - 0.5],
                        [1.0, 1.0, 1.0, 1.0]])
    corners.setflags(write=False)
    return corners


def _drop_redundant(planes: np.ndarray, size) -> np.ndarray:
    """The half-planes that cut the pixel area of an image of ``size``.

    A half-plane holding at the four corners of the area [-0.5, W - 0.5] x [-0.5, H - 0.5]
    holds on all of it (convexity), so it excludes no pixel of this image; and a later
    image only reaches this one through pixels inside its area (each warp adds the bounds
    of the image it samples). Dropping it keeps chains of edits from piling up tests.
    """
    if len(planes) == 0:
        return planes
    holds_everywhere = np.logical_and.reduce(planes @ _area_corners(size) >= 0, axis=1)
    return planes[~holds_everywhere]


def _clearly_hold(planes: np.ndarray, size) -> bool:
    """True if every half-plane holds, with a margin, at the four corner pixel centres (and so,
    being linear, at every pixel centre): no pixel is cut. False does not mean one is."""
    if len(planes) == 0:
        return True
    height, width = size
    values = planes @ _centre_corners(size)  # (K, 4)
    return bool(values.min() > 1e-6 + 1e-9 * (height + width))


@functools.lru_cache(maxsize=256)
def _centre_corners(size) -> np.ndarray:
    """(3, 4): homogeneous corner pixel centres ``(x, y, 1)`` of an image of ``size``, as columns."""
    height, width = size
    corners = np.array([[0.0, width - 1.0, 0.0, width - 1.0], [0.0, 0.0, height - 1.0, height - 1.0],
                        [1.0, 1.0, 1.0, 1.0]])
    corners.setflags(write=False)
    return corners


def _halfplane_spans(planes: np.ndarray, size) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the columns whose pixel centres satisfy every half-plane ``a*x + b*y + c >= 0``.

    Per row the half-planes cut an interval of x (tolerance 1e-7 pixel). Returns int64
    ``(start, stop)``, each (H,), clipped to [0, W]:
    the row's columns ``start <= col < stop`` (``stop <= start`` for a row that has none).
    """
    height, width = size
    start = np.zeros(height, dtype=np.int64)
    stop = np.full(height, width, dtype=np.int64)
    if len(planes) == 0:
        return start, stop
    a = planes[:, 0]
    rising, falling = a > _EPS, a < -_EPS  # x >= bound, x <= bound
    offset = planes[:, 1:2] * _float_rows(height) + planes[:, 2:3]  # (K, H): b*y + c
    if not np.isfinite(offset).all():
        raise TableError("the half-planes of an analytic table are not finite (a degenerate map)")
    if rising.any():  # bound: the x where a*x + b*y + c = 0
        low = np.ceil((offset[rising] / -planes[rising, 0:1]).max(axis=0) - 1e-7)
        start[:] = np.minimum(np.maximum(low, 0, out=low), width, out=low)
    if falling.any():
        high = np.floor((offset[falling] / -planes[falling, 0:1]).min(axis=0) + 1e-7) + 1
        stop[:] = np.minimum(np.maximum(high, 0, out=high), width, out=high)
    flat = ~(rising | falling)
    if flat.any():  # rows where a plane with a ~ 0 fails everywhere: b*y + c < 0
        stop[(offset[flat] < -_EPS).any(axis=0)] = 0
    return start, stop


@functools.lru_cache(maxsize=64)
def _float_rows(height: int) -> np.ndarray:
    """float64 (H,): 0, 1, ..., H - 1 (cached, read-only)."""
    rows = np.arange(height, dtype=np.float64)
    rows.setflags(write=False)
    return rows


@functools.lru_cache(maxsize=64)
def _run_pattern(height: int) -> np.ndarray:
    """bool (3 H,): False, True, False repeated (cached, read-only)."""
    pattern = np.tile(np.array([False, True, False]), height)
    pattern.setflags(write=False)
    return pattern


def _spans_mask(start: np.ndarray, stop: np.ndarray, width: int) -> np.ndarray:
    """bool (H, W): True at columns ``start[r] <= col < stop[r]`` of every row r.

    Built as runs (False * start, True * length, False * rest) per row with one ``np.repeat``.
    """
    runs = np.empty((len(start), 3), dtype=np.int64)
    runs[:, 0] = start
    np.subtract(stop, start, out=runs[:, 1])
    np.maximum(runs[:, 1], 0, out=runs[:, 1])
    np.subtract(width - start, runs[:, 1], out=runs[:, 2])
    return np.repeat(_run_pattern(len(start)), runs.ravel()).reshape(len(start), width)


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
