"""Image processor of the CopyNCE models: RGB, bicubic resize to the model size, ImageNet normalisation.

Follows ``transformers``' PIL backend (``PilBackend``, a ``BaseImageProcessor``): inputs may be
PIL images, NumPy arrays or tensors, alone or in lists, and ``processor(images,
return_tensors="pt")["pixel_values"]`` is a (B, 3, H, W) float tensor for the models.

Colour conversion follows ``copynce_hf.images.to_rgb`` (alpha composited on white, 16-bit
greyscale rescaled from its range rather than clipped, CMYK through Pillow) so that the
images a model sees here match the ones it was trained on. This file is copied into saved
model folders and must run without ``copynce_hf``, so it carries that small conversion itself.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from transformers.image_processing_backends import PilBackend
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling

__all__ = ["CopyNCEImageProcessor", "pil_to_rgb"]

_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
_ALPHA_MODES = ("LA", "RGBA", "La", "RGBa", "PA")


def pil_to_rgb(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Convert a PIL image of any mode to RGB (same rules as ``copynce_hf.images.to_rgb``)."""
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


class CopyNCEImageProcessor(PilBackend):
    """Pre-processing for :class:`CopyNCEDescriptorModel` and :class:`CopyNCEMatcherModel`.

    Steps: RGB conversion (PIL inputs with :func:`pil_to_rgb`), resize to ``size`` (default
    224 x 224, bicubic, no aspect-ratio preservation: copy detection compares whole images),
    rescale by 1/255, normalise with the ImageNet mean and std (as DINO).

    Example::

        processor = CopyNCEImageProcessor(size={"height": 224, "width": 224})
        batch = processor([image_a, image_b], return_tensors="pt")  # batch["pixel_values"]: (2, 3, 224, 224)
    """

    model_input_names = ["pixel_values"]
    resample = PILImageResampling.BICUBIC
    image_mean = IMAGENET_DEFAULT_MEAN
    image_std = IMAGENET_DEFAULT_STD
    size = {"height": 224, "width": 224}
    do_resize = True
    do_rescale = True
    do_normalize = True
    do_convert_rgb = True

    def process_image(self, image, do_convert_rgb: bool | None = None, **kwargs):
        """One raw image -> channels-first uint8/float array; PIL images get :func:`pil_to_rgb`."""
        if isinstance(image, Image.Image) and do_convert_rgb:
            image = pil_to_rgb(image)
        return super().process_image(image, do_convert_rgb=do_convert_rgb, **kwargs)
