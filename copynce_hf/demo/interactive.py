"""Interactive copy detection: the functions behind the Space (``spaces/copynce/app.py``).

Three views of one detector, each a plain function of images and numbers, so that the web app
only lays them out (and tests call them without a browser):

* :func:`compare`: the matcher's copy probability and the descriptor cosine of a pair, with the
  matcher's token affinity heatmap of one query patch and the affinity entropy map (paper,
  "Visualization and Interpretability");
* :func:`search`: the top references of a :class:`Gallery` (the bundled images, or a zip of
  references read by :func:`gallery_from_zip` within stated size limits), the best one verified
  by the matcher;
* :func:`make_copy` / :func:`copy_overlap_image`: a traced copy of an image with a recipe preset
  and a seed, and the PixTrace overlap prior between copy and original (paper, "PixTrace
  Pipeline" and "CopyNCE Loss", q-hat) drawn over both.

Bad input raises :class:`~copynce_hf.modeling.errors.CopyNCEError` subclasses whose message is written
for the page: which file, what is wrong, what the limit is.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..calibration.meaning import CardThreshold, card_threshold
from ..evaluation.demo_task import BUNDLED_IMAGES, input_overlap, probe_patch
from ..images import load_image
from ..modeling.errors import ConfigError, ImageLoadError
from ..pixtrace import CopyEditor, CopyRecipe, CopyResult
from ..reports.affinity import AffinityMaps, affinity_figures, affinity_maps
from ..retrieval import (
    IMAGE_EXTENSIONS,
    DescriptorIndex,
    DescriptorSet,
    ImageListSource,
    IndexConfig,
    extract_descriptors,
    score_views,
    search_references,
)
from ..runtime.loading import load_model
from .figures import figure_image, overlap_figure

__all__ = [
    "COPY_PRESETS",
    "DESCRIPTOR_ENV",
    "MATCHER_ENV",
    "MAX_GALLERY_IMAGES",
    "MAX_IMAGE_BYTES",
    "MAX_ZIP_BYTES",
    "Comparison",
    "Detector",
    "Gallery",
    "SearchHit",
    "SearchResult",
    "bundled_image_files",
    "bundled_gallery",
    "compare",
    "comparison_images",
    "copy_overlap_image",
    "copy_summary",
    "gallery_from_images",
    "gallery_from_zip",
    "make_copy",
    "patch_at",
    "read_upload",
    "search",
]

#: Environment variables naming the descriptor / matcher (a folder or a Hub id); unset: the embedded models.
DESCRIPTOR_ENV = "COPYNCE_DESCRIPTOR"
MATCHER_ENV = "COPYNCE_MATCHER"
#: Largest uploaded image file accepted (bytes).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
#: Largest uploaded zip of references (bytes, compressed) and its largest total uncompressed size.
MAX_ZIP_BYTES = 50 * 1024 * 1024
MAX_ZIP_UNCOMPRESSED_BYTES = 200 * 1024 * 1024
#: Most images a gallery zip may hold.
MAX_GALLERY_IMAGES = 200
#: Gallery images are kept at most this large (longer side, pixels): the models see 112x112.
GALLERY_MAX_SIDE = 512


def _megabytes(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


# ---------------------------------------------------------------------------------------------- models


@dataclasses.dataclass
class Detector:
    """A CopyNCE descriptor and matcher, each ``(model, image_processor)`` in float32, with their names."""

    descriptor: tuple[Any, Any]
    matcher: tuple[Any, Any]
    descriptor_name: str
    matcher_name: str
    matcher_card: CardThreshold | None = None

    @classmethod
    def load(cls, descriptor: str | os.PathLike | None = None, matcher: str | os.PathLike | None = None) -> Detector:
        """Load both models from folders or Hub ids; ``None``: the embedded models of the package.

        Raises :class:`ConfigError` when a model cannot be loaded or is of the wrong kind.
        """
        loaded = {}
        for kind, source, env in (("descriptor", descriptor, DESCRIPTOR_ENV), ("matcher", matcher, MATCHER_ENV)):
            model, processor = load_model(str(source) if source else None, kind, env)
            loaded[kind] = ((model, processor), str(source) if source else f"embedded {kind}")
        return cls(loaded["descriptor"][0], loaded["matcher"][0], loaded["descriptor"][1], loaded["matcher"][1],
                   card_threshold(matcher, "matcher"))

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> Detector:
        """:meth:`load` with the models named by ``COPYNCE_DESCRIPTOR`` / ``COPYNCE_MATCHER`` (unset: embedded)."""
        environ = os.environ if environ is None else environ
        return cls.load(environ.get(DESCRIPTOR_ENV) or None, environ.get(MATCHER_ENV) or None)

    @property
    def grid(self) -> int:
        """Patches per side of the matcher's input (image_size // patch_size)."""
        config = self.matcher[0].config
        return int(config.image_size) // int(config.patch_size)

    def embed(self, images: Sequence[Image.Image], ids: Sequence[str] | None = None) -> DescriptorSet:
        """Descriptors (N, D) of RGB images, L2-normalised."""
        ids = list(ids) if ids is not None else [str(i) for i in range(len(images))]
        model, processor = self.descriptor
        found = extract_descriptors(model, processor, ImageListSource(ids, list(images)), batch_size=16,
                                    progress=False)
        vectors = torch.nn.functional.normalize(torch.from_numpy(found.descriptors), dim=-1).numpy()
        return DescriptorSet(found.ids, vectors, skipped=found.skipped)

    def copy_probability(self, query: Image.Image, reference: Image.Image) -> float:
        """The matcher's copy probability ``sigmoid(logit)`` of the pair."""
        return self._score(self.matcher, query, reference)

    def cosine(self, query: Image.Image, reference: Image.Image) -> float:
        """Cosine similarity of the two descriptors, in [-1, 1]."""
        return self._score(self.descriptor, query, reference)

    @staticmethod
    def _score(model_and_processor, query: Image.Image, reference: Image.Image) -> float:
        model, processor = model_and_processor
        pixels = processor(images=[query, reference], return_tensors="pt")["pixel_values"]
        # score_views takes (pairs, views, 3, H, W): one pair, one view each
        return float(score_views(model, pixels[:1, None], pixels[1:, None])[0])


