"""One copy recipe type; training, paper, demo, mini-DISC and calibration recipes are presets of it.

A :class:`CopyRecipe` is data: named steps of the step vocabulary (:mod:`.steps`) and the
order they are scheduled in,

* ``before_resize`` and ``after_resize``: schedule nodes on either side of the editor's resize to
  the model input. A node is a step name (applied with its ``p``; a :class:`~.steps.OneOf` or
  :class:`~.steps.SomeOf` name schedules its chosen members there), a :class:`Group` (its nodes in
  order) or a :class:`Shuffled` (its nodes in a random order);
* ``shared_generator``: every draw from the copy's one generator (the evaluation queries), or, by
  default, each drawing step from its own child generator, so that changing one step's
  probability or ranges leaves the draws of every other step as they were (the random order and
  the choices then come from one more child, spawned first);
* ``max_side``: finally shrink the copy so that its longer side is at most this many pixels;
* ``resample``: the interpolation of the editor's resize to the model input (``bilinear`` by default,
  ``bicubic`` in the paper presets, as the authors' final ``Resize``);
* ``fused``: how a :class:`~.editor.CopyEditor` renders the recipe's copies by default: ``True``
  (the package's recipes) with fused geometry (:mod:`.fused`: one bilinear, antialiased
  resampling per run of geometric edits, whatever each edit's ``resample``), ``False`` (the paper
  presets and :meth:`CopyRecipe.off`) edit by edit, each geometric edit resampled with its own
  ``resample`` (the authors': bicubic at every edit).

Presets, as SSCD's ``settings.py`` names presets of one pipeline (:data:`PRESETS`):

* :meth:`CopyRecipe.training`: the package's training augmentation (paper, supplementary table
  "All detailed settings in our training pipeline": colour jitter, greyscale, blur, text, emoji,
  flips, affine, perspective, random resized crop, overlay image, random erasing, "etc."; plus
  pasting onto another image, padding, stripes, JPEG, pixelisation, pixel shuffling and noise);
* :meth:`CopyRecipe.training_everyday`: the training augmentation widened with the edit families users meet
  that it lacks (rotation, skew, aspect change, solarisation, posterisation, edge enhancement, sharpening, a small
  paste, a meme band), each on a minority of the copies, with ranges and words no evaluation or calibration recipe
  uses;
* :meth:`CopyRecipe.off`: no random edit (with the editor's output size only the resize remains:
  the paper's references and fine-tuning input), a bicubic resize as the image processor's and the
  authors' ``basic_transform``;
* :meth:`CopyRecipe.light_copy`: a few mild edits (a crop of half the area or more, a flip, a small colour
  change, a slight blur, a small caption or emoji, JPEG): the other side of a copy-to-copy training pair,
  two edited copies of one original (beyond the paper, whose references are never edited);
* :meth:`CopyRecipe.paper_descriptor` / :meth:`CopyRecipe.paper_matcher`: the CopyNCE authors'
  recipes (their ``lyakaap`` recipe, values of ``descriptor_default_config.yaml`` and
  ``matching_default_config.yaml``): four groups in a random order per copy (crop: one of a
  random resized crop to the model input, the copy pasted onto another image, another image
  pasted onto it; geometric: flips then one of perspective or a snapped affine; appearance: ten
  edits in a random order; additional: one albumentations operation), padding, the resize, then
  random erasing. A partly transparent paste keeps a pixel traced where the copy's weight is at
  least one half (:mod:`.edits.compositing`); rendered edit by edit with bicubic resampling at every
  geometric edit and at the final resize, as theirs (``fused=False``, ``resample="bicubic"``). Where
  their code does what their configuration does not say, the presets follow the code: text on
  ``1 - p`` of the copies (``p_means="skip"``), blur radius (0-10) and smearing width (1-5) in
  pixels of the image each runs on (``units="pixels"``), pixels under text, emoji, smearing and
  erased boxes keeping their trace (``covered="mapped"``, their ``MaskMapper``), erased values
  unclipped in the model input (``values="unclipped"``), pixel shuffling with AugLy's fixed seed 10;
* :meth:`CopyRecipe.demo_queries` / :meth:`CopyRecipe.minidisc_queries`: DISC21-style evaluation
  queries (paper, section "Experiments" and supplementary "Evaluation Protocols"): one or two
  structural families (applied in the order listed), one or two photometric ones (in the order
  drawn), then a downscale to a web-sized query; all from one generator, so that a task is the
  same on every machine (the mini-DISC fingerprint pins it);
* :meth:`CopyRecipe.calibration_copies`: the copies the calibrations plant (``copynce calibrate``'s and
  ``copynce dedup``'s self-calibration, :mod:`copynce_hf.calibration`), built like the evaluation queries (one or
  two structural edits, one or two photometric ones, one generator, a web-sized copy) from everyday edit families
  with ranges of their own: no benchmark and no training recipe draws it, so that a threshold calibrated on its
  copies is checked on copies of other recipes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ..modeling.errors import ConfigError
from .edits import Edit, Resize, Scale
from .edits.params import RESAMPLE
from .steps import (
    ALL_FONTS,
    DEMO_WORDS,
    STEP_TYPES,
    TRAINING_MEME_WORDS,
    AffineStep,
    AlbumentationsStep,
    AspectRatioStep,
    BlurStep,
    BrightnessStep,
    ColorJitterStep,
    ContrastStep,
    DrawContext,
    EdgeEnhanceStep,
    GrayscaleStep,
    HeavyCropOverlaysStep,
    HorizontalFlipStep,
    JpegStep,
    MemeFormatStep,
    NoiseStep,
    OneOf,
    OntoBackgroundStep,
    OntoOtherImageStep,
    OtherImageOntoStep,
    OverlayEmojiStep,
    OverlayImageStep,
    OverlayStripesStep,
    OverlayTextStep,
    PadStep,
    PerspectiveStep,
    PixelizationStep,
    PosterizeStep,
    RandomErasingStep,
    RandomResizedCropStep,
    RotateStep,
    SaturationStep,
    ScreenshotStep,
    SharpenStep,
    ShufflePixelsStep,
    SkewStep,
    SmearingStep,
    SolarizeStep,
    SomeOf,
    Step,
    VerticalFlipStep,
)
from .table import CoordinateTable

__all__ = ["PRESETS", "CopyRecipe", "Group", "Shuffled"]

Size = tuple[int, int]
Scheduled = tuple[Step, np.random.Generator]


@dataclasses.dataclass(frozen=True)
class Group:
    """Schedule nodes applied in order (a unit inside a :class:`Shuffled`)."""

    nodes: tuple[Node, ...]


@dataclasses.dataclass(frozen=True)
class Shuffled:
    """Schedule nodes applied in a random order per copy."""

    nodes: tuple[Node, ...]


Node = str | Group | Shuffled


def _node_to_json(node: Node):
    if isinstance(node, str):
        return node
    return {"group" if isinstance(node, Group) else "shuffled": [_node_to_json(n) for n in node.nodes]}


def _node_from_json(data) -> Node:
    if isinstance(data, str):
        return data
    if isinstance(data, dict) and len(data) == 1 and set(data) <= {"group", "shuffled"} and isinstance(
            next(iter(data.values())), list):
        kind, nodes = next(iter(data.items()))
        return (Group if kind == "group" else Shuffled)(tuple(_node_from_json(n) for n in nodes))
    raise ConfigError(f"a recipe schedule node must be a step name, {{'group': [...]}} or {{'shuffled': [...]}}, "
                      f"got {data!r}")


def _names_in(nodes: Sequence[Node]) -> list[str]:
    names = []
    for node in nodes:
        names += [node] if isinstance(node, str) else _names_in(node.nodes)
    return names


@dataclasses.dataclass(frozen=True)
class CopyRecipe:
    """Named steps and their schedule (module docstring); build one with a preset.

    ``recipe.blur`` is the step named ``blur``; :meth:`replace` changes steps by name, e.g.
    ``recipe.replace(blur=dataclasses.replace(recipe.blur, p=0.5))``, :meth:`updated` changes
    fields from a mapping ``{step: {field: value}}``; :meth:`to_dict` / :meth:`from_dict` store it.
    """

    steps: tuple[tuple[str, Any], ...]
    before_resize: tuple[Node, ...]
    after_resize: tuple[Node, ...] = ()
    shared_generator: bool = False
    max_side: int | None = None
    resample: str = "bilinear"
    fused: bool = True

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple((str(name), step) for name, step in self.steps))
        object.__setattr__(self, "before_resize", tuple(self.before_resize))
        object.__setattr__(self, "after_resize", tuple(self.after_resize))
        named = dict(self.steps)
        if len(named) != len(self.steps):
            raise ConfigError(f"recipe steps must have distinct names, got {[name for name, _ in self.steps]}")
        for name, step in self.steps:
            if not isinstance(step, (Step, OneOf, SomeOf)):
                raise ConfigError(f"recipe step {name} must be a step of the vocabulary, got {step!r}")
        for name in _names_in(self.before_resize + self.after_resize):
            if name not in named:
                raise ConfigError(f"recipe schedule names unknown step {name!r}; steps: {list(named)}")
        for name, step in self.steps:
            if not isinstance(step, (OneOf, SomeOf)):
                continue
            for member in step.members:
                if not isinstance(named.get(member), Step):
                    raise ConfigError(f"recipe step {name}: member {member!r} is not a drawing step of the recipe")
            if isinstance(step, OneOf) and step.p > 0 and not any(named[m].p > 0 for m in step.members):
                raise ConfigError(f"recipe step {name}: p={step.p} but every member of {list(step.members)} has p 0")
        if self.resample not in RESAMPLE:
            raise ConfigError(f"recipe resample={self.resample!r} must be one of {sorted(RESAMPLE)}")
        if not isinstance(self.fused, bool):
            raise ConfigError(f"recipe fused={self.fused!r} must be true or false")
        if self.max_side is not None and (isinstance(self.max_side, bool) or not isinstance(self.max_side, int)
                                          or self.max_side < 32):
            raise ConfigError(f"recipe max_side={self.max_side!r} must be None or an integer of at least 32")

    # ------------------------------------------------------------------ access
    def __getattr__(self, name: str):
        if name.startswith("_") or name == "steps":  # not a step name (and no recursion while unpickling)
            raise AttributeError(name)
        try:
            return self._named[name]
        except KeyError:
            raise AttributeError(f"CopyRecipe has no step {name!r}") from None

    @functools.cached_property
    def _named(self) -> dict[str, Any]:
        return dict(self.steps)

    @functools.cached_property
    def _layout(self) -> tuple[list[str], bool, dict[str, int]]:
        """(the drawing steps' names, whether a random order or choice needs its own generator, the
        position of every step in the listing)."""
        drawing = [name for name, step in self.steps if isinstance(step, Step)]
        random_order = any(isinstance(step, (OneOf, SomeOf)) for _, step in self.steps) or any(
            isinstance(node, Shuffled) for node in _all_nodes(self.before_resize + self.after_resize))
        return drawing, random_order, {name: position for position, name in enumerate(self.step_names())}

    def step_names(self) -> list[str]:
        """The names of the recipe's steps, in the order listed."""
        return [name for name, _ in self.steps]

    def replace(self, **steps) -> CopyRecipe:
        """This recipe with the named steps replaced (``name=step``)."""
        unknown = sorted(set(steps) - set(self.step_names()))
        if unknown:
            raise ConfigError(f"unknown recipe step {unknown[0]!r}; known steps: {sorted(self.step_names())}")
        return dataclasses.replace(self, steps=tuple((name, steps.get(name, step)) for name, step in self.steps))

    def updated(self, values: dict[str, dict[str, Any]]) -> CopyRecipe:
        """This recipe with the fields of ``{step: {field: value}}`` changed; raises :class:`ConfigError`
        naming an unknown step or field, or a bad value."""
        if not isinstance(values, dict):
            raise ConfigError(f"recipe values must be a mapping of steps, got {type(values).__name__}")
        changed = {}
        for name, fields in values.items():
            if name not in self.step_names():
                raise ConfigError(f"unknown recipe step {name!r}; known steps: {sorted(self.step_names())}")
            if not isinstance(fields, dict):
                raise ConfigError(f"recipe step {name} must be a mapping of fields, got {fields!r}")
            step = getattr(self, name)
            known = {f.name for f in dataclasses.fields(step)}
            for key in fields:
                if key not in known:
                    raise ConfigError(f"unknown field {name}.{key}; known fields: {sorted(known)}")
            try:
                changed[name] = dataclasses.replace(step, **fields)
            except ConfigError as error:
                raise ConfigError(f"recipe step {name!r}: {error}") from error
        return self.replace(**changed)

    def with_probability(self, p: float, names: Sequence[str] | None = None) -> CopyRecipe:
        """This recipe with the drawing steps ``names`` (default: all) applied with probability ``p``."""
        names = set(self.step_names() if names is None else names)
        return self.replace(**{name: dataclasses.replace(step, p=p) for name, step in self.steps
                               if name in names and isinstance(step, Step)})

    # ------------------------------------------------------------------ presets
    @classmethod
    def training(cls) -> CopyRecipe:
        """The heavy default for training queries (the paper's augmentation list, with ranges in the
        spirit of torchvision's and AugLy's defaults), applied in this order: geometric steps, colour,
        pasting or padding, overlays, compression-like degradations."""
        steps = (
            ("random_resized_crop", RandomResizedCropStep()),
            ("horizontal_flip", HorizontalFlipStep()),
            ("vertical_flip", VerticalFlipStep()),
            ("affine", AffineStep()),
            ("perspective", PerspectiveStep()),
            ("color_jitter", ColorJitterStep()),
            ("grayscale", GrayscaleStep()),
            ("blur", BlurStep()),
            ("onto_background", OntoBackgroundStep()),
            ("pad", PadStep()),
            ("overlay_text", OverlayTextStep()),
            ("overlay_emoji", OverlayEmojiStep()),
            ("overlay_image", OverlayImageStep()),
            ("overlay_stripes", OverlayStripesStep()),
            ("random_erasing", RandomErasingStep()),
            ("jpeg", JpegStep()),
            ("pixelization", PixelizationStep()),
            ("shuffle_pixels", ShufflePixelsStep()),
            ("noise", NoiseStep()),
        )
        return cls(steps=steps, before_resize=tuple(name for name, _ in steps))

    @classmethod
    def training_everyday(cls) -> CopyRecipe:
        """:meth:`training` widened with the edit families users meet that it lacks, each on a minority of the
        copies and with ranges of its own (no evaluation or calibration recipe draws one of these steps): a
        rotation of 3-45 degrees either way cropped to the content (p 0.15), a skew of 0.05-0.4 (p 0.1) and an
        aspect change to w/h 0.6-1.7 (p 0.15) after the perspective; solarisation above 128-200 (p 0.08),
        posterisation to 3-5 bits (p 0.08), edge enhancement (p 0.08) and sharpening by 1.5-4 (p 0.08) after
        greyscale; the copy pasted small onto another image, 20-50 % of its height (p 0.2: a photo inside a
        screenshot or a page), after the training recipe's own paste; a meme band of 10-30 % of the height with
        words of its own (p 0.1) after the padding. Rendered fused, as :meth:`training`."""
        added = {
            "perspective": (("rotate", RotateStep(p=0.15, degrees=(3.0, 45.0))),
                            ("skew", SkewStep(p=0.1, factor=(0.05, 0.4))),
                            ("aspect_ratio", AspectRatioStep(p=0.15, ratio=(0.6, 1.7)))),
            "grayscale": (("solarize", SolarizeStep(p=0.08, threshold=(128, 200))),
                          ("posterize", PosterizeStep(p=0.08, bits=(3, 5))),
                          ("edge_enhance", EdgeEnhanceStep(p=0.08)),
                          ("sharpen", SharpenStep(p=0.08, factor=(1.5, 4.0)))),
            "onto_background": (("small_paste", OntoBackgroundStep(p=0.2, overlay_size=(0.2, 0.5),
                                                                   background_scale=(1.2, 2.0))),),
            "pad": (("meme_format", MemeFormatStep(p=0.1, caption=(0.1, 0.3), words=TRAINING_MEME_WORDS)),),
        }
        steps = []
        for name, step in cls.training().steps:
            steps += [(name, step), *added.get(name, ())]
        return cls(steps=tuple(steps), before_resize=tuple(name for name, _ in steps))

    @classmethod
    def off(cls) -> CopyRecipe:
        """No random edit: :meth:`training` with every step at probability 0 (with the editor's
        ``output_size`` only the resize remains: the paper's references and fine-tuning input). The
        resize is Pillow's bicubic, as :class:`~copynce_hf.modeling.CopyNCEImageProcessor` resizes at
        evaluation and as the authors' ``basic_transform`` resizes their references."""
        return dataclasses.replace(cls.training().with_probability(0.0), resample="bicubic", fused=False)

    @classmethod
    def light_copy(cls) -> CopyRecipe:
        """A few mild edits, as the second copy of a copy-to-copy pair (beyond the paper: its references are
        never edited; ``TrainingConfig.copy_to_copy_share``): a random resized crop of 50-100 % of the area
        (p 0.7, aspect 3/4-4/3), a horizontal flip (p 0.5), a colour jitter of +-20 % brightness, contrast and
        saturation and +-0.03 hue (p 0.5), a blur of 0.05-0.3 % of the shorter side (p 0.2), a caption of
        3-10 characters at 5-10 % of the shorter side (p 0.2), an emoji of 8-20 % of the height (p 0.15)
        and JPEG at quality 50-90 (p 0.4); rendered fused as :meth:`training`."""
        steps = (
            ("random_resized_crop", RandomResizedCropStep(p=0.7, scale=(0.5, 1.0), ratio=(3 / 4, 4 / 3))),
            ("horizontal_flip", HorizontalFlipStep(p=0.5)),
            ("color_jitter", ColorJitterStep(p=0.5, brightness=0.2, contrast=0.2, saturation=0.2, hue=0.03)),
            ("blur", BlurStep(p=0.2, radius=(0.0005, 0.003))),
            ("overlay_text", OverlayTextStep(p=0.2, length=(3, 10), font_size=(0.05, 0.1))),
            ("overlay_emoji", OverlayEmojiStep(p=0.15, size=(0.08, 0.2))),
            ("jpeg", JpegStep(p=0.4, quality=(50, 90))),
        )
        return cls(steps=steps, before_resize=tuple(name for name, _ in steps))

    @classmethod
    def paper_descriptor(cls) -> CopyRecipe:
        """The authors' descriptor recipe (``descriptor_default_config.yaml``; module docstring)."""
        appearance = ("color_jitter", "pixelization", "shuffle_pixels", "jpeg", "grayscale", "blur", "overlay_text",
                      "overlay_emoji", "edge_enhance", "smearing")
        steps = (
            ("crop", OneOf(p=0.3, members=("random_resized_crop", "onto_other_image", "other_image_onto"))),
            ("random_resized_crop", RandomResizedCropStep(p=1.0, scale=(0.25, 0.5), ratio=(0.33, 3.0), to_output=True,
                                                          resample="bicubic", form="crop")),
            ("onto_other_image", OntoOtherImageStep(form="authors")),
            ("other_image_onto", OtherImageOntoStep(form="authors")),
            ("horizontal_flip", HorizontalFlipStep(p=0.5)),
            ("vertical_flip", VerticalFlipStep(p=0.1)),
            ("linear", OneOf(p=0.25, members=("perspective", "affine"))),
            ("perspective", PerspectiveStep(p=1.0, distortion=0.5, fill=(0, 0, 0), resample="bicubic",
                                            form="torchvision")),
            ("affine", AffineStep(p=1.0, degrees=(0.0, 360.0), translate=None, scale=None, shear=(-45.0, 45.0),
                                  fill=(0, 0, 0), rotation_affinity=22.5, resample="bicubic", form="torchvision")),
            ("color_jitter", ColorJitterStep(p=1.0, brightness=0.5, contrast=0.5, saturation=0.5, hue=0.1,
                                             form="torchvision")),
            ("pixelization", PixelizationStep(p=0.15, ratio=(0.1, 1.0))),
            ("shuffle_pixels", ShufflePixelsStep(p=0.15, factor=(0.1, 0.1), seed=10, form="augly")),
            ("jpeg", JpegStep(p=0.25, qualities=(10, 20, 30, 50))),
            ("grayscale", GrayscaleStep(p=0.25)),
            ("blur", BlurStep(p=0.2, radius=(0.0, 10.0), units="pixels")),
            ("overlay_text", OverlayTextStep(p=0.25, length=(1, 100), font_size=(0.1, 0.3), opacity=(0.1, 1.0),
                                             fonts=(ALL_FONTS,), form="authors", p_means="skip", covered="mapped")),
            ("overlay_emoji", OverlayEmojiStep(p=0.25, size=(0.1, 0.5), opacity=(0.7, 1.0), form="authors",
                                               covered="mapped")),
            ("edge_enhance", EdgeEnhanceStep(p=0.25, coin="integers")),
            ("smearing", SmearingStep(p=0.25, width=(1, 5), units="pixels", covered="mapped")),
            ("additional", AlbumentationsStep(p=0.15)),
            ("padding", PadStep(p=0.15, fraction=(0.2, 0.2), color=(0, 0, 0), rounding="round")),
            ("random_erasing", RandomErasingStep(p=0.15, scale=(0.02, 0.33), ratio=(0.3, 3.3), value="random",
                                                 values="unclipped", covered="mapped")),
        )
        groups = Shuffled(("crop", Group(("horizontal_flip", "vertical_flip", "linear")), Shuffled(appearance),
                           "additional"))
        return cls(steps=steps, before_resize=(groups, "padding"), after_resize=("random_erasing",),
                   resample="bicubic", fused=False)

    @classmethod
    def paper_matcher(cls) -> CopyRecipe:
        """The authors' matcher recipe (``matching_default_config.yaml``): stronger and more frequent edits."""
        base = cls.paper_descriptor()
        replace = dataclasses.replace
        return base.replace(
            crop=replace(base.crop, p=0.5),
            random_resized_crop=replace(base.random_resized_crop, scale=(0.15, 0.5)),
            onto_other_image=replace(base.onto_other_image, scale=(0.15, 0.5)),
            other_image_onto=replace(base.other_image_onto, scale=(0.5, 0.8)),
            linear=replace(base.linear, p=0.35),
            color_jitter=replace(base.color_jitter, brightness=0.8, contrast=0.8, saturation=0.8, hue=0.2),
            pixelization=replace(base.pixelization, p=0.25),
            shuffle_pixels=replace(base.shuffle_pixels, p=0.25),
            jpeg=replace(base.jpeg, p=0.35),
            blur=replace(base.blur, p=0.25),
            overlay_text=replace(base.overlay_text, p=0.35),
            overlay_emoji=replace(base.overlay_emoji, p=0.35),
            edge_enhance=replace(base.edge_enhance, p=0.3),
            smearing=replace(base.smearing, p=0.3),
            padding=replace(base.padding, p=0.25),
            random_erasing=replace(base.random_erasing, p=0.25),
        )

    @classmethod
    def minidisc_queries(cls) -> CopyRecipe:
        """The mini-DISC benchmark's queries: one or two of a heavy crop covered with a caption and an
        emoji, a skew, a rotation, an aspect change, a meme caption or a screenshot; one or two of
        brightness, contrast, saturation, sharpening, solarisation, posterisation, edge enhancement; at
        most 512 pixels (DISC21 queries are web-sized)."""
        structural = (("heavy_crop_overlays", 1.0), ("skew", 1.0), ("rotate", 1.0), ("aspect_ratio", 0.7),
                      ("meme_format", 1.0), ("screenshot", 1.0))
        photometric = (("brightness", 1.0), ("contrast", 1.0), ("saturation", 1.0), ("sharpen", 0.5),
                       ("solarize", 0.3), ("posterize", 0.5), ("edge_enhance", 0.5))
        steps = (
            ("structural", SomeOf(count=(1, 2), weights=structural, in_order=True)),
            ("photometric", SomeOf(count=(1, 2), weights=photometric)),
            ("heavy_crop_overlays", HeavyCropOverlaysStep()),
            ("aspect_ratio", AspectRatioStep()),
            ("skew", SkewStep()),
            ("rotate", RotateStep()),
            ("meme_format", MemeFormatStep()),
            ("screenshot", ScreenshotStep()),
            ("brightness", BrightnessStep()),
            ("contrast", ContrastStep()),
            ("saturation", SaturationStep()),
            ("sharpen", SharpenStep()),
            ("solarize", SolarizeStep()),
            ("posterize", PosterizeStep()),
            ("edge_enhance", EdgeEnhanceStep()),
        )
        return cls(steps=steps, before_resize=("structural", "photometric"), shared_generator=True, max_side=512)

    @classmethod
    def demo_queries(cls) -> CopyRecipe:
        """The demo's queries over the bundled images: harsher crops of at least 16 px with one word,
        flips, greyscale and JPEG, at most 320 pixels (otherwise as :meth:`minidisc_queries`)."""
        structural = (("heavy_crop_overlays", 1.5), ("flip", 0.5), ("aspect_ratio", 0.7), ("skew", 1.0), ("rotate", 1.0),
                      ("meme_format", 0.8), ("screenshot", 0.8))
        photometric = (("brightness", 1.0), ("contrast", 1.0), ("saturation", 1.0), ("grayscale", 0.4), ("jpeg", 1.0))
        steps = (
            ("structural", SomeOf(count=(1, 2), weights=structural, in_order=True)),
            ("photometric", SomeOf(count=(1, 2), weights=photometric)),
            ("heavy_crop_overlays", HeavyCropOverlaysStep(crop_area=(0.25, 0.6), crop_log_aspect=(-0.4, 0.4),
                                                          crop_min_side=16, words=DEMO_WORDS, caption_words=1,
                                                          emoji_size=(0.15, 0.35))),
            ("flip", HorizontalFlipStep(p=1.0)),
            ("aspect_ratio", AspectRatioStep(ratio=(0.6, 1.7))),
            ("skew", SkewStep(factor=(0.15, 0.4))),
            ("rotate", RotateStep(degrees=(8.0, 30.0))),
            ("meme_format", MemeFormatStep(caption=(0.15, 0.3), words=DEMO_WORDS, colour_first=True)),
            ("screenshot", ScreenshotStep()),
            ("brightness", BrightnessStep(factor=(0.6, 1.5))),
            ("contrast", ContrastStep(factor=(0.6, 1.6))),
            ("saturation", SaturationStep(factor=(0.3, 2.0))),
            ("grayscale", GrayscaleStep(p=1.0)),
            ("jpeg", JpegStep(p=1.0, quality=(20, 60))),
        )
        return cls(steps=steps, before_resize=("structural", "photometric"), shared_generator=True, max_side=320)

    @classmethod
    def calibration_copies(cls) -> CopyRecipe:
        """The calibrations' copies (``copynce calibrate`` and ``copynce dedup``'s self-calibration): the edits a
        picture meets when passed around. One or two of (applied in the order listed) a crop keeping 30-80 % of the
        area (aspect w/h 0.5-2), a mirror, a rotation of 5-25 degrees either way (cropped to the content), a
        perspective of up to 25 % of each half side (a random colour outside), an aspect change to w/h 0.65-1.55,
        a border of 5-25 % of each side in a random colour, the copy pasted onto a background (its height 50-85 % of
        the background's, a procedural background 1.1-1.5 times its size), a caption of 5-20 characters (5-12 % of the
        shorter side, opacity 0.7-1), an emoji (12-30 % of the height, opacity 0.8-1); then one or two of (in the
        order drawn) a colour jitter (brightness and contrast +-30 %, saturation +-40 %, hue +-0.05), greyscale, JPEG
        at quality 30-80, a blur of 0.1-0.5 % of the shorter side, Gaussian noise of 1-5 % of the range, a
        pixelisation to 20-50 % of the size; at most 600 pixels. All from one generator, as the evaluation queries.
        The calibration's own recipe, with ranges fixed before any measurement: no benchmark (mini-DISC, the
        template, look-alike, dedup and speed tasks) and no training recipe draws it."""
        structural = (("crop", 1.5), ("mirror", 0.6), ("rotate", 0.8), ("perspective", 0.8), ("aspect_ratio", 0.6),
                      ("border", 0.6), ("onto_background", 0.6), ("caption", 0.8), ("emoji", 0.6))
        photometric = (("color_jitter", 1.5), ("grayscale", 0.5), ("jpeg", 1.0), ("blur", 0.6), ("noise", 0.5),
                       ("pixelization", 0.3))
        steps = (
            ("structural", SomeOf(count=(1, 2), weights=structural, in_order=True)),
            ("photometric", SomeOf(count=(1, 2), weights=photometric)),
            ("crop", RandomResizedCropStep(p=1.0, scale=(0.3, 0.8), ratio=(0.5, 2.0))),
            ("mirror", HorizontalFlipStep(p=1.0)),
            ("rotate", RotateStep(degrees=(5.0, 25.0))),
            ("perspective", PerspectiveStep(p=1.0, distortion=0.25)),
            ("aspect_ratio", AspectRatioStep(ratio=(0.65, 1.55))),
            ("border", PadStep(p=1.0, fraction=(0.05, 0.25))),
            ("onto_background", OntoBackgroundStep(p=1.0, overlay_size=(0.5, 0.85), background_scale=(1.1, 1.5))),
            ("caption", OverlayTextStep(p=1.0, length=(5, 20), font_size=(0.05, 0.12), opacity=(0.7, 1.0))),
            ("emoji", OverlayEmojiStep(p=1.0, size=(0.12, 0.3), opacity=(0.8, 1.0))),
            ("color_jitter", ColorJitterStep(p=1.0, brightness=0.3, contrast=0.3, saturation=0.4, hue=0.05)),
            ("grayscale", GrayscaleStep(p=1.0)),
            ("jpeg", JpegStep(p=1.0, quality=(30, 80))),
            ("blur", BlurStep(p=1.0, radius=(0.001, 0.005))),
            ("noise", NoiseStep(p=1.0, std=(0.01, 0.05))),
            ("pixelization", PixelizationStep(p=1.0, ratio=(0.2, 0.5))),
        )
        return cls(steps=steps, before_resize=("structural", "photometric"), shared_generator=True, max_side=600)

    @classmethod
    def preset(cls, name: str) -> CopyRecipe:
        """The preset called ``name`` (one of :data:`PRESETS`)."""
        if name not in PRESETS:
            raise ConfigError(f"unknown copy recipe preset {name!r}; known: {sorted(PRESETS)}")
        return getattr(cls, name)()

    # ------------------------------------------------------------------ drawing
    def schedule(self, rng: np.random.Generator) -> tuple[list[Scheduled], list[Scheduled]]:
        """The steps drawn for one copy, each with the generator it draws from: ``(before_resize, after_resize)``."""
        drawing, random_order, listed = self._layout
        named = self._named
        if self.shared_generator:
            order, generators = rng, dict.fromkeys(drawing, rng)
        else:
            children = rng.spawn(len(drawing) + int(random_order))
            order = children.pop(0) if random_order else None
            generators = dict(zip(drawing, children))

        def scheduled(node: Node) -> list[Scheduled]:
            if isinstance(node, Group):
                return [item for child in node.nodes for item in scheduled(child)]
            if isinstance(node, Shuffled):
                parts = [scheduled(child) for child in node.nodes]
                return [item for i in order.permutation(len(parts)) for item in parts[i]]
            step = named[node]
            if isinstance(step, OneOf):
                chosen = order.random() < step.p
                weights = np.array([named[m].p for m in step.members], dtype=np.float64)
                pick = (step.members[int(order.choice(len(weights), p=weights / weights.sum()))]
                        if weights.sum() > 0 else None)
                return [(named[pick], generators[pick])] if chosen and pick else []
            if isinstance(step, SomeOf):
                count = order.integers(step.count[0], step.count[1] + 1)
                names = [name for name, weight in step.weights if weight > 0]
                weights = np.array([weight for _, weight in step.weights if weight > 0], dtype=np.float64)
                count = min(int(count), len(names))
                picked = ([names[i] for i in order.choice(len(names), size=count, replace=False,
                                                          p=weights / weights.sum())] if count else [])
                if step.in_order:
                    picked.sort(key=listed.__getitem__)
                return [(named[name], generators[name]) for name in picked]
            return [(step, generators[node])] if generators[node].random() < step.rate() else []

        before = [item for node in self.before_resize for item in scheduled(node)]
        after = [item for node in self.after_resize for item in scheduled(node)]
        return before, after

    def draw(self, rng: np.random.Generator, size: Size, output_size: Size | None = None,
             image_pool: Sequence[str] = ()) -> list[Edit]:
        """The explicit edits of one copy of an image of (H, W) ``size``, drawn without pixel work.

        Steps look only at the size of the image so far, which each geometric edit predicts; with
        ``output_size`` the chain holds the resize to it between the two parts of the schedule, and
        with :attr:`max_side` it ends with the downscale. ``image_pool``: files for pastes and overlays.
        """
        before, after = self.schedule(rng)
        size, edits = (int(size[0]), int(size[1])), []

        def add(new: list[Edit]) -> None:
            nonlocal size
            for edit in new:
                if edit.kind == "geometric":
                    size = edit.output_size(size)
                edits.append(edit)

        pool = tuple(image_pool)
        for step, generator in before:
            add(step.draw(DrawContext(generator, size, pool, output_size)))
        if output_size is not None:
            add([Resize(*output_size, resample=self.resample)])
        for step, generator in after:
            add(step.draw(DrawContext(generator, size, pool, output_size)))
        if self.max_side is not None and max(size) > self.max_side:
            add([Scale(factor=self.max_side / max(size))])
        return edits

    def apply(self, image: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, CoordinateTable, list[dict]]:
        """Edit an RGB ``image`` edit by edit: ``(edited image, table to image, [Edit.to_dict(), ...])``."""
        table = CoordinateTable.identity(image.height, image.width)
        done = []
        for edit in self.draw(rng, (image.height, image.width)):
            image, table = edit(image, table)
            done.append(edit.to_dict())
        return image, table, done

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"steps": {name: {"type": ..., field: value}}, "before_resize": [...], ...}``."""
        return {
            "steps": {name: step.to_dict() for name, step in self.steps},
            "before_resize": [_node_to_json(node) for node in self.before_resize],
            "after_resize": [_node_to_json(node) for node in self.after_resize],
            "shared_generator": self.shared_generator,
            "max_side": self.max_side,
            "resample": self.resample,
            "fused": self.fused,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CopyRecipe:
        """Rebuild from :meth:`to_dict` output; raises :class:`ConfigError` naming an unknown step type
        or field, or a bad value."""
        known = {"steps", "before_resize", "after_resize", "shared_generator", "max_side", "resample", "fused"}
        if not isinstance(data, dict) or not isinstance(data.get("steps"), dict) or not set(data) <= known:
            raise ConfigError(f"a copy recipe must be a mapping with keys {sorted(known)} ('steps' a mapping), "
                              f"got {data!r:.200}")
        steps = []
        for name, values in data["steps"].items():
            if not isinstance(values, dict) or values.get("type") not in STEP_TYPES:
                raise ConfigError(f"recipe step {name}: unknown step type {values.get('type') if isinstance(values, dict) else values!r}; "
                                  f"known: {sorted(STEP_TYPES)}")
            step_type = STEP_TYPES[values["type"]]
            fields = {k: v for k, v in values.items() if k != "type"}
            unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(step_type)})
            if unknown:
                raise ConfigError(f"unknown field {name}.{unknown[0]}; known fields: "
                                  f"{sorted(f.name for f in dataclasses.fields(step_type))}")
            steps.append((name, step_type(**fields)))
        return cls(steps=tuple(steps),
                   before_resize=tuple(_node_from_json(n) for n in data.get("before_resize", ())),
                   after_resize=tuple(_node_from_json(n) for n in data.get("after_resize", ())),
                   shared_generator=bool(data.get("shared_generator", False)), max_side=data.get("max_side"),
                   resample=data.get("resample", "bilinear"), fused=data.get("fused", True))


def _all_nodes(nodes: Sequence[Node]) -> list[Node]:
    found = []
    for node in nodes:
        found.append(node)
        if not isinstance(node, str):
            found += _all_nodes(node.nodes)
    return found


#: The preset names, as recipe options name them (``CopyRecipe.preset(name)``).
PRESETS = ("training", "training_everyday", "off", "light_copy", "paper_descriptor", "paper_matcher", "demo_queries",
           "minidisc_queries", "calibration_copies")
