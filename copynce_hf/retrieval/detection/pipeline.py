"""The paper's detection pipeline as one function: descriptors (+ LCE, + score normalisation), merged
candidates, matcher verification (+ LCE).

Stages (supplementary "More about Candidates List for Matcher"):

1. for every descriptor model: build (or reuse) the index over the reference views, embed the
   query views, take each query's top ``candidates`` references by best view-pair cosine (with the
   ``authors`` views: each query view's own top-k per view group, then the best ``candidates``),
   and score-normalise with an auxiliary set when one is given (:mod:`copynce_hf.retrieval.detection.candidates`);
2. merge the models' lists per query: union, best score, top ``candidates`` (:func:`~copynce_hf.retrieval.search.candidates.merge_candidates`);
3. re-score the merged candidates with the matcher (encoder-token cache, LCE view pairs,
   :mod:`copynce_hf.retrieval.verify.scorer`) and keep the top ``k`` per query; without a matcher the top ``k`` merged
   candidates are the answer. With ``descriptor_weight``, the matcher's scores take the descriptors' cosines in
   (:mod:`copynce_hf.retrieval.detection.evidence`, beyond the paper) before the top ``k`` are kept.

:data:`~copynce_hf.retrieval.presets.DETECT_PRESETS` names three whole settings: ``paper`` (the authors' inference), ``fast``
(the CPU-sized defaults of :class:`DetectConfig`) and ``accurate`` (local crops on a CPU budget).

Used by ``copynce detect``, the demo and the benchmarks (through :mod:`copynce_hf.evaluation`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ...modeling.errors import ConfigError, PredictionsError
from ..content.stage import StoredByRole
from ..content.store import source_token_store, token_folder
from ..descriptors.cached import Descriptor
from ..descriptors.views import ViewPreset
from ..predictions import Prediction, prediction_metrics
from ..search.candidates import candidate_recall, merge_candidates, top_per_query
from ..sources import SourceImages
from ..verify.pairs import score_pairs
from .candidates import CandidateSearch, DescriptorCandidates, descriptor_candidates
from .config import MATCHER_VIEW_NAMES, DetectConfig
from .evidence import with_descriptor_evidence

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DetectResult:
    """What :func:`detect` found.

    Attributes:
        predictions: final top-``k`` per query (matcher scores, or merged descriptor scores).
        candidates: the merged candidate lists (top ``candidates`` per query).
        per_model: each descriptor's own candidate list.
        seconds: wall time per stage (``index:<name>``, ``auxiliary:<name>``, ``query views:<name>``,
            ``search:<name>`` (k-NN, LCE aggregation, score normalisation), ``matcher``); reused query views
            count the time they took when computed.
        matcher_cost: encoder passes and fusion passes the matcher ran (``None`` without matcher).
        skipped: query ids whose image could not be read, and unscored candidate pairs.
        reused: stages read from ``index_folder``, not recomputed.
        skipped_queries, skipped_references: id -> plain-words reason (``ImageLoadError.reason``) of each
            image left out; ``"unreadable"`` when the skip was read from a reused cache written before reasons
            were saved with it.
        candidates_per_query: the candidates each query could get: ``candidates``, or fewer when fewer
            references could be read.
        crop_boxes: query id -> the box of its crop (``query_crops``; fractions of its width and height): the crop
            whose pair scored best among its pairs scored on a crop, else its content crop.
        crop_pairs: the ``(query, reference)`` pairs whose score is the matcher's on a crop of the query, each with
            the box of that crop.
        layout_cropped: the queries whose box in ``crop_boxes`` is a layout crop (read from the query alone).
    """

    predictions: list[Prediction]
    candidates: list[Prediction]
    per_model: dict[str, list[Prediction]]
    seconds: dict[str, float]
    matcher_cost: dict[str, int] | None = None
    skipped: list[str] = dataclasses.field(default_factory=list)
    reused: list[str] = dataclasses.field(default_factory=list)
    skipped_queries: dict[str, str] = dataclasses.field(default_factory=dict)
    skipped_references: dict[str, str] = dataclasses.field(default_factory=dict)
    candidates_per_query: int = 0
    crop_boxes: dict[str, tuple[float, float, float, float]] = dataclasses.field(default_factory=dict)
    crop_pairs: dict[tuple[str, str], tuple[float, float, float, float]] = dataclasses.field(default_factory=dict)
    layout_cropped: list[str] = dataclasses.field(default_factory=list)

    def candidate_recall(self, ground_truth: dict[str, list[str]]) -> float | None:
        return candidate_recall(self.candidates, ground_truth)

    def metrics(self, ground_truth: dict[str, list[str]]) -> dict:
        """The copy-detection metrics of :attr:`predictions` against ``ground_truth`` (query id -> reference
        ids; muAP, RP90, recall@k, ...), with ``candidate_recall`` and ``num_candidates_per_query``."""
        metrics = prediction_metrics(self.predictions, ground_truth)
        metrics["candidate_recall"] = self.candidate_recall(ground_truth)
        metrics["num_candidates_per_query"] = self.candidates_per_query
        return metrics


def detect(
    queries,
    references,
    descriptors: Sequence[Descriptor],
    matcher: tuple | None = None,
    auxiliary=None,
    config: DetectConfig | None = None,
    index_folder: str | os.PathLike | None = None,
    progress: bool = True,
    log: Callable[[str], None] = logger.info,
    rescoring_folder: str | os.PathLike | None = None,
    accelerator=None,
    whiten_from=None,
    tokens_folder: str | os.PathLike | None = None,
) -> DetectResult:
    """Find the references that every query copies.

    Args:
        queries, references: image sources (``ids`` + ``load(i)``, e.g. :class:`ImageFolderSource`).
        descriptors: one or more :class:`Descriptor`; their candidate lists are merged.
        matcher: ``(model, image_processor)`` of a CopyNCE matcher, or ``None`` for descriptors only.
        auxiliary: an image source without copies of the queries, for score normalisation; ``None``: off.
        config: :class:`DetectConfig`.
        index_folder: where the reference (and auxiliary) indexes and the query view descriptors are saved and
            reused, ``<index_folder>/<descriptor name>/references``, ``.../auxiliary``, ``.../queries`` (``None``: not).
        progress: progress bars per stage.
        log: receives one line per stage.
        rescoring_folder: where the matcher's scored chunks are kept, so that a run cut short resumes (those of the
            query crops in its ``query-crops`` folder); ``None``: not kept.
        accelerator: an ``accelerate.Accelerator`` (``None``: one is made). Under ``accelerate launch`` every
            process calls :func:`detect`: the images are embedded and the candidate pairs scored in shards,
            the caches written by the main process, and every process gets the whole result.
        whiten_from: an image source (sample images of the collection, without the queries' copies) from which
            each descriptor learns a whitening (``config.whiten_dim`` directions) applied to references, queries and
            auxiliary images; ``None``: no whitening.
        tokens_folder: where the matcher's encoder tokens of the candidates' images are kept (whole images: each
            encoded once for the run, resumed) in ``queries/`` and ``references/``; ``None``: a temporary folder.
    """
    config = config or DetectConfig()
    _check_inputs(descriptors, auxiliary, config)
    from ...precision import make_accelerator

    accelerator = accelerator or make_accelerator(config.encoder_precision)
    search = CandidateSearch(queries, references, auxiliary, whiten_from, config, ViewPreset(config.descriptor_lce),
                             {"batch_size": config.batch_size, "num_workers": config.num_workers,
                              "accelerator": accelerator}, progress, log)
    result = DetectResult([], [], {}, {})
    found = [descriptor_candidates(search, descriptor, Path(index_folder) / descriptor.name if index_folder else None)
             for descriptor in descriptors]
    for descriptor, candidates in zip(descriptors, found):
        _add_descriptor(result, descriptor.name, candidates)
    result.candidates = merge_candidates(result.per_model.values(), config.candidates)
    result.candidates_per_query = min(config.candidates, len(references) - len(result.skipped_references))
    if len(descriptors) > 1:
        log(f"merged: {len(result.candidates)} candidate pairs (top {result.candidates_per_query} per query)")
    verified = result.candidates if matcher is None else _matcher_stage(
        result, matcher, search, descriptors[0], found, rescoring_folder, tokens_folder)
    result.predictions = top_per_query(verified, config.k)
    return result


def _with_evidence(verified: list[Prediction], found: Sequence[DescriptorCandidates], weight: float,
                   log: Callable[[str], None]) -> list[Prediction]:
    """The matcher's ``verified`` pairs with the descriptors' evidence weighed in (``descriptor_weight``)."""
    log(f"scores: the matcher's logit + {weight:g} x (the descriptor cosine of the whole images less the reference's "
        "background)")
    return with_descriptor_evidence(verified, [f.whole for f in found], weight, [f.backgrounds for f in found])


def _matcher_stage(result: DetectResult, matcher: tuple, search: CandidateSearch, descriptor: Descriptor,
                   found: Sequence[DescriptorCandidates], rescoring_folder, tokens_folder) -> list[Prediction]:
    """Stage 3: the merged candidates re-scored by the matcher, every image of theirs encoded once into the token
    stores in ``tokens_folder`` (a temporary folder when ``None``), then the query crops (with the first descriptor,
    ``descriptor``, and its whole-image descriptors in ``found``, each descriptor's candidates), then the descriptors'
    evidence where ``descriptor_weight`` asks for it."""
    whole = found[0].whole if search.config.crops_queries else None
    with token_folder(tokens_folder, search.extract["accelerator"]) as kept_tokens:
        start = time.perf_counter()
        stores = _token_stores(result.candidates, matcher, search, kept_tokens)
        result.seconds["matcher tokens"] = time.perf_counter() - start
        rescored = _verified(result, matcher, search, rescoring_folder, stores)
        if whole is not None:
            rescored = _with_query_crops(result, rescored, descriptor, matcher, search, whole, rescoring_folder,
                                         stores)
    if search.config.descriptor_weight:
        rescored = _with_evidence(rescored, found, search.config.descriptor_weight, search.log)
    return rescored


def _token_stores(candidates: list[Prediction], matcher: tuple, search: CandidateSearch, folder: Path
                  ) -> StoredByRole | None:
    """The matcher's encoder tokens of the queries and the references of the candidate pairs, each encoded once into
    ``folder/queries`` and ``folder/references`` (:func:`~copynce_hf.retrieval.content.store.source_token_store`),
    which the matcher stage, the query crops' content tokens and their pairs read; ``None`` with LCE views, which the
    scorer's cache encodes."""
    if search.config.matcher_lce != "none":
        return None
    stores = []
    for role, source, wanted in (("queries", search.queries, {p.query_id for p in candidates}),
                                 ("references", search.references, {p.reference_id for p in candidates})):
        stores.append(source_token_store(
            matcher, SourceImages(source), [image_id for image_id in source.ids if image_id in wanted], folder / role,
            batch_size=search.config.batch_size, num_workers=search.config.num_workers,
            accelerator=search.extract["accelerator"], progress=search.progress,
            log=lambda line, role=role: search.log(f"matcher ({role}): {line}")))
    return StoredByRole(*stores)


def _check_inputs(descriptors: Sequence[Descriptor], auxiliary, config: DetectConfig) -> None:
    """Refuse what :func:`detect` cannot run: no descriptor, two descriptors of one name, reference backgrounds from
    auxiliary images without them."""
    names = [d.name for d in descriptors]
    if not descriptors:
        raise ConfigError("detect needs at least one descriptor model")
    if len(set(names)) != len(names):
        raise ConfigError(f"descriptor names must differ, got {names}")
    if config.normalises_references and config.reference_background == "auxiliary" and auxiliary is None:
        raise ConfigError("reference backgrounds from the auxiliary images need auxiliary images (--aux)")


def _add_descriptor(result: DetectResult, name: str, found: DescriptorCandidates) -> None:
    """One descriptor's candidates, times, reused caches and skipped images into ``result``."""
    result.per_model[name] = found.found
    result.seconds.update(found.seconds)
    result.reused.extend(found.reused)
    result.skipped.extend(q for q in found.skipped_queries if q not in result.skipped)
    for skipped, new in ((result.skipped_queries, found.skipped_queries),
                         (result.skipped_references, found.skipped_references)):
        for image_id, reason in new.items():
            skipped.setdefault(image_id, reason)


def _verified(result: DetectResult, matcher: tuple, search: CandidateSearch, rescoring_folder,
              stores: StoredByRole | None) -> list[Prediction]:
    """The merged candidates re-scored by the matcher (stage 3, the images' tokens read from ``stores`` where given),
    unscored pairs listed in ``result.skipped``; the matcher's time and passes go to ``result``."""
    start, accelerator = time.perf_counter(), search.extract["accelerator"]
    pairs = [(p.query_id, p.reference_id) for p in result.candidates]
    scored = score_pairs(pairs, *matcher, SourceImages(search.queries), SourceImages(search.references),
                         search.config.pair_scoring(getattr(search.queries, "max_pixels", None), None,
                                                    *(stores.stores.values() if stores else ())), accelerator,
                         rescoring_folder, search.progress, f"matcher ({MATCHER_VIEW_NAMES[search.config.matcher_lce]})",
                         lambda line: search.log(f"matcher: {line}"))
    encoded = sum(store.encoded for store in stores.stores.values()) if stores else 0
    result.matcher_cost = {**scored.cost, "encoded_views": scored.cost["encoded_views"] + encoded}
    rescored = [Prediction(q, r, s) for (q, r), s in zip(pairs, scored.scores) if s is not None]
    result.skipped.extend(f"{q}/{r}" for (q, r), s in zip(pairs, scored.scores) if s is None)
    result.seconds["matcher"] = time.perf_counter() - start
    on = f" on {accelerator.num_processes} processes" if accelerator.num_processes > 1 else ""
    search.log(f"matcher: {len(rescored)} pairs re-scored{on} ({scored.cost['encoded_views']} encoder passes, "
               f"{scored.cost['fused_pairs']} fusion passes)")
    if not rescored:
        raise PredictionsError(f"the matcher could not score any of the {len(pairs)} candidate pairs")
    return rescored


def _with_query_crops(result: DetectResult, rescored: list[Prediction], descriptor: Descriptor, matcher: tuple,
                      search: CandidateSearch, whole: tuple, rescoring_folder, stores: StoredByRole | None
                      ) -> list[Prediction]:
    """``rescored`` with the pairs the queries' content crops decide
    (:func:`~copynce_hf.retrieval.content.queries.query_crops`) scored on the crops; their boxes, time and passes go
    to ``result``. The crops' scored chunks are kept in ``rescoring_folder/query-crops`` (``None``: not kept), so
    that a run cut short resumes them; the images ``stores`` hold are read from them, not encoded again."""
    from ..content.queries import query_crops, settled, with_crop_scores

    start, accelerator = time.perf_counter(), search.extract["accelerator"]
    crop_config = dataclasses.replace(search.config, content_tokens=False, query_crops=False)  # a crop: own content
    folder = Path(rescoring_folder) / "query-crops" if rescoring_folder is not None else None
    references = SourceImages(search.references)

    def score_crop_pairs(pairs, crops):
        scoring = crop_config.pair_scoring(crops.max_pixels, None, None, stores.stores["reference"] if stores else None)
        scored = score_pairs(pairs, *matcher, SourceImages(crops), references, scoring,
                             accelerator, folder, False, "matcher", lambda line: search.log(f"matcher: {line}"))
        return scored.scores, scored.cost

    found = settled(rescored, query_crops(SourceImages(search.queries), references, descriptor, matcher, *whole,
                                          search.config, accelerator, search.log, score_crop_pairs, search.progress,
                                          stores))
    result.crop_boxes, result.crop_pairs, result.layout_cropped = found.boxes, found.pair_boxes, found.layout
    result.matcher_cost = {name: result.matcher_cost[name] + found.cost[name] for name in found.cost}
    result.seconds["query crops"] = time.perf_counter() - start
    return with_crop_scores(rescored, found)
