"""The detection pipeline: paper LCE views, view search, candidate merging, the matcher token cache, detect()."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import TINY_VIT, tiny_models
from PIL import Image

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval import (
    DETECT_PRESETS,
    CollectionNormalisation,
    Descriptor,
    DescriptorIndex,
    DescriptorSet,
    DetectConfig,
    ImageFolderSource,
    ImageListSource,
    MatcherScorer,
    Prediction,
    View,
    ViewPreset,
    candidate_recall,
    detect,
    extract_view_descriptors,
    matcher_view_pairs,
    merge_candidates,
    paper_query_views,
    paper_reference_views,
    render_view,
    search_view_groups,
    search_views,
    view_index,
    view_predictions,
    view_preset_of,
)


@pytest.fixture(scope="module")
def tiny():
    return tiny_models(seed=5)


def noise(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


# --------------------------------------------------------------------------- views


@pytest.mark.parametrize("width,height", [(120, 90), (101, 77)])
def test_paper_views_are_the_defined_boxes(width, height):
    w, h = width, height
    query = paper_query_views(w, h)
    reference = paper_reference_views(w, h)
    assert len(query) == 26 and len(reference) == 10
    thirds = [
        (w // 3, h // 3, 2 * w // 3, 2 * h // 3),  # centre third
        (w // 6, h // 6, w // 2, h // 2),  # centred at (1/3, 1/3)
        (w // 2, h // 6, 5 * w // 6, h // 2),  # (2/3, 1/3)
        (w // 6, h // 2, w // 2, 5 * h // 6),  # (1/3, 2/3)
        (w // 2, h // 2, 5 * w // 6, 5 * h // 6),  # (2/3, 2/3)
    ]
    quarters = [(0, 0, w // 2, h // 2), (w // 2, 0, w, h // 2), (0, h // 2, w // 2, h), (w // 2, h // 2, w, h)]
    ninths = [(c * w // 3, r * h // 3, (c + 1) * w // 3, (r + 1) * h // 3) for r in range(3) for c in range(3)]
    rotations = [View("rotate", angle=a) for a in (45, 90, 135, 180, 225, 270, 315)]
    crops = [View("crop", box) for box in thirds + quarters + ninths]
    assert query == [View("full"), *crops, *rotations]
    assert reference == [View("full"), *(View("crop", box) for box in thirds + quarters)]
    # the one-third crops are centred where the definition says and a third of each side wide
    for (left, top, right, bottom), (cx, cy) in zip(thirds, [(1 / 2, 1 / 2), (1 / 3, 1 / 3), (2 / 3, 1 / 3),
                                                            (1 / 3, 2 / 3), (2 / 3, 2 / 3)]):
        assert abs((left + right) / 2 - cx * w) <= 1 and abs((top + bottom) / 2 - cy * h) <= 1
        assert abs((right - left) - w / 3) <= 1 and abs((bottom - top) - h / 3) <= 1
    # the ninths tile the image exactly
    assert sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in ninths) == w * h

    image = noise(w, h, 0)
    rendered = ViewPreset("matcher-views").query_images(image)
    assert rendered[0] is image and rendered[1].size == (thirds[0][2] - thirds[0][0], thirds[0][3] - thirds[0][1])
    assert rendered[20].size[::-1] == pytest.approx(image.size, abs=1)  # 90 degrees (view 20), expanded
    diagonal = rendered[19]  # 45 degrees, expanded: the canvas holds the rotated rectangle
    assert diagonal.size[0] == pytest.approx((w + h) / np.sqrt(2), abs=2)
    assert np.array_equal(np.asarray(render_view(image, View("crop", (3, 4, 30, 20)))),
                          np.asarray(image)[4:20, 3:30])
    assert ViewPreset("none").query_images(image) == [image]
    with pytest.raises(ConfigError, match="unknown LCE view preset"):
        ViewPreset("grid")


def _box(image_width: int, image_height: int, x0, y0, x1, y1) -> tuple[int, int, int, int]:
    """A box given as fractions of the sides, floored to pixels."""
    return (math.floor(x0 * image_width), math.floor(y0 * image_height), math.floor(x1 * image_width),
            math.floor(y1 * image_height))


@pytest.mark.parametrize("width,height", [(120, 90), (101, 77)])
def test_authors_views_are_the_defined_boxes(width, height):
    w, h = width, height
    F = Fraction
    preset = ViewPreset("authors")
    groups = preset.query_view_groups(w, h)
    assert [len(group) for group in groups] == [1, 10, 9, 25] and preset.group_sizes == (1, 10, 9, 25)
    assert preset.group_top_k == (100, 10, 10, 4)
    assert sum(n * k for n, k in zip(preset.group_sizes, preset.group_top_k)) == 390  # the paper's count
    assert groups[0] == [View("full")]
    half, quarter = F(1, 2), F(1, 4)
    corner_near, corner_far = F(707, 1000), F(293, 1000)
    two = [(0, 0, half, 1), (quarter, 0, F(3, 2), 1), (half, 0, 1, 1),  # vertical halves (centre: to 3w/2)
           (0, 0, 1, half), (0, quarter, 1, 3 * quarter), (0, half, 1, 1),  # horizontal halves
           (0, 0, corner_near, corner_near), (corner_far, 0, 1, corner_near),  # corners of 0.707 per side
           (0, corner_far, corner_near, 1), (corner_far, corner_far, 1, 1)]
    four = [(i * quarter, j * quarter, i * quarter + half, j * quarter + half) for j in range(3) for i in range(3)]
    nine = [(F(i, 6), F(j, 6), F(i + 2, 6), F(j + 2, 6)) for j in range(5) for i in range(5)]
    for group, fractions in zip(groups[1:], (two, four, nine)):
        assert group == [View("crop", _box(w, h, *f)) for f in fractions]
    reference = preset.reference_views(w, h)
    eighths = [(F(1, 8), F(1, 8)), (F(3, 8), F(1, 8)), (F(1, 8), F(3, 8)), (F(3, 8), F(3, 8))]
    assert reference == [View("full"), View("crop", _box(w, h, F(1, 6), F(1, 6), F(5, 6), F(5, 6))),
                         *(View("crop", _box(w, h, x, y, x + half, y + half)) for x, y in eighths),
                         View("rotate", angle=90), View("rotate", angle=180), View("rotate", angle=270)]
    # the 5 x 5 grid of one-third boxes covers the whole image
    covered = np.zeros((h, w), dtype=bool)
    for left, top, right, bottom in (view.box for view in groups[3]):
        covered[top:bottom, left:right] = True
    assert covered.all()
    image = noise(w, h, 1)
    rendered = preset.query_images(image)
    assert len(rendered) == 45 and rendered[0] is image
    centre_vertical = np.asarray(rendered[2])  # (w/4, 0, 3w/2, h): past the right edge, padded with black
    assert centre_vertical.shape[:2] == (h, 3 * w // 2 - w // 4)
    assert np.array_equal(centre_vertical[:, : w - w // 4], np.asarray(image)[:, w // 4 :])
    assert not centre_vertical[:, w - w // 4 :].any()
    assert [r.size for r in preset.reference_images(image)[6:]] == [(h, w), (w, h), (h, w)]
    assert ViewPreset("paper") == ViewPreset("matcher-views")  # the earlier name, read from saved indexes


def test_matcher_view_pairs_follow_the_authors_rule():
    assert matcher_view_pairs("none", 26, 10) == [(0, 0)]
    paper = matcher_view_pairs("paper", 26, 10)
    assert len(paper) == 35 and len(set(paper)) == 35
    assert paper[:26] == [(q, 0) for q in range(26)] and paper[26:] == [(0, r) for r in range(1, 10)]
    everything = matcher_view_pairs("all", 26, 10)
    assert len(everything) == 260 and set(paper) <= set(everything)
    with pytest.raises(ConfigError, match="matcher_lce"):
        matcher_view_pairs("most", 26, 10)


# --------------------------------------------------------------------------- descriptor LCE search


def test_best_view_scoring_finds_a_query_that_is_a_crop_of_a_reference(tiny):
    descriptor, _, processor = tiny
    references = [noise(96, 72, seed) for seed in range(6)]
    # the query is exactly the centre third of reference 3: the reference's view 1
    query = references[3].crop((96 // 3, 72 // 3, 2 * 96 // 3, 2 * 72 // 3))
    reference_source = ImageListSource([f"r{i}" for i in range(6)], references)
    query_source = ImageListSource(["q"], [query])
    paper = ViewPreset("matcher-views")
    index = view_index(Descriptor("tiny", descriptor, processor), reference_source, paper, progress=False)
    assert len(index) == 60 and index.info["views"] == "matcher-views"
    queries = extract_view_descriptors(descriptor, processor, query_source, paper, "query", progress=False)
    assert queries.ids[:2] == ["q#0", "q#1"] and len(queries) == 26
    query_ids, ranked = search_views(index, queries, paper, k=3)
    assert query_ids == ["q"]
    assert ranked[0][0][0] == "r3" and ranked[0][0][1] == pytest.approx(1.0, abs=1e-5)
    assert len({r for r, _ in ranked[0]}) == 3  # distinct references, best view pair each
    # the LCE score is the best view pair: brute force over all 26 x 10 view descriptors of each reference;
    # the 3 kept are the 3 best by that score (here r3, r4, r0: the next, r5, is 1.4e-3 below r0)
    reference_views = index.references
    brute = {}
    for i in range(6):
        rows = [j for j, rid in enumerate(reference_views.ids) if rid.startswith(f"r{i}#")]
        brute[f"r{i}"] = float((queries.descriptors @ reference_views.descriptors[rows].T).max())
    assert [reference for reference, _ in ranked[0]] == sorted(brute, key=lambda r: -brute[r])[:3]
    for reference, score in ranked[0]:
        assert score == pytest.approx(brute[reference], abs=1e-5)
    # without views the crop is one of many: its score with r3 is below the exact view match
    plain = ViewPreset("none")
    plain_index = view_index(Descriptor("tiny", descriptor, processor), reference_source, plain, progress=False)
    plain_queries = extract_view_descriptors(descriptor, processor, query_source, plain, "query", progress=False)
    _, plain_ranked = search_views(plain_index, plain_queries, plain, k=6)
    assert dict(plain_ranked[0])["r3"] < 1.0 - 1e-3


def _view_index(rng, images: int, views: int, dim: int, name: str, preset: str) -> DescriptorIndex:
    vectors = rng.normal(size=(images * views, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"{name}{i}#{v}" for i in range(images) for v in range(views)]
    return DescriptorIndex.build(DescriptorSet(ids, vectors), info={"views": preset})


def _query_views(rng, index: DescriptorIndex, queries: int, dim: int) -> DescriptorSet:
    """45 views per query, some of them noisy copies of reference views (so that lists overlap)."""
    vectors = rng.normal(size=(queries * 45, dim)).astype(np.float32)
    copied = rng.choice(len(index), size=queries * 45 // 3)
    vectors[: len(copied)] += 3 * index.references.descriptors[copied]
    vectors = vectors[rng.permutation(len(vectors))]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return DescriptorSet([f"q{i}#{v}" for i in range(queries) for v in range(45)], vectors)


def test_authors_per_group_top_k_equals_a_brute_force_merge():
    rng = np.random.default_rng(3)
    index = _view_index(rng, images=130, views=9, dim=16, name="r", preset="authors")
    queries = _query_views(rng, index, queries=3, dim=16)
    preset = ViewPreset("authors")
    assert view_preset_of(index) == preset
    query_ids, ranked = search_view_groups(index, queries, preset)
    # brute force: every query view's cosine to every reference (its best view), top k of the view's group,
    # then the union per query, a reference keeping its best score
    cosines = queries.descriptors @ index.references.descriptors.T  # (3 * 45, 130 * 9)
    per_reference = cosines.reshape(3, 45, 130, 9).max(axis=3)  # (query, view, reference)
    group_k = [100] + [10] * 10 + [10] * 9 + [4] * 25
    assert query_ids == ["q0", "q1", "q2"]
    for q in range(3):
        expected: dict[str, float] = {}
        for v in range(45):
            for r in np.argsort(-per_reference[q, v], kind="stable")[: group_k[v]]:
                expected[f"r{r}"] = max(expected.get(f"r{r}", -np.inf), float(per_reference[q, v, r]))
        assert 100 <= len(expected) <= 390
        got = dict(ranked[q])
        assert got.keys() == expected.keys()
        assert [got[r] for r in expected] == pytest.approx(list(expected.values()), abs=1e-5)
        assert [s for _, s in ranked[q]] == sorted((s for _, s in ranked[q]), reverse=True)
    # view_predictions keeps the best k of that union
    top = view_predictions(index, queries, preset, k=7)
    assert [(p.reference_id, p.score) for p in top if p.query_id == "q1"] == ranked[1][:7]
    with pytest.raises(ConfigError, match="per view group"):
        search_view_groups(index, queries, ViewPreset("matcher-views"))


def test_score_normalisation_uses_the_configured_auxiliary_ranks():
    rng = np.random.default_rng(4)
    index = _view_index(rng, images=20, views=9, dim=8, name="r", preset="authors")
    auxiliary = _view_index(rng, images=12, views=9, dim=8, name="a", preset="authors")
    queries = _query_views(rng, index, queries=2, dim=8)
    preset = ViewPreset("authors")
    plain = {(p.query_id, p.reference_id): p.score for p in view_predictions(index, queries, preset, k=5)}
    # the bias: the mean of the query's best-view-pair cosines to the auxiliary images of ranks 1..4
    lce = (queries.descriptors @ auxiliary.references.descriptors.T).reshape(2, 45, 12, 9).max(axis=(1, 3))
    ranks = -np.sort(-lce, axis=1)
    for k_start, k_end in ((1, 4), (0, 9)):
        normalised = view_predictions(index, queries, preset, k=5, auxiliary=auxiliary, alpha=0.5,
                                      k_start=k_start, k_end=k_end)
        assert len(normalised) == 10
        for p in normalised:
            bias = ranks[int(p.query_id[1:]), k_start : k_end + 1].mean()
            assert p.score == pytest.approx(plain[(p.query_id, p.reference_id)] - 0.5 * bias, abs=1e-5)
    assert DetectConfig.from_preset("paper").k_start == 1 and DetectConfig.from_preset("paper").k_end == 4
    assert (DetectConfig.from_preset("fast").k_start, DetectConfig.from_preset("fast").k_end) == (0, 9)


def test_reference_backgrounds_are_the_mean_of_the_other_references_of_the_configured_ranks():
    """Reference-side collection normalisation: each reference's background is its mean best-view-pair cosine to
    the other references of ranks 2..5 (or to the auxiliary images); a query's template reference, nearer by
    cosine, falls below its isolated true reference once the backgrounds are subtracted."""
    from copynce_hf.retrieval import normalised_reference_scores, reference_background

    rng = np.random.default_rng(7)
    index = _view_index(rng, images=14, views=10, dim=8, name="r", preset="matcher-views")
    lce = (index.references.descriptors @ index.references.descriptors.T).reshape(14, 10, 14, 10).max(axis=(1, 3))
    others = np.where(np.eye(14, dtype=bool), -np.inf, lce)
    expected = -np.sort(-others, axis=1)[:, 2:6].mean(axis=1)
    background = reference_background(index, 2, 5)
    assert background == pytest.approx({f"r{i}": float(expected[i]) for i in range(14)}, abs=1e-5)
    auxiliary = _view_index(rng, images=9, views=10, dim=8, name="a", preset="matcher-views")
    to_auxiliary = (index.references.descriptors @ auxiliary.references.descriptors.T).reshape(14, 10, 9, 10).max(
        axis=(1, 3))
    assert reference_background(index, 0, 3, auxiliary) == pytest.approx(
        {f"r{i}": float(-np.sort(-to_auxiliary[i])[:4].mean()) for i in range(14)}, abs=1e-5)
    found = [Prediction("q", "template", 0.9), Prediction("q", "copy", 0.8), Prediction("q", "other", 0.1),
             Prediction("p", "template", 0.5)]
    normalised = normalised_reference_scores(found, {"template": 0.6, "copy": 0.1, "other": 0.0}, 0.5, top=2)
    assert normalised == [Prediction("q", "copy", pytest.approx(0.75)), Prediction("q", "template", pytest.approx(0.6)),
                          Prediction("p", "template", pytest.approx(0.2))]
    with pytest.raises(ConfigError, match="reference_background must be one of collection, auxiliary"):
        DetectConfig(reference_background="queries")
    with pytest.raises(ConfigError, match="collection normalisation needs 0 <= k_start <= k_end"):
        CollectionNormalisation(k_start=4, k_end=3)


def test_detect_presets():
    paper = DetectConfig.from_preset("paper", k=3)
    assert (paper.descriptor_lce, paper.matcher_lce, paper.candidates, paper.k) == ("authors", "paper", 400, 3)
    assert DetectConfig.from_preset("fast") == DetectConfig()  # fast is the CPU-sized default
    assert set(DETECT_PRESETS) == {"paper", "fast", "accurate"}
    accurate = DetectConfig.from_preset("accurate")
    assert (accurate.descriptor_lce, accurate.matcher_lce, accurate.candidates, accurate.k) == (
        "matcher-views", "paper", 2, 10)
    assert (accurate.alpha, accurate.k_start, accurate.k_end) == (1.0, 0, 9)
    with pytest.raises(ConfigError, match="unknown detect preset 'slow'"):
        DetectConfig.from_preset("slow")
    with pytest.raises(ConfigError, match="k_start=3, k_end=2"):
        DetectConfig(k_start=3, k_end=2)


def test_merge_candidates_and_recall():
    first = [Prediction("q1", "a", 0.9), Prediction("q1", "b", 0.2), Prediction("q2", "c", 0.5)]
    second = [Prediction("q1", "b", 0.8), Prediction("q1", "d", 0.1), Prediction("q2", "e", 0.6)]
    merged = merge_candidates([first, second], top=2)
    assert sorted(merged) == sorted([Prediction("q1", "a", 0.9), Prediction("q1", "b", 0.8),
                                     Prediction("q2", "e", 0.6), Prediction("q2", "c", 0.5)])
    truth = {"q1": ["d"], "q2": ["c"], "q3": []}
    assert candidate_recall(merged, truth) == 0.5
    assert candidate_recall(first + second, truth) == 1.0
    assert candidate_recall(merged, {"q3": []}) is None


# --------------------------------------------------------------------------- matcher token cache


@pytest.mark.parametrize("lce", ["none", "paper"])
def test_cached_matcher_scores_equal_uncached_forwards(tiny, lce):
    import torch

    _, matcher, processor = tiny
    images = {f"q{i}": noise(60 + 7 * i, 50, 10 + i) for i in range(2)}
    references = {f"r{i}": noise(55, 64 - 5 * i, 20 + i) for i in range(3)}
    pairs = [("q0", "r0"), ("q0", "r1"), ("q1", "r1"), ("q1", "r2"), ("q0", "r2"), ("q1", "r0")]
    scorer = MatcherScorer(matcher, processor, lce=lce, batch_size=5, fusion_precision="float32")
    cached = scorer.score(pairs, images, references, progress=False)
    preset = ViewPreset("matcher-views" if lce == "paper" else "none")
    views_q, views_r = preset.num_query_views, preset.num_reference_views
    # one encoder pass per view of each distinct image, one fusion pass per scored view pair
    assert scorer.encoded_views == 2 * views_q + 3 * views_r
    assert scorer.fused_pairs == len(pairs) * len(matcher_view_pairs(lce, views_q, views_r))
    expected = []
    with torch.no_grad():
        for query_id, reference_id in pairs:
            q = processor(images=preset.query_images(images[query_id]), return_tensors="pt")["pixel_values"]
            r = processor(images=preset.reference_images(references[reference_id]), return_tensors="pt")[
                "pixel_values"]
            pair_scores = [torch.sigmoid(matcher(pixel_values=q[qi : qi + 1], reference_pixel_values=r[ri : ri + 1])
                                         .logits).item() for qi, ri in matcher_view_pairs(lce, views_q, views_r)]
            expected.append(max(pair_scores))
    np.testing.assert_allclose(cached, expected, atol=1e-5)
    # a tiny cache evicts and re-encodes, with the same scores
    small = MatcherScorer(matcher, processor, lce=lce, batch_size=3, cache_size=1, fusion_precision="float32")
    np.testing.assert_allclose(small.score(pairs, images, references, progress=False), expected, atol=1e-5)
    # pairs whose image is missing are None
    assert scorer.score([("q0", "zz"), ("zz", "r0")], images, references, progress=False) == [None, None]



def test_bfloat16_fusion_scores_near_float32_with_float32_logits(tiny):
    """Under bfloat16 fusion the matcher's blocks compute in bfloat16 and the logits stay float32: the scores move by
    rounding only, and the setting is resolved (and recorded) per model."""
    import torch

    from copynce_hf.retrieval.verify.pairs import PairScoring, score_pairs
    from copynce_hf.retrieval.verify.scorer import resolve_fusion_precision

    descriptor, matcher, processor = tiny
    images = {f"q{i}": noise(60 + 7 * i, 50, 10 + i) for i in range(2)}
    references = {f"r{i}": noise(55, 64 - 5 * i, 20 + i) for i in range(3)}
    pairs = [(q, r) for q in images for r in references]
    exact = MatcherScorer(matcher, processor, fusion_precision="float32").score(pairs, images, references, progress=False)
    rounded = MatcherScorer(matcher, processor, fusion_precision="bfloat16")
    assert rounded.fusion_precision == "bfloat16"
    scores = rounded.score(pairs, images, references, progress=False)
    np.testing.assert_allclose(scores, exact, atol=2e-2)
    assert scores != exact  # bfloat16 really ran
    query = matcher.pre_fusion_tokens(processor(images=[images["q0"]], return_tensors="pt")["pixel_values"])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert matcher.fusion_logits(query, query).dtype == torch.float32
    # resolved per model: a descriptor has no fusion blocks; auto follows the CPU's native bfloat16 kernels
    from copynce_hf.precision import cpu_has_native_bf16

    assert resolve_fusion_precision("bfloat16", descriptor) == "float32"
    assert resolve_fusion_precision("auto", matcher) == ("bfloat16" if cpu_has_native_bf16() else "float32")
    with pytest.raises(ConfigError, match="fusion_precision"):
        resolve_fusion_precision("half", matcher)
    with pytest.raises(ConfigError, match="needs a PyTorch matcher"):
        resolve_fusion_precision("bfloat16", object())
    assert "fusion_precision" not in PairScoring(fusion_precision="float32").identity()  # as chunks scored before
    scored = score_pairs(pairs[:2], matcher, processor, images, references, PairScoring(fusion_precision="bfloat16"),
                         progress=False)
    np.testing.assert_allclose(scored.scores, scores[:2])
    with pytest.raises(ConfigError, match="fusion_precision"):
        DetectConfig(fusion_precision="fp8")


# --------------------------------------------------------------------------- detect


def test_encoder_precision_runs_the_descriptors_in_bfloat16_or_exactly(tiny, tmp_path):
    """encoder_precision float32 gives the float32 model's cosines; bfloat16 moves them by rounding only; both run in
    one process (accelerate's own mixed precision could not change within it)."""
    import torch

    descriptor, _, processor = tiny
    for folder, seeds in (("refs", range(4)), ("queries", range(40, 42))):
        (tmp_path / folder).mkdir()
        for seed in seeds:
            noise(64, 48, seed).save(tmp_path / folder / f"{folder[0]}{seed}.png")
    queries, references = ImageFolderSource(tmp_path / "queries"), ImageFolderSource(tmp_path / "refs")
    found = {}
    for precision in ("float32", "bfloat16", "float32"):
        config = DetectConfig(k=4, candidates=4, encoder_precision=precision)
        result = detect(queries, references, [Descriptor("one", descriptor, processor)], None, None, config,
                        progress=False)
        found.setdefault(precision, []).append({(p.query_id, p.reference_id): p.score for p in result.predictions})
    with torch.no_grad():
        def describe(source):
            pixels = processor(images=[source.load(i) for i in range(len(source))], return_tensors="pt")
            return dict(zip(source.ids, descriptor.get_image_features(pixels["pixel_values"])))

        query_rows, reference_rows = describe(queries), describe(references)
    exact = {(q, r): float(query_rows[q] @ reference_rows[r]) for q in query_rows for r in reference_rows}
    assert found["float32"][0] == found["float32"][1] and len(exact) == 8
    for pair, cosine in exact.items():
        assert found["float32"][0][pair] == pytest.approx(cosine, abs=1e-5)
        assert found["bfloat16"][0][pair] == pytest.approx(cosine, abs=3e-2)
    assert found["bfloat16"][0] != found["float32"][0]  # bfloat16 really ran
    with pytest.raises(ConfigError, match="encoder_precision"):
        DetectConfig(encoder_precision="fp16")


def test_detect_end_to_end_with_two_descriptors_and_index_reuse(tiny, tmp_path):
    import torch

    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel

    descriptor, matcher, processor = tiny
    for folder, seeds in (("refs", range(5)), ("aux", range(30, 42))):
        (tmp_path / folder).mkdir()
        for seed in seeds:
            noise(64, 48, seed).save(tmp_path / folder / f"{folder[0]}{seed}.png")
    (tmp_path / "queries").mkdir()
    Image.open(tmp_path / "refs" / "r2.png").crop((10, 5, 60, 45)).save(tmp_path / "queries" / "qa.png")
    noise(50, 50, 99).save(tmp_path / "queries" / "qb.png")
    torch.manual_seed(11)
    other = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=8, **TINY_VIT)).eval()
    descriptors = [Descriptor("one", descriptor, processor), Descriptor("two", other, processor)]
    queries, references = ImageFolderSource(tmp_path / "queries"), ImageFolderSource(tmp_path / "refs")
    config = DetectConfig(k=2, candidates=3, descriptor_lce="matcher-views", matcher_lce="paper", batch_size=16,
                          content_tokens=False, collection=CollectionNormalisation(on=True))
    result = detect(queries, references, descriptors, (matcher, processor), ImageFolderSource(tmp_path / "aux"),
                    config, index_folder=tmp_path / "indexes", progress=False)
    assert set(result.per_model) == {"one", "two"}
    assert all(len([p for p in result.candidates if p.query_id == q]) == 3 for q in ("qa", "qb"))
    assert all(len([p for p in result.predictions if p.query_id == q]) == 2 for q in ("qa", "qb"))
    assert all(0.0 <= p.score <= 1.0 for p in result.predictions)
    assert result.matcher_cost["fused_pairs"] == 6 * 35
    # 3 distinct candidates per query out of 5 references: 6 of the 10 pairs of every query with every
    # reference, none of a query that was not searched
    every_reference = [f"r{seed}" for seed in range(5)]
    assert result.candidate_recall({"qa": every_reference, "qb": every_reference}) == pytest.approx(6 / 10)
    assert result.candidate_recall({"qa": every_reference, "qb": every_reference, "qz": ["r1"]}) == pytest.approx(6 / 11)
    identity = json.loads((tmp_path / "indexes" / "one" / "references" / "identity.json").read_text())
    assert identity["views"] == "matcher-views" and identity["num_images"] == 5
    # the ids and file stamps are held as digests: the file stays small whatever the number of references
    assert len(identity["images"]) == len(identity["files"]) == 32 and len(json.dumps(identity)) < 1000
    stamp = (tmp_path / "indexes" / "one" / "references" / "index.faiss").stat().st_mtime_ns
    query_stamp = (tmp_path / "indexes" / "one" / "queries" / "descriptors.safetensors").stat().st_mtime_ns
    background_stamp = (tmp_path / "indexes" / "one" / "reference-background" / "background.safetensors").stat(
        ).st_mtime_ns
    again = detect(queries, references, descriptors, (matcher, processor), ImageFolderSource(tmp_path / "aux"),
                   config, index_folder=tmp_path / "indexes", progress=False)
    assert (tmp_path / "indexes" / "one" / "references" / "index.faiss").stat().st_mtime_ns == stamp
    assert (tmp_path / "indexes" / "one" / "queries" / "descriptors.safetensors").stat().st_mtime_ns == query_stamp
    assert sorted(again.predictions) == sorted(result.predictions)
    assert again.reused == ["query views:one", "query views:two"] and result.reused == []
    # the references' backgrounds (collection normalisation, on by default) are kept beside their index and reused
    background = tmp_path / "indexes" / "one" / "reference-background"
    assert json.loads((background / "identity.json").read_text())["k_end"] == config.collection.k_end
    assert (background / "background.safetensors").stat().st_mtime_ns == background_stamp
    assert again.seconds["query views:one"] == pytest.approx(result.seconds["query views:one"])
    # descriptors only: the merged candidates' top-k
    plain = detect(queries, references, descriptors[:1], None, None, DetectConfig(k=1, candidates=4), progress=False)
    assert plain.matcher_cost is None and len(plain.predictions) == 2
    # with collection normalisation (off by default) a pair's score is its cosine less its reference's background:
    # the mean cosine of the reference to the other references of ranks 2..9 (here 2..3: 4 others)
    from copynce_hf.retrieval import reference_background

    exact = {"k": 5, "candidates": 5, "encoder_precision": "float32"}  # as the index built below
    cosines = detect(queries, references, descriptors[:1], None, None,
                     DetectConfig(**exact, collection=CollectionNormalisation(on=False)), progress=False)
    assert not DetectConfig().collection.on
    every = detect(queries, references, descriptors[:1], None, None,
                   DetectConfig(**exact, collection=CollectionNormalisation(on=True)), progress=False)
    index = view_index(descriptors[0], references, ViewPreset("none"), progress=False)
    reference_backgrounds = reference_background(index, 2, 9)
    assert len(reference_backgrounds) == 5 and len(every.predictions) == len(cosines.predictions) == 10
    cosine = {(p.query_id, p.reference_id): p.score for p in cosines.predictions}
    for p in every.predictions:
        assert p.score == pytest.approx(cosine[(p.query_id, p.reference_id)] - reference_backgrounds[p.reference_id],
                                        abs=1e-5)
    with pytest.raises(ConfigError, match="auxiliary images"):
        detect(queries, references, descriptors[:1], None, None,
               DetectConfig(reference_background="auxiliary", collection=CollectionNormalisation(on=True)), progress=False)
    with pytest.raises(ConfigError, match="descriptor_lce"):
        DetectConfig(descriptor_lce="all")


