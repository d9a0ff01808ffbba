"""The step vocabulary of copy recipes: one type per random edit, drawn with a seeded generator.

A step says how to draw the explicit edits (:mod:`copynce_hf.pixtrace.edits`) of one kind of copy
edit: the probability ``p`` of applying it (or, inside a choice, its relative weight) and the
ranges its parameters are drawn from. Fields that are pairs are closed ranges ``(low, high)``
drawn uniformly unless said otherwise. Steps look only at the size of the image so far
(:class:`DrawContext`), so that a chain is drawn without any pixel work.

Two choices pick among steps by name: :class:`OneOf` (the authors' one-of groups) and
:class:`SomeOf` (the evaluation queries' families). :class:`~copynce_hf.pixtrace.recipes.CopyRecipe`
arranges steps and choices into a recipe; its presets (training, paper, demo and mini-DISC
queries) are values of these types. A new kind of random edit is one new :class:`Step` subclass
registered with :func:`register_step`.

Sources of the draws: torchvision's ``RandomResizedCrop``, ``RandomAffine``, ``RandomPerspective``,
``ColorJitter`` and ``RandomErasing``; AugLy's overlays; the CopyNCE authors' recipe (snapped
rotations, smearing, albumentations, one-of groups; :meth:`CopyRecipe.paper_descriptor`); the
DISC21-style evaluation queries (paper, supplementary "Evaluation Protocols").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import string
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from ..modeling.errors import ConfigError, EditParameterError
from .edits import (
    ALBUMENTATIONS_OPS,
    COLOR_JITTER_FORMS,
    COVERED_FORMS,
    EMOJI_FORMS,
    ERASED_VALUES,
    SHUFFLE_FORMS,
    WARP_FORMS,
    Affine,
    Albumentation,
    Blur,
    Brightness,
    ChangeAspectRatio,
    ColorJitter,
    Contrast,
    Crop,
    EdgeEnhance,
    Edit,
    Grayscale,
    HorizontalFlip,
    JpegQuality,
    MemeFormat,
    Noise,
    OverlayEmoji,
    OverlayImage,
    OverlayImageBox,
    OverlayOntoBackground,
    OverlayOntoScreenshot,
    OverlayStripes,
    OverlayText,
    Pad,
    PasteIntoBox,
    Perspective,
    Pixelization,
    Posterize,
    RandomErasing,
    RandomResizedCrop,
    Rotate,
    Saturation,
    Sharpen,
    ShufflePixels,
    Skew,
    Smear,
    Solarize,
    VerticalFlip,
    emoji_names,
    font_characters,
    font_names,
    text_ink_box,
)

__all__ = ["STEP_TYPES", "DrawContext", "OneOf", "SomeOf", "Step", "register_step", "snap_angle"]

Range = tuple[float, float]
RGB = tuple[int, int, int]
_SEED_HIGH = 2**31 - 1
#: One pixel at 224 pixels, the authors' model input: a size in pixels at 224 as a fraction of the shorter side.
AT_224 = 1.0 / 224.0
#: How a step's sizes are given (``units``): ``"fraction"`` of the shorter side of the image the edit runs on (the
#: package's: the same edit at any resolution), or ``"pixels"`` of that image (the authors', whose blur radius and
#: smearing width are absolute at the resolution each edit runs at: the original's, or 224 after a crop).
UNITS = ("fraction", "pixels")
#: Forms of the authors' paste steps (``form``): the package's rendering, or the authors' (see each step).
PASTE_FORMS = ("package", "authors")
#: What a step's ``p`` means (``p_means``): ``"apply"`` (the edit applies with probability ``p``) or ``"skip"`` (it
#: is skipped with probability ``p``: the authors' ``RandomOverlayText`` returns the image unchanged when
#: ``random() < p``, so text lands on ``1 - p`` of their copies).
P_MEANINGS = ("apply", "skip")

#: type name -> step or choice class, filled by :func:`register_step`.
STEP_TYPES: dict[str, type] = {}


def register_step(cls: type) -> type:
    """Class decorator: make a step type buildable by its ``type_name`` from a recipe dict."""
    if cls.type_name in STEP_TYPES:
        raise RuntimeError(f"step type {cls.type_name!r} registered twice")
    STEP_TYPES[cls.type_name] = cls
    return cls


# ---------------------------------------------------------------------- drawing context


@dataclasses.dataclass
class DrawContext:
    """What a step may look at while drawing: the generator, the (H, W) size of the image so far,
    the pool of other images and the editor's output size (None: the edited size is kept)."""

    rng: np.random.Generator
    size: tuple[int, int]
    image_pool: tuple[str, ...] = ()
    output_size: tuple[int, int] | None = None

    def uniform(self, bounds: Range) -> float:
        """A float uniform in ``[low, high)``."""
        return float(self.rng.uniform(bounds[0], bounds[1]))

    def signed(self, bounds: Range) -> float:
        """:meth:`uniform` in ``bounds`` with a random sign (the sign drawn first)."""
        return (1.0 if self.rng.random() < 0.5 else -1.0) * self.uniform(bounds)

    def integer(self, bounds: Range) -> int:
        """An int uniform in the closed range."""
        return int(self.rng.integers(int(bounds[0]), int(bounds[1]) + 1))

    def pick(self, options):
        """One of ``options``, uniformly."""
        return options[int(self.rng.integers(len(options)))]

    def color(self) -> RGB:
        """A random RGB colour."""
        return tuple(int(c) for c in self.rng.integers(0, 256, size=3))

    def seed(self) -> int:
        """A seed for an edit's own generator."""
        return int(self.rng.integers(0, _SEED_HIGH))

    def image_spec(self, scale: Range) -> dict[str, Any]:
        """Another image: a file of the pool if there is one, else a procedural image.

        Procedural images get a side drawn as ``scale`` times the current image's side, so
        the edits drawn stay JSON-serialisable and replayable without files.
        """
        if self.image_pool:
            return {"kind": "file", "path": self.image_pool[int(self.rng.integers(len(self.image_pool)))]}
        kind = ("noise", "gradient")[int(self.rng.integers(2))]
        factor = self.uniform(scale)
        height, width = self.size
        size = [max(16, int(round(height * factor))), max(16, int(round(width * factor)))]
        return {"kind": kind, "seed": self.seed(), "size": size}


# ---------------------------------------------------------------------- steps and choices


