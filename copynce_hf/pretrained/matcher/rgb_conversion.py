"""Conversion of PIL images of any mode to RGB: the package's one rule set.

The image processor (:mod:`image_processing_copynce`) and ``copynce_hf.images`` (PixTrace, the
data pipeline, retrieval) both use :func:`pil_to_rgb`, so the images a model sees at inference
match the ones it was trained on. It needs only NumPy and Pillow.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["pil_to_rgb"]

_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
_ALPHA_MODES = ("LA", "RGBA", "La", "RGBa", "PA")


def pil_to_rgb(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
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
    if mode in _SIXTEEN_BIT_MODES or mode in ("I", "F"):
        array = np.asarray(image, dtype=np.float64)
        low, high = (0.0, 65535.0) if mode in _SIXTEEN_BIT_MODES else (float(array.min()), float(array.max()))
        scaled = np.clip((array - low) / max(high - low, 1e-12) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(scaled, mode="L").convert("RGB")
    if mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, background + (255,))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    return image.convert("RGB")
