"""CopyNCE descriptor and matcher models, configurations and image processor (tiny configs)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import TINY_VIT_3_BLOCKS
from PIL import Image
from transformers import AutoConfig, AutoImageProcessor, AutoModel

from copynce_hf import (
    ConfigError,
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEError,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
    CopyNCEViTConfig,
)
from copynce_hf.modeling.configuration_copynce import EARLIER_MATCHER_ARCHITECTURE
from copynce_hf.modeling.losses_copynce import copy_bce_loss, copynce_loss

TINY = TINY_VIT_3_BLOCKS
GRID = 2  # 32 px / 16 px patches per side
LENGTH = GRID * GRID


def descriptor(**overrides) -> CopyNCEDescriptorModel:
    torch.manual_seed(0)
    return CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**{**TINY, "descriptor_dim": 16, **overrides}))


def matcher(**overrides) -> CopyNCEMatcherModel:
    torch.manual_seed(0)
    return CopyNCEMatcherModel(CopyNCEMatcherConfig(**{**TINY, "num_fusion_layers": 1, **overrides}))


def identity_overlap(batch: int) -> torch.Tensor:
    """Prior of an unedited copy: patch i lies entirely in patch i."""
    return torch.eye(LENGTH).expand(batch, LENGTH, LENGTH).clone()


def collator_batch(batch: int = 4, labels=None) -> dict:
    """A batch dict with the training collator's keys."""
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(batch, 3, 32, 32, generator=generator)
    reference = query.flip(-1) + 0.1 * torch.randn(batch, 3, 32, 32, generator=generator)
    overlap = torch.rand(batch, LENGTH, LENGTH, generator=generator)
    overlap = overlap / overlap.sum(-1, keepdim=True)
    return {
        "pixel_values": query,
        "reference_pixel_values": reference,
        "labels": torch.ones(batch, dtype=torch.long) if labels is None else torch.tensor(labels),
        "overlap_qr": overlap,
        "overlap_rq": overlap.transpose(1, 2).contiguous(),
        "pair_mask": torch.ones(batch, dtype=torch.bool),
    }


# ----------------------------------------------------------------------------- configurations


def test_config_defaults_are_the_papers():
    config = CopyNCEDescriptorConfig()
    # ViT-S/16 as DINO, 224 input
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size) == (
        384, 12, 6, 1536)
    assert (config.image_size, config.patch_size, config.layer_norm_eps, config.qkv_bias) == (224, 16, 1e-4, True)
    assert config.descriptor_dim == 512
    assert (config.copynce_temperature, config.copynce_weight, config.copynce_gamma) == (1 / 16, 5, 3)
    assert config.copynce_layer == -1 and config.copynce_weighting == "paper"
    assert (config.logit_scale_init, config.infonce_weight, config.koleo_weight) == (3.2, 1, 5)
    matcher_config = CopyNCEMatcherConfig()
    assert (matcher_config.num_encoder_layers, matcher_config.num_fusion_layers) == (8, 4)
    assert (matcher_config.copynce_temperature, matcher_config.copynce_weight, matcher_config.copynce_gamma,
            matcher_config.bce_weight) == (1 / 16, 3, 1, 1)


def test_default_configs_build_the_authors_architecture():
    """The authors' descriptor_default_config.yaml / matching_default_config.yaml and build_encoder."""
    descriptor = CopyNCEDescriptorConfig()
    assert (descriptor.final_layer_norm, descriptor.freeze_patch_embeddings) == (False, True)
    assert (descriptor.head_batch_norm, descriptor.sync_batch_norm) == ("per_side", True)
    matcher = CopyNCEMatcherConfig()
    assert (matcher.final_layer_norm, matcher.freeze_patch_embeddings, matcher.layer_norm_eps) == (True, False, 1e-4)
    assert (matcher.keep_image_cls_tokens, matcher.segment_embeddings) == (True, False)
    assert (matcher.classifier_layer_norm, matcher.patch_token_layer_norm) == (True, True)
    # The bare backbone stays DINO's.
    assert (CopyNCEViTConfig().layer_norm_eps, CopyNCEViTConfig().final_layer_norm) == (1e-6, True)


