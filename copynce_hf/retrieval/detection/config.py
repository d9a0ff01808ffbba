"""Settings of the detection pipeline (:func:`~copynce_hf.retrieval.detection.pipeline.detect`), and how they score
candidate pairs (:class:`~copynce_hf.retrieval.verify.pairs.PairScoring`).

Each field that a command sets declares its option (:func:`~copynce_hf.configuration.fields.setting`), so that
``copynce detect``, ``calibrate`` and ``dedup`` build their options from it; this module imports nothing heavy, so
that ``copynce --help`` can read it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import TYPE_CHECKING

from ...configuration.fields import nested, non_negative_float, non_negative_int, positive_int, setting
from ...modeling.errors import ConfigError
from ..descriptors.views import DESCRIPTOR_LCE_MODES, MATCHER_LCE_MODES, check_mode
from ..presets import (
    DEFAULT_CANDIDATES,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_ENCODER_PRECISION,
    DEFAULT_FUSION_PRECISION,
    DEFAULT_LAYOUT_CANDIDATES,
    DESCRIPTOR_TAU,
    ENCODER_PRECISIONS,
    FUSION_PRECISIONS,
    MATCHER_TAU,
    MIN_IMAGES,
    NEIGHBOURS,
    PIPELINE_PRESETS,
    REFERENCE_BACKGROUNDS,
    CollectionNormalisation,
)

if TYPE_CHECKING:
    from ..verify.pairs import PairScoring

#: How the log lines name the views of each ``descriptor_lce`` / ``matcher_lce`` mode.
DESCRIPTOR_VIEW_NAMES = {"none": "whole images", "matcher-views": "LCE: 26 query x 10 reference views",
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
        collection: the reference-side collection normalisation (:class:`~copynce_hf.retrieval.presets.
            CollectionNormalisation`, off by default): each reference's background, its mean score to its neighbours
            (:mod:`~copynce_hf.retrieval.search.background`), is subtracted from every query->reference descriptor
            score before the candidates are chosen (out of each query's ``2 * candidates`` nearest):
            ``s(q, r) = cos(q, r) - alpha * bias(q) - collection.alpha * bg(r)``. With a matcher it changes which
            candidates are verified, not their scores.
        reference_background: where a reference's neighbours are taken: ``collection`` (the other references: one
            self-search of the reference index, cached beside it) or ``auxiliary`` (the auxiliary images, which
            must be given).
        content_tokens: the matcher fuses content tokens only, dropping the encoder tokens an image shares with
            ``content_min_images`` of its ``content_neighbours`` neighbour images (the pair's other image not
            counting) at a cosine above ``content_tau`` (template, "bursty" regions; :mod:`copynce_hf.retrieval.content.stage`, beyond
            the paper); whole images only (``matcher_lce`` ``none``).
        query_crops: with content tokens and a matcher, each query's own content (the tokens it does not share with
            its nearest references and queries) is cut from its pixels where it is a small part of the query, and
            searched and verified as a second view of the query (:func:`~copynce_hf.retrieval.content.queries.query_crops`,
            beyond the paper), with the first descriptor; it applies where content tokens do, to whole images
            (:attr:`crops_queries`).
        layout_crops: with query crops, each query is also cut where its own layout shows a frame around a photo
            (straight-sided rectangles, dense regions: :mod:`copynce_hf.retrieval.content.layout`), so that a frame no
            other image shares is recognised too; a few more descriptor passes per query, and matcher passes where a
            crop matches a reference better than the whole query.
        layout_candidates: the references each layout crop proposes to the matcher, its nearest by descriptor
            cosine (at most ``candidates``).
        fusion_precision: how the matcher's fusion blocks compute (:data:`~copynce_hf.retrieval.presets.
            FUSION_PRECISIONS`); the logits stay float32.
        encoder_precision: how the descriptors and the matcher's encoder compute (:data:`~copynce_hf.retrieval.
            presets.ENCODER_PRECISIONS`): the mixed precision of the ``Accelerator`` that ``copynce detect`` and
            :func:`~copynce_hf.retrieval.detection.pipeline.detect` make (one given to it keeps its own).
        descriptor_content_tokens: the descriptor search runs again on content descriptors (final-layer patch
            tokens shared at a cosine above ``descriptor_content_tau`` dropped from the input; whole images only,
            ``descriptor_lce`` ``none``); costs two more descriptor passes per image.
        descriptor_weight: beyond the paper, with a matcher: each final pair's score is the matcher's logit plus
            ``descriptor_weight`` times the pair's descriptor cosine (whole images) less the reference's background
            (as ``collection`` measures it, on or off), averaged over the descriptors
            (:mod:`~copynce_hf.retrieval.detection.evidence`): a score in logits rather than a probability; 0
            (default): the matcher's probability alone.
    """

    k: int = setting(10, "predictions kept per query", type=positive_int)
    candidates: int = setting(DEFAULT_CANDIDATES, (
        "candidates of each query image verified by the matcher: its nearest references, merged over the descriptors "
        "(dedup: the nearest other images of each image)"), type=positive_int, preset_notes={
            "paper": "as the authors on GPUs"})
    descriptor_lce: str = setting("none", (
        "descriptor views: none (whole images), matcher-views (26 query x 10 reference views, a pair scores its best "
        "view pair) or authors (45 query views in 4 groups x 9 reference views, each query view keeps its top "
        "100/10/10/4 references by group: up to 390 per query), then the best --candidates"),
        choices=DESCRIPTOR_LCE_MODES)
    matcher_lce: str = setting("none", (
        "the matcher's local crops ensembling: view pairs scored per candidate, none (1), paper (35) or all (260), the "
        "best one counting"), choices=MATCHER_LCE_MODES)
    alpha: float = setting(1.0, "score normalisation weight", type=float)
    k_start: int = setting(0, "first auxiliary rank of score normalisation, from 0", type=non_negative_int)
    k_end: int = setting(9, "last auxiliary rank of score normalisation, inclusive", type=non_negative_int)
    batch_size: int = 64
    num_workers: int = 0
    cache_size: int = 4096
    chunk_size: int = setting(DEFAULT_CHUNK_SIZE, (
        "candidate pairs per chunk of re-scoring work (whole queries), the unit shared by the processes of "
        "`accelerate launch` and saved as it completes, so that the same command resumes a run cut short"),
        type=positive_int, metavar="N")
    whiten_dim: int | None = setting(None, "whitened directions kept; needs more than D sample images (views)",
                                     type=positive_int, metavar="D", default_text="(default: all)")
    collection: CollectionNormalisation = nested(CollectionNormalisation)
    reference_background: str = setting("collection", (
        "where a reference's neighbours are taken: collection (the other references) or auxiliary (the --aux "
        "images)"), choices=REFERENCE_BACKGROUNDS)
    content_tokens: bool = setting(True, (
        f"the matcher ignores the patch tokens an image shares (cosine above {MATCHER_TAU}) with {MIN_IMAGES} of its "
        f"{NEIGHBOURS} neighbour images (templates, frames, meme bands), so that two different photos in one frame are "
        "not copies; whole images only (--matcher-lce none), PyTorch runtime only, off by default "
        "with --matcher-lce paper or all or with --runtime onnx"),
        action=argparse.BooleanOptionalAction)
    content_tau: float = MATCHER_TAU
    content_min_images: int = MIN_IMAGES
    content_neighbours: int = NEIGHBOURS
    query_crops: bool = setting(True, (
        "with content tokens and a matcher: each query whose own content (the tokens it does not share with its "
        "nearest references and queries) covers less than 60% of it is also searched and verified as that part, cut "
        "from its pixels (a copy pasted into a screenshot or a meme); whole images only"),
        action=argparse.BooleanOptionalAction)
    layout_crops: bool = setting(True, (
        "with query crops: each query is also cut where its own layout shows a frame around a photo (a rectangle of "
        "straight sides, a dense region among flat colours and text), so that a screenshot, poster or print that "
        "arrives alone is searched and verified as its photo"), action=argparse.BooleanOptionalAction)
    layout_candidates: int = setting(DEFAULT_LAYOUT_CANDIDATES, (
        "references each layout crop proposes for the matcher to verify: its nearest by descriptor cosine (at most "
        "--candidates)"), type=positive_int)
    descriptor_content_tokens: bool = setting(False, (
        "search again with descriptors of each image's content tokens (final-layer tokens shared at a cosine above "
        f"{DESCRIPTOR_TAU} with {MIN_IMAGES} of its {NEIGHBOURS} nearest images dropped): two more descriptor passes "
        "per image; whole images only (--descriptor-lce none)"), action="store_true")
    descriptor_content_tau: float = DESCRIPTOR_TAU
    fusion_precision: str = setting(DEFAULT_FUSION_PRECISION, (
        "the matcher's fusion blocks: float32, bfloat16 (autocast; the logits stay float32) or auto "
        "(bfloat16 where the device multiplies it natively: a CPU with AVX-512 bfloat16, a recent GPU)"),
        choices=FUSION_PRECISIONS)
    descriptor_weight: float = setting(0.0, (
        "with a matcher: each pair's score is the matcher's logit plus this weight times the descriptors' cosine of the "
        "two whole images less the reference's background (its mean cosine to its neighbours of ranks "
        "--collection-k-start..--collection-k-end, which a shared frame raises); a score in logits, not a "
        "probability: calibrate for a threshold. The descriptor's evidence beside the matcher's, worth it where the "
        "descriptor is strong; 0: the matcher's probability alone"), type=non_negative_float, metavar="W")
    encoder_precision: str = setting(DEFAULT_ENCODER_PRECISION, (
        "the descriptors' and the matcher encoder's passes: float32, bfloat16 (autocast, accelerate's mixed precision "
        "bf16) or auto (what accelerate launch --mixed_precision chose, else bfloat16 where the device multiplies it "
        "natively)"), choices=ENCODER_PRECISIONS)

    def __post_init__(self) -> None:
        check_mode(self.descriptor_lce, DESCRIPTOR_LCE_MODES, "descriptor_lce")
        check_mode(self.matcher_lce, MATCHER_LCE_MODES, "matcher_lce")
        check_mode(self.fusion_precision, FUSION_PRECISIONS, "fusion_precision")
        check_mode(self.encoder_precision, ENCODER_PRECISIONS, "encoder_precision")
        from ..content.tokens import check_content_settings  # torch: not for --help

        check_content_settings(self.content_tau, self.content_min_images, self.content_neighbours)
        check_content_settings(self.descriptor_content_tau, self.content_min_images, self.content_neighbours,
                               "descriptor_content_tau")
        if self.content_tokens and self.matcher_lce != "none":
            raise ConfigError(f"content tokens apply to whole images only: matcher_lce {self.matcher_lce!r} needs "
                              "content_tokens=False (--no-content-tokens)")
        if self.descriptor_content_tokens and self.descriptor_lce != "none":
            raise ConfigError(f"descriptor content tokens apply to whole images only: descriptor_lce "
                              f"{self.descriptor_lce!r} needs descriptor_content_tokens=False")
        if not (math.isfinite(float(self.descriptor_weight)) and float(self.descriptor_weight) >= 0):
            raise ConfigError(f"descriptor_weight must be a finite number of at least 0, got {self.descriptor_weight}")
        if self.descriptor_weight and self.descriptor_lce != "none":
            raise ConfigError(f"descriptor_weight weighs the cosine of whole images: descriptor_lce "
                              f"{self.descriptor_lce!r} needs descriptor_weight 0")
        for name in ("k", "candidates", "batch_size", "chunk_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.whiten_dim is not None and self.whiten_dim < 1:
            raise ConfigError(f"whiten_dim must be at least 1, got {self.whiten_dim}")
        if not 0 <= self.k_start <= self.k_end:
            raise ConfigError(f"score normalisation needs 0 <= k_start <= k_end, got k_start={self.k_start}, "
                              f"k_end={self.k_end}")
        check_mode(self.reference_background, REFERENCE_BACKGROUNDS, "reference_background")
        if self.reference_background != "collection" and not self.normalises_references:
            raise ConfigError(f"reference_background {self.reference_background!r} sets where collection "
                              "normalisation measures the references' backgrounds, and it is off: give "
                              "collection=CollectionNormalisation(on=True) (--collection-normalisation on)")

    @property
    def crops_queries(self) -> bool:
        """Whether query crops apply: asked for, with content tokens, on whole images (``descriptor_lce`` ``none``)."""
        return self.query_crops and self.content_tokens and self.descriptor_lce == "none"

    @property
    def crops_layouts(self) -> bool:
        """Whether layout crops apply: asked for, with query crops (:attr:`crops_queries`)."""
        return self.layout_crops and self.crops_queries

    @property
    def normalises_references(self) -> bool:
        """Whether :func:`detect` normalises its references over their collection (``collection.on``)."""
        return self.collection.on

    def pair_scoring(self, max_pixels: int | None = None, matches=None, query_tokens=None,
                     reference_tokens=None) -> PairScoring:
        """How the matcher scores this pipeline's pairs: its LCE views, batches, cache, chunks and content tokens
        (with the collection's ``matches`` when given), images read under ``max_pixels``, their encoder tokens
        read from ``query_tokens`` / ``reference_tokens`` (token stores) where they hold them."""
        from ..content.stage import matcher_content  # torch: not for --help
        from ..verify.pairs import PairScoring

        content = matcher_content(self)
        return PairScoring(lce=self.matcher_lce, batch_size=self.batch_size, cache_size=self.cache_size,
                           num_workers=self.num_workers, max_pixels=max_pixels, chunk_size=self.chunk_size,
                           content=content, matches=matches if content is not None else None,
                           query_tokens=query_tokens, reference_tokens=reference_tokens,
                           fusion_precision=self.fusion_precision)

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> DetectConfig:
        """The settings of ``preset`` (:data:`~copynce_hf.retrieval.presets.PIPELINE_PRESETS`: ``detect``'s and
        ``dedup``'s), with ``overrides`` (fields given explicitly)."""
        if preset not in PIPELINE_PRESETS:
            raise ConfigError(f"unknown detect preset {preset!r}; choose one of {', '.join(PIPELINE_PRESETS)}")
        return cls(**{**PIPELINE_PRESETS[preset], **overrides})
