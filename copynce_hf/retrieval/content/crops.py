"""Content crops: each image's own content, cut from its full-resolution pixels, as a second view in ``dedup``
(every image) and ``detect`` (the queries).

Beyond the paper. A copy put into a screenshot, then into a meme band or onto a background, can keep a few percent
of its pixels: at the models' input size (112 pixels for the embedded ones) its photo is a handful of patches, too
few for the descriptor to propose the pair or for the matcher to verify it. Content tokens
(:mod:`copynce_hf.retrieval.content.tokens`) mark what an image shares with many of its neighbours (the frames and bands of
templates); the tokens it keeps outline what is its own. Their largest 4-connected region, grown by
:data:`MARGIN` patches, is cut from the image's own pixels when it covers less than :data:`MAX_AREA` of the image
and enters the search as a second view of that image:

1. each crop's descriptor searches the whole images and the other crops for its :data:`~copynce_hf.retrieval.detection.config.DetectConfig`
   ``candidates`` nearest other images (:func:`crop_pairs`);
2. a pair whose best cosine over its views involves a crop is verified by the matcher on those two views (both
   orders when the dedup settings ask for them); its score replaces the whole-image one. Other pairs keep the
   whole-image score. The crops are their own content, so no tokens are dropped from them.

The boxes follow the image processor's resize (the whole image squeezed to the model's square input): a token of
row ``r``, column ``c`` of a ``g x g`` grid covers ``[c / g, (c + 1) / g)`` of the width and ``[r / g, (r + 1) /
g)`` of the height of the original image.

**Query crops** (``detect``) cut the queries the same way: :mod:`.queries`.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

import faiss
import numpy as np
import torch
from PIL import Image

from ...modeling.errors import ShapeError
from ...outputs import StagedFile
from ..descriptors.sets import DescriptorSet
from ..work_folder import digest, image_stamps

__all__ = ["MAX_AREA", "MARGIN", "MIN_SIDE", "Box", "CropSource", "CropPair", "content_box", "content_boxes",
           "crop_pairs", "crop_views", "nearest_rows", "write_crops", "write_box_rows", "CROP_COLUMNS", "VIEW_WHOLE", "VIEW_CROP",
           "VIEW_LAYOUT"]

#: A region of kept tokens covering at least this fraction of the image is the whole image: no crop.
MAX_AREA = 0.6
#: Patches added around the region on every side (the edges of a photo share tokens with its frame).
MARGIN = 1
#: The narrowest region cut, in patches (margin included).
MIN_SIDE = 2
#: The views of an image: the whole image, its content crop, and (``dedup``) one of its layout crops
#: (:mod:`copynce_hf.retrieval.deduplication.layouts`).
VIEW_WHOLE = "whole"
VIEW_CROP = "crop"
VIEW_LAYOUT = "layout"

#: ``(left, top, right, bottom)`` as fractions of the image's width and height.
Box = tuple[float, float, float, float]


def _largest_region(grid: np.ndarray) -> np.ndarray:
    """(g, g) bool -> (g, g) bool: its largest 4-connected region of ``True`` (the first found among equals)."""
    seen = np.zeros_like(grid, dtype=bool)
    best: list[tuple[int, int]] = []
    rows, cols = grid.shape
    for start in zip(*np.nonzero(grid)):
        if seen[start]:
            continue
        region, queue = [], deque([start])
        seen[start] = True
        while queue:
            r, c = queue.popleft()
            region.append((r, c))
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= nr < rows and 0 <= nc < cols and grid[nr, nc] and not seen[nr, nc]:
                    seen[nr, nc] = True
                    queue.append((nr, nc))
        if len(region) > len(best):
            best = region
    largest = np.zeros_like(grid, dtype=bool)
    for cell in best:
        largest[cell] = True
    return largest


def content_box(keep: torch.Tensor, max_area: float = MAX_AREA, margin: int = MARGIN,
                min_side: int = MIN_SIDE) -> Box | None:
    """The crop of an image's own content: its (L,) bool keep mask (``True``: a content token, L = g x g, rows
    first) -> the box of its largest 4-connected region of content tokens grown by ``margin`` patches, as fractions
    of the image; ``None`` when that box covers ``max_area`` of the image or more, is narrower than ``min_side``
    patches, or no token is kept."""
    count = int(keep.numel())
    side = int(round(count ** 0.5))
    if keep.dim() != 1 or side * side != count:
        raise ShapeError(f"a keep mask must be (L,) over a square token grid, got {tuple(keep.shape)}")
    region = _largest_region(keep.reshape(side, side).cpu().numpy().astype(bool))
    if not region.any():
        return None
    rows, cols = np.nonzero(region)
    top, bottom = max(int(rows.min()) - margin, 0), min(int(rows.max()) + 1 + margin, side)
    left, right = max(int(cols.min()) - margin, 0), min(int(cols.max()) + 1 + margin, side)
    if min(bottom - top, right - left) < min_side or (bottom - top) * (right - left) >= max_area * count:
        return None
    return left / side, top / side, right / side, bottom / side


def content_boxes(ids, keep_of: Callable[[str], torch.Tensor | None], max_area: float = MAX_AREA,
                  margin: int = MARGIN) -> dict[str, Box]:
    """image id -> its content box (:func:`content_box`), for the images of ``ids`` that have one; ``keep_of(id)``
    gives an image's keep mask (``None``: it keeps every token, so it has no crop)."""
    boxes = {}
    for image_id in ids:
        keep = keep_of(image_id)
        box = None if keep is None else content_box(keep, max_area, margin)
        if box is not None:
            boxes[image_id] = box
    return boxes


