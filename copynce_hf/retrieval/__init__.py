"""Retrieval: descriptors for image collections, faiss search, post-processing, matcher re-scoring.

Four layers, each a folder that imports only the ones above it in this list (``tests/test_package_structure.py``
checks it):

* :mod:`.search`: image sources, descriptors and their extraction, LCE views, faiss indexes, whitening, score
  normalisation, candidates, the one search (:func:`search_references`) and the one prediction type;
* :mod:`.jobs`: resumable work on disk: chunked extraction and scoring, the work folder and the one identity of
  descriptors kept on disk (``views_identity``), the matcher's encoder-token cache;
* :mod:`.apps`: what a user runs: matcher re-scoring of predictions, ``detect`` (the paper's pipeline),
  ``dedup`` (copies inside one collection), calibration files (a threshold for a precision), and each command's
  request and one call (``indexing``, ``searching``, ``matching``, ``detect_run``, ``dedup_run``; the models and
  settings a run names in ``pipeline_settings``);
* :mod:`.reports`: what people look at: affinity maps, match and group galleries, the output folders of
  ``copynce detect`` and ``dedup`` (``run_folders``), ``copynce evaluate``'s metrics and curves.

The detection flow (see docs/ARCHITECTURE.md)::

    images -> extract_descriptors -> DescriptorIndex.build -> search_references (the one search: views,
      score normalisation, feature stretching) -> rescore_predictions (matcher, local crops)
      -> write_predictions (DISC21 CSV) -> copy_detection metric

Names are imported on first access (``from copynce_hf.retrieval import detect`` loads what it needs),
so that the command line and ``import copynce_hf`` start without torch, faiss or the models.
"""

import importlib
import sys

_SOURCES = {
    **dict.fromkeys(('AffinityMaps', 'affinity_figures', 'affinity_maps', 'save_affinity_figures'), 'reports.affinity'),
    **dict.fromkeys(('candidate_recall', 'merge_candidates', 'top_per_query'), 'search.candidates'),
    **dict.fromkeys(('ChunkFolder', 'PairScores', 'plan_chunks', 'score_in_chunks'), 'jobs.chunked_scoring'),
    **dict.fromkeys(('ChunkedDescriptors', 'extract_in_chunks'), 'jobs.chunked_extraction'),
    **dict.fromkeys(('DescriptorSet', 'concatenate_descriptor_files', 'export_disc21_hdf5'), 'search.descriptors'),
    **dict.fromkeys(('DEFAULT_CANDIDATES', 'DEFAULT_CHUNK_SIZE', 'DEFAULT_INDEX_CHUNK_SIZE', 'DETECT_PRESETS', 'DETECT_PRESET_FIELDS'), 'search.presets'),
    **dict.fromkeys(('Descriptor', 'DetectConfig', 'DetectResult', 'detect', 'learn_whitening', 'view_index'), 'apps.detect'),
    **dict.fromkeys(('Whitening',), 'search.whitening'),
    **dict.fromkeys(('CandidatePairs', 'DedupResult', 'DedupSettings', 'dedup', 'self_neighbours', 'self_search_pairs',
                      'write_pairs'), 'apps.dedup'),
    **dict.fromkeys(('GROUPINGS', 'GroupMember', 'connected_groups', 'connected_members', 'group_members', 'group_pairs',
                      'pair_precision_recall', 'representative_groups', 'write_groups'), 'apps.grouping'),
    **dict.fromkeys(('matcher_backgrounds', 'neighbour_background', 'normalised_probability',
                      'normalised_reference_scores', 'pair_background', 'reference_background'), 'search.background'),
    **dict.fromkeys(('ProcessedImages', 'extract_descriptors'), 'search.extract'),
    **dict.fromkeys(('INDEX_KINDS', 'DescriptorIndex', 'IndexConfig', 'knn_predictions', 'write_index_from_files'), 'search.index'),
    **dict.fromkeys(('MatcherScorer', 'matcher_stages'), 'jobs.matcher_cache'),
    **dict.fromkeys(('OnnxDescriptorModel', 'OnnxMatcherModel', 'load_onnx_model'), 'search.onnx_runtime'),
    **dict.fromkeys(('auxiliary_similarities', 'euclidean_scores', 'normalize_scores', 'score_normalization_bias', 'stretch_features'), 'search.postprocess'),
    **dict.fromkeys(('PREDICTION_COLUMNS', 'Prediction', 'check_unique', 'read_predictions', 'write_predictions'), 'search.predictions'),
    **dict.fromkeys(('LocalCrops', 'PairViews', 'RescoreResult', 'grid_boxes', 'rescore_predictions', 'score_views'), 'apps.rescoring'),
    **dict.fromkeys(('search_references',), 'search.references'),
    **dict.fromkeys(('IMAGE_EXTENSIONS', 'DatasetImageSource', 'ImageFolderSource', 'ImageListSource', 'StreamedImageSource', 'list_image_files', 'open_dataset_source'), 'search.sources'),
    **dict.fromkeys(('ViewSource', 'extract_view_descriptors', 'lce_normalization_bias', 'search_view_groups', 'search_views', 'view_predictions', 'view_preset_of'), 'search.view_search'),
    **dict.fromkeys(('DESCRIPTOR_LCE_MODES', 'MATCHER_LCE_MODES', 'View', 'ViewPreset', 'authors_query_view_groups', 'authors_reference_views', 'matcher_view_pairs', 'ninth_boxes', 'one_third_boxes', 'paper_query_views', 'paper_reference_views', 'quarter_boxes', 'render_view'), 'search.views'),
}


