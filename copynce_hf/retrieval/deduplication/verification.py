"""Step 2 of :func:`~copynce_hf.retrieval.deduplication.collection.dedup`: the matcher verifies the candidate pairs of
one collection, and each pair's raw score becomes its decision score.

Each unordered pair is verified once, the earlier image in the collection's order as the query, when the matcher's
score does not depend on the order (the authors' form); in both orders for a matcher whose fused sequence tells query
from reference (segment embeddings), its probability then the sigmoid of the mean of the two logits
(``DedupSettings.matcher_orders``). Whole images (``matcher_lce`` ``none``) are encoded once each into a token store
(:mod:`~copynce_hf.retrieval.content.store`) that the content tokens and every fusion read; LCE views go through the
scorer's encoder-token cache. With matcher normalisation (on by default) the decision score is the matcher's
probability with each image's background logit above an anchor discounted
(:func:`~copynce_hf.retrieval.search.background.normalised_probability`); without a matcher the descriptor score of
step 1 decides.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from ..content.masks import CollectionMatches
from ..content.stage import dedup_keep_masks
from ..content.store import TokenStore, source_token_store
from ..detection.config import MATCHER_VIEW_NAMES, DetectConfig
from ..search.background import matcher_backgrounds, mean_logit_probability, normalised_probability
from ..sources import SourceImages
from ..verify.pairs import score_pairs
from .self_search import CandidatePairs


@dataclasses.dataclass
class CollectionMatcher:
    """The matcher over one collection: what its scorings share (the collection, the settings, the processes), the
    images' content matches and token store once computed, and the encoder and fusion passes of every scoring.

    Attributes:
        source: the collection (an image source).
        matcher: ``(model, image_processor)``.
        config, settings: the run's :class:`~copynce_hf.retrieval.detection.config.DetectConfig` and
            :class:`~copynce_hf.retrieval.deduplication.collection.DedupSettings`.
        accelerator, progress, log: the processes, progress bars, one line per step.
        cost: ``encoded_views`` and ``fused_pairs`` so far (``None`` before the first scoring).
        matches: the images' content-token matches in their neighbours (``content_tokens``), once verified.
        tokens: the images' matcher encoder tokens (whole images), once verified.
    """

    source: object
    matcher: tuple
    config: DetectConfig
    settings: object
    accelerator: object
    progress: bool
    log: Callable[[str], None]
    cost: dict[str, int] | None = None
    matches: CollectionMatches | None = None
    tokens: TokenStore | None = None

    def score(self, pairs: list[tuple[str, str]], queries, references, config: DetectConfig, folder=None,
              progress: bool = False, tokens: tuple = (None, None)) -> list[float | None]:
        """The matcher's scores of ``pairs`` read from two sources (:func:`~copynce_hf.retrieval.verify.pairs.score_pairs`,
        with the collection's content matches where ``config`` fuses content tokens, and ``tokens``, the two sides'
        token stores, read instead of encoding the images they hold); the passes add to :attr:`cost`."""
        query_images, reference_images = SourceImages(queries), SourceImages(references)
        scored = score_pairs(pairs, *self.matcher, query_images, reference_images,
                             config.pair_scoring(query_images.max_pixels, self.matches, *tokens), self.accelerator,
                             folder, progress, f"matcher ({MATCHER_VIEW_NAMES[config.matcher_lce]})",
                             lambda line: self.log(f"matcher: {line}"))
        self.add_cost(scored.cost)
        return scored.scores

    @property
    def both_orders(self) -> bool:
        """Whether each pair is scored in both orders (``DedupSettings.matcher_orders``)."""
        return self.settings.scores_both_orders(self.matcher[0])

    def whole_scores(self, pairs: list[tuple[str, str]], folder=None) -> list[float | None]:
        """The matcher's score of each pair of whole images of the collection, content tokens and token store as
        verified; in both orders (:attr:`both_orders`) the pairs and their reversals in one scoring, so that they
        share chunks and resume, then :func:`mean_of_orders`."""
        ordered = pairs + [(b, a) for a, b in pairs] if self.both_orders else pairs
        scores = self.score(ordered, self.source, self.source, self.config, folder, self.progress,
                            (self.tokens, self.tokens))
        return mean_of_orders(scores[:len(pairs)], scores[len(pairs):]) if self.both_orders else scores

    def view_scores(self, pairs: list[tuple[str, str]], queries, references, folder: Path | None = None,
                    tokens: tuple = (None, None)) -> list[float | None]:
        """The matcher's scores of ``pairs`` read from two sources of views (crops and whole images), every token kept
        (a crop is its image's own content): in both orders where :attr:`both_orders` says so, the reversed pairs' chunks
        kept beside ``folder`` in ``<folder>-reversed``, then :func:`mean_of_orders`; ``tokens``: the two sides'
        token stores."""
        config = dataclasses.replace(self.config, content_tokens=False)
        scores = self.score(pairs, queries, references, config, folder, tokens=tokens)
        if not self.both_orders:
            return scores
        backward = self.score([(b, a) for a, b in pairs], references, queries, config,
                              folder and folder.with_name(f"{folder.name}-reversed"), tokens=tokens[::-1])
        return mean_of_orders(scores, backward)

    def crop_tokens(self, crops, ids: list[str], folder: Path, label: str) -> TokenStore:
        """The matcher's encoder tokens of the crops ``ids`` of a crop source, each encoded once into ``folder``
        (resumed from it); the passes add to :attr:`cost`, the log lines start with ``label``."""
        store = source_token_store(self.matcher, SourceImages(crops), ids, folder, batch_size=self.config.batch_size,
                                   num_workers=self.config.num_workers, accelerator=self.accelerator,
                                   progress=self.progress, log=lambda line: self.log(f"{label}: {line}"))
        self.add_cost({"encoded_views": store.encoded, "fused_pairs": 0})
        return store

    def add_cost(self, cost: dict[str, int]) -> None:
        """Add a scoring's encoder and fusion passes to :attr:`cost`."""
        self.cost = cost if self.cost is None else {name: self.cost[name] + cost[name] for name in cost}


def mean_of_orders(forward: list[float | None], backward: list[float | None]) -> list[float | None]:
    """Each pair's probability from its two orders' (:func:`~copynce_hf.retrieval.search.background.mean_logit_probability`;
    ``None`` where either is)."""
    return [None if None in pair else mean_logit_probability(*pair) for pair in zip(forward, backward)]


def token_store(scorer: CollectionMatcher, pairs: list[tuple[str, str]], folder: Path | None) -> TokenStore | None:
    """The matcher's encoder tokens of every image of ``pairs``, each encoded once (kept in ``folder``, resumed after
    a kill); ``None`` with LCE views, which the scorer's cache encodes."""
    if scorer.config.matcher_lce != "none":
        return None
    in_pairs = {image_id for pair in pairs for image_id in pair}
    return source_token_store(scorer.matcher, SourceImages(scorer.source),
                              [image_id for image_id in scorer.source.ids if image_id in in_pairs], folder,
                              batch_size=scorer.config.batch_size, num_workers=scorer.config.num_workers,
                              accelerator=scorer.accelerator, progress=scorer.progress,
                              log=lambda line: scorer.log(f"matcher: {line}"))


def verify_candidates(scorer: CollectionMatcher, candidates: CandidatePairs, folder, tokens_folder: Path | None,
                      seconds: dict[str, float]) -> dict[tuple[str, str], float]:
    """``(earlier, later)`` -> the matcher's probability of each candidate pair (chunks kept in ``folder``; a pair it
    cannot score is left out), its images encoded once into the token store in ``tokens_folder`` and masked by their
    content matches; the time goes to ``seconds["matcher"]``."""
    start = time.perf_counter()
    pair_ids = list(candidates.raw)
    scorer.tokens = token_store(scorer, pair_ids, tokens_folder)
    scorer.matches = dedup_keep_masks(scorer.matcher, SourceImages(scorer.source), list(scorer.source.ids),
                                      candidates.pairs, scorer.config, scorer.accelerator, scorer.log, scorer.progress,
                                      scorer.tokens)
    scores = scorer.whole_scores(pair_ids, folder)
    scorer.cost["encoded_views"] += scorer.matches.encoded if scorer.matches is not None else 0
    scorer.cost["encoded_views"] += scorer.tokens.encoded if scorer.tokens is not None else 0
    verified = {pair: score for pair, score in zip(pair_ids, scores) if score is not None}
    seconds["matcher"] = time.perf_counter() - start
    processes = scorer.accelerator.num_processes
    scorer.log(f"matcher: {len(verified)} pairs verified{f' on {processes} processes' if processes > 1 else ''} "
               f"({scorer.cost['encoded_views']} encoder passes, {scorer.cost['fused_pairs']} fusion passes)")
    return verified


@dataclasses.dataclass
class PairDecision:
    """How a pair's raw score becomes its decision score: the descriptor's cosine less the pair's background
    (:meth:`~.self_search.CandidatePairs.score`) without matcher; with one, the matcher's probability, its
    backgrounds discounted (:func:`~copynce_hf.retrieval.search.background.normalised_probability`) when
    ``matcher_background`` is given."""

    candidates: CandidatePairs
    has_matcher: bool
    settings: object
    matcher_background: dict[str, float] | None = None

    def __call__(self, a: str, b: str, raw: float) -> float:
        if not self.has_matcher:
            return self.candidates.score(a, b, raw)
        if self.matcher_background is None:
            return raw
        background, settings = self.matcher_background, self.settings
        return normalised_probability(raw, background.get(a), background.get(b), settings.matcher_alpha,
                                      settings.matcher_anchor)


def pair_decision(candidates: CandidatePairs, raw: dict[tuple[str, str], float], has_matcher: bool, settings,
                  log: Callable[[str], None]) -> PairDecision:
    """How raw scores become decision scores; with a matcher and matcher normalisation, each image's matcher
    background is measured over its verified pairs (:func:`~copynce_hf.retrieval.search.background.matcher_backgrounds`)."""
    if not has_matcher or not settings.matcher_normalisation:
        return PairDecision(candidates, has_matcher, settings)
    background = matcher_backgrounds(((a, b, score) for (a, b), score in raw.items()), settings.matcher_k_start,
                                     settings.matcher_k_end)
    above = [value for value in background.values() if value > settings.matcher_anchor]
    log(f"matcher normalisation: {len(above)} of {len(background)} images have a background (mean logit of their "
        f"verified pairs of ranks {settings.matcher_k_start}-{settings.matcher_k_end}) above "
        f"{settings.matcher_anchor:g}, discounted from their pairs" + (f" (largest {max(above):.2f})" if above else ""))
    return PairDecision(candidates, True, settings, background)
