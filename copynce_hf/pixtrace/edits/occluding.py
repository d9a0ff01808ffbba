"""Occluding edits: something is drawn over the image and the pixels it covers become untraced.

Paper, section "PixTrace Pipeline": overlays (text, emoji, other images, stripes, erased
boxes) hide part of the copied content, so the covered pixels of the copy come from
nowhere in the original. Every edit here computes the *coverage* of its overlay, the
effective opacity (uint8, 0..255) with which the overlay is blended into each pixel,
from the same geometry as the pixel work, and marks the pixels whose effective opacity
exceeds one half (``coverage >= 128``) untraced. Pixels under a fainter overlay (an
anti-aliased glyph border, a half-transparent emoji) keep their trace: the original
still dominates them.

Text, emoji, smearing and erased boxes also have the CopyNCE authors' form of the table
(``covered="mapped"``): their ``MaskMapper`` records nothing for these edits, so the pixels they
cover keep the position they had (:data:`COVERED_FORMS`).

Emoji and stripes are drawn by AugLy; their coverage is computed here by reproducing
AugLy's geometry (and for stripes by calling AugLy's own stripe-mask function), and
the tests check that the pixels AugLy changes are exactly the ones the coverage says.
Text, another image and erased boxes are composited here with Pillow, from the same geometry.

Positions and sizes are fractions of the edited image's size, so an edit (and a
list of edits) applies to images of any size.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ...modeling.errors import EditParameterError
from ..table import CoordinateTable
from .base import Edit, check_range, register_edit
from .sources import image_size, is_procedural, resolve_image

__all__ = [
    "COVERED_ALPHA",
    "COVERED_FORMS",
    "EMOJI_FORMS",
    "ERASED_VALUES",
    "Layer",
    "OccludingEdit",
    "OverlayEmoji",
    "OverlayText",
    "OverlayImage",
    "OverlayStripes",
    "RandomErasing",
    "blend_color",
    "check_covered",
    "emoji_names",
    "erasing_noise",
    "font_characters",
    "font_names",
    "fraction_box",
    "opacity_level",
    "text_ink_box",
]

#: A pixel counts as covered when the overlay's effective opacity is above one half.
COVERED_ALPHA = 128
#: What the table says of the pixels an overlay covers (the ``covered`` field of text, emoji, smearing and erasing):
#: ``"untraced"`` (the paper's PixTrace: covered content comes from nowhere) or ``"mapped"`` (the authors'
#: ``MaskMapper``, which records nothing for these edits: a covered pixel keeps the source position it had).
COVERED_FORMS = ("untraced", "mapped")
#: The values of a :class:`RandomErasing` box filled with noise (``values``): ``"clipped"`` (N(0, 1) on the
#: [0, 1] scale clipped to it: the image is 8-bit) or ``"unclipped"`` (the same 8-bit image; the model input
#: gets the unclipped values, as the authors' ``RandomErasing`` on the tensor before normalisation:
#: :meth:`RandomErasing.noise`, applied by ``copynce_hf.data.PixTraceCollator``).
ERASED_VALUES = ("clipped", "unclipped")


def check_covered(edit: Edit) -> None:
    """Raise :class:`EditParameterError` unless ``edit.covered`` is one of :data:`COVERED_FORMS`."""
    if edit.covered not in COVERED_FORMS:
        raise EditParameterError(f"{edit.name}: parameter covered={edit.covered!r} must be one of {list(COVERED_FORMS)}")


@dataclasses.dataclass(frozen=True)
class Layer:
    """What an occluding edit paints over an image of (H, W), for renderers that blend it in at
    another resolution (:meth:`OccludingEdit.layer`).

    ``coverage`` is the uint8 (H, W) effective opacity of the overlay (the edit's :meth:`~OccludingEdit.coverage`;
    the table is occluded where it is at least :data:`COVERED_ALPHA`). What is painted is one of: a
    flat RGB ``color``; ``pixels``, a uint8 (H, W, 3) image; or the image ``source`` (an image spec or
    a PIL image) resized into ``box`` = (left, top, width, height), clipped by the image.
    """

    coverage: np.ndarray
    color: tuple[int, int, int] | None = None
    pixels: np.ndarray | None = None
    source: Any = None
    box: tuple[int, int, int, int] | None = None

    def colour(self, draw: Callable[[Any, tuple[int, int]], np.ndarray]) -> np.ndarray:
        """The painted colour: uint8 (3,) for a flat colour, else uint8 (H, W, 3).

        ``draw(source, (h, w))`` returns the source image resized to (h, w) as uint8 (h, w, 3).
        """
        if self.color is not None:
            return np.asarray(self.color, dtype=np.uint8)
        if self.pixels is not None:
            return self.pixels
        left, top, width, height = self.box
        canvas = np.zeros(self.coverage.shape + (3,), dtype=np.uint8)
        _place_into(canvas, draw(self.source, (height, width)), left, top)
        return canvas


@dataclasses.dataclass(frozen=True)
class OccludingEdit(Edit):
    """Base class: ``apply`` = pixel work + ``table.occlude(coverage >= COVERED_ALPHA)`` (:meth:`untraced`).

    Edits whose ``scaling`` is ``"relative"`` also describe their paint as a :class:`Layer`
    (:meth:`layer`), which a renderer may blend in at another resolution.
    """

    kind: ClassVar[str] = "occluding"

    def coverage(self, height: int, width: int) -> np.ndarray:
        """uint8 (height, width): effective opacity of the overlay at each pixel (0 = untouched)."""
        raise NotImplementedError

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        """The edited RGB image; ``coverage`` is :meth:`coverage` of the image's size."""
        raise NotImplementedError

    def layer(self, size: tuple[int, int]) -> Layer:
        """What the edit paints over an image of (H, W) ``size`` (edits of ``scaling`` ``"relative"``)."""
        raise NotImplementedError(f"{self.name} has no layer form")

    def untraced(self, coverage: np.ndarray) -> np.ndarray:
        """bool (H, W): the pixels the table loses, those the overlay covers (``coverage >= COVERED_ALPHA``); none
        for an edit whose ``covered`` field is ``"mapped"`` (:data:`COVERED_FORMS`)."""
        if getattr(self, "covered", "untraced") == "mapped":
            return np.zeros(coverage.shape, dtype=bool)
        return coverage >= COVERED_ALPHA

    def apply(self, image: Image.Image, table: CoordinateTable) -> tuple[Image.Image, CoordinateTable]:
        coverage = self.coverage(image.height, image.width)
        edited = self.render(image, coverage)
        if edited.mode != "RGB":
            edited = edited.convert("RGB")
        return edited, table.occlude(self.untraced(coverage))


