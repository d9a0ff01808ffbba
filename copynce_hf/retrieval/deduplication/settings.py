"""What :func:`~copynce_hf.retrieval.deduplication.collection.dedup` adds to the detection pipeline's settings: the
collection normalisation of both stages, the matcher's orders, content crops and the grouping.

Each field declares its ``copynce dedup`` option (:func:`~copynce_hf.configuration.fields.setting`); this module
imports nothing heavy, so that ``copynce --help`` can read it.
"""

from __future__ import annotations

import argparse
import dataclasses

from ...configuration.fields import nested, non_negative_int, on_off, setting
from ...modeling.errors import ConfigError
from ..presets import (
    COLLECTION_K_END,
    COLLECTION_K_START,
    MATCHER_ORDERS,
    CollectionNormalisation,
    check_ranks,
)
from .grouping import GROUPINGS


@dataclasses.dataclass
class DedupSettings:
    """What :func:`~copynce_hf.retrieval.deduplication.collection.dedup` adds to
    :class:`~copynce_hf.retrieval.detection.config.DetectConfig`: collection normalisation, the matcher's orders,
    content crops and the grouping.

    Attributes:
        collection: the descriptor stage's collection normalisation (:class:`~copynce_hf.retrieval.presets.
            CollectionNormalisation`, on by default): a pair's score is its cosine less ``alpha`` times the mean of
            its two images' backgrounds (CSLS over the collection's own neighbours).
        matcher_normalisation: discount each image's matcher background (:func:`~copynce_hf.retrieval.search.
            background.normalised_probability`); ``False``: the matcher's probability decides; ``None`` (the
            default): as ``collection.on`` (set when the settings are made).
        matcher_alpha: the weight of the discount.
        matcher_k_start, matcher_k_end: the 0-based ranks of an image's verified pairs (by decreasing probability)
            averaged into its background; its best ``matcher_k_start`` pairs, its likely copies, are left out.
        matcher_anchor: the logit above which a background is discounted (0: probability 0.5).
        matcher_orders: ``both`` (each pair scored twice, each image the query once, the two logits averaged:
            neither side of a pair of two edited copies is "the original"), ``one`` (the earlier image in the
            collection's order as the query; half the fusion passes) or ``auto``: ``both`` for a matcher whose
            score depends on the order (:func:`order_dependent`), ``one`` for the others, whose two orders give
            the same score.
        content_crops: with content tokens, each image's own content cut from its pixels as a second view, which
            proposes pairs and verifies those its descriptor matches best (:mod:`copynce_hf.retrieval.content.crops`).
        layout_crops: with a token store (whole images), each image is also cut where its own layout shows a frame
            around a photo (:mod:`copynce_hf.retrieval.deduplication.layouts`); a layout crop's score counts where it
            is higher. On by default since it raised the template task's development draws (benchmarks/LOG.md, "Layout
            crops in dedup").
        grouping: ``representative`` (a pair joins a group only if it clears the threshold against the group's
            representative) or ``connected`` (connected components; :mod:`.grouping`).
    """

    collection: CollectionNormalisation = nested(lambda: CollectionNormalisation(on=True))
    matcher_normalisation: bool | None = setting(None, (
        "the matcher's decision discounts each image's background, the mean logit of its verified pairs of ranks "
        "--matcher-k-start..--matcher-k-end, where it is above --matcher-anchor"), type=on_off, metavar="{on,off}",
        default_text="(default: as --collection-normalisation)")
    matcher_alpha: float = setting(1.0, "its weight", type=float, metavar="A")
    matcher_k_start: int = setting(COLLECTION_K_START, "first verified pair rank averaged, from 0",
                                   type=non_negative_int, metavar="N")
    matcher_k_end: int = setting(COLLECTION_K_END, "last verified pair rank averaged, inclusive",
                                 type=non_negative_int, metavar="N")
    matcher_anchor: float = setting(0.0, "only the part of a background above this logit is discounted", type=float,
                                    metavar="LOGIT", default_text=(
                                        "(default 0: probability 0.5, so that images whose other pairs are "
                                        "non-copies keep their scores)"))
    matcher_orders: str = setting("auto", (
        "both: the matcher scores each pair twice, each image the query once, and the mean of the two logits decides "
        "(neither of two edited copies is the original); one: once, the earlier image as the query (half the "
        "matcher's fusion passes); auto: both for a matcher with segment embeddings (its score depends on the order, "
        "as the embedded matcher's), one for the authors' form (the same score in both orders)"),
        choices=MATCHER_ORDERS)
    content_crops: bool = setting(True, (
        "with content tokens: each image whose own content (the tokens it does not share with its neighbours) covers "
        "less than 60% of it gets a second view, that region cut from its pixels; the crops propose candidate pairs, "
        "and a pair whose best descriptor match involves a crop is verified on those views (--no-content-crops: whole "
        "images only)"), action=argparse.BooleanOptionalAction)
    layout_crops: bool = setting(True, (
        "each image is also cut where its own layout shows a frame around a photo (a rectangle of straight sides, a "
        "dense region among flat colours and text); a crop verifies its nearest other image where it matches it "
        "better than the whole image does, and its score counts where it is higher (a screenshot or poster met once "
        "in the collection); whole images only"), action=argparse.BooleanOptionalAction)
    grouping: str = setting("representative", (
        "representative: a pair joins a group only if it clears the threshold against the group's first member, two "
        "groups merge only if their first members' pair does; connected: connected components (two images join "
        "through any chain of pairs)"), choices=GROUPINGS)

    def __post_init__(self) -> None:
        if self.matcher_normalisation is None:
            self.matcher_normalisation = self.collection.on
        if self.grouping not in GROUPINGS:
            raise ConfigError(f"grouping must be one of {', '.join(GROUPINGS)}, got {self.grouping!r}")
        if self.matcher_orders not in MATCHER_ORDERS:
            raise ConfigError(f"matcher_orders must be one of {', '.join(MATCHER_ORDERS)}, got "
                              f"{self.matcher_orders!r}")
        check_ranks(self.matcher_k_start, self.matcher_k_end, "matcher normalisation")

    def scores_both_orders(self, matcher) -> bool:
        """Whether ``matcher`` (a model) scores each pair in both orders under :attr:`matcher_orders`."""
        return self.matcher_orders == "both" or (self.matcher_orders == "auto" and order_dependent(matcher))


def order_dependent(matcher) -> bool:
    """Whether the matcher's score of ``(a, b)`` can differ from its score of ``(b, a)``: with segment embeddings
    (query and reference tokens marked apart). Without them the fusion blocks see one set of tokens with no
    position across the two images, and the copy logit (read from the fusion CLS token) is the same in both
    orders: scoring twice would double the cost for nothing."""
    return bool(getattr(getattr(matcher, "config", None), "segment_embeddings", False))
