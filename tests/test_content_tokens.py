"""Content tokens (beyond the paper): bursty tokens found on constructed tokens, the re-run descriptor and the
masked fusion against the models' own paths, and the options of ``dedup`` / ``detect`` reaching the scores and
the identity of saved scores, on tiny random models and a crafted collection (one frame, different contents)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_models
from PIL import Image

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval import (
    CollectionNormalisation,
    DedupSettings,
    Descriptor,
    DetectConfig,
    ImageFolderSource,
    dedup,
    detect,
)
from copynce_hf.retrieval.content.masks import PairMatches, TokenCache, neighbour_matches, walk_order
from copynce_hf.retrieval.content.stage import pair_neighbours
from copynce_hf.retrieval.content.tokens import (
    ContentSettings,
    bursty_keep,
    bursty_keep_batch,
    content_descriptors,
    fuse_content,
    fuse_kept,
    keep_tokens,
    local_keep_masks,
    matched_in,
    pair_keep,
    unit_patch_tokens,
)
from copynce_hf.retrieval.predictions import Prediction
from copynce_hf.retrieval.verify.scorer import MatcherScorer
from copynce_hf.runs.settings import PipelineModels, PipelineSettings


def _unit(*rows) -> torch.Tensor:
    """(len(rows), 8) unit vectors: each row a sum of basis vectors."""
    tokens = torch.zeros(len(rows), 8)
    for row, axes in enumerate(rows):
        tokens[row, list(axes)] = 1.0
    return torch.nn.functional.normalize(tokens, dim=-1)


def test_a_token_shared_by_enough_neighbours_is_dropped_and_never_all_of_them():
    tokens = _unit([0], [1], [2], [3])  # token 0 in three neighbours, token 1 in one, tokens 2 and 3 in none
    neighbours = torch.stack([_unit([0], [1], [5]), _unit([6], [0], [7]), _unit([0], [5], [6])])
    assert bursty_keep(tokens, neighbours, 0.8, 2).tolist() == [False, True, True, True]
    assert bursty_keep(tokens, neighbours, 0.8, 3).tolist() == [False, True, True, True]
    assert bursty_keep(tokens, neighbours, 0.8, 4).tolist() == [True] * 4  # only 3 neighbours share it
    assert bursty_keep(tokens, neighbours, 0.8, 1).tolist() == [False, False, True, True]
    # a neighbour's token at cosine 0.71 with token 2 does not match at 0.8, does at 0.7
    near = torch.stack([_unit([2, 4], [5], [6]), _unit([2, 4], [6], [7])])
    assert bursty_keep(tokens, near, 0.8, 2).tolist() == [True] * 4
    assert bursty_keep(tokens, near, 0.7, 2).tolist() == [True, True, False, True]
    # an image all of whose tokens are shared keeps them all; the batched form says it fell back
    template = _unit([0], [1])
    shared = torch.stack([_unit([0], [1]), _unit([1], [0])])
    assert bursty_keep(template, shared, 0.8, 2).tolist() == [True, True]
    pool = torch.cat([shared, neighbours[2:, :2]])  # rows 0, 1: share both tokens; row 2: shares token 0 only
    masks = bursty_keep_batch(torch.stack([template, template]), pool, torch.tensor([[0, 1, -1], [0, 2, -1]]),
                              0.8, 2)
    assert masks.keep.tolist() == [[True, True], [False, True]] and masks.fell_back.tolist() == [True, False]


def test_pair_masks_leave_the_pair_out_of_the_count():
    matched = torch.tensor([[True, True, False], [True, False, False], [True, False, True]])  # 3 neighbours x 3
    assert pair_keep(matched, 2)[0].tolist() == [False, True, True]
    assert pair_keep(matched, 2, partner=0)[0].tolist() == [False, True, True]  # token 0 still in 2 others
    assert pair_keep(matched, 3, partner=0) == (pytest.approx(torch.ones(3, dtype=torch.bool)), False)
    assert pair_keep(torch.ones(2, 3, dtype=torch.bool), 2)[1] and not pair_keep(torch.ones(2, 3, dtype=torch.bool),
                                                                                     2, partner=1)[1]


def test_local_masks_of_a_query_and_its_candidates():
    frame, settings = [0], ContentSettings(0.8, 2, 3)
    query = _unit(frame, [1])
    # candidate 0 is a copy of the query's content in the frame, 1 and 2 other photos in the frame, 3 unframed
    candidates = torch.stack([_unit(frame, [1]), _unit(frame, [2]), _unit(frame, [3]), _unit([4], [5])])
    masks = local_keep_masks(query, candidates, settings)
    # the neighbours are the first 3 candidates; in the pair of candidate r, r itself does not count: the frame is
    # still shared with the 2 others; the query's content, shared with candidate 0 alone, stays
    assert masks.query.tolist() == [[False, True]] * 4
    assert masks.reference.tolist() == [[False, True], [False, True], [False, True], [True, True]]
    assert masks.kept_whole == 0
    copies = torch.stack([_unit(frame, [1]), _unit(frame, [1]), _unit([4], [5])])  # two copies of the query
    masks = local_keep_masks(query, copies, ContentSettings(0.8, 2, 3))
    assert masks.query.tolist() == [[True, True], [True, True], [True, True]]  # a copy of copies keeps its content
    assert masks.reference.tolist() == [[True, True]] * 3
    assert masks.kept_whole == 1  # the query beside the unrelated image: every token in both copies, kept whole
    masks = local_keep_masks(query, copies, ContentSettings(0.8, 1, 3))  # one other image sharing a token is enough
    assert masks.query.tolist()[2] == [True, True] and masks.kept_whole == 5  # all shared: kept whole
    with pytest.raises(ConfigError, match="content_min_images"):
        ContentSettings(0.8, 0, 3)
    with pytest.raises(ConfigError, match="content_tau must be a cosine strictly between -1 and 1, got 1.5"):
        ContentSettings(1.5)
    with pytest.raises(ConfigError, match="cannot exceed content_neighbours"):
        ContentSettings(0.8, 4, 3)


def test_content_descriptors_re_run_the_descriptor():
    descriptor, _, _ = tiny_models(0)
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        whole = descriptor.get_image_features(pixels)
        assert torch.allclose(content_descriptors(descriptor, pixels, torch.ones(3, 4, dtype=torch.bool)), whole,
                              atol=1e-6)
        keep = torch.tensor([[True, False, True, True], [True] * 4, [False, True, True, False]])
        content = content_descriptors(descriptor, pixels, keep)
        for row in range(3):  # one image at a time, its sequence built by hand
            embedded = descriptor.vit.embeddings(pixels[row:row + 1])
            sequence = torch.cat([embedded[:, :1], embedded[:, 1:][:, keep[row]]], 1)
            hidden, _, _ = descriptor.vit.run_blocks(sequence)
            assert torch.allclose(content[row], descriptor.head(descriptor.vit.norm(hidden)[:, 0])[0], atol=1e-6)
    assert torch.allclose(content[1], whole[1], atol=1e-6) and not torch.allclose(content[0], whole[0], atol=1e-3)


def test_fusion_of_content_tokens():
    _, matcher, _ = tiny_models(0)
    with torch.no_grad():
        encoded = matcher.pre_fusion_tokens(torch.randn(3, 3, 32, 32))
        every = torch.ones(4, dtype=torch.bool)
        logit = matcher.fuse(encoded[:1], encoded[1:2])[0][0]
        assert torch.allclose(fuse_content(matcher, encoded[0], encoded[1], every, every), logit, atol=1e-6)
        keep = torch.tensor([True, False, False, True])
        masked = fuse_content(matcher, encoded[0], encoded[1], keep, every)
        by_hand = matcher.fuse(encoded[:1, [0, 1, 4]], encoded[1:2])[0][0]
        assert torch.allclose(masked, by_hand, atol=1e-6) and not torch.allclose(masked, logit, atol=1e-4)
        # pairs of several lengths batched together equal each pair alone
        queries = [keep_tokens(encoded[0], keep), encoded[1], keep_tokens(encoded[2], keep), encoded[0]]
        references = [encoded[1], encoded[2], keep_tokens(encoded[0], ~keep), encoded[2]]
        logits = fuse_kept(lambda q, r: matcher.fuse(q, r)[0], queries, references, batch_size=2)
        alone = [matcher.fuse(q[None], r[None])[0][0] for q, r in zip(queries, references)]
    assert torch.allclose(logits, torch.stack(alone), atol=1e-6)


@pytest.fixture(scope="module")
def framed(tmp_path_factory):
    """Six images: the left half one frame, the right half random (``F0``..``F5``), and a plain random one. With the
    tiny random models the frame's two tokens match across images (cosine about 1), the others do not."""
    folder = tmp_path_factory.mktemp("framed")
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 255, (32, 16, 3), dtype=np.uint8)
    for i in range(6):
        half = rng.integers(0, 255, (32, 16, 3), dtype=np.uint8)
        Image.fromarray(np.concatenate([frame, half], 1)).save(folder / f"F{i}.png")
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / "P.png")
    return folder


