"""The authors' released checkpoints through from_pretrained, tested without their code.

``fixtures/authors_checkpoint_layout.json`` holds every tensor name and shape of their descriptor and
matcher checkpoints (ViT-S/16, 224), written by ``scripts/check_against_authors.py --write-layout``
from their own model code; synthetic checkpoints with those names and shapes stand in for the
released files here. The stand-ins the oracle gives their code for timm, torchvision and kornia are
tested against the behaviour those libraries document.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, run_without_copynce_hf
from PIL import Image

from copynce_hf import CopyNCEDescriptorModel, CopyNCEError, CopyNCEImageProcessor, CopyNCEMatcherModel
from copynce_hf.authors_checkpoints import (
    RELEASES,
    convert_authors_checkpoint,
    convert_authors_state_dict,
    read_authors_checkpoint,
)
from copynce_hf.cli import main as copynce_main
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.fidelity import standins

LAYOUT = json.loads((Path(__file__).parent / "fixtures" / "authors_checkpoint_layout.json").read_text())


#: Their ViT-S/16 sizes and small stand-ins (width 32, one head, 2 x 2 patches, 16-d descriptor): the
#: same tensor names, shapes with these sizes replaced, for the tests that need no full-size model.
SMALL = {384: 32, 1152: 96, 1536: 64, 197: 5, 512: 16}


def synthetic_state_dict(kind: str, seed: int = 0, small: bool = False) -> dict[str, torch.Tensor]:
    """Random tensors with the names and shapes of the authors' ``kind`` checkpoint (``small``: the sizes
    of :data:`SMALL`)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in LAYOUT[kind].items():
        shape = [SMALL.get(size, size) for size in shape] if small else shape
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(1000)
        elif name.endswith("running_var"):
            state[name] = 0.5 + torch.rand(shape, generator=generator)
        else:
            state[name] = 0.02 * torch.randn(shape, generator=generator)
    return state


def save_authors_checkpoint(state: dict, path: Path, **extra) -> Path:
    """The file layout of their Checkpointer: ``{"model": state_dict, "epoch": N}`` (``module.`` prefixed
    here, as a DistributedDataParallel model's state dict is)."""
    torch.save({"model": {f"module.{name}": value for name, value in state.items()}, "epoch": 30, **extra}, path)
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict:
    """Both synthetic checkpoints (full size) converted: ``{kind: (folder, authors' state dict)}``."""
    root = tmp_path_factory.mktemp("authors")
    folders = {}
    for kind in ("descriptor", "matcher"):
        state = synthetic_state_dict(kind)
        checkpoint = save_authors_checkpoint(state, root / RELEASES[kind].filename)
        folders[kind] = (convert_authors_checkpoint(checkpoint, kind, root / kind), state)
    return folders


@pytest.fixture(scope="module")
def small_matcher(tmp_path_factory) -> Path:
    """A small synthetic matcher checkpoint (their names, :data:`SMALL` sizes) converted."""
    root = tmp_path_factory.mktemp("authors-small")
    checkpoint = save_authors_checkpoint(synthetic_state_dict("matcher", small=True), root / "matcher.pth.tar")
    return convert_authors_checkpoint(checkpoint, "matcher", root / "matcher")