# ---------------------------------------------------------------------------------------------- uploads


def _uploaded_file(path: str | os.PathLike | None, missing: str, what: str, max_bytes: int) -> Path:
    """``path`` as a Path after the checks every upload gets: present, a file, at most ``max_bytes``."""
    if path is None or str(path) == "":
        raise ImageLoadError(missing)
    path = Path(path)
    if not path.is_file():
        raise ImageLoadError(f"{what} {path.name} could not be read (upload it again).")
    size = path.stat().st_size
    if size > max_bytes:
        raise ImageLoadError(f"{what} {path.name} is too large: {_megabytes(size)}, "
                             f"the limit is {_megabytes(max_bytes)}.")
    return path


def read_upload(path: str | os.PathLike | None, label: str, max_bytes: int = MAX_IMAGE_BYTES) -> Image.Image:
    """An uploaded image file as RGB, or an :class:`ImageLoadError` with a message for the page.

    Args:
        path: the uploaded file (``None``: nothing was uploaded).
        label: what the file is for, e.g. ``"query"`` (named in the message).
        max_bytes: the largest file accepted.
    """
    path = _uploaded_file(path, f"Please upload a {label} image.", f"The {label} file", max_bytes)
    name = path.name
    try:
        return load_image(path)
    except ImageLoadError as error:
        reason = str(error).replace(repr(str(path)), "it")
        raise ImageLoadError(f"The {label} file {name} is not a usable image: {reason}.") from error


# ---------------------------------------------------------------------------------------------- compare


