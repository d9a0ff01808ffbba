"""How ``copynce dedup``'s self-calibration turns the scored pairs of its calibration collection into a threshold,
and the lines that say what it measured.

Beyond the paper. The pairs are those :func:`~copynce_hf.calibration.collection.self_calibrate` verified, labelled
by provenance (:mod:`copynce_hf.calibration.synthetic`): planted copy pairs are positives; pairs of images made from
two different sampled images are negatives, except those the collection itself pairs
(:data:`~copynce_hf.calibration.synthetic.PAIRED`), which count as neither.

The rule (:func:`self_threshold`):

1. the threshold is the lowest decision score at which the labelled pairs reach the target precision
   (``--precision``, 0.9 by default): the most recall that precision allows (:func:`choose_threshold`);
2. its precision and recall on the planted pairs are stated in one line (:attr:`SelfCalibration.origin`); the
   recall counts every planted copy pair, those the candidates never verified too;
3. where that recall is below :data:`RECALL_FLOOR`, or no threshold reaches the target, the run would keep too few
   copies to be of use: a one-line warning says so (:attr:`SelfCalibration.warning`) and the run falls back to a
   stated default (:class:`Fallback`: the matcher's threshold at precision 0.9 from its model card,
   :func:`card_fallback`), or keeps the self-calibrated threshold where there is none (a run without matcher: its
   decision scores are collection-normalised cosines, which no card states).

Why the floor is :data:`RECALL_FLOOR`: it was set when the planted copies were drawn with the mini-DISC query recipe,
on whose copies the embedded matcher keeps 0.513 at precision 0.9 (its card's RP90): a self-calibrated threshold
keeping fewer than half that share is set by a few hard non-copies of the calibration collection (two images in one
template, a look-alike or a copy pair the collection holds), not by what the model can tell apart, and keeps too few
copies to be worth its precision. The planted copies are now drawn with the calibration's own recipe
(:data:`~copynce_hf.calibration.synthetic.COPY_RECIPE`, so that no benchmark checks the threshold on copies of the
recipe it was calibrated on); the floor was kept as it was. With mini-DISC's recipe planted, copies as most users make
them (a crop, a caption, a filter) scored higher than the planted ones: on folders of such copies
(``benchmarks/quality/dedup_folders.py``) the planted recall stated was 0.09-0.56 and the folders' own 0.87-1.00.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from ..modeling.errors import PredictionsError
from .meaning import card_threshold
from .synthetic import NON_COPY_KINDS, PAIRED

#: Below this recall of its planted copy pairs, a self-calibrated threshold is not used (see the module).
RECALL_FLOOR = 0.25


@dataclasses.dataclass(frozen=True)
class ThresholdChoice:
    """The chosen ``threshold``, the ``precision`` and the ``recall`` of the pairs scored at or above it, and whether
    the precision ``reached`` the target."""

    threshold: float
    precision: float
    recall: float
    reached: bool


@dataclasses.dataclass(frozen=True)
class Fallback:
    """The threshold a run falls back to when its self-calibration keeps too few copies, and where it comes from in
    words (``"the matcher's threshold at precision 0.9 on mini-DISC, from its model card"``)."""

    threshold: float
    source: str


def choose_threshold(is_copy: Sequence[bool], scores: Sequence[float], negative_weight: float,
                     target: float, positives: int | None = None) -> ThresholdChoice:
    """The lowest score ``t`` at which the pairs scored ``>= t`` reach precision ``target``, each non-copy counting
    ``negative_weight``: precision ``TP / (TP + negative_weight * FP)``, recall ``TP / positives``. Where no score
    reaches it, the score of best precision (then of most recall), with ``reached`` false.

    Args:
        is_copy: (P,) whether each pair is a copy.
        scores: (P,) its score.
        negative_weight: how many negatives one non-copy stands for (1: none).
        target: the precision aimed at, in (0, 1].
        positives: the copies the recall counts (``None``: those in ``is_copy``; more where some were never scored).
    """
    copies = sum(bool(c) for c in is_copy)
    if copies == 0:
        raise PredictionsError("the self-calibration verified no copy pair: no threshold can be chosen")
    positives = copies if positives is None else max(int(positives), copies)
    ranked = sorted(zip(map(float, scores), map(bool, is_copy)), key=lambda pair: -pair[0])
    points, found, false = [], 0, 0
    for i, (score, copy) in enumerate(ranked):
        found, false = found + copy, false + (not copy)
        if found and (i + 1 == len(ranked) or ranked[i + 1][0] < score):  # the last pair of this score
            points.append(ThresholdChoice(score, found / (found + negative_weight * false), found / positives, False))
    reaching = [point for point in points if point.precision >= target - 1e-12]
    if reaching:
        return dataclasses.replace(reaching[-1], reached=True)
    return max(points, key=lambda point: (point.precision, point.recall))


def card_fallback(folder: str | os.PathLike | None) -> Fallback | None:
    """The :class:`Fallback` of a matcher folder (or Hub id): the score threshold at precision 0.9 its model card
    states, as :func:`~copynce_hf.calibration.meaning.card_threshold` reads it, on the task the card names; ``None``
    without a folder, a card or such a result."""
    card = card_threshold(folder, "matcher") if folder is not None else None
    if card is None:
        return None
    return Fallback(card.threshold, f"the matcher's threshold at precision 0.9 on {card.task}, from its model card")


@dataclasses.dataclass
class SelfCalibration:
    """A self-calibration: the verified pairs of its calibration collection (kinds, decision scores), the sample,
    the ``true_pairs`` (the planted copy pairs among its readable images, verified or not), the target precision,
    the :class:`ThresholdChoice`, the :class:`Fallback` offered (``None``: none), the sampled images the collection
    pairs itself (``linked``), where it is saved and whether its scores were reused from there."""

    pairs: list
    sample: list[str]
    true_pairs: int
    target: float
    choice: ThresholdChoice
    fallback: Fallback | None = None
    linked: int = 0
    file: Path | None = None
    reused: bool = False

    @property
    def usable(self) -> bool:
        """Whether the self-calibrated threshold is used: it reached the target at a recall of at least
        :data:`RECALL_FLOOR`."""
        return self.choice.reached and self.choice.recall >= RECALL_FLOOR

    @property
    def falls_back(self) -> bool:
        return not self.usable and self.fallback is not None

    @property
    def threshold(self) -> float:
        """The threshold the run uses: the self-calibrated one, or the fallback's (:attr:`falls_back`)."""
        return self.fallback.threshold if self.falls_back else self.choice.threshold

    @property
    def counts(self) -> dict[str, int]:
        copies = sum(p.is_copy for p in self.pairs)
        counts = {"images": len(self.sample), "copy_pairs": copies,
                  "non_copy_pairs": sum(p.kind in NON_COPY_KINDS for p in self.pairs),
                  "true_pairs": self.true_pairs, "missed_true_pairs": self.true_pairs - copies,
                  "paired_in_collection": sum(p.kind == PAIRED for p in self.pairs), "linked_images": self.linked}
        counts.update({kind: sum(p.kind == kind for p in self.pairs) for kind in NON_COPY_KINDS})
        return counts

    @property
    def measured(self) -> str:
        """What the self-calibration measured at its own threshold, in words."""
        counts, choice = self.counts, self.choice
        return (f"precision {choice.precision:.2f} and recall {choice.recall:.2f} on {counts['true_pairs']} planted "
                f"copy pairs and {counts['non_copy_pairs']} non-copy pairs (target precision {self.target:g}; the "
                f"recall counts the {counts['missed_true_pairs']} copy pairs never verified; "
                f"{counts['shared template']} non-copies share a template; {counts['linked_images']} pairs of this "
                "collection's images score as copies of each other and are counted as neither)")

    @property
    def origin(self) -> str:
        """Where the threshold comes from and what was measured, in one line (the log's and the report's)."""
        made, choice = f"self-calibrated on {len(self.sample)} images of this collection", self.choice
        if self.usable:
            return f"{made}: threshold {choice.threshold:.4g}, where it measured {self.measured}"
        short = (f"below the recall floor {RECALL_FLOOR:g}" if choice.reached else
                 f"short of the target precision {self.target:g}")
        if self.falls_back:
            return (f"{made}: threshold {self.threshold:.4g}, {self.fallback.source}; the self-calibrated "
                    f"{choice.threshold:.4g} measured {self.measured}, {short}")
        return (f"{made}: threshold {choice.threshold:.4g}, where it measured {self.measured}, {short} (no stated "
                "default for these scores)")

    @property
    def warning(self) -> str | None:
        """The one-line warning of a self-calibration whose threshold keeps too few copies (``None`` otherwise)."""
        if self.usable:
            return None
        choice = self.choice
        found = (f"recall {choice.recall:.2f} of its planted copies at precision {choice.precision:.2f} is below the "
                 f"floor {RECALL_FLOOR:g}" if choice.reached else
                 f"no threshold reaches precision {self.target:g} on its planted pairs (the best, "
                 f"{choice.precision:.2f} at {choice.threshold:.4g}, keeps recall {choice.recall:.2f})")
        then = (f"this run uses threshold {self.threshold:.4g} instead, {self.fallback.source}" if self.falls_back
                else f"no stated default for these scores: this run keeps {choice.threshold:.4g}")
        return f"self-calibration: {found}; {then}; --threshold T sets one"

    def to_dict(self) -> dict:
        """What ``self_calibration.json`` says of the threshold (beside the pairs and images)."""
        return {"target_precision": self.target, "recall_floor": RECALL_FLOOR, "threshold": self.threshold,
                "self_calibrated_threshold": self.choice.threshold, "precision": self.choice.precision,
                "recall": self.choice.recall, "reached": self.choice.reached, "used": (
                    "self-calibrated" if self.usable else "fallback" if self.falls_back else "self-calibrated, below "
                    "the recall floor"), "fallback": None if self.fallback is None else dataclasses.asdict(
                        self.fallback), "counts": self.counts, "origin": self.origin, "warning": self.warning}


def self_threshold(pairs: list, sample: list[str], true_pairs: int, target: float,
                   fallback: Fallback | None = None, linked: int = 0) -> SelfCalibration:
    """The :class:`SelfCalibration` of the verified, labelled ``pairs`` (objects with ``kind``, ``is_copy``,
    ``score``) at ``target``: pairs of the kind :data:`~copynce_hf.calibration.synthetic.PAIRED` count as neither
    copies nor non-copies; the recall counts ``true_pairs``."""
    labelled = [p for p in pairs if p.kind != PAIRED]
    choice = choose_threshold([p.is_copy for p in labelled], [p.score for p in labelled], 1.0, target, true_pairs)
    return SelfCalibration(pairs, sample, true_pairs, target, choice, fallback, linked)
