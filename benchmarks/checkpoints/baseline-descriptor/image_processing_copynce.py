"""Image processor of the CopyNCE models: RGB, bicubic resize to the model size, ImageNet normalisation.

Follows ``transformers``' PIL backend (``PilBackend``, a ``BaseImageProcessor``): inputs may be
PIL images, NumPy arrays or tensors, alone or in lists, and ``processor(images,
return_tensors="pt")["pixel_values"]`` is a (B, 3, H, W) float tensor for the models.

Colour conversion (:func:`pil_to_rgb`: alpha composited on white, 16-bit greyscale rescaled
from its range rather than clipped, CMYK through Pillow) is the package's one conversion:
``copynce_hf.images.to_rgb`` is this function, so the images a model sees here match the ones
it was trained on. Saved model folders carry this file (Hub custom code).
"""

from __future__ import annotations

from PIL import Image
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling

from .rgb_conversion import pil_to_rgb

try:  # a transformers 5 module (4.x has none): say which version is needed rather than "no module named"
    from transformers.image_processing_backends import PilBackend
except ImportError as error:
    from .errors import transformers_too_old

    raise transformers_too_old(error) from error

__all__ = ["CopyNCEImageProcessor"]

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