def test_layout_fixture_is_their_vits16_224():
    descriptor, matcher = LAYOUT["descriptor"], LAYOUT["matcher"]
    assert descriptor["encoder.pos_embed"] == [1, 197, 384] and descriptor["heads.linear_head.fc1.weight"] == [512, 384]
    assert "encoder.norm.weight" not in descriptor and descriptor["infonce_log_scale"] == []
    assert max(int(name.split(".")[2]) for name in descriptor if name.startswith("encoder.blocks.")) == 11
    assert max(int(name.split(".")[2]) for name in matcher if name.startswith("encoder.blocks.")) == 7
    assert max(int(name.split(".")[2]) for name in matcher if name.startswith("fusion.blocks.")) == 3
    assert {"fusion.cls_token", "heads.cls_head.norm.weight", "heads.fusion_head.norm.weight"} <= set(matcher)


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_synthetic_checkpoint_converts_every_tensor(kind, converted):
    folder, state = converted[kind]
    model = (CopyNCEDescriptorModel if kind == "descriptor" else CopyNCEMatcherModel).from_pretrained(folder)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.image_size,
            config.patch_size, config.layer_norm_eps) == (384, 12, 6, 224, 16, 1e-4)
    assert config.copynce_weighting == "authors_code" and config.copynce_average == "all_pairs"
    ours = model.state_dict()
    assert len(ours) == len(state)  # one of ours for each of theirs, nothing dropped
    pairs = {"encoder.blocks.5.attn.qkv.weight": "vit.blocks.5.attn.qkv.weight",
             "encoder.pos_embed": "vit.embeddings.position_embeddings",
             "encoder.patch_embed.proj.weight": "vit.embeddings.patch_embeddings.projection.weight"}
    if kind == "descriptor":
        assert config.descriptor_dim == 512 and config.infonce_negatives == config.koleo_scope == "all_embeddings"
        # Their loss settings: InfoNCE's scale unbounded, the all-gather without gradient.
        assert config.infonce_max_scale is None and config.gather_gradients is False
        assert not config.final_layer_norm and config.head_batch_norm == "per_side"
        pairs.update({"heads.linear_head.bn.running_var": "head.batch_norm.running_var",
                      "heads.linear_head.fc1.weight": "head.projection.weight"})
        torch.testing.assert_close(model.logit_scale.reshape(()), state["infonce_log_scale"])
    else:
        assert config.num_fusion_layers == 4 and config.keep_image_cls_tokens and not config.segment_embeddings
        pairs.update({"fusion.blocks.0.mlp.fc1.weight": "vit.blocks.8.mlp.fc1.weight",
                      "fusion.blocks.3.norm2.bias": "vit.blocks.11.norm2.bias", "fusion.norm.weight": "vit.norm.weight",
                      "fusion.cls_token": "fusion_cls_token", "heads.cls_head.norm.bias": "classifier_norm.bias",
                      "heads.cls_head.classifier.weight": "classifier.weight",
                      "heads.fusion_head.norm.weight": "patch_token_norm.weight"})
    for theirs, name in pairs.items():
        assert torch.equal(ours[name], state[theirs]), name


def test_finetuned_matcher_without_fusion_head_converts(tmp_path):
    """A matcher of their train/matching/finetune.yaml (``fusion_head: null``): no heads.fusion_head.* tensors."""
    state = {name: value for name, value in synthetic_state_dict("matcher", small=True).items()
             if not name.startswith("heads.fusion_head.")}
    assert len(state) == len(LAYOUT["matcher"]) - 2
    folder = convert_authors_checkpoint(save_authors_checkpoint(state, tmp_path / "finetuned.pth.tar"), "matcher",
                                        tmp_path / "finetuned")
    model = CopyNCEMatcherModel.from_pretrained(folder)
    assert not model.config.patch_token_layer_norm and model.config.copynce_weight == 0.0
    ours = model.state_dict()
    assert len(ours) == len(state) and not any("patch_token_norm" in name for name in ours)
    torch.testing.assert_close(ours["classifier.weight"], state["heads.cls_head.classifier.weight"])
    with_head = convert_authors_state_dict(synthetic_state_dict("matcher", small=True), "matcher")
    assert with_head.config.patch_token_layer_norm and with_head.config.copynce_weight > 0


def test_converted_folder_has_processor_card_licence_and_loads_with_auto_classes(converted):
    from transformers import AutoImageProcessor, AutoModel

    folder = converted["descriptor"][0]
    processor = AutoImageProcessor.from_pretrained(folder)
    assert processor.size == {"height": 224, "width": 224} and processor.resample == 3  # bicubic
    assert isinstance(AutoModel.from_pretrained(folder), CopyNCEDescriptorModel)
    card = (folder / "README.md").read_text()
    assert "descriptor_vits_224.pth.tar" in card and "reported by the authors" in card
    assert "license: apache-2.0" in card and "0.705" in card
    assert "Apache License, Version 2.0" in (folder / "LICENSE").read_text()


def test_converted_folder_loads_with_remote_code_where_copynce_hf_cannot_be_imported(small_matcher, tmp_path):
    folder = small_matcher
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    torch.save(pixels, tmp_path / "pixels.pt")
    with torch.no_grad():
        expected = CopyNCEMatcherModel.from_pretrained(folder).eval()(pixels, pixels.flip(0)).logits
    code = """
        import torch
        from transformers import AutoModel
        folder, pixels = sys.argv[1], torch.load(sys.argv[2])
        model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        with torch.no_grad():
            print(model(pixels, pixels.flip(0)).logits.tolist())
    """
    output = run_without_copynce_hf(code, [folder, tmp_path / "pixels.pt"], tmp_path)
    np.testing.assert_allclose(json.loads(output.strip().splitlines()[-1]), expected.numpy(), atol=1e-5, rtol=0)


