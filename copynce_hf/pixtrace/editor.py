"""Random copy edits with traced tables: the paper's training augmentation, as a declarative recipe.

Paper, supplementary table "All detailed settings in our training pipeline": queries are
made with colour jitter, random greyscale, random blur, overlay text, overlay emoji,
random flipping, affine, perspective, random resized crop, overlay image, random erasing,
"etc."; references are only resized (fine-tuning table). :class:`CopyRecipe` holds, for
each of these steps (plus pasting onto another image, padding, stripes, JPEG,
pixelisation, pixel shuffling and noise), the probability of applying it and the ranges its
parameters are drawn from. :class:`CopyEditor` draws a chain of explicit edits from a
recipe with a seeded generator, applies them while updating the coordinate table, and
returns the edited image, its table to the input image and the list of edits drawn, from
which :func:`replay` rebuilds the same image and table exactly.

Example::

    editor = CopyEditor(seed=0, recipe=CopyRecipe.training(), output_size=(224, 224))
    result = editor(image)                          # result.image, result.table, result.recipe
    same = replay(image, result.recipe)  # identical pixels and table

By default the editor renders with fused geometry (one resampling per run of geometric edits,
:mod:`copynce_hf.pixtrace.fused`); ``CopyEditor(..., fuse=False)`` applies the edits one by one,
the reference it is tested against (same tables bit for bit, pixels equal up to resampling).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import string
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from ..errors import ConfigError, EditParameterError
from ..images import load_image, to_rgb
from .edits import (
    Affine,
    Blur,
    ColorJitter,
    Crop,
    Edit,
    Grayscale,
    HorizontalFlip,
    JpegQuality,
    Noise,
    OverlayEmoji,
    OverlayImage,
    OverlayOntoBackground,
    OverlayStripes,
    OverlayText,
    Pad,
    Perspective,
    Pixelization,
    RandomErasing,
    RandomResizedCrop,
    Resize,
    ShufflePixels,
    VerticalFlip,
    edit_from_dict,
    emoji_names,
    font_characters,
)
from .fused import render_fused
from .table import CoordinateTable

__all__ = ["CopyRecipe", "CopyEditor", "CopyResult", "replay"]

Range = tuple[float, float]
_SEED_HIGH = 2**31 - 1


# ---------------------------------------------------------------------- drawing context


@dataclasses.dataclass
class _Context:
    """What a step may look at while drawing: the generator, the current size, the image pool."""

    rng: np.random.Generator
    size: tuple[int, int]
    image_pool: tuple[str, ...]
    output_size: tuple[int, int] | None = None

    def uniform(self, bounds: Range) -> float:
        return float(self.rng.uniform(bounds[0], bounds[1]))

    def integer(self, bounds: Range) -> int:
        return int(self.rng.integers(int(bounds[0]), int(bounds[1]) + 1))

    def color(self) -> tuple[int, int, int]:
        return tuple(int(c) for c in self.rng.integers(0, 256, size=3))

    def seed(self) -> int:
        return int(self.rng.integers(0, _SEED_HIGH))

    def image_spec(self, scale: Range) -> dict[str, Any]:
        """Another image: a file of the pool if there is one, else a procedural image.

        Procedural images get a side drawn as ``scale`` times the current image's side, so
        recipes stay JSON-serialisable and replayable without files.
        """
        if self.image_pool:
            return {"kind": "file", "path": self.image_pool[int(self.rng.integers(len(self.image_pool)))]}
        kind = ("noise", "gradient")[int(self.rng.integers(2))]
        factor = self.uniform(scale)
        height, width = self.size
        size = [max(16, int(round(height * factor))), max(16, int(round(width * factor)))]
        return {"kind": kind, "seed": self.seed(), "size": size}


# ---------------------------------------------------------------------- recipe steps


@dataclasses.dataclass(frozen=True)
class Step:
    """One entry of a recipe: apply with probability ``p``, parameters drawn from the ranges.

    Fields that are pairs are closed ranges ``(low, high)`` drawn uniformly unless said otherwise.
    """

    p: float = 0.0
    name: ClassVar[str] = "step"

    def __post_init__(self):
        _check_unit(self.name, "p", self.p)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, field.name, value)
            if field.type in ("Range", Range):
                _check_range_pair(self.name, field.name, value)

    def draw(self, context: _Context) -> list[Edit]:
        """The edits of this step for the current image (the caller has already decided to apply it)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class RandomResizedCropStep(Step):
    """Crop with torchvision's RandomResizedCrop draw: area fraction in ``scale``, aspect w/h
    log-uniform in ``ratio``. The resize to the model input is the editor's final resize."""

    p: float = 0.8
    scale: Range = (0.25, 1.0)
    ratio: Range = (3 / 4, 4 / 3)
    name: ClassVar[str] = "random_resized_crop"

    def draw(self, context):
        box = RandomResizedCrop.draw(context.rng, context.size, (1, 1), self.scale, self.ratio)
        return [Crop(box.left, box.top, box.right, box.bottom)]


