"""Stand-ins for the ``torchvision.transforms.functional`` names the authors' augmentation code calls.

Their augmentation (``core/data/augmentation``: ``transforms_pt.py``, ``custom_transforms.py``,
``overlay.py``) calls torchvision's functional API on PIL images. torchvision cannot be installed beside
this package's CPU torch, so :func:`copynce_hf.fidelity.standins.install_standins` registers these
functions under ``torchvision.transforms.functional`` when torchvision is absent. Each follows
torchvision's behaviour for PIL inputs, which is Pillow's own operation with the interpolation named
(tested against Pillow in ``tests/test_authors_data_oracle.py``):

* geometry: :func:`resize` (Pillow ``resize``, antialiased), :func:`crop`, :func:`resized_crop` (a crop,
  then a resize), :func:`hflip` / :func:`vflip` (``transpose``), :func:`pad` (``ImageOps.expand``),
  :func:`affine` (Pillow's affine ``transform`` with the inverse of rotation about the centre, scale, shear
  and translation) and :func:`perspective` (Pillow's perspective ``transform`` with the coefficients that
  send the end points to the start points, solved in float32 by QR least squares as torchvision 0.16
  solves them);
* colour: :func:`adjust_brightness` / :func:`adjust_contrast` / :func:`adjust_saturation`
  (``ImageEnhance.Brightness`` / ``Contrast`` / ``Color``), :func:`adjust_hue` (the HSV hue channel
  shifted by ``int(hue_factor * 255)`` modulo 256), :func:`rgb_to_grayscale` (``convert("L")``, repeated);
* sizes: :func:`get_image_size` ``[w, h]``, :func:`get_dimensions` ``[c, h, w]``, :func:`get_image_num_channels`.

Only PIL images are accepted (their augmentation runs on PIL images; a tensor raises ``TypeError``).
"""

from __future__ import annotations

import enum
import math

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

__all__ = ["FUNCTIONS", "InterpolationMode", "interpolation_mode_from_int"]


