"""ONNX Runtime in place of the PyTorch models: ``--runtime onnx`` of ``copynce index``, ``search`` and ``detect``.

:class:`OnnxDescriptorModel` and :class:`OnnxMatcherModel` run the graphs of a folder written by
:func:`copynce_hf.runtime.onnx_export.export_onnx` and answer the calls the retrieval code makes of a
CopyNCE model: ``model(pixel_values=...)`` (a :class:`CopyNCEDescriptorOutput` with ``descriptors``
and ``patch_tokens``; for the matcher ``model(pixel_values=..., reference_pixel_values=...)``, a
:class:`CopyNCEMatcherOutput`), the matcher's two stages ``pre_fusion_tokens`` and ``fuse`` (so that
:class:`~copynce_hf.retrieval.verify.scorer.MatcherScorer` caches encoder tokens as with PyTorch), ``config``,
``device``, ``eval()``, ``to()`` and ``state_dict()`` (the graph files' bytes, for weight fingerprints). Tensors go in and come out as CPU torch tensors.

Sessions use ``threads`` intra-op threads (default: ``torch.get_num_threads()``, so that both
runtimes use the same number of cores, ``OMP_NUM_THREADS`` included).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..modeling.errors import ConfigError, ShapeError
from ..modeling.modeling_copynce import CopyNCEDescriptorOutput, CopyNCEMatcherOutput
from .onnx_export import GRAPHS, read_manifest


def inference_session(file: Path, threads: int | None):
    """An ONNX Runtime CPU session of the graph ``file`` with ``threads`` intra-op threads (default: torch's); a
    :class:`ConfigError` naming the file when ONNX Runtime cannot load it."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ImportError("--runtime onnx and onnx:PATH descriptors need onnxruntime, from the 'onnx' extra: "
                          "pip install -e '.[onnx]'") from error
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(threads or torch.get_num_threads())
    options.inter_op_num_threads = 1
    try:
        return onnxruntime.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for a damaged file
        raise ConfigError(f"{file} cannot be loaded by ONNX Runtime: {' '.join(str(error).split())[:300]}") from None


class CpuSessionModel:
    """What an ONNX Runtime model shares with a torch module for the retrieval code: its ``device`` (the CPU),
    ``eval()`` and ``to()`` (both no-ops); :func:`file_tensor` gives its ``state_dict()`` the bytes that hold its
    weights."""

    device = torch.device("cpu")

    def eval(self):
        return self

    def to(self, *args, **kwargs):
        """Kept on the CPU: the sessions run on ONNX Runtime's CPU provider whatever device is asked."""
        return self


def file_tensor(file: Path) -> torch.Tensor:
    """A file's bytes as a (N,) uint8 tensor (what a weight fingerprint reads of a graph)."""
    return torch.from_numpy(np.fromfile(file, dtype=np.uint8))


class _OnnxModel(CpuSessionModel):
    """What both wrappers share: the folder's config and manifest, the sessions, the size check."""

    def __init__(self, folder: str | os.PathLike, threads: int | None = None):
        from transformers import AutoConfig

        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        self.config = AutoConfig.from_pretrained(str(self.folder))
        self.graph_files = {name: self.folder / str(self.manifest["graphs"].get(name, file))
                            for name, file in GRAPHS[self.manifest["kind"]].items()}
        self.sessions = {name: inference_session(file, threads) for name, file in self.graph_files.items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The graph files' bytes (uint8 tensors by file name), which hold the weights: what a fingerprint of the
        model's weights (:func:`~.work_folder.model_fingerprint`, the identity of saved scores) reads."""
        return {file.name: file_tensor(file) for file in self.graph_files.values()}

    def _check_pixels(self, pixel_values: torch.Tensor) -> np.ndarray:
        size = tuple(self.manifest["image_size"])
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[-2:]) != size:
            raise ShapeError(f"the ONNX graphs of {self.folder} take (B, 3, {size[0]}, {size[1]}) pixel_values, "
                             f"got {tuple(pixel_values.shape)}")
        return pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()

    def _run(self, name: str, **inputs) -> list[torch.Tensor]:
        return [torch.from_numpy(array) for array in self.sessions[name].run(None, inputs)]


class OnnxDescriptorModel(_OnnxModel):
    """A descriptor's ``descriptor.onnx``: ``(B, 3, H, W) -> descriptors (B, D), patch_tokens (B, L, C)``."""

    def __call__(self, pixel_values: torch.Tensor) -> CopyNCEDescriptorOutput:
        descriptors, patch_tokens = self._run("descriptor", pixel_values=self._check_pixels(pixel_values))
        return CopyNCEDescriptorOutput(descriptors=descriptors, patch_tokens=patch_tokens)


class OnnxMatcherModel(_OnnxModel):
    """A matcher's ``matcher_encoder.onnx`` and ``matcher_fusion.onnx`` (the two stages of
    :class:`~copynce_hf.modeling.CopyNCEMatcherModel`)."""

    def pre_fusion_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> encoder tokens (B, 1 + L, C), CLS first."""
        return self._run("encoder", pixel_values=self._check_pixels(pixel_values))[0]

    def fuse(self, query_encoded: torch.Tensor, reference_encoded: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Encoder tokens (B, 1 + L, C) of both sides -> ``(logits (B,), query_patch_tokens (B, L, C),
        reference_patch_tokens (B, L, C))``."""
        if query_encoded.shape != reference_encoded.shape:
            raise ShapeError(f"the ONNX fusion graph takes two token batches of one shape, got "
                             f"{tuple(query_encoded.shape)} and {tuple(reference_encoded.shape)}")
        arrays = (t.detach().to("cpu", torch.float32).contiguous().numpy() for t in (query_encoded, reference_encoded))
        return tuple(self._run("fusion", **dict(zip(("query_tokens", "reference_tokens"), arrays))))

    def __call__(self, pixel_values: torch.Tensor, reference_pixel_values: torch.Tensor) -> CopyNCEMatcherOutput:
        logits, query_patches, reference_patches = self.fuse(self.pre_fusion_tokens(pixel_values),
                                                             self.pre_fusion_tokens(reference_pixel_values))
        return CopyNCEMatcherOutput(logits=logits, query_patch_tokens=query_patches,
                                    reference_patch_tokens=reference_patches)


def load_onnx_model(folder: str | os.PathLike, kind: str | None = None, option: str = "--model",
                    threads: int | None = None):
    """``(ONNX model, image processor)`` of a folder written by :func:`~copynce_hf.runtime.onnx_export.export_onnx`;
    ``kind`` (``descriptor`` or ``matcher``) insists on that kind. (``load_model(..., runtime="onnx")`` also
    takes model folders, exported once into a cache.)"""
    from transformers import AutoImageProcessor

    manifest = read_manifest(folder)
    if kind is not None and manifest["kind"] != kind:
        raise ConfigError(f"{option} {folder} holds an exported {manifest['kind']}; a {kind} is needed here")
    wrapper = OnnxDescriptorModel if manifest["kind"] == "descriptor" else OnnxMatcherModel
    return wrapper(folder, threads), AutoImageProcessor.from_pretrained(str(folder))


def check_content_fusion(model) -> None:
    """Refuse content tokens with a matcher that cannot fuse token sequences of varying length (ONNX Runtime)."""
    if isinstance(model, OnnxMatcherModel):
        raise ConfigError("content tokens fuse sequences of varying length, which the ONNX fusion graph does not "
                          "take: use --runtime torch, or --no-content-tokens with --runtime onnx")
