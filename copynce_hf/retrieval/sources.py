"""Image sources for retrieval: a folder of image files, or a dataset (``datasets``) with an image column.

A source is an indexable collection with stable string ids: ``source.ids[i]`` and
``source.load(i)`` (an RGB PIL image read through :func:`copynce_hf.images.load_image`,
raising :class:`ImageLoadError` for a bad file). Folder ids are the file names without
extension (DISC21 style: ``Q00001.jpg`` has id ``Q00001``); dataset ids come from an id column, else
the row number. A streamed dataset (:class:`StreamedImageSource`) has no random access: it is read
once, in chunks (:meth:`StreamedImageSource.chunks`). :func:`open_dataset_source` opens any dataset
the training loader opens (Hub id, Parquet file, ``save_to_disk`` folder, image folder). :class:`ImageInput`
holds how a command reads its images (``--recursive``, ``--max-pixels``, the dataset options) and opens them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from itertools import islice
from pathlib import Path

from PIL import Image

from ..images import load_image
from ..modeling.errors import SKIP_REASONS, ConfigError, ImageLoadError

logger = logging.getLogger(__name__)

#: File extensions treated as images when listing a folder (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def list_image_files(folder: str | os.PathLike, recursive: bool = False) -> list[Path]:
    """Image files of ``folder`` (with ``recursive``, of its sub-folders too), sorted by path.

    Hidden files and folders (names starting with ``.``) are left out. Raises
    :class:`ImageLoadError` when the folder does not exist, is not a folder, holds no image file,
    or holds two images whose ids (:func:`image_id`) collide, e.g. ``a.jpg`` and ``a.png``.
    """
    folder = Path(folder)
    if not folder.exists():
        raise ImageLoadError(f"image folder {os.fspath(folder)!r} does not exist")
    if not folder.is_dir():
        raise ImageLoadError(f"{os.fspath(folder)!r} is not a folder")
    candidates = folder.rglob("*") if recursive else folder.iterdir()
    files = sorted(
        p for p in candidates
        if p.suffix.lower() in IMAGE_EXTENSIONS and not _hidden(p.relative_to(folder)) and p.is_file()
    )
    if not files:
        subfolders = [] if recursive else subfolders_of(folder)
        hint = f"; it has {len(subfolders)} sub-folder(s): pass --recursive to read them" if subfolders else ""
        raise ImageLoadError(
            f"image folder {os.fspath(folder)!r} holds no image file ({', '.join(IMAGE_EXTENSIONS)}){hint}"
        )
    ids: dict[str, Path] = {}
    for path in files:
        key = image_id(path, folder)
        if key in ids:
            raise ImageLoadError(
                f"image folder {os.fspath(folder)!r} holds {ids[key].relative_to(folder)} and "
                f"{path.relative_to(folder)}: both would have the id {key!r}; rename or remove one"
            )
        ids[key] = path
    return files


def subfolders_of(folder: str | os.PathLike) -> list[Path]:
    """The visible sub-folders directly inside ``folder`` (read only with ``recursive``)."""
    return sorted(p for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith("."))


def image_id(path: Path, folder: Path) -> str:
    """The id of an image file: its path relative to ``folder`` without extension, ``/``-separated
    (``Q00001.jpg`` -> ``Q00001``; ``cats/tom.png`` -> ``cats/tom``)."""
    return path.relative_to(folder).with_suffix("").as_posix()


class ImageFolderSource:
    """The images of a folder (see :func:`list_image_files`); ids from :func:`image_id`.

    Args:
        folder: the image folder.
        recursive: also read the images of its sub-folders (ids keep the relative path).
        max_pixels: size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
    """

    def __init__(self, folder: str | os.PathLike, recursive: bool = False, max_pixels: int | None = None):
        self.folder = Path(folder)
        self.recursive = recursive
        self.max_pixels = max_pixels
        self.files = list_image_files(folder, recursive=recursive)
        self.ids = [image_id(path, self.folder) for path in self.files]
        #: visible sub-folders that were not read (``recursive=False``)
        self.ignored_subfolders = [] if recursive else subfolders_of(self.folder)

    def __len__(self) -> int:
        return len(self.files)

    def load(self, index: int) -> Image.Image:
        return load_image(self.files[index], max_pixels=self.max_pixels)

    def lookup(self) -> dict[str, Path]:
        """Map from id to file path."""
        return dict(zip(self.ids, self.files))

    @property
    def identity(self) -> dict:
        """Where a cache of this source's descriptors comes from: the folder (its files' ids, sizes and modification
        times are digested beside it, :func:`~copynce_hf.retrieval.work_folder.source_identity`)."""
        return {"folder": str(self.folder.resolve())}


def _undecoded_image(value, where: str):
    """The bytes or path of an undecoded ``datasets.Image`` value (``{"bytes": ..., "path": ...}``), a path or
    bytes; :class:`ImageLoadError` naming ``where`` when the row has no image."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if value is None:
        raise ImageLoadError(f"{where} has no image")
    return value


