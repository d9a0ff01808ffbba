"""What a saved result was computed from, and the work folder of a resumable job.

A result kept on disk for a later run (a chunk of scores, an index, descriptors) is reused only when it was
computed from the same inputs: its *identity*, input name -> digest (or any JSON-able value), is stored beside it
and compared with the current one. This module holds that vocabulary:

- :func:`digest`, :func:`lines_digest`, :func:`model_fingerprint`, :func:`file_stamp`, :func:`image_stamps`: the
  digests an identity is made of (a value, many lines, a model's weights, image files' sizes and times);
- :func:`views_identity` (with :func:`source_identity`): the one identity of descriptors kept on disk, whichever
  command keeps them (``copynce index``'s chunks; the indexes, query views and whitening samples ``detect`` and
  ``dedup`` cache);
- :func:`holds_identity`: whether an identity file holds the current identity; when it does not, a warning names
  the inputs that changed (:func:`changed_inputs`). Both resumable jobs use it through :class:`WorkFolder`, and the
  cached indexes and query views of ``copynce detect`` (:mod:`~copynce_hf.retrieval.detection`) directly.

Two jobs keep a work folder: matcher re-scoring (:mod:`.chunked_scoring`: ``identity.json`` and
``chunk-NNNNNN.json``) and descriptor extraction (:mod:`.chunked_extraction`, ``copynce index``: ``work.json`` and
``chunk-NNNNNN.safetensors``). A :class:`WorkFolder` owns what they share:

- the identity file;
- :meth:`WorkFolder.open`: before a run, the temporary files a killed run left (``.<name>.partial-<pid>...``,
  :class:`~copynce_hf.outputs.StagedFile`) are removed; chunks of another identity are deleted, with the warning
  of :func:`holds_identity`, and the new identity is written;
- chunk ``i``'s file name and its atomic writing (a file that exists is complete).

Each job keeps its own chunk format and decides which of the chunks present it can reuse.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from ..modeling.errors import PredictionsError
from ..outputs import StagedFile

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- digests of the inputs


def digest(value) -> str:
    """A short digest of a JSON-able value (dict keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def lines_digest(lines: Iterable[str]) -> str:
    """A short digest of many lines of text (millions of pairs), hashed in blocks without one big string."""
    hasher, lines = hashlib.blake2b(digest_size=16), iter(lines)
    while block := list(itertools.islice(lines, 65536)):
        hasher.update(("\n".join(block) + "\n").encode("utf-8"))
    return hasher.hexdigest()


def model_fingerprint(model) -> str:
    """A digest of a model's class, config and every tensor of its state dict (names, dtypes, shapes, bytes):
    equal for the same weights wherever they were loaded from, different after any change."""
    hasher = hashlib.blake2b(digest_size=16)
    config = getattr(model, "config", None)
    hasher.update(type(model).__name__.encode())
    if config is not None and hasattr(config, "to_json_string"):
        hasher.update(config.to_json_string(use_diff=False).encode())
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().to("cpu").contiguous()
        hasher.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        if tensor.numel():
            hasher.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))  # 0-d tensors too
    return hasher.hexdigest()


