"""Re-scoring candidate pairs with a model, optionally with local crops ensembling.

The descriptor's k-NN gives candidate (query, reference) pairs; the matcher then scores
each pair jointly: the copy probability ``sigmoid(logit)`` (paper section on the matcher,
supplementary "More about Candidates List for Matcher"). A descriptor model can score pairs
too, by the cosine similarity of the two descriptors.

Local crops ensembling (supplementary "Local Crops Ensembling"): both images are cut into
a fixed set of views (the whole image, a grid of overlapping crops, and for the query also
rotations of the whole image); every query view is compared with every reference view and
the pair's score is the maximum (highest copy probability for the matcher, highest cosine
for the descriptor). The paper's 26 query views x 10 reference views are the ``paper`` preset of
:mod:`.views`; :class:`LocalCrops` is a configurable grid (default 8 x 1 views). A matcher always
scores through the encoder-token cache of :mod:`copynce_hf.retrieval.verify.scorer`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from ...images import load_image
from ...modeling.configuration_copynce import model_kind
from ...modeling.errors import SKIP_REASONS, ConfigError, ImageLoadError, PredictionsError
from ..predictions import Prediction
from .chunked_scoring import (
    DEFAULT_CHUNK_SIZE,
    ChunkScorer,
    PairScores,
    score_in_chunks,
    scoring_identity,
)

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


@dataclass
class RescoreResult:
    """Output of :func:`rescore_predictions`: the re-scored pairs and the pairs left out."""

    predictions: list[Prediction]
    skipped: list[tuple[str, str, str]]  # (query_id, reference_id, reason)


def rescore_predictions(
    predictions: list[Prediction],
    model,
    image_processor,
    query_files: dict[str, os.PathLike],
    reference_files: dict[str, os.PathLike],
    batch_size: int = 32,
    num_workers: int = 0,
    local_crops: LocalCrops | None = None,
    progress: bool = True,
    matcher_lce: str = "none",
    max_pixels: int | None = None,
    accelerator=None,
    work_folder: str | os.PathLike | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    log=logger.info,
) -> RescoreResult:
    """Score every candidate pair of ``predictions`` with ``model``; old scores are discarded.

    A matcher scores through :class:`copynce_hf.retrieval.MatcherScorer`: one encoder pass per image
    view, fusion passes batched over view pairs. The pairs are scored in chunks of whole queries
    (:func:`~.chunked_scoring.score_in_chunks`): shared by the processes of ``accelerator``, and kept in
    ``work_folder`` so that the same call after a kill resumes.

    Args:
        predictions: candidate pairs (e.g. from k-NN search).
        model: a CopyNCE matcher or descriptor, see :func:`score_views`.
        image_processor: the model's image processor.
        query_files, reference_files: id -> image (a path or a PIL image).
        batch_size: model inputs (view combinations) per forward pass.
        num_workers: ``DataLoader`` workers that read and process the images.
        local_crops: grid views for local crops ensembling (every query view against every
            reference view); ``None`` compares the whole images, or uses ``matcher_lce``.
        matcher_lce: for a matcher without ``local_crops``: ``none``, ``paper`` (the paper's 35 view
            pairs) or ``all`` (260), see :mod:`copynce_hf.retrieval.descriptors.views`.
        max_pixels: image size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
        accelerator: an ``accelerate.Accelerator`` whose processes share the pairs (call this on every
            process; the model moves to its device); ``None``: this process scores every pair.
        work_folder: where completed chunks are kept and resumed from; ``None``: nowhere.
        chunk_size: pairs per chunk.
        log: receives the line saying how much work is resumed.

    Returns:
        :class:`RescoreResult` (on every process). Pairs whose image id is not in the folders or whose
        image cannot be read are skipped, logged and listed; if every pair is skipped,
        :class:`PredictionsError` is raised.
    """
    kept, skipped = _pairs_with_images(predictions, query_files, reference_files)
    if accelerator is not None:
        model = model.to(accelerator.device)
    if model_kind(model) == "matcher":
        score_chunk = _matcher_chunks(model, image_processor, query_files, reference_files, batch_size, num_workers,
                                      local_crops, matcher_lce, max_pixels)
    else:
        score_chunk = _descriptor_chunks(model, image_processor, query_files, reference_files, batch_size,
                                         num_workers, local_crops, max_pixels)
    pairs = [(p.query_id, p.reference_id) for p in kept]
    identity = None
    if work_folder is not None:
        settings = {"local_crops": dataclasses.asdict(local_crops) if local_crops else None,
                    "matcher_lce": matcher_lce, "max_pixels": max_pixels}
        identity = scoring_identity(model, image_processor, settings, query_files, reference_files, pairs)
    scored = score_in_chunks(pairs, score_chunk, chunk_size, work_folder, identity, accelerator, progress,
                             "re-scoring", log)
    return _rescored(kept, scored, skipped, len(predictions))


def _pairs_with_images(predictions: list[Prediction], query_files: dict, reference_files: dict
                       ) -> tuple[list[Prediction], list[tuple[str, str, str]]]:
    """``(kept, skipped)``: the predictions whose two images are in the folders, and ``(query id, reference id,
    reason)`` for the others; :class:`PredictionsError` if none is kept."""
    kept, skipped = [], []
    for prediction in predictions:
        query_path = query_files.get(prediction.query_id)
        reference_path = reference_files.get(prediction.reference_id)
        if query_path is None or reference_path is None:
            missing = f"query {prediction.query_id!r}" if query_path is None else f"reference {prediction.reference_id!r}"
            skipped.append((prediction.query_id, prediction.reference_id, f"missing: no image file for {missing}"))
            continue
        kept.append(prediction)
    if not kept:
        reasons = "; ".join(reason for *_, reason in skipped[:3])
        raise PredictionsError(f"none of the {len(predictions)} candidate pairs has both images ({reasons}, ...)")
    return kept, skipped


def _rescored(kept: list[Prediction], scored: PairScores, skipped: list[tuple[str, str, str]], total: int
              ) -> RescoreResult:
    """The new scores of ``kept`` (one per row of ``scored``, ``None`` where it could not be scored, which joins
    ``skipped`` with its reason); :class:`PredictionsError` if none of the ``total`` pairs was scored."""
    rescored = []
    for row, (prediction, score) in enumerate(zip(kept, scored.scores)):
        if score is not None:
            rescored.append(Prediction(prediction.query_id, prediction.reference_id, float(score)))
        else:
            skipped.append((prediction.query_id, prediction.reference_id, scored.reasons.get(row, SKIP_REASONS[-1])))
    if skipped:
        logger.warning("skipped %d of %d candidate pairs (missing or unreadable images)", len(skipped), total)
    if not rescored:
        raise PredictionsError(f"none of the {total} candidate pairs could be scored")
    return RescoreResult(rescored, skipped)


def _matcher_chunks(model, image_processor, query_files, reference_files, batch_size, num_workers, local_crops,
                    matcher_lce, max_pixels) -> ChunkScorer:
    """Chunks scored by a matcher through one :class:`~copynce_hf.retrieval.verify.scorer.MatcherScorer` (its token cache lives on
    from chunk to chunk)."""
    from .scorer import MatcherScorer

    views = {}
    if local_crops is not None:
        views = {"query_views": local_crops.query_views, "reference_views": local_crops.reference_views,
                 "view_pairs": lambda nq, nr: [(q, r) for q in range(nq) for r in range(nr)]}
    scorer = MatcherScorer(model, image_processor, lce=matcher_lce, batch_size=batch_size, max_pixels=max_pixels,
                           **views)

    def score_chunk(pairs: list[tuple[str, str]], scored) -> PairScores:
        return PairScores(scorer.score(pairs, query_files, reference_files, num_workers=num_workers, progress=False,
                                       on_scored=scored))

    return score_chunk


def _descriptor_chunks(model, image_processor, query_files, reference_files, batch_size, num_workers, local_crops,
                       max_pixels) -> ChunkScorer:
    """Chunks scored by a descriptor: cosine of the descriptors, the best over the view combinations."""
    model.eval()

    def score_chunk(pairs: list[tuple[str, str]], scored) -> PairScores:
        dataset = PairViews([(query_files[q], reference_files[r]) for q, r in pairs], image_processor, local_crops,
                            max_pixels=max_pixels)
        views_per_pair = dataset.placeholders[0].shape[0] * dataset.placeholders[1].shape[0]
        loader = DataLoader(dataset, batch_size=max(1, batch_size // views_per_pair), num_workers=num_workers,
                            shuffle=False)
        scores, codes = [], []
        for batch in loader:
            scores.extend(score_views(model, batch["query_views"], batch["reference_views"], chunk_size=batch_size).tolist())
            codes.extend(batch["valid"].tolist())
            scored(len(batch["valid"]))
        return PairScores([score if code > 0 else None for score, code in zip(scores, codes)],
                          {row: SKIP_REASONS[-1 - code] for row, code in enumerate(codes) if code <= 0})

    return score_chunk