class DatasetImageSource:
    """The images of a ``datasets.Dataset`` (random access).

    Its columns are read by :func:`copynce_hf.data.loading.standardise_image_columns`, as training reads them.

    Args:
        dataset: a ``datasets.Dataset``.
        image_column: column holding the images (an ``Image`` feature, a path or bytes); ``None``: the first
            ``datasets.Image`` column, else a usual name (``image``, ``img``, ...).
        id_column: column holding the ids; ``None``: a usual id column (``image_id``, ``id``, ...), else the
            row number.
        max_pixels: size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
        name: how messages name the dataset (its Hub id or path).
    """

    def __init__(self, dataset, image_column: str | None = None, id_column: str | None = None,
                 max_pixels: int | None = None, name: str = "dataset"):
        from ..data.loading import standardise_image_columns

        self.name, self.max_pixels = name, max_pixels
        self.dataset = standardise_image_columns(dataset, image_column, id_column, name)
        self.ids = list(self.dataset["image_id"])
        if len(set(self.ids)) != len(self.ids):
            seen: set[str] = set()
            duplicate = next(i for i in self.ids if i in seen or seen.add(i))
            raise ImageLoadError(f"dataset {name!r}: the id {duplicate!r} appears twice"
                                 + (f" in column {id_column!r}" if id_column else ""))
        #: what a cache of this source's descriptors is tied to (``datasets``' fingerprint of its rows)
        self.identity = {"dataset": name, "fingerprint": getattr(self.dataset, "_fingerprint", None)}

    def __len__(self) -> int:
        return len(self.ids)

    def undecoded(self, index: int):
        """The bytes or path of image ``index``."""
        where = f"dataset {self.name!r} row {index} ({self.ids[index]!r})"
        try:
            value = self.dataset[int(index)]["image"]
        except Exception as error:  # a broken row is a bad image, not a crash
            raise ImageLoadError(f"{where} cannot be read: {error}") from error
        return _undecoded_image(value, where)

    def load(self, index: int) -> Image.Image:
        return load_image(self.undecoded(index), max_pixels=self.max_pixels)

    def lookup(self) -> Mapping[str, object]:
        """Map from id to the image's bytes or path (read on access), like :meth:`ImageFolderSource.lookup`."""
        return _UndecodedById(self)


class _UndecodedById(Mapping):
    """id -> bytes or path of a :class:`DatasetImageSource`'s image, read when asked for."""

    def __init__(self, source: DatasetImageSource):
        self.source = source
        self.position = {image_id: i for i, image_id in enumerate(source.ids)}

    def __getitem__(self, image_id: str):
        return self.source.undecoded(self.position[image_id])

    @property
    def identity(self):
        """The source's own identity, where it has one (what a cache of its images is tied to besides their files)."""
        return getattr(self.source, "identity", None)

    def __contains__(self, image_id) -> bool:
        return image_id in self.position  # without reading the row (Mapping's own reads it)

    def __iter__(self) -> Iterator[str]:
        return iter(self.source.ids)

    def __len__(self) -> int:
        return len(self.source.ids)


