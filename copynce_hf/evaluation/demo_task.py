"""The demo's copy-detection task, built from the package's bundled sample images.

A DISC21-shaped task in miniature (paper, section "Experiments"): references are originals;
queries are edited copies of some references, plus distractors, edited images whose original is
*not* among the references (they must not match anything). Everything comes from
``copynce_hf/assets/images`` (12 public-domain images), so the demo needs no network and no data:

* distractor sources: :data:`DEFAULT_DISTRACTOR_SOURCES` (4 images held out of the references);
* references: the other 8 images;
* queries: ``copies_per_reference`` edited copies of every reference and ``copies_per_distractor``
  edited versions of every distractor source, made with the copy recipe preset ``CopyRecipe.demo_queries()``;
* ground truth: ``{query_id: [reference_id]}``, ``[]`` for distractors.

Query edits are the copy recipe's demo preset (``CopyRecipe.demo_queries()``), built from the
PixTrace catalogue (:mod:`copynce_hf.pixtrace.edits`), harsher than and different from the training recipe
(``CopyRecipe.training()``): heavy crops covered with text and an emoji, rotations cropped to
their content, skew, changes of aspect ratio, meme captions, screenshots, then photometric
changes. Each query is applied through the traced edits, so its :class:`CoordinateTable` to
the original is known exactly and the query/reference overlap prior of the true pair can be
drawn (:func:`true_pair_overlap`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..images import load_image
from ..modeling.errors import ConfigError
from ..pixtrace import CoordinateTable, CopyRecipe, pair_overlaps
from ..retrieval.sources import ImageListSource

__all__ = [
    "BUNDLED_IMAGES",
    "DEFAULT_DISTRACTOR_SOURCES",
    "DemoQuery",
    "DemoTask",
    "DemoTaskConfig",
    "build_demo_task",
    "input_overlap",
    "probe_patch",
    "traced_patches",
    "true_pair_overlap",
]

#: The package's bundled sample images (see ``copynce_hf/assets/README.md`` for their licences).
BUNDLED_IMAGES = Path(__file__).resolve().parents[1] / "assets" / "images"
#: Bundled images held out of the references: their edited versions are the distractor queries.
DEFAULT_DISTRACTOR_SOURCES = ("brick", "gravel", "horse", "retina")

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


# ---------------------------------------------------------------------------------------------- task


@dataclasses.dataclass(frozen=True)
class DemoTaskConfig:
    """Which bundled images play which role, and how many queries are made.

    Attributes:
        image_folder: folder of the original images (default: the bundled sample images).
        distractor_sources: image names (file stems) held out of the references; their edited
            versions are the distractor queries.
        num_references: use only the first N remaining images (sorted by name) as references;
            ``None``: all of them.
        num_distractor_sources: use only the first N distractor sources; ``None``: all.
        copies_per_reference: edited copies made of every reference.
        copies_per_distractor: edited versions made of every distractor source.
        seed: seed of the query edits; query ``k`` draws from ``default_rng([seed, k])``.
        recipe: the query edit recipe.
    """

    image_folder: Path = BUNDLED_IMAGES
    distractor_sources: tuple[str, ...] = DEFAULT_DISTRACTOR_SOURCES
    num_references: int | None = None
    num_distractor_sources: int | None = None
    copies_per_reference: int = 2
    copies_per_distractor: int = 2
    seed: int = 2025
    recipe: CopyRecipe = dataclasses.field(default_factory=CopyRecipe.demo_queries)

    def __post_init__(self):
        object.__setattr__(self, "image_folder", Path(self.image_folder))
        object.__setattr__(self, "distractor_sources", tuple(self.distractor_sources))
        for key in ("num_references", "num_distractor_sources"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ConfigError(f"DemoTaskConfig.{key}={value} must be >= 0 or None")
        for key in ("copies_per_reference", "copies_per_distractor"):
            if getattr(self, key) < 0:
                raise ConfigError(f"DemoTaskConfig.{key}={getattr(self, key)} must be >= 0")


@dataclasses.dataclass
class DemoQuery:
    """One query of the demo task.

    Attributes:
        query_id: ``Q00``, ``Q01``, ... (shuffled: the id tells nothing about the source).
        source_id: name of the original image the query was made from.
        reference_id: ``source_id`` when the original is a reference, ``None`` for a distractor.
        image: the edited RGB image.
        table: :class:`CoordinateTable` from the query's pixels to the original's pixels.
        edits: the edits applied, ``[Edit.to_dict(), ...]`` (replayable with ``pixtrace.replay(..., fuse=False)``: applied one by one).
    """

    query_id: str
    source_id: str
    reference_id: str | None
    image: Image.Image
    table: CoordinateTable
    edits: list[dict]

    @property
    def is_copy(self) -> bool:
        return self.reference_id is not None


@dataclasses.dataclass
class DemoTask:
    """References (id -> file), queries and ground truth of the demo."""

    config: DemoTaskConfig
    reference_files: dict[str, Path]
    distractor_files: dict[str, Path]
    queries: list[DemoQuery]

    @property
    def reference_ids(self) -> list[str]:
        return list(self.reference_files)

    @property
    def query_ids(self) -> list[str]:
        return [query.query_id for query in self.queries]

    def reference_source(self) -> ImageListSource:
        """The references as an image source (``ids`` + ``load(i)``) for the systems of :mod:`.systems`."""
        return ImageListSource(self.reference_ids, list(self.reference_files.values()))

    def query_source(self) -> ImageListSource:
        """The edited queries (in memory) as an image source."""
        return ImageListSource(self.query_ids, [query.image for query in self.queries])

    @property
    def ground_truth(self) -> dict[str, list[str]]:
        """``{query_id: [reference_id]}``; distractor queries map to ``[]``."""
        return {query.query_id: [query.reference_id] if query.is_copy else [] for query in self.queries}

    def query(self, query_id: str) -> DemoQuery:
        for query in self.queries:
            if query.query_id == query_id:
                return query
        raise KeyError(query_id)

    def save_queries(self, folder: str | Path) -> dict[str, Path]:
        """Write every query as a lossless PNG ``<folder>/<query_id>.png``; returns id -> path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {}
        for query in self.queries:
            path = folder / f"{query.query_id}.png"
            query.image.save(path)
            paths[query.query_id] = path
        return paths

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable description: roles of the images, every query's source and edits."""
        return {
            "references": {key: str(path) for key, path in self.reference_files.items()},
            "distractor_sources": {key: str(path) for key, path in self.distractor_files.items()},
            "seed": self.config.seed,
            "recipe": self.config.recipe.to_dict(),
            "queries": [{"query_id": q.query_id, "source_id": q.source_id, "reference_id": q.reference_id,
                         "size": [q.image.height, q.image.width], "traced_fraction": q.table.traced_fraction,
                         "edits": q.edits} for q in self.queries],
        }