# ---------------------------------------------------------------------- AugLy, imported on first use


def _augly_image():
    """AugLy's functional image API (imported lazily: it takes a few hundred milliseconds)."""
    import augly.image.functional as augly_functional

    return augly_functional


@functools.lru_cache(maxsize=1)
def _asset_dirs() -> tuple[str, str]:
    """AugLy's bundled (emoji folder, font folder)."""
    from augly.utils import EMOJI_DIR, FONTS_DIR

    return EMOJI_DIR, FONTS_DIR


# ---------------------------------------------------------------------- emoji


#: Forms of :class:`OverlayEmoji`: the package's (AugLy's geometry) and the CopyNCE authors'.
EMOJI_FORMS = ("augly", "authors")


def emoji_names() -> list[str]:
    """The emoji bundled with AugLy, as ``"<category>/<name>.png"`` paths relative to its emoji folder."""
    return _emoji_names()


@functools.lru_cache(maxsize=1)
def _emoji_names() -> list[str]:
    names = []
    emoji_dir = _asset_dirs()[0]
    for category in sorted(os.listdir(emoji_dir)):
        folder = os.path.join(emoji_dir, category)
        if os.path.isdir(folder):
            names += [f"{category}/{name}" for name in sorted(os.listdir(folder)) if name.endswith(".png")]
    return names