class StreamedImageSource:
    """The images of a ``datasets.IterableDataset`` with the columns ``image_id`` and ``image`` (undecoded), as
    :func:`copynce_hf.data.load_image_dataset` streams them: read once, in order, a chunk at a time.

    Args:
        dataset: the stream.
        name: how messages name the dataset.
        max_pixels: size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
        identity: what a cache of this source's descriptors is tied to.
    """

    def __init__(self, dataset, name: str, max_pixels: int | None = None, identity: dict | None = None):
        self.dataset, self.name, self.max_pixels = dataset, name, max_pixels
        self.identity = identity or {"dataset": name}

    def chunks(self, size: int, start: int = 0) -> Iterator[ImageListSource]:
        """Consecutive chunks of ``size`` rows (the last one shorter) as :class:`ImageListSource`, from chunk
        ``start`` on (the rows of the chunks before it are read and passed over, not decoded)."""
        rows = iter(self.dataset.skip(start * size) if start else self.dataset)
        number = start
        while True:
            batch = list(islice(rows, size))
            if not batch:
                return
            ids = [str(row["image_id"]) for row in batch]
            first = number * size
            images = [partial(_load_undecoded, row["image"], f"dataset {self.name!r} row {first + i} ({ids[i]!r})",
                              self.max_pixels) for i, row in enumerate(batch)]
            yield ImageListSource(ids, images)
            number += 1


def _load_undecoded(value, where: str, max_pixels: int | None) -> Image.Image:
    return load_image(_undecoded_image(value, where), max_pixels=max_pixels)


def local_files_stamp(path: str | os.PathLike) -> str | None:
    """A hash of the names, sizes and modification times of a local file or of every file under a local folder
    (what stands for their content in a cache's identity); ``None`` for what is not local (a Hub id)."""
    local = Path(path).expanduser()
    if not local.exists():
        return None
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.relative_to(local).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def open_dataset_source(name: str, split: str = "train", image_column: str | None = None,
                        id_column: str | None = None, streaming: bool = False, max_pixels: int | None = None):
    """The images of a dataset as a source: a Hub dataset id, a local Parquet file, a ``save_to_disk`` folder, a
    folder of Parquet shards or an image folder, opened by :func:`copynce_hf.data.load_image_dataset` (the
    loader of training).

    Returns a :class:`DatasetImageSource`, or with ``streaming`` a :class:`StreamedImageSource` (a Hub dataset
    is then read as it goes, nothing downloaded ahead). Raises :class:`ConfigError` naming the dataset and the
    missing split or column.
    """
    from ..data.loading import load_image_dataset

    dataset = load_image_dataset(name, split=split, streaming=streaming, image_column=image_column,
                                 id_column=id_column)
    local = Path(name).expanduser()
    identity = {"dataset": str(local.resolve()) if local.exists() else name, "split": split,
                "image_column": image_column, "id_column": id_column, "files": local_files_stamp(name)}
    if streaming:
        return StreamedImageSource(dataset, name, max_pixels=max_pixels, identity=identity)
    source = DatasetImageSource(dataset, "image", "image_id", max_pixels=max_pixels, name=name)
    source.identity = {**identity, "fingerprint": source.identity["fingerprint"]}
    return source


class ImageListSource:
    """Images given one by one: ids with PIL images, file paths, or callables returning a PIL image.

    The source of in-memory tasks (the demo's edited queries, mini-DISC's replayed queries).

    Args:
        ids: N image ids.
        images: N items, each a PIL image, a path (read with :func:`copynce_hf.images.load_image`) or a
            zero-argument callable returning an RGB PIL image (or raising :class:`ImageLoadError`).
    """

    def __init__(self, ids, images):
        ids, images = list(ids), list(images)
        if len(ids) != len(images):
            raise ImageLoadError(f"{len(ids)} ids for {len(images)} images")
        self.ids = [str(i) for i in ids]
        self.images = images

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, index: int) -> Image.Image:
        image = self.images[index]
        if callable(image) and not isinstance(image, Image.Image):
            image = image()
        return image.convert("RGB") if isinstance(image, Image.Image) else load_image(image)