@dataclasses.dataclass
class Comparison:
    """What :func:`compare` found for a pair.

    Attributes:
        copy_probability: the matcher's ``sigmoid(logit)``, in [0, 1].
        cosine: the descriptor cosine similarity, in [-1, 1].
        maps: the matcher's token affinity heatmap of the probe patch and the affinity entropy map.
    """

    copy_probability: float
    cosine: float
    maps: AffinityMaps


def verdict(probability: float, card: CardThreshold | None) -> str:
    """How the page words a pair's copy probability: against the matcher card's threshold at precision 0.9
    (:func:`~copynce_hf.calibration.meaning.card_threshold`; ``None``: against 0.5 only), never as a calibrated
    decision: look-alike images (textures of one kind, drawings in one style) can score as high as copies."""
    caveat = "uncalibrated for your images: look-alike images can score as high as copies"
    if probability < 0.5:
        return "likely not a copy"
    if card is None:
        return f"likely a copy ({caveat})"
    where = f"the model card's threshold for precision 0.9 on {card.task}, {card.threshold:.3f}"
    if probability >= card.threshold:
        return f"likely a copy (at or above {where}; {caveat})"
    return f"uncertain (below {where})"


def patch_at(x: float, y: float, width: int, height: int, grid: int) -> tuple[int, int]:
    """(row, col) of the model-input patch under pixel (x, y) of a ``width`` x ``height`` image.

    The image processor resizes every image to a square input of ``grid`` x ``grid`` patches
    (no crop), so the patch grid stretches over the whole image.
    """
    if width <= 0 or height <= 0 or grid <= 0:
        raise ConfigError(f"patch_at needs a positive size and grid, got {width}x{height}, grid {grid}")
    row = min(grid - 1, max(0, int(float(y) * grid / height)))
    col = min(grid - 1, max(0, int(float(x) * grid / width)))
    return row, col


def compare(detector: Detector, query: Image.Image, reference: Image.Image,
            patch: tuple[int, int] | None = None) -> Comparison:
    """Score a pair and explain it; ``patch`` None probes the most confident query patch (lowest entropy)."""
    model, processor = detector.matcher
    maps = affinity_maps(model, processor, query, reference, patch)
    return Comparison(detector.copy_probability(query, reference), detector.cosine(query, reference), maps)


def comparison_images(comparison: Comparison) -> tuple[Image.Image, Image.Image]:
    """``(token affinity, affinity entropy)`` figures of a comparison as RGB images."""
    affinity, entropy = affinity_figures(comparison.maps)
    return figure_image(affinity), figure_image(entropy)


# ---------------------------------------------------------------------------------------------- search


@dataclasses.dataclass
class Gallery:
    """References to search: ids, images (longer side at most :data:`GALLERY_MAX_SIDE`), descriptors.

    Attributes:
        name: where the references came from (shown on the page).
        ids: N reference ids (file names).
        images: N RGB images.
        descriptors: their :class:`DescriptorSet` (N, D), L2-normalised, in ``ids`` order.
        skipped: files that were not used, each with the reason.
    """

    name: str
    ids: list[str]
    images: list[Image.Image]
    descriptors: DescriptorSet
    skipped: list[str] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def _shrunk(image: Image.Image) -> Image.Image:
    if max(image.size) <= GALLERY_MAX_SIDE:
        return image
    image = image.copy()
    image.thumbnail((GALLERY_MAX_SIDE, GALLERY_MAX_SIDE), Image.Resampling.LANCZOS)
    return image


def gallery_from_images(detector: Detector, images: dict[str, Image.Image], name: str,
                        skipped: Sequence[str] = (), progress: Callable[[int, int], None] | None = None,
                        batch_size: int = 16) -> Gallery:
    """Embed ``{id: image}`` as a gallery, calling ``progress(done, total)`` after every batch."""
    if not images:
        raise ImageLoadError(f"{name} holds no usable image.")
    ids = list(images)
    shrunk = [_shrunk(images[key]) for key in ids]
    parts = []
    for start in range(0, len(ids), batch_size):
        parts.append(detector.embed(shrunk[start : start + batch_size], ids[start : start + batch_size]))
        if progress is not None:
            progress(min(start + batch_size, len(ids)), len(ids))
    descriptors = DescriptorSet([i for part in parts for i in part.ids],
                                np.concatenate([part.descriptors for part in parts]))
    return Gallery(name, ids, shrunk, descriptors, list(skipped))


