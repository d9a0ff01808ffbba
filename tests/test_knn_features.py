"""The k-NN graph's features in the two forms of ``scripts/build_knn.py --features`` (tiny ViTs, real image files).

The authors' form (their ``extract_dino_features.py``: LayerNorm epsilon 1e-4, the final LayerNorm's CLS token,
a bicubic resize to the model size, ImageNet normalisation) is computed here independently: a ``transformers``
``ViTModel`` built with epsilon 1e-4 from the same weights, on pixels resized by Pillow and normalised with NumPy.
``scripts/check_against_authors.py --authors-code DIR`` compares the same path with their own code
(``copynce_hf.fidelity.negatives_oracle``). The tiny ViT's residual stream is scaled down so that its LayerNorms
see small variances, where epsilon 1e-4 and 1e-6 give different features.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, TINY_VIT_3_BLOCKS
from PIL import Image
from test_data import _small_images
from test_dino import dino_state_dict
from transformers import ViTConfig, ViTModel

from copynce_hf.data import KNNGraph, load_image_dataset
from copynce_hf.data.instances import InstancePlan, make_instances
from copynce_hf.data.knn_features import extract_knn_features, load_feature_model
from copynce_hf.modeling.errors import ConfigError

#: A tiny ViT with DINO's 64 channels per head (a .pth file does not store the number of heads).
VIT = {**TINY_VIT_3_BLOCKS, "hidden_size": 64, "num_attention_heads": 1, "intermediate_size": 128}
SIZE = VIT["image_size"]
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


@pytest.fixture(scope="module")
def dino(tmp_path_factory):
    """``(ViTModel with DINO's epsilon 1e-6, its folder, the same weights as a DINO .pth)``: a tiny ViT whose residual
    stream is about 1e-2 of the usual size (embeddings and each block's output projections scaled down)."""
    torch.manual_seed(0)
    vit = ViTModel(ViTConfig(**VIT, layer_norm_eps=1e-6), add_pooling_layer=False).eval()
    with torch.no_grad():
        for name, parameter in vit.named_parameters():
            if name.startswith("embeddings.") or name.endswith(("o_proj.weight", "o_proj.bias", "fc2.weight",
                                                                "fc2.bias")):
                parameter.mul_(0.01)
            elif "layernorm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    root = tmp_path_factory.mktemp("knn-features")
    vit.save_pretrained(root / "vit")
    torch.save(dino_state_dict(vit), root / "dino_tiny.pth")
    return vit, root / "vit", root / "dino_tiny.pth"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("knn-images") / "imgs"
    _small_images(folder, 6, side=50)
    return load_image_dataset(folder)


@torch.no_grad()
def _authors_features(vit: ViTModel, images) -> np.ndarray:
    """Their extraction, computed independently: epsilon 1e-4, bicubic resize, ImageNet normalisation, final CLS."""
    model = ViTModel(ViTConfig(**VIT, layer_norm_eps=1e-4), add_pooling_layer=False).eval()
    model.load_state_dict(vit.state_dict())
    pixels = []
    for row in images:
        image = Image.open(row["image"]["path"]).convert("RGB").resize((SIZE, SIZE), Image.BICUBIC)
        pixels.append(((np.asarray(image, dtype=np.float64) / 255.0 - MEAN) / STD).transpose(2, 0, 1))
    cls = model(pixel_values=torch.tensor(np.stack(pixels), dtype=torch.float32)).last_hidden_state[:, 0]
    return torch.nn.functional.normalize(cls, dim=1).numpy()


def _features(name, images, form: str) -> np.ndarray:
    model, processor, kind = load_feature_model(str(name), SIZE, form)
    vectors, valid, skipped = extract_knn_features(model, processor, kind, images, batch_size=4, num_workers=0,
                                                   device="cpu")
    assert kind == "cls" and valid.all() and skipped == 0
    return vectors


@pytest.mark.parametrize("source", ["pth", "folder"])
def test_authors_features_are_their_extraction(dino, images, source):
    vit, folder, pth = dino
    expected = _authors_features(vit, images)
    name = pth if source == "pth" else folder
    assert np.abs(_features(name, images, "authors") - expected).max() <= 1e-5
    # The package's form keeps DINO's epsilon (1e-6): on this ViT its features are far from theirs.
    assert np.abs(_features(name, images, "package") - expected).max() > 1e-2


def test_package_form_of_a_dino_pth_is_dinos_own_final_cls_token(dino, images):
    """DINO's k-NN evaluation reads the final LayerNorm's CLS token at DINO's epsilon: the .pth and the saved ViT agree."""
    vit, folder, pth = dino
    assert np.abs(_features(pth, images, "package") - _features(folder, images, "package")).max() <= 1e-5


def test_authors_features_take_dino_weights_only(tmp_path, images):
    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel

    CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=8, **TINY_VIT_3_BLOCKS)).save_pretrained(tmp_path / "d")
    with pytest.raises(ConfigError, match="DINO weights"):
        load_feature_model(str(tmp_path / "d"), SIZE, "authors")
    with pytest.raises(ConfigError, match="--features"):
        load_feature_model(str(tmp_path / "d"), SIZE, "theirs")


