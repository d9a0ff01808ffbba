"""The `image-copy-detection` transformers pipeline on tiny random descriptor and matcher models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT as REPO
from conftest import TINY_VIT, run_without_copynce_hf, save_tiny_models
from PIL import Image
from transformers import pipeline
from transformers.pipelines import PIPELINE_REGISTRY

import copynce_hf.pipelines  # noqa: F401  (registers the task)
from copynce_hf.modeling.errors import ConfigError, ImageLoadError
from copynce_hf.modeling.pipeline_copynce import ImageCopyDetectionPipeline


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
    for empty in ([], ([], [])):  # no pair: one clear error, not an IndexError inside transformers
        with pytest.raises(ConfigError, match="empty list"):
            detector(*empty) if isinstance(empty, tuple) else detector(empty)
    with pytest.raises(ConfigError, match="empty list of references"):
        detector(a, [])


def test_pipeline_images_follow_the_image_policy(folders, pair_images, tmp_path):
    """The sizes and files the command line refuses are refused by the pipeline too, in the same words."""
    from copynce_hf.images import load_image

    path, (a, _, _) = pair_images
    detector = pipeline("image-copy-detection", model=folders["matcher"])
    dot, empty = tmp_path / "dot.png", tmp_path / "empty.png"
    Image.new("RGB", (1, 1)).save(dot)
    empty.write_bytes(b"")
    for bad, reason in ((dot, "too small"), (Image.new("RGB", (1, 1)), "too small"), (empty, "empty file"),
                        (b"", "empty file")):
        with pytest.raises(ImageLoadError) as caught:
            detector(bad, path)
        assert caught.value.reason == reason
        if isinstance(bad, Path):
            with pytest.raises(ImageLoadError) as policy:
                load_image(bad)
            assert str(caught.value) == str(policy.value)
    assert 0.0 <= detector(a, path)["score"] <= 1.0


def test_one_query_against_a_list_of_references_gives_one_score_each(folders, pair_images):
    _, (a, b, c) = pair_images
    for kind in ("descriptor", "matcher"):
        detector = pipeline("image-copy-detection", model=folders[kind])
        expected = [detector(a, reference)["score"] for reference in (b, c, a)]
        results = detector(a, [b, c, a])
        assert isinstance(results, list) and len(results) == 3
        assert [r["score"] for r in results] == pytest.approx(expected, abs=1e-5)
        assert [r["score"] for r in detector([b, c], a)] == pytest.approx(
            [detector(q, a)["score"] for q in (b, c)], abs=1e-5)


def test_descriptor_works_with_the_stock_image_feature_extraction_pipeline(folders, pair_images, monkeypatch):
    _, (a, b, _) = pair_images
    prompts = []  # transformers asks "Do you wish to run the custom code?" through input()
    monkeypatch.setattr("builtins.input", lambda text="": prompts.append(text) or "n")
    extractor = pipeline("image-feature-extraction", model=folders["descriptor"])
    assert prompts == []
    features = torch.tensor(extractor([a, b]))  # (2, 1, D): one descriptor per image
    processor, model = extractor.image_processor, extractor.model
    with torch.no_grad():
        expected = model(processor(images=[a, b], return_tensors="pt")["pixel_values"]).descriptors
    torch.testing.assert_close(features.reshape(2, -1), expected, atol=1e-5, rtol=0)


# Loads a saved pipeline folder (run where copynce_hf is blocked), scores the pairs, prints the scores.
REMOTE_PIPELINE = """
import json

from transformers import pipeline

