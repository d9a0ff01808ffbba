"""The CopyNCE authors' training recipes: four shuffled groups of copy edits, then a post-process.

The paper says its augmentation follows the authors' code; that code (``lyakaap`` recipe of
github.com/eddielyc/CopyNCE, values in ``descriptor_default_config.yaml`` and
``matching_default_config.yaml``) builds every query as follows. Values are descriptor / matcher
where they differ.

1. Four groups, applied in a random order per copy:

   * **crop** (p 0.3 / 0.5), one of (uniformly):

     - random resized crop to the model input: area 0.25-0.5 / 0.15-0.5, aspect (w/h) 0.33-3;
     - the copy pasted onto another image: with p 0.5 the copy is first random-resized-cropped
       (area 0.2-1.0, aspect 0.33-3), then resized to a box of the other image (the other image
       at the model input size; box area 0.25-0.5 / 0.15-0.5 of it, aspect 0.33-3) and blended
       in with opacity 0.5-1.0;
     - another image pasted onto the copy: with p 0.5 the copy is first random-resized-cropped
       (area 0.3-1.0, aspect 0.33-3); the other image is resized to a box of the copy (area
       0.3-0.7 / 0.5-0.8, aspect 0.33-3) and blended in with opacity 0.0-0.5;

   * **geometric**: horizontal flip p 0.5, vertical flip p 0.1, then with p 0.25 / 0.35 one of
     perspective (torchvision's, distortion 0.5) or affine (angle uniform in 0-360 degrees, snapped
     to 0, 90, 180 or 270 when within 22.5 degrees of it; x shear uniform in -45..45 degrees; the
     output keeps the input size, black outside, as torchvision's affine);
   * **appearance**, its ten edits in a random order: colour jitter p 1.0 (brightness, contrast,
     saturation 0.5 / 0.8, hue 0.1 / 0.2), pixelisation p 0.15 / 0.25 (ratio 0.1-1.0), pixel
     shuffling (factor 0.1) p 0.15, JPEG at quality 10, 20, 30 or 50 p 0.25 / 0.35, greyscale
     p 0.25, blur p 0.2, text p 0.25 / 0.35, emoji p 0.25 / 0.35, edge enhancement (normal or
     more) p 0.25 / 0.3, smearing (a Bezier stroke through 5-50 points of a box of area 0.08-0.8
     and aspect 0.5-2, width 1-5 pixels) p 0.25 / 0.3;
   * **additional**, p 0.15: one of the 24 albumentations operations of
     :data:`~copynce_hf.pixtrace.edits.ALBUMENTATIONS_OPS` at their default parameters
     (photometric; rain, snow and fog come without a mask and count as photometric).

2. **Post-process**: padding p 0.15 / 0.25 (0.2 of each side, black), the editor's resize to the
   model input, random erasing p 0.15 / 0.25 (torchvision's draw: area 0.02-0.33, aspect
   0.3-3.3, random values).

Rule for partly transparent pastes: a pixel counts as copied where the copy's weight in the blend
is at least 0.5, otherwise it is untraced (:mod:`~copynce_hf.pixtrace.edits.compositing`). With the
ranges above the copy always dominates (its opacity is 0.5-1.0 on another image, and another
image's opacity over it 0.0-0.5), so a blended pixel stays traced. Text and emoji overlays follow
the occluding edits' rule (covered where the overlay's opacity exceeds one half).

Sizes given in pixels by the authors (blur radius 2-10, stroke width 1-5) are fractions of the
shorter side here (those pixels at 224), so the recipe means the same at any resolution.
Geometric resampling is bicubic, as the authors' ``interpolation: bicubic``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from .editor import (
    BlurStep,
    ColorJitterStep,
    GrayscaleStep,
    HorizontalFlipStep,
    OverlayEmojiStep,
    OverlayTextStep,
    PerspectiveStep,
    PixelizationStep,
    Range,
    ShufflePixelsStep,
    Step,
    VerticalFlipStep,
    _check_unit,
)
from .edits import (
    ALBUMENTATIONS_OPS,
    Affine,
    Albumentation,
    Crop,
    EdgeEnhance,
    JpegQuality,
    OverlayImageBox,
    Pad,
    PasteIntoBox,
    RandomErasing,
    RandomResizedCrop,
    Smear,
)

__all__ = ["PaperCopyRecipe", "snap_angle"]

_AT_224 = 1.0 / 224.0


def _box(rng: np.random.Generator, size: tuple[int, int], scale: Range, ratio: Range) -> tuple[int, int, int, int]:
    """``(left, top, width, height)`` of a box drawn as torchvision's RandomResizedCrop draws one."""
    box = RandomResizedCrop.draw(rng, size, size, scale, ratio)
    return box.left, box.top, box.right - box.left, box.bottom - box.top