def test_configs_saved_before_the_options_keep_their_form(tmp_path):
    """A config.json without the architecture options (written before them) reads as the old form."""
    saved = CopyNCEDescriptorConfig(layer_norm_eps=1e-6).to_dict()
    for key in ("final_layer_norm", "freeze_patch_embeddings", "head_batch_norm", "sync_batch_norm"):
        del saved[key]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    old = CopyNCEDescriptorConfig.from_pretrained(tmp_path)
    assert (old.final_layer_norm, old.freeze_patch_embeddings, old.head_batch_norm, old.sync_batch_norm) == (
        True, False, "joint", False)
    saved = CopyNCEMatcherConfig().to_dict()
    for key in ("keep_image_cls_tokens", "segment_embeddings", "classifier_layer_norm", "patch_token_layer_norm"):
        del saved[key]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    old = CopyNCEMatcherConfig.from_pretrained(tmp_path)
    assert (old.keep_image_cls_tokens, old.segment_embeddings, old.classifier_layer_norm,
            old.patch_token_layer_norm) == (False, True, False, False)
    # Saved again, the options are written out and read back unchanged.
    old.save_pretrained(tmp_path / "again")
    assert CopyNCEMatcherConfig.from_pretrained(tmp_path / "again").segment_embeddings is True


@pytest.mark.parametrize(
    ("config_class", "values", "key"),
    [
        (CopyNCEDescriptorConfig, {"head_batch_norm": "sync"}, "head_batch_norm"),
        (CopyNCEDescriptorConfig, {"final_layer_norm": "no"}, "final_layer_norm"),
        (CopyNCEMatcherConfig, {"final_layer_norm": False}, "final_layer_norm"),
        (CopyNCEMatcherConfig, {"keep_image_cls_tokens": 1}, "keep_image_cls_tokens"),
        (CopyNCEDescriptorConfig, {"image_size": 230}, "image_size"),
        (CopyNCEDescriptorConfig, {"num_attention_heads": 5}, "num_attention_heads"),
        (CopyNCEDescriptorConfig, {"koleo_weight": -1.0}, "koleo_weight"),
        (CopyNCEDescriptorConfig, {"copynce_weight": float("nan")}, "copynce_weight"),
        (CopyNCEDescriptorConfig, {"copynce_temperature": 0}, "copynce_temperature"),
        (CopyNCEDescriptorConfig, {"copynce_layer": 13}, "copynce_layer"),
        (CopyNCEDescriptorConfig, {"descriptor_dim": 0}, "descriptor_dim"),
        (CopyNCEDescriptorConfig, {"copynce_weighting": "mean"}, "copynce_weighting"),
        (CopyNCEDescriptorConfig, {"inference_sizes": [32, 40]}, "inference_sizes"),
        (CopyNCEDescriptorConfig, {"inference_sizes": []}, "inference_sizes"),
        (CopyNCEDescriptorConfig, {"inference_sizes": [32, 32]}, "inference_sizes"),
        (CopyNCEDescriptorConfig, {"inference_sizes": 32}, "inference_sizes"),
        (CopyNCEMatcherConfig, {"num_fusion_layers": 13}, "num_fusion_layers"),
        (CopyNCEMatcherConfig, {"bce_weight": -0.5}, "bce_weight"),
        (CopyNCEMatcherConfig, {"copynce_gamma": -1}, "copynce_gamma"),
    ],
)
def test_config_rejects_bad_values_naming_the_key(config_class, values, key):
    with pytest.raises(ConfigError, match=key):
        config_class(**values)


def test_config_round_trip_and_auto_config(tmp_path):
    config = CopyNCEDescriptorConfig(**TINY, descriptor_dim=256, copynce_layer=2)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, CopyNCEDescriptorConfig)
    assert loaded.descriptor_dim == 256 and loaded.copynce_layer == 2 and loaded.hidden_size == 32


# ----------------------------------------------------------------------------- descriptor


def test_descriptor_shapes_unit_norm_and_batch_norm_eval_with_one_image():
    model = descriptor().eval()
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        output = model(pixels)
        single = model(pixels[1:2])
    assert output.descriptors.shape == (3, 16)
    assert output.patch_tokens.shape == (3, LENGTH, 32)
    assert output.last_hidden_state.shape == (3, 1 + LENGTH, 32)
    torch.testing.assert_close(output.descriptors.norm(dim=-1), torch.ones(3))
    # Eval mode uses running statistics: an image's descriptor does not depend on its batch.
    torch.testing.assert_close(single.descriptors[0], output.descriptors[1], atol=1e-6, rtol=0)
    assert output.loss is None and output.reference_descriptors is None