def test_collection_masks_drop_the_shared_frame(framed, capsys):
    _, matcher, processor = tiny_models(0)
    source = ImageFolderSource(framed)
    files = source.lookup()
    neighbours = {image_id: [other for other in source.ids if other != image_id] for image_id in source.ids}
    assert walk_order(["F3", "P"], {"F3": ["F1"], "F1": ["F3"]}) == ["F3", "F1", "P"]
    cache = TokenCache(matcher.pre_fusion_tokens, processor, files, capacity=3, batch_size=2)
    found = neighbour_matches(source.ids, neighbours, cache, ContentSettings(0.8, 2, 10), progress=True)
    bar = capsys.readouterr().err  # the images done and the encoder passes run (a long stage at scale)
    assert "content tokens: 100%" in bar and "7/7" in bar and "encoder_passes=" in bar
    frame = [False, True, False, True]  # the 2x2 grid: the left column is the frame
    assert {image_id: found.keep(image_id).tolist() for image_id in source.ids} == {
        **{f"F{i}": frame for i in range(6)}, "P": [True] * 4}
    assert found.keep("F0", "F1").tolist() == frame and found.keep("F0", "P").tolist() == frame
    assert found.neighbours["F0"] == ["F1", "F2", "F3", "F4", "F5", "P"]
    assert found.matched["F0"].tolist() == [[True, False, True, False]] * 5 + [[False] * 4]
    assert "7 images compared with their neighbours, 42.9% of their tokens shared with 2 or more" in found.summary()
    three = neighbour_matches(["F0"], {"F0": ["F1", "P"]}, cache, ContentSettings(0.8, 2, 10))
    assert three.keep("F0").tolist() == [True] * 4  # shared with one neighbour only
    assert three.keep("P") is None  # not asked: keeps every token
    assert cache.encoded == len(source.ids)  # one request held them all
    cache.get(["P"])  # back to 3 images
    cache.get(["F0", "F1", "F2", "F3"])
    assert cache.encoded > len(source.ids)  # a cache of 3 images encodes some again
    assert pair_neighbours([Prediction("a", "b", 0.2), Prediction("c", "a", 0.9)]) == {
        "a": ["c", "b"], "b": ["a"], "c": ["a"]}