def check_number(owner: str, key: str, value, low: float, high: float) -> None:
    """Raise :class:`ConfigError` naming ``owner.key`` unless ``value`` is a finite number in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"recipe step {owner}: {key}={value!r} must be a finite number")
    if not low <= value <= high:
        raise ConfigError(f"recipe step {owner}: {key}={value!r} outside [{low}, {high}]")


def _check_range_pair(owner: str, key: str, value) -> None:
    if not (isinstance(value, tuple) and len(value) == 2) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    ):
        raise ConfigError(f"recipe step {owner}: {key}={value!r} must be a range [low, high] of two numbers")
    if value[0] > value[1]:
        raise ConfigError(f"recipe step {owner}: {key}={value!r} has low > high")


def _check_color(owner: str, key: str, value) -> None:
    if value is not None and not (
        isinstance(value, tuple) and len(value) == 3
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in value)
    ):
        raise ConfigError(f"recipe step {owner}: {key}={value!r} must be None or three integers in [0, 255]")


def check_choice(owner: str, key: str, value, choices: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` naming ``owner.key`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"recipe step {owner}: {key}={value!r} must be one of {list(choices)}")


def _check_names(owner: str, key: str, value) -> None:
    if not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"recipe step {owner}: {key}={value!r} must be a non-empty list of names")


@dataclasses.dataclass(frozen=True)
class _Declared:
    """Base of steps and choices: lists become tuples, declared ranges and colours are checked."""

    type_name: ClassVar[str] = "step"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
                object.__setattr__(self, field.name, value)
            declared = str(field.type)
            if declared.startswith("Range") and not (value is None and "None" in declared):
                _check_range_pair(self.type_name, field.name, value)
            elif declared.startswith("RGB"):
                _check_color(self.type_name, field.name, value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"type": type_name, field: value}`` (tuples as lists)."""
        values = {"type": self.type_name}
        for key, value in dataclasses.asdict(self).items():
            values[key] = [list(v) if isinstance(v, tuple) else v for v in value] if isinstance(value, tuple) else value
        return values


@dataclasses.dataclass(frozen=True)
class Step(_Declared):
    """One kind of random edit: applied with probability ``p`` (in a choice: its relative weight)."""

    p: float = 0.0

    def __post_init__(self):
        check_number(self.type_name, "p", self.p, 0.0, 1.0)
        super().__post_init__()

    def rate(self) -> float:
        """The probability that the step applies (``p``; a step with ``p_means`` may say otherwise)."""
        return self.p

    def draw(self, context: DrawContext) -> list[Edit]:
        """The edits of this step for the current image (the caller has already decided to apply it)."""
        raise NotImplementedError


@register_step
@dataclasses.dataclass(frozen=True)
class OneOf(_Declared):
    """With probability ``p``, one of the steps named in ``members``, drawn with their ``p`` as weights."""

    p: float = 1.0
    members: tuple[str, ...] = ()
    type_name: ClassVar[str] = "one_of"

    def __post_init__(self):
        check_number(self.type_name, "p", self.p, 0.0, 1.0)
        _check_names(self.type_name, "members", self.members)
        super().__post_init__()


@register_step
@dataclasses.dataclass(frozen=True)
class SomeOf(_Declared):
    """``count`` (drawn uniformly in the closed range) distinct steps of ``weights`` (``(name, weight)``
    pairs), drawn without replacement in proportion to the positive weights; applied in the order the
    recipe lists them when ``in_order``, else in the order drawn."""

    count: tuple[int, int] = (1, 1)
    weights: tuple[tuple[str, float], ...] = ()
    in_order: bool = False
    type_name: ClassVar[str] = "some_of"

    def __post_init__(self):
        super().__post_init__()
        if not self.weights or not all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
            and isinstance(pair[1], (int, float)) and not isinstance(pair[1], bool) for pair in self.weights
        ):
            raise ConfigError(f"recipe step {self.type_name}: weights={self.weights!r} must be [name, weight] pairs")
        for name, weight in self.weights:
            if not weight >= 0:
                raise ConfigError(f"recipe step {self.type_name}: weight of {name!r} must be >= 0, got {weight}")
        count = self.count
        if not (isinstance(count, tuple) and len(count) == 2 and all(isinstance(c, int) for c in count)):
            raise ConfigError(f"recipe step {self.type_name}: count={self.count!r} must be two integers [low, high]")
        positive = sum(1 for _, weight in self.weights if weight > 0)
        if not 0 <= count[0] <= count[1] <= positive:
            raise ConfigError(f"recipe step {self.type_name}: count={count} must satisfy 0 <= low <= high <= "
                              f"{positive} (the members with a positive weight)")

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.weights)


def snap_angle(angle: float, affinity: float = 22.5) -> float:
    """``angle`` (degrees) wrapped to [0, 360) and snapped to 0, 90, 180 or 270 when within ``affinity`` of it."""
    angle -= math.floor(angle / 360.0) * 360.0
    for target in (0.0, 90.0, 180.0, 270.0, 360.0):
        if abs(angle - target) <= affinity:
            return target % 360.0
    return angle


def _resized_crop(context: DrawContext, scale: Range, ratio: Range, to_output: bool, resample: str,
                  form: str = "box") -> Edit:
    """torchvision's RandomResizedCrop box as a crop, or straight to the model input when ``to_output``
    and the editor has an output size (resampled in the :class:`~.edits.RandomResizedCrop` ``form``)."""
    target = context.output_size if to_output else None
    box = RandomResizedCrop.draw(context.rng, context.size, target or (1, 1), scale, ratio, resample, form)
    return box if target is not None else Crop(box.left, box.top, box.right, box.bottom)


def _box(rng: np.random.Generator, size: tuple[int, int], scale: Range, ratio: Range) -> tuple[int, int, int, int]:
    """``(left, top, width, height)`` of a box drawn as torchvision's RandomResizedCrop draws one."""
    box = RandomResizedCrop.draw(rng, size, size, scale, ratio)
    return box.left, box.top, box.right - box.left, box.bottom - box.top


@functools.lru_cache(maxsize=4096)
def _displayed_size(path: str) -> tuple[int, int]:
    """(H, W) of an image file as :func:`~copynce_hf.images.load_image` returns it (EXIF rotations swap the sides)."""
    with Image.open(path) as handle:
        width, height = handle.size
        orientation = handle.getexif().get(0x0112, 1)
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


# ---------------------------------------------------------------------- geometric steps


@register_step
@dataclasses.dataclass(frozen=True)
class RandomResizedCropStep(Step):
    """torchvision RandomResizedCrop: area fraction in ``scale``, aspect w/h log-uniform in ``ratio``.

    A plain crop (the editor's final resize follows), or with ``to_output`` a crop resized straight
    to the editor's output size with ``resample`` (the authors' recipe), from the box in the whole image
    (``form="box"``) or from the crop (``form="crop"``, torchvision's, as the authors run it)."""

    p: float = 0.8
    scale: Range = (0.25, 1.0)
    ratio: Range = (3 / 4, 4 / 3)
    to_output: bool = False
    resample: str = "bilinear"
    form: str = "box"
    type_name: ClassVar[str] = "random_resized_crop"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "form", self.form, ("box", "crop"))

    def draw(self, context):
        return [_resized_crop(context, self.scale, self.ratio, self.to_output, self.resample, self.form)]