class CropSource:
    """An image source of crops: ``ids`` are those of the boxes (``boxes``, id -> box), ``load(i)`` cuts box ``ids[i]``
    from the image ``images[image_of[id]]`` (a path or a PIL image, as :class:`~copynce_hf.retrieval.sources.SourceImages`
    gives them); without ``image_of`` a box's id is its image's."""

    def __init__(self, images: Mapping, boxes: Mapping[str, Box], max_pixels: int | None = None,
                 image_of: Mapping[str, str] | None = None):
        self.images, self.boxes = images, dict(boxes)
        self.ids = list(self.boxes)
        self.image_of = dict(image_of) if image_of is not None else {}
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.ids)

    def image_id(self, crop_id: str) -> str:
        """The id of the image a crop is cut from."""
        return self.image_of.get(crop_id, crop_id)

    @property
    def identity(self) -> dict:
        """What the crops are, for scores of them kept on disk: the boxes (and the image each is cut from), the image
        files (:func:`~copynce_hf.retrieval.work_folder.image_stamps`) and the identity of those images' source, if it
        has one."""
        files = getattr(self.images, "files", None) or {}
        source = getattr(getattr(self.images, "source", None), "identity", None)
        found = {"crops of": source, "boxes": digest(self.boxes),
                 "images": image_stamps(files, [self.image_id(crop_id) for crop_id in self.ids])}
        if self.image_of:
            found["cut from"] = digest(self.image_of)
        return found

    def load(self, index: int) -> Image.Image:
        from ...images import load_image

        crop_id = self.ids[index]
        image = self.images[self.image_id(crop_id)]
        image = image.convert("RGB") if isinstance(image, Image.Image) else load_image(image, max_pixels=self.max_pixels)
        left, top, right, bottom = self.boxes[crop_id]
        width, height = image.size
        return image.crop((int(left * width), int(top * height), max(int(left * width) + 1, round(right * width)),
                           max(int(top * height) + 1, round(bottom * height))))


@dataclasses.dataclass(frozen=True)
class CropPair:
    """A pair of images proposed or decided by a crop: ``(a, b)`` in the collection's order, the views of each
    (:data:`VIEW_WHOLE` or :data:`VIEW_CROP`) whose cosine is the pair's best, and that cosine."""

    a: str
    b: str
    view_a: str
    view_b: str
    cosine: float


