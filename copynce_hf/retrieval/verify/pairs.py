"""The one scoring path of candidate pairs: every pair's score, chunk by chunk over Accelerate's processes, kept on
disk and resumed, and the passes it took. ``detect``, ``dedup`` and their crops, ``copynce match`` and the
evaluation engine all score through :func:`score_pairs`.

A matcher scores through :class:`~.scorer.MatcherScorer` (paper, "Matcher": the copy probability
``sigmoid(logit)``; one encoder pass per image view, fusion passes batched over view pairs, the LCE view pairs of
supplementary "Local Crops Ensembling" or a grid of :class:`~.local_crops.LocalCrops`, content tokens beyond the
paper). A descriptor scores a pair by the cosine of its two descriptors, the best over the view combinations.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from torch.utils.data import DataLoader

from ...modeling.configuration_copynce import model_kind
from ...modeling.errors import SKIP_REASONS
from ..content.masks import CollectionMatches
from ..content.stage import content_identity, log_local_masks
from ..content.store import TokenStore
from ..content.tokens import ContentSettings
from ..presets import DEFAULT_FUSION_PRECISION
from .chunked_scoring import DEFAULT_CHUNK_SIZE, ChunkScorer, PairScores, score_in_chunks, scoring_identity
from .local_crops import LocalCrops, PairViews, score_views
from .scorer import MatcherScorer, resolve_fusion_precision

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PairScoring:
    """How pairs are scored.

    Attributes:
        lce: the matcher's view pairs without ``local_crops``: ``none`` (whole images), ``paper`` (35) or ``all``
            (260), :func:`~copynce_hf.retrieval.descriptors.views.matcher_view_pairs`.
        local_crops: a grid of views, every query view against every reference view (``None``: ``lce``).
        batch_size: views per encoder pass and view pairs per fusion pass (a descriptor: views per pass).
        cache_size: reference views whose matcher tokens are kept.
        num_workers: ``DataLoader`` workers reading the images.
        max_pixels: the image size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
        chunk_size: pairs per chunk (whole queries): the unit shared by the processes and kept on disk.
        content: fuse content tokens only (:class:`~copynce_hf.retrieval.content.tokens.ContentSettings`, beyond
            the paper; ``None``: every token), with the collection's ``matches`` when given, else each query's
            local set (:class:`~.scorer.MatcherScorer`).
        matches: the collection's matches (:class:`~copynce_hf.retrieval.content.masks.CollectionMatches`).
        query_tokens, reference_tokens: the queries' and the references' encoder tokens, already computed (each a
            :class:`~copynce_hf.retrieval.content.store.TokenStore`): an image a store holds is read from it instead
            of encoded.
        fusion_precision: the matcher's fusion blocks in ``float32`` or under ``bfloat16`` autocast
            (:data:`~copynce_hf.retrieval.presets.FUSION_PRECISIONS`; ``auto``: bfloat16 where the device multiplies
            it natively), resolved on the model's device by :func:`score_pairs`, whatever the accelerator's autocast
            (the encoder's).
    """

    lce: str = "none"
    local_crops: LocalCrops | None = None
    batch_size: int = 64
    cache_size: int = 4096
    num_workers: int = 0
    max_pixels: int | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    content: ContentSettings | None = None
    matches: CollectionMatches | None = None
    query_tokens: TokenStore | None = None
    reference_tokens: TokenStore | None = None
    fusion_precision: str = DEFAULT_FUSION_PRECISION

    def identity(self) -> dict:
        """What the scores depend on besides the model, the image processor and the images."""
        crops = dataclasses.asdict(self.local_crops) if self.local_crops is not None else None
        found = {"matcher_lce": self.lce, "local_crops": crops, "max_pixels": self.max_pixels,
                 **content_identity(self.content, self.matches)}
        if self.fusion_precision != "float32":  # chunks scored before the setting existed were float32
            found["fusion_precision"] = self.fusion_precision
        return found


@dataclasses.dataclass
class ScoredPairs:
    """What :func:`score_pairs` returns: ``scores`` in the order of the pairs (``None``: unscored, its reason in
    ``reasons`` by row) and the passes run (``encoded_views``, ``fused_pairs``; summed over the processes, resumed
    chunks cost nothing)."""

    scores: list[float | None]
    reasons: dict[int, str]
    cost: dict[str, int]


def score_pairs(pairs: Sequence[tuple[str, str]], model, image_processor, query_images: Mapping,
                reference_images: Mapping, scoring: PairScoring | None = None, accelerator=None, folder=None,
                progress: bool = True, description: str = "matcher",
                log: Callable[[str], None] = logger.info) -> ScoredPairs:
    """The score of every ``(query id, reference id)`` pair.

    Args:
        pairs: the candidate pairs, any order.
        model, image_processor: a CopyNCE matcher (or its ONNX Runtime form) or descriptor, and its processor.
        query_images, reference_images: id -> image (a path or a PIL image); a mapping with an ``identity`` (an
            image source's, :class:`~copynce_hf.retrieval.sources.SourceImages`) adds it to the chunks' identity.
        scoring: :class:`PairScoring`.
        accelerator: an ``accelerate.Accelerator`` whose processes share the chunks (every process calls this with
            the same pairs; the model moves to its device); ``None``: this process scores every pair.
        folder: where completed chunks are kept and resumed from; ``None``: nowhere.
        progress, description: a progress bar and its label.
        log: receives the line saying how much work is resumed (and what content tokens dropped).
    """
    scoring = scoring or PairScoring()
    if accelerator is not None:
        model = model.to(accelerator.device)
    scoring = dataclasses.replace(scoring, fusion_precision=resolve_fusion_precision(scoring.fusion_precision, model))
    if model_kind(model) == "descriptor":
        score_chunk, passes = _descriptor_chunks(model, image_processor, query_images, reference_images, scoring), None
    else:
        scorer = MatcherScorer(model, image_processor, lce=scoring.lce, batch_size=scoring.batch_size,
                               cache_size=scoring.cache_size, max_pixels=scoring.max_pixels, content=scoring.content,
                               matches=scoring.matches if scoring.content is not None else None,
                               query_tokens=scoring.query_tokens, reference_tokens=scoring.reference_tokens,
                               fusion_precision=scoring.fusion_precision, **_grid_views(scoring.local_crops))

        def score_chunk(chunk: list[tuple[str, str]], scored) -> PairScores:
            return PairScores(scorer.score(chunk, query_images, reference_images, num_workers=scoring.num_workers,
                                           progress=False, on_scored=scored))

        passes = scorer
    identity = None
    if folder is not None:
        settings = {**scoring.identity(), "sources": [getattr(images, "identity", None)
                                                      for images in (query_images, reference_images)]}
        mixed = getattr(accelerator, "mixed_precision", "no")
        if mixed != "no":  # the encoder's autocast (chunks scored before it was recorded ran without one)
            settings["mixed_precision"] = mixed
        identity = scoring_identity(model, image_processor, settings, _files(query_images), _files(reference_images),
                                    pairs)
    scored = score_in_chunks(pairs, score_chunk, scoring.chunk_size, folder, identity, accelerator, progress,
                             description, log)
    return ScoredPairs(scored.scores, scored.reasons, _passes(passes, scoring, accelerator, log))


def _files(images: Mapping) -> Mapping:
    """The id -> file mapping whose stamps identify ``images`` (an image source's files; none for a dataset's)."""
    files = getattr(images, "files", images)
    return files if files is not None else {}


def _grid_views(local_crops: LocalCrops | None) -> dict:
    """The :class:`~.scorer.MatcherScorer` view options of a grid of local crops (every query view against every
    reference view); none without."""
    if local_crops is None:
        return {}
    return {"query_views": local_crops.query_views, "reference_views": local_crops.reference_views,
            "view_pairs": lambda nq, nr: [(q, r) for q in range(nq) for r in range(nr)]}


def _passes(scorer: MatcherScorer | None, scoring: PairScoring, accelerator, log) -> dict[str, int]:
    """The encoder and fusion passes of ``scorer`` summed over the processes (none for a descriptor); the line of
    what each query's local content masks dropped."""
    if scorer is None:
        return {"encoded_views": 0, "fused_pairs": 0}
    passes = [(scorer.encoded_views, scorer.fused_pairs, scorer.content_counts)]
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        passes = gather_object(passes)
    if scoring.content is not None and scoring.matches is None:
        log_local_masks(scoring.content, [p[2] for p in passes], log)
    return {"encoded_views": sum(p[0] for p in passes), "fused_pairs": sum(p[1] for p in passes)}


def _descriptor_chunks(model, image_processor, query_images: Mapping, reference_images: Mapping,
                       scoring: PairScoring) -> ChunkScorer:
    """Chunks scored by a descriptor: cosine of the descriptors, the best over the view combinations."""
    model.eval()

    def score_chunk(pairs: list[tuple[str, str]], scored) -> PairScores:
        dataset = PairViews([(query_images[q], reference_images[r]) for q, r in pairs], image_processor,
                            scoring.local_crops, max_pixels=scoring.max_pixels)
        views_per_pair = dataset.placeholders[0].shape[0] * dataset.placeholders[1].shape[0]
        loader = DataLoader(dataset, batch_size=max(1, scoring.batch_size // views_per_pair),
                            num_workers=scoring.num_workers, shuffle=False)
        scores, codes = [], []
        for batch in loader:
            scores.extend(score_views(model, batch["query_views"], batch["reference_views"],
                                      chunk_size=scoring.batch_size).tolist())
            codes.extend(batch["valid"].tolist())
            scored(len(batch["valid"]))
        return PairScores([score if code > 0 else None for score, code in zip(scores, codes)],
                          {row: SKIP_REASONS[-1 - code] for row, code in enumerate(codes) if code <= 0})

    return score_chunk
