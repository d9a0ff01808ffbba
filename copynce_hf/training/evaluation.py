"""Periodic evaluation during training: a small copy-detection task scored by the evaluation engine.

Images held out of the training set become a miniature DISC21: every held-out image gets one query
(a training-recipe copy with a fixed seed); the first three quarters also give a reference (an
``off``-recipe copy), so the queries of the last quarter are distractors. The task has the shape of
the engine's tasks (:mod:`copynce_hf.evaluation`: ids, ground truth, image sources), and the engine's
systems score it: a descriptor ranks every reference for every query by cosine similarity
(:class:`~copynce_hf.evaluation.systems.DescriptorSystem`, exact search), a matcher re-scores every
(query, reference) pair with its copy probability (:class:`~copynce_hf.evaluation.systems.MatcherRescoring`);
:func:`~copynce_hf.evaluation.systems.score_predictions` gives muAP, RP90, recall at rank 1, ... The task
is built once, deterministically, so the numbers are comparable along the run and between runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from PIL import Image

from ..data.loading import ImageDecoder
from ..data.pairs import CopyPairMaker
from ..evaluation.systems import DescriptorSystem, MatcherRescoring, score_predictions
from ..modeling.configuration_copynce import model_kind
from ..retrieval import ImageListSource, Prediction
from .checkpoints import TrainingProgress

logger = logging.getLogger(__name__)

__all__ = ["CopyDetectionTask", "PeriodicEvaluation", "build_copy_detection_task", "evaluate_copy_detection"]


@dataclass
class CopyDetectionTask:
    """A small copy-detection task held in memory, in the form of the evaluation engine's tasks.

    Attributes:
        query_ids, reference_ids: ids (``q:<image id>``, ``r:<image id>``).
        queries, references: the edited copies, RGB PIL images of the model's size, in id order.
        ground_truth: ``{query_id: [reference_id]}``; distractor queries map to ``[]``.
        skipped_images: held-out images left out because they could not be read.
    """

    query_ids: list[str]
    reference_ids: list[str]
    queries: list[Image.Image]
    references: list[Image.Image]
    ground_truth: dict[str, list[str]]
    skipped_images: int = 0

    def query_source(self) -> ImageListSource:
        return ImageListSource(self.query_ids, self.queries)

    def reference_source(self) -> ImageListSource:
        return ImageListSource(self.reference_ids, self.references)

    @property
    def query_files(self) -> dict[str, Image.Image]:
        """Query id -> image (what the engine's matcher reads)."""
        return dict(zip(self.query_ids, self.queries))

    @property
    def reference_files(self) -> dict[str, Image.Image]:
        """Reference id -> image."""
        return dict(zip(self.reference_ids, self.references))

    def all_pairs(self) -> list[Prediction]:
        """Every (query, reference) pair, unscored: the candidates a matcher re-scores."""
        return [Prediction(q, r, 0.0) for q in self.query_ids for r in self.reference_ids]


def build_copy_detection_task(rows, image_size: int, seed: int = 12345, query_recipe: str = "training",
                              decoder: ImageDecoder | None = None) -> CopyDetectionTask | None:
    """Build the task from dataset rows (``image_id`` + undecoded ``image``); ``None`` if < 2 readable.

    ``decoder`` reads the images (its ``skipped`` count grows by the unreadable ones, which the task
    also records in ``skipped_images``).
    """
    maker = CopyPairMaker(image_size, query_recipe=query_recipe, reference_recipe="off")
    decoder = decoder or ImageDecoder(max_side=maker.max_source_side)
    skipped_before = decoder.skipped
    originals = decoder.decode_all(rows)
    if len(originals) < 2:
        return None
    num_references = max(1, (3 * len(originals)) // 4)
    task = CopyDetectionTask([], [], [], [], {}, skipped_images=decoder.skipped - skipped_before)
    for position, (image_id, image) in enumerate(originals):
        image = maker.source(image)
        query, _, _ = maker.copy(image, query_recipe, seed + position)
        query_id = f"q:{image_id}"
        task.query_ids.append(query_id)
        task.queries.append(query)
        task.ground_truth[query_id] = []
        if position < num_references:
            reference, _, _ = maker.copy(image, "off", seed + 100_003 + position)
            task.reference_ids.append(f"r:{image_id}")
            task.references.append(reference)
            task.ground_truth[query_id] = [f"r:{image_id}"]
    return task


def evaluate_copy_detection(model, image_processor, task: CopyDetectionTask, accelerator=None,
                            batch_size: int = 64) -> dict[str, float]:
    """Score every (query, reference) pair of ``task`` with ``model`` and return the metric's numbers.

    ``model`` is the bare (unwrapped) descriptor or matcher; it is put in eval mode and restored
    afterwards. ``accelerator``: the run's (a descriptor's images are then embedded in shards by all
    processes, each getting every descriptor); call it on every process. Under autocast (bf16) the
    model runs in that precision; scores are float32.
    """
    was_training = model.training
    try:
        if model_kind(model) == "descriptor":
            system = DescriptorSystem("training", model, image_processor, batch_size, accelerator=accelerator)
            predictions = system.predict(task, k=len(task.reference_ids)).predictions
        else:
            rescoring = MatcherRescoring("training", model, image_processor, batch_size)
            predictions = rescoring.rescore(task.all_pairs(), task.query_files, task.reference_files).predictions
    finally:
        model.train(was_training)
    metrics, _curve = score_predictions(predictions, task.ground_truth)
    return {key: float(value) for key, value in metrics.items() if isinstance(value, (int, float))}


class PeriodicEvaluation:
    """The run's evaluation on its held-out images, called every ``eval_steps`` and at the end.

    Scores the weights the run saves: the trained weights, or with a weight average (``ema``) the average
    as ``"eval"`` and the trained weights as ``"eval_without_ema"``; both in the run's precision. Every
    process calls it; the main process logs the numbers (trackers, history, one line each).
    """

    def __init__(self, accelerator, model, image_processor, ema, task: CopyDetectionTask | None,
                 progress: TrainingProgress):
        self.accelerator, self.model, self.image_processor = accelerator, model, image_processor
        self.ema, self.task, self.progress = ema, task, progress

    def __call__(self) -> dict[str, dict[str, float]]:
        """``{"eval": metrics[, "eval_without_ema": metrics]}``; empty without a task (too few held-out images)."""
        accelerator, scored = self.accelerator, {}
        if self.task is not None:
            with accelerator.autocast():
                trained = accelerator.unwrap_model(self.model)
                scored["eval"] = evaluate_copy_detection(trained, self.image_processor, self.task, accelerator)
                if self.ema is not None:
                    scored["eval_without_ema"] = scored.pop("eval")
                    scored["eval"] = evaluate_copy_detection(self.ema.module, self.image_processor, self.task,
                                                             accelerator)
            if accelerator.is_main_process:
                self._log(scored)
        accelerator.wait_for_everyone()
        return scored

    def _log(self, scored: dict[str, dict[str, float]]) -> None:
        step = self.progress.step
        values = {f"{prefix}/{k}": v for prefix, metrics in scored.items() for k, v in metrics.items()}
        self.accelerator.log(values, step=step)
        for prefix, metrics in scored.items():
            logger.info("step %d %s: muAP %.4f, RP90 %.4f, recall@1 %.4f", step, prefix.replace("_", " "),
                        metrics["micro_ap"], metrics["recall_at_p90"], metrics["recall_at_rank1"])
        self.progress.history.append({"step": step, **values})
