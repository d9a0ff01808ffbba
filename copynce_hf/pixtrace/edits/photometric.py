"""Photometric edits: pixel values change, positions do not, so the table is returned unchanged.

Paper, section "PixTrace Pipeline": colour jitter and similar edits keep every pixel where
it was (f is the identity on the table). Pixelisation and pixel shuffling are treated as
photometric too: pixelisation resamples the image down and
back up to its own size, and shuffling moves a fraction of the pixels to random places,
both without moving the content's frame.

The pixel work uses AugLy where it has the operation and is fast (brightness, contrast,
saturation, colour jitter, greyscale, blur, sharpen, JPEG, pixelisation, PIL filters);
noise and pixel shuffling are done with numpy, seeded by the edit's explicit ``seed`` (AugLy's versions are
several times slower).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from typing import ClassVar

import cv2
import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from ...modeling.errors import EditParameterError
from ..table import CoordinateTable
from .albumentations_131 import REIMPLEMENTED, apply_1_3_1
from .albumentations_defaults import authors_parameters
from .base import Edit, check_range, register_edit

__all__ = [
    "PhotometricEdit",
    "ColorJitter",
    "Brightness",
    "Contrast",
    "Saturation",
    "Grayscale",
    "Blur",
    "Sharpen",
    "JpegQuality",
    "Noise",
    "Pixelization",
    "ShufflePixels",
    "Solarize",
    "Posterize",
    "EdgeEnhance",
    "ALBUMENTATIONS_OPS",
    "COLOR_JITTER_FORMS",
    "POINTWISE_ALBUMENTATIONS",
    "SHUFFLE_FORMS",
    "Albumentation",
    "gaussian_blur",
    "hue_rotation",
]

#: Upper bound of the enhancement factors (1.0 = unchanged).
MAX_FACTOR = 10.0
#: Forms of :class:`ShufflePixels`: the package's (``"numpy"``) and AugLy's, as the CopyNCE authors run it.
SHUFFLE_FORMS = ("numpy", "augly")


def _augly_image():
    """AugLy's functional image API (imported lazily: it takes a few hundred milliseconds)."""
    import augly.image.functional as augly_functional

    return augly_functional


@dataclasses.dataclass(frozen=True)
class PhotometricEdit(Edit):
    """Base class: ``apply`` returns ``(transform(image), table)`` with the table untouched."""

    kind: ClassVar[str] = "photometric"

    def transform(self, image: Image.Image) -> Image.Image:
        """The edited RGB image, same size as ``image``."""
        raise NotImplementedError

    def apply(self, image: Image.Image, table: CoordinateTable) -> tuple[Image.Image, CoordinateTable]:
        edited = self.transform(image)
        if edited.mode != "RGB":
            edited = edited.convert("RGB")
        return edited, table

    def render_array(self, pixels: np.ndarray, true_size: tuple[int, int], density: tuple[float, float] | None = None,
                     visible: np.ndarray | None = None) -> np.ndarray:
        """The edit on uint8 (h, w, 3) ``pixels`` that show its input, drawn for (H, W) ``true_size``.

        For renderers that work at another resolution (see ``Edit.scaling``): ``density`` is the
        (rows, cols) of the true-size image per pixel of ``pixels`` where the two differ by more than a
        resize (inside a resampling pass), ``visible`` the bool (h, w) mask of the pixels that stay in
        sight (None: all). The default goes through :meth:`transform`; edits override it with a faster
        equivalent or one that follows the resolution.
        """
        edited = self.transform(Image.fromarray(pixels, "RGB"))
        return np.asarray(edited if edited.mode == "RGB" else edited.convert("RGB"))