@register_step
@dataclasses.dataclass(frozen=True)
class HorizontalFlipStep(Step):
    p: float = 0.5
    type_name: ClassVar[str] = "horizontal_flip"

    def draw(self, context):
        return [HorizontalFlip()]


@register_step
@dataclasses.dataclass(frozen=True)
class VerticalFlipStep(Step):
    p: float = 0.05
    type_name: ClassVar[str] = "vertical_flip"

    def draw(self, context):
        return [VerticalFlip()]


@register_step
@dataclasses.dataclass(frozen=True)
class AffineStep(Step):
    """torchvision RandomAffine: angle in ``degrees``, translation up to ``translate`` of each side,
    isotropic ``scale``, x shear in ``shear`` (degrees), ``fill`` outside (None: a random colour).

    ``translate`` or ``scale`` None draws no translation or scaling; ``rotation_affinity`` snaps the
    angle with :func:`snap_angle` (the authors' affine: 0-360 degrees, snapped within 22.5)."""

    p: float = 0.25
    degrees: Range = (-30.0, 30.0)
    translate: float | None = 0.1
    scale: Range | None = (0.8, 1.2)
    shear: Range = (-10.0, 10.0)
    fill: RGB | None = None
    rotation_affinity: float | None = None
    resample: str = "bilinear"
    form: str = "exact"
    type_name: ClassVar[str] = "affine"

    def __post_init__(self):
        super().__post_init__()
        if self.form not in WARP_FORMS:
            raise ConfigError(f"recipe step {self.type_name}: form={self.form!r} must be one of {list(WARP_FORMS)}")
        if self.translate is not None:
            check_number(self.type_name, "translate", self.translate, 0.0, 1.0)
        if self.rotation_affinity is not None:
            check_number(self.type_name, "rotation_affinity", self.rotation_affinity, 0.0, 45.0)

    def draw(self, context):
        height, width = context.size
        values = {}
        if self.translate is not None:
            values["translate"] = (self.translate * width * context.uniform((-1, 1)),
                                   self.translate * height * context.uniform((-1, 1)))
        angle = context.uniform(self.degrees)
        values["angle"] = angle if self.rotation_affinity is None else snap_angle(angle, self.rotation_affinity)
        if self.scale is not None:
            values["scale"] = context.uniform(self.scale)
        values["shear"] = (context.uniform(self.shear), 0.0)
        values["fill"] = self.fill if self.fill is not None else context.color()
        return [Affine(**values, resample=self.resample, form=self.form)]


