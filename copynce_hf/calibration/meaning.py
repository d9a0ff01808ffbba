"""What a run's scores mean, said where they are printed: which score it is, the threshold in force and where that
threshold comes from, and what a score at or above it means.

A matcher's copy probability (the sigmoid of its logit) is not the chance that a pair of *your* images is a copy:
unrelated images that look alike (textures of one kind, drawings in one style) can score as high as copies
(BENCHMARKS.md, "Look-alike negatives"). Only a threshold calibrated on known copies states a precision. So every
command that prints or writes decision scores says, in one :class:`ScoreMeaning` line:

* the score: the matcher's copy probability, a descriptor's cosine, or a normalised score (:func:`detect_score`,
  :func:`dedup_score`, :func:`search_score`, :func:`match_score`);
* the threshold in force: a ``copynce calibrate`` file's at a precision (detect, dedup ``--calibration``), dedup's
  self-calibration, a ``--threshold`` given by hand, or none (the scores then only rank pairs);
* for a score the model card measured (a matcher's probability, a descriptor's raw cosine), the card's own threshold
  at precision 0.9 on its evaluation task (:func:`card_threshold`), as a point of reference that calibrates nothing.

``copynce detect`` and ``copynce dedup`` also write it as ``OUTPUT/scores.json``
(``"format": "copynce-scores"``, :meth:`ScoreMeaning.to_dict`), beside the CSV files whose ``score`` column it
describes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..outputs import StagedFile

FORMAT = "copynce-scores"
#: The model-index result (``config``) of a card's score threshold at precision 0.9 (:mod:`copynce_hf.hub`).
CARD_RESULT = "threshold_at_p90"
#: What every matcher score is.
MATCHER_SCORE = "the matcher's copy probability (sigmoid of its logit)"


@dataclasses.dataclass(frozen=True)
class CardThreshold:
    """A model card's score threshold at precision 0.9: the lowest score at which its evaluation task's pooled
    predictions still had precision 0.9 (``task``: the task's short name, ``mini-DISC``)."""

    threshold: float
    task: str


def card_threshold(path: str | os.PathLike | None, kind: str) -> CardThreshold | None:
    """The card threshold of a model (``path``: its folder or Hub id, ``None``: the embedded model of ``kind``), read
    from the ``model-index`` of its ``README.md`` (a Hub id's from the local cache only); ``None`` where there is no
    card or it states no such result."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    from ..runtime.loading import DEFAULTS

    folder = Path(os.fspath(path)).expanduser() if path is not None else DEFAULTS[kind]
    card_file = folder / "README.md"
    if not card_file.is_file():
        try:
            cached = try_to_load_from_cache(os.fspath(path), "README.md") if path is not None else None
        except ValueError:  # not a Hub id either
            cached = None
        if not isinstance(cached, str):
            return None
        card_file = Path(cached)
    try:
        results = ModelCard.load(card_file).data.eval_results or []
    except (OSError, ValueError):
        return None
    for result in results:
        if result.metric_config == CARD_RESULT and result.metric_value is not None:
            return CardThreshold(float(result.metric_value), str(result.dataset_name or "its task").split(" (")[0])
    return None


@dataclasses.dataclass(frozen=True)
class ScoreMeaning:
    """What a run's scores are and what decides with them.

    Attributes:
        score: what the number is, in words (:data:`MATCHER_SCORE`, "the descriptor's cosine", ...).
        model: the model that gives it (a folder or Hub id; several descriptors joined).
        threshold: the threshold in force (``None``: none; the scores only rank pairs).
        source: where the threshold comes from ("calibration.json (`copynce calibrate`)", "self-calibrated on this
            collection", "--threshold").
        precision: the precision it was calibrated for (``None``: not calibrated, a threshold given by hand).
        recall: the recall the calibration measured there (``None``: unknown).
        decides: what a pair scored at or above the threshold becomes ("decided a copy", "joined into a group").
        card: the model card's threshold at precision 0.9 (:func:`card_threshold`), where the score is the one the
            card measured; ``None`` otherwise.
    """

    score: str
    model: str
    threshold: float | None = None
    source: str | None = None
    precision: float | None = None
    recall: float | None = None
    decides: str = "decided a copy"
    card: CardThreshold | None = None

    def line(self) -> str:
        """The line commands print and reports show: ``scores: <score> (<model>); <threshold and its meaning>``."""
        head = f"scores: {self.score} ({self.model}); "
        if self.threshold is None:
            card = (f"; its model card puts precision 0.9 on {self.card.task} at {self.card.threshold:.4f}, on "
                    "other images") if self.card else ""
            return (head + "uncalibrated, no threshold decides: they rank pairs and are not the chance that a pair "
                    f"is a copy, look-alike images can score as high as copies{card}; for decisions at a stated "
                    "precision: `copynce calibrate`, then `copynce detect --calibration`")
        if self.precision is None:
            return (head + f"threshold {self.threshold:.4g} ({self.source}, not calibrated): a pair scored at or "
                    f"above it is {self.decides}")
        recall = "" if self.recall is None else f", recall {self.recall:.3f} there"
        return (head + f"threshold {self.threshold:.4g} ({self.source}: precision {self.precision:g}{recall}): a "
                f"pair scored at or above it is {self.decides}; about {self.precision:.0%} of those pairs are copies "
                "where copies and non-copies come as in that calibration")

    def to_dict(self) -> dict[str, Any]:
        """The ``scores.json`` record: every field, the card's as ``{"threshold_at_p90", "task"}``, and the line."""
        found = dataclasses.asdict(self)
        found["card"] = None if self.card is None else {CARD_RESULT: self.card.threshold, "task": self.card.task}
        return {"format": FORMAT, **found, "meaning": self.line()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as JSON at ``path`` (atomically); returns the path."""
        with StagedFile(path) as temporary:
            temporary.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return Path(path)


def detect_score(config, descriptors: int, has_matcher: bool, auxiliary: bool) -> str:
    """What ``copynce detect`` scores are under a :class:`~copynce_hf.retrieval.detection.config.DetectConfig`, with
    ``descriptors`` descriptor models, a matcher or not, and an auxiliary set (score normalisation) or not."""
    if has_matcher:
        views = config.matcher_lce != "none" or config.crops_queries
        best = ", the highest over the views of a pair scored" if views else ""
        if not config.descriptor_weight:
            return MATCHER_SCORE + best
        cosine = "the descriptor's cosine" if descriptors == 1 else "the descriptors' mean cosine"
        return (f"the matcher's logit (of its copy probability{best}) plus {config.descriptor_weight:g} x {cosine} "
                "of the two whole images less the reference's background (--descriptor-weight: a score in logits, not "
                "a probability)")
    parts = ["the descriptor's cosine" if descriptors == 1 else "the best cosine of the descriptors"]
    if config.descriptor_lce != "none":
        parts.append("the best over view pairs")
    if auxiliary:
        parts.append(f"less {config.alpha:g} x the query's mean cosine to its auxiliary neighbours of ranks "
                     f"{config.k_start}-{config.k_end} (score normalisation)")
    if config.normalises_references:
        parts.append("less the reference's own background (collection normalisation)")
    return ", ".join(parts)


def dedup_score(settings, has_matcher: bool) -> str:
    """What ``copynce dedup``'s decision scores (``pairs.csv``'s ``score``) are under its
    :class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`."""
    if has_matcher:
        if not settings.matcher_normalisation:
            return MATCHER_SCORE
        return (MATCHER_SCORE + ", discounted by the part of each image's background above probability 0.5 "
                "(collection normalisation; pairs.csv's raw_score is the probability itself)")
    if settings.collection.on:
        return (f"the descriptor's cosine less {settings.collection.alpha:g} x the mean of its two images' "
                "backgrounds (collection normalisation; pairs.csv's raw_score is the cosine itself)")
    return "the descriptor's cosine"


def search_score(normalised: bool, stretched: bool, views: bool, alpha: float = 1.0, k_start: int = 0,
                 k_end: int = 9) -> str:
    """What ``copynce search`` scores are: cosines, score-normalised, or negative distances after stretching."""
    if stretched:
        return "the negative squared distance of the stretched descriptors (feature stretching; not a cosine)"
    score = "the descriptor's cosine" + (", the best over view pairs" if views else "")
    if normalised:
        score += (f", less {alpha:g} x the query's mean cosine to its auxiliary neighbours of ranks {k_start}-{k_end} "
                  "(score normalisation)")
    return score


def match_score(is_matcher: bool, views: bool) -> str:
    """What ``copynce match`` scores are: the matcher's probability, or a descriptor's cosine (``--matcher`` naming
    a descriptor); ``views``: local crops or matcher LCE, the highest over the view pairs."""
    score = MATCHER_SCORE if is_matcher else "the descriptor's cosine"
    return score + (", the highest over the view pairs scored" if views else "")