@dataclasses.dataclass(frozen=True)
class HorizontalFlipStep(Step):
    p: float = 0.5
    name: ClassVar[str] = "horizontal_flip"

    def draw(self, context):
        return [HorizontalFlip()]


@dataclasses.dataclass(frozen=True)
class VerticalFlipStep(Step):
    p: float = 0.05
    name: ClassVar[str] = "vertical_flip"

    def draw(self, context):
        return [VerticalFlip()]


@dataclasses.dataclass(frozen=True)
class AffineStep(Step):
    """torchvision RandomAffine: angle in ``degrees``, translation up to ``translate`` of each
    side, isotropic ``scale``, x shear in ``shear`` (degrees)."""

    p: float = 0.25
    degrees: Range = (-30.0, 30.0)
    translate: float = 0.1
    scale: Range = (0.8, 1.2)
    shear: Range = (-10.0, 10.0)
    name: ClassVar[str] = "affine"

    def __post_init__(self):
        super().__post_init__()
        _check_unit(self.name, "translate", self.translate)

    def draw(self, context):
        height, width = context.size
        shift = (self.translate * width * context.uniform((-1, 1)), self.translate * height * context.uniform((-1, 1)))
        return [
            Affine(
                angle=context.uniform(self.degrees),
                translate=shift,
                scale=context.uniform(self.scale),
                shear=(context.uniform(self.shear), 0.0),
                fill=context.color(),
            )
        ]


@dataclasses.dataclass(frozen=True)
class PerspectiveStep(Step):
    """torchvision RandomPerspective: each corner moves inwards by up to ``distortion`` of half a side."""

    p: float = 0.25
    distortion: float = 0.3
    name: ClassVar[str] = "perspective"

    def __post_init__(self):
        super().__post_init__()
        _check_range(self.name, "distortion", self.distortion, 0.0, 0.95)

    def draw(self, context):
        height, width = context.size
        dx, dy = self.distortion * (width - 1) / 2, self.distortion * (height - 1) / 2
        right, bottom = width - 1.0, height - 1.0
        start = ((0.0, 0.0), (right, 0.0), (right, bottom), (0.0, bottom))
        signs = ((1, 1), (-1, 1), (-1, -1), (1, -1))  # inwards from each corner
        end = tuple(
            (x + sx * context.uniform((0, dx)), y + sy * context.uniform((0, dy)))
            for (x, y), (sx, sy) in zip(start, signs)
        )
        return [Perspective(start, end, fill=context.color())]


@dataclasses.dataclass(frozen=True)
class ColorJitterStep(Step):
    """torchvision ColorJitter: factors in ``[1 - b, 1 + b]`` etc., hue shift in ``[-hue, hue]``."""

    p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    name: ClassVar[str] = "color_jitter"

    def __post_init__(self):
        super().__post_init__()
        for key in ("brightness", "contrast", "saturation"):
            _check_range(self.name, key, getattr(self, key), 0.0, 1.0)
        _check_range(self.name, "hue", self.hue, 0.0, 0.5)

    def draw(self, context):
        def factor(spread):
            return context.uniform((1 - spread, 1 + spread))

        return [ColorJitter(factor(self.brightness), factor(self.contrast), factor(self.saturation),
                            context.uniform((-self.hue, self.hue)))]


@dataclasses.dataclass(frozen=True)
class GrayscaleStep(Step):
    p: float = 0.2
    name: ClassVar[str] = "grayscale"

    def draw(self, context):
        return [Grayscale()]


