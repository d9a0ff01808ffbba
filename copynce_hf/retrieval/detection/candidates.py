"""Stage 1 of :func:`~copynce_hf.retrieval.detection.pipeline.detect`, for one descriptor: its candidate references for
every query (supplementary "More about Candidates List for Matcher").

The index over the reference views (and the auxiliary images') is built or reused, whitened when a whitening sample
is given; the query views are embedded (or reused); with descriptor content tokens the search runs on content
descriptors (:func:`~copynce_hf.retrieval.content.stage.detect_content_search`, beyond the paper); each query keeps
its top ``candidates`` references (:func:`~copynce_hf.retrieval.search.references.search_references`: LCE views,
score normalisation with an auxiliary set), less each reference's background with collection normalisation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...modeling.errors import PredictionsError
from ..content.stage import detect_content_search
from ..descriptors.cached import Descriptor, learn_whitening, note_skips, query_view_descriptors
from ..descriptors.sets import DescriptorSet
from ..descriptors.views import ViewPreset
from ..descriptors.whitening import Whitening
from ..predictions import Prediction
from ..search.background import normalised_reference_scores, reference_background
from ..search.cached_index import view_index
from ..search.index import DescriptorIndex
from ..search.references import search_references
from ..sources import SourceImages
from ..work_folder import is_main_process, reuse_saved, rewriting, views_identity
from .config import DESCRIPTOR_VIEW_NAMES, DetectConfig


@dataclasses.dataclass
class CandidateSearch:
    """What every descriptor's candidate search reads: the image sources (``auxiliary`` and ``whiten_from`` may be
    ``None``), the settings, the views, the extraction options (``batch_size``, ``num_workers``, ``accelerator``),
    progress bars and the log."""

    queries: object
    references: object
    auxiliary: object
    whiten_from: object
    config: DetectConfig
    preset: ViewPreset
    extract: dict
    progress: bool
    log: Callable[[str], None]


@dataclasses.dataclass
class DescriptorCandidates:
    """One descriptor's candidates and what finding them took.

    Attributes:
        found: each query's top ``candidates`` references.
        seconds: wall time per step (``index:<name>``, ``auxiliary:<name>``, ``query views:<name>``,
            ``search:<name>``).
        reused: steps read from the cache folder (``query views:<name>``).
        skipped_queries, skipped_references: id -> reason of each image left out.
        whole: the query views' and the references' descriptors of whole images, before content tokens (what query
            crops compare).
        backgrounds: with ``descriptor_weight``, each reference's background among the whole images (as collection
            normalisation measures it), which the descriptor's evidence subtracts; ``None`` otherwise.
    """

    found: list[Prediction]
    seconds: dict[str, float]
    reused: list[str]
    skipped_queries: dict[str, str]
    skipped_references: dict[str, str]
    whole: tuple[DescriptorSet, DescriptorSet]
    backgrounds: dict[str, float] | None = None


def descriptor_candidates(search: CandidateSearch, descriptor: Descriptor, folder: Path | None
                          ) -> DescriptorCandidates:
    """The descriptor's candidates of every query, its caches in ``folder`` (``None``: none kept)."""
    seconds: dict[str, float] = {}
    skipped_references: dict[str, str] = {}
    index, auxiliary_index = _indexes(search, descriptor, folder, seconds)
    note_skips(index.references, skipped_references)
    query_views, seconds[f"query views:{descriptor.name}"], reused = query_view_descriptors(
        descriptor, search.queries, search.preset, folder / "queries" if folder else None, progress=search.progress,
        description=f"{descriptor.name}: query views", **search.extract)
    start = time.perf_counter()
    skipped_queries: dict[str, str] = {}
    note_skips(query_views, skipped_queries)
    if len(query_views) == 0:
        raise PredictionsError(f"none of the {len(search.queries)} query images could be read")
    whole = (query_views, index.references)
    config = search.config
    backgrounds, whole_index = None, index
    if config.descriptor_weight:  # of the whole images' index; its cache is collection normalisation's unless content
        backgrounds = reference_backgrounds(search, descriptor, index, auxiliary_index,  # tokens change that index
                                            None if config.descriptor_content_tokens else folder)
    index, auxiliary_index, query_views = detect_content_search(
        descriptor, (SourceImages(search.queries), SourceImages(search.references),
                     SourceImages(search.auxiliary) if search.auxiliary is not None else None),
        index, auxiliary_index, query_views, config, search.extract["accelerator"], search.log)
    pool = 2 * config.candidates if config.normalises_references else config.candidates
    found = search_references(index, query_views, pool, query_views=search.preset, auxiliary=auxiliary_index,
                              alpha=config.alpha, k_start=config.k_start, k_end=config.k_end)
    normalised = ", score-normalised" if search.auxiliary is not None else ""
    if config.normalises_references:  # the backgrounds above where the search ran on that same index
        found, normalised = _less_backgrounds(search, descriptor, found, (index, auxiliary_index), folder, normalised,
                                              backgrounds if index is whole_index else None)
    seconds[f"search:{descriptor.name}"] = time.perf_counter() - start
    search.log(f"{descriptor.name}: {len(found)} candidate pairs ({DESCRIPTOR_VIEW_NAMES[config.descriptor_lce]}"
               f"{normalised})")
    return DescriptorCandidates(found, seconds, [f"query views:{descriptor.name}"] if reused else [],
                                skipped_queries, skipped_references, whole, backgrounds)


