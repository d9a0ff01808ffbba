"""Batching copy pairs: pixel tensors, labels and the PixTrace patch overlap priors of both directions.

The collator is the last step of the data pipeline and runs inside the ``DataLoader`` workers (it is
the loader's ``collate_fn``), so the overlap priors are computed off the training process. The pixels
travel as 8-bit RGB (a quarter of the bytes of float32, one copy per image into a preallocated batch);
they are normalised on the device by :meth:`PixTraceCollator.normalize` (or
:func:`normalize_pixel_values`) in the training step, just before ``model(**batch)``.

A copy whose last edit erases a box with unclipped values (``RandomErasing(values="unclipped")``, the paper
presets: the authors erase their tensor before normalising it, so erased values are not bound to 8 bits) travels
with its box and noise seed (``<pixel key>_erasing``); :meth:`PixTraceCollator.normalize` writes the unclipped
values into the normalised pixels, where the 8-bit image holds them clipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..modeling.errors import ConfigError
from ..pixtrace import CoordinateTable, pair_overlaps
from ..pixtrace.edits import RandomErasing, edit_from_dict, erasing_noise
from ..pixtrace.overlap import REVERSE_PRIORS

__all__ = ["CopyPair", "PIXEL_KEYS", "PixTraceCollator", "normalize_pixel_values", "unclipped_erasing"]

#: Batch keys holding uint8 pixels that :func:`normalize_pixel_values` turns into model inputs.
PIXEL_KEYS = ("pixel_values", "reference_pixel_values")
#: The side of a pair (``CopyPair.edits``) whose image each pixel key holds.
_SIDES = {"pixel_values": "query", "reference_pixel_values": "reference"}
#: Suffix of the batch key holding a pixel key's unclipped erasings: int64 (B, 5) ``(top, left, bottom, right,
#: seed)``, -1 where a copy has none (present only when one has).
ERASING_SUFFIX = "_erasing"


def normalize_pixel_values(
    pixels: torch.Tensor,
    image_mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    image_std: Sequence[float] = IMAGENET_DEFAULT_STD,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """uint8 RGB (B, 3, H, W) -> ``dtype`` (B, 3, H, W): ``(x / 255 - mean) / std`` per channel, on
    ``pixels``' device (what ``CopyNCEImageProcessor`` does on the CPU). Float input is returned as is
    (already normalised)."""
    if pixels.dtype != torch.uint8:
        return pixels
    mean = torch.tensor(image_mean, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(image_std, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    # (x / 255 - mean) / std = x * scale + offset: one fused multiply-add per value.
    scale, offset = 1.0 / (255.0 * std), -mean / std
    return torch.addcmul(offset, pixels.to(torch.float32), scale).to(dtype)


def unclipped_erasing(edits: Sequence[dict], size: int) -> tuple[int, int, int, int, int] | None:
    """``(top, left, bottom, right, seed)`` of the box an ``S x S`` copy's last edit erases with unclipped values
    (``RandomErasing(values="unclipped")``, ``size`` = S), else None. Only a last edit: one before another would
    have been moved or blended by the edits after it."""
    if not edits or edits[-1].get("name") != RandomErasing.name:
        return None
    edit = edit_from_dict(edits[-1])
    if edit.values != "unclipped":
        return None
    left, top, right, bottom = edit.box(size, size)
    return top, left, bottom, right, int(edit.noise_seed)


def _write_erasings(pixels: torch.Tensor, erasings: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> None:
    """Write the unclipped noise of ``erasings`` (B, 5) into the normalised ``pixels`` (B, 3, S, S) in place."""
    mean_t = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    for row, (top, left, bottom, right, seed) in enumerate(erasings.tolist()):
        if seed < 0:
            continue
        noise = torch.from_numpy(erasing_noise(seed, bottom - top, right - left)).to(torch.float32).permute(2, 0, 1)
        values = (noise - mean_t) / std_t  # N(0, 1) on the [0, 1] scale, normalised as the pixels
        pixels[row, :, top:bottom, left:right] = values.to(device=pixels.device, dtype=pixels.dtype)


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
        edits: ``{"query": [...], "reference": [...]}``, the edits each copy was made with (lists of
            ``Edit.to_dict()``, replayable with ``pixtrace.replay``).
    """

    query: Image.Image
    reference: Image.Image
    query_table: CoordinateTable | None
    reference_table: CoordinateTable | None
    label: int
    query_id: str = ""
    reference_id: str = ""
    skipped_images: int = 0
    edits: dict = field(default_factory=dict)