@dataclasses.dataclass(frozen=True)
class BlurStep(Step):
    """Gaussian blur; ``radius`` is a fraction of the shorter side (0.004 = 2 px at 500 px)."""

    p: float = 0.3
    radius: Range = (0.0005, 0.006)
    name: ClassVar[str] = "blur"

    def draw(self, context):
        return [Blur(radius=context.uniform(self.radius) * min(context.size))]


@dataclasses.dataclass(frozen=True)
class OntoBackgroundStep(Step):
    """Paste the copy onto another image ("overlay image onto another"): the copy's height is
    ``overlay_size`` of the background's; procedural backgrounds are ``background_scale``
    times the current size."""

    p: float = 0.15
    overlay_size: Range = (0.4, 0.9)
    background_scale: Range = (1.0, 1.6)
    name: ClassVar[str] = "onto_background"

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


@dataclasses.dataclass(frozen=True)
class PadStep(Step):
    """Pad by fractions of the width and height in ``fraction`` on each side, random colour."""

    p: float = 0.1
    fraction: Range = (0.02, 0.2)
    name: ClassVar[str] = "pad"

    def draw(self, context):
        return [Pad(context.uniform(self.fraction), context.uniform(self.fraction), context.color())]


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


@dataclasses.dataclass(frozen=True)
class OverlayTextStep(Step):
    """A random string of ``length`` characters in one of ``fonts`` (AugLy's bundled fonts),
    ``font_size`` as a fraction of the shorter side, random colour, ``opacity``."""

    p: float = 0.3
    length: Range = (3, 14)
    font_size: Range = (0.06, 0.2)
    opacity: Range = (0.6, 1.0)
    fonts: tuple[str, ...] = _DEFAULT_FONTS
    name: ClassVar[str] = "overlay_text"

    def __post_init__(self):
        super().__post_init__()
        if not self.fonts or not all(isinstance(f, str) for f in self.fonts):
            raise ConfigError(f"recipe step {self.name}: fonts={self.fonts!r} must be a non-empty list of font files")
        for font in self.fonts:
            try:
                OverlayText(font=font)
            except EditParameterError as error:
                raise ConfigError(f"recipe step {self.name}: fonts entry {font!r} is not a font file") from error

    def draw(self, context):
        font = self.fonts[int(context.rng.integers(len(self.fonts)))]
        try:
            drawable = font_characters(font)
        except EditParameterError:  # a user's font without AugLy's character listing
            drawable = _TEXT_ALPHABET
        alphabet = [c for c in _TEXT_ALPHABET if c == " " or c in drawable] or list("copy")
        length = context.integer(self.length)
        text = "".join(alphabet[i] for i in context.rng.integers(len(alphabet), size=length)).strip() or "copy"
        return [OverlayText(text=text, font=font, font_size=context.uniform(self.font_size), color=context.color(),
                            x=context.uniform((0.0, 0.7)), y=context.uniform((0.0, 0.85)),
                            opacity=context.uniform(self.opacity))]


@dataclasses.dataclass(frozen=True)
class OverlayEmojiStep(Step):
    """One of AugLy's emoji, ``size`` as a fraction of the height, ``opacity``, anywhere."""

    p: float = 0.3
    size: Range = (0.1, 0.35)
    opacity: Range = (0.6, 1.0)
    name: ClassVar[str] = "overlay_emoji"

    def draw(self, context):
        names = emoji_names()
        return [OverlayEmoji(emoji=names[int(context.rng.integers(len(names)))], size=context.uniform(self.size),
                             x=context.uniform((0.0, 0.9)), y=context.uniform((0.0, 0.9)),
                             opacity=context.uniform(self.opacity))]


@dataclasses.dataclass(frozen=True)
class OverlayImageStep(Step):
    """Paste another image onto the copy ("another image onto it"): height ``size`` of the
    copy's, ``opacity``; procedural overlays are ``overlay_scale`` times the current size."""

    p: float = 0.15
    size: Range = (0.15, 0.45)
    opacity: Range = (0.6, 1.0)
    overlay_scale: Range = (0.2, 0.6)
    name: ClassVar[str] = "overlay_image"

    def draw(self, context):
        return [OverlayImage(overlay=context.image_spec(self.overlay_scale), size=context.uniform(self.size),
                             x=context.uniform((0.0, 0.85)), y=context.uniform((0.0, 0.85)),
                             opacity=context.uniform(self.opacity))]