def test_descriptor_loss_is_the_weighted_sum_of_its_parts_and_backpropagates():
    model = descriptor().train()
    output = model(**collator_batch())
    config = model.config
    for part in (output.loss, output.infonce_loss, output.koleo_loss, output.copynce_loss):
        assert part is not None and torch.isfinite(part) and part.dim() == 0
    expected = (config.infonce_weight * output.infonce_loss + config.koleo_weight * output.koleo_loss
                + config.copynce_weight * output.copynce_loss)
    torch.testing.assert_close(output.loss, expected)
    assert output.reference_descriptors.shape == (4, 16) and output.reference_patch_tokens.shape == (4, LENGTH, 32)
    # The CopyNCE part is the package's loss on the tokens the output exposes.
    batch = collator_batch()
    recomputed = copynce_loss(output.patch_tokens, output.reference_patch_tokens, batch["overlap_qr"],
                              batch["overlap_rq"], temperature=1 / 16, gamma=3.0)
    torch.testing.assert_close(output.copynce_loss, recomputed)
    output.loss.backward()
    for name in ("logit_scale", "vit.blocks.0.attn.qkv.weight", "head.projection.weight", "vit.embeddings.cls_token"):
        gradient = dict(model.named_parameters())[name].grad
        assert gradient is not None and gradient.abs().sum() > 0, name


def test_descriptor_without_priors_or_with_zero_weight_trains_the_baseline():
    batch = collator_batch()
    for model, inputs in ((descriptor(copynce_weight=0.0), batch),
                          (descriptor(), {k: v for k, v in batch.items() if not k.startswith("overlap")})):
        output = model(**inputs)
        assert output.copynce_loss is None
        torch.testing.assert_close(output.loss, output.infonce_loss + 5 * output.koleo_loss)


def test_descriptor_pair_mask_excludes_pairs_from_copynce():
    model = descriptor().train()
    batch = collator_batch()
    batch["pair_mask"] = torch.tensor([True, False, True, False])
    masked = model(**batch)
    expected = copynce_loss(masked.patch_tokens[[0, 2]], masked.reference_patch_tokens[[0, 2]],
                            batch["overlap_qr"][[0, 2]], batch["overlap_rq"][[0, 2]], 1 / 16, 3.0)
    torch.testing.assert_close(masked.copynce_loss, expected)
    batch["pair_mask"][:] = False
    assert model(**batch).copynce_loss.item() == 0.0


def test_descriptor_refuses_non_copy_labels():
    with pytest.raises(CopyNCEError, match="copy pairs"):
        descriptor()(**collator_batch(labels=[1, 0, 1, 1]))


def test_descriptor_intermediate_copynce_layer_uses_that_blocks_tokens():
    model = descriptor(copynce_layer=2).eval()
    output = model(torch.randn(2, 3, 32, 32), output_hidden_states=True)
    assert len(output.hidden_states) == 1 + 3
    torch.testing.assert_close(output.patch_tokens, output.hidden_states[2][:, 1:])
    # copynce_layer numbers layers as hidden_states does: -2 of 3 blocks is layer 2; -1 the backbone's output
    torch.manual_seed(0)
    counted_back = descriptor(copynce_layer=-2).eval()
    counted_back.load_state_dict(model.state_dict())
    pixels = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(counted_back(pixels).patch_tokens, model(pixels).patch_tokens)
    last = descriptor(copynce_layer=-1).eval()
    last.load_state_dict(model.state_dict())
    torch.testing.assert_close(last(pixels).patch_tokens, last.encode(pixels)[:, 1:])


