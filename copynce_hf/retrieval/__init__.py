"""Retrieval: descriptors for image collections, faiss search, post-processing, matcher re-scoring.

The detection flow (see docs/ARCHITECTURE.md)::

    images -> extract_descriptors -> DescriptorIndex.build -> search_references (the one search: views,
      score normalisation, feature stretching) -> rescore_predictions (matcher, local crops)
      -> write_predictions (DISC21 CSV) -> copy_detection metric

:func:`detect` runs the paper's whole pipeline: LCE views (:mod:`.views`) searched per view
(:mod:`.view_search`), several descriptors' candidates merged (:mod:`.candidates`), the matcher
with its encoder-token cache (:mod:`.matcher_cache`), its pairs scored in chunks shared by Accelerate's
processes and resumed after a kill (:mod:`.chunked_scoring`).

Names are imported on first access (``from copynce_hf.retrieval import detect`` loads what it needs),
so that the command line and ``import copynce_hf`` start without torch, faiss or the models.
"""

import importlib
import sys
import types

_SOURCES = {
    **dict.fromkeys(('AffinityMaps', 'affinity_figures', 'affinity_maps', 'save_affinity_figures'), 'affinity'),
    **dict.fromkeys(('candidate_recall', 'merge_candidates', 'top_per_query'), 'candidates'),
    **dict.fromkeys(('ChunkFolder', 'PairScores', 'plan_chunks', 'score_in_chunks'), 'chunked_scoring'),
    **dict.fromkeys(('ChunkedDescriptors', 'extract_in_chunks'), 'chunked_extraction'),
    **dict.fromkeys(('DescriptorSet', 'concatenate_descriptor_files', 'export_disc21_hdf5'), 'descriptors'),
    **dict.fromkeys(('DEFAULT_CANDIDATES', 'DEFAULT_CHUNK_SIZE', 'DEFAULT_INDEX_CHUNK_SIZE', 'DETECT_PRESETS', 'DETECT_PRESET_FIELDS'), 'presets'),
    **dict.fromkeys(('Descriptor', 'DetectConfig', 'DetectResult', 'detect', 'learn_whitening', 'view_index'), 'detect'),
    **dict.fromkeys(('Whitening',), 'whitening'),
    **dict.fromkeys(('DedupResult', 'connected_groups', 'dedup', 'group_pairs', 'pair_precision_recall', 'self_search_pairs',
                      'write_groups'), 'dedup'),
    **dict.fromkeys(('ProcessedImages', 'extract_descriptors'), 'extract'),
    **dict.fromkeys(('INDEX_KINDS', 'DescriptorIndex', 'IndexConfig', 'knn_predictions', 'write_index_from_files'), 'index'),
    **dict.fromkeys(('MatcherScorer', 'matcher_stages'), 'matcher_cache'),
    **dict.fromkeys(('OnnxDescriptorModel', 'OnnxMatcherModel', 'load_onnx_model'), 'onnx_runtime'),
    **dict.fromkeys(('auxiliary_similarities', 'euclidean_scores', 'normalize_scores', 'score_normalization_bias', 'stretch_features'), 'postprocess'),
    **dict.fromkeys(('PREDICTION_COLUMNS', 'Prediction', 'check_unique', 'read_predictions', 'write_predictions'), 'predictions'),
    **dict.fromkeys(('LocalCrops', 'PairViews', 'RescoreResult', 'grid_boxes', 'model_kind', 'rescore_predictions', 'score_views'), 'rescoring'),
    **dict.fromkeys(('search_references',), 'search'),
    **dict.fromkeys(('IMAGE_EXTENSIONS', 'DatasetImageSource', 'ImageFolderSource', 'ImageListSource', 'StreamedImageSource', 'list_image_files', 'open_dataset_source'), 'sources'),
    **dict.fromkeys(('ViewSource', 'extract_view_descriptors', 'lce_normalization_bias', 'search_view_groups', 'search_views', 'view_predictions', 'view_preset_of'), 'view_search'),
    **dict.fromkeys(('DESCRIPTOR_LCE_MODES', 'MATCHER_LCE_MODES', 'View', 'ViewPreset', 'authors_query_view_groups', 'authors_reference_views', 'matcher_view_pairs', 'ninth_boxes', 'one_third_boxes', 'paper_query_views', 'paper_reference_views', 'quarter_boxes', 'render_view'), 'views'),
}


class _LazyPackage(types.ModuleType):
    """Keeps an exported name (``detect``, a function) from being replaced by the submodule of the same
    name when that submodule is imported (the import system sets it as an attribute of the package)."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _SOURCES.get(name) == name and value.__name__.endswith(f".{name}"):
            return  # resolved by __getattr__ to the exported object instead
        super().__setattr__(name, value)


def __getattr__(name: str):
    if name in _SOURCES:
        value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
        vars(sys.modules[__name__])[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


sys.modules[__name__].__class__ = _LazyPackage

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
    "model_kind",
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
    "DedupResult",
    "connected_groups",
    "dedup",
    "group_pairs",
    "pair_precision_recall",
    "self_search_pairs",
    "write_groups",
]