@dataclasses.dataclass(frozen=True)
class OverlayStripesStep(Step):
    """AugLy stripes: ``line_width``, ``line_density``, any angle, solid/dotted/dashed, ``opacity``."""

    p: float = 0.05
    line_width: Range = (0.1, 0.4)
    line_density: Range = (0.3, 0.8)
    opacity: Range = (0.5, 1.0)
    name: ClassVar[str] = "overlay_stripes"

    def draw(self, context):
        line_type = ("solid", "dotted", "dashed")[int(context.rng.integers(3))]
        return [OverlayStripes(line_width=context.uniform(self.line_width), line_color=context.color(),
                               line_angle=context.uniform((-90.0, 90.0)), line_density=context.uniform(self.line_density),
                               line_type=line_type, line_opacity=context.uniform(self.opacity))]


@dataclasses.dataclass(frozen=True)
class RandomErasingStep(Step):
    """torchvision RandomErasing: a box of area fraction ``scale`` and aspect h/w log-uniform in
    ``ratio`` filled with a random colour."""

    p: float = 0.25
    scale: Range = (0.02, 0.15)
    ratio: Range = (0.3, 3.3)
    name: ClassVar[str] = "random_erasing"

    def draw(self, context):
        height, width = context.size
        area = context.uniform(self.scale) * height * width
        aspect = math.exp(context.uniform((math.log(self.ratio[0]), math.log(self.ratio[1]))))
        box_w = min(1.0, math.sqrt(area / aspect) / width)
        box_h = min(1.0, math.sqrt(area * aspect) / height)
        return [RandomErasing(x=context.uniform((0.0, 1.0 - box_w)), y=context.uniform((0.0, 1.0 - box_h)),
                              width=box_w, height=box_h, fill=context.color())]


@dataclasses.dataclass(frozen=True)
class JpegStep(Step):
    p: float = 0.3
    quality: Range = (20, 90)
    name: ClassVar[str] = "jpeg"

    def draw(self, context):
        return [JpegQuality(quality=context.integer(self.quality))]


@dataclasses.dataclass(frozen=True)
class PixelizationStep(Step):
    p: float = 0.1
    ratio: Range = (0.2, 0.6)
    name: ClassVar[str] = "pixelization"

    def draw(self, context):
        return [Pixelization(ratio=context.uniform(self.ratio))]


@dataclasses.dataclass(frozen=True)
class ShufflePixelsStep(Step):
    p: float = 0.05
    factor: Range = (0.01, 0.1)
    name: ClassVar[str] = "shuffle_pixels"

    def draw(self, context):
        return [ShufflePixels(factor=context.uniform(self.factor), seed=context.seed())]


@dataclasses.dataclass(frozen=True)
class NoiseStep(Step):
    """Gaussian noise, ``std`` as a fraction of the 0..255 range."""

    p: float = 0.1
    std: Range = (0.01, 0.06)
    name: ClassVar[str] = "noise"

    def draw(self, context):
        return [Noise(std=context.uniform(self.std), seed=context.seed())]


# ---------------------------------------------------------------------- the recipe


