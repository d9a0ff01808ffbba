"""Initialisation from DINO weights: transformers ViT folders and original DINO state dicts (offline, tiny)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import TINY_VIT_3_BLOCKS
from transformers import AutoModel, ViTConfig, ViTModel

from copynce_hf import (
    CopyNCEDescriptorModel,
    CopyNCEError,
    CopyNCEMatcherModel,
    CopyNCEViTConfig,
    CopyNCEViTModel,
)
from copynce_hf.modeling import interpolate_position_embeddings
from copynce_hf.modeling.convert_dino import backbone_state_dict

LAYERS = TINY_VIT_3_BLOCKS["num_hidden_layers"]
ARCHITECTURE = {**TINY_VIT_3_BLOCKS, "layer_norm_eps": 1e-6}  # DINO's epsilon
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vit() -> ViTModel:
    """A small randomly initialised transformers ViT standing in for facebook/dino-vits16."""
    torch.manual_seed(0)
    config = ViTConfig(**ARCHITECTURE)
    model = ViTModel(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that a wrong mapping shows
        for name, parameter in model.named_parameters():
            if "layernorm" in name or name.endswith("bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.fixture(scope="module")
def vit_folder(vit, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dino-vit-tiny")
    vit.save_pretrained(folder)
    return folder


def dino_state_dict(vit: ViTModel) -> dict:
    """The original DINO layout of the same weights: q, k, v fused into qkv."""
    source = {key: value.clone() for key, value in vit.state_dict().items()}
    dino = {
        "cls_token": source["embeddings.cls_token"],
        "pos_embed": source["embeddings.position_embeddings"],
        "patch_embed.proj.weight": source["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": source["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": source["layernorm.weight"],
        "norm.bias": source["layernorm.bias"],
    }
    for index in range(LAYERS):
        layer = f"layers.{index}"
        for kind in ("weight", "bias"):
            dino[f"blocks.{index}.attn.qkv.{kind}"] = torch.cat(
                [source[f"{layer}.attention.{name}_proj.{kind}"] for name in "qkv"])
            dino[f"blocks.{index}.attn.proj.{kind}"] = source[f"{layer}.attention.o_proj.{kind}"]
            dino[f"blocks.{index}.norm1.{kind}"] = source[f"{layer}.layernorm_before.{kind}"]
            dino[f"blocks.{index}.norm2.{kind}"] = source[f"{layer}.layernorm_after.{kind}"]
            dino[f"blocks.{index}.mlp.fc1.{kind}"] = source[f"{layer}.mlp.fc1.{kind}"]
            dino[f"blocks.{index}.mlp.fc2.{kind}"] = source[f"{layer}.mlp.fc2.{kind}"]
    return dino


def pixels(size: int = 32, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(3))


#: The DINO form of the descriptor (final LayerNorm kept), whose tokens are the ViT's outputs.
DINO_FORM = {"final_layer_norm": True, "layer_norm_eps": 1e-6}


def test_descriptor_from_transformers_folder_reproduces_the_vit(vit, vit_folder):
    model = CopyNCEDescriptorModel.from_dino(vit_folder, descriptor_dim=8, **DINO_FORM).eval()
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == LAYERS
    assert model.config.layer_norm_eps == 1e-6 and model.config.descriptor_dim == 8
    with torch.no_grad():
        expected = vit(pixels()).last_hidden_state
        ours = model(pixels())
    torch.testing.assert_close(ours.last_hidden_state, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.patch_tokens, expected[:, 1:], atol=1e-5, rtol=0)
    random_model = CopyNCEDescriptorModel(model.config).eval()
    with torch.no_grad():
        assert (random_model(pixels()).last_hidden_state - expected).abs().max() > 0.1
    report = model.dino_load_report
    assert report.missing == [] and report.interpolated is None
    assert report.unexpected == ["pooler.dense.bias", "pooler.dense.weight"]  # reported, not silently dropped
    assert "head.projection.weight" in report.initialised and "logit_scale" in report.initialised


def test_descriptor_from_original_dino_pth_and_training_checkpoint(vit, tmp_path):
    state_dict = dino_state_dict(vit)
    path = tmp_path / "dino_tiny_pretrain.pth"
    torch.save(state_dict, path)
    with torch.no_grad():
        expected = vit(pixels()).last_hidden_state
    model = CopyNCEDescriptorModel.from_dino(path, strict=True).eval()
    assert (model.config.num_attention_heads, model.config.intermediate_size, model.config.image_size) == (1, 64, 32)
    # DINO's heads have 64 channels; this tiny ViT has 16 per head, so pass the head count.
    model = CopyNCEDescriptorModel.from_dino(path, num_attention_heads=2, strict=True, **DINO_FORM).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(pixels()).last_hidden_state, expected, atol=1e-5, rtol=0)
    assert model.dino_load_report.missing == [] and model.dino_load_report.unexpected == []
    # A DINO training checkpoint: teacher/student with module./backbone. prefixes, a projection head, args.
    head = {"head.last_layer.weight_g": torch.ones(1, 4)}
    checkpoint = {
        "teacher": {**{f"backbone.{k}": v for k, v in state_dict.items()}, **head},
        "student": {f"module.backbone.{k}": torch.zeros_like(v) for k, v in state_dict.items()},
        "epoch": 100,
        "args": argparse.Namespace(arch="vit_tiny", patch_size=16),
    }
    checkpoint_path = tmp_path / "checkpoint.pth"
    torch.save(checkpoint, checkpoint_path)
    teacher = CopyNCEDescriptorModel.from_dino(checkpoint_path, num_attention_heads=2, **DINO_FORM).eval()
    with torch.no_grad():
        torch.testing.assert_close(teacher(pixels()).last_hidden_state, expected, atol=1e-5, rtol=0)
    assert teacher.dino_load_report.unexpected == ["head.last_layer.weight_g"]
    student = CopyNCEDescriptorModel.from_dino(checkpoint_path, num_attention_heads=2, checkpoint_key="student")
    assert student.vit.embeddings.cls_token.abs().sum() == 0


def test_matcher_from_dino_splits_encoder_and_fusion(vit, vit_folder):
    model = CopyNCEMatcherModel.from_dino(vit_folder, num_fusion_layers=1, layer_norm_eps=1e-6).eval()
    assert len(model.vit.blocks) == 3 and model.config.num_encoder_layers == 2
    with torch.no_grad():
        hidden_states = vit(pixels(), output_hidden_states=True).hidden_states
        torch.testing.assert_close(model.pre_fusion_tokens(pixels()), hidden_states[2], atol=1e-5, rtol=0)
    source = vit.state_dict()
    torch.testing.assert_close(model.vit.blocks[2].mlp.fc1.weight, source["layers.2.mlp.fc1.weight"])
    torch.testing.assert_close(model.vit.blocks[2].attn.qkv.bias, torch.cat(
        [source[f"layers.2.attention.{name}_proj.bias"] for name in "qkv"]))
    torch.testing.assert_close(model.vit.norm.weight, source["layernorm.weight"])
    torch.testing.assert_close(model.fusion_cls_token,
                               source["embeddings.cls_token"] + source["embeddings.position_embeddings"][:, :1])
    report = model.dino_load_report
    assert report.missing == [] and sorted(report.initialised) == [
        "classifier.bias", "classifier.weight", "classifier_norm.bias", "classifier_norm.weight",
        "patch_token_norm.bias", "patch_token_norm.weight"]


def test_authors_descriptor_from_dino_reads_the_last_block_without_the_final_norm(vit, tmp_path):
    """Their descriptor has no final LayerNorm: DINO's is left out (not an unexpected key) and the
    head reads the last block's raw output."""
    path = tmp_path / "dino_tiny_pretrain.pth"
    torch.save(dino_state_dict(vit), path)
    model = CopyNCEDescriptorModel.from_dino(path, num_attention_heads=2, strict=True).eval()
    assert not hasattr(model.vit.norm, "weight") and model.dino_load_report.unexpected == []
    assert model.config.layer_norm_eps == 1e-4  # the authors' epsilon around DINO's weights
    with torch.no_grad():
        last_block = vit(pixels(), output_hidden_states=True).hidden_states[-1]
        # atol: the authors' LayerNorm epsilon (1e-4, the ViT's is 1e-6) moves the tokens by ~3e-4.
        torch.testing.assert_close(model(pixels()).last_hidden_state, last_block, atol=2e-3, rtol=0)


