"""One model loader for the CLI, the demo, the benchmarks and ``copynce detect``: the embedded defaults and Auto loading;
and ``copynce export-onnx``, a loaded model exported for ONNX Runtime (:func:`export_model_onnx`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..modeling.errors import ConfigError

#: Embedded model folders (float16 safetensors, see ``copynce_hf/pretrained/README.md``), the defaults everywhere.
PRETRAINED_DIR = Path(__file__).resolve().parents[1] / "pretrained"
DEFAULT_DESCRIPTOR = PRETRAINED_DIR / "descriptor"
DEFAULT_MATCHER = PRETRAINED_DIR / "matcher"
DEFAULTS = {"descriptor": DEFAULT_DESCRIPTOR, "matcher": DEFAULT_MATCHER}
#: What runs the models: PyTorch, or ONNX Runtime on graphs exported by ``copynce export-onnx``.
RUNTIMES = ("torch", "onnx")
_MADE_BY = (" (model folders are written by training, `python -m copynce_hf.training --output_dir DIR`, or by "
            "save_pretrained; the embedded ones by `python scripts/export_embedded.py`)")


def check_model_path(path: str | Path | None, option: str = "--model") -> None:
    """Refuse a model value that names a local folder which does not exist or is not a model folder.

    A value is local when it exists, is absolute, starts with ``.`` or ``~``, or has more than one
    path separator (a Hub id is ``name`` or ``org/name``); other values are left to the Hub. Called
    before any work, so that a mistyped path is reported as such (not as a malformed Hub id). An ONNX embedding
    model (``onnx:PATH``) must name a graph with its declaration
    (:func:`~copynce_hf.runtime.embedding_declaration.resolve_embedding`).
    """
    if path is None:
        return
    from .embedding_declaration import is_embedding_path, resolve_embedding

    if is_embedding_path(path):
        resolve_embedding(path, option)
        return
    text = os.fspath(path)
    local = Path(text).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ConfigError(f"{option} {text!r} is a file; a model folder written by save_pretrained is expected")
        if not (local / "config.json").is_file():
            raise ConfigError(f"{option} {text!r} is a folder without config.json (not a saved model folder)")
        return
    if local.is_absolute() or text.startswith((".", "~")) or text.replace("\\", "/").count("/") > 1:
        raise ConfigError(f"{option} {text!r}: the model folder does not exist{_MADE_BY}")


def _load_error(error: Exception, path, option: str) -> ConfigError:
    """One line on a model that cannot be loaded: the first line of ``error`` and what to do."""
    from safetensors import SafetensorError

    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, SafetensorError):
        return ConfigError(f"cannot load the model {str(path)!r} ({option}): {first_line}; a weights file is "
                           "damaged or incomplete: download or save the model again")
    if not Path(str(path)).exists():  # read as a Hub id: say first that no such folder exists
        return ConfigError(f"cannot load the model {str(path)!r} ({option}): there is no such folder here, and "
                           f"as a Hub id: {first_line}{_MADE_BY}")
    return ConfigError(f"cannot load the model {str(path)!r} ({option}): {first_line}")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub's host answers a TCP connection within ``timeout`` seconds (one name lookup and one
    connection; never where ``HF_HUB_OFFLINE`` is set)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


def resolve_hub_id(path: str | Path, option: str = "--model") -> str | Path:
    """``path`` as it is where it is a local folder or the Hub can be reached; where the Hub cannot be reached,
    the folder of the Hub id's snapshot in the local Hugging Face cache, or at once a :class:`ConfigError`
    (instead of transformers' five retries per file, each logged, about half a minute for a mistyped name)."""
    if Path(os.fspath(path)).expanduser().exists() or hub_reachable():
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(str(path), local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError) as error:
        hub = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached from this machine"
        raise ConfigError(f"cannot load the model {str(path)!r} ({option}): there is no such folder here, {hub} "
                          f"and its cache holds no such model ({type(error).__name__}){_MADE_BY}") from None


def load_model(path: str | Path | None = None, kind: str | None = None, option: str = "--model",
               default: str | Path | None = None, runtime: str = "torch"):
    """``(model, image_processor)`` of a saved CopyNCE folder or Hub id, in float32, in eval mode.

    Args:
        path: model folder or Hub id; ``None`` means ``default``, else the embedded model of ``kind``; ``onnx:PATH``
            an ONNX embedding model as a descriptor, whatever ``runtime``
            (:func:`copynce_hf.runtime.onnx_embedding.load_embedding_model`).
        kind: ``descriptor`` or ``matcher`` to insist on that kind of model; ``None`` accepts either.
        option: the command-line option named in error messages.
        default: the folder used when ``path`` is None (default: the embedded model of ``kind``).
        runtime: ``torch``, or ``onnx`` for the model's ONNX Runtime form
            (:func:`copynce_hf.runtime.onnx_runtime.load_onnx_model`: ``path`` may then also be a folder written by
            ``copynce export-onnx``; a model folder is exported once into a cache).

    The embedded models are stored in float16 to stay small; they are loaded in float32 because float16
    matrix products are several times slower (and less exact) on a CPU.

    Raises:
        ConfigError: the default folder is absent, the model cannot be loaded (a weights file is damaged, ...),
            or it is not a CopyNCE model (checked from its configuration, before the weights load) or not a
            ``kind``.
    """
    from .embedding_declaration import is_embedding_path
    from .onnx_embedding import load_embedding_model
    from .onnx_export import is_onnx_folder

    if kind not in (None, "descriptor", "matcher"):
        raise ConfigError(f"model kind must be 'descriptor' or 'matcher', got {kind!r}")
    if is_embedding_path(path):
        if kind == "matcher":
            raise ConfigError(f"{option} {path}: an ONNX embedding model (onnx:PATH) is a descriptor; a matcher is "
                              "needed here")
        return load_embedding_model(path, option=option)
    if runtime not in RUNTIMES:
        raise ConfigError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime == "onnx":
        return _load_onnx(path if path is not None else default, kind, option)
    if is_onnx_folder(path):
        raise ConfigError(f"{option} {path} is an ONNX export (copynce export-onnx): pass --runtime onnx to run it")
    path = _model_path(path, kind, option, default)
    check_model_path(path, option)
    path = resolve_hub_id(path, option)  # before torch loads: a mistyped name fails in a second
    return _load_torch(path, kind, option)


def _model_path(path: str | Path | None, kind: str | None, option: str, default: str | Path | None) -> str | Path:
    """``path``, or the default folder (``default``, else the embedded model of ``kind``) when it is ``None``;
    :class:`ConfigError` naming ``option`` when that folder is absent."""
    if path is not None:
        return path
    folder = Path(default) if default is not None else DEFAULTS.get(kind or "descriptor")
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"no {option} given and the embedded model folder {folder} does not exist (the embedded models are "
            f"made by `python scripts/export_embedded.py`, see copynce_hf/pretrained/README.md); pass {option} PATH "
            f"(a folder written by save_pretrained, or a Hub id)"
        )
    return folder