class PixTraceCollator:
    """Turn a list of :class:`CopyPair` into the batch dict the CopyNCE models take (after
    :meth:`normalize`).

    Output (``B`` pairs, ``S = image_size``, ``L = (S / patch_size) ** 2``), the batch contract:

    - ``pixel_values`` **uint8** (B, 3, S, S): the queries' RGB values 0..255, channels first;
    - ``reference_pixel_values`` **uint8** (B, 3, S, S): the references';
    - ``labels`` float32 (B,): 1 for copies, 0 for negatives;
    - ``overlap_qr`` float32 (B, L, L): the paper's q-hat from query patches to reference patches,
      ``pair_overlaps(query_table, reference_table, patch_size)[0]``; zero for negative pairs;
    - ``overlap_rq`` float32 (B, L, L): the same from reference patches to query patches (the exact
      inverse, or with ``reverse_prior="scatter"`` the authors' scatter inverse of the query's table,
      see :func:`copynce_hf.pixtrace.overlap.scatter_reverse_overlap`);
    - ``pair_mask`` bool (B,): positive pairs with at least one overlapping patch in both directions
      (the pairs CopyNCE is computed on);
    - ``num_skipped_images`` int64 scalar (only with ``report_skipped=True``): unreadable images
      skipped while making these pairs, so the training process can count what the workers skipped;
    - ``pixel_values_erasing`` / ``reference_pixel_values_erasing`` int64 (B, 5) (only when a copy of the batch
      ends with an unclipped erasing, :func:`unclipped_erasing`): ``(top, left, bottom, right, seed)``, -1 rows
      for the others; :meth:`normalize` consumes them.

    The models take float pixels normalised with the ImageNet mean and std (``image_mean``,
    ``image_std``), like ``CopyNCEImageProcessor``'s: whoever consumes a batch calls
    ``collator.normalize(batch)`` once it is on its device (the training step does), which turns the
    two uint8 keys into float32 and leaves the rest alone.
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
        self.image_mean = tuple(float(v) for v in image_mean)
        self.image_std = tuple(float(v) for v in image_std)
        self.compute_overlaps = compute_overlaps
        self.report_skipped = report_skipped
        if reverse_prior not in REVERSE_PRIORS:
            raise ConfigError(f"reverse_prior={reverse_prior!r} must be one of {REVERSE_PRIORS}")
        self.reverse_prior = reverse_prior

    # ------------------------------------------------------------------ per pair
    def pixels(self, image: Image.Image) -> np.ndarray:
        """uint8 (S, S, 3) view of a pair image (checked to be ``S x S`` RGB)."""
        if image.size != (self.image_size, self.image_size):
            raise ValueError(
                f"pair image is {image.size[0]}x{image.size[1]}, expected {self.image_size}x{self.image_size}"
            )
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))

    def overlaps(self, pair: CopyPair) -> tuple[np.ndarray, np.ndarray] | None:
        """``(overlap_qr (L, L), overlap_rq (L, L))`` of a pair; ``None`` (zeros) for negatives and untraced pairs."""
        if pair.label and self.compute_overlaps and pair.query_table is not None and pair.reference_table is not None:
            return pair_overlaps(pair.query_table, pair.reference_table, self.patch_size, self.reverse_prior)
        return None

    def stack_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """uint8 (N, 3, S, S): the images copied once each into a preallocated tensor."""
        out = torch.empty((len(images), 3, self.image_size, self.image_size), dtype=torch.uint8)
        channels_last = out.numpy().transpose(0, 2, 3, 1)  # (N, S, S, 3) view of the tensor's memory
        for row, image in enumerate(images):
            channels_last[row] = self.pixels(image)  # one strided copy per image, no temporary
        return out

    # ------------------------------------------------------------------ batch
    def __call__(self, pairs: Sequence[CopyPair]) -> dict[str, torch.Tensor]:
        if not pairs:
            raise ValueError("cannot collate an empty list of pairs")
        size = (len(pairs), self.num_patches, self.num_patches)
        overlap_qr, overlap_rq = torch.zeros(size), torch.zeros(size)
        for row, pair in enumerate(pairs):
            priors = self.overlaps(pair)
            if priors is not None:
                overlap_qr[row] = torch.from_numpy(priors[0])
                overlap_rq[row] = torch.from_numpy(priors[1])
        labels = torch.tensor([float(p.label) for p in pairs], dtype=torch.float32)
        # CopyNCE is defined on pairs whose regions correspond in both directions (paper Eq. CopyNCE,
        # symmetric form): a positive pair with no traced overlap (e.g. the query was cropped to an
        # overlay) carries no patch supervision.
        pair_mask = (labels > 0) & (overlap_qr.flatten(1).sum(1) > 0) & (overlap_rq.flatten(1).sum(1) > 0)
        batch = {
            "pixel_values": self.stack_images([p.query for p in pairs]),
            "reference_pixel_values": self.stack_images([p.reference for p in pairs]),
            "labels": labels,
            "overlap_qr": overlap_qr,
            "overlap_rq": overlap_rq,
            "pair_mask": pair_mask,
        }
        batch.update(self.erasings(pairs))
        if self.report_skipped:
            batch["num_skipped_images"] = torch.tensor(sum(p.skipped_images for p in pairs), dtype=torch.int64)
        return batch

    def erasings(self, pairs: Sequence[CopyPair]) -> dict[str, torch.Tensor]:
        """``{"<pixel key>_erasing": int64 (B, 5)}`` for the pixel keys of which a copy ends with an unclipped
        erasing (:func:`unclipped_erasing`; none in a pair put into a template, whose frame follows its edits)."""
        found = {}
        for key, side in _SIDES.items():
            rows = [None if "templates" in pair.edits else unclipped_erasing(pair.edits.get(side) or [], self.image_size)
                    for pair in pairs]
            if any(row is not None for row in rows):
                found[key + ERASING_SUFFIX] = torch.tensor([row or (-1,) * 5 for row in rows], dtype=torch.int64)
        return found

    def normalize(self, batch: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict:
        """The batch with its uint8 pixel keys normalised (on their device) to ``dtype`` model inputs, and the
        unclipped erasings (``<pixel key>_erasing``, removed from the batch) written into them."""
        out = dict(batch)
        for key in PIXEL_KEYS:
            erasings = out.pop(key + ERASING_SUFFIX, None)
            if key in out:
                out[key] = normalize_pixel_values(out[key], self.image_mean, self.image_std, dtype)
                if erasings is not None:
                    if out[key] is batch[key]:  # float input comes back as it is: write into a copy
                        out[key] = out[key].clone()
                    _write_erasings(out[key], erasings, self.image_mean, self.image_std)
        return out