def _emoji_path(emoji: str) -> str:
    return emoji if os.path.isabs(emoji) else os.path.join(_asset_dirs()[0], emoji)


@functools.lru_cache(maxsize=64)
def _emoji_image(path: str) -> Image.Image:
    with Image.open(path) as handle:
        handle.load()
        return handle.copy()


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayEmoji(OccludingEdit):
    """Paste one of AugLy's emoji, in one of two forms (``form``):

    * ``"augly"`` (the package's, pixel work by ``augly.image.overlay_emoji``): ``size`` is the emoji's
      height as a fraction of the image height, ``(x, y)`` its top-left corner as fractions of the image
      width and height (an emoji near the right or bottom edge is cut there);
    * ``"authors"`` (the CopyNCE authors' ``RandomOverlayEmoji``, SSCD's overlay): ``size`` is a fraction
      of the largest scale at which the whole emoji fits the image (theirs: 0.1-0.5), the emoji resized
      with bilinear interpolation, and ``(x, y)`` place it within the room left, the corner at
      ``(int(x * (W - w)), int(y * (H - h)))``, so that it always lies inside the image. As their code
      does with Pillow, an emoji stored as a palette image (828 of AugLy's 872) is resized by nearest
      neighbour (Pillow's rule for palette images) and, having no alpha band, pasted as its whole box at
      the opacity (its transparent pixels show their palette colour); emoji with an alpha band are
      pasted through it.

    Args:
        emoji: path relative to AugLy's emoji folder (see :func:`emoji_names`) or an absolute PNG path.
        size: in (0, 1] (see the forms).
        x, y: in [0, 1] (see the forms).
        opacity: in [0, 1]; the emoji's own alpha is multiplied by it (and truncated to 8 bits).
        form: ``"augly"`` or ``"authors"``.
        covered: ``"untraced"`` or ``"mapped"`` (:data:`COVERED_FORMS`).
    """

    name: ClassVar[str] = "overlay_emoji"
    emoji: str = "smileys/smiling_face_with_heart_eyes.png"
    size: float = 0.15
    x: float = 0.4
    y: float = 0.4
    opacity: float = 1.0
    form: str = "augly"
    covered: str = "untraced"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("covered",)

    def __post_init__(self):
        check_covered(self)
        if not isinstance(self.emoji, str) or not os.path.isfile(_emoji_path(self.emoji)):
            raise EditParameterError(f"{self.name}: parameter emoji={self.emoji!r} is not an emoji file")
        check_range(self.name, "size", self.size, 1e-6, 1.0)
        check_range(self.name, "x", self.x, 0.0, 1.0)
        check_range(self.name, "y", self.y, 0.0, 1.0)
        check_range(self.name, "opacity", self.opacity, 0.0, 1.0)
        if self.form not in EMOJI_FORMS:
            raise EditParameterError(f"{self.name}: parameter form={self.form!r} must be one of {list(EMOJI_FORMS)}")

    def to_dict(self) -> dict:
        """As :meth:`Edit.to_dict`; ``form`` is left out when it is ``"augly"`` (the form of the lists of edits
        recorded before the authors' form existed, which thus stay the same)."""
        description = super().to_dict()
        if self.form == "augly":
            del description["params"]["form"]
        return description

    def _placed(self, height: int, width: int) -> tuple[Image.Image, int, int] | None:
        """The emoji resized (in the mode it is stored in) and its top-left corner in an image of
        (height, width); None when empty."""
        emoji = _emoji_image(_emoji_path(self.emoji))
        if self.form == "authors":
            scale = min(width / emoji.width, height / emoji.height) * self.size
            new_width, new_height = int(emoji.width * scale), int(emoji.height * scale)
            if min(new_width, new_height) < 1:
                return None
            resized = emoji.resize((new_width, new_height), Image.BILINEAR)  # nearest for palette images
            return resized, int(self.x * (width - new_width)), int(self.y * (height - new_height))
        # AugLy's overlay_image geometry: height int(H * size) (at least 1), width keeps the emoji's
        # aspect, default resampling, pasted at (int(W * x), int(H * y)) and clipped by the image.
        new_height = max(1, int(height * self.size))
        new_width = int(emoji.width * new_height / emoji.height)
        if new_width < 1:
            return None
        return emoji.resize((new_width, new_height)), int(width * self.x), int(height * self.y)

    def coverage(self, height: int, width: int) -> np.ndarray:
        placed = self._placed(height, width)
        if placed is None:
            return np.zeros((height, width), dtype=np.uint8)
        resized, left, top = placed
        return _place(self._mask(resized), left, top, height, width)

    def _mask(self, resized: Image.Image) -> np.ndarray:
        """uint8 (h, w): the emoji's alpha times the opacity, truncated; without an alpha band (a palette
        emoji in the authors' form) the opacity over the whole box."""
        if self.form == "augly":
            resized = resized.convert("RGBA")
        if "A" not in resized.getbands():
            return np.full((resized.height, resized.width), int(self.opacity * 255), dtype=np.uint8)
        return (np.asarray(resized.getchannel("A")) * self.opacity).astype(np.uint8)

    scaling: ClassVar[str] = "relative"

    def layer(self, size):
        # The emoji is pasted with its alpha times the opacity: that alpha is the coverage.
        height, width = size
        coverage = self.coverage(height, width)
        pixels = np.zeros((height, width, 3), dtype=np.uint8)
        placed = self._placed(height, width) if coverage.any() else None
        if placed is not None:
            resized, left, top = placed
            if self.form == "augly":  # resized from the RGBA emoji
                emoji = _emoji_image(_emoji_path(self.emoji)).convert("RGBA")
                resized = emoji.resize((resized.width, resized.height))
            _place_into(pixels, np.asarray(resized.convert("RGBA"))[..., :3], left, top)
        return Layer(coverage, pixels=pixels)

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        if not coverage.any():
            return image.copy()
        if self.form == "authors":  # pasted onto the RGBA image through the mask, as their code does
            resized, left, top = self._placed(image.height, image.width)
            edited = image.convert("RGBA")
            edited.paste(resized, box=(left, top), mask=Image.fromarray(self._mask(resized), "L"))
            return edited.convert("RGB")
        return _augly_image().overlay_emoji(
            image,
            emoji_path=_emoji_path(self.emoji),
            opacity=self.opacity,
            emoji_size=self.size,
            x_pos=self.x,
            y_pos=self.y,
        )