class InterpolationMode(enum.Enum):
    """torchvision's interpolation modes (the names their configs use)."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


PIL_FILTERS = {
    InterpolationMode.NEAREST: Image.NEAREST, InterpolationMode.BILINEAR: Image.BILINEAR,
    InterpolationMode.BICUBIC: Image.BICUBIC, InterpolationMode.BOX: Image.BOX,
    InterpolationMode.HAMMING: Image.HAMMING, InterpolationMode.LANCZOS: Image.LANCZOS,
}


def interpolation_mode_from_int(value: int) -> InterpolationMode:
    """The mode of a Pillow filter constant (torchvision's ``_interpolation_modes_from_int``)."""
    return {int(pil): mode for mode, pil in PIL_FILTERS.items()}[int(value)]


def _pil(image) -> Image.Image:
    if not isinstance(image, Image.Image):
        raise TypeError(f"the torchvision stand-ins take PIL images, got {type(image).__name__}")
    return image


def get_image_size(image) -> list[int]:
    return list(_pil(image).size)


def get_image_num_channels(image) -> int:
    return len(_pil(image).getbands())


def get_dimensions(image) -> list[int]:
    width, height = _pil(image).size
    return [get_image_num_channels(image), height, width]


def _fill(image: Image.Image, fill):
    """A fill value as Pillow takes it for the image's mode (one number per band, integers)."""
    fill = 0 if fill is None else fill
    channels = get_image_num_channels(image)
    if isinstance(fill, (int, float)) and channels > 1:
        fill = (fill,) * channels
    if isinstance(fill, (list, tuple)):
        fill = tuple(int(value) for value in fill) if len(fill) > 1 else int(fill[0])
    else:
        fill = int(fill)
    return fill


def resize(image, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=None):
    """``size`` (h, w), or an int (or one-element list) the shorter side is matched to."""
    image = _pil(image)
    if max_size is not None:
        raise NotImplementedError("the stand-in resize has no max_size")
    if isinstance(size, int) or len(size) == 1:
        side = size if isinstance(size, int) else size[0]
        width, height = image.size
        long = int(side * max(width, height) / min(width, height))
        height, width = (side, long) if height <= width else (long, side)
    else:
        height, width = size
    return image.resize((int(width), int(height)), PIL_FILTERS[interpolation])


def crop(image, top: int, left: int, height: int, width: int):
    return _pil(image).crop((left, top, left + width, top + height))


def resized_crop(image, top, left, height, width, size, interpolation=InterpolationMode.BILINEAR, antialias=None):
    return resize(crop(image, top, left, height, width), size, interpolation)


def hflip(image):
    return _pil(image).transpose(Image.Transpose.FLIP_LEFT_RIGHT)


def vflip(image):
    return _pil(image).transpose(Image.Transpose.FLIP_TOP_BOTTOM)


def pad(image, padding, fill=0, padding_mode="constant"):
    """Constant padding by ``padding``: an int, (left/right, top/bottom) or (left, top, right, bottom)."""
    if padding_mode != "constant":
        raise NotImplementedError("the stand-in pad pads with a constant only")
    padding = [padding] if isinstance(padding, int) else list(padding)
    if len(padding) == 1:
        padding = padding * 4
    elif len(padding) == 2:
        padding = padding * 2
    return ImageOps.expand(_pil(image), border=tuple(padding), fill=_fill(image, fill))


def _inverse_affine(center, angle: float, translate, scale: float, shear) -> list[float]:
    """The output -> input map of rotation by ``angle`` (degrees, counter-clockwise on screen) about ``center``,
    then ``scale``, then shear (``shear`` degrees along x and y), then ``translate``: six affine coefficients."""
    rotation, shear_x, shear_y = (math.radians(value) for value in (angle, shear[0], shear[1]))
    centre_x, centre_y = center
    shift_x, shift_y = translate
    # Forward linear part R(angle) S(shear) (before scaling): [[a, b], [c, d]].
    a = math.cos(rotation - shear_y) / math.cos(shear_y)
    b = -math.cos(rotation - shear_y) * math.tan(shear_x) / math.cos(shear_y) - math.sin(rotation)
    c = math.sin(rotation - shear_y) / math.cos(shear_y)
    d = -math.sin(rotation - shear_y) * math.tan(shear_x) / math.cos(shear_y) + math.cos(rotation)
    # Its inverse (determinant 1), divided by the scale, about the centre and the translated centre.
    inverse = [value / scale for value in (d, -b, 0.0, -c, a, 0.0)]
    inverse[2] = inverse[0] * (-centre_x - shift_x) + inverse[1] * (-centre_y - shift_y) + centre_x
    inverse[5] = inverse[3] * (-centre_x - shift_x) + inverse[4] * (-centre_y - shift_y) + centre_y
    return inverse


def affine(image, angle, translate, scale, shear, interpolation=InterpolationMode.NEAREST, fill=None, center=None):
    image = _pil(image)
    shear = [float(shear), 0.0] if isinstance(shear, (int, float)) else [float(v) for v in shear] + [0.0] * (
        2 - len(shear))
    width, height = image.size
    center = [width * 0.5, height * 0.5] if center is None else center
    matrix = _inverse_affine(center, float(angle), translate, float(scale), shear)
    return image.transform(image.size, Image.Transform.AFFINE, matrix, PIL_FILTERS[interpolation],
                           fillcolor=_fill(image, fill))


def perspective_coefficients(startpoints, endpoints) -> list[float]:
    """The 8 coefficients of the projective map sending each end point to its start point: the 8 x 8 system in
    float32 solved by LAPACK's QR least squares (``torch.linalg.lstsq``, driver ``gels``), as torchvision 0.16
    solves it."""
    import torch

    rows, targets = [], []
    for (end_x, end_y), (start_x, start_y) in zip(endpoints, startpoints):
        rows.append([end_x, end_y, 1, 0, 0, 0, -start_x * end_x, -start_x * end_y])
        rows.append([0, 0, 0, end_x, end_y, 1, -start_y * end_x, -start_y * end_y])
        targets += [start_x, start_y]
    system = torch.tensor(rows, dtype=torch.float32)
    solution = torch.linalg.lstsq(system, torch.tensor(targets, dtype=torch.float32), driver="gels").solution
    return [float(value) for value in solution.tolist()]


def perspective(image, startpoints, endpoints, interpolation=InterpolationMode.BILINEAR, fill=None):
    image = _pil(image)
    coefficients = perspective_coefficients(startpoints, endpoints)
    return image.transform(image.size, Image.Transform.PERSPECTIVE, coefficients, PIL_FILTERS[interpolation],
                           fillcolor=_fill(image, fill))


def adjust_brightness(image, factor: float):
    return ImageEnhance.Brightness(_pil(image)).enhance(factor)


def adjust_contrast(image, factor: float):
    return ImageEnhance.Contrast(_pil(image)).enhance(factor)


def adjust_saturation(image, factor: float):
    return ImageEnhance.Color(_pil(image)).enhance(factor)


def adjust_hue(image, hue_factor: float):
    image = _pil(image)
    if not -0.5 <= hue_factor <= 0.5:
        raise ValueError(f"hue_factor ({hue_factor}) is not in [-0.5, 0.5]")
    if image.mode in {"L", "1", "I", "F"}:
        return image
    mode = image.mode
    hue, saturation, value = image.convert("HSV").split()
    shifted = (np.asarray(hue, dtype=np.int64) + int(hue_factor * 255)) % 256  # wraps around, as uint8 sums do
    hue = Image.fromarray(shifted.astype(np.uint8), "L")
    return Image.merge("HSV", (hue, saturation, value)).convert(mode)


def rgb_to_grayscale(image, num_output_channels: int = 1):
    grey = _pil(image).convert("L")
    if num_output_channels == 1:
        return grey
    return Image.merge("RGB", (grey, grey, grey))


#: The stand-in module's names.
FUNCTIONS = dict(
    InterpolationMode=InterpolationMode, _interpolation_modes_from_int=interpolation_mode_from_int,
    get_image_size=get_image_size, get_image_num_channels=get_image_num_channels, get_dimensions=get_dimensions,
    resize=resize, crop=crop, resized_crop=resized_crop, hflip=hflip, vflip=vflip, pad=pad, affine=affine,
    perspective=perspective, adjust_brightness=adjust_brightness, adjust_contrast=adjust_contrast,
    adjust_saturation=adjust_saturation, adjust_hue=adjust_hue, rgb_to_grayscale=rgb_to_grayscale,
)