def test_position_embeddings_interpolated_for_a_larger_input(vit, vit_folder):
    # The tiny analogue of 224 -> 336: a 2x2 patch grid becomes 3x3.
    model = CopyNCEDescriptorModel.from_dino(vit_folder, image_size=48, **DINO_FORM).eval()
    assert model.dino_load_report.interpolated == (2, 3)
    assert model.vit.embeddings.position_embeddings.shape == (1, 10, 32)
    large = pixels(48)
    with torch.no_grad():
        expected = vit(large, interpolate_pos_encoding=True).last_hidden_state
        torch.testing.assert_close(model(large, interpolate_pos_encoding=False).last_hidden_state, expected,
                                   atol=1e-5, rtol=0)


def test_interpolation_224_to_336_keeps_a_smooth_field():
    # A ViT-S/16 position table 14x14 -> 21x21: a linear field over the grid stays linear away
    # from the border (to within 0.06 of 13: PyTorch's bicubic kernel, a = -0.75, is not exact on
    # linear functions), increasing along its axes, inside its range; the CLS entry is untouched.
    rows, columns = torch.meshgrid(torch.arange(14.0), torch.arange(14.0), indexing="ij")
    field = torch.stack([rows, columns, rows + 2 * columns], -1).reshape(1, 196, 3)
    table = torch.cat([torch.full((1, 1, 3), 7.0), field], dim=1)
    resized = interpolate_position_embeddings(table, (21, 21))
    assert resized.shape == (1, 442, 3)
    assert torch.equal(resized[:, 0], table[:, 0])
    assert interpolate_position_embeddings(table, (14, 14)) is table
    grid = resized[0, 1:].reshape(21, 21, 3)
    source = (torch.arange(21.0) + 0.5) * 14 / 21 - 0.5  # source coordinate of each new patch centre
    inner = slice(3, 18)
    torch.testing.assert_close(grid[inner, inner, 0], source[inner, None].expand(15, 15), atol=0.06, rtol=0)
    torch.testing.assert_close(grid[inner, inner, 1], source[None, inner].expand(15, 15), atol=0.06, rtol=0)
    assert (grid[1:, :, 0] > grid[:-1, :, 0]).all() and (grid[:, 1:, 1] > grid[:, :-1, 1]).all()
    assert grid[..., 2].min() >= -0.5 and grid[..., 2].max() <= 39.5


