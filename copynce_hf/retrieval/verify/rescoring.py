"""Re-scoring the candidate pairs of predictions (``copynce match``, the evaluation engine): the pairs whose images
are found scored through :func:`~.pairs.score_pairs`, the others listed with their reason.

The descriptor's k-NN gives candidate (query, reference) pairs; the matcher then scores
each pair jointly: the copy probability ``sigmoid(logit)`` (paper section on the matcher,
supplementary "More about Candidates List for Matcher"). A descriptor model can score pairs
too, by the cosine similarity of the two descriptors; both with local crops ensembling
(:mod:`.local_crops`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ...modeling.errors import SKIP_REASONS, PredictionsError
from ..predictions import Prediction
from ..presets import DEFAULT_FUSION_PRECISION
from .chunked_scoring import DEFAULT_CHUNK_SIZE
from .local_crops import LocalCrops
from .pairs import PairScoring, ScoredPairs, score_pairs

logger = logging.getLogger(__name__)


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
    fusion_precision: str = DEFAULT_FUSION_PRECISION,
) -> RescoreResult:
    """Score every candidate pair of ``predictions`` with ``model`` (:func:`~.pairs.score_pairs`, the one scoring
    path); old scores are discarded.

    Args:
        predictions: candidate pairs (e.g. from k-NN search).
        model: a CopyNCE matcher or descriptor, see :func:`~.local_crops.score_views`.
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
        fusion_precision: the matcher's fusion blocks (:data:`~copynce_hf.retrieval.presets.FUSION_PRECISIONS`).

    Returns:
        :class:`RescoreResult` (on every process). Pairs whose image id is not in the folders or whose
        image cannot be read are skipped, logged and listed; if every pair is skipped,
        :class:`PredictionsError` is raised.
    """
    kept, skipped = _pairs_with_images(predictions, query_files, reference_files)
    scoring = PairScoring(lce=matcher_lce, local_crops=local_crops, batch_size=batch_size, num_workers=num_workers,
                          max_pixels=max_pixels, chunk_size=chunk_size, fusion_precision=fusion_precision)
    scored = score_pairs([(p.query_id, p.reference_id) for p in kept], model, image_processor, query_files,
                         reference_files, scoring, accelerator, work_folder, progress, "re-scoring", log)
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


def _rescored(kept: list[Prediction], scored: ScoredPairs, skipped: list[tuple[str, str, str]], total: int
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