@dataclasses.dataclass(frozen=True)
class CopyRecipe:
    """Probabilities and parameter ranges of the random copy edits, applied in field order.

    Geometric steps come first (crop, flips, affine, perspective), then colour, then the
    copy is pasted onto another image or padded, then overlays hide parts of it, and
    compression-like degradations come last. The defaults are :meth:`training`. Change a
    step with ``dataclasses.replace``, e.g.
    ``replace(recipe, blur=BlurStep(p=0.5))``, or edit the dict of :meth:`to_dict` and
    call :meth:`from_dict`.
    """

    random_resized_crop: RandomResizedCropStep = dataclasses.field(default_factory=RandomResizedCropStep)
    horizontal_flip: HorizontalFlipStep = dataclasses.field(default_factory=HorizontalFlipStep)
    vertical_flip: VerticalFlipStep = dataclasses.field(default_factory=VerticalFlipStep)
    affine: AffineStep = dataclasses.field(default_factory=AffineStep)
    perspective: PerspectiveStep = dataclasses.field(default_factory=PerspectiveStep)
    color_jitter: ColorJitterStep = dataclasses.field(default_factory=ColorJitterStep)
    grayscale: GrayscaleStep = dataclasses.field(default_factory=GrayscaleStep)
    blur: BlurStep = dataclasses.field(default_factory=BlurStep)
    onto_background: OntoBackgroundStep = dataclasses.field(default_factory=OntoBackgroundStep)
    pad: PadStep = dataclasses.field(default_factory=PadStep)
    overlay_text: OverlayTextStep = dataclasses.field(default_factory=OverlayTextStep)
    overlay_emoji: OverlayEmojiStep = dataclasses.field(default_factory=OverlayEmojiStep)
    overlay_image: OverlayImageStep = dataclasses.field(default_factory=OverlayImageStep)
    overlay_stripes: OverlayStripesStep = dataclasses.field(default_factory=OverlayStripesStep)
    random_erasing: RandomErasingStep = dataclasses.field(default_factory=RandomErasingStep)
    jpeg: JpegStep = dataclasses.field(default_factory=JpegStep)
    pixelization: PixelizationStep = dataclasses.field(default_factory=PixelizationStep)
    shuffle_pixels: ShufflePixelsStep = dataclasses.field(default_factory=ShufflePixelsStep)
    noise: NoiseStep = dataclasses.field(default_factory=NoiseStep)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, Step) or value.name != field.name:
                raise ConfigError(f"recipe step {field.name} must be a {field.name} step, got {value!r}")

    @classmethod
    def training(cls) -> CopyRecipe:
        """The heavy default for training queries (the paper's augmentation list, with ranges
        in the spirit of torchvision's and AugLy's defaults)."""
        return cls()

    @classmethod
    def light(cls) -> CopyRecipe:
        """No random edit: with the editor's ``output_size`` only the resize remains (the paper's
        references and fine-tuning input)."""
        return cls.off()

    @classmethod
    def off(cls) -> CopyRecipe:
        """Every step with probability 0."""
        return cls(**{f.name: dataclasses.replace(getattr(cls(), f.name), p=0.0) for f in dataclasses.fields(cls)})

    @classmethod
    def paper_descriptor(cls):
        """The authors' training recipe of the descriptor: shuffled groups of edits, then a post-process.

        Returns a :class:`~copynce_hf.pixtrace.paper_recipe.PaperCopyRecipe` (see there for its
        structure, values and the rule for partly transparent pastes).
        """
        from .paper_recipe import PaperCopyRecipe

        return PaperCopyRecipe.descriptor()

    @classmethod
    def paper_matcher(cls):
        """The authors' training recipe of the matcher (heavier than the descriptor's); see
        :meth:`paper_descriptor`."""
        from .paper_recipe import PaperCopyRecipe

        return PaperCopyRecipe.matcher()

    def steps(self) -> list[Step]:
        """The steps in application order."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def schedule(self, rng: np.random.Generator) -> tuple[list[tuple[Step, np.random.Generator]], list]:
        """The steps drawn for one copy, each with its own generator: ``(before_resize, after_resize)``.

        Every step draws from its own child generator, so that changing one step's probability
        or ranges leaves the draws of every other step as they were. All steps come before the
        editor's final resize.
        """
        steps = self.steps()
        return [(step, child) for step, child in zip(steps, rng.spawn(len(steps))) if child.random() < step.p], []

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """JSON-serialisable ``{step: {field: value}}`` (ranges as two-element lists)."""
        return {
            f.name: {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(getattr(self, f.name)).items()}
            for f in dataclasses.fields(self)
        }

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, Any]]) -> CopyRecipe:
        """Rebuild from :meth:`to_dict` output; missing steps and fields keep the training defaults.

        Raises :class:`ConfigError` naming an unknown step or field, or an invalid value.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"a copy recipe must be a mapping of steps, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        steps = {}
        for step_name, values in data.items():
            if step_name not in fields:
                raise ConfigError(f"unknown recipe step {step_name!r}; known steps: {sorted(fields)}")
            step_cls = type(fields[step_name].default_factory())
            known = {f.name for f in dataclasses.fields(step_cls)}
            if not isinstance(values, dict):
                raise ConfigError(f"recipe step {step_name} must be a mapping of fields, got {values!r}")
            for key in values:
                if key not in known:
                    raise ConfigError(f"unknown field {step_name}.{key}; known fields: {sorted(known)}")
            steps[step_name] = step_cls(**values)
        return cls(**steps)


