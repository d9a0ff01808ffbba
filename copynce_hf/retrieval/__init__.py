"""Retrieval: descriptors for image collections, faiss search, post-processing, matcher re-scoring.

The detection flow (see docs/ARCHITECTURE.md)::

    images -> extract_descriptors -> DescriptorIndex.build / search -> knn_predictions
      (+ score normalisation / feature stretching) -> rescore_predictions (matcher, local crops)
      -> write_predictions (DISC21 CSV) -> copy_detection metric
"""

from .affinity import AffinityMaps, affinity_figures, affinity_maps, save_affinity_figures
from .descriptors import DescriptorSet, export_disc21_hdf5
from .extract import ProcessedImages, extract_descriptors
from .index import INDEX_KINDS, DescriptorIndex, IndexConfig, knn_predictions
from .postprocess import (
    auxiliary_similarities,
    euclidean_scores,
    normalize_scores,
    score_normalization_bias,
    stretch_features,
)
from .predictions import PREDICTION_COLUMNS, Prediction, check_unique, read_predictions, write_predictions
from .rescoring import (
    LocalCrops,
    PairViews,
    RescoreResult,
    grid_boxes,
    model_kind,
    rescore_predictions,
    score_views,
)
from .sources import IMAGE_EXTENSIONS, DatasetImageSource, ImageFolderSource, list_image_files

__all__ = [
    "AffinityMaps",
    "affinity_figures",
    "affinity_maps",
    "save_affinity_figures",
    "DescriptorSet",
    "export_disc21_hdf5",
    "ProcessedImages",
    "extract_descriptors",
    "INDEX_KINDS",
    "DescriptorIndex",
    "IndexConfig",
    "knn_predictions",
    "auxiliary_similarities",
    "euclidean_scores",
    "normalize_scores",
    "score_normalization_bias",
    "stretch_features",
    "PREDICTION_COLUMNS",
    "Prediction",
    "check_unique",
    "read_predictions",
    "write_predictions",
    "LocalCrops",
    "PairViews",
    "RescoreResult",
    "grid_boxes",
    "model_kind",
    "rescore_predictions",
    "score_views",
    "IMAGE_EXTENSIONS",
    "DatasetImageSource",
    "ImageFolderSource",
    "list_image_files",
]
