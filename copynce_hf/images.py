"""Reading images safely: every mode to RGB, EXIF orientation applied, bad files refused.

All image input of the package (PixTrace, datasets, retrieval, the command line) goes
through :func:`load_image` or :func:`to_rgb`, so that one set of rules holds everywhere.
"""

from __future__ import annotations

import io
import math
import os
import re
import threading
import warnings
from pathlib import Path

from PIL import Image, ImageOps

from .modeling.errors import MIN_IMAGE_SIDE, ImageLoadError, empty_image_error, small_image_error
from .modeling.rgb_conversion import pil_to_rgb as to_rgb  # the image processor's own conversion

#: Default size limit in pixels (268 megapixels, 16384 x 16384): above every camera photograph
#: (a 100-megapixel sensor gives 11648 x 8736), below the sizes used as decompression bombs.
#: Images above the limit are refused before their pixels are decoded; raise it per call with
#: ``load_image(max_pixels=...)``, on the command line with ``--max-pixels`` or in a training
#: configuration with ``max_image_pixels``.
MAX_IMAGE_PIXELS = 16384 * 16384


# Pillow's own bomb check (``Image.MAX_IMAGE_PIXELS``: a warning above 89.5 megapixels, an error above
# twice that) is a process-wide setting that would refuse real photographs below the package's limit.
# It is switched off, under this lock, only while a file header is read; the package's own check on
# the header's size then applies the limit of the call.
_PILLOW_LIMIT_LOCK = threading.Lock()


def megapixels(pixels: int) -> str:
    """``268435456`` -> ``"268.4 megapixels"``; under 0.1 megapixels, ``"4096 pixels"``."""
    return f"{pixels / 1e6:.1f} megapixels" if pixels >= 100_000 else f"{pixels} pixels"


def load_image(
    source: str | os.PathLike | bytes | Image.Image,
    min_side: int = MIN_IMAGE_SIDE,
    max_pixels: int | None = None,
    max_side: int | None = None,
) -> Image.Image:
    """Open an image file (path, bytes or PIL image) as an RGB PIL image.

    EXIF orientation is applied first, so that every later coordinate refers to the image as it
    is displayed. ``max_pixels`` (default :data:`MAX_IMAGE_PIXELS`) is the largest accepted
    width x height; the size is checked from the file header, before any pixel is decoded.

    Raises :class:`ImageLoadError`, naming the file and the reason in plain words: missing file,
    "empty file", "not an image", "truncated or corrupt", "too large: WxH" (with the limit and how
    to raise it) or "too small: WxH, minimum ``min_side``".

    ``max_side``: the caller shrinks the image to this longer side anyway (e.g.
    ``CopyPairMaker.max_source_side``), so a JPEG larger than that is decoded at the smallest
    of the decoder's scales 1/2, 1/4, 1/8 that keeps the longer side at or above ``max_side``
    (Pillow's draft mode: the DCT is reduced, several times faster than decoding everything).
    Other formats, and files already small enough, are decoded in full; ``min_side`` is judged
    on the file's size.
    """
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else int(max_pixels)
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be a positive number of pixels, got {max_pixels}")
    name = _describe(source)
    if isinstance(source, Image.Image):
        image = source
    else:
        with _open(source, name) as stream:
            image = _decode(stream, name, max_pixels, min_side, max_side)
    _check_size(image, name, min_side, max_pixels)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception as error:  # a broken EXIF block is a bad file, not a crash
        raise ImageLoadError(f"image {name} has an unreadable EXIF orientation: {error}") from error
    return to_rgb(image)


def image_size(source: str | os.PathLike | bytes, min_side: int = MIN_IMAGE_SIDE,
               max_pixels: int | None = None) -> tuple[int, int]:
    """``(width, height)`` of an image file as displayed (EXIF orientation applied), from its header: no pixel is
    decoded. Raises the :class:`ImageLoadError` of :func:`load_image` for what a header shows (missing, empty file,
    not an image, too large, too small); a file cut after its header passes here and is refused by
    :func:`load_image`."""
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else int(max_pixels)
    name = _describe(source)
    with _open(source, name) as stream:
        image = _header(stream, name, max_pixels)
        _check_size(image, name, min_side, max_pixels)
        try:
            turned = image.getexif().get(0x0112, 1) in (5, 6, 7, 8)  # a quarter turn swaps the sides
        except Exception as error:  # a broken EXIF block is a bad file, not a crash
            raise ImageLoadError(f"image {name} has an unreadable EXIF orientation: {error}") from error
    width, height = image.size
    return (height, width) if turned else (width, height)


