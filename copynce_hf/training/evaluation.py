"""Periodic evaluation during training: a small copy-detection task scored with the project's muAP.

Images held out of the training set become a miniature DISC21: every held-out image gets one query
(a training-recipe copy with a fixed seed); the first three quarters also give a reference (a
``light``-recipe copy), so the queries of the last quarter are distractors. The descriptor scores
every (query, reference) pair by cosine similarity, the matcher by its copy probability; the
predictions are scored with :func:`copynce_hf.metrics.core.copy_detection_metrics` (muAP, RP90,
recall at rank 1, ...). The task is built once, deterministically, so the numbers are comparable
along the run and between runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..data.collator import PixTraceCollator, normalize_pixel_values
from ..data.loading import ImageDecoder
from ..data.pairs import CopyPairMaker
from ..metrics.core import copy_detection_metrics

__all__ = ["CopyDetectionTask", "build_copy_detection_task", "evaluate_copy_detection"]


@dataclass
class CopyDetectionTask:
    """Pixel tensors of a small copy-detection task.

    Attributes:
        queries: uint8 (Q, 3, S, S) RGB, normalised on the model's device when scored.
        references: uint8 (R, 3, S, S).
        query_ids, reference_ids: ids (``q:<image id>``, ``r:<image id>``).
        ground_truth: ``{query_id: [reference_id]}``; distractor queries map to ``[]``.
        skipped_images: held-out images left out because they could not be read.
    """

    queries: torch.Tensor
    references: torch.Tensor
    query_ids: list[str]
    reference_ids: list[str]
    ground_truth: dict[str, list[str]]
    skipped_images: int = 0
    image_mean: tuple[float, ...] = tuple(IMAGENET_DEFAULT_MEAN)
    image_std: tuple[float, ...] = tuple(IMAGENET_DEFAULT_STD)


def build_copy_detection_task(rows, image_size: int, patch_size: int, seed: int = 12345,
                              query_recipe: str = "training", decoder: ImageDecoder | None = None
                              ) -> CopyDetectionTask | None:
    """Build the task from dataset rows (``image_id`` + undecoded ``image``); ``None`` if < 2 readable.

    ``decoder`` reads the images (its ``skipped`` count grows by the unreadable ones, which the task
    also records in ``skipped_images``).
    """
    maker = CopyPairMaker(image_size, query_recipe=query_recipe, reference_recipe="light")
    decoder = decoder or ImageDecoder(max_side=maker.max_source_side)
    skipped_before = decoder.skipped
    originals = decoder.decode_all(rows)
    if len(originals) < 2:
        return None
    collator = PixTraceCollator(image_size, patch_size)
    num_references = max(1, (3 * len(originals)) // 4)
    queries, references, query_ids, reference_ids, truth = [], [], [], [], {}
    for position, (image_id, image) in enumerate(originals):
        image = maker.source(image)
        query, _, _ = maker.copy(image, query_recipe, seed + position)
        queries.append(query)
        query_id = f"q:{image_id}"
        query_ids.append(query_id)
        truth[query_id] = []
        if position < num_references:
            reference, _, _ = maker.copy(image, "light", seed + 100_003 + position)
            references.append(reference)
            reference_ids.append(f"r:{image_id}")
            truth[query_id] = [f"r:{image_id}"]
    return CopyDetectionTask(collator.stack_images(queries), collator.stack_images(references), query_ids,
                             reference_ids, truth, skipped_images=decoder.skipped - skipped_before,
                             image_mean=collator.image_mean, image_std=collator.image_std)


@torch.inference_mode()
def evaluate_copy_detection(model: torch.nn.Module, task: CopyDetectionTask, model_type: str,
                            batch_size: int = 64) -> dict[str, float]:
    """Score every (query, reference) pair of ``task`` with ``model`` and return the metric's numbers.

    ``model`` is the bare (unwrapped) model; it is put in eval mode and restored afterwards. Called
    under autocast (bf16), the model runs in that precision and the scores are computed in float32.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device

    def on_device(pixels: torch.Tensor) -> torch.Tensor:  # uint8 -> normalised float32, on the device
        return normalize_pixel_values(pixels.to(device), task.image_mean, task.image_std)

    try:
        if model_type == "descriptor":
            def describe(pixels):
                return torch.cat([model(pixel_values=on_device(chunk)).descriptors.float()
                                  for chunk in pixels.split(batch_size)])

            queries, references = describe(task.queries), describe(task.references)
            with torch.autocast(device.type, enabled=False):  # float32 scores, also under autocast
                scores = (queries @ references.T).cpu().numpy()
        else:
            num_q, num_r = len(task.queries), len(task.references)
            query_index = torch.arange(num_q).repeat_interleave(num_r)
            reference_index = torch.arange(num_r).repeat(num_q)
            logits = []
            for start in range(0, len(query_index), batch_size):
                q = on_device(task.queries[query_index[start:start + batch_size]])
                r = on_device(task.references[reference_index[start:start + batch_size]])
                logits.append(model(pixel_values=q, reference_pixel_values=r).logits.float().reshape(-1))
            with torch.autocast(device.type, enabled=False):
                scores = torch.sigmoid(torch.cat(logits)).reshape(num_q, num_r).cpu().numpy()
    finally:
        model.train(was_training)
    query_ids = np.repeat(np.array(task.query_ids, dtype=object), len(task.reference_ids))
    reference_ids = np.tile(np.array(task.reference_ids, dtype=object), len(task.query_ids))
    metrics = copy_detection_metrics(list(query_ids), list(reference_ids), scores.reshape(-1), task.ground_truth)
    return {key: float(value) for key, value in metrics.items() if isinstance(value, (int, float))}
