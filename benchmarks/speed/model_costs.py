"""Seconds per model pass of inference: a descriptor image, a matcher encoder view, a matcher fusion pair.

These are the units the inference pipeline is made of (``copynce detect``): the descriptor embeds
every image or LCE view once; the matcher's encoder-token cache
(:class:`copynce_hf.retrieval.verify.scorer.MatcherScorer`) runs its encoder blocks once per image
view and only its fusion blocks per (query view, reference view) pair. Used by
:mod:`benchmarks.scale.disc21` (this CPU) and :mod:`benchmarks.scale.gpu_throughput` (a GPU).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from ..common import REPO_ROOT

__all__ = ["COST_MODELS", "vits16_options", "load_cost_models", "pass_costs", "synchronize"]

#: Model pairs timed: the embedded 112-pixel models, and ViT-S/16 at 224 (the paper's size; random weights).
COST_MODELS = {
    "embedded": "copynce_hf/pretrained/descriptor and copynce_hf/pretrained/matcher (float32)",
    "vits16-224": "configs/descriptor_vits16_224.yaml and configs/matcher_vits16_224.yaml models, random weights",
}


def vits16_options(config_name: str, image_size: int | None = None) -> dict:
    """The ``model`` options of a shipped ViT-S/16 training config (``configs/<config_name>``), optionally at
    another ``image_size`` (tests run them small). No k-NN graph is needed to read the architecture."""
    from copynce_hf.training.config import load_config

    options = dict(load_config(Path(REPO_ROOT) / "configs" / config_name, {"hard_negative_mining": None}).model)
    if image_size is not None:
        options["image_size"] = int(image_size)
    return options


def load_cost_models(name: str, image_size: int | None = None):
    """``(descriptor, matcher)`` in eval mode on the CPU, float32, for a :data:`COST_MODELS` name
    (``image_size`` changes the ViT-S/16 models' input size; the embedded ones keep theirs)."""
    from copynce_hf.modeling import (
        CopyNCEDescriptorConfig,
        CopyNCEDescriptorModel,
        CopyNCEMatcherConfig,
        CopyNCEMatcherModel,
    )

    if name == "embedded":
        folder = Path(REPO_ROOT) / "copynce_hf" / "pretrained"
        descriptor = CopyNCEDescriptorModel.from_pretrained(folder / "descriptor", dtype=torch.float32)
        matcher = CopyNCEMatcherModel.from_pretrained(folder / "matcher", dtype=torch.float32)
    elif name == "vits16-224":
        torch.manual_seed(0)
        descriptor = CopyNCEDescriptorModel(
            CopyNCEDescriptorConfig(**vits16_options("descriptor_vits16_224.yaml", image_size)))
        matcher = CopyNCEMatcherModel(CopyNCEMatcherConfig(**vits16_options("matcher_vits16_224.yaml", image_size)))
    else:
        raise ValueError(f"unknown cost model {name!r}; choose one of {', '.join(COST_MODELS)}")
    return descriptor.eval(), matcher.eval()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fastest_seconds(function, repeats: int, device: torch.device) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (load on a shared machine only ever adds time):
    CPU time of this process on the CPU (what the work costs a core, whatever else the machine runs),
    wall time after synchronising on a GPU."""
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    function()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = clock()
        function()
        synchronize(device)
        times.append(clock() - start)
    return min(times)


def pass_costs(descriptor, matcher, batch_size: int = 32, repeats: int = 3, device: str = "cpu",
               precision: str = "no") -> dict:
    """Seconds per item of each inference pass, on random pixels of the models' image size.

    Args:
        descriptor, matcher: a ``CopyNCEDescriptorModel`` and a ``CopyNCEMatcherModel``.
        batch_size: images (or pairs) per pass.
        repeats: timed passes of each kind; the fastest is kept (CPU time on the CPU: run with one torch
            thread, the figures are then seconds of one core).
        device: where the models run (they are moved there).
        precision: ``no`` (float32) or ``bf16`` (autocast).

    Returns:
        ``descriptor_seconds_per_image`` (``descriptor(pixel_values (B, 3, S, S))``),
        ``encoder_seconds_per_view`` (``matcher.pre_fusion_tokens``: the cached part),
        ``fusion_seconds_per_pair`` (``matcher.fuse`` of two encoded batches: the part run per pair),
        ``uncached_seconds_per_pair`` (a whole matcher forward of a pair: both encoders and the fusion),
        with the batch size, precision and model shapes.
    """
    from copynce_hf.retrieval.verify.scorer import matcher_stages

    device = torch.device(device)
    descriptor, matcher = descriptor.to(device), matcher.to(device)
    pre_fusion_tokens, fuse = matcher_stages(matcher)
    generator = torch.Generator().manual_seed(0)

    def pixels(model):
        size = model.config.image_size
        return torch.randn(batch_size, 3, size, size, generator=generator).to(device)

    descriptor_pixels, query_pixels, reference_pixels = pixels(descriptor), pixels(matcher), pixels(matcher)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    with torch.inference_mode(), autocast:
        query_tokens, reference_tokens = pre_fusion_tokens(query_pixels), pre_fusion_tokens(reference_pixels)
        seconds = {
            "descriptor_seconds_per_image": _fastest_seconds(lambda: descriptor(pixel_values=descriptor_pixels),
                                                             repeats, device),
            "encoder_seconds_per_view": _fastest_seconds(lambda: pre_fusion_tokens(query_pixels), repeats, device),
            "fusion_seconds_per_pair": _fastest_seconds(lambda: fuse(query_tokens, reference_tokens), repeats,
                                                        device),
            "uncached_seconds_per_pair": _fastest_seconds(
                lambda: matcher(pixel_values=query_pixels, reference_pixel_values=reference_pixels), repeats, device),
        }
    result = {name: value / batch_size for name, value in seconds.items()}
    result.update(batch_size=batch_size, repeats=repeats, precision=precision, device=str(device),
                  torch_threads=torch.get_num_threads(),
                  descriptor={key: descriptor.config.to_dict()[key] for key in
                              ("hidden_size", "num_hidden_layers", "image_size", "patch_size", "descriptor_dim")},
                  matcher={key: matcher.config.to_dict()[key] for key in
                           ("hidden_size", "num_hidden_layers", "num_fusion_layers", "image_size", "patch_size")})
    return result
