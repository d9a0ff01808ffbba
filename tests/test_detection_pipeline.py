"""The detection pipeline: paper LCE views, view search, candidate merging, the matcher token cache, detect()."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TINY_VIT, tiny_models
from PIL import Image

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval import (
    Descriptor,
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
    search_views,
    view_index,
)


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("torch")
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
    rendered = ViewPreset("paper").query_images(image)
    assert rendered[0] is image and rendered[1].size == (thirds[0][2] - thirds[0][0], thirds[0][3] - thirds[0][1])
    assert rendered[20].size[::-1] == pytest.approx(image.size, abs=1)  # 90 degrees (view 20), expanded
    diagonal = rendered[19]  # 45 degrees, expanded: the canvas holds the rotated rectangle
    assert diagonal.size[0] == pytest.approx((w + h) / np.sqrt(2), abs=2)
    assert np.array_equal(np.asarray(render_view(image, View("crop", (3, 4, 30, 20)))),
                          np.asarray(image)[4:20, 3:30])
    assert ViewPreset("none").query_images(image) == [image]
    with pytest.raises(ConfigError, match="unknown LCE view preset"):
        ViewPreset("grid")


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
    paper = ViewPreset("paper")
    index = view_index(Descriptor("tiny", descriptor, processor), reference_source, paper, progress=False)
    assert len(index) == 60 and index.info["views"] == "paper"
    queries = extract_view_descriptors(descriptor, processor, query_source, paper, "query", progress=False)
    assert queries.ids[:2] == ["q#0", "q#1"] and len(queries) == 26
    query_ids, ranked = search_views(index, queries, paper, k=3)
    assert query_ids == ["q"]
    assert ranked[0][0][0] == "r3" and ranked[0][0][1] == pytest.approx(1.0, abs=1e-5)
    assert len({r for r, _ in ranked[0]}) == 3  # distinct references, best view pair each
    # the LCE score is the best view pair: brute force over all 26 x 10 view descriptors
    reference_views = index.references
    row = [i for i, rid in enumerate(reference_views.ids) if rid.startswith("r1#")]
    brute = (queries.descriptors @ reference_views.descriptors[row].T).max()
    r1 = dict(ranked[0]).get("r1")
    if r1 is not None:
        assert r1 == pytest.approx(float(brute), abs=1e-5)
    # without views the crop is one of many: its score with r3 is below the exact view match
    plain = ViewPreset("none")
    plain_index = view_index(Descriptor("tiny", descriptor, processor), reference_source, plain, progress=False)
    plain_queries = extract_view_descriptors(descriptor, processor, query_source, plain, "query", progress=False)
    _, plain_ranked = search_views(plain_index, plain_queries, plain, k=6)
    assert dict(plain_ranked[0])["r3"] < 1.0 - 1e-3


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
    scorer = MatcherScorer(matcher, processor, lce=lce, batch_size=5)
    cached = scorer.score(pairs, images, references, progress=False)
    preset = ViewPreset("paper" if lce == "paper" else "none")
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
    small = MatcherScorer(matcher, processor, lce=lce, batch_size=3, cache_size=1)
    np.testing.assert_allclose(small.score(pairs, images, references, progress=False), expected, atol=1e-5)
    # pairs whose image is missing are None
    assert scorer.score([("q0", "zz"), ("zz", "r0")], images, references, progress=False) == [None, None]


# --------------------------------------------------------------------------- detect


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
    config = DetectConfig(k=2, candidates=3, descriptor_lce="paper", matcher_lce="paper", batch_size=16)
    result = detect(queries, references, descriptors, (matcher, processor), ImageFolderSource(tmp_path / "aux"),
                    config, index_folder=tmp_path / "indexes", progress=False)
    assert set(result.per_model) == {"one", "two"}
    assert all(len([p for p in result.candidates if p.query_id == q]) == 3 for q in ("qa", "qb"))
    assert all(len([p for p in result.predictions if p.query_id == q]) == 2 for q in ("qa", "qb"))
    assert all(0.0 <= p.score <= 1.0 for p in result.predictions)
    assert result.matcher_cost["fused_pairs"] == 6 * 35
    assert result.candidate_recall({"qa": ["r2"], "qb": []}) in (0.0, 1.0)
    identity = json.loads((tmp_path / "indexes" / "one" / "references" / "identity.json").read_text())
    assert identity["views"] == "paper" and identity["images"] == ["r0", "r1", "r2", "r3", "r4"]
    stamp = (tmp_path / "indexes" / "one" / "references" / "index.faiss").stat().st_mtime_ns
    query_stamp = (tmp_path / "indexes" / "one" / "queries" / "descriptors.safetensors").stat().st_mtime_ns
    again = detect(queries, references, descriptors, (matcher, processor), ImageFolderSource(tmp_path / "aux"),
                   config, index_folder=tmp_path / "indexes", progress=False)
    assert (tmp_path / "indexes" / "one" / "references" / "index.faiss").stat().st_mtime_ns == stamp
    assert (tmp_path / "indexes" / "one" / "queries" / "descriptors.safetensors").stat().st_mtime_ns == query_stamp
    assert sorted(again.predictions) == sorted(result.predictions)
    assert again.reused == ["query views:one", "query views:two"] and result.reused == []
    assert again.seconds["query views:one"] == pytest.approx(result.seconds["query views:one"])
    # descriptors only: the merged candidates' top-k
    plain = detect(queries, references, descriptors[:1], None, None, DetectConfig(k=1, candidates=4), progress=False)
    assert plain.matcher_cost is None and len(plain.predictions) == 2
    with pytest.raises(ConfigError, match="descriptor_lce"):
        DetectConfig(descriptor_lce="all")