def _resized_crop(context, scale: Range, ratio: Range):
    """A random resized crop to the model input (a plain crop when the editor keeps the edited size)."""
    target = context.output_size
    box = RandomResizedCrop.draw(context.rng, context.size, target or (1, 1), scale, ratio, "bicubic")
    if target is None:
        return Crop(box.left, box.top, box.right, box.bottom)
    return box


# ---------------------------------------------------------------------- crop group


@dataclasses.dataclass(frozen=True)
class PaperResizedCropStep(Step):
    """torchvision RandomResizedCrop to the model input: area ``scale``, aspect w/h log-uniform in ``ratio``.

    In a one-of group ``p`` is the step's relative weight."""

    p: float = 1.0
    scale: Range = (0.25, 0.5)
    ratio: Range = (0.33, 3.0)
    name: ClassVar[str] = "random_resized_crop"

    def draw(self, context):
        return [_resized_crop(context, self.scale, self.ratio)]


@dataclasses.dataclass(frozen=True)
class OntoOtherImageStep(Step):
    """The copy pasted onto another image (the authors' ``OverlayImageOntoTheOther``).

    With probability ``crop_p`` the copy is first random-resized-cropped (``crop_scale``,
    ``crop_ratio``) to the model input; it is then resized to a box of area ``scale`` and aspect
    ``ratio`` of the other image (at the model input size) and blended in with ``opacity``."""

    p: float = 1.0
    crop_p: float = 0.5
    crop_scale: Range = (0.2, 1.0)
    crop_ratio: Range = (0.33, 3.0)
    scale: Range = (0.25, 0.5)
    ratio: Range = (0.33, 3.0)
    opacity: Range = (0.5, 1.0)
    name: ClassVar[str] = "onto_other_image"

    def __post_init__(self):
        super().__post_init__()
        _check_unit(self.name, "crop_p", self.crop_p)

    def draw(self, context):
        edits = []
        if context.rng.random() < self.crop_p:
            edits.append(_resized_crop(context, self.crop_scale, self.crop_ratio))
        canvas = context.output_size or context.size
        spec = context.image_spec((1.0, 1.0))
        left, top, width, height = _box(context.rng, canvas, self.scale, self.ratio)
        edits.append(PasteIntoBox(spec, canvas[0], canvas[1], left, top, height, width,
                                  opacity=context.uniform(self.opacity), resample="bicubic"))
        return edits


@dataclasses.dataclass(frozen=True)
class OtherImageOntoStep(Step):
    """Another image pasted onto the copy (the authors' ``OverlayTheOtherOntoImage``).

    With probability ``crop_p`` the copy is first random-resized-cropped (``crop_scale``,
    ``crop_ratio``) to the model input; the other image is then resized to a box of area ``scale``
    and aspect ``ratio`` of the copy and blended in with ``opacity``."""

    p: float = 1.0
    crop_p: float = 0.5
    crop_scale: Range = (0.3, 1.0)
    crop_ratio: Range = (0.33, 3.0)
    scale: Range = (0.3, 0.7)
    ratio: Range = (0.33, 3.0)
    opacity: Range = (0.0, 0.5)
    name: ClassVar[str] = "other_image_onto"

    def __post_init__(self):
        super().__post_init__()
        _check_unit(self.name, "crop_p", self.crop_p)

    def draw(self, context):
        edits, size = [], context.size
        if context.rng.random() < self.crop_p:
            crop = _resized_crop(context, self.crop_scale, self.crop_ratio)
            edits.append(crop)
            size = crop.output_size(size)
        spec = context.image_spec((0.3, 1.0))
        left, top, width, height = _box(context.rng, size, self.scale, self.ratio)
        rows, cols = size
        edits.append(OverlayImageBox(spec, x=left / cols, y=top / rows, width=width / cols, height=height / rows,
                                     opacity=context.uniform(self.opacity)))
        return edits