@register_step
@dataclasses.dataclass(frozen=True)
class PerspectiveStep(Step):
    """torchvision RandomPerspective: each corner moves inwards by up to ``distortion`` of half a
    side; ``fill`` outside (None: a random colour). ``form="torchvision"`` (the authors'): the corners
    are drawn as torchvision draws them (whole pixels, up to ``int(distortion * (side // 2))``) and the
    :class:`~.edits.Perspective` edit has that form."""

    p: float = 0.25
    distortion: float = 0.3
    fill: RGB | None = None
    resample: str = "bilinear"
    form: str = "exact"
    type_name: ClassVar[str] = "perspective"

    def __post_init__(self):
        super().__post_init__()
        check_number(self.type_name, "distortion", self.distortion, 0.0, 0.95)
        if self.form not in WARP_FORMS:
            raise ConfigError(f"recipe step {self.type_name}: form={self.form!r} must be one of {list(WARP_FORMS)}")

    def draw(self, context):
        if self.form == "torchvision":
            return [self._torchvision_draw(context)]
        height, width = context.size
        dx, dy = self.distortion * (width - 1) / 2, self.distortion * (height - 1) / 2
        right, bottom = width - 1.0, height - 1.0
        start = ((0.0, 0.0), (right, 0.0), (right, bottom), (0.0, bottom))
        signs = ((1, 1), (-1, 1), (-1, -1), (1, -1))  # inwards from each corner
        end = tuple(
            (x + sx * context.uniform((0, dx)), y + sy * context.uniform((0, dy)))
            for (x, y), (sx, sy) in zip(start, signs)
        )
        fill = self.fill if self.fill is not None else context.color()
        return [Perspective(start, end, fill=fill, resample=self.resample)]

    def _torchvision_draw(self, context) -> Perspective:
        """torchvision's corners: each coordinate a whole pixel drawn uniformly within ``int(distortion *
        (side // 2))`` of its corner (start points are the corner pixels)."""
        height, width = context.size
        reach_x, reach_y = int(self.distortion * (width // 2)), int(self.distortion * (height // 2))

        def near(low: bool, side: int, reach: int) -> float:
            return float(context.rng.integers(0, reach + 1) if low else context.rng.integers(side - reach - 1, side))

        end = ((near(True, width, reach_x), near(True, height, reach_y)),
               (near(False, width, reach_x), near(True, height, reach_y)),
               (near(False, width, reach_x), near(False, height, reach_y)),
               (near(True, width, reach_x), near(False, height, reach_y)))
        start = ((0.0, 0.0), (width - 1.0, 0.0), (width - 1.0, height - 1.0), (0.0, height - 1.0))
        fill = self.fill if self.fill is not None else context.color()
        return Perspective(start, end, fill=fill, resample=self.resample, form="torchvision")


@register_step
@dataclasses.dataclass(frozen=True)
class PadStep(Step):
    """Pad by fractions of the width and height drawn in ``fraction`` on each side, ``color`` (None: random); the
    margins rounded down, or with ``rounding="round"`` to the nearest pixel (the authors' ``RandomPadding``)."""

    p: float = 0.1
    fraction: Range = (0.02, 0.2)
    color: RGB | None = None
    rounding: str = "floor"
    type_name: ClassVar[str] = "pad"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "rounding", self.rounding, ("floor", "round"))

    def draw(self, context):
        width_fraction, height_fraction = context.uniform(self.fraction), context.uniform(self.fraction)
        color = self.color if self.color is not None else context.color()
        return [Pad(width_fraction, height_fraction, color, rounding=self.rounding)]


@register_step
@dataclasses.dataclass(frozen=True)
class OntoBackgroundStep(Step):
    """Paste the copy onto another image ("overlay image onto another"): the copy's height is
    ``overlay_size`` of the background's; procedural backgrounds are ``background_scale``
    times the current size."""

    p: float = 0.15
    overlay_size: Range = (0.4, 0.9)
    background_scale: Range = (1.0, 1.6)
    type_name: ClassVar[str] = "onto_background"

    def draw(self, context):
        spec = context.image_spec(self.background_scale)
        fraction = context.uniform(self.overlay_size)
        if spec["kind"] == "file":
            bg_height, bg_width = _displayed_size(spec["path"])
        else:
            bg_height, bg_width = spec["size"]
        height, width = context.size
        pasted_width = width * max(1, int(bg_height * fraction)) / height
        x_room = max(0.0, 1.0 - pasted_width / bg_width)
        y_room = max(0.0, 1.0 - fraction)
        return [OverlayOntoBackground(spec, overlay_size=fraction, x_pos=context.uniform((0, x_room)),
                                      y_pos=context.uniform((0, y_room)))]


@register_step
@dataclasses.dataclass(frozen=True)
class OntoOtherImageStep(Step):
    """The copy pasted onto another image (the authors' ``OverlayImageOntoTheOther``).

    With probability ``crop_p`` the copy is first random-resized-cropped (``crop_scale``,
    ``crop_ratio``) to the model input; it is then resized to a box of area ``scale`` and aspect
    ``ratio`` of the other image (at the model input size) and blended in with ``opacity``. ``form``
    (:data:`PASTE_FORMS`): ``"authors"`` renders as their class (the crop resized from the crop, the mask level
    truncated)."""

    p: float = 1.0
    crop_p: float = 0.5
    crop_scale: Range = (0.2, 1.0)
    crop_ratio: Range = (0.33, 3.0)
    scale: Range = (0.25, 0.5)
    ratio: Range = (0.33, 3.0)
    opacity: Range = (0.5, 1.0)
    form: str = "package"
    type_name: ClassVar[str] = "onto_other_image"

    def __post_init__(self):
        super().__post_init__()
        check_number(self.type_name, "crop_p", self.crop_p, 0.0, 1.0)
        check_choice(self.type_name, "form", self.form, PASTE_FORMS)

    def draw(self, context):
        edits, authors = [], self.form == "authors"
        if context.rng.random() < self.crop_p:
            edits.append(_resized_crop(context, self.crop_scale, self.crop_ratio, True, "bicubic",
                                       "crop" if authors else "box"))
        canvas = context.output_size or context.size
        spec = context.image_spec((1.0, 1.0))
        left, top, width, height = _box(context.rng, canvas, self.scale, self.ratio)
        edits.append(PasteIntoBox(spec, canvas[0], canvas[1], left, top, height, width,
                                  opacity=context.uniform(self.opacity), resample="bicubic",
                                  level_rounding="truncate" if authors else "nearest"))
        return edits


@register_step
@dataclasses.dataclass(frozen=True)
class OtherImageOntoStep(Step):
    """Another image pasted onto the copy (the authors' ``OverlayTheOtherOntoImage``).

    With probability ``crop_p`` the copy is first random-resized-cropped (``crop_scale``,
    ``crop_ratio``) to the model input; the other image is then resized to a box of area ``scale``
    and aspect ``ratio`` of the copy and blended in with ``opacity``. ``form`` (:data:`PASTE_FORMS`):
    ``"authors"`` renders as their class (the crop resized from the crop; the other image resized bicubic to the
    model input, then to the box; the mask level truncated)."""

    p: float = 1.0
    crop_p: float = 0.5
    crop_scale: Range = (0.3, 1.0)
    crop_ratio: Range = (0.33, 3.0)
    scale: Range = (0.3, 0.7)
    ratio: Range = (0.33, 3.0)
    opacity: Range = (0.0, 0.5)
    form: str = "package"
    type_name: ClassVar[str] = "other_image_onto"

    def __post_init__(self):
        super().__post_init__()
        check_number(self.type_name, "crop_p", self.crop_p, 0.0, 1.0)
        check_choice(self.type_name, "form", self.form, PASTE_FORMS)

    def draw(self, context):
        edits, size, authors = [], context.size, self.form == "authors"
        if context.rng.random() < self.crop_p:
            crop = _resized_crop(context, self.crop_scale, self.crop_ratio, True, "bicubic", "crop" if authors else "box")
            edits.append(crop)
            size = crop.output_size(size)
        spec = context.image_spec((0.3, 1.0))
        left, top, width, height = _box(context.rng, size, self.scale, self.ratio)
        rows, cols = size
        rendering = ({"resample": "bicubic", "overlay_size": context.output_size, "level_rounding": "truncate"}
                     if authors else {})
        edits.append(OverlayImageBox(spec, x=left / cols, y=top / rows, width=width / cols, height=height / rows,
                                     opacity=context.uniform(self.opacity), **rendering))
        return edits


# ---------------------------------------------------------------------- query structure steps


#: Fonts of AugLy's asset folder that the training recipe's text step does not use (the queries' captions).
CAPTION_FONTS = ("Chunkfive.ttf", "CaviarDreams.ttf", "Elsie-Black.ttf", "GrandHotel-Regular.ttf")
#: Caption words of the mini-DISC queries.
MINIDISC_WORDS = ("LOL", "WHEN YOU SEE IT", "ME IRL", "NOPE", "SO TRUE", "MONDAY MOOD", "WAIT FOR IT", "OK")
#: Caption words of the demo queries.
DEMO_WORDS = ("LOL", "ME IRL", "NOPE", "SO TRUE", "WAIT FOR IT", "OK", "MONDAY", "FOUND IT")
#: Meme band words of the training recipe ``training_everyday`` (none of the evaluation recipes' words).
TRAINING_MEME_WORDS = ("TFW", "SAME", "BIG IF TRUE", "TOO REAL", "RELATABLE", "THIS IS FINE", "GUESS WHAT", "WOW")


@register_step
@dataclasses.dataclass(frozen=True)
class HeavyCropOverlaysStep(Step):
    """A heavy crop (kept area ``crop_area``, log aspect ``crop_log_aspect`` relative to the image's,
    sides at least ``crop_min_side`` pixels) covered with a caption of ``caption_words`` of ``words``
    (``text_font_size`` of the shorter side) and an emoji (``emoji_size`` of the height)."""

    p: float = 1.0
    crop_area: Range = (0.2, 0.45)
    crop_log_aspect: Range = (math.log(0.6), math.log(1.6))
    crop_min_side: int = 1
    words: tuple[str, ...] = MINIDISC_WORDS
    caption_words: int = 2
    text_font_size: Range = (0.08, 0.16)
    emoji_size: Range = (0.2, 0.4)
    type_name: ClassVar[str] = "heavy_crop_overlays"

    def __post_init__(self):
        super().__post_init__()
        if self.crop_min_side < 1:
            raise ConfigError(f"recipe step {self.type_name}: crop_min_side={self.crop_min_side} must be at least 1")
        if not self.words or self.caption_words < 1:
            raise ConfigError(f"recipe step {self.type_name} needs caption words and caption_words >= 1, got "
                              f"{self.words!r}, {self.caption_words}")

    def draw(self, context):
        rng, (height, width) = context.rng, context.size
        area = context.uniform(self.crop_area)
        aspect = math.exp(context.uniform(self.crop_log_aspect))
        box_w = min(width, max(self.crop_min_side, round(width * math.sqrt(area * aspect))))
        box_h = min(height, max(self.crop_min_side, round(height * math.sqrt(area / aspect))))
        left = int(rng.integers(0, width - box_w + 1))
        top = int(rng.integers(0, height - box_h + 1))
        names = emoji_names()
        words = " ".join(self.words[int(i)] for i in rng.integers(len(self.words), size=self.caption_words))
        return [
            Crop(left, top, left + box_w, top + box_h),
            OverlayText(text=words, font=context.pick(CAPTION_FONTS), font_size=context.uniform(self.text_font_size),
                        color=context.color(), x=context.uniform((0.0, 0.4)), y=context.uniform((0.0, 0.8)),
                        opacity=1.0),
            OverlayEmoji(emoji=context.pick(names), size=context.uniform(self.emoji_size),
                         x=context.uniform((0.0, 0.7)), y=context.uniform((0.0, 0.7)), opacity=1.0),
        ]


@register_step
@dataclasses.dataclass(frozen=True)
class AspectRatioStep(Step):
    """A new aspect ratio w / h, log-uniform in ``ratio``."""

    p: float = 1.0
    ratio: Range = (0.5, 2.0)
    type_name: ClassVar[str] = "aspect_ratio"

    def draw(self, context):
        low, high = (math.log(v) for v in self.ratio)
        return [ChangeAspectRatio(ratio=math.exp(context.uniform((low, high))))]


@register_step
@dataclasses.dataclass(frozen=True)
class SkewStep(Step):
    """AugLy skew by ``factor`` of either sign, along either axis."""

    p: float = 1.0
    factor: Range = (0.15, 0.5)
    type_name: ClassVar[str] = "skew"

    def draw(self, context):
        return [Skew(skew_factor=context.signed(self.factor), axis=int(context.rng.integers(2)))]


@register_step
@dataclasses.dataclass(frozen=True)
class RotateStep(Step):
    """A rotation by ``degrees`` of either sign, cropped to the rotated content."""

    p: float = 1.0
    degrees: Range = (8.0, 40.0)
    type_name: ClassVar[str] = "rotate"

    def draw(self, context):
        return [Rotate(degrees=context.signed(self.degrees), crop_to_content=True)]


@register_step
@dataclasses.dataclass(frozen=True)
class MemeFormatStep(Step):
    """A meme caption band of height ``caption`` of the image's, one of ``words``, dark or light.

    Draws the height, the colours, then the text; ``colour_first`` draws the colours, the text, then
    the height (the demo's order, kept so that its queries stay the same)."""

    p: float = 1.0
    caption: Range = (0.15, 0.35)
    words: tuple[str, ...] = MINIDISC_WORDS
    colour_first: bool = False
    type_name: ClassVar[str] = "meme_format"

    def __post_init__(self):
        super().__post_init__()
        if not self.words:
            raise ConfigError(f"recipe step {self.type_name} needs caption words")

    def draw(self, context):
        if self.colour_first:
            dark = bool(context.rng.random() < 0.5)
            text = context.pick(self.words)
            caption = max(11, int(context.size[0] * context.uniform(self.caption)))
        else:
            caption = max(11, int(context.size[0] * context.uniform(self.caption)))
            dark = bool(context.rng.random() < 0.5)
            text = context.pick(self.words)
        return [MemeFormat(text=text, caption_height=caption, text_color=(255, 255, 255) if dark else (0, 0, 0),
                           bg_color=(0, 0, 0) if dark else (255, 255, 255))]


@register_step
@dataclasses.dataclass(frozen=True)
class ScreenshotStep(Step):
    """The copy on a web or mobile screenshot template, cropped to fit or not (each half the time)."""

    p: float = 1.0
    type_name: ClassVar[str] = "screenshot"

    def draw(self, context):
        template = "web" if context.rng.random() < 0.5 else "mobile"
        return [OverlayOntoScreenshot(template=template, crop_src_to_fit=bool(context.rng.random() < 0.5))]


# ---------------------------------------------------------------------- photometric steps


@register_step
@dataclasses.dataclass(frozen=True)
class ColorJitterStep(Step):
    """torchvision ColorJitter: factors in ``[1 - b, 1 + b]`` etc., hue shift in ``[-hue, hue]``; ``form`` is
    the :class:`~.edits.ColorJitter` form (``"torchvision"``, the authors': also a random order of the four)."""

    p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    form: str = "augly"
    type_name: ClassVar[str] = "color_jitter"

    def __post_init__(self):
        super().__post_init__()
        for key in ("brightness", "contrast", "saturation"):
            check_number(self.type_name, key, getattr(self, key), 0.0, 1.0)
        check_number(self.type_name, "hue", self.hue, 0.0, 0.5)
        if self.form not in COLOR_JITTER_FORMS:
            raise ConfigError(f"recipe step {self.type_name}: form={self.form!r} must be one of {list(COLOR_JITTER_FORMS)}")

    def draw(self, context):
        def factor(spread):
            return context.uniform((1 - spread, 1 + spread))

        if self.form == "torchvision":  # torchvision draws the order first, then the factors
            order = tuple(int(index) for index in context.rng.permutation(4))
            return [ColorJitter(factor(self.brightness), factor(self.contrast), factor(self.saturation),
                                context.uniform((-self.hue, self.hue)), form="torchvision", order=order)]
        return [ColorJitter(factor(self.brightness), factor(self.contrast), factor(self.saturation),
                            context.uniform((-self.hue, self.hue)))]


@register_step
@dataclasses.dataclass(frozen=True)
class BrightnessStep(Step):
    """Brightness factor in ``factor``."""

    p: float = 1.0
    factor: Range = (0.5, 1.6)
    type_name: ClassVar[str] = "brightness"

    def draw(self, context):
        return [Brightness(factor=context.uniform(self.factor))]


@register_step
@dataclasses.dataclass(frozen=True)
class ContrastStep(Step):
    """Contrast factor in ``factor``."""

    p: float = 1.0
    factor: Range = (0.5, 1.8)
    type_name: ClassVar[str] = "contrast"

    def draw(self, context):
        return [Contrast(factor=context.uniform(self.factor))]


@register_step
@dataclasses.dataclass(frozen=True)
class SaturationStep(Step):
    """Saturation factor in ``factor``."""

    p: float = 1.0
    factor: Range = (0.2, 2.5)
    type_name: ClassVar[str] = "saturation"

    def draw(self, context):
        return [Saturation(factor=context.uniform(self.factor))]


@register_step
@dataclasses.dataclass(frozen=True)
class SharpenStep(Step):
    """Sharpening factor in ``factor``."""

    p: float = 1.0
    factor: Range = (2.0, 6.0)
    type_name: ClassVar[str] = "sharpen"

    def draw(self, context):
        return [Sharpen(factor=context.uniform(self.factor))]


@register_step
@dataclasses.dataclass(frozen=True)
class SolarizeStep(Step):
    """Solarisation above an integer ``threshold`` drawn in the closed range."""

    p: float = 1.0
    threshold: Range = (160, 230)
    type_name: ClassVar[str] = "solarize"

    def draw(self, context):
        return [Solarize(threshold=context.integer(self.threshold))]


@register_step
@dataclasses.dataclass(frozen=True)
class PosterizeStep(Step):
    """Posterisation to an integer number of ``bits`` drawn in the closed range."""

    p: float = 1.0
    bits: Range = (2, 4)
    type_name: ClassVar[str] = "posterize"

    def draw(self, context):
        return [Posterize(bits=context.integer(self.bits))]


@register_step
@dataclasses.dataclass(frozen=True)
class GrayscaleStep(Step):
    p: float = 0.2
    type_name: ClassVar[str] = "grayscale"

    def draw(self, context):
        return [Grayscale()]


@register_step
@dataclasses.dataclass(frozen=True)
class BlurStep(Step):
    """Gaussian blur of a ``radius`` drawn uniformly, in ``units`` (:data:`UNITS`): a fraction of the shorter side
    (0.004 = 2 px at 500 px) or pixels of the image it runs on (the authors' AugLy ``RandomBlur``: 0-10)."""

    p: float = 0.3
    radius: Range = (0.0005, 0.006)
    units: str = "fraction"
    type_name: ClassVar[str] = "blur"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "units", self.units, UNITS)

    def draw(self, context):
        radius = context.uniform(self.radius)
        return [Blur(radius=radius * min(context.size) if self.units == "fraction" else radius)]