def _indexes(search: CandidateSearch, descriptor: Descriptor, folder: Path | None, seconds: dict[str, float]
             ) -> tuple[DescriptorIndex, DescriptorIndex | None]:
    """The indexes of the reference views and of the auxiliary images' (``None`` without them), whitened with the
    descriptor's whitening when a sample is given, each cached in ``folder/<role>``; their times go to ``seconds``."""
    start = time.perf_counter()
    whitening = descriptor_whitening(search, descriptor, folder)
    indexes: list[DescriptorIndex | None] = []
    for role, source in (("references", search.references), ("auxiliary", search.auxiliary)):
        if source is None:
            indexes.append(None)
            continue
        indexes.append(view_index(descriptor, source, search.preset, folder / role if folder else None,
                                  progress=search.progress, description=f"{descriptor.name}: {role.rstrip('s')} views",
                                  whitening=whitening, log=search.log, **search.extract))
        seconds[f"{'index' if role == 'references' else role}:{descriptor.name}"] = time.perf_counter() - start
        start = time.perf_counter()
    return indexes[0], indexes[1]


def descriptor_whitening(search: CandidateSearch, descriptor: Descriptor, folder: Path | None) -> Whitening | None:
    """The descriptor's whitening learned from ``whiten_from`` (``None`` without it), cached in ``folder/whitening``."""
    if search.whiten_from is None:
        return None
    whitening = learn_whitening(descriptor, search.whiten_from, search.preset, search.config.whiten_dim,
                                folder / "whitening" if folder else None, progress=search.progress,
                                description=f"{descriptor.name}: whitening sample", **search.extract)
    search.log(f"{descriptor.name}: whitening learned from {whitening.samples} sample views "
               f"({whitening.input_dim} -> {whitening.dim} dimensions)")
    return whitening


def _less_backgrounds(search: CandidateSearch, descriptor: Descriptor, found: list[Prediction], indexes: tuple,
                      folder: Path | None, normalised: str, background: dict[str, float] | None = None
                      ) -> tuple[list[Prediction], str]:
    """``found`` less each reference's background (collection normalisation; ``background`` where already measured
    on ``indexes``), its top ``candidates`` per query, and the log's description of the scores with it."""
    config = search.config
    if background is None:
        background = reference_backgrounds(search, descriptor, *indexes, folder)
    found = normalised_reference_scores(found, background, config.collection.alpha, config.candidates)
    among = "other references" if config.reference_background == "collection" else "auxiliary images"
    normalised += (f", less each reference's background: its mean cosine to the {among} of ranks "
                   f"{config.collection.k_start}-{config.collection.k_end}, median "
                   f"{np.median(list(background.values()) or [0.0]):.3f}")
    return found, normalised


def reference_backgrounds(search: CandidateSearch, descriptor: Descriptor, index: DescriptorIndex,
                          auxiliary_index: DescriptorIndex | None, folder: Path | None) -> dict[str, float]:
    """Each reference's background (:func:`~copynce_hf.retrieval.search.background.reference_background`): among the
    other references (one self-search of ``index``, kept in ``folder/reference-background`` and reused for the same
    references, model, views, whitening and ranks), or among the auxiliary images."""
    config = search.config
    if config.reference_background == "auxiliary":
        return reference_background(index, config.collection.k_start, config.collection.k_end, auxiliary_index)
    identity = {**views_identity(descriptor.model, descriptor.processor, search.references, search.preset.name,
                                 "reference background"),
                "whitening": index.whitening.fingerprint() if index.whitening is not None else None,
                "k_start": config.collection.k_start, "k_end": config.collection.k_end}
    cache = folder / "reference-background" if folder is not None else None
    saved = reuse_saved(cache, identity, lambda: DescriptorSet.load(cache / "background.safetensors"),
                        "the references' backgrounds")
    if saved is not None:
        return dict(zip(saved.ids, saved.descriptors[:, 0].tolist()))
    # float32, as kept on disk: a run that reuses them scores exactly as the run that computed them
    background = {reference: float(np.float32(value)) for reference, value in
                  reference_background(index, config.collection.k_start, config.collection.k_end).items()}
    if cache is not None and background and is_main_process():
        with rewriting(cache, identity):
            DescriptorSet(list(background), np.array(list(background.values()), dtype=np.float32)[:, None]).save(
                cache / "background.safetensors")
    return background