@dataclasses.dataclass
class ImageInput:
    """How a run reads its images: the image options every command shares.

    Attributes:
        recursive: also read the images of sub-folders (ids keep the relative path).
        max_pixels: size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
        split, image_column, id_column, streaming: how a dataset is read (:func:`open_dataset_source`).
        progress: ``datasets``' progress bars while a dataset loads.
    """

    recursive: bool = False
    max_pixels: int | None = None
    split: str = "train"
    image_column: str | None = None
    id_column: str | None = None
    streaming: bool = False
    progress: bool = True

    def folder(self, folder: str | os.PathLike) -> ImageFolderSource:
        """The images of ``folder``; a warning names the sub-folders left out without ``recursive``."""
        source = ImageFolderSource(folder, recursive=self.recursive, max_pixels=self.max_pixels)
        ignored = source.ignored_subfolders
        if ignored:
            names = ", ".join(p.name for p in ignored[:3])
            logger.warning("%s: %d sub-folder(s) not read (%s%s); pass --recursive to include them", folder,
                           len(ignored), names, ", ..." if len(ignored) > 3 else "")
        return source

    def whitening_sample(self, folder: str | os.PathLike | None, dim: int | None) -> ImageFolderSource | None:
        """The sample images a whitening is learned from (``--whiten-from``; ``None`` without them); a number of
        whitened dimensions without a sample is a :class:`ConfigError`."""
        if folder is None and dim is not None:
            raise ConfigError("--whiten-dim needs --whiten-from FOLDER (the sample images the whitening is learned "
                              "from)")
        return self.folder(folder) if folder is not None else None

    def folder_or_dataset(self, folder: str | os.PathLike | None, dataset: str | None, dataset_option: str):
        """The images of ``folder`` (:meth:`folder`) or of ``dataset`` (:func:`open_dataset_source`); exactly one
        is given (else a :class:`ConfigError` naming ``dataset_option``, the option that names a dataset)."""
        if (folder is None) == (dataset is None):
            raise ConfigError(f"give either a folder of images or {dataset_option} NAME_OR_PATH"
                              + (", not both" if folder is not None else ""))
        if dataset is None:
            return self.folder(folder)
        if not self.progress:
            import datasets

            datasets.disable_progress_bars()
        return open_dataset_source(dataset, self.split, self.image_column, self.id_column, self.streaming,
                                   self.max_pixels)


def count_text(reasons: Iterable[str]) -> str:
    """How many images were skipped and why: ``["too small", "empty file", "too small"]`` ->
    ``"3 (1 empty file, 2 too small)"`` (reasons in the order of :data:`~copynce_hf.modeling.errors.SKIP_REASONS`)."""
    counts = Counter(reasons)
    if not counts:
        return "0"
    order = {reason: i for i, reason in enumerate(SKIP_REASONS)}
    parts = [f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda item: order.get(item[0], 99))]
    return f"{sum(counts.values())} ({', '.join(parts)})"


class SourceImages:
    """id -> image mapping over an image source (file paths when the source has them, else loaded images), with the
    source's image size limit (``max_pixels``)."""

    def __init__(self, source):
        self.source = source
        self.max_pixels = getattr(source, "max_pixels", None)
        self.position = {image_id: i for i, image_id in enumerate(source.ids)}
        self.files = source.lookup() if hasattr(source, "lookup") else None

    @property
    def identity(self):
        """The source's own identity, where it has one (what a cache of its images is tied to besides their files)."""
        return getattr(self.source, "identity", None)

    def __contains__(self, image_id) -> bool:
        return image_id in self.position

    def __getitem__(self, image_id):
        if self.files is not None:
            return self.files[image_id]
        return self.source.load(self.position[image_id])
