"""The ViT backbone and the heads around it: attention backends, output options.

Tiny configs; every model is built or saved in a temporary folder and loaded back the way a
``transformers`` user loads it (``from_pretrained`` with ``attn_implementation=``, ``AutoModel``).
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VIT_3_BLOCKS
from transformers import AutoConfig, AutoModel

from copynce_hf import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
    CopyNCEViTConfig,
    CopyNCEViTModel,
)

TINY = TINY_VIT_3_BLOCKS
LENGTH = 4  # patches per 32 x 32 image


def models() -> dict:
    torch.manual_seed(0)
    descriptor = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**TINY, descriptor_dim=16))
    matcher = CopyNCEMatcherModel(CopyNCEMatcherConfig(**TINY, num_fusion_layers=1))
    with torch.no_grad():  # running statistics and the matcher's extra LayerNorms away from their defaults
        descriptor.head.batch_norm.running_mean.normal_()
        descriptor.head.batch_norm.running_var.uniform_(0.5, 2.0)
        matcher.classifier_norm.weight.normal_()
        matcher.patch_token_norm.bias.normal_()
    return {"descriptor": descriptor, "matcher": matcher}


def pair_batch(batch: int = 3) -> dict:
    generator = torch.Generator().manual_seed(7)
    overlap = torch.rand(batch, LENGTH, LENGTH, generator=generator)
    overlap = overlap / overlap.sum(-1, keepdim=True)
    return {
        "pixel_values": torch.randn(batch, 3, 32, 32, generator=generator),
        "reference_pixel_values": torch.randn(batch, 3, 32, 32, generator=generator),
        "overlap_qr": overlap,
        "overlap_rq": overlap.transpose(1, 2).contiguous(),
        "pair_mask": torch.ones(batch, dtype=torch.bool),
    }


def main_output(kind: str, output) -> torch.Tensor:
    return output.descriptors if kind == "descriptor" else output.logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("backbone")
    for kind, model in models().items():
        model.save_pretrained(root / kind)
    return root


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_sdpa_is_the_default_and_eager_gives_the_same_outputs(saved, kind):
    batch = pair_batch()
    inputs = {key: batch[key] for key in ("pixel_values", "reference_pixel_values")}
    if kind == "descriptor":
        inputs.pop("reference_pixel_values")
    outputs = {}
    for implementation in ("sdpa", "eager", None):
        kwargs = {"attn_implementation": implementation} if implementation else {}
        model = AutoModel.from_pretrained(saved / kind, **kwargs).eval()
        assert model.config._attn_implementation == (implementation or "sdpa")
        with torch.no_grad():
            outputs[implementation] = main_output(kind, model(**inputs))
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs[None], outputs["sdpa"], atol=0, rtol=0)
    with pytest.raises(ValueError, match="does not support Flash Attention 2"):
        AutoModel.from_pretrained(saved / kind, attn_implementation="flash_attention_2")


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_set_attn_implementation_switches_the_backend_of_a_loaded_model(saved, kind, caplog):
    batch = pair_batch()
    inputs = {key: batch[key] for key in ("pixel_values", "reference_pixel_values")}
    if kind == "descriptor":
        inputs.pop("reference_pixel_values")
    model = AutoModel.from_pretrained(saved / kind).eval()
    with torch.no_grad():
        sdpa = main_output(kind, model(**inputs))
    with caplog.at_level("WARNING"):
        model.set_attn_implementation("eager")
    assert "does not support setting its attention implementation" not in caplog.text
    assert model.config._attn_implementation == "eager"
    assert all(block.attn.config._attn_implementation == "eager" for block in model.vit.blocks)
    with torch.no_grad():
        torch.testing.assert_close(main_output(kind, model(**inputs)), sdpa, atol=1e-5, rtol=0)
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"


def test_output_attentions_returns_each_blocks_maps(saved):
    batch = pair_batch()
    descriptor = AutoModel.from_pretrained(saved / "descriptor").eval()  # sdpa: the maps come from the eager path
    with torch.no_grad():
        output = descriptor(batch["pixel_values"], output_attentions=True, output_hidden_states=True)
        plain = descriptor(batch["pixel_values"])
    assert len(output.attentions) == 3 and len(output.hidden_states) == 4
    for weights in output.attentions:
        assert weights.shape == (3, 2, 1 + LENGTH, 1 + LENGTH)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 1 + LENGTH))
    torch.testing.assert_close(output.descriptors, plain.descriptors, atol=1e-5, rtol=0)
    assert plain.attentions is None and plain.hidden_states is None
    # The eager maps are those of the model: recompute block 0's from its own projections.
    block = descriptor.vit.blocks[0]
    tokens = block.norm1(output.hidden_states[0])
    qkv = block.attn.qkv(tokens).reshape(3, 1 + LENGTH, 3, 2, 16).permute(2, 0, 3, 1, 4)
    expected = torch.softmax(qkv[0] @ qkv[1].transpose(-1, -2) / 4.0, dim=-1)
    torch.testing.assert_close(output.attentions[0], expected, atol=1e-6, rtol=0)

    matcher = AutoModel.from_pretrained(saved / "matcher").eval()
    with torch.no_grad():
        output = matcher(batch["pixel_values"], batch["reference_pixel_values"], output_attentions=True,
                         output_hidden_states=True)
    assert [weights.shape for weights in output.encoder_attentions] == [(6, 2, 1 + LENGTH, 1 + LENGTH)] * 2
    fused = 1 + 2 * (1 + LENGTH)  # [CLS; query CLS; query patches; reference CLS; reference patches]
    assert [weights.shape for weights in output.attentions] == [(3, 2, fused, fused)]
    assert len(output.encoder_hidden_states) == 3 and len(output.hidden_states) == 2


@pytest.mark.parametrize("kind", ["descriptor", "matcher", "backbone"])
def test_unknown_forward_keywords_raise_type_error(kind):
    model = models()[kind] if kind != "backbone" else CopyNCEViTModel(CopyNCEViTConfig(**TINY))
    batch = pair_batch()
    inputs = {"pixel_values": batch["pixel_values"]}
    if kind == "matcher":
        inputs["reference_pixel_values"] = batch["reference_pixel_values"]
    with pytest.raises(TypeError, match="pair_masks"):
        model(**inputs, pair_masks=batch["pair_mask"])  # a misspelt mask name


def test_descriptor_loss_and_batch_norm_statistics_ignore_output_options():
    batch = pair_batch(4)
    results = []
    for options in ({}, {"output_hidden_states": True}, {"output_attentions": True},
                    {"output_hidden_states": True, "output_attentions": True}):
        model = models()["descriptor"].train()
        output = model(**batch, **options)
        results.append((output.loss.detach(), model.head.batch_norm.running_mean.clone(),
                        model.head.batch_norm.running_var.clone()))
        if options.get("output_hidden_states"):
            assert len(output.hidden_states) == 4 and output.hidden_states[0].shape == (4, 1 + LENGTH, 32)
    for loss, mean, var in results[1:]:
        torch.testing.assert_close(loss, results[0][0], atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(mean, results[0][1], atol=1e-6, rtol=0)
        torch.testing.assert_close(var, results[0][2], atol=1e-6, rtol=0)
    # References of another size take a second backbone pass; the batch norm normalises each side with its
    # own statistics (head_batch_norm="per_side", the authors) or all 2B descriptors together ("joint").
    large = torch.randn(4, 3, 48, 48, generator=torch.Generator().manual_seed(2))

    def batch_normed(projected):
        normalised = (projected - projected.mean(0)) / torch.sqrt(projected.var(0, unbiased=False) + 1e-5)
        return torch.nn.functional.normalize(normalised, dim=-1)

    for mode in ("per_side", "joint"):
        model = models()["descriptor"].train()
        model.config.head_batch_norm = mode
        output = model(batch["pixel_values"], reference_pixel_values=large)
        descriptors = torch.cat([output.descriptors, output.reference_descriptors])
        projected = model.head.projection(torch.cat([model.encode(batch["pixel_values"])[:, 0],
                                                     model.encode(large)[:, 0]]))
        expected = (torch.cat([batch_normed(projected[:4]), batch_normed(projected[4:])]) if mode == "per_side"
                    else batch_normed(projected))
        torch.testing.assert_close(descriptors, expected, atol=1e-5, rtol=0)


def test_backbone_is_an_auto_model_held_under_base_model_prefix(tmp_path):
    built = models()
    for model in built.values():
        assert model.base_model_prefix == "vit" and model.base_model is model.vit
        assert isinstance(model.vit, CopyNCEViTModel)
    descriptor, matcher = built["descriptor"].eval(), built["matcher"].eval()
    standalone = CopyNCEViTModel(CopyNCEViTConfig(**TINY, final_layer_norm=False, layer_norm_eps=1e-4))
    standalone.load_state_dict(descriptor.vit.state_dict())
    standalone.save_pretrained(tmp_path / "vit")
    assert AutoConfig.from_pretrained(tmp_path / "vit").model_type == "copynce-vit"
    backbone = AutoModel.from_pretrained(tmp_path / "vit").eval()
    assert type(backbone) is CopyNCEViTModel
    pixels = pair_batch()["pixel_values"]
    with torch.no_grad():
        output = backbone(pixels)
        torch.testing.assert_close(output.last_hidden_state, descriptor(pixels).last_hidden_state, atol=0, rtol=0)
        torch.testing.assert_close(output.pooler_output, output.last_hidden_state[:, 0])
        # The backbone's final tokens and the matcher's per-image tokens: (pixel_values, interpolate_pos_encoding) -> (B, 1 + L, C).
        torch.testing.assert_close(descriptor.encode(pixels), output.last_hidden_state)
        assert matcher.pre_fusion_tokens(pixels).shape == (3, 1 + LENGTH, 32)
        # The matcher's per-image encoder pass and per-pair fusion reproduce its forward.
        references = pair_batch()["reference_pixel_values"]
        logits, query_tokens, reference_tokens = matcher.fuse(matcher.pre_fusion_tokens(pixels),
                                                                matcher.pre_fusion_tokens(references))
        full = matcher(pixels, references)
    torch.testing.assert_close(logits, full.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(query_tokens, full.query_patch_tokens, atol=1e-6, rtol=0)