def file_stamp(path: str | os.PathLike) -> list[int] | None:
    """``[size, modification time in ns]`` of the file ``path``, so that a replaced file changes it; ``None`` when
    it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def image_stamps(images: Mapping, ids) -> str:
    """A digest of the images ``ids`` name in ``images`` (id -> path or in-memory image): each file's name and
    :func:`file_stamp`; an in-memory image counts by its id only."""
    def stamp(image_id: str) -> str:
        image = images[image_id] if image_id in images else None
        if not isinstance(image, (str, os.PathLike)):
            return json.dumps([image_id, None if image is None else "in memory"])
        return json.dumps([image_id, os.fspath(image), *(file_stamp(image) or [None])])

    return lines_digest(stamp(image_id) for image_id in sorted(set(ids)))


def source_identity(source) -> dict:
    """What the images of a source are, for a cache of their descriptors (digests, so that it stays a few hundred
    bytes for a million images):

    - ``source``: where they come from (the source's own ``identity``: a folder, a dataset and its fingerprint);
    - ``num_images``, ``images``: how many, and a digest of their ids in order;
    - ``files``: a digest of their files' :func:`file_stamp` in order, so that a replaced file changes it;
    - ``max_pixels``: the size limit that decides which images are skipped.

    A value the source cannot tell is ``None`` (a stream knows no ids before it is read; a dataset or in-memory
    images have no files).
    """
    ids = getattr(source, "ids", None)
    files = getattr(source, "files", None) or getattr(source, "images", None)
    on_disk = files is not None and all(isinstance(file, (str, os.PathLike)) for file in files)
    return {"source": getattr(source, "identity", None),
            "num_images": None if ids is None else len(ids),
            "images": None if ids is None else lines_digest(json.dumps(image_id) for image_id in ids),
            "files": lines_digest(json.dumps(file_stamp(file)) for file in files) if on_disk else None,
            "max_pixels": getattr(source, "max_pixels", None)}


def views_identity(model, processor, source, views: str, role: str) -> dict:
    """The one identity of descriptors computed from a source's images and kept on disk: ``copynce index``'s
    chunks, and the indexes, query views and whitening samples that ``detect`` and ``dedup`` cache. The model's
    weights (:func:`model_fingerprint`) and image processor settings (:func:`digest`), the views (a
    :class:`~copynce_hf.retrieval.descriptors.views.ViewPreset` name), the role (``reference``, ``query``, ...) and
    :func:`source_identity`."""
    return {"model": model_fingerprint(model), "image_processor": digest(processor.to_dict()), "views": views,
            "role": role, **source_identity(source)}


# --------------------------------------------------------------------------- stored identity vs current identity


def changed_inputs(stored, identity: dict) -> list[str]:
    """The input names whose values differ between the ``stored`` identity (read from a folder; anything that is
    not a dict counts as empty) and ``identity``, sorted."""
    stored = stored if isinstance(stored, dict) else {}
    return sorted(key for key in {*stored, *identity} if stored.get(key) != identity.get(key))


def as_stored(identity: dict) -> dict:
    """``identity`` as it reads back from its JSON file (a tuple becomes a list, other values their text)."""
    return json.loads(json.dumps(identity, default=str))


def holds_identity(identity_path: Path, identity: dict, saved: str | None = None,
                   then: str = "starting fresh") -> bool:
    """Whether the identity file ``identity_path`` holds ``identity`` (compared as JSON, :func:`as_stored`).

    When it does not and ``saved`` names results kept for the stored identity (``"the 3 chunk(s) in work/"``),
    a warning says they were computed from other inputs, names the inputs that changed (or says the identity
    file is missing or unreadable) and ends with ``then``, what happens instead.
    """
    stored = None
    with contextlib.suppress(OSError, ValueError):
        stored = json.loads(Path(identity_path).read_text(encoding="utf-8"))
    identity = as_stored(identity)
    if stored == identity:
        return True
    if saved is not None:
        changed = ", ".join(changed_inputs(stored, identity)) if isinstance(stored, dict) else (
            f"unknown, {Path(identity_path).name} is missing or unreadable")
        logger.warning("%s were computed from other inputs (changed: %s); %s", saved, changed, then)
    return False


# --------------------------------------------------------------------------- cache folders

#: The file of a cache folder (an index, query views, a whitening sample) holding what its files were computed from.
CACHE_IDENTITY_FILE = "identity.json"


def reuse_saved(folder: str | os.PathLike | None, identity: dict, load: Callable[[], object], what: str):
    """What ``load`` reads from ``folder`` when the folder was written for ``identity``; ``None`` when it was
    not (a warning names the inputs that changed, :func:`holds_identity`), or when its files are
    damaged (then logged): the caller computes and rewrites them."""
    if folder is None:
        return None
    folder = Path(folder)
    saved = f"the files of {what} in {folder}" if folder.is_dir() and any(folder.iterdir()) else None
    if not holds_identity(folder / CACHE_IDENTITY_FILE, identity, saved, then="computing them again"):
        return None
    try:
        loaded = load()
    except PredictionsError as error:
        logger.warning("%s in %s cannot be read (%s); computing it again", what, folder, error)
        return None
    logger.info("reusing %s in %s", what, folder)
    return loaded


def is_main_process() -> bool:
    """Whether this is the process that writes (the only one, unless launched with ``accelerate launch``)."""
    from accelerate import PartialState

    return PartialState().is_main_process


@contextlib.contextmanager
def rewriting(folder: str | os.PathLike, identity: dict):
    """Around the writing of a cache folder's files: its ``identity.json`` is removed first and written
    (atomically) only once every file is, so that a run killed in between leaves a folder no run reuses."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CACHE_IDENTITY_FILE).unlink(missing_ok=True)
    yield
    with StagedFile(folder / CACHE_IDENTITY_FILE) as temporary:
        temporary.write_text(json.dumps(identity) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- the work folder of a resumable job


class WorkFolder:
    """The chunk files of one job in ``folder``, tied to ``identity`` (only the main process uses it).

    Args:
        folder: where the chunks live (created by :meth:`open`).
        identity: input name -> JSON-able value (a digest, a setting) of what the chunks are computed from;
            compared as JSON, so a tuple equals the list read back.
        identity_file: the file holding it (``identity.json``, ``work.json``).
        chunk_suffix: the chunk files' extension (``.json``, ``.safetensors``).
    """

    def __init__(self, folder: str | os.PathLike, identity: dict, identity_file: str, chunk_suffix: str):
        self.folder = Path(folder)
        self.identity = as_stored(identity)
        self.identity_path = self.folder / identity_file
        self.chunk_suffix = chunk_suffix

    def chunk_path(self, index: int) -> Path:
        """The file of chunk ``index`` (from 0): ``chunk-000000<suffix>``, ..."""
        return self.folder / f"chunk-{index:06d}{self.chunk_suffix}"

    def chunk_files(self) -> list[Path]:
        """The chunk files present, in index order."""
        return sorted(self.folder.glob(f"chunk-*{self.chunk_suffix}"))

    def open(self) -> bool:
        """Make the folder ready for this identity; ``True`` when the chunks in it were computed from it.

        The temporary files of a killed run are removed in any case. When the stored identity differs (or is
        missing), the chunks are deleted with a warning naming the changed inputs, and the identity is written;
        the identity file is removed first, so that a run killed meanwhile leaves a folder no identity reuses.
        """
        for temporary in self.folder.glob(".*.partial-*"):
            temporary.unlink(missing_ok=True)
        stale = self.chunk_files()
        if holds_identity(self.identity_path, self.identity, f"the {len(stale)} chunk(s) in {self.folder}" if stale
                          else None):
            return True
        self.folder.mkdir(parents=True, exist_ok=True)
        self.identity_path.unlink(missing_ok=True)
        for path in stale:
            path.unlink(missing_ok=True)
        with StagedFile(self.identity_path) as temporary:
            temporary.write_text(json.dumps(self.identity, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return False

    def write_chunk(self, index: int, write: Callable[[Path], object]) -> Path:
        """Chunk ``index`` written by ``write(temporary_path)`` and renamed into place; its path."""
        path = self.chunk_path(index)
        with StagedFile(path) as temporary:
            write(temporary)
        return path
