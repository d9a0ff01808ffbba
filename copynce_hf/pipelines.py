"""The ``image-copy-detection`` pipeline: copy score of (query, reference) image pairs.

Importing this module registers the task with ``transformers``::

    import copynce_hf.pipelines  # registers "image-copy-detection"
    from transformers import pipeline

    detector = pipeline("image-copy-detection", model="path/or/hub-id/of/a/copynce/model")
    detector("query.jpg", "reference.jpg")                    # {"score": 0.97}
    detector([("q1.jpg", "r1.jpg"), ("q2.jpg", "r2.jpg")])    # [{"score": ...}, {"score": ...}]
    detector(["q1.jpg", "q2.jpg"], ["r1.jpg", "r2.jpg"])      # the same pairs

The score is the matcher's copy probability ``sigmoid(logit)`` for a CopyNCE matcher, or
the cosine similarity of the two descriptors for a CopyNCE descriptor (in [-1, 1]).
Images may be paths, URLs, bytes or PIL images.
"""

from __future__ import annotations

import torch
from transformers import AutoModel
from transformers.pipelines import PIPELINE_REGISTRY, Pipeline

from .errors import ConfigError
from .images import load_image
from .retrieval.rescoring import model_kind

TASK = "image-copy-detection"


def _read(image):
    if isinstance(image, str) and image.startswith(("http://", "https://")):
        from transformers.image_utils import load_image as fetch

        image = fetch(image)
    return load_image(image)


def _as_pairs(query, reference):
    """Normalise the call forms to one ``{"query", "reference"}`` dict or a list of them."""
    if reference is not None:
        if isinstance(query, (list, tuple)) != isinstance(reference, (list, tuple)):
            raise ConfigError("pass either one query and one reference, or two lists of equal length")
        if isinstance(query, (list, tuple)):
            if len(query) != len(reference):
                raise ConfigError(f"{len(query)} queries but {len(reference)} references")
            return [{"query": q, "reference": r} for q, r in zip(query, reference)]
        return {"query": query, "reference": reference}
    if isinstance(query, dict):
        return query
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
        self.kind = model_kind(self.model)
        if self.image_processor is None:
            raise ConfigError("image-copy-detection needs the model's image processor")

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
            images=[_read(pair["query"]), _read(pair["reference"])], return_tensors="pt"
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


PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=ImageCopyDetectionPipeline, pt_model=AutoModel, type="image")
