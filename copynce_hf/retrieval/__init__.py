"""Retrieval: descriptors for image collections, faiss search, post-processing, matcher re-scoring.

The detection flow (see docs/ARCHITECTURE.md)::

    images -> extract_descriptors -> DescriptorIndex.build / search -> knn_predictions
      (+ score normalisation / feature stretching) -> rescore_predictions (matcher, local crops)
      -> write_predictions (DISC21 CSV) -> copy_detection metric

:func:`detect` runs the paper's whole pipeline: LCE views (:mod:`.views`) searched per view
(:mod:`.view_search`), several descriptors' candidates merged (:mod:`.candidates`), the matcher
with its encoder-token cache (:mod:`.matcher_cache`).
"""

from .affinity import AffinityMaps, affinity_figures, affinity_maps, save_affinity_figures
from .candidates import candidate_recall, merge_candidates, top_per_query
from .descriptors import DescriptorSet, export_disc21_hdf5
from .detect import DEFAULT_CANDIDATES, Descriptor, DetectConfig, DetectResult, detect, view_index
from .extract import ProcessedImages, extract_descriptors
from .index import INDEX_KINDS, DescriptorIndex, IndexConfig, knn_predictions
from .matcher_cache import MatcherScorer, matcher_stages
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
from .sources import (
    IMAGE_EXTENSIONS,
    DatasetImageSource,
    ImageFolderSource,
    ImageListSource,
    list_image_files,
)
from .view_search import (
    ViewSource,
    extract_view_descriptors,
    lce_normalization_bias,
    search_views,
    view_predictions,
    view_preset_of,
)
from .views import (
    DESCRIPTOR_LCE_MODES,
    MATCHER_LCE_MODES,
    View,
    ViewPreset,
    matcher_view_pairs,
    ninth_boxes,
    one_third_boxes,
    paper_query_views,
    paper_reference_views,
    quarter_boxes,
    render_view,
)

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
    "ImageListSource",
    "list_image_files",
    "candidate_recall",
    "merge_candidates",
    "top_per_query",
    "MatcherScorer",
    "matcher_stages",
    "DESCRIPTOR_LCE_MODES",
    "MATCHER_LCE_MODES",
    "View",
    "ViewPreset",
    "matcher_view_pairs",
    "ninth_boxes",
    "one_third_boxes",
    "paper_query_views",
    "paper_reference_views",
    "quarter_boxes",
    "render_view",
    "ViewSource",
    "extract_view_descriptors",
    "lce_normalization_bias",
    "search_views",
    "view_predictions",
    "view_preset_of",
    "DEFAULT_CANDIDATES",
    "Descriptor",
    "DetectConfig",
    "DetectResult",
    "detect",
    "view_index",
]
