"""The matcher's token store: every image encoded once into chunk files, read back equal to a fresh encoder pass,
resumed after a kill, refused for other inputs, and what ``dedup`` scores from it equal to the scorer's own
encoding, on tiny random models and small images in temporary folders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_models
from PIL import Image

from copynce_hf.retrieval import Descriptor, DetectConfig, ImageFolderSource, dedup
from copynce_hf.retrieval.content.store import TokenStore, token_folder, token_identity
from copynce_hf.retrieval.deduplication.settings import DedupSettings
from copynce_hf.retrieval.verify.scorer import MatcherScorer


def noise(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict:
    """id -> file of 7 noise images of different sizes and one file that is not an image."""
    folder = tmp_path_factory.mktemp("images")
    files = {}
    for i in range(7):
        files[f"img{i}"] = folder / f"img{i}.png"
        noise(40 + 5 * i, 50 - 3 * i, i).save(files[f"img{i}"])
    files["broken"] = folder / "broken.png"
    files["broken"].write_bytes(b"not an image")
    return files


def _build(images, folder, model, processor, ids=None, **options) -> TokenStore:
    ids = list(images) if ids is None else ids
    identity = token_identity(model, processor, ids, images)
    return TokenStore.build(ids, images, model.pre_fusion_tokens, processor, folder, identity, progress=False,
                            **options)


def test_stored_tokens_equal_a_fresh_encoder_pass_and_unreadable_images_are_none(images, tmp_path):
    _, matcher, processor = tiny_models(3)
    store = _build(images, tmp_path / "tokens", matcher, processor, batch_size=3, chunk_size=3)
    assert store.encoded == 7 and len(store) == 8
    assert sorted(path.name for path in (tmp_path / "tokens").glob("chunk-*")) == [
        "chunk-000000.safetensors", "chunk-000001.safetensors", "chunk-000002.safetensors"]
    with torch.no_grad():
        for image_id in [f"img{i}" for i in range(7)]:
            pixels = processor(images=Image.open(images[image_id]), return_tensors="pt")["pixel_values"]
            expected = matcher.pre_fusion_tokens(pixels)[0]
            stored = store.tokens(image_id)
            assert stored.shape == expected.shape and stored.dtype == expected.dtype
            torch.testing.assert_close(stored, expected, atol=1e-5, rtol=1e-5)
    assert store.tokens("broken") is None
    assert set(store.get(["img1", "broken", "img1"])) == {"img1", "broken"}
    with pytest.raises(KeyError, match="'elsewhere' is not in the token store"):
        store.tokens("elsewhere")


def test_a_killed_build_resumes_from_its_chunks_and_other_inputs_start_fresh(images, tmp_path, caplog):
    _, matcher, processor = tiny_models(3)
    folder = tmp_path / "tokens"
    first = _build(images, folder, matcher, processor, chunk_size=3)
    reference = {image_id: first.tokens(image_id) for image_id in images}
    # a kill while chunk 1 was written: its file is absent, a temporary file was left behind
    (folder / "chunk-000001.safetensors").unlink()
    (folder / ".chunk-000001.safetensors.partial-123").write_bytes(b"half")
    logs: list[str] = []
    resumed = _build(images, folder, matcher, processor, chunk_size=3, log=logs.append)
    assert resumed.encoded == 3  # chunk 1 only: img3, img4, img5
    assert any("resuming 2 of 3 chunks" in line for line in logs)
    assert not list(folder.glob(".*partial*"))
    for image_id, tokens in reference.items():
        assert (tokens is None and resumed.tokens(image_id) is None) or torch.equal(resumed.tokens(image_id), tokens)
    assert _build(images, folder, matcher, processor, chunk_size=3).encoded == 0
    # a damaged chunk is encoded again, with a warning naming it
    (folder / "chunk-000002.safetensors").write_bytes(b"damaged")
    assert _build(images, folder, matcher, processor, chunk_size=3).encoded == 1  # img6 (broken is unreadable)
    assert "chunk-000002.safetensors: not a chunk of this token store" in caplog.text
    # other weights, or another chunk size: every chunk is encoded again, with a warning naming the change
    _, other, _ = tiny_models(4)
    assert _build(images, folder, other, processor, chunk_size=3).encoded == 7
    assert "changed: model" in caplog.text
    assert _build(images, folder, other, processor, chunk_size=4).encoded == 7
    assert json.loads((folder / "identity.json").read_text())["chunk_size"] == 4


def test_the_scorer_reads_the_store_and_scores_as_it_encodes(images, tmp_path):
    _, matcher, processor = tiny_models(3)
    store = _build(images, tmp_path / "tokens", matcher, processor, chunk_size=4)
    pairs = [("img0", "img1"), ("img0", "img2"), ("img3", "img0"), ("img2", "broken"), ("broken", "img4"),
             ("img5", "img6"), ("img6", "img5")]
    encoding = MatcherScorer(matcher, processor, batch_size=3)
    reading = MatcherScorer(matcher, processor, batch_size=3, query_tokens=store, reference_tokens=store)
    expected = encoding.score(pairs, images, images, progress=False)
    found = reading.score(pairs, images, images, progress=False)
    assert [score is None for score in found] == [score is None for score in expected] == [
        False, False, False, True, True, False, False]
    np.testing.assert_allclose([s for s in found if s is not None], [s for s in expected if s is not None],
                               atol=1e-5)
    # the scorer's own cache encodes queries apart from references: img0, img2, img5 and img6 twice (10 passes)
    assert reading.encoded_views == 0 and encoding.encoded_views == 10
    assert reading.fused_pairs == encoding.fused_pairs == 5
    with pytest.raises(Exception, match="whole images only"):
        MatcherScorer(matcher, processor, lce="paper", reference_tokens=store)


def test_images_a_store_lacks_are_encoded_on_either_side(images, tmp_path):
    """A store of some of the images: the scorer reads those and encodes the others, once each, with the scores of a
    scorer that encodes everything (the crops of a run are not in its token store, the references they meet are)."""
    _, matcher, processor = tiny_models(3)
    store = _build({key: images[key] for key in ("img0", "img1", "img2")}, tmp_path / "tokens", matcher, processor,
                   chunk_size=2)
    pairs = [("img0", "img1"), ("img3", "img1"), ("img3", "img4"), ("img4", "img2"), ("img2", "img5")]
    expected = MatcherScorer(matcher, processor, batch_size=3).score(pairs, images, images, progress=False)
    reading = MatcherScorer(matcher, processor, batch_size=3, query_tokens=store, reference_tokens=store)
    np.testing.assert_allclose(reading.score(pairs, images, images, progress=False), expected, atol=1e-5)
    # encoded: queries img3 and img4 (not stored), references img4 and img5 (not stored); stored ones never
    assert reading.encoded_views == 4 and reading.fused_pairs == 5


def test_dedup_encodes_each_image_once_and_scores_as_without_a_store(tmp_path):
    folder = tmp_path / "collection"
    folder.mkdir()
    for i in range(9):
        noise(48, 40, 10 + i).save(folder / f"R{i}.png")
    noise(48, 40, 11).save(folder / "R1_again.png")
    (folder / "broken.png").write_bytes(b"not an image")  # in no candidate pair, so not in the store
    descriptor, matcher, processor = tiny_models(0)
    source = ImageFolderSource(folder)
    config = DetectConfig(candidates=4, cache_size=2)  # a cache of 2 images: the content stage would re-encode

    def run(tokens_folder):
        return dedup(source, Descriptor("tiny", descriptor, processor), (matcher, processor), threshold=0.5,
                     config=config, settings=DedupSettings(layout_crops=False), progress=False,
                     tokens_folder=tokens_folder)  # the whole images' store (layout crops': test_dedup_layouts.py)

    kept = run(tmp_path / "tokens")
    in_pairs = {image for pair in kept.raw_scores for image in pair}
    # one encoder pass per image of a candidate pair: the content tokens and both orders of every pair read the store
    assert kept.matcher_cost["encoded_views"] == len(in_pairs) == 10
    assert (tmp_path / "tokens" / "identity.json").is_file()
    again = run(tmp_path / "tokens")
    assert again.matcher_cost["encoded_views"] == 0 and again.raw_scores == kept.raw_scores
    temporary = run(None)
    assert temporary.raw_scores.keys() == kept.raw_scores.keys()
    np.testing.assert_allclose([temporary.raw_scores[pair] for pair in kept.raw_scores],
                               list(kept.raw_scores.values()), atol=1e-6)
    with token_folder(None) as scratch:
        assert scratch.is_dir()
    assert not scratch.exists()  # a temporary store is removed at the end


@pytest.mark.slow
def test_two_processes_share_the_chunks_and_read_them_all(images, tmp_path):
    import os
    from pathlib import Path

    from conftest import launch_two_cpu_processes

    _, matcher, processor = tiny_models(3)
    alone = _build(images, tmp_path / "alone", matcher, processor, batch_size=2, chunk_size=2)
    folder = next(iter(images.values())).parent
    repo = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "tests"), os.environ.get("PYTHONPATH", "")])}
    result = launch_two_cpu_processes([str(repo / "tests" / "_token_store_worker.py"), str(folder),
                                       str(tmp_path / "two"), str(tmp_path)], environment)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list((tmp_path / "two").glob("chunk-*.safetensors"))) == 4  # 8 images, 2 a chunk, 2 chunks each
    for rank in (0, 1):
        read = torch.load(tmp_path / f"rank{rank}.pt")
        assert read["processes"] == 2 and read["encoded"] == alone.encoded == 7  # the broken image is not encoded
        for image_id, tokens in read["tokens"].items():  # every process reads every chunk, its own and the other's
            expected = alone.tokens(image_id)
            if expected is None:
                assert tokens is None
            else:  # equal but for the rounding of other thread counts
                torch.testing.assert_close(tokens, expected, atol=1e-5, rtol=1e-5)