def test_dedup_matcher_scores_content_tokens_and_keeps_them_apart_in_its_cache(framed, tmp_path):
    descriptor, matcher, processor = tiny_models(0)
    source = ImageFolderSource(framed)

    def run(content: bool, folder):
        lines: list[str] = []
        result = dedup(source, Descriptor("tiny", descriptor, processor), (matcher, processor), threshold=0.5,
                       config=DetectConfig(candidates=6, content_tokens=content, fusion_precision="float32"),
                       progress=False, log=lines.append,
                       rescoring_folder=folder)
        return {(p.query_id, p.reference_id): p.score for p in result.pairs}, lines

    whole, _ = run(False, tmp_path / "rescoring")
    identity_off = json.loads((tmp_path / "rescoring" / "identity.json").read_text())
    content, lines = run(True, tmp_path / "rescoring")  # the same folder: the chunks of the run without are stale
    identity_on = json.loads((tmp_path / "rescoring" / "identity.json").read_text())
    assert identity_on["settings"] != identity_off["settings"]
    fresh, _ = run(True, tmp_path / "fresh")
    assert content == fresh and set(content) == set(whole)
    assert any("matcher content tokens" in line and "7 images compared with their neighbours" in line
               for line in lines)
    # the oracle: each framed pair fused without the frame's tokens, the plain image whole
    with torch.no_grad():
        pixels = processor(images=[Image.open(framed / f"{i}.png") for i in ("F0", "F1", "P")],
                           return_tensors="pt")["pixel_values"]
        encoded = matcher.pre_fusion_tokens(pixels)
        frame = torch.tensor([False, True, False, True])
        every = torch.ones(4, dtype=torch.bool)
        framed_pair = torch.sigmoid(fuse_content(matcher, encoded[0], encoded[1], frame, frame)).item()
        plain_pair = torch.sigmoid(fuse_content(matcher, encoded[0], encoded[2], frame, every)).item()
    assert content[("F0", "F1")] == pytest.approx(framed_pair, abs=1e-5)
    assert content[("F0", "P")] == pytest.approx(plain_pair, abs=1e-5)
    assert whole[("F0", "F1")] != pytest.approx(framed_pair, abs=1e-4)


