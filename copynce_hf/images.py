"""Reading images safely: every mode to RGB, EXIF orientation applied, bad files refused.

All image input of the package (PixTrace, datasets, retrieval, the command line) goes
through :func:`load_image` or :func:`to_rgb`, so that one set of rules holds everywhere.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from .errors import ImageLoadError

#: Images above this many pixels are refused as decompression bombs (about 16k x 16k).
MAX_IMAGE_PIXELS = 16384 * 16384

#: Default smallest accepted side: one ViT patch.
MIN_IMAGE_SIDE = 16


def to_rgb(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Convert a PIL image of any mode to RGB.

    Alpha (modes ``LA``, ``RGBA``, ``PA`` and palette images with transparency) is
    composited on ``background`` (white by default); ``CMYK`` and ``YCbCr`` use Pillow's
    colour conversion; 16- and 32-bit greyscale (``I;16``, ``I``, ``F``) are rescaled from
    their dynamic range to 8 bits rather than clipped.
    """
    mode = image.mode
    if mode == "RGB":
        return image
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        if mode.startswith("I;16"):
            low, high = 0.0, 65535.0
        else:
            low, high = float(array.min()), float(array.max())
        scaled = np.clip((array - low) / max(high - low, 1e-12) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(scaled, mode="L").convert("RGB")
    if mode in ("LA", "RGBA", "La", "RGBa", "PA"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, background + (255,))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    return image.convert("RGB")


def load_image(
    source: str | os.PathLike | bytes | Image.Image,
    min_side: int = MIN_IMAGE_SIDE,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_side: int | None = None,
) -> Image.Image:
    """Open an image file (path, bytes or PIL image) as an RGB PIL image.

    EXIF orientation is applied first, so that every later coordinate refers to the
    image as it is displayed. Raises :class:`ImageLoadError`, naming the file, for a
    missing, truncated or corrupt file, a decompression bomb (more than ``max_pixels``
    pixels) or an image whose smaller side is under ``min_side`` pixels.

    ``max_side``: the caller shrinks the image to this longer side anyway (e.g.
    ``CopyPairMaker.max_source_side``), so a JPEG larger than that is decoded at the smallest
    of the decoder's scales 1/2, 1/4, 1/8 that keeps the longer side at or above ``max_side``
    (Pillow's draft mode: the DCT is reduced, several times faster than decoding everything).
    Other formats, and files already small enough, are decoded in full.
    """
    name = _describe(source)
    if isinstance(source, Image.Image):
        image = source
    else:
        try:
            stream = io.BytesIO(source) if isinstance(source, bytes) else open(Path(source), "rb")
        except OSError as error:
            raise ImageLoadError(f"cannot open image {name}: {error.strerror or error}") from error
        with stream:
            image = _decode(stream, name, max_pixels, min_side, max_side)
    _check_size(image, name, min_side, max_pixels)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception as error:  # a broken EXIF block is a bad file, not a crash
        raise ImageLoadError(f"image {name} has an unreadable EXIF orientation: {error}") from error
    return to_rgb(image)


def _decode(stream, name: str, max_pixels: int, min_side: int = 1, max_side: int | None = None) -> Image.Image:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(stream)
            _check_size(image, name, 1, max_pixels)
            if max_side and image.format == "JPEG" and max(image.size) > max_side:
                _check_size(image, name, min_side, max_pixels)  # judged at full size, before reducing
                width, height = image.size
                scale = max_side / max(width, height)
                # Draft mode picks the strongest DCT scaling whose result is at least this large.
                image.draft(image.mode, (max(math.ceil(width * scale), min(width, min_side)),
                                         max(math.ceil(height * scale), min(height, min_side))))
            image.load()
        except ImageLoadError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise ImageLoadError(f"image {name} refused as a decompression bomb: {error}") from error
        except (OSError, SyntaxError, ValueError) as error:
            raise ImageLoadError(f"image {name} is truncated or corrupt: {error}") from error
    return image


def _check_size(image: Image.Image, name: str, min_side: int, max_pixels: int) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise ImageLoadError(
            f"image {name} refused as a decompression bomb: {width}x{height} pixels exceeds {max_pixels}"
        )
    if min(width, height) < min_side:
        raise ImageLoadError(f"image {name} is {width}x{height}, smaller than the minimum side {min_side}")


def _describe(source) -> str:
    if isinstance(source, bytes):
        return f"<{len(source)} bytes>"
    if isinstance(source, Image.Image):
        return getattr(source, "filename", "") or f"<PIL image {source.mode} {source.size[0]}x{source.size[1]}>"
    return repr(str(source))
