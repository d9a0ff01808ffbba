"""The `image-copy-detection` transformers pipeline on tiny random descriptor and matcher models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import save_tiny_models
from PIL import Image
from transformers import pipeline
from transformers.pipelines import PIPELINE_REGISTRY

import copynce_hf.pipelines  # noqa: F401  (registers the task)
from copynce_hf.errors import ConfigError
from copynce_hf.pipelines import ImageCopyDetectionPipeline


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny_models(tmp_path_factory.mktemp("pipeline_models"), seed=1)


@pytest.fixture(scope="module")
def pair_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline_images")
    rng = np.random.default_rng(3)
    images = [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(3)]
    images[0].save(root / "a.png")
    return root / "a.png", images


def test_task_is_registered():
    assert "image-copy-detection" in PIPELINE_REGISTRY.get_supported_tasks()


def test_descriptor_pipeline_gives_cosine(folders, pair_images):
    path, (a, b, c) = pair_images
    detector = pipeline("image-copy-detection", model=folders["descriptor"])
    assert isinstance(detector, ImageCopyDetectionPipeline)
    processor, model = detector.image_processor, detector.model
    with torch.no_grad():
        d = model(pixel_values=processor(images=[a, b, c], return_tensors="pt")["pixel_values"]).descriptors
    expected = [float(d[0] @ d[1]), float(d[0] @ d[2])]
    single = detector(path, b)  # a path and a PIL image
    assert set(single) == {"score"} and single["score"] == pytest.approx(expected[0], abs=1e-5)
    assert detector(a, a)["score"] == pytest.approx(1.0, abs=1e-5)
    as_pairs = detector([(a, b), (a, c)])
    as_lists = detector([a, a], [b, c], batch_size=2)
    as_dicts = detector([{"query": a, "reference": b}, {"query": a, "reference": c}])
    for result in (as_pairs, as_lists, as_dicts):
        assert [r["score"] for r in result] == pytest.approx(expected, abs=1e-5)


def test_matcher_pipeline_gives_probability(folders, pair_images):
    _, (a, b, c) = pair_images
    detector = pipeline("image-copy-detection", model=folders["matcher"])
    processor, model = detector.image_processor, detector.model
    queries = processor(images=[a, a], return_tensors="pt")["pixel_values"]
    references = processor(images=[b, c], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected = torch.sigmoid(model(pixel_values=queries, reference_pixel_values=references).logits).tolist()
    results = detector([(a, b), (a, c)], batch_size=2)
    assert [r["score"] for r in results] == pytest.approx(expected, abs=1e-5)
    assert all(0.0 <= r["score"] <= 1.0 for r in results)
    assert detector(a, c)["score"] == pytest.approx(expected[1], abs=1e-5)


def test_pipeline_refuses_bad_calls(folders, pair_images):
    _, (a, b, _) = pair_images
    detector = pipeline("image-copy-detection", model=folders["descriptor"])
    with pytest.raises(ConfigError, match="query and a reference"):
        detector(a)
    with pytest.raises(ConfigError, match="2 queries but 1 references"):
        detector([a, a], [b])
    with pytest.raises(ConfigError, match="unknown"):
        detector(a, b, top_k=3)