# ---------------------------------------------------------------------- the editor


@dataclasses.dataclass
class CopyResult:
    """An edited copy: ``image`` (PIL RGB), ``table`` (CoordinateTable from ``image`` to the input
    image) and ``recipe`` (JSON-serialisable list of ``Edit.to_dict()``, replayable with :func:`replay`)."""

    image: Image.Image
    table: CoordinateTable
    recipe: list[dict[str, Any]]


class CopyEditor:
    """Draws and applies a random chain of traced copy edits.

    Args:
        seed: seed of the editor's generator; the same seed and the same sequence of calls
            give the same edits. ``None`` draws fresh entropy.
        recipe: a :class:`CopyRecipe`, a :class:`~copynce_hf.pixtrace.paper_recipe.PaperCopyRecipe`
            (:meth:`CopyRecipe.paper_descriptor`, :meth:`CopyRecipe.paper_matcher`) or the dict of
            either; default :meth:`CopyRecipe.training`.
        output_size: ``(height, width)``: end every chain with a resize to this size (the
            model input), recorded in the recipe; ``None`` keeps the edited size.
        image_pool: paths of images used as backgrounds and overlays ("onto another",
            "another onto it"); without one, procedural noise and gradient images are used.
        fuse: render each run of consecutive geometric edits with one resampling through the
            run's composed map, at the resolution the rest of the chain needs (see
            :mod:`copynce_hf.pixtrace.fused`); the tables are bit-identical to ``fuse=False``,
            which applies the edits one by one (the reference; several times slower).

    ``editor(image)`` draws from the editor's own generator; ``editor(image, seed=k)`` draws
    from a generator seeded by ``(k, seed)`` only, so that item ``k`` of a dataset gets the
    same copy whatever was drawn before (``k`` may be an int or a tuple of ints, e.g.
    ``(epoch, index)``).
    """

    def __init__(
        self,
        seed: int | None = None,
        recipe: CopyRecipe | dict | None = None,
        output_size: tuple[int, int] | None = None,
        image_pool: Sequence[str | os.PathLike] | None = None,
        fuse: bool = True,
    ):
        if seed is not None:
            _check_seed(seed, "seed")
        from .paper_recipe import PaperCopyRecipe

        if recipe is None:
            recipe = CopyRecipe.training()
        elif isinstance(recipe, dict):
            recipe = PaperCopyRecipe.from_dict(recipe) if PaperCopyRecipe.describes(recipe) else CopyRecipe.from_dict(recipe)
        elif not isinstance(recipe, (CopyRecipe, PaperCopyRecipe)):
            raise ConfigError(f"recipe must be a CopyRecipe, a PaperCopyRecipe or its dict, got {type(recipe).__name__}")
        if output_size is not None:
            try:
                output_size = tuple(int(v) for v in output_size)
            except (TypeError, ValueError) as error:
                raise ConfigError(f"output_size must be (height, width), got {output_size!r}") from error
            if len(output_size) != 2 or min(output_size) < 1:
                raise ConfigError(f"output_size must be two positive integers, got {output_size!r}")
        pool = tuple(str(path) for path in (image_pool or ()))
        for path in pool:
            if not os.path.isfile(path):
                raise ConfigError(f"image_pool entry {path!r} is not a file")
        self.seed = seed
        self.recipe = recipe
        self.output_size = output_size
        self.image_pool = pool
        self.fuse = bool(fuse)
        self._rng = np.random.default_rng(seed)

    def __call__(self, image: Image.Image | str | os.PathLike, seed: int | Sequence[int] | None = None) -> CopyResult:
        """Edit ``image`` (PIL image of any mode, or a path) with a freshly drawn chain."""
        image = _as_rgb(image)
        edits = self.draw((image.height, image.width), seed)
        if self.fuse:  # the chain is rendered in one go
            image, table = render_fused(image, edits)
        else:
            table = CoordinateTable.identity(image.height, image.width)
            for edit in edits:
                expected = edit.output_size(table.size) if edit.kind == "geometric" else table.size
                image, table = edit(image, table)
                if table.size != expected:  # the chain was drawn on predicted sizes
                    raise AssertionError(f"{edit.name} produced {table.size}, its output_size says {expected}")
        return CopyResult(image, table, [edit.to_dict() for edit in edits])

    def draw(self, size: tuple[int, int], seed: int | Sequence[int] | None = None) -> list[Edit]:
        """The chain of edits that ``editor(image, seed)`` applies to an image of ``(height, width)``
        ``size``, drawn without any pixel work (the same draws as the call itself).

        Steps look only at the size of the image so far, which each geometric edit predicts.
        """
        if seed is None:
            rng = self._rng
        else:
            key = [seed] if isinstance(seed, (int, np.integer)) else list(seed)
            for value in key:
                _check_seed(value, "per-call seed")
            rng = np.random.default_rng(key + ([self.seed] if self.seed is not None else []))
        size, edits = (int(size[0]), int(size[1])), []
        for step in self._schedule(rng):
            for edit in self._draw_step(step, size):
                if edit.kind == "geometric":
                    size = edit.output_size(size)
                edits.append(edit)
        return edits

    def _schedule(self, rng: np.random.Generator) -> list[tuple[Step, np.random.Generator] | None]:
        """The steps drawn for one copy with their child generators (see ``CopyRecipe.schedule``),
        ``None`` marking the editor's resize to the model input between the recipe's two parts."""
        before_resize, after_resize = self.recipe.schedule(rng)
        return before_resize + ([] if self.output_size is None else [None]) + after_resize

    def _draw_step(self, step: tuple[Step, np.random.Generator] | None, size: tuple[int, int]) -> list[Edit]:
        """The edits of one scheduled step for an image of (H, W) ``size``: steps look only at the
        current size, so sizes predicted from the edits draw what applied edits draw."""
        if step is None:
            return [Resize(*self.output_size)]
        recipe_step, step_rng = step
        return recipe_step.draw(_Context(step_rng, size, self.image_pool, self.output_size))

    def __repr__(self) -> str:
        active = [step.name for step in self.recipe.steps() if step.p > 0]
        return f"CopyEditor(seed={self.seed}, output_size={self.output_size}, fuse={self.fuse}, steps={active})"


