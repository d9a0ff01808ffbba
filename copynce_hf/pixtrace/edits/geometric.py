"""Geometric traced edits: the image is resampled, the table follows the same map exactly.

Paper, section "PixTrace Pipeline": a geometric edit moves pixels, so the coordinate
table is updated by the edit's coordinate function f (T <- f(T)). Every edit here is a
chain of projective maps of the plane (crop, resize, flip, rotation, affine, perspective,
skew, padding, pasting into a canvas), so each one is described by its *stages*: for
every intermediate image, a 3x3 backward matrix from that image's pixel centres to the
previous image's positions, and the intermediate image's size. The table is updated by
:meth:`CoordinateTable.warp` once per stage, which keeps it analytic (cheap) and marks
exactly the pixels that fell off an intermediate image as untraced (the rest of a canvas,
padding, the black border of a rotation).

Conventions
-----------
* Positions are ``(x, y)`` = (column, row) with pixel *centres* at integer coordinates
  (the table's convention); ``(0, 0)`` is the centre of the top-left pixel.
* Pillow's :meth:`PIL.Image.Image.transform` coefficients use pixel-*area* coordinates
  (centre of the top-left pixel at (0.5, 0.5)). A backward map ``A`` in area coordinates
  is ``M = S^-1 A S`` in centre coordinates, with ``S`` the shift by +0.5.
* Pillow's ``resize`` is area-aligned: output centre ``x`` samples input centre
  ``(x + 0.5) * W_in / W_out - 0.5``.
* Pillow's 8-bit ``transform`` truncates interpolated values (half a grey level darker per
  warp, adding up along a chain); warps here interpolate float channels and round once.

Pixel work uses AugLy's functional API where AugLy has the operation and its geometry can
be read from its source (flips, resize, scale, skew, pad, change of aspect ratio, overlay
onto a background image or a screenshot); elsewhere Pillow is called directly with the
matrix the table uses (rotation, affine, perspective, meme format: AugLy's
``perspective_transform`` fails with numpy 2 and ``meme_format`` with Pillow 10+; its
``skew`` matrix is kept but resampled without Pillow's truncation, see below).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ...modeling.errors import EditParameterError
from ..projective import area_to_centre, centre_to_area, homography, resize_matrix, translation_matrix
from ..table import CoordinateTable
from .base import Edit, check_range, register_edit
from .params import RESAMPLE, color_param, float_param, image_spec_param, int_param, resample_param, set_field
from .sources import image_size, resolve_image

__all__ = [
    "Canvas",
    "GeometricEdit",
    "Crop",
    "Resize",
    "Scale",
    "RandomResizedCrop",
    "HorizontalFlip",
    "VerticalFlip",
    "Rotate",
    "Affine",
    "Perspective",
    "WARP_FORMS",
    "torchvision_affine_coefficients",
    "torchvision_perspective_coefficients",
    "Skew",
    "Pad",
    "ChangeAspectRatio",
    "PasteOnCanvas",
    "OverlayOntoBackground",
    "OverlayOntoScreenshot",
    "MemeFormat",
]


#: ``Image.transform`` supports only these three.
_TRANSFORM_RESAMPLE = ("nearest", "bilinear", "bicubic")

#: (3, 3) backward map and the (height, width) of the image it produces.
Stage = tuple[np.ndarray, tuple[int, int]]


# ---------------------------------------------------------------------------- resampling


def _pil_transform(
    image: Image.Image, matrix: np.ndarray, size: tuple[int, int], resample: str, fill: tuple[int, int, int],
    pillow_8bit: bool = False, data: tuple[float, ...] | None = None,
) -> Image.Image:
    """Resample ``image`` with the backward centre-coordinate ``matrix`` into an image of (H, W) ``size``.

    Pillow's ``transform`` truncates interpolated 8-bit values, which darkens every warp by
    half a grey level on average, and a chain of warps by as many half levels. Interpolating
    float channels and rounding once avoids that; nearest neighbour needs no rounding.
    ``pillow_8bit`` uses Pillow's 8-bit ``transform`` as it is (torchvision's path for PIL images, the
    CopyNCE authors'), with Pillow's coefficients ``data`` when given (else those of ``matrix``).
    """
    area = centre_to_area(matrix)
    area = area / area[2, 2]
    height, width = size
    if abs(area[2, 0]) < 1e-15 and abs(area[2, 1]) < 1e-15:
        method, coefficients = Image.Transform.AFFINE, tuple(area[:2].ravel())
    else:
        method, coefficients = Image.Transform.PERSPECTIVE, tuple(area.ravel()[:8])
    data = coefficients if data is None else tuple(data)
    if pillow_8bit:
        method = Image.Transform.AFFINE if len(data) == 6 else Image.Transform.PERSPECTIVE
        return image.transform((width, height), method, data, resample=RESAMPLE[resample], fillcolor=tuple(fill))
    if resample == "nearest":
        return image.transform((width, height), method, data, resample=RESAMPLE[resample], fillcolor=fill)
    pixels = np.asarray(image)
    channels = [
        np.asarray(
            Image.fromarray(pixels[..., c].astype(np.float32), "F").transform(
                (width, height), method, data, resample=RESAMPLE[resample], fillcolor=float(fill[c])
            )
        )
        for c in range(3)
    ]
    out = np.clip(np.rint(np.stack(channels, axis=-1)), 0, 255).astype(np.uint8)
    return Image.fromarray(out, "RGB")


# ---------------------------------------------------------------------------- parameter checks


def _augly():
    """AugLy's functional image API, imported on first use (it takes about half a second)."""
    import augly.image.functional as augly_functional

    return augly_functional


# ---------------------------------------------------------------------------- base


@dataclasses.dataclass(frozen=True)
class Canvas:
    """What a geometric stage's output shows where it samples outside its input.

    Either a flat RGB ``color``, or the image ``image`` (an image spec or a PIL image) resized to
    ``image_size`` (H, W; None: its own size), with the stage's input blended over it with ``opacity``.
    """

    color: tuple[int, int, int] | None = None
    image: Any = None
    image_size: tuple[int, int] | None = None
    opacity: float = 1.0