@register_step
@dataclasses.dataclass(frozen=True)
class JpegStep(Step):
    """JPEG at an integer quality drawn in ``quality``, or at one of ``qualities`` when given
    (AugLy ``OneOf(EncodingQuality(q))``, the authors' recipe)."""

    p: float = 0.3
    quality: Range = (20, 90)
    qualities: tuple[int, ...] | None = None
    type_name: ClassVar[str] = "jpeg"

    def __post_init__(self):
        super().__post_init__()
        if self.qualities is not None and (
            not self.qualities or not all(isinstance(q, int) and 1 <= q <= 100 for q in self.qualities)
        ):
            raise ConfigError(f"recipe step {self.type_name}: qualities={self.qualities!r} must be integers in [1, 100]")

    def draw(self, context):
        if self.qualities is not None:
            return [JpegQuality(quality=context.pick(self.qualities))]
        return [JpegQuality(quality=context.integer(self.quality))]


@register_step
@dataclasses.dataclass(frozen=True)
class PixelizationStep(Step):
    p: float = 0.1
    ratio: Range = (0.2, 0.6)
    type_name: ClassVar[str] = "pixelization"

    def draw(self, context):
        return [Pixelization(ratio=context.uniform(self.ratio))]


@register_step
@dataclasses.dataclass(frozen=True)
class ShufflePixelsStep(Step):
    """A fraction ``factor`` of the pixels shuffled among themselves: by a seed drawn per copy (``seed`` None, the
    package's), or by the same ``seed`` for every copy (the authors' AugLy ``ShufflePixels``: seed 10, so that
    every copy of a given size shuffles the same pixel positions), in the :class:`~.edits.ShufflePixels` ``form``."""

    p: float = 0.05
    factor: Range = (0.01, 0.1)
    seed: int | None = None
    form: str = "numpy"
    type_name: ClassVar[str] = "shuffle_pixels"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "form", self.form, SHUFFLE_FORMS)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**32):
            raise ConfigError(f"recipe step {self.type_name}: seed={self.seed!r} must be null or an integer in [0, 2**32)")

    def draw(self, context):
        factor = context.uniform(self.factor)
        seed = context.seed() if self.seed is None else self.seed
        return [ShufflePixels(factor=factor, seed=seed, form=self.form)]