def test_detect_masks_each_query_with_its_candidates(framed, tmp_path):
    descriptor, matcher, processor = tiny_models(0)
    references = ImageFolderSource(framed)
    queries_folder = tmp_path / "queries"
    queries_folder.mkdir()
    Image.open(framed / "F2.png").save(queries_folder / "q.png")
    queries = ImageFolderSource(queries_folder)
    results = {}
    for content in (False, True):
        lines: list[str] = []
        found = detect(queries, references, [Descriptor("tiny", descriptor, processor)], (matcher, processor),
                       config=DetectConfig(k=7, candidates=7, content_tokens=content, content_neighbours=3,
                                           fusion_precision="float32", encoder_precision="float32"),  # as the oracle
                       progress=False, log=lines.append)
        results[content] = {p.reference_id: p.score for p in found.predictions}
    assert any("of the query's 3 best candidates" in line and "pairs dropped" in line for line in lines)
    # the oracle: the scorer on the same candidate order, masks from local_keep_masks
    order = sorted(results[False], key=lambda r: -next(p.score for p in found.candidates if p.reference_id == r))
    with torch.no_grad():
        images = [Image.open(queries_folder / "q.png")] + [Image.open(framed / f"{r}.png") for r in order]
        encoded = matcher.pre_fusion_tokens(processor(images=images, return_tensors="pt")["pixel_values"])
        tokens = unit_patch_tokens(encoded)
        masks = local_keep_masks(tokens[0], tokens[1:], ContentSettings(0.8, 2, 3))
        expected = {r: torch.sigmoid(fuse_content(matcher, encoded[0], encoded[1 + i], masks.query[i],
                                                  masks.reference[i])).item() for i, r in enumerate(order)}
    assert not masks.query.all() and masks.query.any()  # the frame goes, the rest stays
    assert results[True] == pytest.approx(expected, abs=1e-5)
    assert results[True] != pytest.approx(results[False], abs=1e-4)


def test_descriptor_content_tokens_change_the_candidates_scores(framed, tmp_path):
    descriptor, _, processor = tiny_models(0)
    source = ImageFolderSource(framed)
    scores = {}
    for content in (False, True):
        lines: list[str] = []
        result = dedup(source, Descriptor("tiny", descriptor, processor), None, threshold=2.0,
                       config=DetectConfig(candidates=6, descriptor_content_tokens=content, descriptor_content_tau=0.8),
                       settings=DedupSettings(collection=CollectionNormalisation(on=False)),  # raw cosines: the check
                       progress=False, log=lines.append)
        scores[content] = {(p.query_id, p.reference_id): p.score for p in result.candidates}
    assert any("descriptor content tokens of the images" in line and "6 images described again" in line
               for line in lines)
    with torch.no_grad():
        pixels = processor(images=[Image.open(framed / f"F{i}.png") for i in (0, 1)],
                           return_tensors="pt")["pixel_values"]
        content = content_descriptors(descriptor, pixels, torch.tensor([[False, True, False, True]] * 2))
    assert scores[True][("F0", "F1")] == pytest.approx(float(content[0] @ content[1]), abs=1e-5)
    assert scores[False][("F0", "F1")] != pytest.approx(scores[True][("F0", "F1")], abs=1e-4)


