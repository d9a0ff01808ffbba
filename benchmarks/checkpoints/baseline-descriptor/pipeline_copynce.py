"""The ``image-copy-detection`` pipeline: copy score of (query, reference) image pairs.

``import copynce_hf`` registers the task with ``transformers`` (on first use of
``transformers.pipelines``)::

    import copynce_hf
    from transformers import pipeline

    detector = pipeline("image-copy-detection", model="path/or/hub-id/of/a/copynce/model")
    detector("query.jpg", "reference.jpg")                    # {"score": 0.97}
    detector("query.jpg", ["r1.jpg", "r2.jpg", "r3.jpg"])     # one score per reference
    detector([("q1.jpg", "r1.jpg"), ("q2.jpg", "r2.jpg")])    # [{"score": ...}, {"score": ...}]
    detector(["q1.jpg", "q2.jpg"], ["r1.jpg", "r2.jpg"])      # the same pairs

The score is the matcher's copy probability ``sigmoid(logit)`` for a CopyNCE matcher, or the
cosine similarity of the two descriptors for a CopyNCE descriptor (in [-1, 1]). Images may be
paths, URLs, bytes or PIL images.

This module sits in the modelling package and imports its siblings relatively, so that
``detector.save_pretrained(folder)`` copies it into the folder and writes ``custom_pipelines``
into the config: ``pipeline(model=folder, trust_remote_code=True)`` then runs it where
copynce_hf is not installed.
"""

from __future__ import annotations

import io
import os
import urllib.request

import torch
from PIL import Image, ImageOps
from transformers.pipelines import Pipeline

from .errors import MIN_IMAGE_SIDE, ConfigError, ImageLoadError, empty_image_error, small_image_error

__all__ = ["TASK", "ImageCopyDetectionPipeline", "carry_card_and_licence"]

TASK = "image-copy-detection"
_KINDS = {"copynce-descriptor": "descriptor", "copynce-matcher": "matcher"}


def read_image(image) -> Image.Image:
    """A path, URL, bytes or PIL image -> PIL image with its EXIF orientation applied.

    The package's image policy holds here too: an empty file and an image with a side under
    :data:`MIN_IMAGE_SIDE` pixels are refused with its words. Colour conversion is left to the
    image processor (:func:`pil_to_rgb`).
    """
    name = repr(os.fspath(image)) if isinstance(image, (str, os.PathLike)) else f"<{type(image).__name__}>"
    if not isinstance(image, Image.Image):
        try:
            if isinstance(image, str) and image.startswith(("http://", "https://")):
                with urllib.request.urlopen(image, timeout=30) as response:  # noqa: S310 (http(s) only)
                    image = response.read()
            if (isinstance(image, bytes) and not image) or (isinstance(image, (str, os.PathLike))
                                                             and os.path.getsize(image) == 0):
                raise empty_image_error(name)
            image = Image.open(io.BytesIO(image) if isinstance(image, bytes) else os.fspath(image))
            image.load()
            image = ImageOps.exif_transpose(image)
        except (OSError, ValueError, TypeError, Image.DecompressionBombError) as error:
            raise ImageLoadError(f"cannot read image {name}: {error}") from error
    if min(image.size) < MIN_IMAGE_SIDE:
        raise small_image_error(name, *image.size)
    return image


def _as_pairs(query, reference):
    """Normalise the call forms to one ``{"query", "reference"}`` dict or a list of them."""
    if reference is not None:
        queries_listed, references_listed = isinstance(query, (list, tuple)), isinstance(reference, (list, tuple))
        if (queries_listed and not query) or (references_listed and not reference):
            raise ConfigError("image-copy-detection got an empty list of "
                              f"{'queries' if queries_listed and not query else 'references'}: give at least one image")
        if not queries_listed and not references_listed:
            return {"query": query, "reference": reference}
        if not queries_listed:  # one query against each reference
            return [{"query": query, "reference": r} for r in reference]
        if not references_listed:  # each query against one reference
            return [{"query": q, "reference": reference} for q in query]
        if len(query) != len(reference):
            raise ConfigError(f"{len(query)} queries but {len(reference)} references")
        return [{"query": q, "reference": r} for q, r in zip(query, reference)]
    if isinstance(query, dict):
        return query
    if isinstance(query, (list, tuple)) and not query:
        raise ConfigError("image-copy-detection got an empty list: give at least one (query, reference) pair")
    if isinstance(query, (list, tuple)) and query and all(isinstance(p, (list, tuple, dict)) for p in query):
        pairs = []
        for pair in query:
            if isinstance(pair, dict):
                pairs.append(pair)
            elif len(pair) == 2:
                pairs.append({"query": pair[0], "reference": pair[1]})
            else:
                raise ConfigError(f"a pair must be (query, reference), got {len(pair)} items")
        return pairs
    raise ConfigError("image-copy-detection needs a query and a reference image, or a list of (query, reference) pairs")