# ---------------------------------------------------------------------- geometric group


def snap_angle(angle: float, affinity: float = 22.5) -> float:
    """``angle`` (degrees) wrapped to [0, 360) and snapped to 0, 90, 180 or 270 when within ``affinity`` of it."""
    angle -= math.floor(angle / 360.0) * 360.0
    for target in (0.0, 90.0, 180.0, 270.0, 360.0):
        if abs(angle - target) <= affinity:
            return target % 360.0
    return angle


@dataclasses.dataclass(frozen=True)
class SnappedAffineStep(Step):
    """The authors' RandomAffine: angle uniform in ``degrees`` snapped by :func:`snap_angle` within
    ``rotation_affinity``, x shear uniform in ``shear`` (degrees), same output size, black fill.

    In a one-of group ``p`` is the step's relative weight."""

    p: float = 1.0
    degrees: Range = (0.0, 360.0)
    shear: Range = (-45.0, 45.0)
    rotation_affinity: float = 22.5
    name: ClassVar[str] = "affine"

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.rotation_affinity <= 45.0:
            raise ConfigError(f"recipe step {self.name}: rotation_affinity={self.rotation_affinity!r} outside [0, 45]")

    def draw(self, context):
        angle = snap_angle(context.uniform(self.degrees), self.rotation_affinity)
        return [Affine(angle=angle, shear=(context.uniform(self.shear), 0.0), fill=(0, 0, 0), resample="bicubic")]


@dataclasses.dataclass(frozen=True)
class BlackPerspectiveStep(PerspectiveStep):
    """torchvision RandomPerspective (distortion 0.5), black outside, bicubic.

    In a one-of group ``p`` is the step's relative weight."""

    p: float = 1.0
    distortion: float = 0.5

    def draw(self, context):
        return [dataclasses.replace(edit, fill=(0, 0, 0), resample="bicubic") for edit in super().draw(context)]


# ---------------------------------------------------------------------- appearance group


@dataclasses.dataclass(frozen=True)
class JpegChoiceStep(Step):
    """JPEG at one of ``qualities`` (AugLy ``OneOf(EncodingQuality(q))``)."""

    p: float = 0.25
    qualities: tuple[int, ...] = (10, 20, 30, 50)
    name: ClassVar[str] = "jpeg"

    def __post_init__(self):
        super().__post_init__()
        if not self.qualities or not all(isinstance(q, int) and 1 <= q <= 100 for q in self.qualities):
            raise ConfigError(f"recipe step {self.name}: qualities={self.qualities!r} must be integers in [1, 100]")

    def draw(self, context):
        return [JpegQuality(quality=self.qualities[int(context.rng.integers(len(self.qualities)))])]


@dataclasses.dataclass(frozen=True)
class EdgeEnhanceStep(Step):
    """PIL EDGE_ENHANCE or EDGE_ENHANCE_MORE, one of them uniformly."""

    p: float = 0.25
    name: ClassVar[str] = "edge_enhance"

    def draw(self, context):
        return [EdgeEnhance(more=bool(context.rng.integers(2)))]