def test_missing_and_unexpected_keys_are_reported_and_strict_raises(vit, tmp_path):
    state_dict = dino_state_dict(vit)
    del state_dict["blocks.1.mlp.fc1.weight"]
    state_dict["blocks.0.attn.extra.weight"] = torch.zeros(2)
    state_dict["mask_token"] = torch.zeros(1, 1, 32)
    model = CopyNCEDescriptorModel.from_dino(state_dict, num_attention_heads=2)
    report = model.dino_load_report
    assert report.missing == ["blocks.1.mlp.fc1.weight"]
    assert report.unexpected == ["blocks.0.attn.extra.weight", "mask_token"]
    with pytest.raises(CopyNCEError, match="blocks.1.mlp.fc1.weight"):
        CopyNCEDescriptorModel.from_dino(state_dict, num_attention_heads=2, strict=True)
    with pytest.raises(CopyNCEError, match="intermediate_size"):
        CopyNCEDescriptorModel.from_dino(dino_state_dict(vit), num_attention_heads=2, intermediate_size=48)
    with pytest.raises(CopyNCEError, match="not found"):
        CopyNCEDescriptorModel.from_dino(tmp_path / "absent.pth")


def test_transformers_and_dino_names_give_the_same_backbone(vit):
    backbone, unused = backbone_state_dict(vit.state_dict())  # layers.N.attention.q_proj, ...
    assert unused == ["pooler.dense.bias", "pooler.dense.weight"]
    torch.testing.assert_close(backbone, backbone_state_dict(dino_state_dict(vit))[0])
    assert set(backbone) == set(CopyNCEViTModel(CopyNCEViTConfig(**ARCHITECTURE)).state_dict())


def test_convert_dino_script_writes_a_loadable_folder(vit, tmp_path):
    path = tmp_path / "dino.pth"
    torch.save(dino_state_dict(vit), path)
    spec = importlib.util.spec_from_file_location("convert_dino_script", REPO_ROOT / "scripts" / "convert_dino.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    output = tmp_path / "matcher"
    code = script.main([str(path), str(output), "--model_type", "matcher", "--num_fusion_layers", "1",
                        "--num_attention_heads", "2", "--image_size", "48", "--set", "copynce_weight=2.5",
                        "--strict"])
    assert code == 0
    loaded = AutoModel.from_pretrained(output)
    assert isinstance(loaded, CopyNCEMatcherModel)
    assert (loaded.config.image_size, loaded.config.copynce_weight, loaded.config.num_fusion_layers) == (48, 2.5, 1)
    assert (output / "preprocessor_config.json").exists()
    assert script.main([str(path), str(tmp_path / "bad"), "--descriptor_dim", "8", "--set", "koleo_weight=-1"]) == 1
