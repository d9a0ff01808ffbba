"""Local crops ensembling of pairs (supplementary "Local Crops Ensembling"): both images cut into fixed views,
every query view compared with every reference view, the pair scoring its best view combination.

The views are the whole image, a grid of overlapping crops, and for the query also rotations of the whole image.
The paper's 26 query views x 10 reference views are the ``paper`` preset of
:mod:`copynce_hf.retrieval.descriptors.views`; :class:`LocalCrops` is a configurable grid (default 8 x 1 views).
A descriptor scores a view combination by the cosine of its descriptors, a matcher by ``sigmoid(logit)``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset

from ...images import load_image
from ...modeling.configuration_copynce import model_kind
from ...modeling.errors import SKIP_REASONS, ConfigError, ImageLoadError

logger = logging.getLogger(__name__)

_ROTATIONS = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}


def grid_boxes(width: int, height: int, grid: int, crop_scale: float) -> list[tuple[int, int, int, int]]:
    """``grid * grid`` overlapping crop boxes (left, top, right, bottom), row-major.

    Each crop spans ``min(1, crop_scale / grid)`` of the width and of the height; the crops
    are spread evenly from one border to the other, so that they overlap when
    ``crop_scale > 1`` and together cover the image.
    """
    fraction = min(1.0, crop_scale / grid)
    crop_w, crop_h = max(1, round(width * fraction)), max(1, round(height * fraction))
    boxes = []
    for row in range(grid):
        for col in range(grid):
            left = round((width - crop_w) * col / (grid - 1)) if grid > 1 else 0
            top = round((height - crop_h) * row / (grid - 1)) if grid > 1 else 0
            boxes.append((left, top, left + crop_w, top + crop_h))
    return boxes


@dataclass
class LocalCrops:
    """The fixed views of local crops ensembling.

    Attributes:
        query_grid: query crops per side (``query_grid ** 2`` crops; 1 means no crops).
        reference_grid: reference crops per side.
        crop_scale: a grid cell crop spans ``min(1, crop_scale / grid)`` of each side.
        query_rotations: rotations (degrees, multiples of 90) of the whole query added as views.

    Views: query = whole image, grid crops, rotated whole images; reference = whole image
    and grid crops. Defaults: 1 + 4 + 3 = 8 query views against 1 reference view.
    """

    query_grid: int = 2
    reference_grid: int = 1
    crop_scale: float = 1.5
    query_rotations: tuple[int, ...] = (90, 180, 270)

    def __post_init__(self) -> None:
        if self.query_grid < 1 or self.reference_grid < 1:
            raise ConfigError(f"crop grids must be at least 1, got {self.query_grid} and {self.reference_grid}")
        if self.crop_scale <= 0:
            raise ConfigError(f"crop_scale must be positive, got {self.crop_scale}")
        self.query_rotations = tuple(int(angle) % 360 for angle in self.query_rotations)
        unknown = [angle for angle in self.query_rotations if angle not in _ROTATIONS]
        if unknown:
            raise ConfigError(f"query rotations must be 90, 180 or 270 degrees, got {unknown}")

    def _grid(self, image: Image.Image, grid: int) -> list[Image.Image]:
        if grid == 1:
            return []
        return [image.crop(box) for box in grid_boxes(image.width, image.height, grid, self.crop_scale)]

    def query_views(self, image: Image.Image) -> list[Image.Image]:
        rotated = [image.transpose(_ROTATIONS[angle]) for angle in self.query_rotations]
        return [image, *self._grid(image, self.query_grid), *rotated]

    def reference_views(self, image: Image.Image) -> list[Image.Image]:
        return [image, *self._grid(image, self.reference_grid)]


@torch.inference_mode()
def score_views(model, query_views: torch.Tensor, reference_views: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """Copy score of each pair, maximised over all (query view, reference view) combinations.

    Args:
        model: a CopyNCE matcher (score: ``sigmoid(logits)``) or descriptor (score: cosine
            of the descriptors).
        query_views: (P, Vq, 3, H, W) processed query views.
        reference_views: (P, Vr, 3, H, W) processed reference views.
        chunk_size: model inputs per forward pass.

    Returns:
        (P,) float32 scores on the CPU.
    """
    pairs, n_query, n_reference = query_views.shape[0], query_views.shape[1], reference_views.shape[1]
    device = next(model.parameters()).device
    if model_kind(model) == "descriptor":

        def embed(views: torch.Tensor) -> torch.Tensor:
            flat = views.flatten(0, 1)
            parts = [model(pixel_values=flat[i : i + chunk_size].to(device)).descriptors for i in range(0, len(flat), chunk_size)]
            out = torch.nn.functional.normalize(torch.cat(parts).float(), dim=-1)
            return out.view(views.shape[0], views.shape[1], -1)

        # cos(z_q, z_r) for every view combination: (P, Vq, Vr)
        similarity = torch.einsum("pqd,prd->pqr", embed(query_views), embed(reference_views))
        return similarity.flatten(1).max(dim=1).values.cpu()
    # matcher: every query view against every reference view, (P * Vq * Vr) forward rows
    query_rows = query_views.unsqueeze(2).expand(-1, -1, n_reference, -1, -1, -1).flatten(0, 2)
    reference_rows = reference_views.unsqueeze(1).expand(-1, n_query, -1, -1, -1, -1).flatten(0, 2)
    probabilities = []
    for start in range(0, len(query_rows), chunk_size):
        logits = model(
            pixel_values=query_rows[start : start + chunk_size].to(device),
            reference_pixel_values=reference_rows[start : start + chunk_size].to(device),
        ).logits
        probabilities.append(torch.sigmoid(logits.float().view(-1)))
    return torch.cat(probabilities).view(pairs, n_query * n_reference).max(dim=1).values.cpu()


class PairViews(Dataset):
    """Candidate pairs (each a query and a reference image: paths or PIL images) as processed views: item
    ``i`` is pair ``i``.

    Items: ``query_views`` (Vq, 3, H, W), ``reference_views`` (Vr, 3, H, W), ``valid`` (0 when
    an image is unreadable; its views are then black placeholders).
    """

    def __init__(self, pairs: list[tuple], image_processor, local_crops: LocalCrops | None = None,
                 max_pixels: int | None = None):
        self.pairs = pairs
        self.max_pixels = max_pixels
        self.reasons: dict[int, str] = {}
        self.image_processor = image_processor
        self.local_crops = local_crops
        blank = Image.new("RGB", (64, 64))
        self.placeholders = (self._process(self._query_views(blank)), self._process(self._reference_views(blank)))

    def _query_views(self, image: Image.Image) -> list[Image.Image]:
        return self.local_crops.query_views(image) if self.local_crops else [image]

    def _reference_views(self, image: Image.Image) -> list[Image.Image]:
        return self.local_crops.reference_views(image) if self.local_crops else [image]

    def _process(self, views: list[Image.Image]) -> torch.Tensor:
        return self.image_processor(images=views, return_tensors="pt")["pixel_values"]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        query_path, reference_path = self.pairs[index]
        try:
            query_views = self._process(self._query_views(load_image(query_path, max_pixels=self.max_pixels)))
            reference_views = self._process(
                self._reference_views(load_image(reference_path, max_pixels=self.max_pixels))
            )
            valid = 1
        except ImageLoadError as error:
            logger.warning("skipping pair (%s, %s): %s", _name(query_path), _name(reference_path), error)
            reason = error.reason if error.reason in SKIP_REASONS else "unreadable"
            (query_views, reference_views), valid = self.placeholders, -1 - SKIP_REASONS.index(reason)
        return {"query_views": query_views, "reference_views": reference_views, "valid": valid}


def _name(image) -> str:
    """How a log line names an image given as a path or in memory."""
    return Path(image).stem if isinstance(image, (str, os.PathLike)) else "an image in memory"