@dataclasses.dataclass(frozen=True)
class SmearingStep(Step):
    """The authors' RandomSmearing: ``points`` random points in a box of area ``scale`` and aspect
    ``ratio``, a Bezier stroke through them of ``width`` (fraction of the shorter side, at least one
    pixel), random colour."""

    p: float = 0.25
    points: Range = (5, 50)
    width: Range = (1 * _AT_224, 5 * _AT_224)
    scale: Range = (0.08, 0.8)
    ratio: Range = (0.5, 2.0)
    name: ClassVar[str] = "smearing"

    def draw(self, context):
        rows, cols = context.size
        left, top, width, height = _box(context.rng, context.size, self.scale, self.ratio)
        count = max(2, context.integer(self.points))
        xs = context.rng.integers(left, left + width, size=count)
        ys = context.rng.integers(top, top + height, size=count)
        points = tuple((float(x) / cols, float(y) / rows) for x, y in zip(xs, ys))
        stroke = max(1, int(round(context.uniform(self.width) * min(rows, cols))))
        return [Smear(points=points, width=stroke, color=context.color())]


# ---------------------------------------------------------------------- additional group and post-process


@dataclasses.dataclass(frozen=True)
class AlbumentationsStep(Step):
    """One of ``ops`` (albumentations transform names), uniformly, at its default parameters."""

    p: float = 0.15
    ops: tuple[str, ...] = ALBUMENTATIONS_OPS
    name: ClassVar[str] = "additional"

    def __post_init__(self):
        super().__post_init__()
        unknown = [op for op in self.ops if op not in ALBUMENTATIONS_OPS]
        if not self.ops or unknown:
            raise ConfigError(f"recipe step {self.name}: ops={self.ops!r} must be a non-empty list of "
                              f"{list(ALBUMENTATIONS_OPS)}")

    def draw(self, context):
        return [Albumentation(op=self.ops[int(context.rng.integers(len(self.ops)))], seed=context.seed())]


@dataclasses.dataclass(frozen=True)
class PaddingStep(Step):
    """Pad every side by ``ratio`` of the width (left, right) and height (top, bottom), black."""

    p: float = 0.15
    ratio: float = 0.2
    name: ClassVar[str] = "padding"

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.ratio <= 10.0:
            raise ConfigError(f"recipe step {self.name}: ratio={self.ratio!r} outside [0, 10]")

    def draw(self, context):
        return [Pad(self.ratio, self.ratio, (0, 0, 0))]


@dataclasses.dataclass(frozen=True)
class NoiseErasingStep(Step):
    """torchvision RandomErasing(value="random"): area ``scale``, aspect h/w log-uniform in ``ratio``,
    ten tries (nothing erased when none fits), the box filled with random values."""

    p: float = 0.15
    scale: Range = (0.02, 0.33)
    ratio: Range = (0.3, 3.3)
    name: ClassVar[str] = "random_erasing"

    def draw(self, context):
        rows, cols = context.size
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            area = rows * cols * context.uniform(self.scale)
            aspect = math.exp(context.uniform(log_ratio))
            height, width = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if not (0 < height < rows and 0 < width < cols):
                continue
            top, left = int(context.rng.integers(0, rows - height + 1)), int(context.rng.integers(0, cols - width + 1))
            return [RandomErasing(x=left / cols, y=top / rows, width=width / cols, height=height / rows,
                                  noise_seed=context.seed())]
        return []


# ---------------------------------------------------------------------- the recipe


def _step(cls, **values):
    return dataclasses.field(default_factory=functools.partial(cls, **values))


#: Members of the one-of choices and of the shuffled appearance group (field names).
CROP_CHOICES = ("random_resized_crop", "onto_other_image", "other_image_onto")
LINEAR_CHOICES = ("perspective", "affine")
APPEARANCE = ("color_jitter", "pixelization", "shuffle_pixels", "jpeg", "grayscale", "blur", "overlay_text",
              "overlay_emoji", "edge_enhance", "smearing")
_GROUPS = ("crop", "geometric", "appearance", "additional")
_LAYOUT = "paper"


