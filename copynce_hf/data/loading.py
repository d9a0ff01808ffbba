"""Image datasets for training and evaluation, loaded with Hugging Face ``datasets``.

Every loader returns a ``datasets.Dataset`` (random access, used for GHNM and exact resume) or a
``datasets.IterableDataset`` (streaming) with two columns:

- ``image_id`` (string): the DISC21 id (``T000123``), the path relative to an image folder without its
  extension, or the Hub dataset's id column (the row number when it has none);
- ``image``: a ``datasets.Image(decode=False)`` value, i.e. ``{"bytes": ..., "path": ...}``.

Images are never decoded by ``datasets``: :class:`ImageDecoder` decodes them with
:func:`copynce_hf.images.load_image` so that a corrupt file is skipped, logged and counted instead of
stopping the run.

Sources understood by :func:`load_image_dataset`:

- ``None``: the embedded default, the public-domain images bundled in ``copynce_hf/assets/images``;
- a DISC21 folder (``training_images/T*.jpg``, ``reference_images/R*.jpg``, ``query_images/Q*.jpg``),
  split ``train``, ``reference`` or ``query``;
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``;
- a local Parquet file, or a folder of data files as datasets reads a dataset repository: Parquet
  shards, or a Hub dataset snapshot (what ``huggingface_hub.snapshot_download`` leaves: a ``README.md``
  whose YAML names the configurations and splits, ``data/train-00000-of-00004.parquet``, ...), read with
  ``datasets.load_dataset(folder, name=config_name, split=...)``;
- any other local folder of images (searched recursively); one with split sub-folders (``train/``,
  ``test/``, ...) gives the images of the requested split only, as ``datasets``' imagefolder does;
- a Hub dataset id with an image column (``datasets.load_dataset(id, name=config_name, split=...,
  revision=..., token=..., streaming=...)``).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import datasets
from PIL import Image

from ..images import load_image
from ..modeling.errors import ConfigError, ImageLoadError

logger = logging.getLogger(__name__)

__all__ = [
    "ASSET_IMAGES",
    "DISC21_SPLITS",
    "IMAGE_EXTENSIONS",
    "ImageDecoder",
    "default_image_folder",
    "is_disc21_folder",
    "load_disc21_ground_truth",
    "load_image_dataset",
    "standardise_image_columns",
]

#: Folder of the embedded default images (see ``copynce_hf/assets/README.md``).
ASSET_IMAGES = Path(__file__).resolve().parents[1] / "assets" / "images"

#: DISC21 split name -> (sub-folder, file-name prefix).
DISC21_SPLITS = {
    "train": ("training_images", "T"),
    "reference": ("reference_images", "R"),
    "query": ("query_images", "Q"),
}

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")

#: Column names recognised as the image column / id column of a Hub dataset, in order of preference.
_IMAGE_COLUMNS = ("image", "img", "picture", "photo", "jpg", "png")
_ID_COLUMNS = ("image_id", "id", "idx", "filename", "file_name")

_RAW_IMAGE = datasets.Image(decode=False)


def default_image_folder() -> Path:
    """The folder of the bundled default training images."""
    return ASSET_IMAGES


def is_disc21_folder(path: str | os.PathLike) -> bool:
    """True when ``path`` has at least one of the DISC21 image sub-folders."""
    root = Path(path)
    return root.is_dir() and any((root / folder).is_dir() for folder, _ in DISC21_SPLITS.values())


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


#: Data files that make a folder a dataset repository for ``datasets.load_dataset(folder)``.
_DATA_FILE_SUFFIXES = (".parquet", ".arrow")


def _is_dataset_repository(path: Path) -> bool:
    """A folder of Parquet / Arrow data files (e.g. a Hub dataset snapshot), as opposed to image files."""
    return any(p.is_file() and p.suffix.lower() in _DATA_FILE_SUFFIXES for p in path.rglob("*"))


def _load_repository(source: str, split: str, streaming: bool, config_name: str | None, **hub_options):
    """``datasets.load_dataset`` on a Hub id, a local dataset repository folder or a Parquet file."""
    kind = "dataset"
    arguments = {"path": source, "name": config_name}
    if source.lower().endswith(".parquet"):
        arguments = {"path": "parquet", "data_files": {"train": source}}
        kind, split = "Parquet file", "train"
    try:
        return datasets.load_dataset(**arguments, split=split, streaming=streaming,
                                     **{key: value for key, value in hub_options.items() if value is not None})
    except Exception as error:  # offline, unknown id, missing split or config: report the source and the cause
        config = f", config {config_name!r}" if config_name else ""
        raise ConfigError(f"cannot load {kind} {source!r} (split {split!r}{config}): {error}") from error


def _list_images(folder: Path, pattern: str = "*") -> list[Path]:
    return sorted(
        p for p in folder.rglob(pattern) if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
    )


def _from_files(files: list[Path], ids: list[str]) -> datasets.Dataset:
    """A Dataset of (image_id, undecoded image path); the files are read later, lazily."""
    table = datasets.Dataset.from_dict(
        {"image_id": ids, "image": [str(path) for path in files]},
        features=datasets.Features({"image_id": datasets.Value("string"), "image": _RAW_IMAGE}),
    )
    return table


def _disc21_split(root: Path, split: str) -> datasets.Dataset:
    if split not in DISC21_SPLITS:
        raise ConfigError(f"dataset_split {split!r} is not a DISC21 split; use one of {sorted(DISC21_SPLITS)}")
    folder, prefix = DISC21_SPLITS[split]
    files = [p for p in _list_images(root / folder) if p.name.startswith(prefix)] if (root / folder).is_dir() else []
    if not files:
        raise ConfigError(f"DISC21 folder {str(root)!r} has no {prefix}*.jpg images in {folder}/ for split {split!r}")
    return _from_files(files, [p.stem for p in files])


def _folder_splits(root: Path, files: list[Path]) -> dict[str, list[Path]] | None:
    """The images of each split of a folder with split sub-folders (``train/``, ``test/``, ``validation/``
    and the other names ``datasets``' imagefolder recognises, found by its own patterns), or None for a
    folder without them."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    patterns = get_data_patterns(str(root))
    if list(patterns) == ["train"] and patterns["train"] == ["**"]:  # datasets' answer for "no split folders"
        return None
    if not all(pattern.endswith("/**") for found in patterns.values() for pattern in found):
        # datasets also splits by file names ("bullet_train.JPEG" would be the train split of a flat
        # folder, its other images dropped): only sub-folders name splits here.
        return None
    images = {os.path.abspath(path): path for path in files}
    splits = DataFilesDict.from_patterns(patterns, base_path=str(root))
    return {str(split): [images[name] for name in map(os.path.abspath, found) if name in images]
            for split, found in splits.items()}


def _image_folder(root: Path, split: str) -> datasets.Dataset:
    files = _list_images(root)
    if not files:
        raise ConfigError(f"dataset folder {str(root)!r} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    splits = _folder_splits(root, files)
    if splits is not None:
        if not splits.get(split):
            raise ConfigError(f"dataset_split {split!r} is not a split folder of {str(root)!r} with images "
                              f"(its splits: {sorted(name for name, found in splits.items() if found)})")
        files = splits[split]
    ids = [str(p.relative_to(root).with_suffix("")).replace(os.sep, "/") for p in files]
    return _from_files(files, ids)


def standardise_image_columns(
    dataset: datasets.Dataset | datasets.IterableDataset,
    image_column: str | None,
    id_column: str | None,
    name: str,
) -> datasets.Dataset | datasets.IterableDataset:
    """Rename a Hub/saved dataset's columns to ``image_id`` + undecoded ``image`` (the one place that reads a
    dataset's columns: training and :class:`copynce_hf.retrieval.DatasetImageSource` both go through it).

    ``image_column`` / ``id_column`` ``None``: the first ``datasets.Image`` column (else a usual name such as
    ``image``) and the first usual id column (``image_id``, ``id``, ...), else the row number as a string.
    Raises :class:`ConfigError` naming ``name`` and its columns when a named column does not exist."""
    features = dataset.features
    if features is None:  # some streamed datasets only know their features after a first read
        dataset = dataset._resolve_features()
        features = dataset.features
    columns = list(features)
    if image_column is None:
        typed = [c for c in columns if isinstance(features[c], datasets.Image)]
        named = [c for c in _IMAGE_COLUMNS if c in columns]
        image_column = (typed or named or [None])[0]
    if image_column is None or image_column not in columns:
        raise ConfigError(
            f"dataset {name!r} has no image column (columns: {columns}); pass image_column=<name>"
        )
    if id_column is None:
        id_column = next((c for c in _ID_COLUMNS if c in columns and c != image_column), None)
    elif id_column not in columns:
        raise ConfigError(f"id_column {id_column!r} is not a column of dataset {name!r} (columns: {columns})")
    if isinstance(features[image_column], datasets.Image):
        dataset = dataset.cast_column(image_column, _RAW_IMAGE)
    if id_column is None:
        dataset = dataset.map(lambda _, index: {"image_id": str(index)}, with_indices=True)
    elif id_column != "image_id":
        dataset = dataset.map(lambda row: {"image_id": str(row[id_column])})
    elif not isinstance(features[id_column], datasets.Value) or features[id_column].dtype != "string":
        dataset = dataset.map(lambda row: {"image_id": str(row["image_id"])})
    if image_column != "image":
        dataset = dataset.rename_column(image_column, "image")
    keep = ["image_id", "image"]
    return dataset.remove_columns([c for c in dataset.column_names or [] if c not in keep])


def load_image_dataset(
    source: str | os.PathLike | None = None,
    split: str = "train",
    streaming: bool = False,
    image_column: str | None = None,
    id_column: str | None = None,
    num_shards: int = 8,
    config_name: str | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """Load images as a dataset with columns ``image_id`` (str) and ``image`` (undecoded).

    Args:
        source: ``None`` for the bundled default images, a local folder (DISC21 layout, ``save_to_disk``
            output, Parquet shards or Hub dataset snapshot, plain image folder), a Parquet file or a Hub
            dataset id.
        split: DISC21 split (``train``, ``reference``, ``query``), the Hub/saved dataset's split, or the
            split sub-folder of an image folder that has them (``train/``, ``test/``, ... as ``datasets``'
            imagefolder splits it). Ignored for image folders without split sub-folders and single
            Parquet files.
        streaming: return a ``datasets.IterableDataset``. Hub ids are then read with
            ``load_dataset(..., streaming=True)`` (nothing is downloaded ahead); local sources are wrapped
            with ``to_iterable_dataset(num_shards)`` (their images are read lazily either way).
        image_column, id_column: column names of a Hub or saved dataset (detected when ``None``).
        num_shards: shards of a local source turned into a stream (enables DataLoader workers).
        config_name: configuration of a Hub dataset or snapshot (``load_dataset(name=...)``).
        revision, token: Hub revision (branch, tag or commit) and access token of a Hub id (``None``:
            the main branch, and the token of ``huggingface-cli login`` / ``HF_TOKEN``).

    Raises:
        ConfigError: the folder holds no images, the split is unknown or there is no image column.
    """
    if source is None or str(source) == "":
        return _stream_if(_image_folder(ASSET_IMAGES, split), streaming, num_shards)
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_folder(path, split, streaming, image_column, id_column, num_shards, config_name)
    if path.is_file() and path.suffix.lower() == ".parquet":
        return standardise_image_columns(_load_repository(str(path), split, streaming, None), image_column,
                                         id_column, str(path))
    if path.exists() or str(source).startswith((".", "/", "~")):
        raise ConfigError(f"dataset {str(source)!r} is neither a folder nor a Parquet file")
    # A Hub dataset id. Streaming by default for training: nothing is downloaded ahead.
    loaded = _load_repository(str(source), split, streaming, config_name, revision=revision, token=token)
    return standardise_image_columns(loaded, image_column, id_column, str(source))


def _load_folder(
    path: Path, split: str, streaming: bool, image_column: str | None, id_column: str | None, num_shards: int,
    config_name: str | None,
) -> datasets.Dataset | datasets.IterableDataset:
    """One split of a local folder: a DISC21 layout, a ``save_to_disk`` output, Parquet shards or a Hub dataset
    snapshot (read by ``load_dataset``, streamed there when ``streaming``), or a plain image folder."""
    if is_disc21_folder(path):
        dataset = _disc21_split(path, split)
    elif _is_saved_dataset(path):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ConfigError(f"dataset_split {split!r} not in {str(path)!r} (splits: {list(loaded)})")
            loaded = loaded[split]
        dataset = standardise_image_columns(loaded, image_column, id_column, str(path))
    elif _is_dataset_repository(path):
        loaded = _load_repository(str(path), split, streaming, config_name)
        return standardise_image_columns(loaded, image_column, id_column, str(path))
    else:
        dataset = _image_folder(path, split)
    return _stream_if(dataset, streaming, num_shards)


def _stream_if(dataset: datasets.Dataset, streaming: bool, num_shards: int) -> datasets.Dataset | datasets.IterableDataset:
    """``dataset`` itself, or when ``streaming`` a stream of at most ``num_shards`` shards (one per row at most)."""
    if streaming:
        return dataset.to_iterable_dataset(num_shards=max(1, min(num_shards, len(dataset))))
    return dataset


def load_disc21_ground_truth(path: str | os.PathLike) -> dict[str, list[str]]:
    """Read a DISC21 ground-truth CSV (``query_id,reference_id``) into ``{query_id: [reference_id, ...]}``.

    Distractor queries (empty ``reference_id``) map to an empty list, as in the public ground truth file.
    """
    path = Path(path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"query_id", "reference_id"} - set(reader.fieldnames or [])
        if missing:
            raise ConfigError(
                f"ground truth {str(path)!r} lacks column(s) {sorted(missing)} (found {reader.fieldnames})"
            )
        truth: dict[str, list[str]] = {}
        for row in reader:
            references = truth.setdefault(row["query_id"].strip(), [])
            reference = (row["reference_id"] or "").strip()
            if reference:
                references.append(reference)
    return truth


class ImageDecoder:
    """Decode undecoded ``datasets.Image`` values with :func:`load_image`; skip, log and count failures.

    ``max_side``: JPEGs whose longer side exceeds it are decoded in Pillow's draft mode at the
    smallest DCT scale that keeps the longer side at or above it (the copy-pair datasets pass
    their maker's ``max_source_side``, to which the originals are shrunk anyway).

    ``skipped`` counts the failed decodes seen by this object (in this process); data-loader workers
    report theirs through the batches (see ``PixTraceCollator``). Each failing file is logged once per
    process at WARNING level, with the reason. ``max_pixels`` is the size limit of :func:`load_image`
    (``None``: its default).
    """

    def __init__(self, min_side: int = 16, max_pixels: int | None = None, max_side: int | None = None):
        self.min_side = min_side
        self.max_pixels = max_pixels
        self.max_side = max_side  # JPEGs larger than this are decoded at a reduced scale (load_image)
        self.skipped = 0
        self._logged: set[str] = set()

    def __call__(self, value: dict | str | bytes | Image.Image, image_id: str = "?") -> Image.Image | None:
        """Return the RGB image, or ``None`` (counted and logged) when it cannot be used."""
        try:
            if isinstance(value, dict):
                source = value.get("bytes") or value.get("path")
                if source is None:
                    raise ImageLoadError(f"image {image_id!r} has neither bytes nor a path")
            else:
                source = value
            return load_image(source, min_side=self.min_side, max_pixels=self.max_pixels, max_side=self.max_side)
        except ImageLoadError as error:
            self.skipped += 1
            if image_id not in self._logged:
                self._logged.add(image_id)
                logger.warning("skipping image %s: %s", image_id, error)
            return None

    def decode_all(self, rows: Iterable[dict]) -> list[tuple[str, Image.Image]]:
        """Decode every row of a dataset, dropping (and counting) the unusable ones."""
        out = []
        for row in rows:
            image = self(row["image"], row["image_id"])
            if image is not None:
                out.append((row["image_id"], image))
        return out