def test_missing_unexpected_and_misshapen_tensors_are_named():
    state = synthetic_state_dict("descriptor", small=True)
    missing = {name: value for name, value in state.items() if name != "encoder.blocks.3.attn.proj.bias"}
    with pytest.raises(CopyNCEError, match=r"missing tensors \['vit.blocks.3.attn.proj.bias'\]"):
        convert_authors_state_dict(missing, "descriptor")
    with pytest.raises(CopyNCEError, match=r"unexpected tensors \['heads.extra.weight'\]"):
        convert_authors_state_dict({**state, "heads.extra.weight": torch.zeros(2)}, "descriptor")
    with pytest.raises(CopyNCEError, match=r"unexpected tensors \['encoder.norm.bias', 'encoder.norm.weight'\]"):
        # a final norm is not part of their descriptor: not silently dropped
        convert_authors_state_dict({**state, "encoder.norm.weight": torch.ones(32),
                                    "encoder.norm.bias": torch.zeros(32)}, "descriptor")
    wrong = {**state, "encoder.blocks.0.mlp.fc2.bias": torch.zeros(10)}
    with pytest.raises(CopyNCEError, match="vit.blocks.0.mlp.fc2.bias"):
        convert_authors_state_dict(wrong, "descriptor")
    with pytest.raises(CopyNCEError, match="not an authors' matcher"):
        convert_authors_state_dict(state, "matcher")
    with pytest.raises(CopyNCEError, match="model_type"):
        convert_authors_state_dict(state, "detector")


def test_checkpoint_reading_is_weights_only_unless_allowed(tmp_path):
    state = {"encoder.cls_token": torch.zeros(1, 1, 4)}
    path = save_authors_checkpoint(state, tmp_path / "with-args.pth.tar", args=argparse.Namespace(lr=1))
    with pytest.raises(CopyNCEError, match="allow_pickle"):
        read_authors_checkpoint(path)
    assert list(read_authors_checkpoint(path, allow_pickle=True)) == ["encoder.cls_token"]  # module. removed
    with pytest.raises(CopyNCEError, match="not found"):
        read_authors_checkpoint(tmp_path / "absent.pth.tar")
    (tmp_path / "text.pth.tar").write_text("not a checkpoint")
    with pytest.raises(CopyNCEError, match="not a PyTorch checkpoint"):
        read_authors_checkpoint(tmp_path / "text.pth.tar")


def test_convert_original_command_and_script(tmp_path, capsys):
    checkpoint = save_authors_checkpoint(synthetic_state_dict("descriptor", seed=1, small=True),
                                         tmp_path / "descriptor.pth.tar")
    assert copynce_main(["convert-original", "--checkpoint", str(checkpoint), "--model-type", "descriptor",
                         "--output", str(tmp_path / "command")]) == 0
    assert (tmp_path / "command" / "model.safetensors").is_file() and "wrote" in capsys.readouterr().out
    assert copynce_main(["convert-original", "--checkpoint", str(tmp_path / "absent.pth"), "--model-type",
                         "descriptor", "--output", str(tmp_path / "absent")]) == 2
    assert "not found" in capsys.readouterr().err
    spec = importlib.util.spec_from_file_location("convert_copynce_original",
                                                  REPO_ROOT / "scripts" / "convert_copynce_original.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--checkpoint", str(checkpoint), "--model-type", "matcher", "--output",
                        str(tmp_path / "script")]) == 2
    assert "not an authors' matcher" in capsys.readouterr().err
    assert script.main(["--checkpoint", str(checkpoint), "--model-type", "descriptor", "--output",
                        str(tmp_path / "script")]) == 0
    assert (tmp_path / "script" / "config.json").is_file()