def __getattr__(name: str):
    if name in _SOURCES:
        value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
        vars(sys.modules[__name__])[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AffinityMaps",
    "affinity_figures",
    "affinity_maps",
    "save_affinity_figures",
    "ChunkFolder",
    "PairScores",
    "plan_chunks",
    "score_in_chunks",
    "ChunkedDescriptors",
    "extract_in_chunks",
    "DescriptorSet",
    "concatenate_descriptor_files",
    "export_disc21_hdf5",
    "ProcessedImages",
    "extract_descriptors",
    "INDEX_KINDS",
    "DescriptorIndex",
    "IndexConfig",
    "knn_predictions",
    "write_index_from_files",
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
    "rescore_predictions",
    "score_views",
    "IMAGE_EXTENSIONS",
    "DatasetImageSource",
    "ImageFolderSource",
    "ImageListSource",
    "StreamedImageSource",
    "list_image_files",
    "open_dataset_source",
    "candidate_recall",
    "merge_candidates",
    "top_per_query",
    "MatcherScorer",
    "matcher_stages",
    "OnnxDescriptorModel",
    "OnnxMatcherModel",
    "load_onnx_model",
    "DESCRIPTOR_LCE_MODES",
    "MATCHER_LCE_MODES",
    "View",
    "ViewPreset",
    "authors_query_view_groups",
    "authors_reference_views",
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
    "search_view_groups",
    "search_views",
    "view_predictions",
    "view_preset_of",
    "search_references",
    "DEFAULT_CANDIDATES",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_INDEX_CHUNK_SIZE",
    "Descriptor",
    "DETECT_PRESETS",
    "DETECT_PRESET_FIELDS",
    "DetectConfig",
    "DetectResult",
    "detect",
    "view_index",
    "learn_whitening",
    "Whitening",
    "CandidatePairs",
    "DedupResult",
    "DedupSettings",
    "dedup",
    "self_neighbours",
    "self_search_pairs",
    "write_pairs",
    "GROUPINGS",
    "GroupMember",
    "connected_groups",
    "connected_members",
    "group_members",
    "group_pairs",
    "pair_precision_recall",
    "representative_groups",
    "write_groups",
    "matcher_backgrounds",
    "neighbour_background",
    "normalised_probability",
    "normalised_reference_scores",
    "pair_background",
    "reference_background",
]