@dataclasses.dataclass(frozen=True)
class GeometricEdit(Edit):
    """An edit that moves pixels: its table update is a chain of projective stages.

    Subclasses implement :meth:`stages` (the geometry, from the input size alone) and
    :meth:`render` (the pixel work). :meth:`trace` updates a table without touching pixels,
    e.g. to time or precompute tables.
    """

    kind: ClassVar[str] = "geometric"

    def stages(self, size: tuple[int, int]) -> list[Stage]:
        """Backward maps ``(matrix (3, 3), (H_k, W_k))`` of the intermediate images, in order.

        ``matrix`` maps pixel centres ``(x, y, 1)`` of image k to positions in image k-1
        (image 0 being the input of size ``size`` = (H, W)). Raises
        :class:`EditParameterError` when the parameters do not fit this input size.
        """
        raise NotImplementedError

    def render(self, image: Image.Image) -> Image.Image:
        """The pixel work: the edited RGB image (of the size of the last stage)."""
        raise NotImplementedError

    def canvases(self, stages: list[Stage]) -> list[Canvas | None] | None:
        """Per stage of ``stages`` (this edit's :meth:`stages` for the input at hand), the :class:`Canvas`
        its output shows outside its input (None: the stage never samples outside it).

        Renderers that resample a run of geometric edits in one pass (:mod:`copynce_hf.pixtrace.fused`)
        composite these canvases; None (the default) says the edit has no such form and is rendered by
        :meth:`render` alone.
        """
        return None

    def trace(self, table: CoordinateTable, stages: list[Stage] | None = None) -> CoordinateTable:
        """The edited image's table, from the input image's ``table`` (no pixel work); ``stages`` are
        this edit's :meth:`stages` for the table's size when the caller already has them."""
        for matrix, size in self.stages(table.size) if stages is None else stages:
            table = table.warp(matrix, size)
        return table

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """(H, W) of the edited image for an input of (H, W) ``size``."""
        return self.stages(size)[-1][1]

    def apply(self, image: Image.Image, table: CoordinateTable) -> tuple[Image.Image, CoordinateTable]:
        new_table = self.trace(table)  # validates the parameters against the size first
        edited = self.render(image)
        if edited.mode != "RGB":
            edited = edited.convert("RGB")
        return edited, new_table


def _check_box(edit: str, box: tuple[int, int, int, int], size: tuple[int, int]) -> None:
    left, top, right, bottom = box
    height, width = size
    if right > width or bottom > height:
        raise EditParameterError(
            f"{edit}: box (left={left}, top={top}, right={right}, bottom={bottom}) lies outside "
            f"the {height}x{width} (HxW) image"
        )


def _box_params(edit: Edit, name: str) -> None:
    left = int_param(name, "left", edit.left, 0)
    top = int_param(name, "top", edit.top, 0)
    right = int_param(name, "right", edit.right)
    bottom = int_param(name, "bottom", edit.bottom)
    if right <= left or bottom <= top:
        raise EditParameterError(
            f"{name}: box (left={left}, top={top}, right={right}, bottom={bottom}) has zero area "
            "(need right > left and bottom > top)"
        )
    for key, value in (("left", left), ("top", top), ("right", right), ("bottom", bottom)):
        set_field(edit, key, value)


# ---------------------------------------------------------------------------- crop and resize


@register_edit
@dataclasses.dataclass(frozen=True)
class Crop(GeometricEdit):
    """Keep the pixel box ``[left, right) x [top, bottom)`` (Pillow's box convention, in pixels).

    The box must lie inside the image; that is checked when the edit is applied.
    :meth:`from_fractions` builds the box from AugLy's fractional ``x1, y1, x2, y2``.
    """

    left: int
    top: int
    right: int
    bottom: int
    name: ClassVar[str] = "crop"

    def __post_init__(self):
        _box_params(self, self.name)

    @classmethod
    def from_fractions(cls, x1: float, y1: float, x2: float, y2: float, size: tuple[int, int]) -> Crop:
        """The crop AugLy's ``crop(x1, y1, x2, y2)`` makes of an image of (H, W) ``size``."""
        for key, value in (("x1", x1), ("y1", y1), ("x2", x2), ("y2", y2)):
            check_range(cls.name, key, value, 0.0, 1.0)
        height, width = size
        return cls(int(width * x1), int(height * y1), int(width * x2), int(height * y2))

    def stages(self, size):
        _check_box(self.name, (self.left, self.top, self.right, self.bottom), size)
        return [(translation_matrix(self.left, self.top), (self.bottom - self.top, self.right - self.left))]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        return image.crop((self.left, self.top, self.right, self.bottom))


@register_edit
@dataclasses.dataclass(frozen=True)
class Resize(GeometricEdit):
    """Resize to ``height`` x ``width`` pixels (AugLy ``resize``; area-aligned, anti-aliased)."""

    height: int
    width: int
    resample: str = "bilinear"
    name: ClassVar[str] = "resize"

    def __post_init__(self):
        set_field(self, "height", int_param(self.name, "height", self.height, 1))
        set_field(self, "width", int_param(self.name, "width", self.width, 1))
        resample_param(self.name, self.resample)

    def stages(self, size):
        new = (self.height, self.width)
        return [(resize_matrix(size, new), new)]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        return _augly().resize(image, width=self.width, height=self.height, resample=RESAMPLE[self.resample])


@register_edit
@dataclasses.dataclass(frozen=True)
class Scale(GeometricEdit):
    """AugLy ``scale``: both sides multiplied by ``factor`` and truncated to integers.

    ``resample`` None follows AugLy: Lanczos when shrinking, bilinear when enlarging.
    """

    factor: float
    resample: str | None = None
    name: ClassVar[str] = "scale"

    def __post_init__(self):
        set_field(self, "factor", float_param(self.name, "factor", self.factor))
        if not 0.0 < self.factor <= 16.0:
            raise EditParameterError(f"{self.name}: parameter factor={self.factor!r} outside (0, 16]")
        if self.resample is not None:
            resample_param(self.name, self.resample)

    def stages(self, size):
        height, width = size
        new = (int(height * self.factor), int(width * self.factor))
        if min(new) < 1:
            raise EditParameterError(
                f"{self.name}: factor={self.factor} scales the {height}x{width} image to nothing"
            )
        return [(resize_matrix(size, new), new)]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        resample = None if self.resample is None else RESAMPLE[self.resample]
        return _augly().scale(image, factor=self.factor, interpolation=resample)


