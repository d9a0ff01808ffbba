"""ONNX export and the ONNX Runtime path (``copynce export-onnx``, ``--runtime onnx``): outputs equal PyTorch's.

The embedded models are exported once per module (the cache of ``--runtime onnx`` is that export, so the
command-line tests reuse it); a tiny matcher in the form of folders saved before the authors' options
(segment embeddings, per-image CLS tokens dropped) is exported through the command.
"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from conftest import TINY_VIT, require_extra, shrunk_asset_images
from PIL import Image

from copynce_hf.cli import main
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.modeling.errors import ConfigError, ShapeError
from copynce_hf.retrieval import (
    DescriptorIndex,
    MatcherScorer,
    Prediction,
    read_predictions,
    write_predictions,
)
from copynce_hf.retrieval.content.tokens import ContentSettings
from copynce_hf.runtime.loading import load_model
from copynce_hf.runtime.onnx_export import CACHE_ENV, read_manifest

TOLERANCE = 1e-4
pytestmark = pytest.mark.slow  # the module exports three graphs of the embedded models (a minute on two idle cores)


@pytest.fixture(scope="module", autouse=True)
def onnx_extra():
    """Every test here needs the 'onnx' extra (skips without it; fails in CI)."""
    for module in ("onnx", "onnxruntime", "onnxscript"):
        require_extra(module, "onnx")


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """The cache of ``--runtime onnx`` holding the embedded descriptor and matcher, exported once."""
    root = tmp_path_factory.mktemp("onnx-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root))
        yield {kind: load_model(None, kind, runtime="onnx")[0].folder for kind in ("descriptor", "matcher")}


@pytest.fixture
def use_cache(onnx_cache, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(onnx_cache["descriptor"].parent))
    return onnx_cache


def bundled_pixels(processor) -> torch.Tensor:
    images = [Image.open(path).convert("RGB") for path in sorted(ASSET_IMAGES.glob("*.jpg"))]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def assert_close(onnx_value: torch.Tensor, torch_value: torch.Tensor) -> None:
    assert onnx_value.shape == torch_value.shape
    assert float((onnx_value - torch_value).abs().max()) <= TOLERANCE


def test_descriptor_graph_equals_pytorch_on_bundled_images(onnx_cache):
    model, processor = load_model(None, "descriptor")
    onnx_model, onnx_processor = load_model(onnx_cache["descriptor"], "descriptor", runtime="onnx")
    pixels = bundled_pixels(processor)
    assert torch.equal(pixels, bundled_pixels(onnx_processor))
    with torch.inference_mode():
        expected = model(pixel_values=pixels)
    for batch in (pixels, pixels[:1]):  # the batch axis is dynamic
        got = onnx_model(pixel_values=batch)
        assert_close(got.descriptors, expected.descriptors[: len(batch)])
        assert_close(got.patch_tokens, expected.patch_tokens[: len(batch)])
    manifest = read_manifest(onnx_cache["descriptor"])
    assert manifest["kind"] == "descriptor" and manifest["opset"] == 18
    assert manifest["image_size"] == [model.config.image_size] * 2


def compare_matchers(model, onnx_model, pixels: torch.Tensor) -> None:
    """Encoder tokens, fusion outputs and copy scores of ``pixels`` paired with themselves rolled by one."""
    references = pixels.roll(1, dims=0)
    with torch.inference_mode():
        encoded = model.pre_fusion_tokens(pixels)
        fused = model.fuse(encoded, encoded.roll(1, dims=0))
        full = model(pixel_values=pixels, reference_pixel_values=references)
    assert_close(onnx_model.pre_fusion_tokens(pixels), encoded)
    for got, expected in zip(onnx_model.fuse(encoded, encoded.roll(1, dims=0)), fused):
        assert_close(got, expected)
    onnx_full = onnx_model(pixel_values=pixels, reference_pixel_values=references)
    assert_close(onnx_full.logits.sigmoid(), full.logits.sigmoid())
    assert_close(onnx_full.query_patch_tokens, full.query_patch_tokens)


def test_matcher_graphs_equal_pytorch_on_bundled_images(onnx_cache):
    model, processor = load_model(None, "matcher")
    onnx_model, _ = load_model(onnx_cache["matcher"], "matcher", runtime="onnx")
    compare_matchers(model, onnx_model, bundled_pixels(processor))
    assert read_manifest(onnx_cache["matcher"])["graphs"] == {"encoder": "matcher_encoder.onnx",
                                                              "fusion": "matcher_fusion.onnx"}


def test_matcher_scores_through_the_token_cache_equal_pytorch(onnx_cache):
    files = {path.stem: path for path in sorted(ASSET_IMAGES.glob("*.jpg"))}
    pairs = [(q, r) for q in list(files)[:3] for r in files]
    scores = {}
    for runtime in ("torch", "onnx"):
        model, processor = load_model(onnx_cache["matcher"] if runtime == "onnx" else None, "matcher", runtime=runtime)
        scorer = MatcherScorer(model, processor, batch_size=5, cache_size=64, fusion_precision="float32")
        scores[runtime] = np.array(scorer.score(pairs, files, files, progress=False))
        assert scorer.encoded_views == 3 + len(files)  # each image encoded once, whatever the runtime
    np.testing.assert_allclose(scores["onnx"], scores["torch"], atol=TOLERANCE, rtol=0)
    with pytest.raises(ConfigError, match="the ONNX fusion graph does not take: use --runtime torch"):
        MatcherScorer(model, processor, content=ContentSettings(0.8))  # the last model loaded: ONNX


def test_a_multi_size_descriptor_exports_with_its_resizes_and_takes_its_largest_size(tmp_path, capsys):
    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor

    torch.manual_seed(0)
    model = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=16, inference_sizes=[32, 48],
                                                           **TINY_VIT)).eval()
    model.save_pretrained(tmp_path / "tiny")
    CopyNCEImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "tiny")
    assert main(["--quiet", "export-onnx", str(tmp_path / "tiny"), str(tmp_path / "small")]) == 2
    assert "makes 32x32 inputs but the model's largest inference size is 48" in capsys.readouterr().err
    CopyNCEImageProcessor(size={"height": 48, "width": 48}).save_pretrained(tmp_path / "tiny")
    assert main(["--quiet", "export-onnx", str(tmp_path / "tiny"), str(tmp_path / "exported")]) == 0
    onnx_model, processor = load_model(tmp_path / "exported", "descriptor", runtime="onnx")
    pixels = bundled_pixels(processor)
    assert pixels.shape[-2:] == (48, 48) and read_manifest(tmp_path / "exported")["image_size"] == [48, 48]
    with torch.inference_mode():
        expected = model(pixel_values=pixels)
    assert_close(onnx_model(pixel_values=pixels).descriptors, expected.descriptors)


def test_export_onnx_command_on_a_tiny_matcher_of_the_old_form(tmp_path, capsys):
    from copynce_hf import CopyNCEImageProcessor, CopyNCEMatcherConfig, CopyNCEMatcherModel

    torch.manual_seed(0)
    config = CopyNCEMatcherConfig(num_fusion_layers=1, segment_embeddings=True, keep_image_cls_tokens=False,
                                  classifier_layer_norm=False, patch_token_layer_norm=False, **TINY_VIT)
    model = CopyNCEMatcherModel(config).eval()
    with torch.no_grad():
        model.segment_embeddings.normal_()  # zero at initialisation: make them count
    model.save_pretrained(tmp_path / "tiny")
    CopyNCEImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "tiny")
    torch_messages = []  # what the exporter's registry logs (torch prints it through its own handler)
    collect = logging.Handler()
    collect.emit = lambda record: torch_messages.append(record.getMessage())
    logging.getLogger("torch.onnx._internal.exporter._registration").addHandler(collect)
    try:
        code = main(["--quiet", "export-onnx", str(tmp_path / "tiny"), str(tmp_path / "exported")])
    finally:
        logging.getLogger("torch.onnx._internal.exporter._registration").removeHandler(collect)
    out = capsys.readouterr().out
    assert code == 0
    assert not [text for text in torch_messages if "torchvision is not installed" in text]  # the exporter's notes
    assert "matcher_encoder.onnx, matcher_fusion.onnx (opset 18" in out
    onnx_model, processor = load_model(tmp_path / "exported", "matcher", runtime="onnx")
    compare_matchers(model, onnx_model, bundled_pixels(processor))
    with pytest.raises(ShapeError, match=r"take \(B, 3, 32, 32\) pixel_values, got \(1, 3, 64, 64\)"):
        onnx_model.pre_fusion_tokens(torch.zeros(1, 3, 64, 64))
    # an exported folder is refused by the PyTorch runtime, and a missing graph is named
    with pytest.raises(ConfigError, match="is an ONNX export .*pass --runtime onnx"):
        load_model(tmp_path / "exported", "matcher")
    (tmp_path / "exported" / "matcher_fusion.onnx").unlink()
    with pytest.raises(ConfigError, match="fusion graph matcher_fusion.onnx is missing"):
        load_model(tmp_path / "exported", "matcher", runtime="onnx")
    with pytest.raises(ConfigError, match="holds an exported matcher; a descriptor is needed"):
        (tmp_path / "exported" / "matcher_fusion.onnx").write_bytes(b"")
        load_model(tmp_path / "exported", "descriptor", runtime="onnx")


def test_index_with_the_onnx_runtime_equals_the_torch_runtime(use_cache, tmp_path, capsys):
    (tmp_path / "refs").mkdir()
    images = shrunk_asset_images(tmp_path / "refs", 96)
    for runtime in ("torch", "onnx"):
        code = main(["--quiet", "index", str(images), "--runtime", runtime, "--output", str(tmp_path / runtime)])
        assert code == 0, capsys.readouterr().err
    torch_index, onnx_index = (DescriptorIndex.load(tmp_path / runtime) for runtime in ("torch", "onnx"))
    assert onnx_index.references.ids == torch_index.references.ids
    np.testing.assert_allclose(onnx_index.references.descriptors, torch_index.references.descriptors,
                               atol=TOLERANCE, rtol=0)
    assert json.loads((tmp_path / "onnx" / "index.json").read_text())["runtime"] == "onnx"
    cache = use_cache["descriptor"].parent
    assert sorted(cache.iterdir()) == sorted(use_cache.values())  # the embedded descriptor's export was reused


def cropped_queries(tmp_path):
    """``(queries, references)``: the bundled images shrunk to 96 pixels, and crops of four of them."""
    (tmp_path / "refs").mkdir()
    references = shrunk_asset_images(tmp_path / "refs", 96)
    (tmp_path / "queries").mkdir()
    for path in sorted(references.glob("*.jpg"))[:4]:
        image = Image.open(path)
        image.crop((0, 0, image.width * 3 // 4, image.height * 3 // 4)).save(tmp_path / "queries" / f"q-{path.name}")
    return tmp_path / "queries", references


def test_detect_with_the_onnx_runtime_equals_the_torch_runtime(use_cache, tmp_path, capsys):
    _, references = cropped_queries(tmp_path)
    predictions = {}
    for runtime in ("torch", "onnx"):
        code = main(["--quiet", "detect", str(tmp_path / "queries"), "--references", str(references), "--runtime",
                     runtime, "--candidates", "3", "--k", "3", "--gallery", "1", "--output", str(tmp_path / runtime),
                     "--no-content-tokens", "--fusion-precision", "float32",
                     "--encoder-precision", "float32"])  # as ONNX Runtime can, on both
        assert code == 0, capsys.readouterr().err
        predictions[runtime] = {(p.query_id, p.reference_id): p.score
                                for p in read_predictions(tmp_path / runtime / "predictions.csv")}
    assert predictions["onnx"].keys() == predictions["torch"].keys()
    for pair, score in predictions["torch"].items():
        assert abs(predictions["onnx"][pair] - score) <= TOLERANCE, pair
    assert "(ONNX Runtime)" in (tmp_path / "onnx" / "report.html").read_text(encoding="utf-8")


def test_match_with_the_onnx_runtime_equals_the_torch_runtime(use_cache, tmp_path, capsys):
    """``copynce match --runtime onnx`` (the embedded matcher, exported once into the cache) scores every candidate
    pair as the PyTorch matcher does."""
    queries, references = cropped_queries(tmp_path)
    pairs = [Prediction(query.stem, reference.stem, 0.0) for query in sorted(queries.iterdir())
             for reference in sorted(references.iterdir())[:3]]  # each query's original among them, or not
    write_predictions(tmp_path / "candidates.csv", pairs)
    scores = {}
    for runtime in ("torch", "onnx"):
        code = main(["--quiet", "match", str(tmp_path / "candidates.csv"), "--queries", str(queries), "--references",
                     str(references), "--runtime", runtime, "--output", str(tmp_path / f"{runtime}.csv"),
                     "--fusion-precision", "float32"])
        assert code == 0, capsys.readouterr().err
        scores[runtime] = {(p.query_id, p.reference_id): p.score for p in read_predictions(tmp_path / f"{runtime}.csv")}
    assert scores["torch"].keys() == {(p.query_id, p.reference_id) for p in pairs}
    assert scores["onnx"].keys() == scores["torch"].keys()
    for pair, score in scores["torch"].items():
        assert abs(scores["onnx"][pair] - score) <= TOLERANCE, pair
    assert max(scores["torch"].values()) > 0.5 > min(scores["torch"].values())  # copies and non-copies compared
    assert sorted(use_cache["matcher"].parent.iterdir()) == sorted(use_cache.values())  # the cached export reused



def test_dedup_with_the_onnx_runtime_equals_the_torch_runtime(use_cache, tmp_path, capsys):
    """``copynce dedup --runtime onnx`` (the embedded descriptor and matcher from the cache) verifies the same pairs
    with the same scores and finds the same groups as the PyTorch models."""
    queries, references = cropped_queries(tmp_path)
    collection = tmp_path / "collection"
    shutil.copytree(references, collection)
    for query in queries.iterdir():  # four crops of references: four groups to find
        shutil.copy(query, collection / query.name)
    pairs, groups = {}, {}
    for runtime in ("torch", "onnx"):
        quiet = ["--quiet"] if runtime == "torch" else []  # the ONNX run's progress lines are checked below
        # one given threshold for both: a self-calibrated one is chosen from each runtime's own scores (and the
        # embedded matcher's, about 0.9996, lies above these crops' scores: no group would be compared)
        code = main([*quiet, "dedup", str(collection), "--runtime", runtime, "--candidates", "2", "--gallery", "1",
                     "--threshold", "0.5", "--output", str(tmp_path / runtime), "--no-content-tokens",
                     "--fusion-precision", "float32"])  # as ONNX Runtime can
        err = capsys.readouterr().err
        assert code == 0, err
        pairs[runtime] = {(p.query_id, p.reference_id): p.score
                          for p in read_predictions(tmp_path / runtime / "pairs.csv")}
        groups[runtime] = [line.split(",")[:2] for line in (tmp_path / runtime / "groups.csv").read_text().splitlines()]
    assert pairs["onnx"].keys() == pairs["torch"].keys()
    for pair, score in pairs["torch"].items():
        assert abs(pairs["onnx"][pair] - score) <= TOLERANCE, pair
    assert groups["onnx"] == groups["torch"] and len({group for group, _ in groups["torch"][1:]}) >= 1
    assert "(ONNX Runtime)" in (tmp_path / "onnx" / "report.html").read_text(encoding="utf-8")
    assert "matcher (ONNX Runtime)," in err  # the progress line names the runtime as the report does
    torch_cache, onnx_cache = (json.loads((tmp_path / runtime / "indexes" / "embedded-descriptor" / "references" /
                                           "identity.json").read_text()) for runtime in ("torch", "onnx"))
    # a torch index cache is not taken for the ONNX one: the caches are tied to the models' weights (the ONNX graphs)
    assert onnx_cache["model"] != torch_cache["model"] and onnx_cache["files"] == torch_cache["files"]


def test_calibrate_with_the_onnx_runtime_equals_the_torch_runtime(use_cache, tmp_path, capsys):
    """``copynce calibrate --runtime onnx`` chooses the thresholds the PyTorch models give (same copies, same
    scores to TOLERANCE) and records the runtime."""
    _, references = cropped_queries(tmp_path)
    calibrations = {}
    for runtime in ("torch", "onnx"):
        code = main(["--quiet", "calibrate", str(references), "--sample", "3", "--num-distractors", "2", "--k", "3",
                     "--candidates", "3", "--runtime", runtime, "--output", str(tmp_path / f"{runtime}.json"),
                     "--no-content-tokens", "--encoder-precision", "float32"])  # as ONNX Runtime can
        assert code == 0, capsys.readouterr().err
        calibrations[runtime] = json.loads((tmp_path / f"{runtime}.json").read_text())
    torch_file, onnx_file = calibrations["torch"], calibrations["onnx"]
    assert (torch_file["provenance"].pop("runtime"), onnx_file["provenance"].pop("runtime")) == ("torch", "onnx")
    assert onnx_file["pipeline"] == torch_file["pipeline"] and onnx_file["provenance"] == torch_file["provenance"]
    assert set(torch_file["stages"]) == {"descriptor", "matcher"}
    for stage, rows in torch_file["stages"].items():
        for torch_row, onnx_row in zip(rows, onnx_file["stages"][stage], strict=True):
            assert (onnx_row["precision"], onnx_row["recall"]) == (torch_row["precision"], torch_row["recall"])
            if torch_row["threshold"] is None:
                assert onnx_row["threshold"] is None
            else:
                assert abs(onnx_row["threshold"] - torch_row["threshold"]) <= TOLERANCE, (stage, torch_row)
    assert any(row["threshold"] is not None for rows in torch_file["stages"].values() for row in rows)

def test_weight_fingerprint_of_an_onnx_model_follows_its_graph_files(onnx_cache, tmp_path):
    from copynce_hf.retrieval.work_folder import model_fingerprint

    first = model_fingerprint(load_model(onnx_cache["matcher"], "matcher", runtime="onnx")[0])
    assert model_fingerprint(load_model(onnx_cache["matcher"], "matcher", runtime="onnx")[0]) == first
    assert model_fingerprint(load_model(onnx_cache["descriptor"], "descriptor", runtime="onnx")[0]) != first
    copy, _ = load_model(shutil.copytree(onnx_cache["matcher"], tmp_path / "copy"), "matcher", runtime="onnx")
    before = model_fingerprint(copy)
    with open(tmp_path / "copy" / "matcher_fusion.onnx", "ab") as graph:  # other weights in the same folder
        graph.write(b"\0")
    assert model_fingerprint(copy) != before