def _image_files(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        raise ConfigError(f"the demo's image folder {folder} does not exist")
    files = {path.stem: path for path in sorted(folder.iterdir()) if path.suffix.lower() in _IMAGE_SUFFIXES}
    if not files:
        raise ConfigError(f"the demo's image folder {folder} holds no .jpg/.png image")
    return files


def build_demo_task(config: DemoTaskConfig | None = None) -> DemoTask:
    """Make the demo task: split the images into references and distractor sources, edit the queries.

    Deterministic for a given config. Raises :class:`ConfigError` when a distractor source is not
    in the folder or when the task would have no copy query.
    """
    config = config or DemoTaskConfig()
    files = _image_files(config.image_folder)
    unknown = [name for name in config.distractor_sources if name not in files]
    if unknown:
        raise ConfigError(f"distractor sources {unknown} are not images of {config.image_folder} "
                          f"(available: {sorted(files)})")
    distractors = list(config.distractor_sources)[: config.num_distractor_sources]
    references = [name for name in files if name not in config.distractor_sources][: config.num_references]
    if not references or config.copies_per_reference == 0:
        raise ConfigError("the demo task needs at least one reference and one copy per reference")

    plan = [(name, name) for name in references for _ in range(config.copies_per_reference)]
    plan += [(name, None) for name in distractors for _ in range(config.copies_per_distractor)]
    # Shuffled query ids, so that neither the id nor the order reveals the source.
    order = np.random.default_rng([config.seed, len(plan)]).permutation(len(plan))
    width = max(2, len(str(len(plan) - 1)))
    originals = {name: load_image(files[name]) for name in set(references) | set(distractors)}
    queries = []
    for position, (index, (source, reference)) in enumerate(sorted(zip(order, plan))):
        rng = np.random.default_rng([config.seed, position])
        image, table, edits = config.recipe.apply(originals[source], rng)
        queries.append(DemoQuery(f"Q{index:0{width}d}", source, reference, image, table, edits))
    return DemoTask(config, {name: files[name] for name in references},
                    {name: files[name] for name in distractors}, queries)


# ---------------------------------------------------------------------------------------------- priors


def true_pair_overlap(query: DemoQuery, reference_size: tuple[int, int], image_size: int,
                      patch_size: int) -> np.ndarray:
    """PixTrace overlap prior of a copy query with its true reference, at the model's input size.

    Both images are resized to ``image_size`` x ``image_size`` by the image processor, so the
    query's table is resized likewise and the reference (the unedited original of (H, W)
    ``reference_size``) is an identity table resized to the same size.

    Returns:
        float32 (L, L) with ``L = (image_size // patch_size) ** 2``: entry (i, j) is the fraction of
        query patch i's pixels copied from reference patch j (paper, "CopyNCE Loss", q-hat).
    """
    if not query.is_copy:
        raise ConfigError(f"query {query.query_id} is a distractor: it has no true reference")
    return input_overlap(query.table, reference_size, image_size, patch_size)


def input_overlap(table: CoordinateTable, original_size: tuple[int, int], image_size: int,
                  patch_size: int) -> np.ndarray:
    """PixTrace overlap prior of an edited copy with its original, both resized to the model input.

    Args:
        table: the copy's :class:`CoordinateTable` to the original.
        original_size: (H, W) of the original.
        image_size: side of the square model input both images are resized to.
        patch_size: pixels per patch side.

    Returns:
        float32 (L, L) with ``L = (image_size // patch_size) ** 2``: entry (i, j) is the fraction of
        copy patch i's pixels that come from original patch j (paper, "CopyNCE Loss", q-hat).
    """
    copy_table = table.resize(image_size, image_size)
    original_table = CoordinateTable.identity(*original_size).resize(image_size, image_size)
    overlap, _ = pair_overlaps(copy_table, original_table, patch_size)
    return overlap


def traced_patches(table: CoordinateTable, image_size: int, patch_size: int) -> np.ndarray:
    """float32 (rows, cols): the share of every patch's pixels that are traced, at the model input size."""
    valid = table.resize(image_size, image_size).valid.astype(np.float32)
    grid = image_size // patch_size
    return valid[: grid * patch_size, : grid * patch_size].reshape(grid, patch_size, grid, patch_size).mean(axis=(1, 3))


def probe_patch(copied: np.ndarray) -> tuple[int, int]:
    """(row, col) of a query patch to probe: the most copied patch nearest the copied region's centre.

    Args:
        copied: (rows, cols) share of each query patch that is copied (e.g. the row sums of an
            overlap prior reshaped to the patch grid, or :func:`traced_patches`).
    """
    grid = copied.shape
    if copied.max() <= 0:
        return grid[0] // 2, grid[1] // 2
    rows, cols = np.indices(grid)
    centre = np.array([(rows * copied).sum(), (cols * copied).sum()]) / copied.sum()
    best = copied >= copied.max() - 1e-6
    distance = np.where(best, (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2, np.inf)
    row, col = np.unravel_index(int(np.argmin(distance)), grid)
    return int(row), int(col)
