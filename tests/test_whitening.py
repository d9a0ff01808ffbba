"""Descriptor whitening (SSCD's post-processing): the learned transform, its storage with the index, the
search through it, ``copynce index/detect --whiten-from`` and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli, save_tiny_models, tiny_models
from PIL import Image

from copynce_hf.modeling.errors import ConfigError, PredictionsError
from copynce_hf.retrieval import (
    CollectionNormalisation,
    Descriptor,
    DescriptorIndex,
    DescriptorSet,
    DetectConfig,
    ImageFolderSource,
    Whitening,
    detect,
    search_references,
)


def correlated(count: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    """``count`` unit vectors with a strongly anisotropic covariance and a common offset (as real descriptors)."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim)) * np.linspace(3.0, 0.1, dim)[:, None]
    vectors = rng.normal(size=(count, dim)) @ mixing + 4.0
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("dim", [None, 5])
def test_whitened_sample_has_zero_mean_and_identity_covariance(dim):
    sample = correlated(400)
    whitening = Whitening.fit(sample, dim)
    raw = whitening.whiten(sample, normalise=False)
    kept = dim or 16
    assert raw.shape == (400, kept) and whitening.dim == kept and whitening.samples == 400
    np.testing.assert_allclose(raw.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(np.cov(raw, rowvar=False), np.eye(kept), atol=1e-3)
    # before whitening the sample is far from it: its directions share a large common component
    assert np.abs(np.cov(sample, rowvar=False) - np.eye(16)).max() > 0.5
    np.testing.assert_allclose(np.linalg.norm(whitening.whiten(sample), axis=1), 1.0, atol=1e-5)


def test_too_few_or_degenerate_samples_and_bad_dimensions_are_refused():
    with pytest.raises(ConfigError, match="whitening to 16 dimensions needs at least 17 sample images, got 10"):
        Whitening.fit(correlated(10))
    Whitening.fit(correlated(10), dim=9)  # 10 samples span 9 directions
    with pytest.raises(ConfigError, match="between 1 and the descriptor dimension 16, got 17"):
        Whitening.fit(correlated(100), dim=17)
    repeated = np.repeat(correlated(3), 20, axis=0)  # 60 samples of 3 images: 2 directions
    with pytest.raises(ConfigError, match="vary in only 2 of the 4 whitened directions .* at most 2"):
        Whitening.fit(repeated, dim=4)
    with pytest.raises(PredictionsError, match="do not fit a whitening learned on 16-d"):
        Whitening.fit(correlated(100)).whiten(np.zeros((2, 8), np.float32))


def test_index_stores_the_whitening_and_searches_whitened_queries(tmp_path):
    whitening = Whitening.fit(correlated(300, seed=1), dim=8)
    references = DescriptorSet([f"R{i}" for i in range(50)], correlated(50, seed=2))
    queries = DescriptorSet([f"Q{i}" for i in range(5)], correlated(5, seed=3))
    index = DescriptorIndex.build(references, whitening=whitening)
    index.save(tmp_path / "idx")
    assert json.loads((tmp_path / "idx" / "index.json").read_text())["whitened_dim"] == 8
    loaded = DescriptorIndex.load(tmp_path / "idx")
    np.testing.assert_array_equal(loaded.whitening.mean, whitening.mean)
    np.testing.assert_array_equal(loaded.whitening.projection, whitening.projection)
    assert loaded.whitening.samples == 300
    np.testing.assert_array_equal(loaded.references.descriptors, references.descriptors)  # kept as given
    predictions = search_references(loaded, queries, 3)
    expected = whitening.whiten(queries.descriptors) @ whitening.whiten(references.descriptors).T
    for p in predictions:
        row, column = queries.ids.index(p.query_id), references.ids.index(p.reference_id)
        assert p.score == pytest.approx(float(expected[row, column]), abs=1e-5)
    assert {p.reference_id for p in predictions if p.query_id == "Q0"} == {
        references.ids[i] for i in np.argsort(-expected[0])[:3]}
    # score normalisation compares queries and auxiliary images whitened too
    auxiliary = DescriptorSet([f"A{i}" for i in range(20)], correlated(20, seed=4))
    normalised = search_references(loaded, queries, 3, auxiliary=auxiliary, k_end=4)
    bias = np.sort(whitening.whiten(queries.descriptors) @ whitening.whiten(auxiliary.descriptors).T, axis=1)
    bias = bias[:, ::-1][:, :5].mean(axis=1)
    for plain, shifted in zip(predictions, normalised):
        assert shifted.score == pytest.approx(plain.score - bias[queries.ids.index(plain.query_id)], abs=1e-5)
    with pytest.raises(ConfigError, match="stretching and whitening are alternatives"):
        search_references(loaded, queries, 3, auxiliary=auxiliary, stretch=True)

    (tmp_path / "idx" / "whitening.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PredictionsError, match="whitening file .*whitening.safetensors.* cannot be read"):
        DescriptorIndex.load(tmp_path / "idx")
    (tmp_path / "idx" / "whitening.safetensors").unlink()
    with pytest.raises(PredictionsError, match="whitening.safetensors is missing"):
        DescriptorIndex.load(tmp_path / "idx")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """refs/ (6 random images), queries/ (flipped copies of two of them), sample/ (20 unrelated images)."""
    root = tmp_path_factory.mktemp("whitening")
    rng = np.random.default_rng(0)
    for name in ("refs", "queries", "sample"):
        (root / name).mkdir()
    for i in range(6):
        image = Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
        image.save(root / "refs" / f"R{i}.png")
        if i in (1, 4):
            image.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(root / "queries" / f"Q{i}.png")
    for i in range(20):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "sample" / f"S{i:02d}.png")
    return root


def test_copynce_index_whitens_and_search_applies_the_stored_transform(folders, tmp_path, capsys):
    models = save_tiny_models(tmp_path / "models", seed=0)
    code, out, err = run_cli(capsys, "index", folders / "refs", "--model", models["descriptor"], "--output",
                         tmp_path / "idx", "--whiten-from", folders / "sample", "--whiten-dim", 8)
    assert code == 0, err
    assert "whitened to 8-d from 20 sample views" in out
    index = DescriptorIndex.load(tmp_path / "idx")
    assert index.whitening.dim == 8 and index.index.d == 8 and index.references.dim == 16
    code, out, err = run_cli(capsys, "search", folders / "queries", "--index", tmp_path / "idx", "--k", 2, "--output",
                         tmp_path / "found.csv", "--save-descriptors", tmp_path / "q.safetensors")
    assert code == 0, err
    queries = DescriptorSet.load(tmp_path / "q.safetensors")
    expected = index.whitening.whiten(queries.descriptors) @ index.whitening.whiten(index.references.descriptors).T
    rows = (tmp_path / "found.csv").read_text().splitlines()[1:]
    for row in rows:
        query, reference, score = row.split(",")
        assert float(score) == pytest.approx(
            float(expected[queries.ids.index(query), index.references.ids.index(reference)]), abs=1e-5)

    code, _, err = run_cli(capsys, "index", folders / "refs", "--model", models["descriptor"], "--output",
                       tmp_path / "idx3", "--whiten-from", folders / "refs")
    assert code == 2 and "needs at least 17 sample images, got 6" in err
    code, _, err = run_cli(capsys, "index", folders / "refs", "--model", models["descriptor"], "--output",
                       tmp_path / "idx4", "--whiten-dim", 4)
    assert code == 2 and "--whiten-dim needs --whiten-from FOLDER" in err


def test_detect_whitens_references_queries_and_reuses_its_indexes(folders, tmp_path):
    descriptor, _, processor = tiny_models(0)
    descriptors = [Descriptor("tiny", descriptor, processor, source="tiny-0")]
    queries, references = ImageFolderSource(folders / "queries"), ImageFolderSource(folders / "refs")
    sample = ImageFolderSource(folders / "sample")
    config = DetectConfig(k=3, candidates=3, whiten_dim=6, collection=CollectionNormalisation(on=True))
    lines: list[str] = []
    result = detect(queries, references, descriptors, None, None, config, index_folder=tmp_path / "idx",
                    progress=False, log=lines.append, whiten_from=sample)
    assert any("whitening learned from 20 sample views (16 -> 6 dimensions)" in line for line in lines)
    index = DescriptorIndex.load(tmp_path / "idx" / "tiny" / "references")
    assert index.whitening.dim == 6
    query_views = DescriptorSet.load(tmp_path / "idx" / "tiny" / "queries" / "descriptors.safetensors")
    whitened_references = index.whitening.whiten(index.references.descriptors)
    expected = index.whitening.whiten(query_views.descriptors) @ whitened_references.T
    # collection normalisation (on here) subtracts each reference's background, measured whitened too: its
    # mean whitened cosine to the other references of ranks 2..9 (those it has)
    among = whitened_references @ whitened_references.T
    others = among[~np.eye(len(among), dtype=bool)].reshape(len(among), len(among) - 1)
    assert others.shape[1] > 2
    background = -np.sort(-others, axis=1)[:, 2:10].mean(axis=1)
    for p in result.predictions:
        reference = index.references.ids.index(p.reference_id)
        assert p.score == pytest.approx(
            float(expected[query_views.ids.index(p.query_id), reference] - background[reference]), abs=1e-5)
    # the same run reuses the whitening and the index; without whitening the index is built again, unwhitened
    again = detect(queries, references, descriptors, None, None, config, index_folder=tmp_path / "idx",
                   progress=False, log=lines.append, whiten_from=sample)
    assert [(p.query_id, p.reference_id, p.score) for p in again.predictions] == [
        (p.query_id, p.reference_id, p.score) for p in result.predictions]
    detect(queries, references, descriptors, None, None, DetectConfig(k=3, candidates=3, collection=CollectionNormalisation(on=True)),
           index_folder=tmp_path / "idx", progress=False)
    assert DescriptorIndex.load(tmp_path / "idx" / "tiny" / "references").whitening is None
    # the references' backgrounds were computed again, unwhitened
    assert json.loads((tmp_path / "idx" / "tiny" / "reference-background" / "identity.json").read_text())[
        "whitening"] is None


def test_detect_refuses_a_calibration_for_whitened_descriptor_scores(folders, tmp_path, capsys):
    code, _, err = run_cli(capsys, "detect", folders / "queries", "--references", folders / "refs", "--matcher", "none",
                       "--whiten-from", folders / "sample", "--calibration", tmp_path / "calibration.json",
                       "--output", tmp_path / "found")
    assert code == 2 and "descriptor thresholds without whitening" in err