def bundled_image_files() -> dict[str, Path]:
    """``{file name: path}`` of the package's bundled sample images (``copynce_hf/assets/images``)."""
    return {path.name: path for path in sorted(BUNDLED_IMAGES.iterdir())
            if path.suffix.lower() in IMAGE_EXTENSIONS}


def bundled_gallery(detector: Detector) -> Gallery:
    """The package's bundled sample images as a gallery."""
    images = {name: load_image(path) for name, path in bundled_image_files().items()}
    return gallery_from_images(detector, images, "the bundled sample images")


def gallery_from_zip(detector: Detector, path: str | os.PathLike | None,
                     progress: Callable[[int, int], None] | None = None, max_bytes: int = MAX_ZIP_BYTES,
                     max_images: int = MAX_GALLERY_IMAGES,
                     max_uncompressed: int = MAX_ZIP_UNCOMPRESSED_BYTES) -> Gallery:
    """Index the images of an uploaded zip (any folder depth); other files are listed as skipped.

    Raises :class:`ImageLoadError` for a missing, too large or corrupt zip, more than ``max_images``
    images, more than ``max_uncompressed`` bytes once unpacked, or a zip without a readable image.
    """
    path = _uploaded_file(path, "Please upload a .zip file of reference images.", "The zip", max_bytes)
    name = path.name
    if not zipfile.is_zipfile(path):
        raise ImageLoadError(f"{name} is not a zip archive (or it is corrupt): upload a .zip of reference images.")
    images: dict[str, Image.Image] = {}
    skipped: list[str] = []
    try:
        with zipfile.ZipFile(path) as archive:
            members = [info for info in archive.infolist() if not info.is_dir()]
            wanted = [info for info in members if PurePosixPath(info.filename).suffix.lower() in IMAGE_EXTENSIONS
                      and not PurePosixPath(info.filename).name.startswith(".")
                      and "__MACOSX" not in PurePosixPath(info.filename).parts]
            skipped += [f"{info.filename} (not an image file name)" for info in members if info not in wanted]
            if len(wanted) > max_images:
                raise ImageLoadError(f"The zip {name} holds {len(wanted)} images; the limit is {max_images}.")
            unpacked = sum(info.file_size for info in wanted)
            if unpacked > max_uncompressed:
                raise ImageLoadError(f"The zip {name} unpacks to {_megabytes(unpacked)} of images; "
                                     f"the limit is {_megabytes(max_uncompressed)}.")
            for info in wanted:
                try:
                    images[info.filename] = _shrunk(load_image(archive.read(info)))
                except ImageLoadError as error:
                    # "image <N bytes> is truncated or corrupt: <decoder detail>" -> "is truncated or corrupt"
                    reason = str(error).split(" bytes> ", 1)[-1].split(": ", 1)[0]
                    skipped.append(f"{info.filename} ({reason})")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError) as error:
        raise ImageLoadError(f"The zip {name} is corrupt or unsupported: {error}.") from error
    if not images:
        raise ImageLoadError(f"The zip {name} holds no readable image ({', '.join(IMAGE_EXTENSIONS)}).")
    return gallery_from_images(detector, images, name, skipped, progress)


@dataclasses.dataclass
class SearchHit:
    """One reference found for a query: its id, image and descriptor cosine."""

    reference_id: str
    image: Image.Image
    cosine: float


@dataclasses.dataclass
class SearchResult:
    """The top references of a query (best first) and the matcher's copy probability of the best."""

    hits: list[SearchHit]
    best_copy_probability: float


