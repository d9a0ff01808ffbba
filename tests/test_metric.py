"""Tests of the copy-detection metric (core functions, evaluate module) and the PR-curve plot."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from copynce_hf.metrics import COPY_DETECTION_METRIC_PATH
from copynce_hf.metrics.copy_detection import formulas
from copynce_hf.metrics.copy_detection.formulas import (
    NOT_FOUND,
    copy_detection_metrics,
    precision_recall_curve,
    read_ground_truth_csv,
    true_match_ranks,
)
from copynce_hf.metrics.plots import save_pr_curves


def _columns(rows):
    """[(query, reference, score), ...] -> three lists."""
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


# ----------------------------------------------------------------- brute force from the formulas


def brute_force_metrics(rows, gt: dict[str, list[str]]) -> dict:
    """Slow reference written directly from the DISC21 definitions, with exact fractions.

    muAP and mAP walk the ranks of an explicit pessimistic sort (Python ``sorted``); RP90 and
    its threshold loop over the distinct score thresholds; ranks count predictions per query.
    """
    gt_pairs = {(q, r) for q, refs in gt.items() for r in refs}
    n_gt = len(gt_pairs)

    def ap(preds, n_positives):
        ranked = sorted(preds, key=lambda p: (-p[2], (p[0], p[1]) in gt_pairs))  # negatives first on ties
        tp, total = 0, Fraction(0)
        for n, p in enumerate(ranked, start=1):
            if (p[0], p[1]) in gt_pairs:
                tp += 1
                total += Fraction(tp, n) * Fraction(1, n_positives)  # recall increment x precision
        return total

    micro = ap(rows, n_gt)

    best_recall, best_threshold = Fraction(0), None
    for t in sorted({p[2] for p in rows}, reverse=True):
        kept = [p for p in rows if p[2] >= t]
        tp = sum((p[0], p[1]) in gt_pairs for p in kept)
        precision, recall = Fraction(tp, len(kept)), Fraction(tp, n_gt)
        if precision >= Fraction(9, 10) and recall > best_recall:
            best_recall, best_threshold = recall, t

    ranks = []
    for q, r in gt_pairs:
        match = [p for p in rows if p[0] == q and p[1] == r]
        if not match:
            ranks.append(NOT_FOUND)
            continue
        ranks.append(sum(1 for p in rows if p[0] == q and p[2] >= match[0][2]) - 1)

    with_copy = [q for q, refs in gt.items() if refs]
    per_query = [ap([p for p in rows if p[0] == q], len(gt[q])) for q in with_copy]
    return {
        "micro_ap": float(micro),
        "recall_at_p90": float(best_recall),
        "threshold_at_p90": best_threshold,
        "recall_at_rank1": sum(r < 1 for r in ranks) / n_gt,
        "recall_at_rank10": sum(r < 10 for r in ranks) / n_gt,
        "mean_ap": float(sum(per_query) / len(with_copy)),
    }


def random_case(seed: int, num_queries=40, num_refs=25, per_query=12):
    """Random predictions with many ties (scores rounded to 0.05), and a ground truth with
    distractors, queries with two copies, and copies that were never predicted."""
    rng = np.random.default_rng(seed)
    gt: dict[str, list[str]] = {}
    rows = []
    for qi in range(num_queries):
        q = f"Q{qi:03d}"
        kind = rng.random()
        copies = [] if kind < 0.3 else list(rng.choice(num_refs, size=1 + (kind > 0.85), replace=False))
        gt[q] = [f"R{c:03d}" for c in copies]
        if rng.random() < 0.1:
            continue  # a query with no prediction at all
        candidates = rng.choice(num_refs, size=per_query, replace=False)
        for c in candidates:
            copy = f"R{c:03d}" in gt[q]
            score = rng.normal(0.55 if copy else 0.4, 0.15)
            rows.append((q, f"R{c:03d}", round(float(score) * 20) / 20))
    rng.shuffle(rows)
    return [tuple(r) for r in rows], gt


# ----------------------------------------------------------------- hand-computed cases


def test_hand_computed_case_with_a_tie_counts_the_negative_first():
    gt = {"q1": ["r1"], "q2": ["r2"], "q3": ["r3"], "q4": []}
    rows = [
        ("q3", "r3", 0.4),  # positive
        ("q1", "r1", 0.9),  # positive
        ("q2", "r5", 0.7),  # negative, tied with the positive below
        ("q4", "r9", 0.8),  # distractor query: negative
        ("q2", "r2", 0.7),  # positive
        ("q3", "r7", 0.5),  # negative
    ]
    # Pessimistic order: P(.9) N(.8) N(.7) P(.7) N(.5) P(.4)
    # precision 1, 1/2, 1/3, 1/2, 2/5, 1/2 ; recall 1/3, 1/3, 1/3, 2/3, 2/3, 1
    results = copy_detection_metrics(*_columns(rows), gt)
    assert results["micro_ap"] == pytest.approx(1 / 3 * (1 + 1 / 2 + 1 / 2))  # 2/3, not 13/18 (optimistic)
    assert results["recall_at_p90"] == pytest.approx(1 / 3)
    assert results["threshold_at_p90"] == pytest.approx(0.9)
    # Ranks: q1 -> 0; q2 -> 1 (the tied negative counts before it); q3 -> 1.
    assert results["recall_at_rank1"] == pytest.approx(1 / 3)
    assert results["recall_at_rank10"] == pytest.approx(1.0)
    # Per-query AP: q1 = 1, q2 = 1/2 (tie), q3 = 1/2.
    assert results["mean_ap"] == pytest.approx(2 / 3)
    assert results["num_predictions"] == 6
    assert results["num_ground_truth_pairs"] == 3
    assert results["num_queries_with_copy"] == 3

    precision, recall, thresholds = precision_recall_curve(*_columns(rows), gt)
    np.testing.assert_allclose(precision, [1, 1 / 2, 1 / 3, 1 / 2, 2 / 5, 1 / 2])
    np.testing.assert_allclose(recall, [1 / 3, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1])
    np.testing.assert_allclose(thresholds, [0.9, 0.8, 0.7, 0.7, 0.5, 0.4])


def test_rp90_picks_the_highest_recall_at_precision_090_and_unretrieved_pairs_cap_recall():
    # 12 ground-truth pairs, 11 of them predicted; ranks P x9, N, P, N, P (distinct scores).
    gt = {f"q{i}": [f"r{i}"] for i in range(12)}
    labels = [True] * 9 + [False, True, False, True]
    rows, next_copy = [], 0
    for n, is_copy in enumerate(labels):
        score = 1.0 - 0.01 * n
        if is_copy:
            rows.append((f"q{next_copy}", f"r{next_copy}", score))
            next_copy += 1
        else:
            rows.append(("qx", f"x{n}", score))
    results = copy_detection_metrics(*_columns(rows), gt)
    # precision: ranks 1..9 -> 1, rank 10 -> 0.9, rank 11 -> 10/11, rank 12 -> 10/12, rank 13 -> 11/13
    assert results["recall_at_p90"] == pytest.approx(10 / 12)
    assert results["threshold_at_p90"] == pytest.approx(1.0 - 0.01 * 10)
    assert results["micro_ap"] == pytest.approx((9 + 10 / 11 + 11 / 13) / 12)
    assert results["recall_at_rank1"] == pytest.approx(11 / 12)  # q11 has no prediction


def test_precision_of_exactly_090_is_an_operating_point():
    gt = {f"q{i}": [f"r{i}"] for i in range(10)}
    rows = [(f"q{i}", f"r{i}", 1.0 - 0.01 * i) for i in range(8)] + [("qx", "x", 0.5), ("q8", "r8", 0.4)]
    results = copy_detection_metrics(*_columns(rows), gt)  # rank 10: precision 9/10, recall 9/10
    assert results["recall_at_p90"] == pytest.approx(0.9)
    assert results["threshold_at_p90"] == pytest.approx(0.4)


def test_precision_never_reaching_090_gives_no_threshold():
    gt = {"q1": ["r1"], "q2": ["r2"]}
    rows = [("q1", "x", 0.9), ("q1", "r1", 0.8), ("q2", "y", 0.7), ("q2", "r2", 0.6)]
    results = copy_detection_metrics(*_columns(rows), gt)
    assert results["recall_at_p90"] == 0.0
    assert results["threshold_at_p90"] is None
    assert results["micro_ap"] == pytest.approx(0.5 * (1 / 2 + 2 / 4))


def test_recall_at_rank_counts_other_true_matches_and_ties_against_a_pair():
    gt = {"q": ["a", "b"], "p": ["c"], "t": ["d", "e"]}
    rows = [("q", "a", 0.9), ("q", "b", 0.8), ("q", "z", 0.8), ("p", "c", 0.5), ("p", "y", 0.5)]
    ranks = dict(zip(formulas.ground_truth_pairs(gt), true_match_ranks(*_columns(rows), gt)))
    assert ranks == {
        ("p", "c"): 1,
        ("q", "a"): 0,
        ("q", "b"): 2,
        ("t", "d"): NOT_FOUND,
        ("t", "e"): NOT_FOUND,
    }
    # two true matches tied: each counts the other as ranked before it
    tied = [("t", "d", 0.7), ("t", "e", 0.7)]
    assert list(true_match_ranks(*_columns(rows + tied), gt))[-2:] == [1, 1]
    gt = {"q": ["a", "b"], "p": ["c"]}
    results = copy_detection_metrics(*_columns(rows), gt)
    assert results["recall_at_rank1"] == pytest.approx(1 / 3)
    assert results["recall_at_rank10"] == pytest.approx(1.0)
    # mAP: q: P(.9) N(.8) P(.8) -> (1 + 2/3) / 2; p: N P -> 1/2.
    assert results["mean_ap"] == pytest.approx(((1 + 2 / 3) / 2 + 1 / 2) / 2)


def test_paper_example_map_is_perfect_but_muap_is_not():
    """Paper, supplementary figure mAP_vs_uAP: every query ranks its true match first, but the
    scores of different queries live on different scales, so no single threshold separates
    copies from non-copies."""
    gt = {"q1": ["r1"], "q2": ["r2"], "q3": ["r3"]}
    rows = [
        ("q1", "r1", 0.9), ("q1", "n1", 0.8),
        ("q2", "r2", 0.5), ("q2", "n2", 0.4),
        ("q3", "r3", 0.3), ("q3", "n3", 0.2),
    ]  # fmt: skip
    results = copy_detection_metrics(*_columns(rows), gt)
    assert results["mean_ap"] == 1.0
    assert results["recall_at_rank1"] == 1.0
    # pooled: P N P N P N -> precision at the positives 1, 2/3, 3/5
    assert results["micro_ap"] == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)
    assert results["micro_ap"] < 0.76
    assert results["recall_at_p90"] == pytest.approx(1 / 3)


def test_queries_with_a_copy_and_no_prediction_count_zero_in_mean_ap():
    gt = {"q1": ["r1"], "q2": ["r2"], "d": []}
    rows = [("q1", "r1", 0.3), ("d", "r1", 0.1)]
    results = copy_detection_metrics(*_columns(rows), gt)
    assert results["mean_ap"] == pytest.approx(0.5)
    assert results["micro_ap"] == pytest.approx(0.5)
    assert results["num_queries_with_copy"] == 2


def test_empty_predictions_are_an_error():
    with pytest.raises(ValueError, match="no predictions"):
        copy_detection_metrics([], [], [], {"q1": ["r1"]})


# ----------------------------------------------------------------- bad inputs


def test_duplicate_predictions_are_an_error_naming_the_pair():
    rows = [("q1", "r1", 0.9), ("q2", "r1", 0.5), ("q1", "r1", 0.1)]
    with pytest.raises(ValueError, match=r"duplicate prediction.*'q1'.*'r1'"):
        copy_detection_metrics(*_columns(rows), {"q1": ["r1"]})


def test_nan_scores_unequal_lengths_and_empty_ground_truth_are_errors():
    with pytest.raises(ValueError, match="non-finite score.*'q2'.*NaN"):
        copy_detection_metrics(["q1", "q2"], ["r1", "r2"], [0.5, float("nan")], {"q1": ["r1"], "q2": []})
    with pytest.raises(ValueError, match="non-finite score.*'q1'.*infinite"):
        copy_detection_metrics(["q1", "q2"], ["r1", "r2"], [float("inf"), 0.5], {"q1": ["r1"], "q2": []})
    with pytest.raises(ValueError, match="one entry per prediction"):
        copy_detection_metrics(["q1", "q2"], ["r1"], [0.5, 0.4], {"q1": ["r1"]})
    with pytest.raises(ValueError, match="no copy pair"):
        copy_detection_metrics(["q1"], ["r1"], [0.5], {"q1": [], "q2": None})
    with pytest.raises(ValueError, match="more than once"):
        copy_detection_metrics(["q1"], ["r1"], [0.5], {"q1": ["r1", "r1"]})
    with pytest.raises(TypeError, match="mapping"):
        copy_detection_metrics(["q1"], ["r1"], [0.5], [("q1", "r1")])


# ----------------------------------------------------------------- ground-truth CSV


def test_ground_truth_csv_with_distractor_rows(tmp_path):
    path = tmp_path / "gt.csv"
    path.write_text("query_id,reference_id\nQ0,R5\nQ1,\nQ2,R1\nQ2,R8\n\nQ3,\n")
    assert read_ground_truth_csv(path) == {"Q0": ["R5"], "Q1": [], "Q2": ["R1", "R8"], "Q3": []}
    rows = [("Q0", "R5", 0.9), ("Q1", "R5", 0.8), ("Q2", "R8", 0.7), ("Q3", "R2", 0.6)]
    from_csv = copy_detection_metrics(*_columns(rows), str(path))
    from_dict = copy_detection_metrics(*_columns(rows), {"Q0": ["R5"], "Q2": ["R1", "R8"]})
    assert from_csv == from_dict
    assert from_csv["num_ground_truth_pairs"] == 3 and from_csv["num_queries_with_copy"] == 2
    # columns in the other order are fine
    swapped = tmp_path / "swapped.csv"
    swapped.write_text("reference_id,query_id\nR5,Q0\n,Q1\n")
    assert read_ground_truth_csv(swapped) == {"Q0": ["R5"], "Q1": []}


def test_ground_truth_csv_errors_name_the_problem(tmp_path):
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("query_id,reference_id,score\nQ0,R1,0.5\n")
    with pytest.raises(ValueError, match=r"unknown column\(s\) 'score'"):
        read_ground_truth_csv(unknown)
    headerless = tmp_path / "headerless.csv"
    headerless.write_text("Q0,R1\nQ1,R2\n")
    with pytest.raises(ValueError, match="unknown column.*'Q0'.*header"):
        copy_detection_metrics(["Q0"], ["R1"], [1.0], headerless)
    missing = tmp_path / "missing.csv"
    missing.write_text("query_id\nQ0\n")
    with pytest.raises(ValueError, match="query_id and reference_id"):
        read_ground_truth_csv(missing)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("query_id,reference_id\nQ0,R1,R2\n")
    with pytest.raises(ValueError, match="line 2: expected 2 fields"):
        read_ground_truth_csv(ragged)
    with pytest.raises(FileNotFoundError, match=r"ground-truth file '.*nowhere.csv' does not exist"):
        read_ground_truth_csv(tmp_path / "nowhere.csv")
    # the same words as a missing predictions file
    from copynce_hf.retrieval import read_predictions

    with pytest.raises(ValueError, match=r"predictions file '.*nowhere.csv' does not exist"):
        read_predictions(tmp_path / "nowhere.csv")


# ----------------------------------------------------------------- random cases vs brute force


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_core_matches_brute_force_on_random_predictions_with_ties(seed):
    rows, gt = random_case(seed)
    scores = [r[2] for r in rows]
    assert len(set(scores)) < len(scores) / 4  # plenty of ties
    results = copy_detection_metrics(*_columns(rows), gt)
    expected = brute_force_metrics(rows, gt)
    for key, value in expected.items():
        assert results[key] == pytest.approx(value, abs=1e-12), key


@pytest.fixture(scope="module")
def evaluate_metric():
    import evaluate

    return evaluate.load(COPY_DETECTION_METRIC_PATH)


@pytest.mark.slow
def test_evaluate_load_on_the_folder_matches_core_and_brute_force(evaluate_metric, tmp_path):
    rows, gt = random_case(seed=7, num_queries=60)
    queries, references, scores = _columns(rows)
    from_evaluate = evaluate_metric.compute(
        query_id=queries, reference_id=references, score=np.asarray(scores, dtype=np.float32), ground_truth=gt
    )
    # float32 scores go through the float64 feature unchanged: compare with the same values.
    from_core = copy_detection_metrics(queries, references, np.asarray(scores, dtype=np.float32), gt)
    assert from_evaluate == from_core
    expected = brute_force_metrics([(q, r, float(np.float32(s))) for q, r, s in rows], gt)
    for key, value in expected.items():
        assert from_evaluate[key] == pytest.approx(value, abs=1e-12), key

    # add_batch in several pieces + a CSV ground truth gives the same numbers
    path = tmp_path / "gt.csv"
    lines = ["query_id,reference_id"] + [f"{q},{r}" for q, refs in gt.items() for r in refs or [""]]
    path.write_text("\n".join(lines) + "\n")
    for start in range(0, len(rows), 100):
        chunk = rows[start : start + 100]
        evaluate_metric.add_batch(
            query_id=[c[0] for c in chunk], reference_id=[c[1] for c in chunk], score=[c[2] for c in chunk]
        )
    assert evaluate_metric.compute(ground_truth=str(path)) == copy_detection_metrics(
        queries, references, scores, gt
    )


@pytest.mark.slow
def test_evaluate_module_refuses_duplicates_and_missing_ground_truth(evaluate_metric):
    with pytest.raises(ValueError, match="duplicate prediction"):
        evaluate_metric.compute(
            query_id=["a", "a"], reference_id=["b", "b"], score=[0.1, 0.2], ground_truth={"a": ["b"]}
        )
    with pytest.raises(ValueError, match="needs the keyword ground_truth"):
        evaluate_metric.compute(query_id=["a"], reference_id=["b"], score=[0.1])
    with pytest.raises(ValueError, match="no predictions"):
        evaluate_metric.compute(query_id=[], reference_id=[], score=[], ground_truth={"a": ["b"]})


# ----------------------------------------------------------------- plots


def test_save_pr_curves_writes_one_png_with_every_system(tmp_path):
    rows, gt = random_case(seed=3)
    good = precision_recall_curve(*_columns(rows), gt)
    perfect_rows = [(q, r, 1.0) for q, refs in gt.items() for r in refs]
    perfect = precision_recall_curve(*_columns(perfect_rows), gt)
    path = save_pr_curves(
        {"random": good[:2], "perfect": perfect, "nothing": (np.array([]), np.array([]))},
        tmp_path / "plots" / "pr.png",
        title="test",
    )
    assert path.exists()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (960, 720)
        pixels = np.asarray(image.convert("RGB")).astype(int)
    # the two line colours of matplotlib's default cycle (C0 blue, C1 orange) are both drawn
    blue = np.all(np.abs(pixels - [31, 119, 180]) < 8, axis=-1).sum()
    orange = np.all(np.abs(pixels - [255, 127, 14]) < 8, axis=-1).sum()
    assert blue > 200 and orange > 200
    with pytest.raises(ValueError, match="at least one curve"):
        save_pr_curves({}, tmp_path / "empty.png")
    with pytest.raises(ValueError, match="'bad'"):
        save_pr_curves({"bad": (np.zeros(3), np.zeros(4))}, tmp_path / "bad.png")


def test_space_app_scores_uploaded_predictions_and_ground_truth(tmp_path):
    import importlib.util
    from pathlib import Path

    folder = Path(COPY_DETECTION_METRIC_PATH)
    spec = importlib.util.spec_from_file_location("copy_detection_space_app", folder / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)  # gradio is imported only when the interface is built
    predictions = tmp_path / "predictions.csv"
    predictions.write_text("query_id,reference_id,score\nq1,r1,0.9\nq2,r2,0.5\nq2,x,0.5\n")
    ground_truth = tmp_path / "ground_truth.csv"
    ground_truth.write_text("query_id,reference_id\nq1,r1\nq2,r2\nq3,\n")
    results = app.compute_from_files(predictions, ground_truth)
    # The README's worked example: muAP = (1 + 2/3) / 2, q2's tie counts against its rank.
    assert results["micro_ap"] == pytest.approx((1 + 2 / 3) / 2)
    assert results["recall_at_rank1"] == pytest.approx(0.5) and results["num_predictions"] == 3
    bad = tmp_path / "bad.csv"
    bad.write_text("query_id,reference_id,score\nq1,r1,high\n")
    with pytest.raises(ValueError, match="line 2: score 'high'"):
        app.compute_from_files(bad, ground_truth)
    requirements = (folder / "requirements.txt").read_text().split()
    assert any(line.startswith("evaluate") for line in requirements)


# ----------------------------------------------------------------- ids that do not match


def test_ids_that_never_match_the_ground_truth_are_an_error_with_the_fix():
    truth = {"q00": ["r00"], "q01": ["r01"], "q02": []}
    with pytest.raises(ValueError, match=r"'q00.jpg'.*ground truth 'q00'.*strip the file extensions"):
        copy_detection_metrics(["q00.jpg", "q01.jpg"], ["r00", "r01"], [0.9, 0.8], truth)
    with pytest.raises(ValueError, match=r"letter case"):
        copy_detection_metrics(["Q00", "Q01"], ["r00", "r01"], [0.9, 0.8], truth)
    with pytest.raises(ValueError, match=r"reference ids.*'r00.png'.*strip the file extensions"):
        copy_detection_metrics(["q00", "q01"], ["r00.png", "r01.png"], [0.9, 0.8], truth)
    with pytest.raises(ValueError, match=r"predicted 'a'.*ground truth 'q00'"):
        copy_detection_metrics(["a", "b"], ["r00", "r01"], [0.9, 0.8], truth)


def test_a_partial_id_overlap_is_a_warning_with_counts():
    truth = {"q00": ["r00"], "q01": ["r01"], "q02": ["r02"]}
    with pytest.warns(UserWarning, match="1 of the 3 predicted query ids are not in the ground truth"):
        results = copy_detection_metrics(["q00", "q01", "zz"], ["r00", "r01", "r02"], [0.9, 0.8, 0.7], truth)
    assert results["num_predictions"] == 3


def test_figures_with_cjk_ids_save_without_a_warning_per_character(tmp_path, caplog):
    """Ids in any script: no matplotlib glyph warning (with its source line) per character; where no installed
    font has the characters, one log line says they are drawn as boxes."""
    import warnings

    from matplotlib.figure import Figure

    from copynce_hf.metrics.plots import _fallback_fonts, save_figure

    figure = Figure(figsize=(2, 1))
    figure.suptitle("查询图片 / 参考图片")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_figure(figure, tmp_path / "ids.png")
    assert (tmp_path / "ids.png").stat().st_size > 0
    boxes = [record for record in caplog.records if "drawn as boxes" in record.getMessage()]
    assert len(boxes) == (0 if _fallback_fonts() else 1)
