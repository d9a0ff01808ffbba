"""Features for the k-NN graph of global hard negative mining (GHNM, paper supplementary Algorithm 1).

The graph is built from DINO features (a ``transformers`` ViT's or an original DINO ``.pth``
checkpoint's final CLS token, as DINO's k-NN evaluation) or a CopyNCE descriptor's descriptors:
:func:`load_feature_model` loads one, :func:`extract_knn_features` computes the L2-normalised
features of a dataset, :func:`copynce_hf.data.hard_negatives.build_knn_graph` searches them;
:func:`knn_graph_of_images` does the three (``scripts/build_knn.py`` is the command).

Two forms of DINO features (:data:`KNN_FEATURES`): ``package`` runs the model as it was saved (a ``transformers``
ViT with its configuration's LayerNorm epsilon and its own image processor; a DINO ``.pth`` with DINO's epsilon
1e-6); ``authors`` runs it as the authors' ``scripts/run/extract_dino_features.py`` does (their ViT: LayerNorm
epsilon 1e-4 in every block and the final norm, the final norm's CLS token; the image resized to
``image_size`` x ``image_size``, bicubic, and normalised with the ImageNet mean and std, as their evaluation
transform ``build_eval_transforms``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..modeling.errors import ConfigError
from .hard_negatives import KNNGraph, build_knn_graph
from .instances.folder import read_manifest
from .loading import ImageDecoder

__all__ = ["KNN_FEATURES", "extract_knn_features", "image_groups", "knn_graph_of_images", "load_feature_model"]

#: The forms of the features (``scripts/build_knn.py --features``), see the module docstring.
KNN_FEATURES = ("package", "authors")


def knn_graph_of_images(images, model: str, k: int, image_size: int = 224, batch_size: int = 64,
                        num_workers: int = 2, device: str = "cpu", features: str = "package",
                        groups: list[str] | None = None) -> tuple[KNNGraph, str, int]:
    """``(graph, feature kind, unreadable images skipped)``: the k nearest neighbours of every image of ``images`` (a dataset
    with ``image`` and ``image_id`` columns) under the features of ``model`` (a CopyNCE descriptor or
    ``transformers`` ViT folder or Hub id, or a DINO ``.pth``; ``image_size`` when it has no processor, and always
    with ``features="authors"``). The feature kind is ``descriptors`` or ``cls`` (:func:`load_feature_model`);
    unreadable images get no neighbours. ``groups`` (one label per row, :func:`image_groups`): neighbours only
    within an image's own group."""
    if k < 1:
        raise ConfigError(f"k (--k) must be >= 1, got {k}")
    feature_model, processor, kind = load_feature_model(model, image_size, features)
    vectors, valid, skipped = extract_knn_features(feature_model, processor, kind, images, batch_size, num_workers,
                                                   device)
    return build_knn_graph(vectors, images["image_id"], k, valid=valid, groups=groups), kind, skipped


def image_groups(images, group_by: str, dataset: str | Path | None = None) -> list[str]:
    """The group of every row of ``images`` for a graph per group (``scripts/build_knn.py --group_by``): the
    values of its column ``group_by``, or, for an instance folder ``dataset`` (:mod:`copynce_hf.data.instances`),
    the field ``group_by`` of each image's record in the folder's manifest (``kind``: ``photo``, ``procedural``,
    ``grid``, ...)."""
    if group_by in images.column_names:
        return [str(value) for value in images[group_by]]
    manifest = read_manifest(dataset) if dataset is not None and Path(dataset).is_dir() else None
    if manifest is None:
        raise ConfigError(f"--group_by {group_by!r}: the dataset has no such column (its columns: "
                          f"{', '.join(images.column_names)}) and is not an instance folder with a manifest")
    records = {Path(record["file"]).stem: record for record in manifest["instances"]}
    groups = []
    for image_id in images["image_id"]:
        record = records.get(image_id)
        if record is None or group_by not in record:
            raise ConfigError(f"--group_by {group_by!r}: image {image_id!r} of {str(dataset)!r} has "
                              + ("no record in the folder's manifest" if record is None
                                 else f"no field {group_by!r} in its manifest record (fields: {', '.join(record)})"))
        groups.append(str(record[group_by]))
    return groups