@register_step
@dataclasses.dataclass(frozen=True)
class NoiseStep(Step):
    """Gaussian noise, ``std`` as a fraction of the 0..255 range."""

    p: float = 0.1
    std: Range = (0.01, 0.06)
    type_name: ClassVar[str] = "noise"

    def draw(self, context):
        return [Noise(std=context.uniform(self.std), seed=context.seed())]


@register_step
@dataclasses.dataclass(frozen=True)
class EdgeEnhanceStep(Step):
    """PIL EDGE_ENHANCE or EDGE_ENHANCE_MORE, each half the time. ``coin`` says how that is drawn:
    ``"random"`` (``rng.random() < 0.5``) or ``"integers"`` (``rng.integers(2)``, the authors'
    recipe's draw, kept so that its copies stay the same)."""

    p: float = 0.25
    coin: str = "random"
    type_name: ClassVar[str] = "edge_enhance"

    def __post_init__(self):
        super().__post_init__()
        if self.coin not in ("random", "integers"):
            raise ConfigError(f"recipe step {self.type_name}: coin={self.coin!r} must be 'random' or 'integers'")

    def draw(self, context):
        more = bool(context.rng.integers(2)) if self.coin == "integers" else bool(context.rng.random() < 0.5)
        return [EdgeEnhance(more=more)]


@register_step
@dataclasses.dataclass(frozen=True)
class AlbumentationsStep(Step):
    """One of ``ops`` (albumentations transform names), uniformly, at its default parameters."""

    p: float = 0.15
    ops: tuple[str, ...] = ALBUMENTATIONS_OPS
    type_name: ClassVar[str] = "albumentation"

    def __post_init__(self):
        super().__post_init__()
        unknown = [op for op in self.ops if op not in ALBUMENTATIONS_OPS]
        if not self.ops or unknown:
            raise ConfigError(f"recipe step {self.type_name}: ops={self.ops!r} must be a non-empty list of "
                              f"{list(ALBUMENTATIONS_OPS)}")

    def draw(self, context):
        return [Albumentation(op=context.pick(self.ops), seed=context.seed())]


# ---------------------------------------------------------------------- occluding steps


_DEFAULT_FONTS = (
    "IBMPlexSans-Bold.ttf",
    "Montserrat-Black.ttf",
    "OpenSans-Regular.ttf",
    "Raleway-SemiBold.ttf",
    "Ubuntu-B.ttf",
    "PlayfairDisplay-Bold.ttf",
    "Pacifico.ttf",
    "IBMPlexMono-Medium.ttf",
)
_TEXT_ALPHABET = string.ascii_letters + string.digits + string.digits + "  !?.,#@&"


#: ``fonts`` entry standing for every font of AugLy's folder (:func:`~copynce_hf.pixtrace.edits.font_names`).
ALL_FONTS = "*"
#: Text forms of :class:`OverlayTextStep`.
TEXT_FORMS = ("alphabet", "authors")


def _printable(characters: str) -> str:
    """``characters`` without control characters (AugLy's listings hold NUL or carriage return for many fonts)."""
    return "".join(c for c in characters if c.isprintable() or c == " ")