def _check_int(edit: str, key: str, value, low: int, high: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not low <= value <= high:
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be an integer in [{low}, {high}]")


def _check_seed(edit: str, seed) -> None:
    _check_int(edit, "seed", seed, 0, 2**63 - 1)


@register_edit
@dataclasses.dataclass(frozen=True)
class ColorJitter(PhotometricEdit):
    """Brightness, contrast and saturation factors (1 = unchanged) and a hue change, in one of two forms:

    * ``form="augly"`` (the package's): brightness, contrast and saturation in this order with AugLy's
      ``color_jitter`` (Pillow ``ImageEnhance``), then a hue rotation by ``hue`` of the colour circle (a
      luma-keeping rotation of the YIQ chroma plane, in HSV's direction);
    * ``form="torchvision"`` (the CopyNCE authors' ``ColorJitter``, torchvision's on PIL images): the four
      in the drawn ``order`` (0 brightness, 1 contrast, 2 saturation, 3 hue), brightness, contrast and
      saturation by ``ImageEnhance``, the hue by shifting Pillow's 8-bit HSV hue channel by
      ``int(hue * 255)`` modulo 256.

    Args:
        brightness, contrast, saturation: enhancement factors in [0, 10].
        hue: in [-0.5, 0.5], a fraction of the colour circle.
        form: ``"augly"`` or ``"torchvision"``; order: a permutation of (0, 1, 2, 3) (``torchvision`` form).
    """

    name: ClassVar[str] = "color_jitter"
    brightness: float = 1.0
    contrast: float = 1.0
    saturation: float = 1.0
    hue: float = 0.0
    form: str = "augly"
    order: tuple[int, ...] = (0, 1, 2, 3)

    def __post_init__(self):
        for key in ("brightness", "contrast", "saturation"):
            check_range(self.name, key, getattr(self, key), 0.0, MAX_FACTOR)
        check_range(self.name, "hue", self.hue, -0.5, 0.5)
        if self.form not in COLOR_JITTER_FORMS:
            raise EditParameterError(f"{self.name}: parameter form={self.form!r} must be one of {list(COLOR_JITTER_FORMS)}")
        order = tuple(int(index) for index in self.order) if isinstance(self.order, (list, tuple)) else None
        if order is None or sorted(order) != [0, 1, 2, 3]:
            raise EditParameterError(f"{self.name}: parameter order={self.order!r} must be a permutation of 0, 1, 2, 3")
        object.__setattr__(self, "order", order)

    def to_dict(self) -> dict:
        """As :meth:`Edit.to_dict`; the AugLy form leaves ``form`` and ``order`` out (lists recorded before the
        torchvision form existed stay the same)."""
        description = super().to_dict()
        if self.form == "augly":
            del description["params"]["form"], description["params"]["order"]
        return description

    def transform(self, image: Image.Image) -> Image.Image:
        if self.form == "torchvision":
            return _torchvision_jitter(image, self)
        edited = _augly_image().color_jitter(
            image,
            brightness_factor=self.brightness,
            contrast_factor=self.contrast,
            saturation_factor=self.saturation,
        )
        return _rotate_hue(edited, self.hue)

    scaling: ClassVar[str] = "pointwise"

    def render_array(self, pixels, true_size, density=None, visible=None):
        if self.form == "torchvision":  # Pillow's operations on the array (contrast over the whole array)
            return np.asarray(_torchvision_jitter(Image.fromarray(pixels, "RGB"), self))
        # AugLy's colour jitter is Pillow's ImageEnhance brightness, contrast and colour, each a blend
        # with a degenerate image clipped to 8 bits, then the hue rotation: the same affine colour maps
        # here, each one pass of ``cv2.transform`` (which saturates to 8 bits like the blends). The
        # contrast's mean grey is that of the ``visible`` pixels.
        identity = np.eye(3)
        if self.brightness != 1.0:
            pixels = cv2.transform(pixels, self.brightness * identity)
        if self.contrast != 1.0:
            luma = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
            mean = int((luma.mean() if visible is None or not visible.any() else luma[visible].mean()) + 0.5)
            offset = np.full((3, 1), (1.0 - self.contrast) * mean)
            pixels = cv2.transform(pixels, np.hstack([self.contrast * identity, offset]))
        if self.saturation != 1.0:
            pixels = cv2.transform(pixels, self.saturation * identity + (1.0 - self.saturation) * np.ones((3, 1)) @ _LUMA)
        if self.hue != 0.0:
            pixels = cv2.transform(pixels, hue_rotation(self.hue))
        return pixels


#: Forms of :class:`ColorJitter`: the package's (AugLy, YIQ hue rotation) and torchvision's (the authors').
COLOR_JITTER_FORMS = ("augly", "torchvision")


def _torchvision_jitter(image: Image.Image, jitter: ColorJitter) -> Image.Image:
    """torchvision's ``ColorJitter`` on a PIL image with ``jitter``'s factors, in its ``order``."""
    for index in jitter.order:
        if index == 0:
            image = ImageEnhance.Brightness(image).enhance(jitter.brightness)
        elif index == 1:
            image = ImageEnhance.Contrast(image).enhance(jitter.contrast)
        elif index == 2:
            image = ImageEnhance.Color(image).enhance(jitter.saturation)
        elif jitter.hue != 0.0:
            hue, saturation, value = image.convert("HSV").split()
            shifted = (np.asarray(hue, dtype=np.int64) + int(jitter.hue * 255)) % 256  # wraps as 8-bit sums do
            image = Image.merge("HSV", (Image.fromarray(shifted.astype(np.uint8), "L"), saturation, value)).convert("RGB")
    return image


#: Pillow's "L" conversion (ITU-R 601-2 luma), used by ``ImageEnhance`` and greyscale.
_LUMA = np.array([[0.299, 0.587, 0.114]])


#: RGB -> YIQ (NTSC): luma and two chroma axes; a hue rotation turns the chroma plane.
_RGB_TO_YIQ = np.array([[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]])


def _rotate_hue(image: Image.Image, hue: float) -> Image.Image:
    """Rotate the hue by ``hue`` turns, keeping luma: one 3x3 colour matrix in YIQ space.

    The direction matches HSV's (red -> green -> blue for positive ``hue``); the matrix is
    applied by Pillow's ``convert`` in one pass (about ten times faster than an HSV
    round trip on a 500x375 image).
    """
    if hue == 0.0:
        return image
    matrix = hue_rotation(hue)
    return image.convert("RGB", tuple(np.concatenate([matrix, np.zeros((3, 1))], axis=1).ravel()))


def hue_rotation(hue: float) -> np.ndarray:
    """(3, 3) RGB colour matrix rotating the hue by ``hue`` turns around the YIQ luma axis."""
    angle = -2.0 * math.pi * hue
    cos, sin = math.cos(angle), math.sin(angle)
    rotation = np.array([[1.0, 0.0, 0.0], [0.0, cos, -sin], [0.0, sin, cos]])
    return np.linalg.inv(_RGB_TO_YIQ) @ rotation @ _RGB_TO_YIQ


@register_edit
@dataclasses.dataclass(frozen=True)
class Brightness(PhotometricEdit):
    """Brightness factor in [0, 10] (AugLy ``brightness``; 1 = unchanged, 0 = black)."""

    name: ClassVar[str] = "brightness"
    scaling: ClassVar[str] = "pointwise"
    factor: float = 1.0

    def __post_init__(self):
        check_range(self.name, "factor", self.factor, 0.0, MAX_FACTOR)

    def transform(self, image: Image.Image) -> Image.Image:
        return _augly_image().brightness(image, factor=self.factor)


@register_edit
@dataclasses.dataclass(frozen=True)
class Contrast(PhotometricEdit):
    """Contrast factor in [0, 10] (AugLy ``contrast``; 1 = unchanged, 0 = flat grey)."""

    name: ClassVar[str] = "contrast"
    scaling: ClassVar[str] = "pointwise"
    factor: float = 1.0

    def __post_init__(self):
        check_range(self.name, "factor", self.factor, 0.0, MAX_FACTOR)

    def transform(self, image: Image.Image) -> Image.Image:
        return _augly_image().contrast(image, factor=self.factor)


@register_edit
@dataclasses.dataclass(frozen=True)
class Saturation(PhotometricEdit):
    """Saturation factor in [0, 10] (AugLy ``saturation``; 1 = unchanged, 0 = greyscale)."""

    name: ClassVar[str] = "saturation"
    scaling: ClassVar[str] = "pointwise"
    factor: float = 1.0

    def __post_init__(self):
        check_range(self.name, "factor", self.factor, 0.0, MAX_FACTOR)

    def transform(self, image: Image.Image) -> Image.Image:
        return _augly_image().saturation(image, factor=self.factor)


@register_edit
@dataclasses.dataclass(frozen=True)
class Grayscale(PhotometricEdit):
    """Greyscale, kept as RGB (AugLy ``grayscale``; ``mode`` "luminosity" or "average")."""

    name: ClassVar[str] = "grayscale"
    mode: str = "luminosity"

    def __post_init__(self):
        if self.mode not in ("luminosity", "average"):
            raise EditParameterError(f"{self.name}: parameter mode={self.mode!r} must be 'luminosity' or 'average'")

    def transform(self, image: Image.Image) -> Image.Image:
        return _augly_image().grayscale(image, mode=self.mode)

    scaling: ClassVar[str] = "pointwise"

    def render_array(self, pixels, true_size, density=None, visible=None):
        if self.mode != "luminosity":
            return super().render_array(pixels, true_size)
        return cv2.cvtColor(cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)  # Pillow's "L" luma


@register_edit
@dataclasses.dataclass(frozen=True)
class Blur(PhotometricEdit):
    """Gaussian blur of ``radius`` pixels, in [0, 50] (AugLy ``blur``)."""

    name: ClassVar[str] = "blur"
    radius: float = 2.0

    def __post_init__(self):
        check_range(self.name, "radius", self.radius, 0.0, 50.0)

    def transform(self, image: Image.Image) -> Image.Image:
        if self.radius == 0:  # AugLy refuses a zero radius; no blur is the identity
            return image.copy()
        return _augly_image().blur(image, radius=self.radius)

    scaling: ClassVar[str] = "pointwise"

    def render_array(self, pixels, true_size, density=None, visible=None):
        # The Gaussian of standard deviation ``radius`` (Pillow's ``GaussianBlur``), computed by OpenCV;
        # ``radius`` pixels of the true-size image are radius / density pixels here, per axis.
        if density is None:
            density = (true_size[0] / pixels.shape[0], true_size[1] / pixels.shape[1])
        sigma_y, sigma_x = (self.radius / max(d, 1e-6) for d in density)
        if max(sigma_y, sigma_x) <= 0:
            return pixels
        return gaussian_blur(pixels, max(sigma_y, 1e-3), max(sigma_x, 1e-3))


#: A blur wider than this (pixels) is computed on a box-reduced image (see gaussian_blur).
_REDUCED_BLUR_AT = 4.0


def gaussian_blur(pixels: np.ndarray, sigma_y: float, sigma_x: float) -> np.ndarray:
    """``pixels`` (H, W, C) uint8 blurred by a Gaussian of standard deviations ``(sigma_y, sigma_x)``.

    A wide blur leaves no detail finer than about sigma / 2, so it is computed on the image
    box-reduced by an integer factor f <= sigma / 2 and brought back by bilinear interpolation: the
    box (variance f^2 / 12) and the interpolation tent (about f^2 / 6) are subtracted from the
    Gaussian's variance, so the composition has the requested width. Its cost no longer grows with
    sigma (a direct 6-sigma kernel at sigma = 20 is ~30 times slower); the difference from the exact
    blur is far below what 8-bit rounding and resampling already give (PSNR >= 40 dB against the exact
    Gaussian for sigma up to 20, tested).
    """
    height, width = pixels.shape[:2]
    factor = int(min(sigma_y, sigma_x) / 2) if min(sigma_y, sigma_x) >= _REDUCED_BLUR_AT else 1
    factor = min(factor, height // 8, width // 8)
    if factor < 2:
        return cv2.GaussianBlur(pixels, (0, 0), sigmaX=sigma_x, sigmaY=sigma_y)
    small_h, small_w = math.ceil(height / factor), math.ceil(width / factor)
    padded = cv2.copyMakeBorder(pixels, 0, small_h * factor - height, 0, small_w * factor - width,
                                cv2.BORDER_REPLICATE)
    small = cv2.resize(padded, (small_w, small_h), interpolation=cv2.INTER_AREA)
    residual_y, residual_x = (math.sqrt(max(s * s / (factor * factor) - 0.25, 0.04)) for s in (sigma_y, sigma_x))
    small = cv2.GaussianBlur(small, (0, 0), sigmaX=residual_x, sigmaY=residual_y)
    # Back to full size: small pixel j covers [f j, f (j + 1)), its centre f j + (f - 1) / 2.
    back = np.array([[1.0 / factor, 0.0, -(factor - 1) / (2 * factor)], [0.0, 1.0 / factor, -(factor - 1) / (2 * factor)]])
    return cv2.warpAffine(small, back, (width, height), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REPLICATE)


@register_edit
@dataclasses.dataclass(frozen=True)
class Sharpen(PhotometricEdit):
    """Sharpness factor in [0, 10] (AugLy ``sharpen``; 1 = unchanged, above 1 sharper)."""

    name: ClassVar[str] = "sharpen"
    factor: float = 2.0

    def __post_init__(self):
        check_range(self.name, "factor", self.factor, 0.0, MAX_FACTOR)

    def transform(self, image: Image.Image) -> Image.Image:
        return _augly_image().sharpen(image, factor=self.factor)


@register_edit
@dataclasses.dataclass(frozen=True)
class JpegQuality(PhotometricEdit):
    """Re-encode as JPEG at ``quality`` in [1, 100] (AugLy ``encoding_quality``)."""

    name: ClassVar[str] = "jpeg_quality"
    quality: int = 50

    def __post_init__(self):
        _check_int(self.name, "quality", self.quality, 1, 100)

    def transform(self, image: Image.Image) -> Image.Image:
        return _augly_image().encoding_quality(image, quality=int(self.quality))


@register_edit
@dataclasses.dataclass(frozen=True)
class Noise(PhotometricEdit):
    """Additive Gaussian noise, independent per pixel and channel (numpy, seeded).

    Args:
        std: standard deviation as a fraction of the 0..255 range, in [0, 1].
        seed: seed of the noise (non-negative integer), so that the edit replays exactly.
    """

    name: ClassVar[str] = "noise"
    std: float = 0.05
    seed: int = 0

    def __post_init__(self):
        check_range(self.name, "std", self.std, 0.0, 1.0)
        _check_seed(self.name, self.seed)

    def transform(self, image: Image.Image) -> Image.Image:
        # Gaussian samples by inverse-CDF look-up of 16-bit uniform draws: 65536 quantiles
        # are finer than the 8-bit output, and this is several times faster than
        # ``standard_normal`` on a full image.
        levels = np.rint(_gaussian_quantiles() * np.float32(self.std * 255.0)).astype(np.int16)
        draws = np.random.default_rng(self.seed).integers(0, 65536, size=(image.height, image.width, 3), dtype=np.uint16)
        pixels = np.asarray(image).astype(np.int16) + levels[draws]
        return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


@functools.lru_cache(maxsize=1)
def _gaussian_quantiles() -> np.ndarray:
    """float32 (65536,): standard normal quantiles at the centres of 65536 equal-probability bins."""
    normal = statistics.NormalDist()
    return np.array([normal.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)


@register_edit
@dataclasses.dataclass(frozen=True)
class Pixelization(PhotometricEdit):
    """Resize down by ``ratio`` in (0, 1] and back up to the same size (AugLy ``pixelization``).

    The reduced size is at least one pixel per side.
    """

    name: ClassVar[str] = "pixelization"
    ratio: float = 0.5

    def __post_init__(self):
        check_range(self.name, "ratio", self.ratio, 1e-6, 1.0)

    def transform(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        if int(width * self.ratio) >= 1 and int(height * self.ratio) >= 1:
            return _augly_image().pixelization(image, ratio=self.ratio)
        small = image.resize((max(1, int(width * self.ratio)), max(1, int(height * self.ratio))))
        return small.resize((width, height))

    scaling: ClassVar[str] = "relative"

    def render_array(self, pixels, true_size, density=None, visible=None):
        # The blocks are a fraction of the image: at another resolution the ratio follows it.
        scale = math.sqrt(pixels.shape[0] * pixels.shape[1] / (true_size[0] * true_size[1]))
        resampled = dataclasses.replace(self, ratio=min(1.0, self.ratio / scale))
        return PhotometricEdit.render_array(resampled, pixels, true_size)


@register_edit
@dataclasses.dataclass(frozen=True)
class ShufflePixels(PhotometricEdit):
    """Permute a random fraction ``factor`` in [0, 1] of the pixels among themselves (numpy, seeded).

    The shuffled pixels no longer show their traced content, but they are not overlays
    either: like AugLy's ``shuffle_pixels`` this is treated as noise on the pixel values.

    ``form`` (:data:`SHUFFLE_FORMS`): ``"numpy"`` (the package's: ``round(factor * N)`` of the ``N`` pixels,
    chosen and permuted by NumPy's ``default_rng(seed)``) or ``"augly"`` (AugLy's ``shuffle_pixels``, as the
    CopyNCE authors run it: ``int(factor * N)`` pixels chosen and shuffled by NumPy's legacy generator seeded
    with ``seed``, pixel for pixel the same; AugLy seeds NumPy's global generator for it, this edit a
    generator of its own, so that nothing else's draws change).
    """

    name: ClassVar[str] = "shuffle_pixels"
    factor: float = 0.1
    seed: int = 0
    form: str = "numpy"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("form",)

    def __post_init__(self):
        check_range(self.name, "factor", self.factor, 0.0, 1.0)
        _check_seed(self.name, self.seed)
        if self.form not in SHUFFLE_FORMS:
            raise EditParameterError(f"{self.name}: parameter form={self.form!r} must be one of {list(SHUFFLE_FORMS)}")
        if self.form == "augly":  # NumPy's legacy generator takes 32-bit seeds
            _check_int(self.name, "seed", self.seed, 0, 2**32 - 1)

    def transform(self, image: Image.Image) -> Image.Image:
        pixels = np.array(image)
        flat = pixels.reshape(-1, 3)
        if self.form == "augly":  # augly.image.functional.shuffle_pixels, with its own legacy generator
            legacy = np.random.RandomState(self.seed)
            chosen = legacy.choice(flat.shape[0], size=int(self.factor * flat.shape[0]), replace=False)
            moved = flat[chosen]
            legacy.shuffle(moved)
            flat[chosen] = moved
            return Image.fromarray(pixels, "RGB")
        count = int(round(self.factor * flat.shape[0]))
        if count < 2:
            return Image.fromarray(pixels, "RGB")
        rng = np.random.default_rng(self.seed)
        chosen = rng.choice(flat.shape[0], size=count, replace=False)
        flat[chosen] = flat[rng.permutation(chosen)]
        return Image.fromarray(pixels, "RGB")


@register_edit
@dataclasses.dataclass(frozen=True)
class Solarize(PhotometricEdit):
    """Invert every channel value at or above ``threshold`` in [0, 256] (PIL ``ImageOps.solarize``)."""

    name: ClassVar[str] = "solarize"
    scaling: ClassVar[str] = "pointwise"
    threshold: int = 128

    def __post_init__(self):
        _check_int(self.name, "threshold", self.threshold, 0, 256)

    def transform(self, image: Image.Image) -> Image.Image:
        return ImageOps.solarize(image, int(self.threshold))


@register_edit
@dataclasses.dataclass(frozen=True)
class Posterize(PhotometricEdit):
    """Keep the ``bits`` in [1, 8] most significant bits of each channel (PIL ``ImageOps.posterize``)."""

    name: ClassVar[str] = "posterize"
    scaling: ClassVar[str] = "pointwise"
    bits: int = 4

    def __post_init__(self):
        _check_int(self.name, "bits", self.bits, 1, 8)

    def transform(self, image: Image.Image) -> Image.Image:
        return ImageOps.posterize(image, int(self.bits))


@register_edit
@dataclasses.dataclass(frozen=True)
class EdgeEnhance(PhotometricEdit):
    """PIL's edge-enhancement filter through AugLy ``apply_pil_filter`` (``more`` for the stronger one)."""

    name: ClassVar[str] = "edge_enhance"
    more: bool = False

    def __post_init__(self):
        if not isinstance(self.more, bool):
            raise EditParameterError(f"{self.name}: parameter more={self.more!r} must be a boolean")

    def transform(self, image: Image.Image) -> Image.Image:
        kernel = ImageFilter.EDGE_ENHANCE_MORE if self.more else ImageFilter.EDGE_ENHANCE
        return _augly_image().apply_pil_filter(image, filter_type=kernel)

    def render_array(self, pixels, true_size, density=None, visible=None):
        """Pillow's edge-enhancement kernel applied by OpenCV at the true size: the same 3x3 weights and
        scale, rounded to 8 bits, and, as Pillow does, the outermost rows and columns left as they are.
        Several times faster than Pillow's float filter."""
        pixels = np.ascontiguousarray(pixels)
        (_, _), scale, offset, weights = (ImageFilter.EDGE_ENHANCE_MORE if self.more else ImageFilter.EDGE_ENHANCE).filterargs
        kernel = np.asarray(weights, dtype=np.float32).reshape(3, 3) / np.float32(scale)
        # Pillow rounds halves up; OpenCV rounds them to even: a nudge far below 1/2 makes them agree.
        out = cv2.filter2D(pixels, -1, kernel, delta=float(offset) + 1e-3, borderType=cv2.BORDER_REPLICATE)
        out[0], out[-1], out[:, 0], out[:, -1] = pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]
        return out


#: The photometric operations of the authors' "additional" family (their ``lyakaap`` recipe draws one
#: of these albumentations transforms, with albumentations 1.3.1's default parameters: here run with those
#: parameters, :mod:`.albumentations_defaults`; ``Emboss`` is commented out there).
#: ``RandomRain``, ``RandomSnow`` and ``RandomFog`` draw streaks, flakes and haze over the image;
#: albumentations returns no mask of them, so here they count as photometric (the table is unchanged).
ALBUMENTATIONS_OPS = (
    "CLAHE", "ChannelDropout", "ChannelShuffle", "Equalize", "FancyPCA", "GaussNoise", "HueSaturationValue",
    "ISONoise", "ImageCompression", "InvertImg", "MedianBlur", "MotionBlur", "MultiplicativeNoise", "Posterize",
    "RGBShift", "RandomBrightnessContrast", "RandomFog", "RandomGamma", "RandomRain", "RandomSnow",
    "RandomToneCurve", "Sharpen", "Solarize", "ToSepia",
)


#: The operations of :data:`ALBUMENTATIONS_OPS` that are pointwise (each output pixel a function of
#: that pixel only, with parameters drawn independently of the image): the same up to resampling at
#: any resolution. The others (CLAHE, Equalize and FancyPCA use the image's statistics; noise, blurs,
#: sharpening, compression and weather are in pixels) need their true size.
POINTWISE_ALBUMENTATIONS = frozenset({
    "ChannelDropout", "ChannelShuffle", "HueSaturationValue", "InvertImg", "Posterize", "RGBShift",
    "RandomBrightnessContrast", "RandomGamma", "RandomToneCurve", "Solarize", "ToSepia",
})


@functools.cache
def _albumentations():
    try:
        import albumentations
    except ImportError as error:  # an optional extra: only the paper recipes need it
        raise EditParameterError(
            "the albumentations edit needs the albumentations package: pip install 'copynce_hf[train]'"
        ) from error
    return albumentations


@register_edit
@dataclasses.dataclass(frozen=True)
class Albumentation(PhotometricEdit):
    """One albumentations transform ``op`` (of :data:`ALBUMENTATIONS_OPS`) as the authors ran it: albumentations
    1.3.1 at its defaults. The installed albumentations runs it with 1.3.1's defaults given explicitly
    (:mod:`.albumentations_defaults`), except the six operations whose algorithm 2.x changed, computed as
    1.3.1 does (:mod:`.albumentations_131`).

    The transform's random parameters come from its own generator seeded with ``seed``
    (``set_random_seed``), so the edit replays exactly. Photometric: the table is unchanged.
    """

    name: ClassVar[str] = "albumentation"
    op: str = "CLAHE"
    seed: int = 0

    def __post_init__(self):
        if self.op not in ALBUMENTATIONS_OPS:
            raise EditParameterError(f"{self.name}: parameter op={self.op!r} must be one of {list(ALBUMENTATIONS_OPS)}")
        _check_seed(self.name, self.seed)

    @property
    def scaling(self) -> str:
        return "pointwise" if self.op in POINTWISE_ALBUMENTATIONS else "true_size"

    def transform(self, image: Image.Image) -> Image.Image:
        if self.op in REIMPLEMENTED:  # 2.x computes it otherwise: as albumentations 1.3.1 does
            return Image.fromarray(apply_1_3_1(self.op, np.asarray(image), self.seed), "RGB")
        transform = getattr(_albumentations(), self.op)(p=1.0, **authors_parameters(self.op))
        transform.set_random_seed(self.seed)
        return Image.fromarray(transform(image=np.asarray(image))["image"], "RGB")
