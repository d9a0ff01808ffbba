"""Image sources for retrieval: a folder of image files, or a ``datasets.Dataset`` with an image column.

A source is an indexable collection with stable string ids: ``source.ids[i]`` and
``source.load(i)`` (an RGB PIL image read through :func:`copynce_hf.images.load_image`,
raising :class:`ImageLoadError` for a bad file). Folder ids are the file names without
extension (DISC21 style: ``Q00001.jpg`` has id ``Q00001``).
"""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from ..images import load_image
from ..modeling.errors import ImageLoadError

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


class DatasetImageSource:
    """The images of a ``datasets.Dataset``.

    Args:
        dataset: a ``datasets.Dataset``.
        image_column: column holding the images (an ``Image`` feature, a path or bytes);
            ``None`` picks the first column whose feature is ``datasets.Image``, else ``image``.
        id_column: column holding the ids; ``None`` uses the row number.
    """

    def __init__(self, dataset, image_column: str | None = None, id_column: str | None = None):
        import datasets

        self.dataset = dataset
        if image_column is None:
            image_columns = [name for name, feature in dataset.features.items() if isinstance(feature, datasets.Image)]
            image_column = image_columns[0] if image_columns else "image"
        for column in (image_column, id_column):
            if column is not None and column not in dataset.column_names:
                raise ImageLoadError(f"dataset has no column {column!r}; columns: {dataset.column_names}")
        self.image_column = image_column
        self.ids = [str(i) for i in (dataset[id_column] if id_column else range(len(dataset)))]
        if len(set(self.ids)) != len(self.ids):
            raise ImageLoadError(f"dataset column {id_column!r} holds duplicate ids")

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, index: int) -> Image.Image:
        try:
            value = self.dataset[int(index)][self.image_column]
        except Exception as error:  # a broken row is a bad image, not a crash
            raise ImageLoadError(f"dataset row {index} ({self.ids[index]!r}) cannot be decoded: {error}") from error
        if isinstance(value, dict):  # Image feature with decode=False
            value = value.get("bytes") or value.get("path")
        if value is None:
            raise ImageLoadError(f"dataset row {index} ({self.ids[index]!r}) has no image")
        return load_image(value)


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
