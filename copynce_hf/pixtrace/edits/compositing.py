"""Edits that blend the copy with another image or draw strokes over it (the authors' crop group and smearing).

The CopyNCE authors' training augmentation (their ``lyakaap`` recipe) pastes the copy, resized to
a box, onto another image with an opacity, pastes another image into a box of the copy with an
opacity, and smears random Bezier strokes over the copy. These three edits describe those
operations with explicit, replayable parameters.

Rule for partly transparent pastes: a pixel counts as copied when the copy's weight in the
blend is at least one half, otherwise it is untraced. The weight is the 8-bit paste level
``floor(255 * opacity + 0.5)`` of the copy (or ``255 -`` that level of the other image), so a
copy pasted at opacity 0.5 or more stays traced and another image pasted over the copy at
opacity below 0.5 leaves the pixels under it traced (the copy dominates them).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageDraw

from ...modeling.errors import EditParameterError
from ..projective import resize_matrix, translation_matrix
from ..table import CoordinateTable
from .base import check_range, register_edit
from .geometric import Canvas, GeometricEdit
from .occluding import (
    COVERED_ALPHA,
    Layer,
    OccludingEdit,
    blend_color,
    check_covered,
    fraction_box,
    opacity_level,
)
from .params import RESAMPLE, color_param, image_spec_param, int_param, resample_param, set_field
from .sources import resolve_image

__all__ = ["LEVEL_ROUNDINGS", "PasteIntoBox", "OverlayImageBox", "Smear", "paste_level"]

#: How a paste's opacity becomes its 8-bit mask level (``level_rounding``): ``"nearest"`` (``floor(255 * opacity +
#: 0.5)``, the package's) or ``"truncate"`` (``int(255 * opacity)``: the authors multiply the 255 alpha band by the
#: opacity and cast it to 8 bits).
LEVEL_ROUNDINGS = ("nearest", "truncate")


def paste_level(opacity: float, rounding: str = "nearest") -> int:
    """The 8-bit mask level of a paste at ``opacity`` (:data:`LEVEL_ROUNDINGS`)."""
    return opacity_level(opacity) if rounding == "nearest" else int(255 * opacity)


def check_level_rounding(edit) -> None:
    if edit.level_rounding not in LEVEL_ROUNDINGS:
        raise EditParameterError(f"{edit.name}: parameter level_rounding={edit.level_rounding!r} must be one of "
                                 f"{list(LEVEL_ROUNDINGS)}")


@register_edit
@dataclasses.dataclass(frozen=True)
class PasteIntoBox(GeometricEdit):
    """The copy resized to a box of another image and pasted there with ``opacity``.

    ``background`` (an image spec) is resized to ``canvas_height`` x ``canvas_width`` (bilinear, or bicubic
    with ``resample="bicubic"``, as the authors' ``OverlayImageOntoTheOther`` resizes both); the copy is
    resized to ``box_height`` x ``box_width`` (its aspect ratio may change) and blended in with
    its top-left corner at (``left``, ``top``): ``out = level * copy + (255 - level) * background``
    (``level = floor(255 * opacity + 0.5)``, over 255; with ``level_rounding="truncate"``, ``int(255 * opacity)``
    as the authors' mask). The background maps to nowhere; the box is traced when the copy's weight is at least
    one half (``level >= 128``), else untraced.
    """

    background: Any
    canvas_height: int
    canvas_width: int
    left: int
    top: int
    box_height: int
    box_width: int
    opacity: float = 1.0
    resample: str = "bilinear"
    level_rounding: str = "nearest"
    name: ClassVar[str] = "paste_into_box"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("level_rounding",)

    def __post_init__(self):
        set_field(self, "background", image_spec_param(self.name, "background", self.background))
        for key in ("canvas_height", "canvas_width", "box_height", "box_width"):
            set_field(self, key, int_param(self.name, key, getattr(self, key), 1))
        for key in ("left", "top"):
            set_field(self, key, int_param(self.name, key, getattr(self, key), 0))
        if self.left + self.box_width > self.canvas_width or self.top + self.box_height > self.canvas_height:
            raise EditParameterError(
                f"{self.name}: box (left={self.left}, top={self.top}, {self.box_height}x{self.box_width}) does not "
                f"fit the {self.canvas_height}x{self.canvas_width} canvas"
            )
        check_range(self.name, "opacity", self.opacity, 0.0, 1.0)
        resample_param(self.name, self.resample)
        check_level_rounding(self)

    def stages(self, size):
        box = (self.box_height, self.box_width)
        return [(resize_matrix(size, box), box), (translation_matrix(-self.left, -self.top), (self.canvas_height, self.canvas_width))]

    def trace(self, table: CoordinateTable, stages=None) -> CoordinateTable:
        new_table = super().trace(table, stages)
        if paste_level(self.opacity, self.level_rounding) < COVERED_ALPHA:  # the copy does not dominate its box
            new_table = new_table.occlude(np.ones(new_table.size, dtype=bool))
        return new_table

    def canvases(self, stages):  # the copy blended over the background at its 8-bit paste level
        background = Canvas(image=self.background, image_size=(self.canvas_height, self.canvas_width),
                            opacity=paste_level(self.opacity, self.level_rounding) / 255.0)
        return [None, background]

    def render(self, image):
        canvas_filter = Image.BICUBIC if self.resample == "bicubic" else Image.BILINEAR
        canvas = resolve_image(self.background).resize((self.canvas_width, self.canvas_height), canvas_filter)
        pasted = image.resize((self.box_width, self.box_height), RESAMPLE[self.resample])
        level = paste_level(self.opacity, self.level_rounding)
        canvas.paste(pasted, (self.left, self.top), mask=Image.new("L", pasted.size, level))
        return canvas


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayImageBox(OccludingEdit):
    """Another image resized to a box of the copy and blended in with ``opacity``.

    The box is ``x, y, width, height`` as fractions of the copy's size (rounded as
    :class:`RandomErasing` rounds its box); the other image fills it (aspect ratio not kept), resized with
    ``resample`` (bilinear by default), first to ``overlay_size`` (H, W) when given (the authors resize every
    other image to the model input first, then to the box: bicubic both). Pixels of the box are covered
    (untraced) when the other image's level ``floor(255 * opacity + 0.5)`` (``level_rounding="truncate"``:
    ``int(255 * opacity)``, the authors' mask) is at least 128, i.e. when the copy's weight is below one half.
    """

    name: ClassVar[str] = "overlay_image_box"
    overlay: Any = dataclasses.field(default_factory=lambda: {"kind": "noise", "seed": 0, "size": [64, 64]})
    x: float = 0.25
    y: float = 0.25
    width: float = 0.5
    height: float = 0.5
    opacity: float = 0.5
    resample: str = "bilinear"
    overlay_size: tuple[int, int] | None = None
    level_rounding: str = "nearest"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("resample", "overlay_size", "level_rounding")

    def __post_init__(self):
        set_field(self, "overlay", image_spec_param(self.name, "overlay", self.overlay))
        resample_param(self.name, self.resample)
        check_level_rounding(self)
        if self.overlay_size is not None:
            set_field(self, "overlay_size", tuple(int_param(self.name, "overlay_size", side, 1)
                                                  for side in self.overlay_size))
        check_range(self.name, "x", self.x, 0.0, 1.0)
        check_range(self.name, "y", self.y, 0.0, 1.0)
        check_range(self.name, "width", self.width, 1e-6, 1.0 - self.x + 1e-9)
        check_range(self.name, "height", self.height, 1e-6, 1.0 - self.y + 1e-9)
        check_range(self.name, "opacity", self.opacity, 0.0, 1.0)

    def coverage(self, height: int, width: int) -> np.ndarray:
        left, top, right, bottom = fraction_box(self.x, self.y, self.width, self.height, height, width)
        coverage = np.zeros((height, width), dtype=np.uint8)
        coverage[top:bottom, left:right] = paste_level(self.opacity, self.level_rounding)
        return coverage

    scaling: ClassVar[str] = "relative"

    def layer(self, size):  # a fused renderer resizes the overlay once, whatever overlay_size and resample say
        left, top, right, bottom = fraction_box(self.x, self.y, self.width, self.height, *size)
        return Layer(self.coverage(*size), source=self.overlay, box=(left, top, right - left, bottom - top))

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        left, top, right, bottom = fraction_box(self.x, self.y, self.width, self.height, image.height, image.width)
        overlay = resolve_image(self.overlay)
        if self.overlay_size is not None:
            overlay = overlay.resize((self.overlay_size[1], self.overlay_size[0]), RESAMPLE[self.resample])
        pasted = overlay.resize((right - left, bottom - top), RESAMPLE[self.resample])
        edited = image.copy()
        level = paste_level(self.opacity, self.level_rounding)
        edited.paste(pasted, (left, top), mask=Image.new("L", pasted.size, level))
        return edited


def bezier_curve(points: np.ndarray, segments: int) -> np.ndarray:
    """float (segments + 1, 2): the Bezier curve of control ``points`` (n, 2), in Bernstein form."""
    n = len(points) - 1
    t = np.linspace(0.0, 1.0, segments + 1)[:, None]
    index = np.arange(n + 1)[None, :]
    coefficients = np.array([math.comb(n, i) for i in range(n + 1)], dtype=np.float64)[None, :]
    basis = coefficients * t**index * (1.0 - t) ** (n - index)
    return basis @ points


@register_edit
@dataclasses.dataclass(frozen=True)
class Smear(OccludingEdit):
    """An opaque stroke along the Bezier curve of control ``points`` (the authors' random smearing).

    Args:
        points: control points ``(x, y)`` as fractions of the image width and height, at least two.
        width: stroke width in pixels (>= 1).
        color: RGB stroke colour.
        segments: line segments approximating the curve (the authors use 500).
        covered: ``"untraced"`` or ``"mapped"`` (:data:`~.occluding.COVERED_FORMS`).

    The stroke is drawn with Pillow's ``ImageDraw.line`` (not anti-aliased), so the pixels it
    paints are exactly its coverage and become untraced (``covered="untraced"``).
    """

    name: ClassVar[str] = "smear"
    points: tuple[tuple[float, float], ...] = ((0.1, 0.1), (0.5, 0.9), (0.9, 0.2))
    width: int = 3
    color: tuple[int, int, int] = (255, 255, 255)
    segments: int = 500
    covered: str = "untraced"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("covered",)

    def __post_init__(self):
        check_covered(self)
        try:
            points = tuple((float(x), float(y)) for x, y in self.points)
        except (TypeError, ValueError) as error:
            raise EditParameterError(f"{self.name}: parameter points={self.points!r} must be (x, y) pairs") from error
        if len(points) < 2:
            raise EditParameterError(f"{self.name}: parameter points={self.points!r} needs at least two points")
        for x, y in points:
            check_range(self.name, "points", x, 0.0, 1.0)
            check_range(self.name, "points", y, 0.0, 1.0)
        set_field(self, "points", points)
        set_field(self, "width", int_param(self.name, "width", self.width, 1))
        set_field(self, "segments", int_param(self.name, "segments", self.segments, 1))
        set_field(self, "color", color_param(self.name, "color", self.color))

    def coverage(self, height: int, width: int) -> np.ndarray:
        # Rounded to 1e-9 px: points drawn on whole pixels (x / W) come back as those whole pixels, not a unit in the
        # last place beside them, which can move the stroke by a pixel where the curve passes a half.
        scaled = np.round(np.array(self.points) * np.array([width, height], dtype=np.float64), 9)
        curve = [tuple(p) for p in bezier_curve(scaled, self.segments).tolist()]
        mask = Image.new("L", (width, height), 0)
        ImageDraw.Draw(mask).line(curve, fill=255, width=self.width)
        return np.asarray(mask)

    scaling: ClassVar[str] = "relative"

    def layer(self, size):
        return Layer(self.coverage(*size), color=self.color)

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        return blend_color(image, self.color, coverage)
