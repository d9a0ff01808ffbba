"""What a run's scores mean, said where they are printed (copynce_hf/calibration/meaning.py): the model cards'
thresholds as read from the cards, the one line each case prints, ``scores.json``, and the Space's verdict."""

from __future__ import annotations

import json
import re

import pytest

from copynce_hf.calibration.meaning import (
    MATCHER_SCORE,
    CardThreshold,
    ScoreMeaning,
    card_threshold,
    dedup_score,
    detect_score,
    match_score,
    search_score,
)
from copynce_hf.retrieval.deduplication.settings import DedupSettings
from copynce_hf.retrieval.detection.config import DetectConfig
from copynce_hf.runtime.loading import DEFAULTS


def _card_table_value(kind: str) -> float:
    """The threshold row of the embedded model's card as its Markdown table shows it (4 decimals), read as text."""
    text = (DEFAULTS[kind] / "README.md").read_text(encoding="utf-8")
    return float(re.search(r"\| Score threshold at 90% precision \| ([0-9.]+) \|", text).group(1))


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_card_threshold_is_the_embedded_cards_mini_disc_row(kind):
    card = card_threshold(None, kind)
    assert card.task == "mini-DISC"
    assert round(card.threshold, 4) == _card_table_value(kind)
    assert card_threshold(DEFAULTS[kind], kind) == card  # the folder named explicitly: the same card


def test_card_threshold_is_none_without_a_card_or_its_row(tmp_path):
    assert card_threshold(tmp_path, "matcher") is None  # no README.md
    (tmp_path / "README.md").write_text("---\nlicense: mit\n---\n# a model without results\n", encoding="utf-8")
    assert card_threshold(tmp_path, "matcher") is None
    assert card_threshold("nobody/no-such-model", "matcher") is None  # a Hub id not in the cache: nothing fetched


def test_an_uncalibrated_line_says_that_no_threshold_decides_and_names_the_card():
    meaning = ScoreMeaning(MATCHER_SCORE, "m", card=CardThreshold(0.97583, "mini-DISC"))
    line = meaning.line()
    assert line.startswith("scores: the matcher's copy probability (sigmoid of its logit) (m); uncalibrated, no "
                           "threshold decides")
    assert "not the chance that a pair is a copy" in line and "look-alike images can score as high as copies" in line
    assert "its model card puts precision 0.9 on mini-DISC at 0.9758, on other images" in line
    assert "`copynce calibrate`, then `copynce detect --calibration`" in line
    assert "model card" not in ScoreMeaning("the descriptor's cosine", "d").line()


def test_a_calibrated_line_states_the_threshold_its_source_precision_and_recall():
    line = ScoreMeaning(MATCHER_SCORE, "m", 0.98412, "cal.json (`copynce calibrate`)", 0.9, 0.48).line()
    assert ("threshold 0.9841 (cal.json (`copynce calibrate`): precision 0.9, recall 0.480 there): a pair scored at or "
            "above it is decided a copy; about 90% of those pairs are copies") in line
    given = ScoreMeaning("the descriptor's cosine", "d", 0.3, "given with --threshold", decides="joined").line()
    assert given.endswith("threshold 0.3 (given with --threshold, not calibrated): a pair scored at or above it is "
                          "joined")


def test_scores_json_holds_every_field_and_the_line(tmp_path):
    meaning = ScoreMeaning(MATCHER_SCORE, "m", 0.98, "cal.json", 0.9, 0.5, card=CardThreshold(0.9758, "mini-DISC"))
    written = json.loads(meaning.save(tmp_path / "scores.json").read_text(encoding="utf-8"))
    assert written == {"format": "copynce-scores", "score": MATCHER_SCORE, "model": "m", "threshold": 0.98,
                       "source": "cal.json", "precision": 0.9, "recall": 0.5, "decides": "decided a copy",
                       "card": {"threshold_at_p90": 0.9758, "task": "mini-DISC"}, "meaning": meaning.line()}


def test_each_pipeline_names_its_score():
    fast, plain = DetectConfig.from_preset("fast"), DetectConfig(content_tokens=False, query_crops=False)
    assert detect_score(fast, 1, True, False) == MATCHER_SCORE + ", the highest over the views of a pair scored"
    assert detect_score(plain, 1, True, False) == MATCHER_SCORE
    assert detect_score(plain, 1, False, False) == "the descriptor's cosine"
    weighed = DetectConfig.from_preset("fast", descriptor_weight=20.0)
    assert detect_score(weighed, 2, True, False) == (
        "the matcher's logit (of its copy probability, the highest over the views of a pair scored) plus 20 x the "
        "descriptors' mean cosine of the two whole images less the reference's background (--descriptor-weight: a "
        "score in logits, not a probability)")
    assert detect_score(weighed, 1, False, False) == "the descriptor's cosine"  # no matcher: the weight has no say
    assert detect_score(plain, 2, False, True) == ("the best cosine of the descriptors, less 1 x the query's mean "
                                                   "cosine to its auxiliary neighbours of ranks 0-9 (score "
                                                   "normalisation)")
    assert "collection normalisation" in dedup_score(DedupSettings(), True)
    assert "raw_score is the cosine" in dedup_score(DedupSettings(), False)
    assert dedup_score(DedupSettings(matcher_normalisation=False), True) == MATCHER_SCORE
    assert search_score(False, False, False) == "the descriptor's cosine"
    assert "feature stretching" in search_score(False, True, False)
    assert match_score(False, True) == "the descriptor's cosine, the highest over the view pairs scored"


def test_the_space_verdict_weighs_a_probability_against_the_card_never_as_a_decision():
    from copynce_hf.demo.interactive import verdict

    card = CardThreshold(0.9758, "mini-DISC")
    assert verdict(0.3, card) == "likely not a copy"
    assert verdict(0.9, card) == "uncertain (below the model card's threshold for precision 0.9 on mini-DISC, 0.976)"
    assert verdict(0.99, card).startswith("likely a copy (at or above the model card's threshold")
    assert "look-alike images can score as high as copies" in verdict(0.99, card)
    assert verdict(0.9, None).startswith("likely a copy (uncalibrated")

