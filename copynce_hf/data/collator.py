"""Batching copy pairs: pixel tensors, labels and the PixTrace patch overlap priors of both directions.

The collator is the last step of the data pipeline and runs inside the ``DataLoader`` workers (it is
the loader's ``collate_fn``), so the pixel conversion and the overlap priors are computed off the
training process. Its output keys are the keyword arguments of the CopyNCE models' ``forward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..errors import ConfigError
from ..pixtrace import CoordinateTable, pair_overlaps
from ..pixtrace.overlap import REVERSE_PRIORS

__all__ = ["CopyPair", "PixTraceCollator"]


@dataclass
class CopyPair:
    """One training pair: a query copy and a reference copy, both at the model's input size.

    Attributes:
        query, reference: RGB PIL images of size ``(image_size, image_size)``.
        query_table, reference_table: PixTrace tables from each image's pixels to its original
            (``None`` when the image is not traced, e.g. finetuning pairs made by people).
        label: 1 when the query is a copy of the reference's original, 0 for a negative pair.
        query_id, reference_id: ids of the originals the two images were made from.
        skipped_images: unreadable images skipped while making this pair (see ``ImageDecoder``).
        recipes: the replayable edit recipes of the query and the reference (JSON-serialisable).
    """

    query: Image.Image
    reference: Image.Image
    query_table: CoordinateTable | None
    reference_table: CoordinateTable | None
    label: int
    query_id: str = ""
    reference_id: str = ""
    skipped_images: int = 0
    recipes: dict = field(default_factory=dict)


class PixTraceCollator:
    """Turn a list of :class:`CopyPair` into the batch dict the CopyNCE models take.

    Output (``B`` pairs, ``S = image_size``, ``L = (S / patch_size) ** 2``):

    - ``pixel_values`` float32 (B, 3, S, S): queries, ImageNet mean/std normalised like
      ``CopyNCEImageProcessor``;
    - ``reference_pixel_values`` float32 (B, 3, S, S): references;
    - ``labels`` float32 (B,): 1 for copies, 0 for negatives;
    - ``overlap_qr`` float32 (B, L, L): the paper's q-hat from query patches to reference patches,
      ``pair_overlaps(query_table, reference_table, patch_size)[0]``; zero for negative pairs;
    - ``overlap_rq`` float32 (B, L, L): the same from reference patches to query patches (the exact
      inverse, or with ``reverse_prior="scatter"`` the authors' scatter inverse of the query's table,
      see :func:`copynce_hf.pixtrace.overlap.scatter_reverse_overlap`);
    - ``pair_mask`` bool (B,): positive pairs with at least one overlapping patch in both directions
      (the pairs CopyNCE is computed on);
    - ``num_skipped_images`` int64 scalar (only with ``report_skipped=True``): unreadable images
      skipped while making these pairs, so the training process can count what the workers skipped.
    """

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        image_mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
        image_std: Sequence[float] = IMAGENET_DEFAULT_STD,
        compute_overlaps: bool = True,
        report_skipped: bool = True,
        reverse_prior: str = "exact",
    ):
        if image_size % patch_size:
            raise ConfigError(f"image_size={image_size} must be a multiple of patch_size={patch_size}")
        self.image_size = int(image_size)
        self.patch_size = int(patch_size)
        self.num_patches = (self.image_size // self.patch_size) ** 2
        mean = np.asarray(image_mean, dtype=np.float32)
        std = np.asarray(image_std, dtype=np.float32)
        # (x / 255 - mean) / std = x * scale + offset, per channel, on the channels-first array.
        self.scale = (1.0 / (255.0 * std)).reshape(3, 1, 1).astype(np.float32)
        self.offset = (-mean / std).reshape(3, 1, 1).astype(np.float32)
        self.compute_overlaps = compute_overlaps
        self.report_skipped = report_skipped
        if reverse_prior not in REVERSE_PRIORS:
            raise ConfigError(f"reverse_prior={reverse_prior!r} must be one of {REVERSE_PRIORS}")
        self.reverse_prior = reverse_prior

    # ------------------------------------------------------------------ per pair
    def pixels(self, image: Image.Image) -> np.ndarray:
        """float32 (3, S, S): RGB in [0, 1], normalised with the ImageNet mean and std."""
        if image.size != (self.image_size, self.image_size):
            raise ValueError(
                f"pair image is {image.size[0]}x{image.size[1]}, expected {self.image_size}x{self.image_size}"
            )
        array = np.asarray(image.convert("RGB")).transpose(2, 0, 1).astype(np.float32)  # contiguous copy
        array *= self.scale
        array += self.offset
        return array

    def overlaps(self, pair: CopyPair) -> tuple[np.ndarray, np.ndarray]:
        """``(overlap_qr (L, L), overlap_rq (L, L))`` of a pair; zeros for negatives and untraced pairs."""
        if pair.label and self.compute_overlaps and pair.query_table is not None and pair.reference_table is not None:
            return pair_overlaps(pair.query_table, pair.reference_table, self.patch_size, self.reverse_prior)
        zeros = np.zeros((self.num_patches, self.num_patches), dtype=np.float32)
        return zeros, zeros

    # ------------------------------------------------------------------ batch
    def __call__(self, pairs: Sequence[CopyPair]) -> dict[str, torch.Tensor]:
        if not pairs:
            raise ValueError("cannot collate an empty list of pairs")
        queries, references, qr, rq = [], [], [], []
        for pair in pairs:
            queries.append(self.pixels(pair.query))
            references.append(self.pixels(pair.reference))
            overlap_qr, overlap_rq = self.overlaps(pair)
            qr.append(overlap_qr)
            rq.append(overlap_rq)
        overlap_qr = torch.from_numpy(np.stack(qr))
        overlap_rq = torch.from_numpy(np.stack(rq))
        labels = torch.tensor([float(p.label) for p in pairs], dtype=torch.float32)
        # CopyNCE is defined on pairs whose regions correspond in both directions (paper Eq. CopyNCE,
        # symmetric form): a positive pair with no traced overlap (e.g. the query was cropped to an
        # overlay) carries no patch supervision.
        pair_mask = (labels > 0) & (overlap_qr.flatten(1).sum(1) > 0) & (overlap_rq.flatten(1).sum(1) > 0)
        batch = {
            "pixel_values": torch.from_numpy(np.stack(queries)),
            "reference_pixel_values": torch.from_numpy(np.stack(references)),
            "labels": labels,
            "overlap_qr": overlap_qr,
            "overlap_rq": overlap_rq,
            "pair_mask": pair_mask,
        }
        if self.report_skipped:
            batch["num_skipped_images"] = torch.tensor(sum(p.skipped_images for p in pairs), dtype=torch.int64)
        return batch