@register_step
@dataclasses.dataclass(frozen=True)
class OverlayTextStep(Step):
    """Text in one of ``fonts`` (AugLy's bundled fonts; ``"*"`` is all of them), ``font_size`` as a fraction
    of the shorter side, random colour, ``opacity``. Two forms:

    * ``form="alphabet"`` (the package's): ``length`` characters of a fixed alphabet (those the font
      lists), the anchor's x in [0, 0.7) and y in [0, 0.85) of the image (text may run past the right edge);
    * ``form="authors"`` (the CopyNCE authors' ``RandomOverlayText``, SSCD's overlay): ``length[1]``
      characters (theirs: 100; ``length[0]`` must be 1) drawn from the font's own character listing (control
      characters left out), of which the first ``n`` are kept, ``n`` uniform in 1..``maxlen`` where
      ``maxlen`` is the longest prefix whose ink fits the image (width and height, one pixel spare for
      Pillow's sub-pixel start); the text is placed uniformly where it lies fully inside the image. No edit
      when not even one character fits or the prefix is blank.

    ``p_means`` (:data:`P_MEANINGS`): ``"apply"`` (text on a share ``p`` of the copies) or ``"skip"`` (on ``1 - p``:
    the authors' ``RandomOverlayText`` skips when ``random() < p``). ``covered`` (:data:`~.edits.COVERED_FORMS`):
    whether the pixels under the text are untraced (the package's) or keep their trace (the authors' map).
    """

    p: float = 0.3
    length: Range = (3, 14)
    font_size: Range = (0.06, 0.2)
    opacity: Range = (0.6, 1.0)
    fonts: tuple[str, ...] = _DEFAULT_FONTS
    form: str = "alphabet"
    p_means: str = "apply"
    covered: str = "untraced"
    type_name: ClassVar[str] = "overlay_text"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "p_means", self.p_means, P_MEANINGS)
        check_choice(self.type_name, "covered", self.covered, COVERED_FORMS)
        if self.form not in TEXT_FORMS:
            raise ConfigError(f"recipe step {self.type_name}: form={self.form!r} must be one of {TEXT_FORMS}")
        if self.form == "authors" and (self.length[0] != 1 or self.length[1] < 1 or self.length[1] != int(self.length[1])):
            raise ConfigError(f"recipe step {self.type_name}: length={self.length!r} with form='authors' must be "
                              f"[1, N]: N characters drawn, 1 to as many as fit kept")
        if not self.fonts or not all(isinstance(f, str) for f in self.fonts):
            raise ConfigError(f"recipe step {self.type_name}: fonts={self.fonts!r} must be a non-empty list of font files")
        for font in self.fonts:
            if font == ALL_FONTS:
                continue
            try:
                OverlayText(font=font)
            except EditParameterError as error:
                raise ConfigError(f"recipe step {self.type_name}: fonts entry {font!r} is not a font file") from error

    def rate(self) -> float:
        return self.p if self.p_means == "apply" else 1.0 - self.p

    def font_choices(self) -> tuple[str, ...]:
        """The fonts drawn from, ``"*"`` expanded to every font of AugLy's folder (duplicates kept once)."""
        expanded = [name for font in self.fonts for name in (font_names() if font == ALL_FONTS else (font,))]
        return tuple(dict.fromkeys(expanded))

    def draw(self, context):
        if self.form == "authors":
            return self._draw_authors(context)
        font = context.pick(self.fonts)
        try:
            drawable = font_characters(font)
        except EditParameterError:  # a user's font without AugLy's character listing
            drawable = _TEXT_ALPHABET
        alphabet = [c for c in _TEXT_ALPHABET if c == " " or c in drawable] or list("copy")
        length = context.integer(self.length)
        text = "".join(alphabet[i] for i in context.rng.integers(len(alphabet), size=length)).strip() or "copy"
        return [OverlayText(text=text, font=font, font_size=context.uniform(self.font_size), color=context.color(),
                            x=context.uniform((0.0, 0.7)), y=context.uniform((0.0, 0.85)),
                            opacity=context.uniform(self.opacity), covered=self.covered)]

    def _draw_authors(self, context: DrawContext) -> list[Edit]:
        height, width = context.size
        font = context.pick(self.font_choices())
        font_size = context.uniform(self.font_size)
        pixels = max(1, int(min(height, width) * font_size))  # as OverlayText.coverage sizes the glyphs
        try:
            listing = _printable(font_characters(font))
        except EditParameterError:  # a user's font without AugLy's character listing
            listing = _TEXT_ALPHABET
        drawn = int(self.length[1])
        sample = "".join(listing[i] for i in context.rng.integers(len(listing), size=drawn))

        @functools.cache
        def extent(count: int) -> tuple[int, int, int, int]:
            """(room_x, room_y, left_pad, top_pad) of the first ``count`` characters: spare pixels around
            the ink (one kept for sub-pixel starts)."""
            left, top, right, bottom = text_ink_box(sample[:count], font, pixels)
            left_pad, top_pad = max(0, -left), max(0, -top)
            return width - 1 - (right + left_pad), height - 1 - (bottom + top_pad), left_pad, top_pad

        # The longest prefix that fits: each character adds ink after the others, so the ink box grows
        # with the prefix and a bisection finds where the authors' scan over 1, 2, ... first fails.
        low, high = 0, drawn + 1  # prefixes of ``low`` characters fit (0 trivially), of ``high`` do not
        try:
            while high - low > 1:
                middle = (low + high) // 2
                room_x, room_y, _, _ = extent(middle)
                low, high = (middle, high) if room_x >= 0 and room_y >= 0 else (low, middle)
        except OSError:  # a glyph FreeType cannot load: the authors skip the text too
            return []
        if low == 0:
            return []
        count = context.integer((1, low))
        text = sample[:count]
        room_x, room_y, left_pad, top_pad = extent(count)
        x = (left_pad + context.uniform((0.0, 1.0)) * room_x) / width
        y = (top_pad + context.uniform((0.0, 1.0)) * room_y) / height
        opacity, color = context.uniform(self.opacity), context.color()
        if not text.strip():
            return []
        return [OverlayText(text=text, font=font, font_size=font_size, color=color, x=x, y=y, opacity=opacity,
                            covered=self.covered)]