def _open(source: str | os.PathLike | bytes, name: str):
    """A binary stream of ``source`` (bytes, or a file path); :class:`ImageLoadError` when the file cannot be opened."""
    if isinstance(source, bytes):
        return io.BytesIO(source)
    try:
        return open(Path(source), "rb")
    except FileNotFoundError as error:
        raise ImageLoadError(f"cannot open image {name}: no such file", "missing") from error
    except IsADirectoryError as error:
        raise ImageLoadError(f"cannot open image {name}: it is a folder", "not an image") from error
    except OSError as error:
        raise ImageLoadError(f"cannot open image {name}: {error.strerror or error}") from error


def _header(stream, name: str, max_pixels: int) -> Image.Image:
    """``stream``'s image opened by Pillow: its header read and its size checked against ``max_pixels``, no pixel
    decoded."""
    stream.seek(0, io.SEEK_END)
    if stream.tell() == 0:
        raise empty_image_error(name)
    stream.seek(0)
    try:
        with _PILLOW_LIMIT_LOCK, warnings.catch_warnings():
            # Pillow's check is off while the header is read: the package's check right below
            # decides, from the same header, before any pixel is decoded.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            previous, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            try:
                image = Image.open(stream)
            finally:
                Image.MAX_IMAGE_PIXELS = previous
    except Image.DecompressionBombError as error:
        raise ImageLoadError(f"image {name} is too large ({error}); {_how_to_raise(max_pixels)}", "too large") from error
    except Image.UnidentifiedImageError as error:
        stream.seek(0)
        kind = _signature(stream.read(16))
        if kind:  # an image file's signature, then nothing Pillow can read
            raise ImageLoadError(f"image {name} is truncated or corrupt: a {kind} signature, then no readable "
                                 "image", "truncated") from error
        raise ImageLoadError(f"image {name} is not an image (no known image format in its first bytes)",
                             "not an image") from error
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageLoadError(f"image {name} is truncated or corrupt: {_plain(error)}", "truncated") from error
    _check_size(image, name, 1, max_pixels)  # from the header: nothing decoded yet
    return image


def _decode(stream, name: str, max_pixels: int, min_side: int = 1, max_side: int | None = None) -> Image.Image:
    image = _header(stream, name, max_pixels)
    if max_side and image.format == "JPEG" and max(image.size) > max_side:
        _check_size(image, name, min_side, max_pixels)  # judged at full size, before reducing
        width, height = image.size
        scale = max_side / max(width, height)
        # Draft mode picks the strongest DCT scaling whose result is at least this large.
        image.draft(image.mode, (max(math.ceil(width * scale), min(width, min_side)),
                                 max(math.ceil(height * scale), min(height, min_side))))
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ImageLoadError(f"image {name} is truncated or corrupt: {_plain(error)}", "truncated") from error
    return image


_SIGNATURES = ((b"\x89PNG", "PNG"), (b"\xff\xd8", "JPEG"), (b"GIF8", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
               (b"MM\x00*", "TIFF"))


def _signature(head: bytes) -> str | None:
    """The image format whose magic bytes ``head`` starts with, if any."""
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WebP"
    return next((kind for magic, kind in _SIGNATURES if head.startswith(magic)), None)


def _plain(error: Exception) -> str:
    """An exception's message without Pillow's internal object names."""
    text = " ".join(str(error).split()) or type(error).__name__
    return re.sub(r"<_io\.\w+ name=[^>]*>", "the file", text)


def _how_to_raise(max_pixels: int) -> str:
    size = f"{max_pixels} pixels" + (f" ({megapixels(max_pixels)})" if max_pixels >= 100_000 else "")
    return (f"the limit is {size}; raise it with --max-pixels N "
            "(command line), max_pixels=N (load_image) or max_image_pixels (training configuration)")


def _check_size(image: Image.Image, name: str, min_side: int, max_pixels: int) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise ImageLoadError(
            f"image {name} is too large: {width}x{height} = {megapixels(width * height)}; {_how_to_raise(max_pixels)}",
            "too large",
        )
    if min(width, height) < min_side:
        raise small_image_error(name, width, height, min_side)


def _describe(source) -> str:
    if isinstance(source, bytes):
        return f"<{len(source)} bytes>"
    if isinstance(source, Image.Image):
        return getattr(source, "filename", "") or f"<PIL image {source.mode} {source.size[0]}x{source.size[1]}>"
    return repr(str(source))