def nearest_rows(queries: np.ndarray, base: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Inner-product ``k`` nearest rows of ``base`` for each row of ``queries``: (Q, k) cosines and rows."""
    index = faiss.IndexFlatIP(base.shape[1])
    index.add(np.ascontiguousarray(base, dtype=np.float32))
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k, base.shape[0]))


def crop_pairs(whole: DescriptorSet, crops: DescriptorSet, candidates: int, order: Mapping[str, int]
               ) -> list[CropPair]:
    """The pairs a crop decides: each crop's ``candidates`` nearest other images, by its best cosine to their whole
    image or their crop, kept where that cosine is above the two whole images' own (else the whole-image stage
    decides the pair). ``whole``: (N, D) unit descriptors of the whole images; ``crops``: (M, D) of the crops,
    ids those of their images. Pairs in ``order`` (the collection's), sorted."""
    rows = {image_id: i for i, image_id in enumerate(whole.ids)}
    best: dict[tuple[str, str], CropPair] = {}

    def offer(crop_id: str, other: str, other_view: str, cosine: float) -> None:
        if other == crop_id:
            return
        first, second = sorted((crop_id, other), key=order.__getitem__)
        views = (VIEW_CROP, other_view) if first == crop_id else (other_view, VIEW_CROP)
        found = best.get((first, second))
        if found is None or cosine > found.cosine:
            best[(first, second)] = CropPair(first, second, *views, cosine)

    if len(crops):
        for base, ids, view in ((whole.descriptors, whole.ids, VIEW_WHOLE), (crops.descriptors, crops.ids, VIEW_CROP)):
            cosines, found = nearest_rows(crops.descriptors, base, candidates + 1)
            for crop_id, row_cosines, row_found in zip(crops.ids, cosines, found):
                for cosine, row in zip(row_cosines, row_found):
                    if row >= 0:
                        offer(crop_id, ids[row], view, float(cosine))
    kept = []
    for (a, b), pair in best.items():
        if a not in rows or b not in rows:
            continue
        whole_cosine = float(whole.descriptors[rows[a]] @ whole.descriptors[rows[b]])
        if pair.cosine > whole_cosine:
            kept.append(pair)
    return sorted(kept, key=lambda pair: (order[pair.a], order[pair.b]))


def crop_views(pairs: list[tuple[str, str]], whole: DescriptorSet, crops: DescriptorSet) -> list[CropPair | None]:
    """For given pairs ``(a, b)`` (those grouping scores outside the candidates): the :class:`CropPair` of each
    whose best cosine over its views involves a crop and is above the whole images' own, else ``None`` (the
    whole images decide). Descriptors as :func:`crop_pairs`'."""
    rows = {image_id: i for i, image_id in enumerate(whole.ids)}
    crop_rows = {image_id: i for i, image_id in enumerate(crops.ids)}

    def views(image_id: str) -> list[tuple[str, np.ndarray]]:
        found = [(VIEW_WHOLE, whole.descriptors[rows[image_id]])] if image_id in rows else []
        return found + ([(VIEW_CROP, crops.descriptors[crop_rows[image_id]])] if image_id in crop_rows else [])

    decided: list[CropPair | None] = []
    for a, b in pairs:
        options = [(float(first @ second), view_a, view_b) for view_a, first in views(a) for view_b, second in views(b)]
        whole_cosine = max((cosine for cosine, view_a, view_b in options if view_a == view_b == VIEW_WHOLE),
                           default=float("-inf"))
        cropped = [option for option in options if VIEW_CROP in option[1:]]
        best = max(cropped, default=None)
        decided.append(None if best is None or best[0] <= whole_cosine else CropPair(a, b, best[1], best[2], best[0]))
    return decided


#: The header of ``content_crops.csv`` and ``query_crops.csv``: each cropped image's box, as fractions of its width
#: and height.
CROP_COLUMNS = ("image_id", "left", "top", "right", "bottom")


def write_crops(path: str | os.PathLike, result) -> int:
    """Write ``content_crops.csv`` (``dedup``) or ``query_crops.csv`` (``detect``) (:data:`CROP_COLUMNS`): the box of
    each image's content crop (``result.crop_boxes``), in their order; returns the rows written (none: no file, an
    earlier run's removed)."""
    return write_box_rows(path, CROP_COLUMNS, [((image_id,), box) for image_id, box in result.crop_boxes.items()])


def write_box_rows(path: str | os.PathLike, columns: tuple[str, ...], rows: list[tuple[tuple, Box]]) -> int:
    """Write a CSV of boxes: ``columns``, then each row's leading cells and its box (``left, top, right, bottom``,
    fractions, 6 significant digits); returns the rows written. No rows: no file (an earlier run's removed)."""
    if not rows:
        Path(path).unlink(missing_ok=True)
        return 0
    with StagedFile(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for cells, box in rows:
            writer.writerow((*cells, *(f"{value:.6g}" for value in box)))
    return len(rows)
