"""The paper's detection pipeline as one function: descriptors (+ LCE, + score normalisation), merged
candidates, matcher verification (+ LCE).

Stages (supplementary "More about Candidates List for Matcher"):

1. for every descriptor model: build (or reuse) the index over the reference views, embed the
   query views, take each query's top ``candidates`` references by best view-pair cosine (with the
   ``authors`` views: each query view's own top-k per view group, then the best ``candidates``),
   and score-normalise with an auxiliary set when one is given (:mod:`.view_search`);
2. merge the models' lists per query: union, best score, top ``candidates`` (:mod:`.candidates`);
3. re-score the merged candidates with the matcher (encoder-token cache, LCE view pairs,
   :mod:`copynce_hf.retrieval.verify.scorer`) and keep the top ``k`` per query; without a matcher the top ``k`` merged
   candidates are the answer.

:data:`~.presets.DETECT_PRESETS` names three whole settings: ``paper`` (the authors' inference), ``fast``
(the CPU-sized defaults of :class:`DetectConfig`) and ``accurate`` (local crops on a CPU budget).

Used by ``copynce detect``, the demo and the benchmarks (through :mod:`copynce_hf.evaluation`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..modeling.errors import ConfigError, PredictionsError
from ..outputs import StagedFile
from .content.stage import content_identity, detect_content_search, log_local_masks, matcher_content
from .content.tokens import (
    DESCRIPTOR_TAU,
    MATCHER_TAU,
    MIN_IMAGES,
    NEIGHBOURS,
    check_content_settings,
)
from .descriptors.chunked_extraction import extract_in_chunks, work_folder_of
from .descriptors.sets import DescriptorSet
from .descriptors.view_extraction import extract_view_descriptors
from .descriptors.views import DESCRIPTOR_LCE_MODES, MATCHER_LCE_MODES, ViewPreset, check_mode
from .descriptors.whitening import Whitening
from .predictions import Prediction, prediction_metrics
from .presets import (
    COLLECTION_K_END,
    COLLECTION_K_START,
    DEFAULT_CANDIDATES,
    DEFAULT_INDEX_CHUNK_SIZE,
    DETECT_PRESETS,
    REFERENCE_BACKGROUNDS,
)
from .search.background import check_ranks, normalised_reference_scores, reference_background
from .search.candidates import candidate_recall, merge_candidates, top_per_query
from .search.index import DescriptorIndex, IndexConfig
from .search.references import search_references
from .verify.chunked_scoring import DEFAULT_CHUNK_SIZE, PairScores, score_in_chunks, scoring_identity
from .verify.scorer import MatcherScorer
from .work_folder import holds_identity, views_identity

logger = logging.getLogger(__name__)

#: The file of a cache folder (an index, query views, a whitening sample) holding what its files were computed from.
_IDENTITY_FILE = "identity.json"

#: How the log lines name the views of each ``descriptor_lce`` / ``matcher_lce`` mode.
_DESCRIPTOR_VIEWS = {"none": "whole images", "matcher-views": "LCE: 26 query x 10 reference views",
                     "authors": "LCE: 45 query x 9 reference views"}
MATCHER_VIEW_NAMES = {"none": "whole images", "paper": "LCE: 35 view pairs", "all": "LCE: 260 view pairs"}


@dataclasses.dataclass
class DetectConfig:
    """Settings of :func:`detect`.

    Attributes:
        k: predictions kept per query at the end.
        candidates: merged candidates per query re-scored by the matcher (each descriptor also
            retrieves this many).
        descriptor_lce: ``none``, ``matcher-views`` (26 query x 10 reference views at search time, best
            view pair) or ``authors`` (45 query views in four groups x 9 reference views, top-k per
            query view and group: :mod:`.view_search`).
        matcher_lce: ``none`` (1 view pair), ``paper`` (35) or ``all`` (260).
        alpha, k_start, k_end: score normalisation (used when an auxiliary set is given): ``alpha`` times
            the mean score of the auxiliary neighbours of 0-based ranks ``k_start..k_end`` (inclusive).
        batch_size: images per descriptor pass, views per encoder pass and view pairs per fusion pass.
        num_workers: ``DataLoader`` workers reading images.
        cache_size: reference views whose matcher tokens are kept.
        chunk_size: candidate pairs per chunk of matcher work (whole queries; the unit shared between
            processes and kept on disk, :mod:`.chunked_scoring`).
        whiten_dim: directions kept by the whitening learned from ``whiten_from`` images (``None``: all).
        collection_normalisation: ``True`` / ``False``, or ``None`` (the default): off in :func:`detect`, on in
            :func:`dedup <.dedup.dedup>` (:attr:`normalises_references`, :attr:`normalises_collection`).
            Reference-side normalisation: ``collection_alpha`` times each
            reference's background, its mean score to its neighbours of 0-based ranks ``collection_k_start..
            collection_k_end`` (:mod:`~copynce_hf.retrieval.search.background`), is subtracted from every query->reference descriptor
            score before the candidates are chosen (out of each query's ``2 * candidates`` nearest), so that a
            reference resembling many others (a template: a screenshot frame, a meme band) stops outranking a
            copy. It composes with the auxiliary set's query-side score normalisation (``alpha``, ``k_start``,
            ``k_end``): ``s(q, r) = cos(q, r) - alpha * bias(q) - collection_alpha * bg(r)``. With a matcher it
            changes which candidates are verified, not their scores, and that is why it is off: it pushes the
            references that share a template out of a query's best candidates, the very neighbours in which
            content tokens recognise the template (on template collections of held-out draws it lowered muAP with
            framed references from 0.546 to 0.487). (:func:`dedup <.dedup.dedup>` uses the same fields for its
            descriptor stage, with the symmetric correction of a pair of the one collection, on by default there.)
        reference_background: where a reference's neighbours are taken: ``collection`` (the other references: one
            self-search of the reference index, cached beside it) or ``auxiliary`` (the auxiliary images, which
            must be given).
        content_tokens: the matcher fuses content tokens only, dropping the encoder tokens an image shares with
            ``content_min_images`` of its ``content_neighbours`` neighbour images (the pair's other image not
            counting) at a cosine above ``content_tau`` (template, "bursty" regions; :mod:`copynce_hf.retrieval.content.stage`, beyond
            the paper); whole images only (``matcher_lce`` ``none``).
        query_crops: with content tokens and a matcher, each query's own content (the tokens it does not share with
            its nearest references and queries) is cut from its pixels where it is a small part of the query, and
            searched and verified as a second view of the query (:func:`~copynce_hf.retrieval.content.crops.query_crops`, beyond the
            paper), with the first descriptor; it applies where content tokens do, to whole images
            (:attr:`crops_queries`).
        descriptor_content_tokens: the descriptor search runs again on content descriptors (final-layer patch
            tokens shared at a cosine above ``descriptor_content_tau`` dropped from the input; whole images only,
            ``descriptor_lce`` ``none``); costs two more descriptor passes per image.
    """

    k: int = 10
    candidates: int = DEFAULT_CANDIDATES
    descriptor_lce: str = "none"
    matcher_lce: str = "none"
    alpha: float = 1.0
    k_start: int = 0
    k_end: int = 9
    batch_size: int = 64
    num_workers: int = 0
    cache_size: int = 4096
    chunk_size: int = DEFAULT_CHUNK_SIZE
    whiten_dim: int | None = None
    collection_normalisation: bool | None = None
    collection_alpha: float = 1.0
    collection_k_start: int = COLLECTION_K_START
    collection_k_end: int = COLLECTION_K_END
    reference_background: str = "collection"
    content_tokens: bool = True
    content_tau: float = MATCHER_TAU
    content_min_images: int = MIN_IMAGES
    content_neighbours: int = NEIGHBOURS
    query_crops: bool = True
    descriptor_content_tokens: bool = False
    descriptor_content_tau: float = DESCRIPTOR_TAU

    def __post_init__(self) -> None:
        check_mode(self.descriptor_lce, DESCRIPTOR_LCE_MODES, "descriptor_lce")
        check_mode(self.matcher_lce, MATCHER_LCE_MODES, "matcher_lce")
        check_content_settings(self.content_tau, self.content_min_images, self.content_neighbours)
        check_content_settings(self.descriptor_content_tau, self.content_min_images, self.content_neighbours,
                               "descriptor_content_tau")
        if self.content_tokens and self.matcher_lce != "none":
            raise ConfigError(f"content tokens apply to whole images only: matcher_lce {self.matcher_lce!r} needs "
                              "content_tokens=False (--no-content-tokens)")
        if self.descriptor_content_tokens and self.descriptor_lce != "none":
            raise ConfigError(f"descriptor content tokens apply to whole images only: descriptor_lce "
                              f"{self.descriptor_lce!r} needs descriptor_content_tokens=False")
        for name in ("k", "candidates", "batch_size", "chunk_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.whiten_dim is not None and self.whiten_dim < 1:
            raise ConfigError(f"whiten_dim must be at least 1, got {self.whiten_dim}")
        if not 0 <= self.k_start <= self.k_end:
            raise ConfigError(f"score normalisation needs 0 <= k_start <= k_end, got k_start={self.k_start}, "
                              f"k_end={self.k_end}")
        check_ranks(self.collection_k_start, self.collection_k_end)
        check_mode(self.reference_background, REFERENCE_BACKGROUNDS, "reference_background")
        if self.reference_background != "collection" and not self.normalises_references:
            raise ConfigError(f"reference_background {self.reference_background!r} sets where collection "
                              "normalisation measures the references' backgrounds, and it is off: give "
                              "collection_normalisation=True (--collection-normalisation on)")

    @property
    def crops_queries(self) -> bool:
        """Whether query crops apply: asked for, with content tokens, on whole images (``descriptor_lce`` ``none``)."""
        return self.query_crops and self.content_tokens and self.descriptor_lce == "none"

    @property
    def normalises_references(self) -> bool:
        """Whether :func:`detect` normalises its references over their collection (``collection_normalisation``;
        ``None``: no)."""
        return bool(self.collection_normalisation)

    @property
    def normalises_collection(self) -> bool:
        """Whether :func:`dedup <.dedup.dedup>` normalises its descriptor stage over the collection
        (``collection_normalisation``; ``None``: yes)."""
        return self.collection_normalisation is not False

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> DetectConfig:
        """The settings of ``preset`` (:data:`~.presets.DETECT_PRESETS`), with ``overrides`` (fields given explicitly)."""
        if preset not in DETECT_PRESETS:
            raise ConfigError(f"unknown detect preset {preset!r}; choose one of {', '.join(DETECT_PRESETS)}")
        return cls(**{**DETECT_PRESETS[preset], **overrides})




@dataclasses.dataclass
class Descriptor:
    """A descriptor model taking part in the search: ``name`` (for logs and index folders), model, processor,
    and where it came from (``source``: how reports name it, recorded with a saved index; caches are tied to the
    model's weights, not to this name)."""

    name: str
    model: object
    processor: object
    source: str = ""


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
        crop_boxes: query id -> the box of its content crop (``query_crops``; fractions of its width and height).
        crop_pairs: the ``(query, reference)`` pairs whose score is the matcher's on the query's crop.
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
    crop_pairs: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def candidate_recall(self, ground_truth: dict[str, list[str]]) -> float | None:
        return candidate_recall(self.candidates, ground_truth)

    def metrics(self, ground_truth: dict[str, list[str]]) -> dict:
        """The copy-detection metrics of :attr:`predictions` against ``ground_truth`` (query id -> reference
        ids; muAP, RP90, recall@k, ...), with ``candidate_recall`` and ``num_candidates_per_query``."""
        metrics = prediction_metrics(self.predictions, ground_truth)
        metrics["candidate_recall"] = self.candidate_recall(ground_truth)
        metrics["num_candidates_per_query"] = self.candidates_per_query
        return metrics


def note_skips(descriptors: DescriptorSet, reasons: dict[str, str]) -> None:
    """Add the images ``descriptors`` left out to ``reasons`` (id -> reason), keeping reasons already known."""
    for image_id in descriptors.skipped:
        reasons.setdefault(image_id, descriptors.skip_reasons.get(image_id, "unreadable"))


class SourceImages:
    """id -> image mapping over an image source (file paths when the source has them, else loaded images), with the
    source's image size limit (``max_pixels``)."""

    def __init__(self, source):
        self.source = source
        self.max_pixels = getattr(source, "max_pixels", None)
        self.position = {image_id: i for i, image_id in enumerate(source.ids)}
        self.files = source.lookup() if hasattr(source, "lookup") else None

    def __contains__(self, image_id) -> bool:
        return image_id in self.position

    def __getitem__(self, image_id):
        if self.files is not None:
            return self.files[image_id]
        return self.source.load(self.position[image_id])


def _reuse(folder: str | os.PathLike | None, identity: dict, load: Callable[[], object], what: str):
    """What ``load`` reads from ``folder`` when the folder was written for ``identity``; ``None`` when it was
    not (a warning names the inputs that changed, :func:`~.work_folder.holds_identity`), or when its files are
    damaged (then logged): the caller computes and rewrites them."""
    if folder is None:
        return None
    folder = Path(folder)
    saved = f"the files of {what} in {folder}" if folder.is_dir() and any(folder.iterdir()) else None
    if not holds_identity(folder / _IDENTITY_FILE, identity, saved, then="computing them again"):
        return None
    try:
        loaded = load()
    except PredictionsError as error:
        logger.warning("%s in %s cannot be read (%s); computing it again", what, folder, error)
        return None
    logger.info("reusing %s in %s", what, folder)
    return loaded


def _is_main_process() -> bool:
    """Whether this is the process that writes (the only one, unless launched with ``accelerate launch``)."""
    from accelerate import PartialState

    return PartialState().is_main_process


@contextlib.contextmanager
def _rewriting(folder: str | os.PathLike, identity: dict):
    """Around the writing of a cache folder's files: its ``identity.json`` is removed first and written
    (atomically) only once every file is, so that a run killed in between leaves a folder no run reuses."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _IDENTITY_FILE).unlink(missing_ok=True)
    yield
    with StagedFile(folder / _IDENTITY_FILE) as temporary:
        temporary.write_text(json.dumps(identity) + "\n", encoding="utf-8")


def query_view_descriptors(descriptor: Descriptor, source, preset: ViewPreset, folder: str | os.PathLike | None = None,
                           progress: bool = True, description: str = "query views",
                           **extract) -> tuple[DescriptorSet, float, bool]:
    """Descriptors of every view of the query images; kept in ``folder`` and reused from it for the same
    images (ids, file sizes and times), model and views (:func:`~copynce_hf.retrieval.work_folder.views_identity`).

    Returns:
        ``(descriptors, seconds, reused)``: ``seconds`` is the extraction time, measured now or, when the
        descriptors are reused, as measured when they were computed (so that costs stay comparable).
    """
    identity = views_identity(descriptor.model, descriptor.processor, source, preset.name, "query")
    reused = _reuse(folder, identity, lambda: DescriptorSet.load(Path(folder) / "descriptors.safetensors"),
                    "query descriptors")
    if reused is not None:
        try:
            seconds = float(json.loads((Path(folder) / "timing.json").read_text(encoding="utf-8"))["seconds"])
        except (OSError, ValueError, KeyError):
            seconds = float("nan")
        return reused, seconds, True
    start = time.perf_counter()
    views = extract_view_descriptors(descriptor.model, descriptor.processor, source, preset, "query",
                                     progress=progress, description=description, **extract)
    seconds = time.perf_counter() - start
    if folder is not None and len(views) and _is_main_process():
        with _rewriting(folder, identity):
            views.save(Path(folder) / "descriptors.safetensors")
            (Path(folder) / "timing.json").write_text(json.dumps({"seconds": seconds}) + "\n", encoding="utf-8")
    return views, seconds, False


def learn_whitening(descriptor: Descriptor, source, preset: ViewPreset, dim: int | None = None,
                    folder: str | os.PathLike | None = None, progress: bool = True,
                    description: str = "whitening sample", **extract) -> Whitening:
    """The :class:`~.whitening.Whitening` (``dim`` directions) learned from the descriptors of ``source``'s images
    (their reference views, as indexed); the sample's descriptors are written to ``folder`` and reused from it
    for the same images, model and views (whatever ``dim``)."""
    identity = views_identity(descriptor.model, descriptor.processor, source, preset.name, "whitening sample")
    sample = _reuse(folder, identity, lambda: DescriptorSet.load(Path(folder) / "descriptors.safetensors"),
                    "the whitening sample's descriptors")
    if sample is None:
        sample = extract_view_descriptors(descriptor.model, descriptor.processor, source, preset, "reference",
                                          progress=progress, description=description, **extract)
        if folder is not None and len(sample):
            with _rewriting(folder, identity):
                sample.save(Path(folder) / "descriptors.safetensors")
    return Whitening.fit(sample.descriptors, dim)


def view_index(descriptor: Descriptor, source, preset: ViewPreset, folder: str | os.PathLike | None = None,
               config: IndexConfig | None = None, progress: bool = True, description: str = "reference views",
               whitening: Whitening | None = None, chunk_size: int = DEFAULT_INDEX_CHUNK_SIZE,
               log: Callable[[str], None] = logger.info, **extract) -> DescriptorIndex:
    """An exact index over the views of ``source``'s images (whitened with ``whitening`` when given); written to
    ``folder`` and reused from it when it was built from the same images, model, views and whitening
    (``identity.json`` beside the index files: :func:`~copynce_hf.retrieval.work_folder.views_identity`, the identity
    ``copynce index`` keeps with its chunks, and the whitening's fingerprint).

    With a ``folder`` the views are embedded ``chunk_size`` images at a time into the work folder
    ``.<folder name>.chunks`` beside it (:mod:`copynce_hf.retrieval.descriptors.chunked_extraction`, as ``copynce index`` does): a run killed
    meanwhile resumes from its last complete chunk (``log`` says so), and under ``accelerate launch`` the processes
    share each chunk and the main process writes. The work folder is removed once the index is in place."""
    identity = views_identity(descriptor.model, descriptor.processor, source, preset.name, "reference")
    if whitening is not None:
        identity["whitening"] = whitening.fingerprint()
    reused = _reuse(folder, identity, lambda: DescriptorIndex.load(folder), "the index")
    if reused is not None:
        return reused
    info = {"model": descriptor.source or descriptor.name, "views": preset.name}
    config = config or IndexConfig(kind="flat")
    if folder is not None:
        return _chunked_view_index(descriptor, source, preset, Path(folder), identity, (config, info, whitening),
                                   chunk_size, progress, description, log, extract)
    views = extract_view_descriptors(descriptor.model, descriptor.processor, source, preset, "reference",
                                     progress=progress, description=description, **extract)
    if len(views) == 0:
        raise PredictionsError(f"none of the {len(source)} images could be read ({description})")
    return DescriptorIndex.build(views, config, info=info, whitening=whitening)


def _chunked_view_index(descriptor: Descriptor, source, preset: ViewPreset, folder: Path, identity: dict,
                        index: tuple, chunk_size: int, progress: bool, description: str, log: Callable[[str], None],
                        extract: dict) -> DescriptorIndex:
    """:func:`view_index` into ``folder``: the views embedded in resumable chunks, the index built and saved by the
    main process from them, then read back by the others. ``index`` is ``(IndexConfig, info, whitening)``."""
    from accelerate.utils import broadcast_object_list

    work = {**identity, "chunk_size": chunk_size, "batch_size": extract.get("batch_size", 64)}
    chunks = extract_in_chunks(descriptor.model, descriptor.processor, source, work_folder_of(folder), work, preset,
                               chunk_size, progress=progress, description=description, **extract)
    failure = None
    if chunks is not None:  # the main process
        if chunks.resumed:
            log(f"{description}: resumed after {chunks.resumed} complete chunk(s) in {chunks.folder}")
        views = _joined([DescriptorSet.load(part) for part in chunks.parts])
        if len(views) == 0:
            failure = f"none of the {len(source)} images could be read ({description})"
        else:
            config, info, whitening = index
            with _rewriting(folder, identity):
                DescriptorIndex.build(views, config, info=info, whitening=whitening).save(folder)
        chunks.remove()
    failure = broadcast_object_list([failure])[0]  # the others wait here until the index is written
    if failure is not None:
        raise PredictionsError(failure)
    return DescriptorIndex.load(folder)


def _joined(parts: list[DescriptorSet]) -> DescriptorSet:
    """The rows of several descriptor sets (each (N_i, D)), in order, as one (sum N_i, D), with their skipped ids."""
    kept = [part.descriptors for part in parts if len(part)]
    return DescriptorSet([image_id for part in parts for image_id in part.ids],
                         np.concatenate(kept) if kept else np.zeros((0, 0), np.float32),
                         skipped=[image_id for part in parts for image_id in part.skipped],
                         skip_reasons={key: value for part in parts for key, value in part.skip_reasons.items()})


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
) -> DetectResult:
    """Find the references that every query copies.

    Args:
        queries, references: image sources (``ids`` + ``load(i)``, e.g. :class:`ImageFolderSource`).
        descriptors: one or more :class:`Descriptor`; their candidate lists are merged.
        matcher: ``(model, image_processor)`` of a CopyNCE matcher, or ``None`` for descriptors only.
        auxiliary: an image source without copies of the queries, for score normalisation; ``None``: off.
        config: :class:`DetectConfig`.
        index_folder: where the reference (and auxiliary) indexes and the query view descriptors are saved
            and reused, ``<index_folder>/<descriptor name>/references``, ``.../auxiliary`` and ``.../queries``;
            ``None``: not saved.
        progress: progress bars per stage.
        log: receives one line per stage.
        rescoring_folder: where the matcher's scored chunks are kept, so that a run cut short resumes
            (:mod:`.chunked_scoring`; those of the query crops in its ``query-crops`` folder); ``None``: not kept.
        accelerator: an ``accelerate.Accelerator`` (``None``: one is made). Under ``accelerate launch`` every
            process calls :func:`detect`: the images are embedded and the candidate pairs scored in shards,
            the caches written by the main process, and every process gets the whole result.
        whiten_from: an image source (sample images of the collection, without the queries' copies) from
            which each descriptor learns a whitening (:mod:`.whitening`, ``config.whiten_dim`` directions)
            applied to references, queries and auxiliary images; ``None``: no whitening.
    """
    config = config or DetectConfig()
    names = [d.name for d in descriptors]
    if not descriptors:
        raise ConfigError("detect needs at least one descriptor model")
    if len(set(names)) != len(names):
        raise ConfigError(f"descriptor names must differ, got {names}")
    if config.normalises_references and config.reference_background == "auxiliary" and auxiliary is None:
        raise ConfigError("reference backgrounds from the auxiliary images need auxiliary images (--aux)")
    from ..precision import make_accelerator

    accelerator = accelerator or make_accelerator()
    stage = _DescriptorStage(queries, references, auxiliary, whiten_from, config, ViewPreset(config.descriptor_lce),
                             {"batch_size": config.batch_size, "num_workers": config.num_workers,
                              "accelerator": accelerator}, progress, log)
    result = DetectResult([], [], {}, {})
    for descriptor in descriptors:
        folder = Path(index_folder) / descriptor.name if index_folder is not None else None
        result.per_model[descriptor.name] = stage.candidates(descriptor, folder, result)
    result.candidates = merge_candidates(result.per_model.values(), config.candidates)
    result.candidates_per_query = min(config.candidates, len(references) - len(result.skipped_references))
    if len(descriptors) > 1:
        log(f"merged: {len(result.candidates)} candidate pairs (top {result.candidates_per_query} per query)")
    if matcher is None:
        result.predictions = top_per_query(result.candidates, config.k)
        return result
    start = time.perf_counter()
    pairs = [(p.query_id, p.reference_id) for p in result.candidates]
    scores, result.matcher_cost = matcher_scores(pairs, *matcher, queries, references, config, accelerator,
                                                 rescoring_folder, progress, log)
    rescored = [Prediction(q, r, s) for (q, r), s in zip(pairs, scores) if s is not None]
    result.skipped.extend(f"{q}/{r}" for (q, r), s in zip(pairs, scores) if s is None)
    result.seconds["matcher"] = time.perf_counter() - start
    on = f" on {accelerator.num_processes} processes" if accelerator.num_processes > 1 else ""
    log(f"matcher: {len(rescored)} pairs re-scored{on} ({result.matcher_cost['encoded_views']} encoder passes, "
        f"{result.matcher_cost['fused_pairs']} fusion passes)")
    if not rescored:
        raise PredictionsError(f"the matcher could not score any of the {len(pairs)} candidate pairs")
    if config.crops_queries:
        rescored = stage.query_crops(descriptors[0], matcher, result, rescored, rescoring_folder)
    result.predictions = top_per_query(rescored, config.k)
    return result


@dataclasses.dataclass
class _DescriptorStage:
    """Stage 1 of :func:`detect` for one descriptor after another: its inputs and settings, held once."""

    queries: object
    references: object
    auxiliary: object
    whiten_from: object
    config: DetectConfig
    preset: ViewPreset
    extract: dict
    progress: bool
    log: Callable[[str], None]
    whole: tuple[DescriptorSet, DescriptorSet] | None = None  # the first descriptor's (query, reference)
    # descriptors of whole images, before content tokens, kept only for query crops: what they compare

    def whitening(self, descriptor: Descriptor, folder: Path | None) -> Whitening | None:
        """The descriptor's whitening learned from ``whiten_from`` (``None`` without it), cached in ``folder``."""
        if self.whiten_from is None:
            return None
        whitening = learn_whitening(descriptor, self.whiten_from, self.preset, self.config.whiten_dim,
                                    folder / "whitening" if folder else None, progress=self.progress,
                                    description=f"{descriptor.name}: whitening sample", **self.extract)
        self.log(f"{descriptor.name}: whitening learned from {whitening.samples} sample views "
                 f"({whitening.input_dim} -> {whitening.dim} dimensions)")
        return whitening

    def index(self, descriptor: Descriptor, source, folder: Path | None, role: str, whitening) -> DescriptorIndex:
        """The index of ``source``'s views (``role``: ``references`` or ``auxiliary``), cached in ``folder/role``."""
        return view_index(descriptor, source, self.preset, folder / role if folder else None, progress=self.progress,
                          description=f"{descriptor.name}: {role.rstrip('s')} views", whitening=whitening,
                          log=self.log, **self.extract)

    def candidates(self, descriptor: Descriptor, folder: Path | None, result: DetectResult) -> list[Prediction]:
        """The descriptor's ``candidates`` best references of every query (score-normalised with an auxiliary
        set); its times, skipped images and reused caches are added to ``result``."""
        start = time.perf_counter()
        whitening = self.whitening(descriptor, folder)
        index = self.index(descriptor, self.references, folder, "references", whitening)
        result.seconds[f"index:{descriptor.name}"] = time.perf_counter() - start
        note_skips(index.references, result.skipped_references)
        auxiliary_index = None
        if self.auxiliary is not None:
            start = time.perf_counter()
            auxiliary_index = self.index(descriptor, self.auxiliary, folder, "auxiliary", whitening)
            result.seconds[f"auxiliary:{descriptor.name}"] = time.perf_counter() - start
        query_views, extract_seconds, reused_views = query_view_descriptors(
            descriptor, self.queries, self.preset, folder / "queries" if folder else None, progress=self.progress,
            description=f"{descriptor.name}: query views", **self.extract)
        result.seconds[f"query views:{descriptor.name}"] = extract_seconds
        if reused_views:
            result.reused.append(f"query views:{descriptor.name}")
        start = time.perf_counter()
        result.skipped.extend(q for q in query_views.skipped if q not in result.skipped)
        note_skips(query_views, result.skipped_queries)
        if len(query_views) == 0:
            raise PredictionsError(f"none of the {len(self.queries)} query images could be read")
        config = self.config
        if config.crops_queries and self.whole is None:
            self.whole = (query_views, index.references)
        index, auxiliary_index, query_views = detect_content_search(
            descriptor, (SourceImages(self.queries), SourceImages(self.references),
                         SourceImages(self.auxiliary) if self.auxiliary is not None else None),
            index, auxiliary_index, query_views, config, self.extract["accelerator"], self.log)
        pool = 2 * config.candidates if config.normalises_references else config.candidates
        found = search_references(index, query_views, pool, query_views=self.preset,
                                  auxiliary=auxiliary_index, alpha=config.alpha, k_start=config.k_start,
                                  k_end=config.k_end)
        normalised = ", score-normalised" if self.auxiliary is not None else ""
        if config.normalises_references:
            background = self.reference_background(descriptor, index, auxiliary_index, folder)
            found = normalised_reference_scores(found, background, config.collection_alpha, config.candidates)
            among = "other references" if config.reference_background == "collection" else "auxiliary images"
            normalised += (f", less each reference's background: its mean cosine to the {among} of ranks "
                           f"{config.collection_k_start}-{config.collection_k_end}, median "
                           f"{np.median(list(background.values()) or [0.0]):.3f}")
        result.seconds[f"search:{descriptor.name}"] = time.perf_counter() - start
        self.log(f"{descriptor.name}: {len(found)} candidate pairs ({_DESCRIPTOR_VIEWS[config.descriptor_lce]}"
                 f"{normalised})")
        return found

    def query_crops(self, descriptor: Descriptor, matcher: tuple, result: DetectResult,
                    rescored: list[Prediction], rescoring_folder: str | os.PathLike | None) -> list[Prediction]:
        """``rescored`` with the pairs the queries' content crops decide (:func:`~copynce_hf.retrieval.content.crops.query_crops`) scored
        on the crops; their boxes, time and passes go to ``result``. The crops' scored chunks are kept in
        ``rescoring_folder/query-crops`` (``None``: not kept), so that a run cut short resumes them."""
        from .content.crops import query_crops, with_crop_scores

        start, config = time.perf_counter(), self.config
        accelerator = self.extract["accelerator"]
        crop_config = dataclasses.replace(config, content_tokens=False, query_crops=False)  # a crop: own content
        folder = Path(rescoring_folder) / "query-crops" if rescoring_folder is not None else None

        def score_pairs(pairs, crops):
            return matcher_scores(pairs, *matcher, crops, self.references, crop_config, accelerator, folder, False,
                                  self.log)

        found = query_crops(SourceImages(self.queries), SourceImages(self.references), descriptor, matcher,
                            *self.whole, config, accelerator, self.log, score_pairs, self.progress)
        result.crop_boxes, result.crop_pairs = found.boxes, list(found.scores)
        result.matcher_cost = {name: result.matcher_cost[name] + found.cost[name] for name in found.cost}
        result.seconds["query crops"] = time.perf_counter() - start
        return with_crop_scores(rescored, found)

    def reference_background(self, descriptor: Descriptor, index: DescriptorIndex,
                             auxiliary_index: DescriptorIndex | None, folder: Path | None) -> dict[str, float]:
        """Each reference's background (:func:`~copynce_hf.retrieval.search.background.reference_background`): among the other
        references (one self-search of ``index``, kept in ``folder/reference-background`` and reused for the same
        references, model, views, whitening and ranks), or among the auxiliary images."""
        config = self.config
        if config.reference_background == "auxiliary":
            return reference_background(index, config.collection_k_start, config.collection_k_end, auxiliary_index)
        identity = {**views_identity(descriptor.model, descriptor.processor, self.references, self.preset.name,
                                     "reference background"),
                    "whitening": index.whitening.fingerprint() if index.whitening is not None else None,
                    "k_start": config.collection_k_start, "k_end": config.collection_k_end}
        cache = folder / "reference-background" if folder is not None else None
        saved = _reuse(cache, identity, lambda: DescriptorSet.load(cache / "background.safetensors"),
                       "the references' backgrounds")
        if saved is not None:
            return dict(zip(saved.ids, saved.descriptors[:, 0].tolist()))
        # float32, as kept on disk: a run that reuses them scores exactly as the run that computed them
        background = {reference: float(np.float32(value)) for reference, value in
                      reference_background(index, config.collection_k_start, config.collection_k_end).items()}
        if cache is not None and background and _is_main_process():
            with _rewriting(cache, identity):
                DescriptorSet(list(background), np.array(list(background.values()), dtype=np.float32)[:, None]).save(
                    cache / "background.safetensors")
        return background


def matcher_scores(pairs: list[tuple[str, str]], model, processor, queries, references, config: DetectConfig,
                   accelerator, folder, progress: bool, log, matches=None, tokens=None
                   ) -> tuple[list[float | None], dict[str, int]]:
    """The matcher's score of every pair (``None``: unscored), chunk by chunk over the processes, and the passes
    it ran (encoder views, fusion pairs; summed over the processes, resumed chunks cost nothing). With
    ``content_tokens``, ``matches`` (:func:`~copynce_hf.retrieval.content.stage.dedup_keep_masks`) mask the images against their
    neighbours in the collection; without them each query's local set masks it and its candidates. ``tokens``: a
    :class:`~copynce_hf.retrieval.content.store.TokenStore` holding every image of the pairs, read instead of encoding them."""
    model = model.to(accelerator.device)
    content = matcher_content(config)
    scorer = MatcherScorer(model, processor, lce=config.matcher_lce, batch_size=config.batch_size,
                           cache_size=config.cache_size, max_pixels=getattr(queries, "max_pixels", None),
                           content=content, matches=matches if content is not None else None, tokens=tokens)
    query_images, reference_images = SourceImages(queries), SourceImages(references)

    def score_chunk(chunk: list[tuple[str, str]], scored) -> PairScores:
        return PairScores(scorer.score(chunk, query_images, reference_images, num_workers=config.num_workers,
                                       progress=False, on_scored=scored))

    identity = None
    if folder is not None:
        # the sources' own identities too: a dataset's images count by their ids only in the image stamps
        settings = {"matcher_lce": config.matcher_lce, "max_pixels": getattr(queries, "max_pixels", None),
                    "sources": [getattr(queries, "identity", None), getattr(references, "identity", None)],
                    **content_identity(content, matches)}
        identity = scoring_identity(model, processor, settings, query_images.files or {},
                                    reference_images.files or {}, pairs)
    scores = score_in_chunks(pairs, score_chunk, config.chunk_size, folder, identity, accelerator, progress,
                             f"matcher ({MATCHER_VIEW_NAMES[config.matcher_lce]})", lambda line: log(f"matcher: {line}"))
    passes = [(scorer.encoded_views, scorer.fused_pairs, scorer.content_counts)]
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        passes = gather_object(passes)
    if content is not None and matches is None:
        log_local_masks(content, [p[2] for p in passes], log)
    return scores.scores, {"encoded_views": sum(p[0] for p in passes), "fused_pairs": sum(p[1] for p in passes)}