# --------------------------------------------------------------------------- descriptor evidence


def test_descriptor_evidence_is_the_matchers_logit_plus_the_weighted_mean_cosine():
    from copynce_hf.retrieval.detection.evidence import matcher_logits, with_descriptor_evidence

    unit = np.eye(3, dtype=np.float32)
    first = (DescriptorSet(["q1", "q2"], unit[:2]), DescriptorSet(["r1", "r2"], np.array([[1, 0, 0], [0.6, 0.8, 0]])))
    second = (DescriptorSet(["q1"], unit[1:2]), DescriptorSet(["r1", "r2"], unit[1:3]))  # q2 unread by this one
    pairs = [Prediction("q1", "r1", 0.5), Prediction("q2", "r2", 0.9), Prediction("q9", "r1", 1.0)]
    scored = with_descriptor_evidence(pairs, [first, second], 3.0)
    # q1/r1: cosines 1 and 1, mean 1; q2/r2: 0.8 from the first only; q9: no descriptor holds it, cosine 0
    assert [p[:2] for p in scored] == [p[:2] for p in pairs]
    np.testing.assert_allclose([p.score for p in scored], [0.0 + 3.0, math.log(9) + 3 * 0.8, 16.118095], atol=1e-5)
    # each descriptor's cosine less the reference's background in it (a reference without one: 0)
    backgrounds = [{"r1": 0.5, "r2": 0.3}, {"r2": 0.9}]
    less = with_descriptor_evidence(pairs, [first, second], 3.0, backgrounds)
    np.testing.assert_allclose([p.score for p in less], [3 * (0.5 + 1.0) / 2, math.log(9) + 3 * 0.5, 16.118095],
                               atol=1e-5)
    np.testing.assert_allclose(matcher_logits(np.array([0.0, 1.0])), [-16.118095, 16.118095], atol=1e-5)  # clipped
    assert with_descriptor_evidence([], [first], 3.0) == []


