"""Features for the k-NN graph of global hard negative mining (GHNM, paper supplementary Algorithm 1).

The graph is built from DINO features (a ``transformers`` ViT's final CLS token, as DINO's k-NN
evaluation), an original DINO ``.pth`` checkpoint, or a CopyNCE descriptor's descriptors:
:func:`load_feature_model` loads one, :func:`extract_knn_features` computes the L2-normalised
features of a dataset, :func:`copynce_hf.data.hard_negatives.build_knn_graph` searches them;
:func:`knn_graph_of_images` does the three (``scripts/build_knn.py`` is the command).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..modeling.errors import ConfigError
from .hard_negatives import KNNGraph, build_knn_graph
from .loading import ImageDecoder

__all__ = ["extract_knn_features", "knn_graph_of_images", "load_feature_model"]


def knn_graph_of_images(images, model: str, k: int, image_size: int = 224, batch_size: int = 64,
                        num_workers: int = 2, device: str = "cpu") -> tuple[KNNGraph, str, int]:
    """``(graph, feature kind, unreadable images skipped)``: the k nearest neighbours of every image of ``images`` (a dataset
    with ``image`` and ``image_id`` columns) under the features of ``model`` (a CopyNCE descriptor or
    ``transformers`` ViT folder or Hub id, or a DINO ``.pth``; ``image_size`` when it has no processor).
    The feature kind is ``descriptors`` or ``cls`` (:func:`load_feature_model`); unreadable images get no
    neighbours."""
    if k < 1:
        raise ConfigError(f"k (--k) must be >= 1, got {k}")
    feature_model, processor, kind = load_feature_model(model, image_size)
    features, valid, skipped = extract_knn_features(feature_model, processor, kind, images, batch_size, num_workers,
                                                    device)
    return build_knn_graph(features, images["image_id"], k, valid=valid), kind, skipped


def load_feature_model(name: str, image_size: int):
    """``(model, processor, kind)``; ``kind`` is ``descriptors`` (CopyNCE descriptor) or ``cls``."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModel

    from ..modeling.image_processing_copynce import CopyNCEImageProcessor
    from ..modeling.modeling_copynce import CopyNCEDescriptorModel

    default_processor = CopyNCEImageProcessor(size={"height": image_size, "width": image_size})
    if name.endswith((".pth", ".pt")):
        if not Path(name).is_file():
            raise ConfigError(f"--model {name!r}: no such DINO checkpoint file")
        model = CopyNCEDescriptorModel.from_dino(name, image_size=image_size)
        return model, default_processor, "cls"
    try:
        config = AutoConfig.from_pretrained(name)
        model = AutoModel.from_pretrained(name, dtype=torch.float32)  # float32 features, as the evaluation's
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"cannot load --model {name!r}: {error.__class__.__name__}: {str(error).splitlines()[0]}. "
            "Without network access, pass a local model folder (e.g. a ViT saved with save_pretrained) "
            "or a DINO .pth checkpoint."
        ) from error
    try:
        processor = AutoImageProcessor.from_pretrained(name)
    except (OSError, ValueError):
        processor = default_processor
    kind = "descriptors" if getattr(config, "model_type", "") == "copynce-descriptor" else "cls"
    return model, processor, kind


class _DecodedImages(torch.utils.data.Dataset):
    """Decoded, pre-processed images; unreadable ones yield ``None`` (counted by the decoder)."""

    def __init__(self, rows, processor):
        self.rows, self.processor, self.decoder = rows, processor, ImageDecoder()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        row = self.rows[index]
        image = self.decoder(row["image"], row["image_id"])
        if image is None:
            return index, None
        return index, self.processor(image, return_tensors="pt")["pixel_values"][0]


def _collate(items):
    """(indices (B,) int64, pixels (B, 3, H, W) or None, count of unreadable images) of the readable items."""
    good = [(i, x) for i, x in items if x is not None]
    indices = torch.tensor([i for i, _ in good], dtype=torch.long)
    pixels = torch.stack([x for _, x in good]) if good else None
    return indices, pixels, len(items) - len(good)


@torch.inference_mode()
def extract_knn_features(model, processor, kind: str, rows, batch_size: int, num_workers: int, device: str):
    """L2-normalised float32 (N, D) features, bool (N,) readable mask and the count of unreadable images,
    in the order of ``rows`` (a dataset with ``image`` and ``image_id`` columns)."""
    model.to(device).eval()
    loader = torch.utils.data.DataLoader(_DecodedImages(rows, processor), batch_size=batch_size, num_workers=num_workers,
                                         collate_fn=_collate)
    features, valid, skipped = None, np.zeros(len(rows), dtype=bool), 0
    for indices, pixels, bad in tqdm(loader, desc="descriptors", unit="batch"):
        skipped += bad
        if pixels is None:
            continue
        outputs = model(pixel_values=pixels.to(device))
        vectors = outputs.descriptors if kind == "descriptors" else outputs.last_hidden_state[:, 0]
        vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).cpu().numpy()
        if features is None:
            features = np.zeros((len(rows), vectors.shape[1]), dtype=np.float32)
        features[indices.numpy()] = vectors
        valid[indices.numpy()] = True
    if features is None:
        raise ConfigError("no image of the dataset could be read")
    return features, valid, skipped