def search(detector: Detector, gallery: Gallery, query: Image.Image, k: int = 5) -> SearchResult:
    """Top-``k`` references by descriptor cosine (exact faiss search), the best verified by the matcher."""
    if len(gallery) == 0:
        raise ConfigError("the gallery is empty")
    index = DescriptorIndex.build(gallery.descriptors, IndexConfig(kind="flat"))
    found = search_references(index, detector.embed([query], ["query"]), min(k, len(gallery)))
    position = {key: i for i, key in enumerate(gallery.ids)}
    hits = [SearchHit(p.reference_id, gallery.images[position[p.reference_id]], p.score) for p in found]
    best = detector.copy_probability(query, hits[0].image)
    return SearchResult(hits, best)


# ---------------------------------------------------------------------------------------------- copies


#: Recipe presets of :func:`make_copy`: name -> what it is.
COPY_PRESETS = {
    "training": "CopyRecipe.training(): the package's training augmentation (crops, flips, affine, perspective, "
                "colour, blur, pasting, overlays, erasing, compression)",
    "paper_descriptor": "CopyRecipe.paper_descriptor(): the authors' descriptor training recipe (four shuffled "
                        "groups of edits, then padding and erasing)",
    "paper_matcher": "CopyRecipe.paper_matcher(): the authors' matcher training recipe (heavier)",
    "evaluation": "CopyRecipe.demo_queries(): the demo's evaluation-style edits (heavy crops with text and emoji, "
                  "rotations, skew, aspect ratio, memes, screenshots, then photometric changes)",
}


def make_copy(image: Image.Image, preset: str, seed: int,
              image_pool: Sequence[str | os.PathLike] = ()) -> CopyResult:
    """A traced copy of ``image``: the edited image, its table to ``image`` and the list of edits.

    Args:
        image: the original (RGB).
        preset: a key of :data:`COPY_PRESETS`.
        seed: non-negative seed; the same (image, preset, seed, image_pool) gives the same copy.
        image_pool: image files the training presets may paste the copy onto or overlay on it.
    """
    if preset not in COPY_PRESETS:
        raise ConfigError(f"unknown copy preset {preset!r}; known presets: {', '.join(COPY_PRESETS)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**31:
        raise ConfigError(f"the seed must be an integer in [0, 2^31), got {seed!r}")
    if preset == "evaluation":
        edited, table, edits = CopyRecipe.demo_queries().apply(image, np.random.default_rng(int(seed)))
        return CopyResult(edited, table, edits)
    recipe = getattr(CopyRecipe, preset)()
    return CopyEditor(seed=int(seed), recipe=recipe, image_pool=image_pool)(image)


def copy_overlap_image(original: Image.Image, copy: CopyResult, image_size: int, patch_size: int,
                       patch: tuple[int, int] | None = None) -> Image.Image:
    """The PixTrace overlap prior of a copy and its original at the model input, drawn over both.

    Left: the copy, each patch shaded by the fraction of its pixels that come from the original;
    right: the original, shaded by where the probe patch's pixels come from (``patch`` None: the
    most copied patch nearest the copied region's centre). See :func:`~copynce_hf.demo.figures.overlap_figure`.
    """
    overlap = input_overlap(copy.table, (original.height, original.width), image_size, patch_size)
    grid = image_size // patch_size
    probe = patch if patch is not None else probe_patch(overlap.sum(axis=1).reshape(grid, grid))
    resized = [image.resize((image_size, image_size), Image.Resampling.BICUBIC) for image in (copy.image, original)]
    figure = overlap_figure(*resized, overlap, probe, patch_size,
                            title=f"PixTrace overlap prior: {overlap.sum(axis=1).mean():.0%} of the copy is traced")
    return figure_image(figure)


def copy_summary(copy: CopyResult, preset: str, seed: int, original_name: str) -> dict[str, Any]:
    """JSON-serialisable description of a copy: original, preset, seed, edits (replayable with ``pixtrace.replay``)."""
    return {"original": original_name, "preset": preset, "seed": int(seed),
            "size": [copy.image.height, copy.image.width],
            "traced_fraction": round(float(copy.table.traced_fraction), 4), "edits": copy.edits}