def load_feature_model(name: str, image_size: int, features: str = "package"):
    """``(model, processor, kind)``; ``kind`` is ``descriptors`` (CopyNCE descriptor) or ``cls``; ``features`` is one
    of :data:`KNN_FEATURES` (``authors`` takes DINO weights only)."""
    from transformers import AutoImageProcessor, AutoModel

    from ..modeling.image_processing_copynce import CopyNCEImageProcessor

    if features not in KNN_FEATURES:
        raise ConfigError(f"--features {features!r} must be one of {KNN_FEATURES}")
    default_processor = CopyNCEImageProcessor(size={"height": image_size, "width": image_size})
    if features == "authors":
        return _authors_dino(name, image_size), default_processor, "cls"
    if name.endswith((".pth", ".pt")):
        return _dino_checkpoint(name, image_size), default_processor, "cls"
    config = _model_config(name)
    try:
        model = AutoModel.from_pretrained(name, dtype=torch.float32)  # float32 features, as the evaluation's
    except (OSError, ValueError) as error:
        raise _cannot_load(name, error) from error
    try:
        processor = AutoImageProcessor.from_pretrained(name)
    except (OSError, ValueError):
        processor = default_processor
    kind = "descriptors" if getattr(config, "model_type", "") == "copynce-descriptor" else "cls"
    return model, processor, kind


def _cannot_load(name: str, error: Exception) -> ConfigError:
    return ConfigError(
        f"cannot load --model {name!r}: {error.__class__.__name__}: {str(error).splitlines()[0]}. "
        "Without network access, pass a local model folder (e.g. a ViT saved with save_pretrained) "
        "or a DINO .pth checkpoint."
    )


def _model_config(name: str):
    """The ``transformers`` configuration of the model folder or Hub id ``name`` (:class:`ConfigError` when none)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise _cannot_load(name, error) from error


def _dino_checkpoint(name: str, image_size: int, **overrides):
    """The ViT of the DINO ``.pth`` file ``name`` (:class:`CopyNCEViTModel`, its final LayerNorm applied; DINO's
    LayerNorm epsilon 1e-6 unless ``overrides`` say otherwise)."""
    from ..modeling.modeling_copynce import CopyNCEViTModel

    if not Path(name).is_file():
        raise ConfigError(f"--model {name!r}: no such DINO checkpoint file")
    return CopyNCEViTModel.from_dino(name, image_size=image_size, final_layer_norm=True, **overrides)


def _authors_dino(name: str, image_size: int):
    """DINO weights (a ``.pth`` file, or a ``transformers`` ViT folder or Hub id) in the authors' ViT: LayerNorm
    epsilon 1e-4 everywhere, the final LayerNorm applied (their ``build_dino_model``: ``build_encoder`` with
    ``last_norm=True``); every backbone weight must come from the source."""
    from ..modeling.configuration_copynce import AUTHORS_LAYER_NORM_EPS
    from ..modeling.errors import CopyNCEError
    from ..modeling.modeling_copynce import CopyNCEViTModel

    overrides = {"layer_norm_eps": AUTHORS_LAYER_NORM_EPS}
    if name.endswith((".pth", ".pt")):
        model = _dino_checkpoint(name, image_size, **overrides)
    else:
        model_type = getattr(_model_config(name), "model_type", "")
        if model_type != "vit":
            raise ConfigError(f"--features authors takes DINO weights (a transformers ViT or a DINO .pth); --model "
                              f"{name!r} is a {model_type!r} model")
        try:
            model = CopyNCEViTModel.from_dino(name, image_size=image_size, final_layer_norm=True, **overrides)
        except (OSError, ValueError, CopyNCEError) as error:
            raise _cannot_load(name, error) from error
    if model.dino_load_report.missing:
        raise ConfigError(f"--model {name!r} lacks backbone weights {model.dino_load_report.missing}")
    return model.float()


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
