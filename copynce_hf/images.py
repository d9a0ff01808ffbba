"""Reading images safely: every mode to RGB, EXIF orientation applied, bad files refused.

All image input of the package (PixTrace, datasets, retrieval, the command line) goes
through :func:`load_image` or :func:`to_rgb`, so that one set of rules holds everywhere.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

from PIL import Image, ImageOps

from .errors import ImageLoadError
from .modeling.rgb_conversion import pil_to_rgb as to_rgb  # the image processor's own conversion

#: Images above this many pixels are refused as decompression bombs (about 16k x 16k).
MAX_IMAGE_PIXELS = 16384 * 16384

#: Default smallest accepted side: one ViT patch.
MIN_IMAGE_SIDE = 16


def load_image(
    source: str | os.PathLike | bytes | Image.Image,
    min_side: int = MIN_IMAGE_SIDE,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> Image.Image:
    """Open an image file (path, bytes or PIL image) as an RGB PIL image.

    EXIF orientation is applied first, so that every later coordinate refers to the
    image as it is displayed. Raises :class:`ImageLoadError`, naming the file, for a
    missing, truncated or corrupt file, a decompression bomb (more than ``max_pixels``
    pixels) or an image whose smaller side is under ``min_side`` pixels.
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
            image = _decode(stream, name, max_pixels)
    _check_size(image, name, min_side, max_pixels)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception as error:  # a broken EXIF block is a bad file, not a crash
        raise ImageLoadError(f"image {name} has an unreadable EXIF orientation: {error}") from error
    return to_rgb(image)


def _decode(stream, name: str, max_pixels: int) -> Image.Image:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(stream)
            _check_size(image, name, 1, max_pixels)
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