# ---------------------------------------------------------------------- text


def _font_path(font: str) -> str:
    return font if os.path.isabs(font) else os.path.join(_asset_dirs()[1], font)


@functools.lru_cache(maxsize=256)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def font_characters(font: str) -> str:
    """The characters AugLy lists as drawable in one of its bundled fonts (``"<name>.ttf"``)."""
    return _font_characters(font)


@functools.lru_cache(maxsize=64)
def _font_characters(font: str) -> str:
    listing = os.path.splitext(_font_path(font))[0] + ".pkl"
    if not os.path.isfile(listing):
        raise EditParameterError(f"font {font!r} has no AugLy character listing {listing}")
    with open(listing, "rb") as handle:
        return "".join(chr(code) for code in pickle.load(handle))


def font_names() -> tuple[str, ...]:
    """Every font of AugLy's font folder that has AugLy's character listing (``"<name>.ttf"``, sorted)."""
    return _font_names()


@functools.lru_cache(maxsize=1)
def _font_names() -> tuple[str, ...]:
    folder = _asset_dirs()[1]
    return tuple(sorted(name for name in os.listdir(folder)
                        if name.endswith(".ttf") and os.path.isfile(os.path.join(folder, name[:-4] + ".pkl"))))


def text_ink_box(text: str, font: str, pixels: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the ink of ``text`` in ``font`` at ``pixels`` pixels, relative to the
    anchor :class:`OverlayText` draws it at (Pillow's ``getbbox``); left and top may be negative."""
    return tuple(int(v) for v in _font(_font_path(font), pixels).getbbox(text))


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayText(OccludingEdit):
    """Draw a line of text; covered pixels are those where the drawn glyph alpha times opacity > 1/2.

    Args:
        text: the string drawn (newlines start new lines), at least one character.
        font: a TrueType file name in AugLy's font folder or an absolute ``.ttf`` path.
        font_size: glyph size as a fraction of ``min(H, W)`` (AugLy's convention), in (0, 1].
        color: RGB text colour.
        x, y: anchor of the text's top-left as fractions of the image width and height.
        opacity: in [0, 1].
        covered: ``"untraced"`` or ``"mapped"`` (:data:`COVERED_FORMS`).
    """

    name: ClassVar[str] = "overlay_text"
    text: str = "copy"
    font: str = "IBMPlexSans-Bold.ttf"
    font_size: float = 0.15
    color: tuple[int, int, int] = (255, 0, 0)
    x: float = 0.1
    y: float = 0.4
    opacity: float = 1.0
    covered: str = "untraced"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("covered",)

    def __post_init__(self):
        check_covered(self)
        if not isinstance(self.text, str) or not self.text.strip():
            raise EditParameterError(f"{self.name}: parameter text={self.text!r} must be a non-empty string")
        if not isinstance(self.font, str) or not os.path.isfile(_font_path(self.font)):
            raise EditParameterError(f"{self.name}: parameter font={self.font!r} is not a font file")
        check_range(self.name, "font_size", self.font_size, 1e-6, 1.0)
        _check_color(self, "color", self.color)
        check_range(self.name, "x", self.x, 0.0, 1.0)
        check_range(self.name, "y", self.y, 0.0, 1.0)
        check_range(self.name, "opacity", self.opacity, 0.0, 1.0)

    def coverage(self, height: int, width: int) -> np.ndarray:
        pixels = max(1, int(min(height, width) * self.font_size))
        layer = Image.new("L", (width, height), 0)
        ImageDraw.Draw(layer).text(
            (self.x * width, self.y * height), self.text, fill=255, font=_font(_font_path(self.font), pixels)
        )
        return _scale_alpha(np.asarray(layer), self.opacity)

    scaling: ClassVar[str] = "relative"

    def layer(self, size):
        return Layer(self.coverage(*size), color=self.color)

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        return blend_color(image, self.color, coverage)


# ---------------------------------------------------------------------- another image


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayImage(OccludingEdit):
    """Paste another image onto this one ("another image onto it"); opacity > 1/2 counts as covered.

    Args:
        overlay: image spec of the pasted image (see :mod:`.sources`) or a PIL image.
        size: pasted height as a fraction of this image's height, in (0, 1]; the
            overlay keeps its aspect ratio (its width is clipped by the image border).
        x, y: top-left corner as fractions of this image's width and height, in [0, 1].
        opacity: in [0, 1].
    """

    name: ClassVar[str] = "overlay_image"
    overlay: Any = dataclasses.field(default_factory=lambda: {"kind": "noise", "seed": 0, "size": [64, 64]})
    size: float = 0.4
    x: float = 0.3
    y: float = 0.3
    opacity: float = 1.0

    def __post_init__(self):
        if not isinstance(self.overlay, (dict, Image.Image)):
            raise EditParameterError(f"{self.name}: parameter overlay={self.overlay!r} must be an image spec")
        check_range(self.name, "size", self.size, 1e-6, 1.0)
        check_range(self.name, "x", self.x, 0.0, 1.0)
        check_range(self.name, "y", self.y, 0.0, 1.0)
        check_range(self.name, "opacity", self.opacity, 0.0, 1.0)

    def _geometry(self, height: int, width: int, overlay_size: tuple[int, int]) -> tuple[int, int, int, int]:
        overlay_width, overlay_height = overlay_size
        new_height = max(1, int(round(height * self.size)))
        new_width = max(1, int(round(overlay_width * new_height / overlay_height)))
        return int(width * self.x), int(height * self.y), new_width, new_height

    def coverage(self, height: int, width: int) -> np.ndarray:
        return self._coverage(height, width, resolve_image(self.overlay).size)

    def _coverage(self, height: int, width: int, overlay_size: tuple[int, int]) -> np.ndarray:
        left, top, new_width, new_height = self._geometry(height, width, overlay_size)
        alpha = np.full((new_height, new_width), opacity_level(self.opacity), dtype=np.uint8)
        return _place(alpha, left, top, height, width)

    scaling: ClassVar[str] = "relative"

    def layer(self, size):
        # A file is read once here (its size places it, its pixels fill the layer); procedural images
        # say their size, so that a renderer may draw them straight at the placed size.
        height, width = size
        overlay = self.overlay if is_procedural(self.overlay) else resolve_image(self.overlay)
        native_height, native_width = image_size(overlay)
        box = self._geometry(height, width, (native_width, native_height))
        return Layer(self._coverage(height, width, (native_width, native_height)), source=overlay, box=box)

    def apply(self, image: Image.Image, table: CoordinateTable) -> tuple[Image.Image, CoordinateTable]:
        overlay = resolve_image(self.overlay)  # resolved once for both geometry and pixels
        coverage = self._coverage(image.height, image.width, overlay.size)
        return self._render(image, overlay), table.occlude(coverage >= COVERED_ALPHA)

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        return self._render(image, resolve_image(self.overlay))

    def _render(self, image: Image.Image, overlay: Image.Image) -> Image.Image:
        left, top, new_width, new_height = self._geometry(image.height, image.width, overlay.size)
        resized = overlay.resize((new_width, new_height), Image.BILINEAR)
        edited = image.copy()
        # PIL clips the paste at the border exactly as _place clips the coverage.
        edited.paste(resized, (left, top), mask=Image.new("L", resized.size, opacity_level(self.opacity)))
        return edited


# ---------------------------------------------------------------------- stripes


_LINE_TYPES = ("solid", "dotted", "dashed")


@register_edit
@dataclasses.dataclass(frozen=True)
class OverlayStripes(OccludingEdit):
    """AugLy's stripe pattern (pixel work by ``augly.image.overlay_stripes``).

    Args:
        line_width: stripe width as a fraction of the stripe period, in (0, 1].
        line_color: RGB stripe colour.
        line_angle: degrees, in [-360, 360].
        line_density: in [0, 0.95]; higher means closer stripes.
        line_type: "solid", "dotted" or "dashed".
        line_opacity: in [0, 1].
    """

    name: ClassVar[str] = "overlay_stripes"
    line_width: float = 0.5
    line_color: tuple[int, int, int] = (255, 255, 255)
    line_angle: float = 0.0
    line_density: float = 0.5
    line_type: str = "solid"
    line_opacity: float = 1.0

    def __post_init__(self):
        check_range(self.name, "line_width", self.line_width, 1e-6, 1.0)
        _check_color(self, "line_color", self.line_color)
        check_range(self.name, "line_angle", self.line_angle, -360.0, 360.0)
        check_range(self.name, "line_density", self.line_density, 0.0, 0.95)
        if self.line_type not in _LINE_TYPES:
            raise EditParameterError(f"{self.name}: parameter line_type={self.line_type!r} not in {_LINE_TYPES}")
        check_range(self.name, "line_opacity", self.line_opacity, 0.0, 1.0)

    def coverage(self, height: int, width: int) -> np.ndarray:
        # Exactly AugLy's mask: the stripe function, times the perpendicular pattern for
        # dotted (same width) and dashed (width 0.7) lines, times opacity, cast to uint8.
        from augly.image.utils import compute_stripe_mask

        mask = compute_stripe_mask(width, height, self.line_width, self.line_angle, self.line_density)
        if self.line_type != "solid":
            cross_width = self.line_width if self.line_type == "dotted" else 0.7
            mask = mask * compute_stripe_mask(width, height, cross_width, self.line_angle + 90, self.line_density)
        return np.uint8(mask * self.line_opacity * 255)

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        return _augly_image().overlay_stripes(
            image,
            line_width=self.line_width,
            line_color=tuple(self.line_color),
            line_angle=self.line_angle,
            line_density=self.line_density,
            line_type=self.line_type,
            line_opacity=self.line_opacity,
        )


# ---------------------------------------------------------------------- erasing


@register_edit
@dataclasses.dataclass(frozen=True)
class RandomErasing(OccludingEdit):
    """Fill a box with a flat colour (random erasing with explicit, drawn-beforehand parameters).

    Args:
        x, y: top-left corner as fractions of the image width and height, in [0, 1).
        width, height: box size as fractions of the image size, in (0, 1]; the box must
            fit (``x + width <= 1``, ``y + height <= 1``). At least one pixel is erased.
        fill: RGB fill colour.
        noise_seed: ``None`` fills the box with ``fill``; an integer fills it with random values
            instead (torchvision's ``value="random"``: standard normal values on the [0, 1] scale,
            :meth:`noise`), drawn from a generator with this seed.
        values: ``"clipped"`` or ``"unclipped"`` (:data:`ERASED_VALUES`): the image holds the noise clipped to
            8 bits either way; ``"unclipped"`` says that the model input holds it unclipped (the collator
            writes :meth:`noise` into the normalised pixels, as the authors erase their tensor before
            normalising it). Only with a ``noise_seed``.
        covered: ``"untraced"`` or ``"mapped"`` (:data:`COVERED_FORMS`).
    """

    name: ClassVar[str] = "random_erasing"
    x: float = 0.25
    y: float = 0.25
    width: float = 0.25
    height: float = 0.25
    fill: tuple[int, int, int] = (0, 0, 0)
    noise_seed: int | None = None
    values: str = "clipped"
    covered: str = "untraced"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("values", "covered")

    def __post_init__(self):
        check_covered(self)
        if self.values not in ERASED_VALUES:
            raise EditParameterError(f"{self.name}: parameter values={self.values!r} must be one of {list(ERASED_VALUES)}")
        if self.values == "unclipped" and self.noise_seed is None:
            raise EditParameterError(f"{self.name}: parameter values='unclipped' needs a noise_seed (a flat fill "
                                     "has no values beyond 8 bits)")
        check_range(self.name, "x", self.x, 0.0, 1.0)
        check_range(self.name, "y", self.y, 0.0, 1.0)
        check_range(self.name, "width", self.width, 1e-6, 1.0 - self.x + 1e-9)
        check_range(self.name, "height", self.height, 1e-6, 1.0 - self.y + 1e-9)
        _check_color(self, "fill", self.fill)
        if self.noise_seed is not None and (
            isinstance(self.noise_seed, bool) or not isinstance(self.noise_seed, (int, np.integer)) or self.noise_seed < 0
        ):
            raise EditParameterError(f"{self.name}: parameter noise_seed={self.noise_seed!r} must be None or an integer >= 0")

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Pixel box ``(left, top, right, bottom)`` (right and bottom exclusive) on an image of that size."""
        return fraction_box(self.x, self.y, self.width, self.height, height, width)

    def coverage(self, height: int, width: int) -> np.ndarray:
        left, top, right, bottom = self.box(height, width)
        coverage = np.zeros((height, width), dtype=np.uint8)
        coverage[top:bottom, left:right] = 255
        return coverage

    scaling: ClassVar[str] = "relative"

    def layer(self, size):
        coverage = self.coverage(*size)
        if self.noise_seed is None:
            return Layer(coverage, color=self.fill)
        # Random values (torchvision's value="random"), drawn at the true size.
        blank = Image.new("RGB", (size[1], size[0]))
        return Layer(coverage, pixels=np.asarray(self.render(blank, coverage)))

    def noise(self, height: int, width: int) -> np.ndarray:
        """float64 (h, w, 3): the values of the erased box on an image of (``height``, ``width``), standard normal
        on the [0, 1] scale (torchvision's ``value="random"``), drawn from ``noise_seed``; the image holds them
        clipped to 8 bits."""
        left, top, right, bottom = self.box(height, width)
        return erasing_noise(self.noise_seed, bottom - top, right - left)

    def render(self, image: Image.Image, coverage: np.ndarray) -> Image.Image:
        pixels = np.array(image)
        covered = coverage == 255
        if self.noise_seed is None:
            pixels[covered] = np.asarray(self.fill, dtype=np.uint8)
        else:  # the box's pixels in row-major order, as the noise's rows
            noise = self.noise(image.height, image.width).reshape(-1, 3)
            pixels[covered] = np.clip(np.rint(noise * 255.0), 0, 255).astype(np.uint8)
        return Image.fromarray(pixels, "RGB")


def erasing_noise(seed: int, rows: int, cols: int) -> np.ndarray:
    """float64 (rows, cols, 3): the standard normal values :class:`RandomErasing` fills a box with (row-major)."""
    return np.random.default_rng(seed).standard_normal((rows * cols, 3)).reshape(rows, cols, 3)


def fraction_box(x: float, y: float, box_width: float, box_height: float, height: int,
                 width: int) -> tuple[int, int, int, int]:
    """Pixel box ``(left, top, right, bottom)`` (exclusive) of a box given as fractions of a ``height`` x ``width``
    image; at least one pixel."""
    left = min(int(round(x * width)), width - 1)
    top = min(int(round(y * height)), height - 1)
    right = min(width, max(left + 1, int(round((x + box_width) * width))))
    bottom = min(height, max(top + 1, int(round((y + box_height) * height))))
    return left, top, right, bottom


# ---------------------------------------------------------------------- helpers


def _check_color(edit: Edit, key: str, color) -> None:
    """Check an RGB parameter of ``edit`` and store it as a tuple of ints."""
    if (
        not isinstance(color, (tuple, list))
        or len(color) != 3
        or not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) and 0 <= c <= 255 for c in color)
    ):
        raise EditParameterError(f"{edit.name}: parameter {key}={color!r} must be three integers in [0, 255]")
    object.__setattr__(edit, key, tuple(int(c) for c in color))


def opacity_level(opacity: float) -> int:
    return int(np.floor(opacity * 255 + 0.5))


def _scale_alpha(alpha: np.ndarray, opacity: float) -> np.ndarray:
    if opacity >= 1.0:
        return alpha.astype(np.uint8, copy=True)
    return np.floor(alpha.astype(np.float32) * opacity + 0.5).astype(np.uint8)


def _place(patch: np.ndarray, left: int, top: int, height: int, width: int) -> np.ndarray:
    """uint8 (height, width) canvas of zeros with ``patch`` pasted at (left, top), clipped."""
    canvas = np.zeros((height, width), dtype=np.uint8)
    _place_into(canvas, patch, left, top)
    return canvas


def _place_into(canvas: np.ndarray, patch: np.ndarray, left: int, top: int) -> None:
    height, width = canvas.shape[:2]
    right = min(width, left + patch.shape[1])
    bottom = min(height, top + patch.shape[0])
    if right > left and bottom > top:
        canvas[top:bottom, left:right] = patch[: bottom - top, : right - left]


def blend_color(image: Image.Image, color, coverage: np.ndarray) -> Image.Image:
    """``image`` with ``color`` blended in by ``coverage`` (0 keeps the pixel, 255 replaces it)."""
    edited = image.copy()
    edited.paste(tuple(int(c) for c in color), (0, 0, image.width, image.height), mask=Image.fromarray(coverage, "L"))
    return edited
