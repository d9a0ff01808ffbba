"""``copynce dedup``: self-search, matcher verification and groups of copies, on tiny random models (the
mechanics) and on planted copies with the embedded models (pair precision and recall)."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from conftest import TINY_VIT, run_cli, save_tiny_models, tiny_models
from PIL import Image

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval import (
    CollectionNormalisation,
    DedupSettings,
    Descriptor,
    DescriptorIndex,
    DescriptorSet,
    DetectConfig,
    ImageFolderSource,
    ViewPreset,
    connected_groups,
    connected_members,
    dedup,
    group_members,
    matcher_backgrounds,
    normalised_probability,
    pair_precision_recall,
    representative_groups,
    self_search_pairs,
)


def test_connected_groups_are_components_in_collection_order():
    ids = ["a", "b", "c", "d", "e", "f"]
    groups = connected_groups(ids, [("e", "c"), ("d", "b"), ("c", "a"), ("f", "f")])
    assert groups == [["a", "c", "e"], ["b", "d"]]  # f alone is no group
    assert connected_groups(ids, []) == []
    assert pair_precision_recall([["a", "c", "e"]], [["a", "c"], ["e", "f"]]) == (pytest.approx(1 / 3), 0.5)
    assert pair_precision_recall([], [["a", "b"]]) == (1.0, 0.0)


# --------------------------------------------------------------------------- grouping that does not chain


def test_a_weak_link_does_not_chain_two_images_into_one_group():
    """A-B 0.9, B-C 0.9, A-C 0.1 at threshold 0.5: C reaches A's group only through B; its own pair with the
    representative A fails, so it stays out. Connected components chain it in."""
    ids = ["A", "B", "C"]
    scores = {("A", "B"): 0.9, ("B", "C"): 0.9, ("A", "C"): 0.1}
    groups = representative_groups(ids, scores, 0.5)
    assert [[m.image_id for m in group] for group in groups] == [["A", "B"]]
    assert [(m.joined_by, m.score_to_first, m.rule) for m in groups[0]] == [(None, None, "first"),
                                                                           ("A", 0.9, "representative")]
    chained = connected_members(ids, scores, 0.5)
    assert [[m.image_id for m in group] for group in chained] == [["A", "B", "C"]]
    assert [(m.joined_by, m.score_to_first, m.rule) for m in chained[0][1:]] == [("A", 0.9, "connected"),
                                                                                 ("B", 0.1, "connected")]
    assert group_members(ids, scores, 0.5, "connected") == chained
    # the A-C pair was never verified: it is scored on demand, and decides the same way
    asked: list[list[tuple[str, str]]] = []

    def score_missing(pairs):
        asked.append(pairs)
        return [scores[pair] for pair in pairs]

    unverified = {("A", "B"): 0.9, ("B", "C"): 0.9}
    assert representative_groups(ids, unverified, 0.5, score_missing) == groups
    assert asked == [[("A", "C")]]
    # without a way to score it, an unscored pair does not clear the threshold
    assert [[m.image_id for m in g] for g in representative_groups(ids, unverified, 0.5)] == [["A", "B"]]
    with pytest.raises(ConfigError, match="grouping must be one of representative, connected"):
        group_members(ids, scores, 0.5, "majority")


def test_two_groups_merge_only_when_their_representatives_pair_clears_the_threshold():
    ids = ["A", "B", "C", "D"]
    scores = {("A", "B"): 0.95, ("C", "D"): 0.9, ("B", "C"): 0.8, ("A", "C"): 0.2, ("A", "D"): 0.7}
    apart = representative_groups(ids, scores, 0.5)
    assert [[m.image_id for m in group] for group in apart] == [["A", "B"], ["C", "D"]]
    merged = representative_groups(ids, {**scores, ("A", "C"): 0.6}, 0.5)
    assert [[m.image_id for m in group] for group in merged] == [["A", "B", "C", "D"]]
    # C came as the representative of its group (joined through A, the pair of the two representatives), D with
    # it (still joined through C), scored to its new first member
    assert [(m.image_id, m.joined_by, m.joined_score, m.rule, m.score_to_first) for m in merged[0]] == [
        ("A", None, None, "first", None), ("B", "A", 0.95, "representative", 0.95),
        ("C", "A", 0.6, "merge", 0.6), ("D", "C", 0.9, "merge", 0.7)]


# --------------------------------------------------------------------------- collection normalisation


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_collection_normalisation_discounts_pairs_of_images_similar_to_many_others():
    """12 images sharing a template (cosine about 0.95 between any two), two isolated near-duplicates (0.9 to each
    other, about 0 to everything else) and 16 unrelated images: by cosine the template's pairs come first, by the
    normalised score the near-duplicates do, and every score is the cosine less the mean of the two images'
    mean cosines to their neighbours of ranks 2..9."""
    rng = np.random.default_rng(0)
    dim = 64
    template = rng.normal(size=dim)
    vectors = [3 * template + rng.normal(size=dim) * 0.5 for _ in range(12)]
    original = rng.normal(size=dim)
    vectors += [original, original + rng.normal(size=dim) * 0.45]
    vectors += [rng.normal(size=dim) for _ in range(16)]
    ids = [f"t{i}" for i in range(12)] + ["dup_a", "dup_b"] + [f"u{i}" for i in range(16)]
    descriptors = DescriptorSet(ids, _unit(np.array(vectors)))
    index = DescriptorIndex.build(descriptors)
    order = {image_id: i for i, image_id in enumerate(ids)}
    raw = self_search_pairs(index, descriptors, ViewPreset("none"), 3, order)
    normalised = self_search_pairs(index, descriptors, ViewPreset("none"), 3, order, ranks=(2, 9))
    top_raw, top_normalised = (max(found.pairs, key=lambda p: p.score) for found in (raw, normalised))
    assert top_raw.query_id.startswith("t") and top_raw.reference_id.startswith("t")
    assert (top_normalised.query_id, top_normalised.reference_id) == ("dup_a", "dup_b")
    cosine = descriptors.descriptors @ descriptors.descriptors.T
    assert cosine[order["dup_a"], order["dup_b"]] < cosine[order[top_raw.query_id], order[top_raw.reference_id]]
    # the exact scores: cosine - (bg(a) + bg(b)) / 2, bg the mean of ranks 2..9 among the other images
    others = np.where(np.eye(len(ids), dtype=bool), -np.inf, cosine)
    background = -np.sort(-others, axis=1)[:, 2:10].mean(axis=1)
    assert normalised.background == pytest.approx(dict(zip(ids, background.tolist())), abs=1e-5)
    for p in normalised.pairs:
        a, b = order[p.query_id], order[p.reference_id]
        assert p.score == pytest.approx(cosine[a, b] - (background[a] + background[b]) / 2, abs=1e-5)
        assert normalised.raw[(p.query_id, p.reference_id)] == pytest.approx(cosine[a, b], abs=1e-5)
    assert {(p.query_id, p.reference_id, p.score) for p in raw.pairs} == {(a, b, s) for (a, b), s in raw.raw.items()}
    assert raw.background == {}


def test_matcher_normalisation_discounts_a_template_and_leaves_other_images_alone():
    """``t0`` and ``t1`` sit in a template: the matcher scores them 0.999 with each of four template-mates; ``c0``
    and ``c1`` are a copy (0.9999) whose other candidates are non-copies (0.01)."""
    pairs = [("t0", "t1", 0.999)] + [(t, f"m{i}", 0.999) for t in ("t0", "t1") for i in range(4)]
    pairs += [("c0", "c1", 0.9999)] + [(c, f"x{i}", 0.01) for c in ("c0", "c1") for i in range(4)]
    background = matcher_backgrounds(pairs, 1, 9)
    logit = np.log(0.999 / 0.001)
    assert background["t0"] == pytest.approx(logit) and background["c0"] == pytest.approx(np.log(0.01 / 0.99))
    # a background below the anchor (logit 0) discounts nothing: the probability is unchanged, exactly
    assert normalised_probability(0.9999, background["c0"], background["c1"]) == 0.9999
    assert normalised_probability(0.01, background["c0"], None) == 0.01
    # the template pair loses the template's logit: sigmoid(logit - logit) = 0.5, below the copy's
    assert normalised_probability(0.999, background["t0"], background["t1"]) == pytest.approx(0.5)
    assert normalised_probability(0.999, background["t0"], background["t1"], alpha=0.5) == pytest.approx(
        1 / (1 + np.exp(-logit / 2)))
    # an anchor above the template's logit leaves it alone
    assert normalised_probability(0.999, background["t0"], background["t1"], anchor=8.0) == 0.999


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """8 random images, of which R1 is copied byte for byte twice (R1_again, R1_third); the tiny random
    descriptor gives any two of these images a cosine above 0.97, identical files 1."""
    folder = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"R{i}.png")
    shutil.copy(folder / "R1.png", folder / "R1_again.png")
    shutil.copy(folder / "R1.png", folder / "R1_third.png")
    return folder


@pytest.mark.parametrize("with_matcher", [False, True])
def test_identical_images_form_one_group_and_no_image_is_its_own_pair(collection, tmp_path, with_matcher):
    descriptor, matcher, processor = tiny_models(0)
    source = ImageFolderSource(collection)
    lines: list[str] = []
    # raw cosines decide without matcher (collection normalisation off: this checks the self-search's mechanics)
    config = DetectConfig(candidates=9 if with_matcher else 1)
    settings = DedupSettings(collection=CollectionNormalisation(on=with_matcher))
    result = dedup(source, Descriptor("tiny", descriptor, processor), (matcher, processor) if with_matcher else None,
                   threshold=0.9999 if not with_matcher else 0.0, config=config, settings=settings,
                   index_folder=tmp_path / "idx", progress=False, log=lines.append)
    order = {image_id: i for i, image_id in enumerate(source.ids)}
    assert result.pairs and all(order[p.query_id] < order[p.reference_id] for p in result.pairs)  # never (x, x)
    assert len({(p.query_id, p.reference_id) for p in result.pairs}) == len(result.pairs)
    if with_matcher:
        # a threshold of 0 joins every verified pair: every image is in the one group, whose first member (its
        # representative) is the earlier image of the best pair, each other member scored to it
        best = max(result.pairs, key=lambda p: (p.score, -order[p.query_id], -order[p.reference_id]))
        assert len(result.groups) == 1 and result.groups[0][0] == (best.query_id, None)
        assert sorted(image for image, _ in result.groups[0]) == sorted(source.ids)
        assert all(0 <= s <= 1 for _, s in result.groups[0][1:])
        assert result.matcher_cost["fused_pairs"] >= len(result.pairs)
        # matcher normalisation (on by default): each decision is the raw probability less the two images'
        # backgrounds over their verified pairs of ranks 2..9
        background = matcher_backgrounds([(a, b, s) for (a, b), s in result.raw_scores.items()], 2, 9)
        assert result.backgrounds["matcher"] == background and len(background) == len(source.ids)
        for p in result.pairs:
            assert p.score == normalised_probability(result.raw_scores[(p.query_id, p.reference_id)],
                                                     background[p.query_id], background[p.reference_id])
    else:
        # the three identical files, scored 1 to the first (a member found only through another is scored too)
        assert [[image for image, _ in group] for group in result.groups] == [["R1", "R1_again", "R1_third"]]
        assert [score for _, score in result.groups[0][1:]] == [pytest.approx(1.0, abs=1e-5)] * 2
    assert any("candidate pairs among 10 images" in line for line in lines)
    assert (tmp_path / "idx" / "tiny" / "references" / "identity.json").is_file()  # detect's index cache


def test_the_matcher_scores_each_pair_in_both_orders_and_the_mean_logit_decides(collection):
    import torch

    from copynce_hf import CopyNCEMatcherConfig, CopyNCEMatcherModel
    from copynce_hf.retrieval.deduplication.settings import order_dependent
    from copynce_hf.retrieval.search.background import mean_logit_probability, probability_logit

    descriptor, symmetric, processor = tiny_models(0)
    torch.manual_seed(1)  # the form with segment embeddings (the embedded matcher's), made order-dependent
    matcher = CopyNCEMatcherModel(CopyNCEMatcherConfig(num_fusion_layers=1, segment_embeddings=True,
                                                       keep_image_cls_tokens=False, **TINY_VIT)).eval()
    with torch.no_grad():
        matcher.segment_embeddings.normal_(0.0, 1.0)
    assert order_dependent(matcher) and not order_dependent(symmetric)

    def raw_scores(source, orders, model=matcher):
        # every pair a candidate (10 images, 9 each: the identical files tie, no tie decides which pairs are verified);
        # threshold 1: no group, so no member is scored against its group's first outside the candidates
        result = dedup(source, Descriptor("tiny", descriptor, processor), (model, processor), threshold=1.0,
                       config=DetectConfig(candidates=9),
                       settings=DedupSettings(matcher_orders=orders, layout_crops=False),  # whole images only
                       progress=False)
        return result.raw_scores, result.matcher_cost["fused_pairs"]

    forward = ImageFolderSource(collection)
    backward = ImageFolderSource(collection)  # the same images, the collection's order reversed
    backward.files, backward.ids = backward.files[::-1], backward.ids[::-1]
    both, both_passes = raw_scores(forward, "both")
    earlier_first, one_passes = raw_scores(forward, "one")
    later_first, _ = raw_scores(backward, "one")
    assert len(both) == 45 and set(both) == set(earlier_first) and both_passes == 2 * one_passes == 2 * len(both)
    # the earlier image is the query in `earlier_first`, the later one in `later_first` (its pairs reversed)
    assert {(b, a) for a, b in later_first} == set(both)
    for (a, b), score in both.items():
        assert score == pytest.approx(mean_logit_probability(earlier_first[(a, b)], later_first[(b, a)]), rel=1e-4)
    asymmetric = [abs(probability_logit(earlier_first[(a, b)]) - probability_logit(later_first[(b, a)]))
                  for a, b in both]
    assert max(asymmetric) > 1e-3  # this matcher is not symmetric: the two orders differ
    assert raw_scores(forward, "auto") == (both, both_passes)  # auto: both orders for this matcher
    # the authors' form gives one score whatever the order: auto scores each pair once
    once, once_passes = raw_scores(forward, "auto", symmetric)
    assert once_passes == len(once)
    assert once == pytest.approx(raw_scores(forward, "both", symmetric)[0], rel=1e-5)
    assert mean_logit_probability(0.9, 0.1) == pytest.approx(0.5)
    assert mean_logit_probability(0.99, 0.5) == pytest.approx(1 / (1 + 99 ** -0.5))
    with pytest.raises(ConfigError, match="matcher_orders must be one of auto, both, one, got 'three'"):
        DedupSettings(matcher_orders="three")


def test_copynce_dedup_writes_groups_pairs_and_gallery(collection, tmp_path, capsys):
    models = save_tiny_models(tmp_path / "models", seed=0)
    output = tmp_path / "found"
    code, out, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                         "--threshold", 0.9999, "--candidates", 2, "--collection-normalisation", "off",
                         "--output", output)
    assert code == 0, err
    assert "wrote 1 groups of copies (3 images)" in out and "dedup: read 10 images, skipped 0" in out
    meaning = json.loads((output / "scores.json").read_text())
    assert meaning["score"] == "the descriptor's cosine" and meaning["source"] == "given with --threshold"
    assert meaning["threshold"] == 0.9999 and meaning["precision"] is None
    assert meaning["meaning"] in out and "(given with --threshold, not calibrated)" in meaning["meaning"]
    with (output / "groups.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["group_id", "image_id", "score_to_first", "joined_by", "joined_score", "rule"]
    assert [row[:2] for row in rows[1:]] == [["0", "R1"], ["0", "R1_again"], ["0", "R1_third"]]
    assert rows[1][2:] == ["", "", "", "first"] and float(rows[2][2]) == pytest.approx(1.0, abs=1e-5)
    # each other member joined R1 directly (its pair with the first member cleared the threshold)
    assert [(row[3], row[5]) for row in rows[2:]] == [("R1", "representative")] * 2
    assert float(rows[3][4]) == pytest.approx(1.0, abs=1e-5)
    with (output / "pairs.csv").open(newline="") as handle:
        pairs = list(csv.DictReader(handle))
    assert list(pairs[0]) == ["query_id", "reference_id", "score", "raw_score", "views"]
    assert all(row["score"] == row["raw_score"] for row in pairs)  # without normalisation the cosine decides
    code, _, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                           "--threshold", 0.9999, "--candidates", 2, "--collection-normalisation", "off",
                           "--grouping", "connected", "--output", tmp_path / "connected")
    assert code == 0, err
    with (tmp_path / "connected" / "groups.csv").open(newline="") as handle:
        assert [row[5] for row in csv.reader(handle)][1:] == ["first", "connected", "connected"]
    report = (output / "report.html").read_text()
    assert "Group 0: 3 images" in report and "R1_again" in report

    code, out, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                             "--output", tmp_path / "x")
    assert code == 0 and "self-calibrated on 10 images" in (tmp_path / "x" / "report.html").read_text(), err
    meaning = json.loads((tmp_path / "x" / "scores.json").read_text())
    assert meaning["source"] == "self-calibrated on copies of this collection's own images" and meaning["meaning"] in out
    assert "raw_score is the cosine itself" in meaning["score"] and meaning["precision"] is not None
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(collection / "R0.png", single / "R0.png")
    code, _, err = run_cli(capsys, "dedup", single, "--model", models["descriptor"], "--matcher", "none",
                       "--threshold", 0.9, "--output", tmp_path / "y")
    assert code == 2 and "needs at least 2 images, got 1" in err


def test_dedup_threshold_from_a_calibration_file(collection, tmp_path, capsys):
    from copynce_hf.calibration.thresholds import Calibration, OperatingPoint, model_identity

    models = save_tiny_models(tmp_path / "models", seed=0)
    pipeline = {"descriptors": [model_identity(models["descriptor"], "descriptor")], "matcher": None,
                "preset": "fast", "settings": {"descriptor_lce": "none", "matcher_lce": "none",
                                               "score_normalisation": False}}
    rows = [OperatingPoint(0.9, 0.9999, 0.5), OperatingPoint(0.99, None, 0.0)]
    Calibration(pipeline, {"descriptor": rows}).save(tmp_path / "calibration.json")
    dedup_args = ("dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                  "--calibration", tmp_path / "calibration.json")
    # a calibration holds raw cosines: the collection-normalised scores of --matcher none cannot use it
    code, _, err = run_cli(capsys, *dedup_args, "--output", tmp_path / "x")
    assert code == 2 and "--collection-normalisation off" in err and "raw descriptor cosines" in err
    dedup_args = (*dedup_args, "--collection-normalisation", "off")
    code, out, err = run_cli(capsys, *dedup_args, "--output", tmp_path / "found")
    assert code == 0, err
    assert "wrote 1 groups of copies (3 images)" in out
    assert "descriptor score 0.9999 at precision 0.9 in" in (tmp_path / "found" / "report.html").read_text()

    code, _, err = run_cli(capsys, *dedup_args, "--precision", 0.99, "--output", tmp_path / "x")
    assert code == 2 and "no descriptor score reached precision 0.99" in err
    code, _, err = run_cli(capsys, *dedup_args, "--threshold", 0.5, "--output", tmp_path / "x")
    assert code == 2 and "give --threshold or --calibration, not both" in err
    code, _, err = run_cli(capsys, *dedup_args, "--descriptor-lce", "matcher-views", "--output", tmp_path / "x")
    assert code == 2 and "made with descriptor_lce 'none', but this dedup run uses 'matcher-views'" in err
    Calibration({**pipeline, "descriptors": ["embedded:descriptor"]}, {"descriptor": rows}).save(tmp_path / "other.json")
    code, _, err = run_cli(capsys, "dedup", collection, "--model", models["descriptor"], "--matcher", "none",
                       "--calibration", tmp_path / "other.json", "--collection-normalisation", "off",
                       "--output", tmp_path / "x")
    assert code == 2 and "made with descriptor model(s) ['embedded:descriptor']" in err


def planted_collection(folder, copies: int = 2, side: int = 160, seed: int = 0) -> list[list[str]]:
    """The bundled images shrunk to ``side`` pixels, each with ``copies`` copies made with the ``demo_queries``
    recipe; returns the true groups (original and its copies)."""
    from copynce_hf.data import ASSET_IMAGES
    from copynce_hf.pixtrace import CopyRecipe

    recipe, rng, truth = CopyRecipe.preset("demo_queries"), np.random.default_rng(seed), []
    for path in sorted(ASSET_IMAGES.glob("*.jpg")):
        image = Image.open(path).convert("RGB")
        image.thumbnail((side, side))
        image.save(folder / f"{path.stem}.png")
        truth.append([path.stem])
        for copy in range(copies):
            recipe.apply(image, rng)[0].save(folder / f"{path.stem}_copy{copy}.png")
            truth[-1].append(f"{path.stem}_copy{copy}")
    return truth


# The floor is the promise: pair precision and recall at least 0.7 on 36 true pairs, at a fixed threshold of 0.5
# with 5 candidates per image (not the command's defaults, which self-calibrate the threshold and verify 10
# candidates: a fixed threshold keeps the decision out of the calibration's draws).
def test_planted_copies_are_grouped_with_the_embedded_models(tmp_path):
    from copynce_hf.runtime.loading import load_model

    truth = planted_collection(tmp_path)
    # 12 groups of an original and its 2 copies: 36 images, 36 true pairs. One false merge of two groups adds
    # 3 x 3 = 9 false pairs (precision 0.8 if nothing else is wrong): no single merge decides the floor.
    assert len(truth) == 12 and all(len(group) == 3 for group in truth)
    descriptor = Descriptor("embedded", *load_model(None, "descriptor", "--model"))
    result = dedup(ImageFolderSource(tmp_path), descriptor, load_model(None, "matcher", "--matcher"), threshold=0.5,
                   config=DetectConfig(candidates=5), progress=False)
    found = [[image for image, _ in group] for group in result.groups]
    precision, recall = pair_precision_recall(found, truth)
    assert precision >= 0.7 and recall >= 0.7, (precision, recall, found)


def test_collection_normalisation_and_grouping_options_reach_the_library():
    from copynce_hf.cli import build_parser
    from copynce_hf.commands import dedup as dedup_command
    from copynce_hf.commands import detect as detect_command

    parser = build_parser()
    defaults = dedup_command.request_of(parser.parse_args(["--quiet", "dedup", "imgs", "--output", "out"]))
    config, settings = defaults.pipeline.config(), defaults.settings
    assert (settings.collection.on, settings.collection.k_start, settings.collection.k_end) == (True, 2, 9)
    assert (config.candidates, config.descriptor_lce, config.matcher_lce, config.content_tokens) == (
        10, "none", "none", True)
    assert settings == DedupSettings() and defaults.pipeline.overrides == {}  # the library's defaults, none given
    assert (settings.grouping, settings.matcher_normalisation, settings.matcher_anchor) == ("representative", True, 0.0)
    assert settings.matcher_orders == "auto"
    request = dedup_command.request_of(parser.parse_args([
        "--quiet", "dedup", "imgs", "--output", "out", "--collection-normalisation", "off", "--collection-alpha", "0.5",
        "--collection-k-start", "1", "--collection-k-end", "6", "--matcher-normalisation", "on",
        "--matcher-alpha", "2", "--matcher-k-start", "3", "--matcher-k-end", "7", "--matcher-anchor", "1.5",
        "--grouping", "connected", "--matcher-orders", "one"]))
    settings = request.settings
    assert settings.collection == CollectionNormalisation(on=False, alpha=0.5, k_start=1, k_end=6)
    assert (settings.grouping, settings.matcher_normalisation, settings.matcher_alpha, settings.matcher_k_start,
            settings.matcher_k_end, settings.matcher_anchor, settings.matcher_orders) == (
        "connected", True, 2.0, 3, 7, 1.5, "one")
    # the matcher stage follows --collection-normalisation unless it is given
    off = dedup_command.request_of(parser.parse_args(["--quiet", "dedup", "imgs", "--output", "out",
                                                      "--collection-normalisation", "off"]))
    assert off.settings.matcher_normalisation is False
    given = dedup_command.request_of(parser.parse_args(["--quiet", "dedup", "imgs", "--output", "out", "--candidates",
                                                        "4", "--matcher-lce", "paper"])).pipeline
    assert given.preset_text() == "dedup (candidates, matcher_lce given)"
    assert (given.config().candidates, given.config().matcher_lce, given.config().content_tokens) == (4, "paper", False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--quiet", "dedup", "imgs", "--output", "out", "--grouping", "majority"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--quiet", "dedup", "imgs", "--output", "out", "--collection-normalisation", "yes"])

    detect_args = ["--quiet", "detect", "q", "--references", "r", "--output", "out"]
    assert detect_command.request_of(parser.parse_args(detect_args)).pipeline.config() == DetectConfig()
    given = detect_command.request_of(parser.parse_args([*detect_args, "--collection-normalisation", "on",
                                                         "--collection-k-end", "4", "--reference-background",
                                                         "auxiliary", "--collection-alpha", "0.25"])).pipeline
    config = given.config()
    assert (config.collection, config.reference_background) == (
        CollectionNormalisation(on=True, alpha=0.25, k_start=2, k_end=4), "auxiliary")
    assert given.preset_text() == ("fast (collection_alpha, collection_k_end, collection_normalisation, "
                                   "reference_background given)")
    with pytest.raises(ConfigError, match="collection normalisation needs 0 <= k_start <= k_end"):
        dedup_command.request_of(parser.parse_args(["--quiet", "dedup", "imgs", "--output", "out",
                                                    "--collection-k-start", "5", "--collection-k-end", "3"]))


def test_detect_reference_background_from_the_auxiliary_images_needs_them(collection, tmp_path, capsys):
    models = save_tiny_models(tmp_path / "models", seed=0)
    command = ["detect", collection, "--references", collection, "--output", tmp_path / "out", "--models",
               models["descriptor"], "--matcher", "none", "--reference-background", "auxiliary"]
    code, _, err = run_cli(capsys, *command, "--collection-normalisation", "on")
    assert code == 2 and "--reference-background auxiliary needs auxiliary images: give --aux FOLDER" in err
    # collection normalisation is off by default in detect: where to measure backgrounds means nothing without it
    code, _, err = run_cli(capsys, *command)
    assert code == 2 and "reference_background 'auxiliary' sets where collection normalisation" in err
    assert "(--collection-normalisation on)" in err
    assert not (tmp_path / "out").exists()  # refused before any model work