def test_the_authors_code_weighting_is_read_under_its_earlier_name_from_saved_configs_only(tmp_path):
    """copynce_weighting "reference" (the authors' code's form) is now "authors_code": a saved config.json
    with the earlier value loads as the new one; a new configuration or a loss call refuses it."""
    config = CopyNCEDescriptorConfig(**TINY, copynce_weighting="authors_code")
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "copynce_weighting": "reference"}))
    assert AutoConfig.from_pretrained(tmp_path).copynce_weighting == "authors_code"
    matcher_config = CopyNCEMatcherConfig.from_dict({**CopyNCEMatcherConfig(**TINY, num_fusion_layers=1).to_dict(),
                                                     "copynce_weighting": "reference"})
    assert matcher_config.copynce_weighting == "authors_code"
    with pytest.raises(ConfigError, match="copynce_weighting='reference'"):
        CopyNCEDescriptorConfig(**TINY, copynce_weighting="reference")
    tokens = torch.randn(1, 4, 8)
    with pytest.raises(CopyNCEError, match="weighting"):
        copynce_loss(tokens, tokens, torch.eye(4)[None], torch.eye(4)[None], weighting="reference")


def test_descriptor_training_steps_reduce_the_loss():
    model = descriptor().train()
    batch = collator_batch(batch=6)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_position_embeddings_interpolate_to_other_sizes_and_refuse_bad_ones():
    model = descriptor().eval()
    with torch.no_grad():
        larger = model(torch.randn(2, 3, 48, 48))
    assert larger.patch_tokens.shape == (2, 9, 32)
    with pytest.raises(CopyNCEError, match="interpolate_pos_encoding"):
        model(torch.randn(1, 3, 48, 48), interpolate_pos_encoding=False)
    with pytest.raises(CopyNCEError, match="multiple of patch_size"):
        model(torch.randn(1, 3, 40, 40))
    # set_image_size resizes the stored table: then 48 px is the native size.
    model.set_image_size(48)
    assert model.config.image_size == 48 and model.vit.embeddings.position_embeddings.shape == (1, 10, 32)
    with torch.no_grad():
        native = model(torch.randn(1, 3, 48, 48), interpolate_pos_encoding=False)
    assert native.patch_tokens.shape == (1, 9, 32)