def test_detect_with_a_descriptor_weight_scores_pairs_with_both_models(tiny, tmp_path):
    import torch

    from copynce_hf.retrieval.detection.evidence import matcher_logits

    descriptor, matcher, processor = tiny
    (tmp_path / "refs").mkdir()
    (tmp_path / "queries").mkdir()
    for seed in range(4):
        noise(64, 48, seed).save(tmp_path / "refs" / f"r{seed}.png")
    Image.open(tmp_path / "refs" / "r1.png").crop((8, 4, 60, 44)).save(tmp_path / "queries" / "qa.png")
    noise(48, 48, 77).save(tmp_path / "queries" / "qb.png")
    queries, references = ImageFolderSource(tmp_path / "queries"), ImageFolderSource(tmp_path / "refs")
    exact = {"k": 3, "candidates": 3, "content_tokens": False, "encoder_precision": "float32",
             "fusion_precision": "float32", "collection": CollectionNormalisation(on=True, k_start=0, k_end=1)}
    # collection normalisation on: the candidates' search and the evidence share one measure of the backgrounds
    models = ([Descriptor("tiny", descriptor, processor)], (matcher, processor), None)
    alone = detect(queries, references, *models, DetectConfig(**exact), progress=False)
    weighed = detect(queries, references, *models, DetectConfig(**exact, descriptor_weight=2.5), progress=False)
    probability = {p[:2]: p.score for p in alone.predictions}
    assert sorted(p[:2] for p in weighed.predictions) == sorted(probability)
    def described(folder, name):
        pixels = processor(images=Image.open(tmp_path / folder / f"{name}.png").convert("RGB"), return_tensors="pt")
        with torch.no_grad():
            return descriptor(pixels["pixel_values"]).descriptors[0].numpy()
    refs = {f"r{seed}": described("refs", f"r{seed}") for seed in range(4)}
    for p in weighed.predictions:
        cosine = float(described("queries", p.query_id) @ refs[p.reference_id])
        others = sorted((float(refs[p.reference_id] @ vector) for name, vector in refs.items()
                         if name != p.reference_id), reverse=True)
        background = (others[0] + others[1]) / 2  # its 2 nearest other references (ranks 0-1)
        expected = matcher_logits(np.array([probability[p[:2]]]))[0] + 2.5 * (cosine - background)
        assert p.score == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ConfigError, match="descriptor_weight"):
        DetectConfig(descriptor_weight=1.0, descriptor_lce="matcher-views")
    with pytest.raises(ConfigError, match="descriptor_weight"):
        DetectConfig(descriptor_weight=-1.0)