def carry_card_and_licence(source: str | os.PathLike | None, target: str | os.PathLike) -> list[str]:
    """Copy the model card (``README.md``) and the licence file its metadata links (``license_link``) from
    the local folder the weights were loaded from into ``target``, where ``target`` lacks them: the weights'
    licence (the embedded models' is research-only) stays with the weights. Returns the names copied."""
    import shutil

    from huggingface_hub import ModelCard

    card = os.path.join(source, "README.md") if source and os.path.isdir(source) else None
    if card is None or not os.path.isfile(card) or os.path.abspath(source) == os.path.abspath(target):
        return []
    link = getattr(ModelCard.load(card).data, "license_link", None)
    names = ["README.md"] + ([link] if link and "://" not in link else [])
    copied = []
    for name in names:
        origin, destination = os.path.join(source, name), os.path.join(target, name)
        if os.path.isfile(origin) and not os.path.exists(destination):
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            shutil.copyfile(origin, destination)
            copied.append(name)
    return copied


class ImageCopyDetectionPipeline(Pipeline):
    """Copy score of (query, reference) image pairs with a CopyNCE matcher or descriptor.

    Returns ``{"score": float}`` per pair: the copy probability (matcher) or the descriptor
    cosine similarity (descriptor). Supports ``batch_size`` and ``num_workers`` like other
    pipelines.
    """

    _load_image_processor = True
    _load_processor = False
    _load_feature_extractor = False
    _load_tokenizer = False
    _load_video_processor = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        model_type = getattr(self.model.config, "model_type", None)
        if model_type not in _KINDS:
            raise ConfigError(f"image-copy-detection needs a CopyNCE descriptor or matcher, got model_type "
                              f"{model_type!r}")
        self.kind = _KINDS[model_type]
        if self.image_processor is None:
            raise ConfigError("image-copy-detection needs the model's image processor")

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """Write the model, its image processor, this pipeline's code and the config's ``custom_pipelines``
        entry into ``save_directory``: ``pipeline(model=save_directory, trust_remote_code=True)`` then
        rebuilds the pipeline where copynce_hf is not installed. Unlike ``Pipeline.save_pretrained``, this
        also holds for a pipeline built from a folder's own code (``trust_remote_code=True``), which no
        registry knows. ``kwargs`` go to the model's and processor's ``save_pretrained``."""
        from transformers.dynamic_module_utils import custom_object_save

        if os.path.isfile(save_directory):
            raise ConfigError(f"cannot save the pipeline into {save_directory}: it is a file, not a folder")
        os.makedirs(save_directory, exist_ok=True)
        module = type(self).__module__.rpartition(".")[2]
        self.model.config.custom_pipelines = {
            TASK: {"impl": f"{module}.{type(self).__name__}", "pt": ["AutoModel"], "type": "image"}
        }
        custom_object_save(self, save_directory)
        self.model.save_pretrained(save_directory, **kwargs)
        self.image_processor.save_pretrained(save_directory, **kwargs)
        carry_card_and_licence(getattr(self.model.config, "_name_or_path", None), save_directory)

    def __call__(self, query, reference=None, **kwargs):
        """Score one pair (``query``, ``reference``) or several (see the module docstring)."""
        return super().__call__(_as_pairs(query, reference), **kwargs)

    def _sanitize_parameters(self, **kwargs):
        if kwargs:
            raise ConfigError(f"unknown image-copy-detection parameter(s): {', '.join(sorted(kwargs))}")
        return {}, {}, {}

    def preprocess(self, pair: dict) -> dict:
        missing = {"query", "reference"} - set(pair)
        if missing:
            raise ConfigError(f"a pair needs the keys 'query' and 'reference'; missing {sorted(missing)}")
        pixels = self.image_processor(
            images=[read_image(pair["query"]), read_image(pair["reference"])], return_tensors="pt"
        )["pixel_values"]
        return {"pixel_values": pixels[:1], "reference_pixel_values": pixels[1:]}

    def _forward(self, inputs: dict) -> dict:
        query, reference = inputs["pixel_values"], inputs["reference_pixel_values"]
        if self.kind == "matcher":
            logits = self.model(pixel_values=query, reference_pixel_values=reference).logits
            return {"scores": torch.sigmoid(logits.float().reshape(-1))}
        descriptors = self.model(pixel_values=torch.cat([query, reference])).descriptors.float()
        descriptors = torch.nn.functional.normalize(descriptors, dim=-1)
        return {"scores": (descriptors[: len(query)] * descriptors[len(query) :]).sum(-1)}

    def postprocess(self, outputs: dict) -> dict:
        return {"score": float(outputs["scores"].reshape(-1)[0])}