@register_step
@dataclasses.dataclass(frozen=True)
class OverlayEmojiStep(Step):
    """One of AugLy's emoji at ``opacity``, in one of :class:`~.edits.OverlayEmoji`'s forms:

    * ``form="augly"`` (the package's): ``size`` is a fraction of the height, the corner anywhere in
      [0, 0.9) of the width and height (the emoji may be cut at the edge);
    * ``form="authors"`` (the CopyNCE authors' ``RandomOverlayEmoji``): ``size`` is a fraction of the
      largest scale at which the emoji fits (theirs: 0.1-0.5), placed uniformly inside the image.

    ``covered`` (:data:`~.edits.COVERED_FORMS`): the pixels under the emoji untraced or keeping their trace.
    """

    p: float = 0.3
    size: Range = (0.1, 0.35)
    opacity: Range = (0.6, 1.0)
    form: str = "augly"
    covered: str = "untraced"
    type_name: ClassVar[str] = "overlay_emoji"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "covered", self.covered, COVERED_FORMS)
        if self.form not in EMOJI_FORMS:
            raise ConfigError(f"recipe step {self.type_name}: form={self.form!r} must be one of {list(EMOJI_FORMS)}")

    def draw(self, context):
        corner = (0.0, 1.0) if self.form == "authors" else (0.0, 0.9)
        return [OverlayEmoji(emoji=context.pick(emoji_names()), size=context.uniform(self.size),
                             x=context.uniform(corner), y=context.uniform(corner),
                             opacity=context.uniform(self.opacity), form=self.form, covered=self.covered)]


@register_step
@dataclasses.dataclass(frozen=True)
class OverlayImageStep(Step):
    """Paste another image onto the copy ("another image onto it"): height ``size`` of the
    copy's, ``opacity``; procedural overlays are ``overlay_scale`` times the current size."""

    p: float = 0.15
    size: Range = (0.15, 0.45)
    opacity: Range = (0.6, 1.0)
    overlay_scale: Range = (0.2, 0.6)
    type_name: ClassVar[str] = "overlay_image"

    def draw(self, context):
        return [OverlayImage(overlay=context.image_spec(self.overlay_scale), size=context.uniform(self.size),
                             x=context.uniform((0.0, 0.85)), y=context.uniform((0.0, 0.85)),
                             opacity=context.uniform(self.opacity))]


@register_step
@dataclasses.dataclass(frozen=True)
class OverlayStripesStep(Step):
    """AugLy stripes: ``line_width``, ``line_density``, any angle, solid/dotted/dashed, ``opacity``."""

    p: float = 0.05
    line_width: Range = (0.1, 0.4)
    line_density: Range = (0.3, 0.8)
    opacity: Range = (0.5, 1.0)
    type_name: ClassVar[str] = "overlay_stripes"

    def draw(self, context):
        line_type = ("solid", "dotted", "dashed")[int(context.rng.integers(3))]
        return [OverlayStripes(line_width=context.uniform(self.line_width), line_color=context.color(),
                               line_angle=context.uniform((-90.0, 90.0)), line_density=context.uniform(self.line_density),
                               line_type=line_type, line_opacity=context.uniform(self.opacity))]


@register_step
@dataclasses.dataclass(frozen=True)
class RandomErasingStep(Step):
    """torchvision RandomErasing: a box of area fraction ``scale`` and aspect h/w log-uniform in ``ratio``.

    ``value="color"`` fills it with one random colour (a box too large is clamped to the image);
    ``value="random"`` is torchvision's ``value="random"``: ten tries (nothing erased when none
    fits), the box filled with random values, clipped to 8 bits or, with ``values="unclipped"``, unclipped in
    the model input (the authors': :data:`~.edits.ERASED_VALUES`). ``covered``
    (:data:`~.edits.COVERED_FORMS`): the erased pixels untraced or keeping their trace."""

    p: float = 0.25
    scale: Range = (0.02, 0.15)
    ratio: Range = (0.3, 3.3)
    value: str = "color"
    values: str = "clipped"
    covered: str = "untraced"
    type_name: ClassVar[str] = "random_erasing"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "value", self.value, ("color", "random"))
        check_choice(self.type_name, "values", self.values, ERASED_VALUES)
        check_choice(self.type_name, "covered", self.covered, COVERED_FORMS)
        if self.values == "unclipped" and self.value != "random":
            raise ConfigError(f"recipe step {self.type_name}: values='unclipped' needs value='random'")

    def draw(self, context):
        rows, cols = context.size
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        if self.value == "color":
            area = context.uniform(self.scale) * rows * cols
            aspect = math.exp(context.uniform(log_ratio))
            box_w = min(1.0, math.sqrt(area / aspect) / cols)
            box_h = min(1.0, math.sqrt(area * aspect) / rows)
            return [RandomErasing(x=context.uniform((0.0, 1.0 - box_w)), y=context.uniform((0.0, 1.0 - box_h)),
                                  width=box_w, height=box_h, fill=context.color(), covered=self.covered)]
        for _ in range(10):
            area = rows * cols * context.uniform(self.scale)
            aspect = math.exp(context.uniform(log_ratio))
            height, width = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if not (0 < height < rows and 0 < width < cols):
                continue
            top, left = int(context.rng.integers(0, rows - height + 1)), int(context.rng.integers(0, cols - width + 1))
            return [RandomErasing(x=left / cols, y=top / rows, width=width / cols, height=height / rows,
                                  noise_seed=context.seed(), values=self.values, covered=self.covered)]
        return []


@register_step
@dataclasses.dataclass(frozen=True)
class SmearingStep(Step):
    """The authors' RandomSmearing: ``points`` random points in a box of area ``scale`` and aspect
    ``ratio``, a Bezier stroke through them of ``width``, random colour. ``units`` (:data:`UNITS`): the width a
    fraction of the shorter side drawn uniformly (at least one pixel), or whole pixels of the image it runs on
    drawn uniformly in the closed range (the authors': 1-5). ``covered`` (:data:`~.edits.COVERED_FORMS`): the
    pixels under the stroke untraced or keeping their trace."""

    p: float = 0.25
    points: Range = (5, 50)
    width: Range = (1 * AT_224, 5 * AT_224)
    scale: Range = (0.08, 0.8)
    ratio: Range = (0.5, 2.0)
    units: str = "fraction"
    covered: str = "untraced"
    type_name: ClassVar[str] = "smearing"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.type_name, "units", self.units, UNITS)
        check_choice(self.type_name, "covered", self.covered, COVERED_FORMS)
        if self.units == "pixels" and not (self.width[0] >= 1 and all(float(w).is_integer() for w in self.width)):
            raise ConfigError(f"recipe step {self.type_name}: width={self.width!r} in pixels must be whole pixels >= 1")

    def draw(self, context):
        rows, cols = context.size
        left, top, width, height = _box(context.rng, context.size, self.scale, self.ratio)
        count = max(2, context.integer(self.points))
        xs = context.rng.integers(left, left + width, size=count)
        ys = context.rng.integers(top, top + height, size=count)
        points = tuple((float(x) / cols, float(y) / rows) for x, y in zip(xs, ys))
        if self.units == "pixels":
            stroke = context.integer(self.width)
        else:
            stroke = max(1, int(round(context.uniform(self.width) * min(rows, cols))))
        return [Smear(points=points, width=stroke, color=context.color(), covered=self.covered)]
