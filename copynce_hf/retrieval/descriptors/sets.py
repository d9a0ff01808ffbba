"""Descriptor sets on disk: safetensors files with their image ids, and the DISC21 HDF5 export.

A descriptor set is a float32 matrix of shape (N, D), one row per image, with the N image
ids in the same order. It is stored as one safetensors file: the tensor ``descriptors``
and, in the header metadata, the ids as a JSON list (key ``ids``) plus ``format``
``copynce-descriptors``. The DISC21 descriptor track expects instead one HDF5 file with the
datasets ``query``, ``reference``, ``query_ids`` and ``reference_ids``:
:func:`export_disc21_hdf5` writes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from ...modeling.errors import PredictionsError
from ...outputs import give_default_mode

DESCRIPTORS_FORMAT = "copynce-descriptors"


@dataclass
class DescriptorSet:
    """Image ids and their descriptors.

    Attributes:
        ids: N image ids (strings, unique).
        descriptors: float32 array of shape (N, D); rows are L2-normalised for CopyNCE descriptors.
        skipped: ids (or file names) of images that could not be read during extraction.
        skip_reasons: id -> plain-words reason of each skipped image (``ImageLoadError.reason``),
            known right after extraction (saved with the set).
    """

    ids: list[str]
    descriptors: np.ndarray
    skipped: list[str] | None = None
    skip_reasons: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids = [str(i) for i in self.ids]
        self.descriptors = np.ascontiguousarray(self.descriptors, dtype=np.float32)
        if self.descriptors.ndim != 2 or self.descriptors.shape[0] != len(self.ids):
            raise PredictionsError(
                f"descriptors of shape {self.descriptors.shape} do not match {len(self.ids)} ids"
            )
        if len(set(self.ids)) != len(self.ids):
            seen: set[str] = set()
            duplicate = next(i for i in self.ids if i in seen or seen.add(i))
            raise PredictionsError(f"image id {duplicate!r} appears twice in a descriptor set")
        self.skipped = list(self.skipped or [])

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.descriptors.shape[1])

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``descriptors`` (float32, (N, D)) and the ids to one safetensors file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {
            "format": DESCRIPTORS_FORMAT,
            "ids": json.dumps(self.ids),
            "skipped": json.dumps(self.skipped),
            "skip_reasons": json.dumps(self.skip_reasons),
        }
        save_file({"descriptors": self.descriptors}, str(path), metadata=metadata)
        give_default_mode(path)  # safetensors writes 0600
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> DescriptorSet:
        """Read a file written by :meth:`save`; a folder means ``<folder>/descriptors.safetensors``."""
        path = Path(path)
        if path.is_dir():
            path = path / "descriptors.safetensors"
        if not path.is_file():
            raise PredictionsError(f"descriptor file {os.fspath(path)!r} does not exist")
        try:
            with safe_open(str(path), framework="numpy") as handle:
                metadata = handle.metadata() or {}
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as error:
            raise PredictionsError(f"descriptor file {os.fspath(path)!r} is not a safetensors file: {error}") from error
        if metadata.get("format") != DESCRIPTORS_FORMAT or "descriptors" not in tensors:
            raise PredictionsError(
                f"descriptor file {os.fspath(path)!r} was not written by copynce (no {DESCRIPTORS_FORMAT!r} metadata)"
            )
        return cls(json.loads(metadata["ids"]), tensors["descriptors"], json.loads(metadata.get("skipped", "[]")),
                   json.loads(metadata.get("skip_reasons", "{}")))


def read_descriptor_header(path: str | os.PathLike) -> tuple[dict, tuple[int, int]]:
    """The metadata (``ids``, ``skipped``, ``skip_reasons``, decoded from JSON) and the descriptor shape (N, D) of
    a file written by :meth:`DescriptorSet.save`, without reading the descriptors."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            shape = tuple(handle.get_slice("descriptors").get_shape())
    except (SafetensorError, OSError) as error:
        raise PredictionsError(f"descriptor file {os.fspath(path)!r} is not a safetensors file: {error}") from error
    if metadata.get("format") != DESCRIPTORS_FORMAT:
        raise PredictionsError(f"descriptor file {os.fspath(path)!r} was not written by copynce")
    defaults = {"ids": "[]", "skipped": "[]", "skip_reasons": "{}"}
    return {key: json.loads(metadata.get(key, default)) for key, default in defaults.items()}, shape


def concatenate_descriptor_files(parts: list[str | os.PathLike], path: str | os.PathLike) -> Path:
    """Write the rows of several descriptor files (:meth:`DescriptorSet.save`), in order, as one file that
    :meth:`DescriptorSet.load` reads, holding one part in memory at a time.

    The safetensors layout is written directly: an 8-byte little-endian header length, the JSON header
    (the ``descriptors`` tensor's dtype, shape and byte range, and the metadata of :meth:`DescriptorSet.save`),
    padded with spaces to a multiple of 8 bytes, then the float32 rows.
    """
    if not parts:
        raise PredictionsError("no descriptor file to concatenate")
    headers = [read_descriptor_header(part) for part in parts]
    dims = {shape[1] for _, shape in headers}
    if len(dims) > 1:
        raise PredictionsError(f"descriptor files of different dimensions {sorted(dims)}: {[str(p) for p in parts]}")
    dim = dims.pop()
    ids = [image_id for metadata, _ in headers for image_id in metadata["ids"]]
    DescriptorSet(ids, np.zeros((len(ids), 0), np.float32))  # refuses duplicate ids before anything is written
    metadata = {"format": DESCRIPTORS_FORMAT, "ids": json.dumps(ids),
                "skipped": json.dumps([image_id for part, _ in headers for image_id in part["skipped"]]),
                "skip_reasons": json.dumps({key: value for part, _ in headers for key, value in part["skip_reasons"].items()})}
    size = len(ids) * dim * 4
    header = json.dumps({"descriptors": {"dtype": "F32", "shape": [len(ids), dim], "data_offsets": [0, size]},
                         "__metadata__": metadata}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(len(header).to_bytes(8, "little"))
        handle.write(header)
        for part in parts:
            handle.write(np.ascontiguousarray(DescriptorSet.load(part).descriptors, dtype="<f4").tobytes())
    return path


def export_disc21_hdf5(
    path: str | os.PathLike, queries: DescriptorSet, references: DescriptorSet
) -> Path:
    """Write the DISC21 descriptor-track HDF5 file.

    Datasets: ``query`` (Nq, D) float32, ``reference`` (Nr, D) float32, ``query_ids`` and
    ``reference_ids`` (variable-length UTF-8 strings). Requires ``h5py`` (``pip install h5py``,
    or the ``bench`` extra).
    """
    try:
        import h5py
    except ImportError as error:  # optional dependency
        raise ImportError(
            "exporting to the DISC21 HDF5 layout needs h5py: pip install h5py (or copynce_hf[bench])"
        ) from error
    if queries.dim != references.dim:
        raise PredictionsError(f"query descriptors have {queries.dim} dimensions, references {references.dim}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    strings = h5py.string_dtype(encoding="utf-8")
    with h5py.File(path, "w") as handle:
        handle.create_dataset("query", data=queries.descriptors)
        handle.create_dataset("reference", data=references.descriptors)
        handle.create_dataset("query_ids", data=np.array(queries.ids, dtype=object), dtype=strings)
        handle.create_dataset("reference_ids", data=np.array(references.ids, dtype=object), dtype=strings)
    return path
