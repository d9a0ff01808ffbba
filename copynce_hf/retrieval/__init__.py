"""Retrieval: finding which references an image copies, stage by stage.

Each stage is a folder or module that imports only the stages before it in this list
(``tests/test_package_structure.py`` checks it, this facade included):

* :mod:`.sources`, :mod:`.work_folder`, :mod:`.predictions`, :mod:`.presets`: what every stage shares: image
  sources, the one identity of work kept on disk, the one prediction type, the named settings;
* :mod:`.descriptors`: descriptors of images and of their LCE views, extracted in resumable chunks, whitened;
* :mod:`.search`: faiss indexes, the one descriptor search (:func:`search_references`: views, score
  normalisation, feature stretching), collection-normalised scores, merged candidate lists;
* :mod:`.content`: each image's matcher encoder tokens, encoded once and kept (the token store), which of them are
  its own content, the content-token stage and content crops;
* :mod:`.verify`: the matcher verifies candidate pairs: one scoring path over cached encoder tokens, in chunks
  kept on disk, with local crops ensembling;
* :mod:`.detection`: the paper's pipeline as one function (:func:`detect`), its settings and first stage;
* :mod:`.deduplication`: copies inside one collection (:func:`dedup`) and their groups.

What runs them for a command (requests, output folders) is :mod:`copynce_hf.runs`; thresholds for a precision are
:mod:`copynce_hf.calibration`; galleries and affinity maps, :mod:`copynce_hf.reports`.

The detection flow (see docs/ARCHITECTURE.md)::

    images -> extract_descriptors -> DescriptorIndex.build -> search_references (the one search: views,
      score normalisation, feature stretching) -> rescore_predictions (matcher, local crops)
      -> write_predictions (DISC21 CSV) -> copy_detection metric

Names are imported on first access (``from copynce_hf.retrieval import detect`` loads what it needs),
so that the command line and ``import copynce_hf`` start without torch, faiss or the models.
"""

import importlib
import sys

#: module (relative to this package, in stage order) -> the public names it defines.
_MODULE_NAMES = {
    "sources": ("IMAGE_EXTENSIONS", "DatasetImageSource", "ImageFolderSource", "ImageListSource",
                "StreamedImageSource", "list_image_files", "open_dataset_source"),
    "predictions": ("PREDICTION_COLUMNS", "Prediction", "check_unique", "read_predictions", "write_predictions"),
    "presets": ("DEFAULT_CANDIDATES", "DEFAULT_CHUNK_SIZE", "DEFAULT_INDEX_CHUNK_SIZE", "DETECT_PRESETS",
                "DETECT_PRESET_FIELDS", "CollectionNormalisation"),
    "descriptors.sets": ("DescriptorSet", "concatenate_descriptor_files", "export_disc21_hdf5"),
    "descriptors.extract": ("ProcessedImages", "extract_descriptors"),
    "descriptors.views": ("DESCRIPTOR_LCE_MODES", "MATCHER_LCE_MODES", "View", "ViewPreset",
                          "authors_query_view_groups", "authors_reference_views", "matcher_view_pairs", "ninth_boxes",
                          "one_third_boxes", "paper_query_views", "paper_reference_views", "quarter_boxes",
                          "render_view"),
    "descriptors.view_extraction": ("ViewSource", "extract_view_descriptors"),
    "descriptors.whitening": ("Whitening",),
    "descriptors.chunked_extraction": ("ChunkedDescriptors", "extract_in_chunks"),
    "descriptors.cached": ("Descriptor", "learn_whitening"),
    "search.index": ("INDEX_KINDS", "DescriptorIndex", "IndexConfig", "knn_predictions", "write_index_from_files"),
    "search.postprocess": ("auxiliary_similarities", "euclidean_scores", "normalize_scores",
                           "score_normalization_bias", "stretch_features"),
    "search.view_search": ("lce_normalization_bias", "search_view_groups", "search_views", "view_predictions",
                           "view_preset_of"),
    "search.cached_index": ("view_index",),
    "search.references": ("search_references",),
    "search.background": ("matcher_backgrounds", "neighbour_background", "normalised_probability",
                          "normalised_reference_scores", "pair_background", "reference_background"),
    "search.candidates": ("candidate_recall", "merge_candidates", "top_per_query"),
    "verify.scorer": ("MatcherScorer", "matcher_stages"),
    "verify.chunked_scoring": ("ChunkFolder", "PairScores", "plan_chunks", "score_in_chunks"),
    "verify.local_crops": ("LocalCrops", "PairViews", "grid_boxes", "score_views"),
    "verify.pairs": ("PairScoring", "ScoredPairs", "score_pairs"),
    "verify.rescoring": ("RescoreResult", "rescore_predictions"),
    "detection.config": ("DetectConfig",),
    "detection.pipeline": ("DetectResult", "detect"),
    "deduplication.self_search": ("CandidatePairs", "self_neighbours", "self_search_pairs"),
    "deduplication.settings": ("DedupSettings",),
    "deduplication.collection": ("DedupResult", "dedup", "write_pairs"),
    "deduplication.grouping": ("GROUPINGS", "GroupMember", "connected_groups", "connected_members", "group_members",
                               "group_pairs", "pair_precision_recall", "representative_groups", "write_groups"),
}

_SOURCES = {name: module for module, names in _MODULE_NAMES.items() for name in names}


def __getattr__(name: str):
    if name in _SOURCES:
        value = getattr(importlib.import_module(f".{_SOURCES[name]}", __name__), name)
        vars(sys.modules[__name__])[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = list(_SOURCES)