def test_processor_equals_their_evaluation_transform():
    """Their evaluation datasets: PIL RGB, torchvision Resize((224, 224), bicubic), ToTensor, Normalize
    (ImageNet mean and std); here with the stand-ins, themselves tested below."""
    transform = standins.Compose([standins.Resize((224, 224), standins.InterpolationMode.BICUBIC),
                                  standins.ToTensor(),
                                  standins.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    images = [Image.open(path) for path in sorted(ASSET_IMAGES.glob("*.jpg"))[:3]]
    theirs = torch.stack([transform(image.convert("RGB")) for image in images])
    ours = CopyNCEImageProcessor(size={"height": 224, "width": 224})(images, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------- stand-ins for timm, torchvision, kornia


def test_timm_standins_follow_timm():
    assert standins.to_2tuple(3) == (3, 3) and standins.to_2tuple([1, 2]) == (1, 2)
    assert standins.to_2tuple("ab") == ("ab", "ab")
    values = standins.trunc_normal_(torch.empty(20000), std=0.5, a=-0.6, b=0.6)
    assert values.min() >= -0.6 and values.max() <= 0.6 and abs(float(values.mean())) < 0.02
    drop = standins.DropPath(0.5)
    x = torch.ones(400, 3, 2)
    assert torch.equal(drop.eval()(x), x)
    dropped = drop.train()(x)
    assert set(dropped.unique().tolist()) == {0.0, 2.0} and (dropped[:, 0, 0][:, None, None] == dropped).all()
    mlp = standins.Mlp(8, 16)
    assert [name for name, _ in mlp.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    tokens = torch.randn(2, 5, 8)
    torch.testing.assert_close(mlp(tokens), mlp.fc2(torch.nn.functional.gelu(mlp.fc1(tokens))))
    embed = standins.PatchEmbed(img_size=32, patch_size=16, in_chans=3, embed_dim=8)
    assert embed.num_patches == 4 and embed.grid_size == (2, 2)
    assert [name for name, _ in embed.named_parameters()] == ["proj.weight", "proj.bias"]
    pixels = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(embed(pixels), embed.proj(pixels).flatten(2).transpose(1, 2))
    with pytest.raises(AssertionError, match="doesn't match model"):
        embed(torch.randn(1, 3, 48, 48))

    def model_fn():
        return "model"

    assert standins.register_model(model_fn) is model_fn


def test_torchvision_and_kornia_standins_follow_their_documentation():
    image = Image.open(sorted(ASSET_IMAGES.glob("*.jpg"))[0]).convert("RGB")
    resized = standins.Resize((60, 80), standins.InterpolationMode.BICUBIC)(image)
    assert resized.size == (80, 60) and resized.tobytes() == image.resize((80, 60), Image.BICUBIC).tobytes()
    width, height = image.size
    shorter = standins.Resize(50)(image)
    assert min(shorter.size) == 50 and shorter.size[0 if width < height else 1] == 50
    tensor = standins.ToTensor()(image)
    assert tensor.shape == (3, height, width) and tensor.dtype == torch.float32
    torch.testing.assert_close(tensor[:, 3, 7], torch.tensor(image.getpixel((7, 3)), dtype=torch.float32) / 255)
    normalised = standins.Normalize([0.5, 0.5, 0.5], [0.25, 0.5, 1.0])(tensor)
    torch.testing.assert_close(normalised[1], (tensor[1] - 0.5) / 0.5)
    grid = standins.create_meshgrid(3, 4, normalized_coordinates=False)
    assert grid.shape == (1, 3, 4, 2) and grid[0, 2, 3].tolist() == [3.0, 2.0]  # (x, y)
    normalized = standins.create_meshgrid(3, 4)
    assert normalized[0, 0, 0].tolist() == [-1.0, -1.0] and normalized[0, 2, 3].tolist() == [1.0, 1.0]


def test_standins_are_installed_only_for_absent_libraries(tmp_path):
    code = (
        "import sys\n"
        "from copynce_hf.fidelity.standins import install_standins\n"
        "installed = install_standins()\n"
        "from timm.models.vision_transformer import Mlp, PatchEmbed\n"
        "from timm.models.layers import DropPath, to_2tuple, trunc_normal_\n"
        "from torchvision.transforms import InterpolationMode\n"
        "from kornia.utils import create_meshgrid\n"
        "import timm.models\n"
        "print(sorted(installed), timm.models.register_model.__module__)\n"
    )
    real = [library for library in ("timm", "torchvision", "kornia") if importlib.util.find_spec(library)]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=REPO_ROOT)
    if real:  # a real library is used as it is (and may fail to import beside this torch: not our concern)
        pytest.skip(f"{real} installed here")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["['kornia',", "'timm',", "'torchvision']"]


def test_oracle_rows_and_refusal_of_a_folder_that_is_not_their_code(tmp_path, capsys):
    from copynce_hf.fidelity.oracle import Row, _loss_row, format_table

    rows = [Row("a", "max abs", 0.0, 1e-5, 1.0), Row("b", "max abs", float("nan"), 1e-5, 1.0),
            _loss_row("c", torch.tensor(0.0), torch.tensor(0.0))]
    assert [row.holds for row in rows] == [True, False, False]  # NaN and a zero loss of theirs fail
    assert format_table(rows).count("| NO |") == 2
    spec = importlib.util.spec_from_file_location("check_against_authors",
                                                  REPO_ROOT / "scripts" / "check_against_authors.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--authors-code", str(tmp_path)]) == 2
    assert "not a checkout of eddielyc/CopyNCE" in capsys.readouterr().err