def replay(image: Image.Image | str | os.PathLike, recipe: Sequence[dict[str, Any]], fuse: bool = True) -> CopyResult:
    """Apply a recorded list of edits (``CopyResult.recipe``) to ``image``: same image, same table.

    ``fuse`` must be the editor's to reproduce its pixels exactly: ``True`` (the default of both)
    renders with :func:`~copynce_hf.pixtrace.fused.render_fused`, ``False`` applies the edits one
    by one. The table is the same either way.
    """
    image = _as_rgb(image)
    if fuse:
        edits = [edit_from_dict(description) for description in recipe]
        image, table = render_fused(image, edits)
        return CopyResult(image, table, [dict(d) for d in recipe])
    table = CoordinateTable.identity(image.height, image.width)
    for description in recipe:
        image, table = edit_from_dict(description)(image, table)
    return CopyResult(image, table, [dict(d) for d in recipe])


# ---------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=4096)
def _displayed_size(path: str) -> tuple[int, int]:
    """(H, W) of an image file as :func:`load_image` returns it (EXIF rotations swap the sides)."""
    with Image.open(path) as handle:
        width, height = handle.size
        orientation = handle.getexif().get(0x0112, 1)
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def _as_rgb(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return to_rgb(image)
    return load_image(image)


def _check_seed(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")


def _is_pair(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2


def _check_unit(step: str, key: str, value) -> None:
    _check_range(step, key, value, 0.0, 1.0)


def _check_range(step: str, key: str, value, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"recipe step {step}: {key}={value!r} must be a finite number")
    if not low <= value <= high:
        raise ConfigError(f"recipe step {step}: {key}={value!r} outside [{low}, {high}]")


def _check_range_pair(step: str, key: str, value) -> None:
    if not _is_pair(value) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    ):
        raise ConfigError(f"recipe step {step}: {key}={value!r} must be a range [low, high] of two numbers")
    if value[0] > value[1]:
        raise ConfigError(f"recipe step {step}: {key}={value!r} has low > high")
