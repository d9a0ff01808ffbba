"""The evaluation query recipe: one declarative, seeded recipe type for the demo and mini-DISC queries.

DISC21-style query edits (paper, section "Experiments" and supplementary "Evaluation Protocols"),
built from the PixTrace catalogue (:mod:`copynce_hf.pixtrace.edits`) and different from the
training recipe (:class:`copynce_hf.pixtrace.CopyRecipe`). A recipe is data:

* *families*: named draw functions in two registries, :data:`STRUCTURAL_FAMILIES` (geometric
  edits and containers, applied in the registry's order: content edits first, then the meme
  caption and the screenshot) and :data:`PHOTOMETRIC_FAMILIES`;
* *weights and counts*: every query draws ``num_structural`` distinct structural families with
  ``structural_weights`` and ``num_photometric`` distinct photometric families with
  ``photometric_weights``, then a downscale so that the longer side is at most ``max_side``;
* *parameters*: the ranges of the draws (``(low, high)``, uniform unless said otherwise).

Two presets: :meth:`QueryRecipe.minidisc` (the mini-DISC benchmark; also the defaults) and
:meth:`QueryRecipe.demo` (the demo's queries over the bundled images). Every draw consumes the
``numpy.random.Generator`` in a fixed order, so a task is the same on every machine (the
mini-DISC fingerprint pins it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ..errors import ConfigError
from ..pixtrace import CoordinateTable
from ..pixtrace.edits import (
    Brightness,
    ChangeAspectRatio,
    Contrast,
    Crop,
    EdgeEnhance,
    Edit,
    Grayscale,
    HorizontalFlip,
    JpegQuality,
    MemeFormat,
    OverlayEmoji,
    OverlayOntoScreenshot,
    OverlayText,
    Posterize,
    Rotate,
    Saturation,
    Scale,
    Sharpen,
    Skew,
    Solarize,
    emoji_names,
)
from .drawing import Range, check_families, choose, color, signed, uniform

__all__ = ["PHOTOMETRIC_FAMILIES", "STRUCTURAL_FAMILIES", "QueryRecipe"]

Size = tuple[int, int]

#: Fonts of AugLy's asset folder that the training recipe (``OverlayTextStep``) does not use.
FONTS = ("Chunkfive.ttf", "CaviarDreams.ttf", "Elsie-Black.ttf", "GrandHotel-Regular.ttf")
#: Caption words of the mini-DISC queries.
MINIDISC_WORDS = ("LOL", "WHEN YOU SEE IT", "ME IRL", "NOPE", "SO TRUE", "MONDAY MOOD", "WAIT FOR IT", "OK")
#: Caption words of the demo queries.
DEMO_WORDS = ("LOL", "ME IRL", "NOPE", "SO TRUE", "WAIT FOR IT", "OK", "MONDAY", "FOUND IT")


# ---------------------------------------------------------------------------------------------- families
# structural: (recipe, rng, (H, W) of the image so far) -> edits; photometric: (recipe, rng) -> edit.


def _heavy_crop_overlays(recipe: QueryRecipe, rng: np.random.Generator, size: Size) -> list[Edit]:
    """A heavy crop (kept area ``crop_area``, log aspect ``crop_log_aspect`` relative to the image's,
    sides at least ``crop_min_side``) covered with a caption of ``caption_words`` words and an emoji."""
    height, width = size
    area = uniform(rng, recipe.crop_area)
    aspect = math.exp(uniform(rng, recipe.crop_log_aspect))
    box_w = min(width, max(recipe.crop_min_side, round(width * math.sqrt(area * aspect))))
    box_h = min(height, max(recipe.crop_min_side, round(height * math.sqrt(area / aspect))))
    left = int(rng.integers(0, width - box_w + 1))
    top = int(rng.integers(0, height - box_h + 1))
    names = emoji_names()
    words = " ".join(recipe.words[int(i)] for i in rng.integers(len(recipe.words), size=recipe.caption_words))
    return [
        Crop(left, top, left + box_w, top + box_h),
        OverlayText(text=words, font=FONTS[int(rng.integers(len(FONTS)))],
                    font_size=uniform(rng, recipe.text_font_size), color=color(rng),
                    x=uniform(rng, (0.0, 0.4)), y=uniform(rng, (0.0, 0.8)), opacity=1.0),
        OverlayEmoji(emoji=names[int(rng.integers(len(names)))], size=uniform(rng, recipe.emoji_size),
                     x=uniform(rng, (0.0, 0.7)), y=uniform(rng, (0.0, 0.7)), opacity=1.0),
    ]


def _flip(recipe, rng, size):
    return [HorizontalFlip()]


def _aspect_ratio(recipe, rng, size):
    low, high = (math.log(v) for v in recipe.aspect_ratio)  # log-uniform new w / h
    return [ChangeAspectRatio(ratio=math.exp(uniform(rng, (low, high))))]


def _skew(recipe, rng, size):
    return [Skew(skew_factor=signed(rng, recipe.skew_factor), axis=int(rng.integers(2)))]


def _rotate(recipe, rng, size):
    return [Rotate(degrees=signed(rng, recipe.rotate_degrees), crop_to_content=True)]


def _meme(text: str, caption_height: int, dark: bool) -> MemeFormat:
    return MemeFormat(text=text, caption_height=caption_height, text_color=(255, 255, 255) if dark else (0, 0, 0),
                      bg_color=(0, 0, 0) if dark else (255, 255, 255))


def _meme_format(recipe, rng, size):
    """Meme caption band (height ``meme_caption`` of the image's); draws: height, colours, text."""
    caption = max(11, int(size[0] * uniform(rng, recipe.meme_caption)))
    dark = bool(rng.random() < 0.5)
    return [_meme(recipe.words[int(rng.integers(len(recipe.words)))], caption, dark)]


def _colour_first_meme_format(recipe, rng, size):
    """:func:`_meme_format` drawing colours, text, then height (the demo's order, kept so its queries stay the same)."""
    dark = bool(rng.random() < 0.5)
    text = recipe.words[int(rng.integers(len(recipe.words)))]
    return [_meme(text, max(11, int(size[0] * uniform(rng, recipe.meme_caption))), dark)]


def _screenshot(recipe, rng, size):
    template = "web" if rng.random() < 0.5 else "mobile"
    return [OverlayOntoScreenshot(template=template, crop_src_to_fit=bool(rng.random() < 0.5))]


#: Structural families, in application order.
STRUCTURAL_FAMILIES: dict[str, Callable[[QueryRecipe, np.random.Generator, Size], list[Edit]]] = {
    "heavy_crop_overlays": _heavy_crop_overlays,
    "flip": _flip,
    "aspect_ratio": _aspect_ratio,
    "skew": _skew,
    "rotate": _rotate,
    "meme_format": _meme_format,
    "colour_first_meme_format": _colour_first_meme_format,
    "screenshot": _screenshot,
}

#: Photometric families (applied in the order drawn).
PHOTOMETRIC_FAMILIES: dict[str, Callable[[QueryRecipe, np.random.Generator], Edit]] = {
    "brightness": lambda recipe, rng: Brightness(factor=uniform(rng, recipe.brightness)),
    "contrast": lambda recipe, rng: Contrast(factor=uniform(rng, recipe.contrast)),
    "saturation": lambda recipe, rng: Saturation(factor=uniform(rng, recipe.saturation)),
    "grayscale": lambda recipe, rng: Grayscale(),
    "jpeg": lambda recipe, rng: JpegQuality(quality=int(rng.integers(recipe.jpeg_quality[0],
                                                                      recipe.jpeg_quality[1] + 1))),
    "sharpen": lambda recipe, rng: Sharpen(factor=uniform(rng, recipe.sharpen)),
    "solarize": lambda recipe, rng: Solarize(threshold=int(rng.integers(recipe.solarize_threshold[0],
                                                                         recipe.solarize_threshold[1] + 1))),
    "posterize": lambda recipe, rng: Posterize(bits=int(rng.integers(recipe.posterize_bits[0],
                                                                      recipe.posterize_bits[1] + 1))),
    "edge_enhance": lambda recipe, rng: EdgeEnhance(more=bool(rng.random() < 0.5)),
}


# ---------------------------------------------------------------------------------------------- recipe


@dataclasses.dataclass(frozen=True)
class QueryRecipe:
    """How evaluation queries are edited (declarative and seeded); the defaults are :meth:`minidisc`.

    Every query gets ``num_structural`` distinct structural families (drawn with
    ``structural_weights``, applied in the order of :data:`STRUCTURAL_FAMILIES`), then
    ``num_photometric`` distinct photometric families (drawn with ``photometric_weights``), then a
    downscale so that the longer side is at most ``max_side``.
    """

    structural_weights: tuple[tuple[str, float], ...] = (
        ("heavy_crop_overlays", 1.0),
        ("skew", 1.0),
        ("rotate", 1.0),
        ("aspect_ratio", 0.7),
        ("meme_format", 1.0),
        ("screenshot", 1.0),
    )
    num_structural: tuple[int, int] = (1, 2)
    photometric_weights: tuple[tuple[str, float], ...] = (
        ("brightness", 1.0),
        ("contrast", 1.0),
        ("saturation", 1.0),
        ("sharpen", 0.5),
        ("solarize", 0.3),
        ("posterize", 0.5),
        ("edge_enhance", 0.5),
    )
    num_photometric: tuple[int, int] = (1, 2)
    crop_area: Range = (0.2, 0.45)  # heavy crop: kept area fraction
    crop_log_aspect: Range = (math.log(0.6), math.log(1.6))  # uniform log of the kept box's w / h relative to the image's
    crop_min_side: int = 1  # pixels
    words: tuple[str, ...] = MINIDISC_WORDS  # caption words (overlay text and meme caption)
    caption_words: int = 2  # words of the overlay text on the heavy crop
    text_font_size: Range = (0.08, 0.16)  # fraction of the shorter side
    emoji_size: Range = (0.2, 0.4)  # fraction of the height
    skew_factor: Range = (0.15, 0.5)  # either sign, either axis
    rotate_degrees: Range = (8.0, 40.0)  # either sign, cropped to the rotated content
    aspect_ratio: Range = (0.5, 2.0)  # log-uniform new w / h
    meme_caption: Range = (0.15, 0.35)  # caption band height as a fraction of the image height
    brightness: Range = (0.5, 1.6)
    contrast: Range = (0.5, 1.8)
    saturation: Range = (0.2, 2.5)
    sharpen: Range = (2.0, 6.0)
    solarize_threshold: tuple[int, int] = (160, 230)
    posterize_bits: tuple[int, int] = (2, 4)
    jpeg_quality: tuple[int, int] = (20, 60)
    max_side: int = 512  # DISC21 queries are web-sized

    def __post_init__(self):
        object.__setattr__(self, "words", tuple(self.words))
        check_families("QueryRecipe", "structural_weights", self.structural_weights, tuple(STRUCTURAL_FAMILIES),
                       "num_structural", self.num_structural)
        check_families("QueryRecipe", "photometric_weights", self.photometric_weights,
                       tuple(PHOTOMETRIC_FAMILIES), "num_photometric", self.num_photometric)
        if self.max_side < 32:
            raise ConfigError(f"QueryRecipe.max_side={self.max_side} must be at least 32")
        if self.crop_min_side < 1:
            raise ConfigError(f"QueryRecipe.crop_min_side={self.crop_min_side} must be at least 1")
        if not self.words or self.caption_words < 1:
            raise ConfigError(f"QueryRecipe needs caption words and caption_words >= 1, got {self.words!r}, "
                              f"{self.caption_words}")

    @classmethod
    def minidisc(cls, **overrides) -> QueryRecipe:
        """The mini-DISC benchmark's recipe (the defaults), with ``overrides`` (field=value)."""
        return cls(**overrides)

    @classmethod
    def demo(cls, **overrides) -> QueryRecipe:
        """The demo's recipe (bundled images): harsher crops of at least 16 px with one word, flips,
        grayscale and JPEG, smaller queries; with ``overrides`` (field=value)."""
        preset = dict(
            structural_weights=(("heavy_crop_overlays", 1.5), ("flip", 0.5), ("aspect_ratio", 0.7), ("skew", 1.0),
                                ("rotate", 1.0), ("colour_first_meme_format", 0.8), ("screenshot", 0.8)),
            photometric_weights=(("brightness", 1.0), ("contrast", 1.0), ("saturation", 1.0), ("grayscale", 0.4),
                                 ("jpeg", 1.0)),
            crop_area=(0.25, 0.6), crop_log_aspect=(-0.4, 0.4), crop_min_side=16, words=DEMO_WORDS,
            caption_words=1, emoji_size=(0.15, 0.35), aspect_ratio=(0.6, 1.7), skew_factor=(0.15, 0.4),
            rotate_degrees=(8.0, 30.0), meme_caption=(0.15, 0.3), brightness=(0.6, 1.5), contrast=(0.6, 1.6),
            saturation=(0.3, 2.0), max_side=320,
        )
        return cls(**{**preset, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description (written to ``task.json``, recorded with benchmark results)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    # ------------------------------------------------------------------ drawing
    def _draw(self, rng: np.random.Generator, size: Size, advance: Callable[[list[Edit], Size], Size]) -> Size:
        """Draw one query's edits family by family; ``advance(edits, size)`` takes them and returns the new (H, W)."""
        structural = choose(rng, self.structural_weights, rng.integers(self.num_structural[0],
                                                                      self.num_structural[1] + 1))
        photometric = choose(rng, self.photometric_weights, rng.integers(self.num_photometric[0],
                                                                        self.num_photometric[1] + 1))
        for family in (name for name in STRUCTURAL_FAMILIES if name in structural):
            size = advance(STRUCTURAL_FAMILIES[family](self, rng, size), size)
        for family in photometric:
            size = advance([PHOTOMETRIC_FAMILIES[family](self, rng)], size)
        longest = max(size)
        if longest > self.max_side:
            size = advance([Scale(factor=self.max_side / longest)], size)
        return size

    def draw(self, rng: np.random.Generator, size: Size) -> list[Edit]:
        """The explicit edits of one query made from an image of (H, W) ``size`` (no pixel work:
        each family is drawn for the size the previous edits' geometry gives)."""
        edits: list[Edit] = []

        def advance(new: list[Edit], size: Size) -> Size:
            edits.extend(new)
            for edit in new:
                size = _output_size(edit, size)
            return size

        self._draw(rng, size, advance)
        return edits

    def apply(self, image: Image.Image, rng: np.random.Generator) -> tuple[Image.Image, CoordinateTable, list[dict]]:
        """Edit an RGB ``image``: ``(edited image, table to image, [Edit.to_dict(), ...])``.

        Each family is drawn for the current size of the edited image, then applied with its table.
        """
        table = CoordinateTable.identity(image.height, image.width)
        done: list[dict] = []

        def advance(new: list[Edit], size: Size) -> Size:
            nonlocal image, table
            for edit in new:
                image, table = edit(image, table)
                done.append(edit.to_dict())
            return image.height, image.width

        self._draw(rng, (image.height, image.width), advance)
        return image, table, done


def _output_size(edit: Edit, size: Size) -> Size:
    """(H, W) after a geometric edit (occluding and photometric edits keep the size)."""
    stages = getattr(edit, "stages", None)
    return stages(size)[-1][1] if stages is not None else size