@dataclasses.dataclass(frozen=True)
class PaperCopyRecipe:
    """The authors' grouped recipe (module docstring): defaults are the descriptor's.

    ``crop_p`` and ``linear_p`` are the probabilities of the crop group and of the perspective /
    affine choice; within those one-of choices each member's ``p`` is its relative weight (all 1:
    uniform). Every other step applies with its own ``p``. Build the presets with
    :meth:`descriptor` / :meth:`matcher` (or ``CopyRecipe.paper_descriptor()`` /
    ``CopyRecipe.paper_matcher()``), change them with ``dataclasses.replace``, and store them with
    :meth:`to_dict` / :meth:`from_dict` (the dict carries ``"layout": "paper"``).
    """

    crop_p: float = 0.3
    random_resized_crop: PaperResizedCropStep = _step(PaperResizedCropStep)
    onto_other_image: OntoOtherImageStep = _step(OntoOtherImageStep)
    other_image_onto: OtherImageOntoStep = _step(OtherImageOntoStep)
    horizontal_flip: HorizontalFlipStep = _step(HorizontalFlipStep, p=0.5)
    vertical_flip: VerticalFlipStep = _step(VerticalFlipStep, p=0.1)
    linear_p: float = 0.25
    perspective: BlackPerspectiveStep = _step(BlackPerspectiveStep)
    affine: SnappedAffineStep = _step(SnappedAffineStep)
    color_jitter: ColorJitterStep = _step(ColorJitterStep, p=1.0, brightness=0.5, contrast=0.5, saturation=0.5,
                                          hue=0.1)
    pixelization: PixelizationStep = _step(PixelizationStep, p=0.15, ratio=(0.1, 1.0))
    shuffle_pixels: ShufflePixelsStep = _step(ShufflePixelsStep, p=0.15, factor=(0.1, 0.1))
    jpeg: JpegChoiceStep = _step(JpegChoiceStep, p=0.25)
    grayscale: GrayscaleStep = _step(GrayscaleStep, p=0.25)
    blur: BlurStep = _step(BlurStep, p=0.2, radius=(2 * _AT_224, 10 * _AT_224))
    overlay_text: OverlayTextStep = _step(OverlayTextStep, p=0.25, length=(1, 12), font_size=(0.1, 0.3),
                                          opacity=(0.1, 1.0))
    overlay_emoji: OverlayEmojiStep = _step(OverlayEmojiStep, p=0.25, size=(0.1, 0.5), opacity=(0.7, 1.0))
    edge_enhance: EdgeEnhanceStep = _step(EdgeEnhanceStep, p=0.25)
    smearing: SmearingStep = _step(SmearingStep, p=0.25)
    additional: AlbumentationsStep = _step(AlbumentationsStep, p=0.15)
    padding: PaddingStep = _step(PaddingStep, p=0.15)
    random_erasing: NoiseErasingStep = _step(NoiseErasingStep, p=0.15)

    def __post_init__(self):
        _check_unit("crop", "crop_p", self.crop_p)
        _check_unit("geometric", "linear_p", self.linear_p)
        for name in self._step_names():
            value = getattr(self, name)
            if not isinstance(value, Step) or value.name != name:
                raise ConfigError(f"recipe step {name} must be a {name} step, got {value!r}")
        for group, members in (("crop_p", CROP_CHOICES), ("linear_p", LINEAR_CHOICES)):
            if getattr(self, group) > 0 and not sum(getattr(self, m).p for m in members) > 0:
                raise ConfigError(f"recipe {group}={getattr(self, group)} but every member of {list(members)} has p 0")

    # ------------------------------------------------------------------ presets
    @classmethod
    def descriptor(cls) -> PaperCopyRecipe:
        """The authors' descriptor recipe (``descriptor_default_config.yaml``)."""
        return cls()

    @classmethod
    def matcher(cls) -> PaperCopyRecipe:
        """The authors' matcher recipe (``matching_default_config.yaml``): stronger and more frequent edits."""
        base = cls()
        replace = dataclasses.replace
        return replace(
            base,
            crop_p=0.5,
            random_resized_crop=replace(base.random_resized_crop, scale=(0.15, 0.5)),
            onto_other_image=replace(base.onto_other_image, scale=(0.15, 0.5)),
            other_image_onto=replace(base.other_image_onto, scale=(0.5, 0.8)),
            linear_p=0.35,
            color_jitter=replace(base.color_jitter, brightness=0.8, contrast=0.8, saturation=0.8, hue=0.2),
            pixelization=replace(base.pixelization, p=0.25),
            jpeg=replace(base.jpeg, p=0.35),
            overlay_text=replace(base.overlay_text, p=0.35),
            overlay_emoji=replace(base.overlay_emoji, p=0.35),
            edge_enhance=replace(base.edge_enhance, p=0.3),
            smearing=replace(base.smearing, p=0.3),
            padding=replace(base.padding, p=0.25),
            random_erasing=replace(base.random_erasing, p=0.25),
        )

    # ------------------------------------------------------------------ drawing
    @classmethod
    def _step_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("crop_p", "linear_p")]

    def steps(self) -> list[Step]:
        """Every step of the recipe (groups in their listed order; the application order is drawn per copy)."""
        return [getattr(self, name) for name in self._step_names()]

    def schedule(self, rng: np.random.Generator) -> tuple[list[tuple[Step, np.random.Generator]], list]:
        """The steps drawn for one copy, each with its own child generator: ``(before_resize, after_resize)``.

        The group order, the appearance order and the one-of choices come from one generator;
        each step's decision and parameters from its own, so that changing one step leaves the
        other steps' draws as they were.
        """
        names = self._step_names()
        order_rng, *children = rng.spawn(1 + len(names))
        child = dict(zip(names, children))

        def applied(name):
            step = getattr(self, name)
            return [(step, child[name])] if child[name].random() < step.p else []

        def one_of(probability, members):
            chosen = order_rng.random() < probability
            weights = np.array([getattr(self, m).p for m in members], dtype=np.float64)
            pick = members[int(order_rng.choice(len(members), p=weights / weights.sum()))] if weights.sum() > 0 else None
            return [(getattr(self, pick), child[pick])] if chosen and pick else []

        groups = {
            "crop": one_of(self.crop_p, CROP_CHOICES),
            "geometric": applied("horizontal_flip") + applied("vertical_flip") + one_of(self.linear_p, LINEAR_CHOICES),
            "appearance": [item for i in order_rng.permutation(len(APPEARANCE)) for item in applied(APPEARANCE[i])],
            "additional": applied("additional"),
        }
        before = [item for g in order_rng.permutation(len(_GROUPS)) for item in groups[_GROUPS[g]]]
        return before + applied("padding"), applied("random_erasing")

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"layout": "paper", "crop_p": ..., "linear_p": ..., step: {field: value}}``."""
        out: dict[str, Any] = {"layout": _LAYOUT, "crop_p": self.crop_p, "linear_p": self.linear_p}
        for name in self._step_names():
            values = dataclasses.asdict(getattr(self, name))
            out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        return out

    @staticmethod
    def describes(data: Any) -> bool:
        """Whether a recipe dict is a :class:`PaperCopyRecipe`'s (it has ``"layout": "paper"``)."""
        return isinstance(data, dict) and data.get("layout") == _LAYOUT

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaperCopyRecipe:
        """Rebuild from :meth:`to_dict` output; missing steps and fields keep the descriptor's values.

        Raises :class:`ConfigError` naming an unknown step or field, or an invalid value.
        """
        if not cls.describes(data):
            raise ConfigError('a paper copy recipe must be a mapping with "layout": "paper"')
        base, values = cls(), {}
        names = cls._step_names()
        for key, value in data.items():
            if key == "layout":
                continue
            if key in ("crop_p", "linear_p"):
                values[key] = value
                continue
            if key not in names:
                raise ConfigError(f"unknown recipe step {key!r}; known steps: {sorted(names)}")
            if not isinstance(value, dict):
                raise ConfigError(f"recipe step {key} must be a mapping of fields, got {value!r}")
            step = getattr(base, key)
            known = {f.name for f in dataclasses.fields(step)}
            for field_name in value:
                if field_name not in known:
                    raise ConfigError(f"unknown field {key}.{field_name}; known fields: {sorted(known)}")
            values[key] = dataclasses.replace(step, **value)
        return dataclasses.replace(base, **values)
