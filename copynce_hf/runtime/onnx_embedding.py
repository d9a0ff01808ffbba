"""An ONNX embedding model run as a descriptor (``onnx:PATH``, declared as :mod:`.embedding_declaration` reads it).

:class:`EmbeddingImageProcessor` makes the graph's ``pixel_values`` (``processor(images=image, return_tensors="pt")``):
the package's one RGB conversion (:func:`~copynce_hf.modeling.rgb_conversion.pil_to_rgb`), the declared resize, then
the declared layout and type. :class:`OnnxEmbeddingModel` answers the calls the retrieval code makes of a descriptor
model (``model(pixel_values=...).descriptors`` (B, D), ``to``, ``eval``, ``state_dict`` for weight fingerprints).
Images resized to several sizes (``short-side``, ``none``) batch as lists of tensors, run one size at a time. An
embedding model has no patch tokens: descriptor content tokens and token heatmaps need a CopyNCE model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ..modeling.errors import ConfigError, ShapeError
from .embedding_declaration import PREFIX, EmbeddingDeclaration, resolve_embedding
from .onnx_runtime import CpuSessionModel, file_tensor, inference_session


class EmbeddingImageProcessor:
    """The pixel values an embedding graph takes, as its :class:`EmbeddingDeclaration` says: RGB
    (:func:`~copynce_hf.modeling.rgb_conversion.pil_to_rgb`), resized, then ``(3, H, W)`` (``nchw``) or
    ``(H, W, 3)`` (``nhwc``) per image, float32 rescaled and normalised or uint8 as read."""

    model_input_names = ["pixel_values"]

    def __init__(self, declaration: EmbeddingDeclaration):
        self.declaration = declaration

    def resized(self, image):
        """The RGB PIL image resized by the declaration (``short-side``: the long side scaled to keep the aspect
        ratio, truncated as torchvision's ``Resize(int)`` does)."""
        from PIL import Image

        from ..modeling.rgb_conversion import pil_to_rgb

        image = pil_to_rgb(image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image)))
        declared, width, height = self.declaration, *image.size
        if declared.resize == "none":
            return image
        if declared.resize == "fixed":
            size = (declared.size[-1], declared.size[0])  # one side: a square
        else:
            short = declared.size[0]
            size = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
        resample = getattr(Image.Resampling, declared.resample.upper())
        return image if image.size == size else image.resize(size, resample)

    def pixels(self, image) -> torch.Tensor:
        """One image's pixel values: ``(3, H, W)`` or ``(H, W, 3)``, float32 or uint8."""
        array = np.array(self.resized(image), dtype=np.uint8)  # (H, W, 3), writable
        declared = self.declaration
        if declared.dtype == "float32":
            array = array.astype(np.float32) * np.float32(declared.rescale)
            if declared.mean is not None:
                array = (array - np.array(declared.mean, np.float32)) / np.array(declared.std, np.float32)
        if declared.layout == "nchw":
            array = array.transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(array))

    def __call__(self, images, return_tensors: str = "pt") -> dict:
        """``{"pixel_values": (B, ...)}`` of one image or a list of images of one processed size."""
        if return_tensors != "pt":
            raise ConfigError(f"an embedding model's image processor returns torch tensors, not {return_tensors!r}")
        rows = [self.pixels(image) for image in (images if isinstance(images, (list, tuple)) else [images])]
        if len({tuple(row.shape) for row in rows}) > 1:
            raise ShapeError(f"images of sizes {sorted({tuple(row.shape) for row in rows})} after the resize "
                             f"{self.declaration.resize!r} do not batch: process them one at a time")
        return {"pixel_values": torch.stack(rows)}

    def to_dict(self) -> dict:
        """The settings (what caches of descriptors are tied to, with the model's weights)."""
        return {"image_processor_type": type(self).__name__, **self.declaration.to_dict()}


