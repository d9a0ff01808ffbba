"""Photometric edits: pixel values change, positions do not, so the table is returned unchanged.

Paper, section "PixTrace Pipeline": colour jitter and similar edits keep every pixel where
it was (f is the identity on the table). Pixelisation and pixel shuffling are treated as
photometric too: pixelisation resamples the image down and
back up to its own size, and shuffling moves a fraction of the pixels to random places,
both without moving the content's frame.

The pixel work uses AugLy where it has the operation and is fast (brightness, contrast,
saturation, colour jitter, greyscale, blur, sharpen, JPEG, pixelisation, PIL filters);
noise and pixel shuffling are done with numpy, seeded by the edit's explicit ``seed``
(AugLy's versions cost about 25 ms and 140 ms on a 500x375 image).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from typing import ClassVar

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from ...errors import EditParameterError
from ..table import CoordinateTable
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
    "Albumentation",
]

#: Upper bound of the enhancement factors (1.0 = unchanged).
MAX_FACTOR = 10.0


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


def _check_int(edit: str, key: str, value, low: int, high: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not low <= value <= high:
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be an integer in [{low}, {high}]")


def _check_seed(edit: str, seed) -> None:
    _check_int(edit, "seed", seed, 0, 2**63 - 1)


@register_edit
@dataclasses.dataclass(frozen=True)
class ColorJitter(PhotometricEdit):
    """Brightness, contrast and saturation factors (1 = unchanged), then a hue rotation.

    Args:
        brightness, contrast, saturation: enhancement factors in [0, 10], applied in this
            order with AugLy's ``color_jitter`` (PIL ``ImageEnhance``).
        hue: hue rotation as a fraction of the colour circle, in [-0.5, 0.5] (a luma-keeping
            rotation of the YIQ chroma plane, in HSV's direction).
    """

    name: ClassVar[str] = "color_jitter"
    brightness: float = 1.0
    contrast: float = 1.0
    saturation: float = 1.0
    hue: float = 0.0

    def __post_init__(self):
        for key in ("brightness", "contrast", "saturation"):
            check_range(self.name, key, getattr(self, key), 0.0, MAX_FACTOR)
        check_range(self.name, "hue", self.hue, -0.5, 0.5)

    def transform(self, image: Image.Image) -> Image.Image:
        edited = _augly_image().color_jitter(
            image,
            brightness_factor=self.brightness,
            contrast_factor=self.contrast,
            saturation_factor=self.saturation,
        )
        return _rotate_hue(edited, self.hue)


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


@register_edit
@dataclasses.dataclass(frozen=True)
class ShufflePixels(PhotometricEdit):
    """Permute a random fraction ``factor`` in [0, 1] of the pixels among themselves (numpy, seeded).

    The shuffled pixels no longer show their traced content, but they are not overlays
    either: like AugLy's ``shuffle_pixels`` this is treated as noise on the pixel values.
    """

    name: ClassVar[str] = "shuffle_pixels"
    factor: float = 0.1
    seed: int = 0

    def __post_init__(self):
        check_range(self.name, "factor", self.factor, 0.0, 1.0)
        _check_seed(self.name, self.seed)

    def transform(self, image: Image.Image) -> Image.Image:
        pixels = np.array(image)
        flat = pixels.reshape(-1, 3)
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


#: The photometric operations of the authors' "additional" family (their ``lyakaap`` recipe draws one
#: of these albumentations transforms, with its default parameters; ``Emboss`` is commented out there).
#: ``RandomRain``, ``RandomSnow`` and ``RandomFog`` draw streaks, flakes and haze over the image;
#: albumentations returns no mask of them, so here they count as photometric (the table is unchanged).
ALBUMENTATIONS_OPS = (
    "CLAHE", "ChannelDropout", "ChannelShuffle", "Equalize", "FancyPCA", "GaussNoise", "HueSaturationValue",
    "ISONoise", "ImageCompression", "InvertImg", "MedianBlur", "MotionBlur", "MultiplicativeNoise", "Posterize",
    "RGBShift", "RandomBrightnessContrast", "RandomFog", "RandomGamma", "RandomRain", "RandomSnow",
    "RandomToneCurve", "Sharpen", "Solarize", "ToSepia",
)


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
    """One albumentations transform ``op`` (of :data:`ALBUMENTATIONS_OPS`) at its default parameters.

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

    def transform(self, image: Image.Image) -> Image.Image:
        transform = getattr(_albumentations(), self.op)(p=1.0)
        transform.set_random_seed(self.seed)
        return Image.fromarray(transform(image=np.asarray(image))["image"], "RGB")