def test_content_settings_are_checked_and_follow_the_views_and_runtime():
    with pytest.raises(ConfigError, match="content_tau must be a cosine"):
        DetectConfig(content_tau=1.0)
    with pytest.raises(ConfigError, match="descriptor_content_tau must be a cosine"):
        DetectConfig(descriptor_content_tau=-2)
    with pytest.raises(ConfigError, match="content_min_images must be a whole number of at least 1, got 0"):
        DetectConfig(content_min_images=0)
    with pytest.raises(ConfigError, match="content_neighbours must be a whole number"):
        DetectConfig(content_neighbours=2.5)
    with pytest.raises(ConfigError, match="matcher_lce 'paper' needs content_tokens=False"):
        DetectConfig(matcher_lce="paper")
    with pytest.raises(ConfigError, match="descriptor_lce 'authors' needs descriptor_content_tokens=False"):
        DetectConfig(descriptor_lce="authors", descriptor_content_tokens=True, content_tokens=False)
    assert DetectConfig().content_tokens and not DetectConfig.from_preset("paper").content_tokens
    assert not PipelineSettings(preset="fast", overrides={"matcher_lce": "paper"}).config().content_tokens
    assert not PipelineSettings(PipelineModels(runtime="onnx")).config().content_tokens
    assert PipelineSettings().config().content_tokens
    with pytest.raises(ConfigError, match="needs content_tokens=False"):
        PipelineSettings(overrides={"matcher_lce": "all", "content_tokens": True}).config()
    _, matcher, processor = tiny_models(0)
    with pytest.raises(ConfigError, match="whole images only"):
        MatcherScorer(matcher, processor, lce="paper", content=ContentSettings(0.8))


def test_the_command_line_options_reach_the_run(framed, tmp_path, capsys):
    from conftest import run_cli, save_tiny_models

    models = save_tiny_models(tmp_path / "models", seed=0)
    common = ("dedup", framed, "--model", models["descriptor"], "--matcher", models["matcher"], "--threshold", 0.5)
    for flags, shown in (((), "matcher (tau 0.8): tokens shared with 2 of 10 neighbour images dropped"),
                         (("--no-content-tokens",), "off"),
                         (("--no-content-tokens", "--descriptor-content-tokens"), "descriptor (tau 0.6): tokens"),
                         (("--matcher-lce", "paper"), "off")):
        output = tmp_path / f"run{len(flags)}{flags[-1] if flags else ''}"
        code, _, err = run_cli(capsys, *common, *flags, "--output", output)
        assert code == 0, err
        assert f"content tokens</th><td>{shown}" in (output / "report.html").read_text()
    code, _, err = run_cli(capsys, *common, "--matcher-lce", "paper", "--content-tokens", "--output", tmp_path / "x")
    assert code == 2 and "content tokens apply to whole images only" in err


def test_matches_computed_in_blocks_equal_one_pass(monkeypatch):
    from copynce_hf.retrieval.content import tokens as content_tokens

    generator = torch.Generator().manual_seed(0)
    tokens = torch.nn.functional.normalize(torch.randn(5, 6, 4, generator=generator), dim=-1)
    others = torch.nn.functional.normalize(torch.randn(3, 7, 4, generator=generator), dim=-1)
    one_pass = torch.einsum("nlc,mkc->nmlk", tokens, others).amax(-1) > 0.5
    assert 0 < one_pass.float().mean() < 1
    for elements in (1 << 24, 50, 1):  # everything at once; an image against one other at a time; less than that
        monkeypatch.setattr(content_tokens, "_BLOCK_ELEMENTS", elements)
        assert torch.equal(content_tokens.matched_in(tokens, others, 0.5), one_pass)


def test_pair_matches_kept_from_query_to_query_equal_matching_anew():
    """A candidate's matches in the other candidates, kept by image ids, are those matched_in computes for each query's
    set; a second query sharing candidates matches only the new pairs, and the oldest pairs go past the capacity."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.nn.functional.normalize(torch.randn(6, 9, 8, generator=generator), dim=-1)
    tokens[3, :4] = tokens[1, :4]  # shared regions: some tokens match across images
    ids = [f"r{i}" for i in range(6)]
    kept = PairMatches(tau=0.5, capacity=100)
    first, second = [0, 1, 2, 3], [1, 3, 4, 5]
    for order in (first, second):
        found = kept.among([ids[i] for i in order], tokens[order], top=2)
        assert torch.equal(found, matched_in(tokens[order], tokens[order][:2], 0.5))
    assert found[1, 0, :4].all()  # r3's shared tokens in r1
    assert kept.computed == 8 + 6  # the second query's pairs (r1, r1), (r3, r1) were kept from the first
    small = PairMatches(tau=0.5, capacity=3)
    small.among(ids[:4], tokens[:4], top=2)
    assert len(small) == 3