@register_edit
@dataclasses.dataclass(frozen=True)
class RandomResizedCrop(GeometricEdit):
    """Crop the box ``[left, right) x [top, bottom)`` and resize it to ``height`` x ``width``.

    The explicit form of torchvision's ``RandomResizedCrop``: the box is drawn elsewhere
    (see :meth:`draw`) and stored, so the edit replays exactly. ``form="box"`` (the package's) resamples in
    one pass from the whole image (Pillow ``resize`` with a box: the filter reads the pixels around the box);
    ``form="crop"`` crops first and resizes the crop (torchvision's ``resized_crop`` on a PIL image, as the
    authors run it: the filter stops at the crop's border). Same geometry either way.
    """

    left: int
    top: int
    right: int
    bottom: int
    height: int
    width: int
    resample: str = "bilinear"
    form: str = "box"
    name: ClassVar[str] = "random_resized_crop"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("form",)

    def __post_init__(self):
        _box_params(self, self.name)
        set_field(self, "height", int_param(self.name, "height", self.height, 1))
        set_field(self, "width", int_param(self.name, "width", self.width, 1))
        resample_param(self.name, self.resample)
        if self.form not in ("box", "crop"):
            raise EditParameterError(f"{self.name}: parameter form={self.form!r} must be 'box' or 'crop'")

    @classmethod
    def draw(
        cls,
        rng: np.random.Generator,
        size: tuple[int, int],
        output_size: tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        resample: str = "bilinear",
        form: str = "box",
    ) -> RandomResizedCrop:
        """Draw a box as torchvision's ``RandomResizedCrop``: area fraction in ``scale``,
        aspect ratio (w / h) log-uniform in ``ratio``, ten tries, then a central crop."""
        height, width = size
        area = height * width
        log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(scale[0], scale[1])
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return cls(left, top, left + w, top + h, output_size[0], output_size[1], resample, form)
        in_ratio = width / height
        if in_ratio < min(ratio):
            w, h = width, int(round(width / min(ratio)))
        elif in_ratio > max(ratio):
            h, w = height, int(round(height * max(ratio)))
        else:
            w, h = width, height
        top, left = (height - h) // 2, (width - w) // 2
        return cls(left, top, left + w, top + h, output_size[0], output_size[1], resample, form)

    def stages(self, size):
        _check_box(self.name, (self.left, self.top, self.right, self.bottom), size)
        box_size = (self.bottom - self.top, self.right - self.left)
        new = (self.height, self.width)
        return [(translation_matrix(self.left, self.top) @ resize_matrix(box_size, new), new)]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        box = (self.left, self.top, self.right, self.bottom)
        if self.form == "crop":
            return image.crop(box).resize((self.width, self.height), RESAMPLE[self.resample])
        return image.resize((self.width, self.height), RESAMPLE[self.resample], box=box)


@register_edit
@dataclasses.dataclass(frozen=True)
class ChangeAspectRatio(GeometricEdit):
    """AugLy ``change_aspect_ratio``: same area, width / height = ``ratio`` (sides truncated)."""

    ratio: float
    name: ClassVar[str] = "change_aspect_ratio"

    def __post_init__(self):
        set_field(self, "ratio", float_param(self.name, "ratio", self.ratio))
        if not 0.01 <= self.ratio <= 100.0:
            raise EditParameterError(f"{self.name}: parameter ratio={self.ratio!r} outside [0.01, 100]")

    def stages(self, size):
        height, width = size
        area = width * height
        new_width = int(math.sqrt(self.ratio * area))  # AugLy's rounding
        if new_width < 1 or int(area / new_width) < 1:
            raise EditParameterError(
                f"{self.name}: ratio={self.ratio} leaves nothing of a {height}x{width} image"
            )
        new = (int(area / new_width), new_width)
        return [(resize_matrix(size, new), new)]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        return _augly().change_aspect_ratio(image, ratio=self.ratio)


# ---------------------------------------------------------------------------- flips, rotation, warps


