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

from ..errors import ImageLoadError
from ..images import load_image

#: File extensions treated as images when listing a folder (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def list_image_files(folder: str | os.PathLike) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name.

    Raises :class:`ImageLoadError` when the folder does not exist, is not a folder, holds
    no image file, or holds two images with the same stem (their ids would collide).
    """
    folder = Path(folder)
    if not folder.exists():
        raise ImageLoadError(f"image folder {os.fspath(folder)!r} does not exist")
    if not folder.is_dir():
        raise ImageLoadError(f"{os.fspath(folder)!r} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ImageLoadError(
            f"image folder {os.fspath(folder)!r} holds no image file ({', '.join(IMAGE_EXTENSIONS)})"
        )
    stems: dict[str, Path] = {}
    for path in files:
        if path.stem in stems:
            raise ImageLoadError(
                f"image folder {os.fspath(folder)!r} holds {stems[path.stem].name} and {path.name}: "
                f"both would have the id {path.stem!r}"
            )
        stems[path.stem] = path
    return files


class ImageFolderSource:
    """The images of a folder (see :func:`list_image_files`); ids are file stems."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.files = list_image_files(folder)
        self.ids = [path.stem for path in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def load(self, index: int) -> Image.Image:
        return load_image(self.files[index])

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