def test_multi_size_descriptors_are_the_normalised_sum_over_sizes_in_eval_only(tmp_path):
    model = descriptor(inference_sizes=[32, 48]).eval()
    pixels = torch.randn(3, 3, 48, 48)
    smaller = torch.nn.functional.interpolate(pixels, size=(32, 32), mode="bicubic", align_corners=False,
                                              antialias=True)
    with torch.no_grad():
        output = model(pixels)
        features = model.get_image_features(pixels)
        model.config.inference_sizes = None
        at_48, at_32 = model(pixels).descriptors, model(smaller).descriptors
        model.config.inference_sizes = [32, 48]
    expected = torch.nn.functional.normalize(at_48 + at_32, dim=-1)
    torch.testing.assert_close(output.descriptors, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(features, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(expected, at_48, atol=1e-3)  # the smaller size changes the descriptor
    assert output.patch_tokens.shape == (3, 9, 32)  # the other outputs are those of the input's own size
    # Training (and the training loss) describes at the input's size only.
    model.train()
    pairs = model(pixels, reference_pixel_values=pixels.flip(0))
    model.eval()
    assert pairs.loss is not None
    with torch.no_grad():
        model.train()
        trained_mode = model(pixels).descriptors
        model.config.inference_sizes = None
        one_size = model(pixels).descriptors
        model.config.inference_sizes = [32, 48]
        model.eval()
    torch.testing.assert_close(trained_mode, one_size, atol=0, rtol=0)
    # The option survives saving; a folder saved before it describes at one size.
    model.save_pretrained(tmp_path / "multi")
    assert CopyNCEDescriptorConfig.from_pretrained(tmp_path / "multi").inference_sizes == [32, 48]
    assert CopyNCEDescriptorConfig(**TINY).inference_sizes is None


# ----------------------------------------------------------------------------- matcher


def test_matcher_shapes_and_loss_on_positive_pairs_only():
    model = matcher().train()
    batch = collator_batch(labels=[1, 0, 1, 0])
    output = model(**batch)
    assert output.logits.shape == (4,)
    assert output.query_patch_tokens.shape == (4, LENGTH, 32)
    assert output.reference_patch_tokens.shape == (4, LENGTH, 32)
    torch.testing.assert_close(output.bce_loss, copy_bce_loss(output.logits, batch["labels"]))
    positives = [0, 2]
    expected = copynce_loss(output.query_patch_tokens[positives], output.reference_patch_tokens[positives],
                            batch["overlap_qr"][positives], batch["overlap_rq"][positives], 1 / 16, 1.0)
    torch.testing.assert_close(output.copynce_loss, expected)
    torch.testing.assert_close(output.loss, output.bce_loss + 3 * output.copynce_loss)
    output.loss.backward()
    for name in ("fusion_cls_token", "classifier_norm.weight", "classifier.weight", "patch_token_norm.weight",
                 "vit.blocks.0.mlp.fc1.weight", "vit.blocks.2.attn.qkv.weight"):
        gradient = dict(model.named_parameters())[name].grad
        assert gradient is not None and gradient.abs().sum() > 0, name


def test_matcher_inference_without_labels_and_structure():
    model = matcher().eval()
    assert len(model.vit.blocks) == 3 and model.config.num_encoder_layers == 2
    query, reference = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        output = model(pixel_values=query, reference_pixel_values=reference)
        alone = model(pixel_values=query[:1], reference_pixel_values=reference[:1])
        larger = model(pixel_values=torch.randn(1, 3, 48, 48), reference_pixel_values=reference[:1])
    assert output.loss is None and output.bce_loss is None and output.copynce_loss is None
    torch.testing.assert_close(alone.logits[0], output.logits[0], atol=1e-5, rtol=0)
    assert larger.query_patch_tokens.shape == (1, 9, 32) and larger.reference_patch_tokens.shape == (1, 4, 32)
    # return_dict=False gives the non-None fields in order.
    logits = model(query, reference, return_dict=False)[0]
    torch.testing.assert_close(logits, output.logits)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("overrides", [{}, {"num_fusion_layers": 2}, EARLIER_MATCHER_ARCHITECTURE])
def test_fusion_logits_computing_the_last_cls_alone_equal_the_whole_fusion(attention, overrides):
    """The scoring path (the last fusion block's CLS token alone) gives the logits of the whole fusion, for one or two
    fusion blocks, with and without the images' CLS tokens and segment embeddings, on either attention backend;
    with another last block (its MLP changed) they move together, so the check reads that block."""
    model = matcher(**overrides).eval()
    model.config._attn_implementation = attention
    if model.config.segment_embeddings:  # zero at initialisation: make them tell the images apart
        model.segment_embeddings.data.normal_(std=0.5)
    with torch.no_grad():
        query, reference = model.pre_fusion_tokens(torch.randn(3, 3, 32, 32)), model.pre_fusion_tokens(
            torch.randn(3, 3, 32, 48))
        whole = model.fuse(query, reference)[0]
        torch.testing.assert_close(model.fusion_logits(query, reference), whole, atol=1e-5, rtol=0)
        model.vit.blocks[-1].mlp.fc2.weight.mul_(3.0)
        changed = model.fuse(query, reference)[0]
        assert not torch.allclose(changed, whole, atol=1e-4)
        torch.testing.assert_close(model.fusion_logits(query, reference), changed, atol=1e-5, rtol=0)


def test_matcher_segment_embeddings_tell_query_from_reference():
    model = matcher(**EARLIER_MATCHER_ARCHITECTURE).eval()  # the authors' matcher has none
    query, reference = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        # Zero segments: the fused CLS sees a set of tokens, so swapping the images changes nothing.
        torch.testing.assert_close(model(query, reference).logits, model(reference, query).logits)
        model.segment_embeddings.normal_(std=0.5)
        assert not torch.allclose(model(query, reference).logits, model(reference, query).logits)


# ----------------------------------------------------------------------------- image processor


def test_image_processor_matches_bicubic_resize_and_imagenet_normalisation():
    processor = CopyNCEImageProcessor()
    assert processor.size == {"height": 224, "width": 224}
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (50, 70, 3), dtype=np.uint8))
    pixels = processor(image, return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, 224, 224) and pixels.dtype == torch.float32
    manual = np.asarray(image.resize((224, 224), Image.Resampling.BICUBIC), dtype=np.float32) / 255.0
    manual = (manual - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(pixels[0].numpy(), manual.transpose(2, 0, 1), atol=1e-4)


def test_image_processor_inputs_and_colour_modes():
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    white = (1.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    transparent = Image.new("RGBA", (40, 40), (0, 0, 0, 0))  # black but fully transparent -> white
    sixteen_bit = Image.fromarray(np.full((40, 40), 65535, dtype=np.uint16))  # I;16 full scale -> white
    assert sixteen_bit.mode.startswith("I;16")
    arrays = [np.zeros((40, 30, 3), dtype=np.uint8), np.full((20, 20, 3), 255, dtype=np.uint8)]
    batch = processor([transparent, sixteen_bit, *arrays], return_tensors="pt")["pixel_values"]
    assert batch.shape == (4, 3, 32, 32)
    for index in (0, 1, 3):
        np.testing.assert_allclose(batch[index].mean(dim=(1, 2)).numpy(), white, atol=1e-4)
    black = -np.array([0.485, 0.456, 0.406]) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(batch[2].mean(dim=(1, 2)).numpy(), black, atol=1e-4)


# ----------------------------------------------------------------------------- saving and loading


def test_save_and_load_with_auto_classes_in_process(tmp_path):
    model = descriptor().eval()
    model.save_pretrained(tmp_path)
    CopyNCEImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "pytorch_model.bin").exists()
    loaded = AutoModel.from_pretrained(tmp_path)
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    assert type(loaded) is CopyNCEDescriptorModel and isinstance(processor, CopyNCEImageProcessor)
    assert not loaded.training and math.isclose(loaded.logit_scale.item(), 3.2, rel_tol=1e-6)
    pixels = processor(Image.new("RGB", (64, 48), (200, 30, 90)), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(pixels).descriptors, model(pixels).descriptors)


# ----------------------------------------------------------------------------- the authors' architecture


def test_authors_descriptor_has_no_final_norm_and_a_frozen_patch_embedding():
    model = descriptor()
    assert isinstance(model.vit.norm, torch.nn.Identity) and "vit.norm.weight" not in model.state_dict()
    frozen = {name for name, parameter in model.named_parameters() if not parameter.requires_grad}
    assert frozen == {"vit.embeddings.patch_embeddings.projection.weight",
                      "vit.embeddings.patch_embeddings.projection.bias"}
    output = model.eval()(torch.randn(2, 3, 32, 32), output_hidden_states=True)
    # The head and CopyNCE read the last block's raw output.
    torch.testing.assert_close(output.last_hidden_state, output.hidden_states[-1])
    torch.testing.assert_close(output.patch_tokens, output.hidden_states[-1][:, 1:])
    assert all(parameter.requires_grad for parameter in descriptor(freeze_patch_embeddings=False).parameters())


def test_authors_matcher_keeps_the_image_cls_tokens_and_norms_twice():
    model = matcher().eval()
    assert not hasattr(model, "segment_embeddings")
    query, reference = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        output = model(query, reference, output_hidden_states=True)
        fused = model.vit.norm(output.hidden_states[-1])  # (B, 1 + 2 (1 + L), C)
    assert fused.shape[1] == 1 + 2 * (1 + LENGTH)
    torch.testing.assert_close(output.logits, model.classifier(model.classifier_norm(fused[:, 0])).squeeze(-1))
    torch.testing.assert_close(output.query_patch_tokens, model.patch_token_norm(fused[:, 2 : 2 + LENGTH]))
    torch.testing.assert_close(output.reference_patch_tokens, model.patch_token_norm(fused[:, 3 + LENGTH :]))


def test_synced_batch_norm_only_for_several_gpu_processes(caplog):
    model = descriptor()
    assert model.with_synced_batch_norm(1, "cuda") is model
    assert model.with_synced_batch_norm(2, "cpu") is model and "GPUs only" in caplog.text
    assert isinstance(model.with_synced_batch_norm(2, "cuda").head.batch_norm, torch.nn.SyncBatchNorm)
    joint = descriptor(sync_batch_norm=False)
    assert isinstance(joint.with_synced_batch_norm(2, "cuda").head.batch_norm, torch.nn.BatchNorm1d)


def test_per_side_batch_norm_needs_two_pairs_in_training():
    batch = {"pixel_values": torch.randn(1, 3, 32, 32), "reference_pixel_values": torch.randn(1, 3, 32, 32)}
    with pytest.raises(CopyNCEError, match="head_batch_norm"):
        descriptor().train()(**batch)
    assert descriptor(head_batch_norm="joint").train()(**batch).loss is not None