def _load_torch(path: str | Path, kind: str | None, option: str):
    """``(model, image_processor)`` of a model folder or Hub id with ``transformers``' Auto classes, its configuration
    read first: a folder of another architecture, or not of ``kind``, is refused before its weights load."""
    # importing copynce_hf (this module's package) registered the CopyNCE classes with the Auto classes
    import torch
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoImageProcessor, AutoModel

    from ..modeling.configuration_copynce import model_kind

    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as error:
        raise _load_error(error, path, option) from error
    try:
        found = model_kind(config)
    except ConfigError as error:
        raise ConfigError(f"{option} {path}: {error}") from None
    if kind is not None and found != kind:
        raise ConfigError(f"{option} {path} holds a {found}; a {kind} is needed here")
    try:
        model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
        processor = AutoImageProcessor.from_pretrained(str(path))
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        raise _load_error(error, path, option) from error
    return model, processor


def _load_onnx(path: str | Path | None, kind: str | None, option: str):
    """``load_model(..., runtime="onnx")``: an exported folder as it is; a local model folder (``None``: the
    embedded model of ``kind``) exported first into its cache folder, once (:func:`copynce_hf.runtime.onnx_export.cache_folder`)."""
    import logging

    from .onnx_export import cache_folder, export_onnx, is_onnx_folder
    from .onnx_runtime import load_onnx_model

    if not is_onnx_folder(path):
        folder = Path(path) if path is not None else DEFAULTS[kind or "descriptor"]
        check_model_path(folder, option)
        if not folder.is_dir():
            raise ConfigError(f"{option} {path}: --runtime onnx needs a local model folder or a folder written by "
                              "copynce export-onnx, not a Hub id (download the model first)")
        target = cache_folder(folder)
        if not is_onnx_folder(target):
            logging.getLogger(__name__).warning("exporting %s to ONNX into %s (once: reused while the model is "
                                                "unchanged)", folder, target)
            model, processor = load_model(folder, kind, option)
            export_onnx(model, processor, target, source=str(folder.resolve()))
        path = target
    return load_onnx_model(path, kind, option)