def test_build_knn_script_writes_the_authors_form(dino, images, tmp_path):
    spec = importlib.util.spec_from_file_location("build_knn_script", Path(REPO_ROOT) / "scripts" / "build_knn.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, _, pth = dino
    dataset = Path(images[0]["image"]["path"]).parent
    path = script.main(["--dataset", str(dataset), "--model", str(pth), "--features", "authors", "--image_size",
                        str(SIZE), "--k", "2", "--num_workers", "0", "--device", "cpu", "--output",
                        str(tmp_path / "knn.safetensors")])
    graph = KNNGraph.load(path)
    vectors = _features(pth, images, "authors")
    order = np.argsort(-(vectors @ vectors.T), axis=1, kind="stable")[:, 1:3]  # the image itself first, skipped
    assert graph.ids == list(images["image_id"]) and np.array_equal(graph.neighbors, order)
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        assert handle.metadata()["form"] == "authors"


def test_build_knn_script_builds_a_graph_per_kind_of_an_instance_folder(dino, images, tmp_path):
    """``--group_by kind`` on an instance folder: the photos' neighbours are photos and the procedural images'
    are procedural, from the manifest's kinds; a field the folder does not have, or a plain folder, is an error
    that names it."""
    spec = importlib.util.spec_from_file_location("build_knn_script", Path(REPO_ROOT) / "scripts" / "build_knn.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, _, pth = dino
    photos = sorted(Path(images[0]["image"]["path"]).parent.iterdir())
    folder = tmp_path / "instances"
    records = make_instances(photos, folder, InstancePlan(photos=True, procedural=5, side=32), seed=0)
    kinds = {Path(record["file"]).stem: record["kind"] for record in records}
    common = ["--model", str(pth), "--image_size", str(SIZE), "--k", "3", "--num_workers", "0", "--device", "cpu"]
    path = script.main(["--dataset", str(folder), "--group_by", "kind", *common, "--output",
                        str(tmp_path / "knn.safetensors")])
    graph = KNNGraph.load(path)
    assert sorted(graph.ids) == sorted(kinds) and (graph.neighbors >= 0).all()
    for row, image_id in enumerate(graph.ids):
        assert {kinds[graph.ids[n]] for n in graph.neighbors[row]} == {kinds[image_id]}
    with pytest.raises(ConfigError, match="'style'.*no field 'style'"):
        script.main(["--dataset", str(folder), "--group_by", "style", *common, "--output", str(tmp_path / "s.st")])
    with pytest.raises(ConfigError, match="no such column.*not an instance folder"):
        script.main(["--dataset", str(photos[0].parent), "--group_by", "kind", *common, "--output",
                     str(tmp_path / "p.st")])