detector = pipeline(model=sys.argv[1], trust_remote_code=True)
assert type(detector).__module__.startswith("transformers_modules."), type(detector).__module__
images = sys.argv[2:]
print("SCORES", json.dumps([r["score"] for r in detector(images[0], images[1:])]))
# saved from the folder's own code, the pipeline reloads (its code and custom_pipelines travel along)
detector.save_pretrained("again")
again = pipeline(model="again", trust_remote_code=True)
print("AGAIN", json.dumps([r["score"] for r in again(images[0], images[1:])]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_saved_pipeline_runs_from_its_folder_without_copynce_hf(folders, pair_images, tmp_path, kind):
    path, (a, b, c) = pair_images
    for name, image in (("b.png", b), ("c.png", c)):
        image.save(tmp_path / name)
    images = [str(path), str(tmp_path / "b.png"), str(tmp_path / "c.png")]
    detector = pipeline("image-copy-detection", model=folders[kind])
    expected = [r["score"] for r in detector(images[0], images[1:])]
    detector.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["custom_pipelines"]["image-copy-detection"]["impl"] == "pipeline_copynce.ImageCopyDetectionPipeline"
    assert (tmp_path / "saved" / "pipeline_copynce.py").is_file()
    output = run_without_copynce_hf(REMOTE_PIPELINE, [tmp_path / "saved", *images], tmp_path)
    for label in ("SCORES", "AGAIN"):
        scores = json.loads(output.split(label, 1)[1].strip().splitlines()[0])
        assert scores == pytest.approx(expected, abs=1e-6), label
    assert (tmp_path / "again" / "pipeline_copynce.py").read_text() == (tmp_path / "saved" / "pipeline_copynce.py").read_text()


def test_registered_task_runs_on_folders_that_carry_custom_pipelines(tmp_path, monkeypatch):
    """The shipped folders and those training writes (save_for_hub) record the task in custom_pipelines,
    for loads without copynce_hf; after ``import copynce_hf`` the registered task runs them as they are."""
    from copynce_hf import CopyNCEImageProcessor, CopyNCEMatcherConfig, CopyNCEMatcherModel
    from copynce_hf.hub import save_for_hub

    written = tmp_path / "trained"
    save_for_hub(CopyNCEMatcherModel(CopyNCEMatcherConfig(**TINY_VIT, num_fusion_layers=1)), written,
                 image_processor=CopyNCEImageProcessor(size={"height": 32, "width": 32}))
    image = str(REPO / "copynce_hf" / "assets" / "images" / "chelsea.jpg")
    prompts = []
    monkeypatch.setattr("builtins.input", lambda text="": prompts.append(text) or "n")
    for folder in (REPO / "copynce_hf" / "pretrained" / "matcher", REPO / "copynce_hf" / "pretrained" / "descriptor",
                   written):
        assert "image-copy-detection" in json.loads((folder / "config.json").read_text())["custom_pipelines"]
        detector = pipeline("image-copy-detection", model=str(folder))
        assert type(detector) is ImageCopyDetectionPipeline
        assert 0.0 <= detector(image, image)["score"] <= 1.0 + 1e-6
        assert "image-copy-detection" not in detector.model.config.custom_pipelines  # left to the registration
        assert list(detector.model.config.custom_pipelines) == ["image-copy-detection"]  # kept for saving
        assert detector.model.config.to_dict()["custom_pipelines"] == json.loads(
            (folder / "config.json").read_text())["custom_pipelines"]
    assert prompts == []
    # Without a task, the task is still inferred from the folder, with or without trust_remote_code.
    for trust in (None, True):
        detector = pipeline(model=str(written), trust_remote_code=trust)
        assert type(detector) is ImageCopyDetectionPipeline, trust
    assert prompts == []


FEATURES_WITHOUT_COPYNCE_HF = """
from transformers import pipeline

extractor = pipeline("image-feature-extraction", model=sys.argv[1], trust_remote_code=True)
assert type(extractor.model).__module__.startswith("transformers_modules."), type(extractor.model).__module__
print("SHAPE", len(extractor(sys.argv[2])[0]))
"""


@pytest.mark.slow
def test_stock_feature_extraction_runs_the_shipped_descriptor_without_copynce_hf(tmp_path):
    folder = REPO / "copynce_hf" / "pretrained" / "descriptor"
    image = REPO / "copynce_hf" / "assets" / "images" / "chelsea.jpg"
    output = run_without_copynce_hf(FEATURES_WITHOUT_COPYNCE_HF, [folder, image], tmp_path)
    assert "Do you wish to run the custom code" not in output
    assert f"SHAPE {json.loads((folder / 'config.json').read_text())['descriptor_dim']}" in output, output


def test_saving_the_embedded_matchers_pipeline_keeps_its_card_and_research_only_licence(tmp_path):
    """``pipeline(...).save_pretrained`` of a folder with a card and a licence file carries both (the
    embedded weights are research-only: a saved copy without its LICENSE would drop that)."""
    from huggingface_hub import ModelCard

    from copynce_hf.runtime.loading import DEFAULT_MATCHER

    detector = pipeline("image-copy-detection", model=str(DEFAULT_MATCHER))
    detector.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "LICENSE").read_bytes() == (DEFAULT_MATCHER / "LICENSE").read_bytes()
    card = ModelCard.load(tmp_path / "saved" / "README.md")
    assert (card.data.license, card.data.license_link) == ("other", "LICENSE")
    # a folder without a card (a model built in memory) saves as before, with nothing invented
    bare = tmp_path / "bare"
    detector.model.config._name_or_path = ""
    detector.save_pretrained(bare)
    assert not (bare / "LICENSE").exists() and not (bare / "README.md").exists()


def test_registering_the_task_again_prints_no_overwrite_warning():
    """A second registration (``save_for_hub`` registers too) or a reload stays quiet; the entry stays ours."""
    import importlib

    from transformers.pipelines import PIPELINE_REGISTRY
    from transformers.utils import logging as transformers_logging

    import copynce_hf.pipelines as registration

    messages = []

    class Collect(transformers_logging.logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    logger = transformers_logging.get_logger("transformers.pipelines.base")
    logger.addHandler(handler)
    try:
        registration.register_pipeline()
        importlib.reload(registration)
    finally:
        logger.removeHandler(handler)
    assert not [message for message in messages if "already registered" in message]
    impl = PIPELINE_REGISTRY.supported_tasks["image-copy-detection"]["impl"]
    assert impl.__qualname__ == "ImageCopyDetectionPipeline"
