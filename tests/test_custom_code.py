"""Saved model folders: safetensors, auto_map and Hub custom code that runs without copynce_hf.

The folders are loaded in a fresh Python process with copynce_hf blocked, so that only the
code inside the folder is available (``trust_remote_code``): AutoModel and AutoImageProcessor
must give the outputs and losses of the models that were saved. (Loading through the Auto
classes registered by ``import copynce_hf`` is tested in-process in test_modeling.py.)
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY_VIT_3_BLOCKS, run_without_copynce_hf
from PIL import Image

import copynce_hf
from copynce_hf import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)

TINY = TINY_VIT_3_BLOCKS
PACKAGE = Path(copynce_hf.__file__).resolve().parent

# Loads both folders, compares with the references saved by the test, and re-saves the
# descriptor from the loaded (remote) code to check that a second generation is complete too.
# Mode "registered" goes through the Auto classes registered by ``import copynce_hf``.
RUNNER = textwrap.dedent(
    """
    from pathlib import Path

    if sys.argv[1] != "blocked":
        import copynce_hf  # registers the Auto classes on first use

    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    root = Path(sys.argv[2])
    remote = sys.argv[1] == "blocked"
    kwargs = {"trust_remote_code": True} if remote else {}
    ref = torch.load(root / "reference.pt")
    descriptor = AutoModel.from_pretrained(root / "descriptor", **kwargs)
    matcher = AutoModel.from_pretrained(root / "matcher", **kwargs)
    processor = AutoImageProcessor.from_pretrained(root / "descriptor", **kwargs)
    for obj in (descriptor, matcher, processor):
        module = type(obj).__module__
        assert module.startswith("transformers_modules." if remote else "copynce_hf."), module
    pixels = processor(Image.open(root / "image.png"), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(pixels, ref["pixels"])
    with torch.no_grad():
        torch.testing.assert_close(descriptor(pixels).descriptors, ref["descriptors"], atol=1e-6, rtol=0)
        torch.testing.assert_close(matcher(**ref["matcher_batch"]).logits, ref["logits"], atol=1e-6, rtol=0)
    if remote:
        descriptor.save_pretrained(root / "second")  # a second generation, saved from the folder's code
        again = AutoModel.from_pretrained(root / "second", trust_remote_code=True)
        with torch.no_grad():
            torch.testing.assert_close(again(pixels).descriptors, ref["descriptors"], atol=1e-6, rtol=0)
    # The training objectives run from the folder's own loss code.
    descriptor.train()
    matcher.train()
    torch.testing.assert_close(descriptor(**ref["descriptor_batch"]).loss, ref["descriptor_loss"])
    torch.testing.assert_close(matcher(**ref["matcher_batch"]).loss, ref["matcher_loss"])
    print("LOADED", sys.argv[1])
    """
)


# Loads the model folders shipped in the repository where copynce_hf is blocked, and compares
# their outputs with the in-package loads saved by the test.
SHIPPED_RUNNER = textwrap.dedent(
    """
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    ref = torch.load(sys.argv[1])
    for folder, expected in ref["outputs"].items():
        model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
        processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        pixels = processor([Image.open(path) for path in ref["images"]], return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(pixels, ref["pixels"][folder])
        with torch.no_grad():
            if "matcher" in model.config.model_type:
                values = model(pixels[:1].expand(len(pixels) - 1, -1, -1, -1), pixels[1:]).logits
            else:
                values = model(pixels).descriptors
        torch.testing.assert_close(values, expected, atol=1e-5, rtol=0)
        print("SHIPPED", folder, model.config.model_type)
    """
)
SHIPPED_FOLDERS = (PACKAGE / "pretrained" / "descriptor", PACKAGE / "pretrained" / "matcher",
                   PACKAGE.parent / "benchmarks" / "checkpoints" / "baseline-descriptor")


def batch(size: int = 3, labels=None) -> dict:
    generator = torch.Generator().manual_seed(5)
    overlap = torch.rand(size, 4, 4, generator=generator)
    return {
        "pixel_values": torch.randn(size, 3, 32, 32, generator=generator),
        "reference_pixel_values": torch.randn(size, 3, 32, 32, generator=generator),
        "labels": torch.tensor(labels if labels is not None else [1] * size),
        "overlap_qr": overlap,
        "overlap_rq": overlap.transpose(1, 2).contiguous(),
        "pair_mask": torch.ones(size, dtype=torch.bool),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Two saved folders (descriptor with image processor, matcher) and reference outputs."""
    root = tmp_path_factory.mktemp("hub")
    torch.manual_seed(0)
    descriptor = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**TINY, descriptor_dim=16))
    matcher = CopyNCEMatcherModel(CopyNCEMatcherConfig(**TINY, num_fusion_layers=1))
    with torch.no_grad():  # running statistics and the matcher's extra LayerNorms away from their defaults
        descriptor.head.batch_norm.running_mean.normal_()
        descriptor.head.batch_norm.running_var.uniform_(0.5, 2.0)
        matcher.classifier_norm.weight.normal_()
        matcher.patch_token_norm.bias.normal_()
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    Image.new("RGBA", (50, 37), (10, 200, 90, 128)).save(root / "image.png")
    descriptor_batch, matcher_batch = batch(), batch(labels=[1, 0, 1])
    descriptor.train()
    matcher.train()
    reference = {
        "descriptor_batch": descriptor_batch,
        "matcher_batch": matcher_batch,
        "descriptor_loss": descriptor(**descriptor_batch).loss.detach(),
        "matcher_loss": matcher(**matcher_batch).loss.detach(),
    }
    descriptor.eval()
    matcher.eval()
    pixels = processor(Image.open(root / "image.png"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        reference.update(pixels=pixels, descriptors=descriptor(pixels).descriptors,
                         logits=matcher(**matcher_batch).logits)
    torch.save(reference, root / "reference.pt")
    descriptor.save_pretrained(root / "descriptor")
    processor.save_pretrained(root / "descriptor")
    matcher.save_pretrained(root / "matcher")
    return root


def run_fresh(mode: str, root: Path) -> None:
    output = run_without_copynce_hf(RUNNER, [mode, root], root, blocked=mode == "blocked")
    assert f"LOADED {mode}" in output, output


def test_saved_folder_layout(saved):
    folder = saved / "descriptor"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "copynce-descriptor"
    assert config["auto_map"] == {"AutoConfig": "configuration_copynce.CopyNCEDescriptorConfig",
                                  "AutoModel": "modeling_copynce.CopyNCEDescriptorModel"}
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    assert processor["auto_map"] == {"AutoImageProcessor": "image_processing_copynce.CopyNCEImageProcessor"}
    assert processor["resample"] == 3 and processor["image_mean"] == [0.485, 0.456, 0.406]
    assert (folder / "model.safetensors").exists() and not (folder / "pytorch_model.bin").exists()
    matcher = json.loads((saved / "matcher" / "config.json").read_text())
    assert matcher["auto_map"]["AutoModel"] == "modeling_copynce.CopyNCEMatcherModel"
    # The folders carry the modelling package's own files (imported relatively), unchanged; the
    # descriptor folder also holds the image processor.
    model_code = {"configuration_copynce.py", "convert_dino.py", "errors.py", "losses_copynce.py", "modeling_copynce.py"}
    for folder, expected in ((saved / "descriptor", model_code | {"image_processing_copynce.py", "rgb_conversion.py"}),
                             (saved / "matcher", model_code)):
        assert {path.name for path in folder.glob("*.py")} == expected
        for name in expected:
            assert (folder / name).read_text() == (PACKAGE / "modeling" / name).read_text()


@pytest.mark.slow
def test_custom_code_loads_where_copynce_hf_is_not_importable(saved):
    run_fresh("blocked", saved)


@pytest.mark.slow
def test_shipped_model_folders_load_as_hub_custom_code_without_copynce_hf(tmp_path):
    from transformers import AutoImageProcessor, AutoModel

    images = sorted((PACKAGE / "assets" / "images").glob("*.jpg"))[:3]
    reference = {"images": [str(path) for path in images], "outputs": {}, "pixels": {}}
    for folder in SHIPPED_FOLDERS:
        assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModel"].startswith("modeling_copynce.")
        model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()  # the package's classes
        assert type(model).__module__.startswith("copynce_hf.")
        processor = AutoImageProcessor.from_pretrained(folder)
        pixels = processor([Image.open(path) for path in images], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            if isinstance(model, CopyNCEMatcherModel):
                values = model(pixels[:1].expand(len(pixels) - 1, -1, -1, -1), pixels[1:]).logits
            else:
                values = model(pixels).descriptors
        reference["outputs"][str(folder)] = values
        reference["pixels"][str(folder)] = pixels
        # loaded from a copy, as `cp -r` makes it (links are copied as links)
        copy = tmp_path / "copies" / f"{folder.parent.name}-{folder.name}"
        shutil.copytree(folder, copy, symlinks=True)
        reference["outputs"][str(copy)] = reference["outputs"].pop(str(folder))
        reference["pixels"][str(copy)] = reference["pixels"].pop(str(folder))
    torch.save(reference, tmp_path / "reference.pt")
    output = run_without_copynce_hf(SHIPPED_RUNNER, [tmp_path / "reference.pt"], tmp_path)
    assert output.count("SHIPPED") == len(SHIPPED_FOLDERS), output


@pytest.mark.parametrize("module, missing", [("modeling_copynce", "transformers.initialization"),
                                             ("image_processing_copynce", "transformers.image_processing_backends")])
def test_code_on_transformers_4_names_the_version_it_needs(tmp_path, monkeypatch, module, missing):
    """A folder's code imported where transformers 4.x is installed (its 5.x modules absent) says which
    transformers it needs, not only "No module named ..."."""
    import importlib
    import sys

    import transformers

    package = tmp_path / "folder_code"  # the code as a model folder carries it, imported as its own package
    shutil.copytree(SHIPPED_FOLDERS[0], package, ignore=shutil.ignore_patterns("*.safetensors"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, missing, None)  # an import of it fails, as on transformers 4.57
    monkeypatch.delattr(transformers, missing.rpartition(".")[2], raising=False)
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    try:
        with pytest.raises(ImportError, match=r"needs transformers>=5\.24,<6, but transformers 4\.57\.1 is installed"):
            importlib.import_module(f"folder_code.{module}")
    finally:
        for name in [name for name in sys.modules if name.startswith("folder_code")]:
            del sys.modules[name]
