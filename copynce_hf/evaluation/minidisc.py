"""The mini-DISC task: a DISC21-shaped copy-detection benchmark built from an image folder with splits.

DISC21 (paper, section "Experiments" and supplementary "Evaluation Protocols") asks, for every
query image, which reference image (if any) it is an edited copy of; most queries are
distractors with no original among the references. The mini version:

* references: the images of the ``reference`` split of the splits CSV (300 in the project's
  ``imagenet-sample`` data, sorted by name);
* queries: one edited copy of every ``query_every``-th reference (150) and one edited version of
  every ``distractor`` image (100); their originals are never references, so they must not match;
* ground truth: ``{query_id: [reference_id]}``, distractors mapping to ``[]``.

The queries are made by the preset :meth:`CopyRecipe.minidisc_queries <copynce_hf.pixtrace.CopyRecipe.minidisc_queries>`,
*different from the training preset* (:meth:`~copynce_hf.pixtrace.CopyRecipe.training`): it uses catalogue edits the training
recipe never draws (meme format, overlay onto a screenshot template, skew, rotation cropped
to its content, change of aspect ratio, brightness/contrast/saturation, sharpen, solarise,
posterise, edge enhancement) and heavy crops covered with text and emoji in fonts the
training recipe does not use, with its own seeds. Queries are not stored: each is a list of
explicit edits (``Edit.to_dict()``) drawn deterministically from ``(seed, query index)``, and
the image is rebuilt with :func:`copynce_hf.pixtrace.replay`; :meth:`MiniDisc.materialize`
writes them once into a cache folder (lossless PNG) for the systems that read files.

Nothing here is fitted to the reference or distractor images: the recipe's ranges were chosen
a priori, in the spirit of DISC21's query edits.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..images import image_size, load_image
from ..modeling.errors import ConfigError, ImageLoadError
from ..pixtrace import CopyRecipe, replay
from ..retrieval.sources import ImageListSource

__all__ = ["MiniDiscConfig", "MiniDisc", "QueryEntry", "build_minidisc", "draw_queries"]


# ---------------------------------------------------------------------------------------------- task


@dataclasses.dataclass(frozen=True)
class MiniDiscConfig:
    """Where the images come from and how many of each kind the task uses.

    Attributes:
        image_folder: folder of the original images (``imagenet-sample``).
        splits_csv: ``filename,split`` CSV assigning each file to ``train``/``reference``/``distractor``.
        num_references: use only the first N references (sorted by name); ``None``: all (300).
        query_every: every ``query_every``-th reference (0, k, 2k, ...) gets one edited copy.
        num_distractors: use only the first N distractor images; ``None``: all (100).
        seed: seed of the query edits (the evaluation's own; training uses other seeds).
        recipe: the evaluation recipe.
    """

    image_folder: Path | None = None
    splits_csv: Path | None = None
    num_references: int | None = None
    query_every: int = 2
    num_distractors: int | None = None
    seed: int = 20250806
    recipe: CopyRecipe = dataclasses.field(default_factory=CopyRecipe.minidisc_queries)

    def __post_init__(self):
        if self.image_folder is None or self.splits_csv is None:
            raise ConfigError("MiniDiscConfig needs image_folder and splits_csv (the image folder and its "
                              "filename,split CSV)")
        object.__setattr__(self, "image_folder", Path(self.image_folder))
        object.__setattr__(self, "splits_csv", Path(self.splits_csv))
        if self.query_every < 1:
            raise ConfigError(f"query_every={self.query_every} must be >= 1")
        for key in ("num_references", "num_distractors"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ConfigError(f"{key}={value} must be >= 0 or None")

    def to_dict(self) -> dict[str, Any]:
        return {"image_folder": str(self.image_folder), "splits_csv": str(self.splits_csv),
                "num_references": self.num_references, "query_every": self.query_every,
                "num_distractors": self.num_distractors, "seed": self.seed, "recipe": self.recipe.to_dict()}


@dataclasses.dataclass(frozen=True)
class QueryEntry:
    """One query: its id, the original file it is made from, whether that original is a reference
    (``reference_id`` set) or a distractor (``None``), and the explicit edits (``Edit.to_dict()``)."""

    query_id: str
    source_path: Path
    reference_id: str | None
    edits: tuple[dict[str, Any], ...]


class MiniDisc:
    """A built mini-DISC task.

    Attributes:
        config: the :class:`MiniDiscConfig` it was built from.
        reference_ids: R ids (file stems), sorted.
        reference_files: id -> path of each reference.
        queries: Q :class:`QueryEntry` in id order (copies and distractors shuffled together).
        ground_truth: ``{query_id: [reference_id]}``; distractors map to ``[]``.
    """

    def __init__(self, config: MiniDiscConfig, reference_files: dict[str, Path], queries: list[QueryEntry]):
        self.config = config
        self.reference_files = dict(reference_files)
        self.reference_ids = list(self.reference_files)
        self.queries = list(queries)
        self.query_ids = [q.query_id for q in self.queries]
        self.ground_truth = {q.query_id: ([q.reference_id] if q.reference_id else []) for q in self.queries}
        self._query_files: dict[str, Path] | None = None

    def __repr__(self) -> str:
        copies = sum(1 for q in self.queries if q.reference_id)
        return (f"MiniDisc({len(self.reference_ids)} references, {len(self.queries)} queries: {copies} copies, "
                f"{len(self.queries) - copies} distractors)")

    @property
    def fingerprint(self) -> str:
        """Short hash of the task definition (files, edits): names the query cache folder."""
        payload = json.dumps({"refs": self.reference_ids,
                              "queries": [[q.query_id, q.source_path.name, q.reference_id, list(q.edits)]
                                          for q in self.queries]}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def query_image(self, index: int) -> Image.Image:
        """Query ``index`` (RGB PIL), rebuilt from its original by replaying its edits (one by one,
        ``fuse=False``: the evaluation queries stay the images they were before fused rendering)."""
        entry = self.queries[index]
        if self._query_files is not None:
            return load_image(self._query_files[entry.query_id])
        return replay(entry.source_path, list(entry.edits), fuse=False).image

    def reference_image(self, index: int) -> Image.Image:
        return load_image(self.reference_files[self.reference_ids[index]])

    def materialize(self, folder: str | os.PathLike) -> dict[str, Path]:
        """Write every query as ``<folder>/<fingerprint>/<query_id>.png`` (once) and return id -> path.

        Later calls (and :meth:`query_image`) read the files; a folder written for another task
        definition is never reused, since its name is the task's :attr:`fingerprint`.
        """
        target = Path(folder) / self.fingerprint
        target.mkdir(parents=True, exist_ok=True)
        files = {}
        for entry in self.queries:
            path = target / f"{entry.query_id}.png"
            if not path.is_file():
                partial = path.with_suffix(".tmp.png")
                replay(entry.source_path, list(entry.edits), fuse=False).image.save(partial, format="PNG")
                os.replace(partial, path)  # never leave a half-written file under the final name
            files[entry.query_id] = path
        (target / "task.json").write_text(json.dumps(self.describe(), indent=2, default=str) + "\n")
        self._query_files = files
        return dict(files)

    def export(self, folder: str | os.PathLike, auxiliary_split: str | None = "train") -> dict[str, Path]:
        """Lay the task out as folders for ``copynce detect``: ``queries/`` (PNG), ``references/`` and ``auxiliary/``
        (symbolic links to the originals, or copies where links are not possible) and ``ground_truth.csv``.

        ``auxiliary_split``: the split linked into ``auxiliary/`` for score normalisation (``None``: none).
        Returns ``{"queries", "references", "auxiliary", "ground_truth"}`` paths.
        """
        folder = Path(folder)
        queries = folder / "queries"
        queries.mkdir(parents=True, exist_ok=True)
        for path in self.materialize(folder / "cache").values():
            _link(path, queries / path.name)
        layout = {"queries": queries, "references": folder / "references", "ground_truth": folder / "ground_truth.csv"}
        for path in self.reference_files.values():
            _link(path, layout["references"] / path.name)
        if auxiliary_split is not None:
            layout["auxiliary"] = folder / "auxiliary"
            for path in read_splits(self.config.splits_csv, self.config.image_folder).get(auxiliary_split, []):
                _link(path, layout["auxiliary"] / path.name)
        with layout["ground_truth"].open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["query_id", "reference_id"])
            for query_id, references in self.ground_truth.items():
                writer.writerow([query_id, references[0] if references else ""])
        return layout

    @property
    def query_files(self) -> dict[str, Path] | None:
        return None if self._query_files is None else dict(self._query_files)

    def reference_source(self) -> ImageListSource:
        return ImageListSource(self.reference_ids, [_file_loader(self.reference_files[i]) for i in self.reference_ids])

    def query_source(self) -> ImageListSource:
        return ImageListSource(self.query_ids, [(lambda i=i: self.query_image(i)) for i in range(len(self.queries))])

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable description: config, counts, and every query's edits and answer."""
        return {
            "config": self.config.to_dict(),
            "fingerprint": self.fingerprint,
            "num_references": len(self.reference_ids),
            "num_queries": len(self.queries),
            "num_copies": sum(1 for q in self.queries if q.reference_id),
            "queries": [{"query_id": q.query_id, "source": q.source_path.name, "reference_id": q.reference_id,
                         "edits": list(q.edits)} for q in self.queries],
        }


def _link(source: Path, target: Path) -> None:
    """``target`` -> ``source`` as a symbolic link (a copy where the file system refuses links)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        target.unlink()
    try:
        target.symlink_to(Path(source).resolve())
    except OSError:
        import shutil

        shutil.copyfile(source, target)


def _file_loader(path: Path):
    return lambda: load_image(path)


def read_splits(splits_csv: Path, image_folder: Path) -> dict[str, list[Path]]:
    """``{split: [file, ...]}`` from the ``filename,split`` CSV, files sorted by name."""
    if not splits_csv.is_file():
        raise ConfigError(f"splits file {str(splits_csv)!r} does not exist")
    with splits_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or {"filename", "split"} - set(rows[0]):
        raise ConfigError(f"splits file {str(splits_csv)!r} must have the columns filename,split")
    splits: dict[str, list[Path]] = {}
    for row in rows:
        splits.setdefault(row["split"], []).append(image_folder / row["filename"])
    return {name: sorted(files) for name, files in splits.items()}


def draw_queries(sources: list[tuple[Path, str | None]], recipe: CopyRecipe, seed: int,
                 listed_in: str = "the task", max_pixels: int | None = None) -> list[QueryEntry]:
    """One query per ``(original file, reference id or None)`` of ``sources``: its edits drawn, no pixel work.

    Query ``k`` (in the order of ``sources``) draws its edits from ``numpy.random.default_rng([seed, k])``,
    so the queries are the same on every machine and a longer list keeps the first queries' edits. Queries
    are then shuffled (seeded) and numbered ``Q000``, ``Q001``, ... so that an id tells nothing about the
    answer. ``listed_in`` names where the files were listed, for the error on a missing one; ``max_pixels``: the
    size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).

    Raises:
        ImageLoadError: an original image does not exist or its header cannot be read (empty file, not an image,
            too large), with its reason.
    """
    drafts = []
    for k, (path, reference_id) in enumerate(sources):
        if not path.is_file():
            raise ImageLoadError(f"image {str(path)!r} listed in {listed_in} does not exist")
        width, height = image_size(path, 1, max_pixels)  # the size only, as displayed (EXIF-rotated files swap sides)
        rng = np.random.default_rng([seed, k])
        edits = tuple(edit.to_dict() for edit in recipe.draw(rng, (height, width)))
        drafts.append((path, reference_id, edits))
    order = np.random.default_rng([seed, len(sources), 1]).permutation(len(drafts))
    width = max(3, len(str(len(drafts) - 1)))
    return [QueryEntry(f"Q{n:0{width}d}", *drafts[i]) for n, i in enumerate(order)]


def build_minidisc(config: MiniDiscConfig) -> MiniDisc:
    """Build the task: pick the images, draw every query's edits (no pixel work yet, :func:`draw_queries`,
    in the order: copies of references 0, e, 2e, ..., then distractors).

    Raises:
        ConfigError: the splits file is missing or malformed, or a split has no image.
        ImageLoadError: an original image cannot be read.
    """
    splits = read_splits(config.splits_csv, config.image_folder)
    references = splits.get("reference", [])[: config.num_references]
    distractors = splits.get("distractor", [])[: config.num_distractors]
    if not references:
        raise ConfigError(f"no reference image in {str(config.splits_csv)!r}")
    reference_files = {path.stem: path for path in references}
    sources = [(path, path.stem) for path in references[:: config.query_every]]
    sources += [(path, None) for path in distractors]
    queries = draw_queries(sources, config.recipe, config.seed, config.splits_csv.name)
    return MiniDisc(config, reference_files, queries)