@register_edit
@dataclasses.dataclass(frozen=True)
class HorizontalFlip(GeometricEdit):
    """Mirror left-right (AugLy ``hflip``): column x shows column W - 1 - x."""

    name: ClassVar[str] = "hflip"

    def stages(self, size):
        width = size[1]
        return [(np.array([[-1.0, 0.0, width - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), size)]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        return _augly().hflip(image)


@register_edit
@dataclasses.dataclass(frozen=True)
class VerticalFlip(GeometricEdit):
    """Mirror top-bottom (AugLy ``vflip``): row y shows row H - 1 - y."""

    name: ClassVar[str] = "vflip"

    def stages(self, size):
        height = size[0]
        return [(np.array([[1.0, 0.0, 0.0], [0.0, -1.0, height - 1.0], [0.0, 0.0, 1.0]]), size)]

    def canvases(self, stages):
        return [None] * len(stages)

    def render(self, image):
        return _augly().vflip(image)


@register_edit
@dataclasses.dataclass(frozen=True)
class Rotate(GeometricEdit):
    """Rotate by ``degrees`` counter-clockwise about the image centre (Pillow's convention).

    ``expand`` False keeps the input size (the corners are lost); True grows the canvas to
    hold the whole rotated image, with Pillow's ``rotate(expand=True)`` size. The uncovered
    canvas is filled with ``fill`` and untraced. ``crop_to_content`` reproduces AugLy's
    ``rotate``: the expanded rotation cropped to the largest axis-aligned rectangle inside
    the rotated image (AugLy's own rounding; ``expand`` is then irrelevant). AugLy
    resamples with nearest neighbour; this edit uses ``resample`` (bilinear by default).
    """

    degrees: float
    expand: bool = False
    fill: tuple[int, int, int] = (0, 0, 0)
    resample: str = "bilinear"
    crop_to_content: bool = False
    name: ClassVar[str] = "rotate"

    def __post_init__(self):
        set_field(self, "degrees", float_param(self.name, "degrees", self.degrees))
        set_field(self, "fill", color_param(self.name, "fill", self.fill))
        resample_param(self.name, self.resample, _TRANSFORM_RESAMPLE)
        for key in ("expand", "crop_to_content"):
            if not isinstance(getattr(self, key), bool):
                raise EditParameterError(
                    f"{self.name}: parameter {key}={getattr(self, key)!r} must be a bool"
                )

    def _rotation(self, size) -> Stage:
        height, width = size
        theta = math.radians(self.degrees % 360.0)
        cos, sin = round(math.cos(theta), 15), round(math.sin(theta), 15)
        if self.expand or self.crop_to_content:
            # Pillow's expanded size: the rotated corners' extent around the area centre (W/2, H/2).
            half_w = round((abs(width * cos) + abs(height * sin)) / 2, 9)
            half_h = round((abs(width * sin) + abs(height * cos)) / 2, 9)
            new_w = math.ceil(width / 2 + half_w) - math.floor(width / 2 - half_w)
            new_h = math.ceil(height / 2 + half_h) - math.floor(height / 2 - half_h)
        else:
            new_h, new_w = height, width
        # Backward map in area coordinates: about the output centre, rotate by -degrees on
        # screen (y points down), then move to the input centre:
        # T(W/2, H/2) R T(-W'/2, -H'/2), written out in pixel-centre coordinates (S^-1 A S).
        dx, dy = 0.5 - new_w / 2, 0.5 - new_h / 2
        matrix = np.array(
            [
                [cos, -sin, cos * dx - sin * dy + width / 2 - 0.5],
                [sin, cos, sin * dx + cos * dy + height / 2 - 0.5],
                [0.0, 0.0, 1.0],
            ]
        )
        return matrix, (new_h, new_w)

    def _content_box(self, size, rotated_size) -> tuple[int, int, int, int]:
        from augly.image.utils import rotated_rect_with_max_area

        height, width = size
        centre_x, centre_y = rotated_size[1] / 2, rotated_size[0] / 2
        box_w, box_h = rotated_rect_with_max_area(width, height, self.degrees)
        box = (
            int(centre_x - box_w / 2),
            int(centre_y - box_h / 2),
            int(centre_x + box_w / 2),
            int(centre_y + box_h / 2),
        )
        if box[2] <= box[0] or box[3] <= box[1]:
            raise EditParameterError(f"{self.name}: degrees={self.degrees} leaves no content rectangle")
        return box

    def stages(self, size):
        rotation = self._rotation(size)
        if not self.crop_to_content:
            return [rotation]
        left, top, right, bottom = self._content_box(size, rotation[1])
        return [rotation, (translation_matrix(left, top), (bottom - top, right - left))]

    def canvases(self, stages):
        return [Canvas(color=self.fill)] + [None] * (len(stages) - 1)

    def render(self, image):
        matrix, size = self._rotation((image.height, image.width))
        rotated = _pil_transform(image, matrix, size, self.resample, self.fill)
        if self.crop_to_content:
            rotated = rotated.crop(self._content_box((image.height, image.width), size))
        return rotated


def _to_dict_without_exact_form(self) -> dict:
    """``Edit.to_dict`` without ``form`` when it is ``"exact"`` (lists recorded before the torchvision form stay
    the same)."""
    description = GeometricEdit.to_dict(self)
    if description["params"].get("form") == "exact":
        del description["params"]["form"]
    return description


@register_edit
@dataclasses.dataclass(frozen=True)
class Affine(GeometricEdit):
    """Affine map about the image centre, with torchvision's ``RandomAffine`` parameters.

    Forward map ``p -> c + t + R(angle) S(scale) Sh_y(shear_y) Sh_x(shear_x) (p - c)`` with
    ``c`` the image centre, ``angle`` in degrees clockwise on screen, ``translate`` (tx, ty)
    in pixels, ``shear`` (x, y) in degrees (torchvision's decomposition). The output keeps
    the input size; uncovered pixels get ``fill`` and are untraced. ``form="torchvision"`` (the
    CopyNCE authors') renders with Pillow's 8-bit ``transform`` as torchvision does on PIL images
    (interpolated values truncated: about 0.4 grey levels darker than ``"exact"``, the default).
    """

    angle: float = 0.0
    translate: tuple[float, float] = (0.0, 0.0)
    scale: float = 1.0
    shear: tuple[float, float] = (0.0, 0.0)
    fill: tuple[int, int, int] = (0, 0, 0)
    resample: str = "bilinear"
    form: str = "exact"
    name: ClassVar[str] = "affine"

    def __post_init__(self):
        set_field(self, "angle", float_param(self.name, "angle", self.angle))
        set_field(self, "scale", float_param(self.name, "scale", self.scale))
        if not 0.01 <= self.scale <= 100.0:
            raise EditParameterError(f"{self.name}: parameter scale={self.scale!r} outside [0.01, 100]")
        for key in ("translate", "shear"):
            value = getattr(self, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = (value, 0.0)  # a single shear angle is the x shear, as in torchvision
            try:
                pair = tuple(float_param(self.name, key, v) for v in value)
            except TypeError:
                pair = ()
            if len(pair) != 2:
                raise EditParameterError(f"{self.name}: parameter {key}={value!r} must be a pair of numbers")
            set_field(self, key, pair)
        for value in self.shear:
            if not -80.0 <= value <= 80.0:
                raise EditParameterError(
                    f"{self.name}: parameter shear={self.shear!r} outside [-80, 80] degrees"
                )
        set_field(self, "fill", color_param(self.name, "fill", self.fill))
        resample_param(self.name, self.resample, _TRANSFORM_RESAMPLE)
        _form_param(self.name, self.form)

    to_dict = _to_dict_without_exact_form

    def forward_matrix(self, size) -> np.ndarray:
        """(3, 3) forward map in pixel-centre coordinates (input position -> output position)."""
        return np.array(self._forward(size) + ((0.0, 0.0, 1.0),))

    def _forward(self, size) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """The first two rows of :meth:`forward_matrix`, as Python floats."""
        height, width = size
        a = math.radians(self.angle)
        sx, sy = (math.radians(v) for v in self.shear)
        # R(a) S(s) Sh_y(sy) Sh_x(sx), expanded so that its determinant is exactly s^2.
        scale, cos_sy = self.scale, math.cos(sy)
        l00 = scale * math.cos(a - sy) / cos_sy
        l01 = scale * (-math.cos(a - sy) * math.tan(sx) / cos_sy - math.sin(a))
        l10 = scale * math.sin(a - sy) / cos_sy
        l11 = scale * (-math.sin(a - sy) * math.tan(sx) / cos_sy + math.cos(a))
        cx, cy = (width - 1) / 2, (height - 1) / 2
        tx = cx + self.translate[0] - (l00 * cx + l01 * cy)
        ty = cy + self.translate[1] - (l10 * cx + l11 * cy)
        return (l00, l01, tx), (l10, l11, ty)

    def stages(self, size):
        # The inverse of the forward map, written out: [L^-1, -L^-1 t].
        (l00, l01, tx), (l10, l11, ty) = self._forward(size)
        det = l00 * l11 - l01 * l10
        i00, i01, i10, i11 = l11 / det, -l01 / det, -l10 / det, l00 / det
        backward = np.array(
            [[i00, i01, -(i00 * tx + i01 * ty)], [i10, i11, -(i10 * tx + i11 * ty)], [0.0, 0.0, 1.0]]
        )
        return [(backward, size)]

    def canvases(self, stages):
        return [Canvas(color=self.fill)]

    def render(self, image):
        size = (image.height, image.width)
        data = torchvision_affine_coefficients(self, size) if self.form == "torchvision" else None
        return _pil_transform(image, self.stages(size)[0][0], size, self.resample, self.fill,
                              pillow_8bit=self.form == "torchvision", data=data)


def _quad_param(edit: str, key: str, value: Any) -> tuple[tuple[float, float], ...]:
    try:
        points = tuple(tuple(float_param(edit, key, c) for c in point) for point in value)
    except TypeError:
        points = ()
    if len(points) != 4 or any(len(p) != 2 for p in points):
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be four (x, y) points")
    corners = np.array(points)
    # A usable quadrilateral is convex and non-degenerate: the cross products of
    # consecutive edges all have one strict sign.
    edges = np.roll(corners, -1, axis=0) - corners
    cross = edges[:, 0] * np.roll(edges, -1, axis=0)[:, 1] - edges[:, 1] * np.roll(edges, -1, axis=0)[:, 0]
    if not (np.all(cross > 1e-6) or np.all(cross < -1e-6)):
        raise EditParameterError(f"{edit}: parameter {key}={value!r} is not a convex quadrilateral")
    return points


@register_edit
@dataclasses.dataclass(frozen=True)
class Perspective(GeometricEdit):
    """Projective warp sending ``startpoints`` to ``endpoints``, like torchvision's ``perspective``.

    Points are four ``(x, y)`` corners (top-left, top-right, bottom-right, bottom-left) in
    pixel-centre coordinates: the unmoved corners of a W x H image are (0, 0), (W - 1, 0),
    (W - 1, H - 1), (0, H - 1). The output keeps the input size; uncovered pixels get
    ``fill`` and are untraced. Implemented with Pillow (AugLy's ``perspective_transform``
    fails with numpy 2); :meth:`augly_like` draws AugLy's corner displacement.

    ``form="torchvision"`` (the CopyNCE authors', torchvision's ``perspective`` on PIL images): the points
    are Pillow's pixel-area coordinates (the corner (0, 0) is the first pixel's top-left corner, not its
    centre), the map's coefficients are solved by least squares and kept in float32, and the image is
    rendered by Pillow's 8-bit ``transform`` with them; the table follows that map.
    """

    startpoints: tuple[tuple[float, float], ...]
    endpoints: tuple[tuple[float, float], ...]
    fill: tuple[int, int, int] = (0, 0, 0)
    resample: str = "bilinear"
    form: str = "exact"
    name: ClassVar[str] = "perspective"

    def __post_init__(self):
        start = _quad_param(self.name, "startpoints", self.startpoints)
        end = _quad_param(self.name, "endpoints", self.endpoints)
        _form_param(self.name, self.form)
        try:
            if self.form == "torchvision":
                coefficients = torchvision_perspective_coefficients(start, end)
                set_field(self, "_coefficients", coefficients)
                backward = area_to_centre(np.append(np.asarray(coefficients, dtype=np.float64), 1.0).reshape(3, 3))
            else:
                backward = homography(np.array(end), np.array(start))
        except np.linalg.LinAlgError as error:
            raise EditParameterError(f"{self.name}: startpoints/endpoints give a singular map") from error
        backward.setflags(write=False)
        set_field(self, "startpoints", start)
        set_field(self, "endpoints", end)
        # The backward map depends on the points only: kept from the validation above (not a field).
        set_field(self, "_backward", backward)
        set_field(self, "fill", color_param(self.name, "fill", self.fill))
        resample_param(self.name, self.resample, _TRANSFORM_RESAMPLE)

    @classmethod
    def augly_like(
        cls, size: tuple[int, int], sigma: float, seed: int, dx: float = 0.0, dy: float = 0.0, **kwargs
    ) -> Perspective:
        """AugLy ``perspective_transform``'s draw: every corner moved by N(0, sigma) + (dx, dy)."""
        height, width = size
        rng = np.random.RandomState(seed)
        start = [(0.0, 0.0), (width - 1.0, 0.0), (width - 1.0, height - 1.0), (0.0, height - 1.0)]
        end = [(float(rng.normal(x, sigma) + dx), float(rng.normal(y, sigma) + dy)) for x, y in start]
        return cls(tuple(start), tuple(end), **kwargs)

    def stages(self, size):
        matrix = self._backward
        height, width = size
        h0, h1, h2 = matrix[2].tolist()
        # w > 0 at the four corners of the output's pixel area (and so on all of it).
        for x, y in ((-0.5, -0.5), (width - 0.5, -0.5), (-0.5, height - 0.5), (width - 0.5, height - 0.5)):
            if h0 * x + h1 * y + h2 <= 1e-9:
                raise EditParameterError(
                    f"{self.name}: the map sends part of the {height}x{width} output beyond the horizon"
                )
        return [(matrix, size)]

    def canvases(self, stages):
        return [Canvas(color=self.fill)]

    to_dict = _to_dict_without_exact_form

    def render(self, image):
        size = (image.height, image.width)
        if self.form == "torchvision":
            return _pil_transform(image, self.stages(size)[0][0], size, self.resample, self.fill, pillow_8bit=True,
                                  data=self._coefficients)
        return _pil_transform(image, self.stages(size)[0][0], size, self.resample, self.fill)


#: Forms of :class:`Affine` and :class:`Perspective`: the package's exact rendering and torchvision's (the authors').
WARP_FORMS = ("exact", "torchvision")


def _form_param(edit: str, form: str) -> None:
    if form not in WARP_FORMS:
        raise EditParameterError(f"{edit}: parameter form={form!r} must be one of {list(WARP_FORMS)}")


def torchvision_affine_coefficients(edit: Affine, size: tuple[int, int]) -> tuple[float, ...]:
    """Pillow's six output -> input coefficients of ``edit`` on an image of (H, W) ``size``, computed as torchvision
    computes them for a PIL image (``_get_inverse_affine_matrix`` about the centre (W / 2, H / 2) of Pillow's area
    coordinates, term by term): the same map as :meth:`Affine.stages`, with torchvision's floating-point rounding,
    which decides some pixels of a warp by a right angle (where the exact map lands on pixel centres)."""
    height, width = size
    rotation, shear_x, shear_y = (math.radians(value) for value in (edit.angle, *edit.shear))
    centre_x, centre_y = width * 0.5, height * 0.5
    shift_x, shift_y = edit.translate
    a = math.cos(rotation - shear_y) / math.cos(shear_y)
    b = -math.cos(rotation - shear_y) * math.tan(shear_x) / math.cos(shear_y) - math.sin(rotation)
    c = math.sin(rotation - shear_y) / math.cos(shear_y)
    d = -math.sin(rotation - shear_y) * math.tan(shear_x) / math.cos(shear_y) + math.cos(rotation)
    matrix = [value / edit.scale for value in (d, -b, 0.0, -c, a, 0.0)]
    matrix[2] += matrix[0] * (-centre_x - shift_x) + matrix[1] * (-centre_y - shift_y)
    matrix[5] += matrix[3] * (-centre_x - shift_x) + matrix[4] * (-centre_y - shift_y)
    matrix[2] += centre_x
    matrix[5] += centre_y
    return tuple(matrix)


def torchvision_perspective_coefficients(startpoints, endpoints) -> tuple[float, ...]:
    """Pillow's 8 perspective coefficients (pixel-area coordinates) sending each end point to its start point,
    solved as torchvision 0.16 (the authors' pin) solves them for PIL images: the 8 x 8 system in float32 by
    LAPACK's QR least squares (``torch.linalg.lstsq``, driver ``gels``). A float64 or SVD solution differs in the
    last bits of float32 now and then, enough for a border pixel of the warp to take the fill or the image."""
    import torch

    system = torch.zeros(2 * len(startpoints), 8, dtype=torch.float32)
    for row, ((end_x, end_y), (start_x, start_y)) in enumerate(zip(endpoints, startpoints)):
        system[2 * row] = torch.tensor([end_x, end_y, 1, 0, 0, 0, -start_x * end_x, -start_x * end_y])
        system[2 * row + 1] = torch.tensor([0, 0, 0, end_x, end_y, 1, -start_y * end_x, -start_y * end_y])
    targets = torch.tensor(startpoints, dtype=torch.float32).view(-1)
    return tuple(float(value) for value in torch.linalg.lstsq(system, targets, driver="gels").solution.tolist())


@register_edit
@dataclasses.dataclass(frozen=True)
class Skew(GeometricEdit):
    """AugLy ``skew``: shear by ``skew_factor`` along x (``axis`` 0) or y (``axis`` 1) about the centre line.

    AugLy's affine data in pixel-area coordinates: axis 0 samples
    ``x_in = x + skew_factor * (y - H / 2)``, axis 1 ``y_in = y + skew_factor * (x - W / 2)``.
    Uncovered pixels are black and untraced. Same matrix and filter as AugLy, without the
    half-level darkening of Pillow's 8-bit ``transform``.
    """

    skew_factor: float
    axis: int = 0
    name: ClassVar[str] = "skew"

    def __post_init__(self):
        set_field(self, "skew_factor", float_param(self.name, "skew_factor", self.skew_factor))
        if abs(self.skew_factor) > 10.0:
            raise EditParameterError(
                f"{self.name}: parameter skew_factor={self.skew_factor!r} outside [-10, 10]"
            )
        if self.axis not in (0, 1) or isinstance(self.axis, bool):
            raise EditParameterError(f"{self.name}: parameter axis={self.axis!r} must be 0 (x) or 1 (y)")

    def stages(self, size):
        height, width = size
        area = np.eye(3)
        if self.axis == 0:
            area[0, 1], area[0, 2] = self.skew_factor, -self.skew_factor * height / 2
        else:
            area[1, 0], area[1, 2] = self.skew_factor, -self.skew_factor * width / 2
        return [(area_to_centre(area), size)]

    def canvases(self, stages):
        return [Canvas(color=(0, 0, 0))]

    def render(self, image):
        # AugLy's skew is Pillow's 8-bit bilinear ``transform`` with this matrix; resampled
        # here without its truncation (see ``_pil_transform``), black outside.
        size = (image.height, image.width)
        return _pil_transform(image, self.stages(size)[0][0], size, "bilinear", (0, 0, 0))


# ---------------------------------------------------------------------------- canvases


@register_edit
@dataclasses.dataclass(frozen=True)
class Pad(GeometricEdit):
    """AugLy ``pad``: ``int(w_factor * W)`` columns left and right, ``int(h_factor * H)`` rows above and below;
    with ``rounding="round"``, ``round(w_factor * W)`` and ``round(h_factor * H)`` (the CopyNCE authors'
    ``RandomPadding``, Python's ``round``)."""

    w_factor: float = 0.25
    h_factor: float = 0.25
    color: tuple[int, int, int] = (0, 0, 0)
    rounding: str = "floor"
    name: ClassVar[str] = "pad"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("rounding",)

    def __post_init__(self):
        for key in ("w_factor", "h_factor"):
            set_field(self, key, float_param(self.name, key, getattr(self, key)))
            check_range(self.name, key, getattr(self, key), 0.0, 10.0)
        set_field(self, "color", color_param(self.name, "color", self.color))
        if self.rounding not in ("floor", "round"):
            raise EditParameterError(f"{self.name}: parameter rounding={self.rounding!r} must be 'floor' or 'round'")

    def margins(self, size: tuple[int, int]) -> tuple[int, int]:
        """(columns left and right, rows above and below) for an image of (H, W) ``size``."""
        height, width = size
        side = int if self.rounding == "floor" else round
        return side(self.w_factor * width), side(self.h_factor * height)

    def stages(self, size):
        height, width = size
        left, top = self.margins(size)
        return [(translation_matrix(-left, -top), (height + 2 * top, width + 2 * left))]

    def canvases(self, stages):
        return [Canvas(color=self.color)]

    def render(self, image):
        if self.rounding == "floor":
            return _augly().pad(image, w_factor=self.w_factor, h_factor=self.h_factor, color=self.color)
        left, top = self.margins((image.height, image.width))
        padded = Image.new("RGB", (image.width + 2 * left, image.height + 2 * top), self.color)
        padded.paste(image, (left, top))
        return padded


@register_edit
@dataclasses.dataclass(frozen=True)
class PasteOnCanvas(GeometricEdit):
    """Paste the image, unscaled, with its top-left corner at (``left``, ``top``) of a plain canvas.

    The canvas is ``canvas_height`` x ``canvas_width`` of colour ``color``; parts of the image
    beyond the canvas are cut off. The canvas maps to nowhere.
    """

    canvas_height: int
    canvas_width: int
    left: int = 0
    top: int = 0
    color: tuple[int, int, int] = (0, 0, 0)
    name: ClassVar[str] = "paste_on_canvas"

    def __post_init__(self):
        set_field(self, "canvas_height", int_param(self.name, "canvas_height", self.canvas_height, 1))
        set_field(self, "canvas_width", int_param(self.name, "canvas_width", self.canvas_width, 1))
        set_field(self, "left", int_param(self.name, "left", self.left))
        set_field(self, "top", int_param(self.name, "top", self.top))
        set_field(self, "color", color_param(self.name, "color", self.color))

    def stages(self, size):
        height, width = size
        if (
            self.left >= self.canvas_width
            or self.top >= self.canvas_height
            or self.left + width <= 0
            or self.top + height <= 0
        ):
            raise EditParameterError(
                f"{self.name}: a {height}x{width} image at (left={self.left}, top={self.top}) misses the "
                f"{self.canvas_height}x{self.canvas_width} canvas"
            )
        return [(translation_matrix(-self.left, -self.top), (self.canvas_height, self.canvas_width))]

    def canvases(self, stages):
        return [Canvas(color=self.color)]

    def render(self, image):
        canvas = Image.new("RGB", (self.canvas_width, self.canvas_height), self.color)
        canvas.paste(image, (self.left, self.top))
        return canvas


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayOntoBackground(GeometricEdit):
    """AugLy ``overlay_onto_background_image`` at opacity 1: the image pasted onto ``background``.

    ``background`` is an image spec (see :func:`~copynce_hf.pixtrace.edits.resolve_image`;
    a PIL image also works but is not replayable from ``to_dict``). The input is scaled to
    height ``int(overlay_size * H_bg)`` (aspect kept) and pasted with its top-left corner at
    ``(int(x_pos * W_bg), int(y_pos * H_bg))``, cut at the background's border. With
    ``scale_bg`` the background is first resized to ``floor(W / overlay_size)`` x
    ``floor(H / overlay_size)``. The background maps to nowhere.
    """

    background: Any
    overlay_size: float = 1.0
    x_pos: float = 0.4
    y_pos: float = 0.4
    scale_bg: bool = False
    name: ClassVar[str] = "overlay_onto_background"

    def __post_init__(self):
        set_field(self, "background", image_spec_param(self.name, "background", self.background))
        for key in ("overlay_size", "x_pos", "y_pos"):
            set_field(self, key, float_param(self.name, key, getattr(self, key)))
        check_range(self.name, "overlay_size", self.overlay_size, 1e-3, 1.0)
        check_range(self.name, "x_pos", self.x_pos, 0.0, 1.0)
        check_range(self.name, "y_pos", self.y_pos, 0.0, 1.0)
        if not isinstance(self.scale_bg, bool):
            raise EditParameterError(f"{self.name}: parameter scale_bg={self.scale_bg!r} must be a bool")

    def _stages(self, size, background_size) -> list[Stage]:
        height, width = size
        bg_h, bg_w = background_size
        if self.scale_bg:  # AugLy resizes the background so that overlay_size is respected
            bg_w, bg_h = math.floor(width / self.overlay_size), math.floor(height / self.overlay_size)
        new_h = max(1, int(bg_h * self.overlay_size))
        new_w = int(width * new_h / height)
        if new_w < 1:
            raise EditParameterError(
                f"{self.name}: overlay_size={self.overlay_size} shrinks the image to nothing"
            )
        x, y = int(bg_w * self.x_pos), int(bg_h * self.y_pos)
        return [(resize_matrix(size, (new_h, new_w)), (new_h, new_w)), (translation_matrix(-x, -y), (bg_h, bg_w))]

    def stages(self, size):
        return self._stages(size, image_size(self.background))

    def canvases(self, stages):
        return [None, Canvas(image=self.background)]

    def apply(self, image, table):
        background = resolve_image(self.background)  # resolved once for both table and pixels
        new_table = table
        for matrix, size in self._stages(table.size, (background.height, background.width)):
            new_table = new_table.warp(matrix, size)
        return self._render(image, background), new_table

    def render(self, image):
        return self._render(image, resolve_image(self.background))

    def _render(self, image, background):
        return (
            _augly()
            .overlay_onto_background_image(
                image,
                background_image=background,
                opacity=1.0,
                overlay_size=self.overlay_size,
                x_pos=self.x_pos,
                y_pos=self.y_pos,
                scale_bg=self.scale_bg,
            )
            .convert("RGB")
        )


@functools.cache
def _screenshot_template(template: str) -> tuple[str, tuple[int, int], tuple[int, int, int, int]]:
    """AugLy's bundled screenshot template: (path, (H, W), bbox (left, top, right, bottom))."""
    from augly.utils import BBOXES_PATH, SCREENSHOT_TEMPLATES_DIR

    path = os.path.join(SCREENSHOT_TEMPLATES_DIR, f"{template}.png")
    with open(BBOXES_PATH) as handle:
        bbox = tuple(int(v) for v in json.load(handle)[f"{template}.png"])
    with Image.open(path) as opened:
        size = (opened.height, opened.width)
    return path, size, bbox


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayOntoScreenshot(GeometricEdit):
    """AugLy ``overlay_onto_screenshot`` with its bundled ``template`` ("web" or "mobile").

    The geometry is recomputed from AugLy's template box (its ``bboxes.json``) and rounding:
    the input is scaled to fit the box (or the template scaled to the input, when
    ``resize_src_to_match_template`` is False), then cropped (``crop_src_to_fit``) or shrunk
    to the box, centred on black padding, and pasted at the box. Everything but the
    pasted image content maps to nowhere.
    """

    template: str = "web"
    crop_src_to_fit: bool = False
    resize_src_to_match_template: bool = True
    max_image_size_pixels: int | None = None
    name: ClassVar[str] = "overlay_onto_screenshot"

    def __post_init__(self):
        if self.template not in ("web", "mobile"):
            raise EditParameterError(
                f"{self.name}: parameter template={self.template!r} must be 'web' or 'mobile'"
            )
        for key in ("crop_src_to_fit", "resize_src_to_match_template"):
            if not isinstance(getattr(self, key), bool):
                raise EditParameterError(
                    f"{self.name}: parameter {key}={getattr(self, key)!r} must be a bool"
                )
        if self.max_image_size_pixels is not None:
            set_field(
                self,
                "max_image_size_pixels",
                int_param(self.name, "max_image_size_pixels", self.max_image_size_pixels, 1),
            )

    def stages(self, size):
        height, width = size
        _, (template_h, template_w), (left, top, right, bottom) = _screenshot_template(self.template)
        box_w, box_h = right - left, bottom - top
        stages: list[Stage] = []
        if self.resize_src_to_match_template:  # AugLy ``scale`` by the factor that fits the box
            factor = min(box_w / width, box_h / height)
            new = (int(height * factor), int(width * factor))
            if min(new) < 1:
                raise EditParameterError(f"{self.name}: the {height}x{width} image scales to nothing")
            stages.append((resize_matrix(size, new), new))
            current_h, current_w = new
        else:  # AugLy ``scale_template_image``: the template and its box follow the input
            factor = (min if self.crop_src_to_fit else max)(width / box_w, height / box_h)
            if self.max_image_size_pixels is not None:
                if template_w * template_h * factor**2 > self.max_image_size_pixels:
                    factor = math.sqrt(self.max_image_size_pixels / (template_w * template_h))
            template_w, template_h = int(template_w * factor), int(template_h * factor)
            box_w, box_h = int(box_w * factor), int(box_h * factor)
            left, top = int(left * factor), int(top * factor)
            if min(box_w, box_h) < 1:
                raise EditParameterError(f"{self.name}: max_image_size_pixels leaves no room for the image")
            current_h, current_w = height, width
        # AugLy ``resize_and_pad_to_given_size`` into the box.
        if self.crop_src_to_fit:
            dx, dy = (current_w - box_w) // 2, (current_h - box_h) // 2
            stages.append((translation_matrix(dx, dy), (box_h, box_w)))
            current_h, current_w = box_h, box_w
        elif current_w > box_w or current_h > box_h:
            factor = min(box_w / current_w, box_h / current_h)
            new = (int(current_h * factor), int(current_w * factor))
            if min(new) < 1:
                raise EditParameterError(f"{self.name}: the {height}x{width} image shrinks to nothing")
            stages.append((resize_matrix((current_h, current_w), new), new))
            current_h, current_w = new
        if current_w < box_w or current_h < box_h:
            dx, dy = max(0, (box_w - current_w) // 2), max(0, (box_h - current_h) // 2)
            stages.append((translation_matrix(-dx, -dy), (box_h, box_w)))
        stages.append((translation_matrix(-left, -top), (template_h, template_w)))
        return stages

    def render(self, image):
        from augly.utils import BBOXES_PATH

        path, _, _ = _screenshot_template(self.template)
        return _augly().overlay_onto_screenshot(
            image,
            template_filepath=path,
            template_bboxes_filepath=BBOXES_PATH,
            max_image_size_pixels=self.max_image_size_pixels,
            crop_src_to_fit=self.crop_src_to_fit,
            resize_src_to_match_template=self.resize_src_to_match_template,
        )


@functools.lru_cache(maxsize=64)
def _meme_font(font_file: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(font_file, size)


@register_edit
@dataclasses.dataclass(frozen=True)
class MemeFormat(GeometricEdit):
    """AugLy ``meme_format``'s look: a ``caption_height`` band of ``bg_color`` with centred text above the image.

    Re-implemented with Pillow (AugLy's version fails with Pillow 10+) with AugLy's rules:
    font AugLy's Raleway ExtraBold at ``caption_height - 10`` points, shrunk by 5 until the
    text fits in ``(W - 10) x (caption_height - 10)`` (never below 1 point), text centred in
    the band. The band maps to nowhere; the image below it is unchanged.
    """

    text: str = "LOL"
    caption_height: int = 250
    text_color: tuple[int, int, int] = (0, 0, 0)
    bg_color: tuple[int, int, int] = (255, 255, 255)
    name: ClassVar[str] = "meme_format"

    def __post_init__(self):
        if not isinstance(self.text, str):
            raise EditParameterError(f"{self.name}: parameter text={self.text!r} must be a string")
        set_field(self, "caption_height", int_param(self.name, "caption_height", self.caption_height, 11))
        set_field(self, "text_color", color_param(self.name, "text_color", self.text_color))
        set_field(self, "bg_color", color_param(self.name, "bg_color", self.bg_color))

    def stages(self, size):
        height, width = size
        return [(translation_matrix(0, -self.caption_height), (height + self.caption_height, width))]

    def render(self, image):
        from augly.utils import MEME_DEFAULT_FONT

        width, height = image.size
        # The text is drawn on the band alone, so that it can never spill onto the image.
        band = Image.new("RGB", (width, self.caption_height), self.bg_color)
        draw = ImageDraw.Draw(band)
        font_size = self.caption_height - 10
        while True:
            font = _meme_font(MEME_DEFAULT_FONT, font_size)
            # (right, bottom) of the text box drawn at the origin: what getsize_multiline gave.
            _, _, text_w, text_h = draw.multiline_textbbox((0, 0), self.text, font=font)
            if (text_w <= width - 10 and text_h <= self.caption_height - 10) or font_size <= 5:
                break
            font_size -= 5
        position = (round((width - text_w) / 2), round((self.caption_height - text_h) / 2))
        draw.multiline_text(position, self.text, font=font, fill=self.text_color, align="center")
        meme = Image.new("RGB", (width, height + self.caption_height), self.bg_color)
        meme.paste(band, (0, 0))
        meme.paste(image, (0, self.caption_height))
        return meme
