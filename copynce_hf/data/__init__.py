"""Training data: image datasets (``datasets``), PixTrace copy pairs, the collator, hard negatives.

Flow: :func:`load_image_dataset` (DISC21 folder, image folder, saved dataset or Hub id) ->
:class:`CopyPairDataset` / :class:`StreamingCopyPairDataset` (a traced query and reference per item,
made in the DataLoader workers) batched by :class:`CopyPairBatchSampler` (with GHNM from a
:class:`KNNGraph`) -> :class:`PixTraceCollator` (uint8 pixel tensors, labels, overlap priors) ->
:func:`normalize_pixel_values` on the training device.
"""

from .collator import PIXEL_KEYS, CopyPair, PixTraceCollator, normalize_pixel_values
from .hard_negatives import CopyPairBatchSampler, KNNGraph, PairKey, build_knn_graph
from .loading import (
    ASSET_IMAGES,
    DISC21_SPLITS,
    ImageDecoder,
    default_image_folder,
    is_disc21_folder,
    load_disc21_ground_truth,
    load_image_dataset,
)
from .pairs import (
    NEGATIVE_ROLES,
    OTHER_IMAGES,
    RECIPES,
    CopyPairDataset,
    CopyPairMaker,
    FinetuneMixDataset,
    GroundTruthPairDataset,
    StreamingCopyPairDataset,
)
from .templated import TemplateGroups, TemplatePairs

__all__ = [
    "ASSET_IMAGES",
    "DISC21_SPLITS",
    "PIXEL_KEYS",
    "NEGATIVE_ROLES",
    "OTHER_IMAGES",
    "RECIPES",
    "CopyPair",
    "CopyPairBatchSampler",
    "CopyPairDataset",
    "CopyPairMaker",
    "FinetuneMixDataset",
    "GroundTruthPairDataset",
    "ImageDecoder",
    "KNNGraph",
    "PairKey",
    "PixTraceCollator",
    "StreamingCopyPairDataset",
    "TemplateGroups",
    "TemplatePairs",
    "build_knn_graph",
    "default_image_folder",
    "is_disc21_folder",
    "load_disc21_ground_truth",
    "load_image_dataset",
    "normalize_pixel_values",
]