def export_model_onnx(path: str | Path | None, output: str | Path, kind: str | None = None) -> tuple[Path, dict]:
    """``copynce export-onnx`` as one call: the model ``path`` (``None``: the embedded model of ``kind``, else the
    descriptor) loaded and its ONNX graphs written into the folder ``output``
    (:func:`copynce_hf.runtime.onnx_export.export_onnx`), the output and the path checked first. Returns ``(folder, graph
    name -> file name)``."""
    from ..outputs import check_output_folder
    from .onnx_export import export_onnx, read_manifest

    check_output_folder(output)
    check_model_path(path, "MODEL")
    model, processor = load_model(path, kind, "MODEL")
    local = Path(str(model.name_or_path))
    source = str(local.resolve()) if local.exists() else str(model.name_or_path)
    folder = export_onnx(model, processor, output, source)
    return folder, read_manifest(folder)["graphs"]


# --------------------------------------------------------------------------- a saved folder read before the model


def saved_config_dict(name_or_path: str) -> dict:
    """The ``config.json`` of a saved model folder or Hub id, as a dict."""
    from transformers import PretrainedConfig

    text = str(name_or_path)
    if not Path(text).is_dir() and (Path(text).is_absolute() or text.startswith(".") or text.count("/") != 1):
        raise ConfigError(f"invalid configuration value model_name_or_path={text!r}: no such model folder")
    if Path(text).is_dir() and not (Path(text) / "config.json").is_file():
        raise ConfigError(f"invalid configuration value model_name_or_path={text!r}: the folder holds no "
                          "config.json (a model folder written by save_pretrained is expected)")
    try:
        values, _ = PretrainedConfig.get_config_dict(text)
    except (OSError, ValueError) as error:  # no such folder, no config.json, offline, not a repository id
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = "" if Path(text).exists() else "no such model folder, and as a Hub id "
        raise ConfigError(f"invalid configuration value model_name_or_path={text!r}: {where}cannot read its "
                          f"configuration ({reason})") from None
    return values


def saved_model_kind(name_or_path: str) -> str:
    """``"descriptor"`` or ``"matcher"``: the kind of the saved CopyNCE model ``name_or_path`` names."""
    model_type = str(saved_config_dict(name_or_path).get("model_type", ""))
    for kind in ("matcher", "descriptor"):
        if kind in model_type:
            return kind
    raise ConfigError(f"invalid configuration value model_name_or_path={name_or_path!r}: its model_type "
                      f"{model_type!r} is neither a CopyNCE descriptor nor a CopyNCE matcher")