def _io_names(session, declaration: EmbeddingDeclaration, graph: Path) -> tuple[str, str]:
    """``(input name, output name)`` of the graph, checked against the declaration: the input's type and rank (and
    its channels and size where the graph fixes them), the output's rank."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    names = [i.name for i in inputs]
    if declaration.input is None and len(inputs) != 1:
        raise ConfigError(f"{graph} takes {len(inputs)} inputs ({', '.join(names)}): declare field 'input'")
    if declaration.input is not None and declaration.input not in names:
        raise ConfigError(f"{graph}: field 'input' is {declaration.input!r}, but the graph's inputs are {names}")
    node = inputs[0] if declaration.input is None else inputs[names.index(declaration.input)]
    expected = {"float32": "tensor(float)", "uint8": "tensor(uint8)"}[declaration.dtype]
    if node.type != expected or len(node.shape) != 4:
        raise ConfigError(f"{graph}: its input {node.name!r} is a rank-{len(node.shape)} {node.type}, but the "
                          f"declaration (dtype {declaration.dtype!r}) gives a rank-4 {expected}")
    channels, height, width = (node.shape[1:] if declaration.layout == "nchw"
                               else (node.shape[3], *node.shape[1:3]))
    if isinstance(channels, int) and channels != 3:
        raise ConfigError(f"{graph}: its input {node.name!r} of shape {node.shape} has {channels} channels where "
                          f"layout {declaration.layout!r} puts RGB's 3: is the layout right?")
    declared = (declaration.size * 2)[:2] if declaration.resize == "fixed" else (None, None)
    if any(isinstance(side, int) and side != want for side, want in zip((height, width), declared)):
        raise ConfigError(f"{graph}: its input {node.name!r} takes {height}x{width} images: declare resize "
                          f"'fixed' and size [{height}, {width}], not resize {declaration.resize!r}, size "
                          f"{declaration.size}")
    output_names = [o.name for o in outputs]
    output = declaration.output or output_names[0]
    if output not in output_names:
        raise ConfigError(f"{graph}: field 'output' is {output!r}, but the graph's outputs are {output_names}")
    if len(outputs[output_names.index(output)].shape) != 2:
        raise ConfigError(f"{graph}: its output {output!r} of shape {outputs[output_names.index(output)].shape} "
                          "is not (batch, dimension) embeddings: declare field 'output'")
    return node.name, output


class OnnxEmbeddingModel(CpuSessionModel):
    """An ONNX embedding graph as a descriptor model: ``model(pixel_values=...)`` gives ``descriptors`` (B, D)
    (L2-normalised when declared) and no patch tokens.

    ``pixel_values``: a ``(B, ...)`` tensor of one size, or a list of B unbatched tensors (images of several sizes,
    as :func:`~copynce_hf.retrieval.descriptors.extract.extract_descriptors` batches them), run one size at a time.
    """

    def __init__(self, graph: str | os.PathLike, declaration: EmbeddingDeclaration, threads: int | None = None,
                 source: str = ""):
        self.graph, self.declaration, self.source = Path(graph), declaration, source
        self.session = inference_session(self.graph, threads)
        self.input_name, self.output_name = _io_names(self.session, declaration, self.graph)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The graph file's bytes and the declaration's (uint8 tensors): what a weight fingerprint reads."""
        text = json.dumps(self.declaration.to_dict(), sort_keys=True).encode()
        return {self.graph.name: file_tensor(self.graph),
                "declaration": torch.frombuffer(bytearray(text), dtype=torch.uint8)}

    def _embed(self, batch: torch.Tensor) -> torch.Tensor:
        dtype = {"float32": torch.float32, "uint8": torch.uint8}[self.declaration.dtype]
        if batch.dim() != 4 or batch.dtype != dtype:
            raise ShapeError(f"{self.graph} takes a rank-4 {dtype} batch (layout {self.declaration.layout}), got "
                             f"{tuple(batch.shape)} {batch.dtype}")
        array = batch.detach().to("cpu").contiguous().numpy()
        return torch.from_numpy(self.session.run([self.output_name], {self.input_name: array})[0]).float()

    def __call__(self, pixel_values) -> object:
        from ..modeling.modeling_copynce import CopyNCEDescriptorOutput

        if isinstance(pixel_values, torch.Tensor):
            embeddings = self._embed(pixel_values)
        else:
            rows: list = [None] * len(pixel_values)
            by_shape: dict[tuple, list[int]] = {}
            for row, pixels in enumerate(pixel_values):
                by_shape.setdefault(tuple(pixels.shape), []).append(row)
            for group in by_shape.values():
                for row, vector in zip(group, self._embed(torch.stack([pixel_values[i] for i in group]))):
                    rows[row] = vector
            embeddings = torch.stack(rows)
        if self.declaration.normalize:
            embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
        return CopyNCEDescriptorOutput(descriptors=embeddings)


def token_heatmap_model(model, processor) -> tuple:
    """``(model, processor)`` for a report's token heatmaps, ``(None, None)`` for an embedding model (no tokens)."""
    return (None, None) if isinstance(model, OnnxEmbeddingModel) else (model, processor)


def load_embedding_model(path: str | os.PathLike, declaration: EmbeddingDeclaration | dict | None = None,
                         option: str = "--model", threads: int | None = None):
    """``(OnnxEmbeddingModel, EmbeddingImageProcessor)`` of ``onnx:PATH`` (the prefix is optional here).

    Args:
        path: an ONNX graph, its JSON declaration or a folder with its ``embedding_config.json``
            (:func:`~.embedding_declaration.resolve_embedding`).
        declaration: the graph's declaration given in Python (a dict of its fields, or an
            :class:`EmbeddingDeclaration`); ``path`` must then be the graph file.
        option: the option named in error messages.
        threads: ONNX Runtime's intra-op threads (default: torch's).
    """
    if declaration is None:
        graph, declaration, where = resolve_embedding(path, option)
    else:
        text = os.fspath(path)
        graph, where = Path(text[len(PREFIX):] if text.startswith(PREFIX) else text).expanduser(), "given in Python"
        if not graph.is_file():
            raise ConfigError(f"{option} {text}: no such ONNX graph file")
        if isinstance(declaration, dict):
            declaration = EmbeddingDeclaration.from_dict(declaration, "the declaration given")
    model = OnnxEmbeddingModel(graph, declaration, threads, source=where)
    return model, EmbeddingImageProcessor(declaration)
