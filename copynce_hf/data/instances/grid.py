"""Photos cut into an ``n x n`` grid of cells, each cell a training instance of its own.

A copy detector learns one identity per training image; a photo cut into cells gives ``n**2`` identities
whose pixels differ. The cells do not overlap; with a ``gap`` a band of pixels between neighbouring
cells is left out, so that no two instances even share a border (a crop of one cell's edge then holds
nothing of its neighbour). A photo whose cells would be smaller than ``min_side`` is refused, naming it.
"""

from __future__ import annotations

from PIL import Image

from ...modeling.errors import MIN_IMAGE_SIDE, ConfigError

__all__ = ["GridCell", "grid_boxes", "grid_cells", "smallest_cell"]

#: One cell: ``(row, column, (left, top, right, bottom))`` in the photo's pixels (right and bottom excluded).
GridCell = tuple[int, int, tuple[int, int, int, int]]


def _bounds(length: int, cells: int, gap: int) -> list[tuple[int, int]]:
    """``cells`` intervals ``[start, end)`` along a side of ``length`` pixels, ``gap`` pixels apart: the
    ``length - (cells - 1) * gap`` pixels left are shared as evenly as rounding allows (sizes differ by <= 1)."""
    usable = length - (cells - 1) * gap
    return [(round(i * usable / cells) + i * gap, round((i + 1) * usable / cells) + i * gap) for i in range(cells)]


def smallest_cell(size: tuple[int, int], cells: int, gap: float = 0.0) -> int:
    """The shortest cell side, in pixels, of a ``cells x cells`` grid with ``gap`` over an image of ``size`` = (W, H)."""
    return min(end - start for length in size for start, end in _bounds(length, cells, round(gap * length)))


def grid_boxes(size: tuple[int, int], cells: int, gap: float = 0.0, min_side: int = 64,
               name: str = "image") -> list[GridCell]:
    """The cells of an ``cells x cells`` grid over an image of ``size`` = (W, H), row by row.

    Args:
        size: the image's (width, height) in pixels.
        cells: cells per side (>= 2).
        gap: the band left out between neighbouring cells, as a fraction of the image's side (0 <= gap <
            0.5): ``round(gap * W)`` pixels between columns, ``round(gap * H)`` between rows.
        min_side: the smallest cell side accepted (>= 16, one ViT patch).
        name: the image's name in errors.

    Returns:
        ``[(row, column, (left, top, right, bottom))]``: with ``gap`` 0 the cells partition the image.

    Raises:
        ConfigError: a bad ``cells``/``gap``/``min_side``, or cells smaller than ``min_side`` (naming
        ``name``, its size and the cell size).
    """
    if not isinstance(cells, int) or cells < 2:
        raise ConfigError(f"grid: cells per side must be an integer >= 2, got {cells!r}")
    if not 0.0 <= gap < 0.5:
        raise ConfigError(f"grid: gap must be a fraction of the side in [0, 0.5), got {gap!r}")
    if min_side < MIN_IMAGE_SIDE:
        raise ConfigError(f"grid: min_side must be at least {MIN_IMAGE_SIDE} pixels, got {min_side}")
    width, height = size
    gaps = (round(gap * width), round(gap * height))
    columns, rows = _bounds(width, cells, gaps[0]), _bounds(height, cells, gaps[1])
    smallest = smallest_cell(size, cells, gap)
    if smallest < min_side:
        raise ConfigError(f"{name} ({width}x{height}) is too small for a {cells}x{cells} grid with gap {gap}: "
                          f"its cells would be {smallest} pixels on a side, below min_side {min_side}")
    return [(row, column, (left, top, right, bottom))
            for row, (top, bottom) in enumerate(rows) for column, (left, right) in enumerate(columns)]


def grid_cells(image: Image.Image, cells: int, gap: float = 0.0, min_side: int = 64,
               name: str = "image") -> list[tuple[GridCell, Image.Image]]:
    """The cells of ``image`` (see :func:`grid_boxes`), each with its pixels as a new PIL image."""
    return [(cell, image.crop(cell[2])) for cell in grid_boxes(image.size, cells, gap, min_side, name)]
