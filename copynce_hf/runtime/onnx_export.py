"""ONNX export of the CopyNCE models: a folder that ONNX Runtime runs without the PyTorch models.

``copynce export-onnx MODEL OUT`` (and :func:`export_onnx`) writes, for a descriptor::

    OUT/descriptor.onnx          pixel_values (B, 3, H, W) -> descriptors (B, D), patch_tokens (B, L, C)

and for a matcher, its two stages as two graphs, so that the encoder-token cache of
:mod:`copynce_hf.retrieval.verify.scorer` works as with PyTorch (one encoder pass per image view,
one fusion pass per view pair)::

    OUT/matcher_encoder.onnx     pixel_values (B, 3, H, W) -> tokens (B, 1 + L, C)
    OUT/matcher_fusion.onnx      query_tokens (B, 1 + L, C), reference_tokens (B, 1 + L, C)
                                 -> logits (B,), query_patch_tokens (B, L, C), reference_patch_tokens (B, L, C)

plus ``config.json`` and ``preprocessor_config.json`` (the image processor that makes ``pixel_values``)
and ``onnx.json``, which names the graphs, their input size and opset, the source model and the
versions that made them. The batch axis is dynamic; the image size is the image processor's
(position embeddings are not interpolated inside the graphs). Graphs come from
``torch.onnx.export`` with its ``torch.export``-based exporter (``dynamo=True``) at opset
:data:`ONNX_OPSET`. Hugging Face ``optimum``'s exporter is not used: it knows only the model types
it registers, and its ONNX package (optimum-onnx 0.1) requires transformers 4.x.

:func:`cache_folder` names where ``--runtime onnx`` keeps the export of a model folder given rather than
an exported one (:func:`copynce_hf.runtime.loading.load_model` exports it there once).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from pathlib import Path

from ..modeling.errors import ConfigError
from ..outputs import StagedFolder

logger = logging.getLogger(__name__)
#: The exporter's registry logs one line per torchvision operator it cannot register when torchvision is
#: absent (it never is here: the package does not use torchvision); :class:`_QuietRegistry` drops those.
_EXPORTER_REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"


class _QuietRegistry(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("torchvision is not installed")

#: The ONNX opset of the exported graphs (ONNX Runtime 1.14 and later run it).
ONNX_OPSET = 18
#: What an exported folder's ``onnx.json`` lists as graph files, per model kind.
GRAPHS = {"descriptor": {"descriptor": "descriptor.onnx"},
          "matcher": {"encoder": "matcher_encoder.onnx", "fusion": "matcher_fusion.onnx"}}
MANIFEST = "onnx.json"
#: Where :func:`cached_export` keeps exports (``COPYNCE_ONNX_CACHE`` overrides it).
CACHE_ENV = "COPYNCE_ONNX_CACHE"


def onnx_cache_root() -> Path:
    """``$COPYNCE_ONNX_CACHE``, else ``$XDG_CACHE_HOME/copynce_hf/onnx`` (``~/.cache/copynce_hf/onnx``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "copynce_hf" / "onnx"


def is_onnx_folder(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is a folder written by :func:`export_onnx`."""
    return path is not None and (Path(path) / MANIFEST).is_file()


def read_manifest(folder: str | os.PathLike) -> dict:
    """The ``onnx.json`` of an exported folder, checked: kind known, every graph file present."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} cannot be read ({error}); export the model again with copynce export-onnx") from None
    kind = manifest.get("kind") if isinstance(manifest, dict) else None
    if kind not in GRAPHS or not isinstance(manifest.get("graphs"), dict):
        raise ConfigError(f"{path}: 'kind' must be one of {', '.join(GRAPHS)} with its 'graphs', got {kind!r}")
    for name in GRAPHS[kind]:
        file = Path(folder) / str(manifest["graphs"].get(name, GRAPHS[kind][name]))
        if not file.is_file():
            raise ConfigError(f"{folder}: the {kind}'s {name} graph {file.name} is missing; export the model again")
    return manifest


def _graph_modules(model):
    """The graphs of ``model`` as ``{name: (module, example inputs, input names, output names, dynamic axes)}``."""
    import torch

    from ..modeling.configuration_copynce import input_side, model_kind

    size = input_side(model.config)
    pixels = torch.zeros(2, model.config.num_channels, size, size)  # batch 2: a batch of 1 would be specialised

    class Descriptor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            output = self.model(pixel_values=pixel_values)
            return output.descriptors, output.patch_tokens

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model.pre_fusion_tokens(pixel_values)

    class Fusion(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, query_tokens, reference_tokens):
            return self.model.fuse(query_tokens, reference_tokens)

    batch = torch.export.Dim("batch", min=1)
    if model_kind(model) == "descriptor":
        return {"descriptor": (Descriptor(), (pixels,), ["pixel_values"], ["descriptors", "patch_tokens"],
                               ({0: batch},))}
    with torch.inference_mode():
        tokens = model.pre_fusion_tokens(pixels)
    return {
        "encoder": (Encoder(), (pixels,), ["pixel_values"], ["tokens"], ({0: batch},)),
        "fusion": (Fusion(), (tokens, tokens.clone()), ["query_tokens", "reference_tokens"],
                   ["logits", "query_patch_tokens", "reference_patch_tokens"], ({0: batch}, {0: batch})),
    }


def export_onnx(model, processor, output: str | os.PathLike, source: str = "") -> Path:
    """Write the ONNX folder ``output`` of a loaded CopyNCE descriptor or matcher (float32, eval mode) and its
    image processor (see the module docstring); ``source`` (the model's folder or Hub id) goes into ``onnx.json``.

    Returns:
        ``output``, written atomically (a failed export leaves no half folder behind).
    """
    from ..modeling.configuration_copynce import input_side, model_kind

    kind = model_kind(model)
    size = input_side(model.config)
    processed = processor.size.get("height"), processor.size.get("width")
    if processed != (size, size):
        named = "largest inference size" if getattr(model.config, "inference_sizes", None) else "image_size"
        raise ConfigError(f"{source or 'the model'}: the image processor makes {processed[0]}x{processed[1]} inputs "
                          f"but the model's {named} is {size}; the ONNX graphs take that size only")
    model.eval()
    quiet = _QuietRegistry()
    logging.getLogger(_EXPORTER_REGISTRY_LOGGER).addFilter(quiet)
    try:
        return _export_graphs(model, processor, kind, source, output)
    finally:
        logging.getLogger(_EXPORTER_REGISTRY_LOGGER).removeFilter(quiet)


def _export_graphs(model, processor, kind: str, source: str, output: str | os.PathLike) -> Path:
    """Write the graphs of ``model`` and its config, processor and manifest into ``output`` (staged)."""
    import torch

    from .. import __version__
    from ..modeling.configuration_copynce import input_side

    with StagedFolder(output) as staging:
        for name, (module, inputs, input_names, output_names, dynamic) in _graph_modules(model).items():
            module.eval()
            logger.info("exporting the %s's %s graph", kind, name)
            with warnings.catch_warnings():  # the exporter's notes on traced Python conditions
                warnings.simplefilter("ignore")
                program = torch.onnx.export(module, inputs, input_names=input_names, output_names=output_names,
                                            dynamic_shapes=dynamic, opset_version=ONNX_OPSET, dynamo=True,
                                            verbose=False)
            program.save(str(staging / GRAPHS[kind][name]))
        model.config.save_pretrained(staging)
        processor.save_pretrained(staging)
        size = input_side(model.config)
        manifest = {"kind": kind, "graphs": GRAPHS[kind], "opset": ONNX_OPSET, "image_size": [size, size],
                    "source": source, "exporter": "torch.onnx.export (dynamo)", "torch": torch.__version__,
                    "copynce_hf": __version__}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return Path(output)


def _model_identity(folder: Path) -> dict:
    """What a cached export depends on: the model folder's files (name, size, time) and the exporting versions."""
    import torch

    from .. import __version__

    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {"folder": str(folder.resolve()), "opset": ONNX_OPSET, "torch": torch.__version__,
            "copynce_hf": __version__,
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def cache_folder(model_folder: str | os.PathLike) -> Path:
    """Where the ONNX export of a local model folder is cached: under :func:`onnx_cache_root`, named by the
    folder and a hash of its files (name, size, time) and of the exporting versions, so that a changed model
    (or a new torch or copynce_hf) is exported again."""
    folder = Path(model_folder)
    key = hashlib.sha256(json.dumps(_model_identity(folder), sort_keys=True).encode()).hexdigest()[:16]
    return onnx_cache_root() / f"{folder.name}-{key}"
