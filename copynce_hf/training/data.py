"""The training pairs of a run and the data loader positioned at any point of it (for exact resume).

Three dataset modes, one constructor each, chosen by :func:`build_training_data`:

* :func:`ground_truth_pairs`: DISC21 dev queries with their references (``pair_source: ground_truth``);
* :func:`indexed_copies`: PixTrace copies of the images of an indexed dataset (random access: GHNM
  batches, the matcher's hard-negative pairs), the last ``num_eval_images`` held out;
* :func:`streamed_copies`: PixTrace copies of a streamed dataset (a Hub id), the first
  ``num_eval_images`` held out; the loader's state is checkpointed so a resumed run reads no row twice.

The flow: images (datasets) -> copy pairs (DataLoader workers) -> :class:`PixTraceCollator` (uint8 pixels)
-> :meth:`TrainingData.batches` (on the device, normalised) -> the model.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator

from ..data import (
    CopyPairBatchSampler,
    CopyPairDataset,
    CopyPairMaker,
    FinetuneMixDataset,
    GroundTruthPairDataset,
    ImageDecoder,
    KNNGraph,
    PixTraceCollator,
    StreamingCopyPairDataset,
    TemplateGroups,
    TemplatePairs,
    load_disc21_ground_truth,
    load_image_dataset,
)
from ..modeling.errors import ConfigError
from .checkpoints import TrainingProgress
from .config import TrainingConfig

logger = logging.getLogger(__name__)

__all__ = ["TrainingData", "build_training_data", "ground_truth_pairs", "indexed_copies", "streamed_copies"]

#: Batch keys that are not model inputs.
_NOT_MODEL_INPUTS = ("num_skipped_images",)


@dataclass
class TrainingData:
    """The pairs of a run and how to load them.

    Attributes:
        dataset: a map-style pair dataset (read through ``sampler``) or a streamed one.
        sampler: the batch sampler of a map-style dataset (``None`` when streamed).
        steps_per_epoch: optimiser steps per epoch (``None``: a stream of unknown length).
        eval_rows: dataset rows held out for the periodic evaluation.
        resume_state: a streamed loader's state to continue from (set when resuming, used once).
    """

    config: TrainingConfig
    accelerator: Accelerator
    collator: PixTraceCollator
    dataset: torch.utils.data.Dataset
    sampler: CopyPairBatchSampler | None
    steps_per_epoch: float | None
    eval_rows: list[dict] = field(default_factory=list)
    resume_state: dict | None = None

    @property
    def streaming(self) -> bool:
        return self.sampler is None

    def decoder(self) -> ImageDecoder:
        """An image decoder with the run's size limit (it counts the images it skips)."""
        return _decoder(self.config)

    def loader(self, progress: TrainingProgress, total_micro_batches: int) -> torch.utils.data.DataLoader:
        """A DataLoader that continues from ``progress`` (map-style: global batch index; stream: epoch
        and batches consumed in it)."""
        workers = self.config.dataloader_num_workers
        extra = {"num_workers": workers, "collate_fn": self.collator,
                 "pin_memory": self.accelerator.device.type == "cuda"}
        if workers:
            extra.update(prefetch_factor=4, persistent_workers=False)
        if not self.streaming:
            self.sampler.set_start(progress.micro_batches)
            self.sampler.num_batches = total_micro_batches
            return torch.utils.data.DataLoader(self.dataset, batch_sampler=self.sampler, **extra)
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.dataset.set_epoch(progress.epoch)
        # Workers send their stream state (shard positions, shuffle buffer, negative pool) with the
        # batches on which a checkpoint falls: loader batch c is global micro-batch
        # micro_batches - batch_in_epoch + c, and checkpoints fall on multiples of ``every``.
        interval = None
        if self.config.checkpointing_steps:
            every = self.config.checkpointing_steps * self.config.gradient_accumulation_steps
            interval = math.gcd((progress.batch_in_epoch - progress.micro_batches) % every, every)
        with warnings.catch_warnings():  # torchdata calls torch.set_vital, deprecated in recent torch
            warnings.filterwarnings("ignore", message=".*set_vital.*deprecated")
            loader = StatefulDataLoader(self.dataset, batch_size=self.config.per_device_train_batch_size,
                                        drop_last=True, snapshot_every_n_steps=interval, **extra)
        if self.resume_state is not None:
            loader.load_state_dict(self.resume_state)
            self.resume_state = None
        return loader

    def batches(self, loader, progress: TrainingProgress, total_micro_batches: int
                ) -> Iterator[tuple[dict[str, torch.Tensor], int, float]]:
        """``(model inputs on the device, images skipped, seconds waited for the batch)`` of ``loader``
        until the run has ``total_micro_batches``, or until a streamed epoch ends (``progress`` then
        counts the epoch)."""
        iterator = iter(loader)
        while progress.micro_batches < total_micro_batches:
            started = time.perf_counter()
            batch = next(iterator, None)
            if self.streaming and not self._all_processes_have_a_batch(batch):
                batch = None
            if batch is None:
                if not self.streaming:
                    raise RuntimeError("the pair sampler ended before the planned number of batches")
                progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
                return
            waited = time.perf_counter() - started
            skipped = int(batch.pop("num_skipped_images", torch.tensor(0)))
            inputs = {key: value.to(self.accelerator.device, non_blocking=True) for key, value in batch.items()
                      if key not in _NOT_MODEL_INPUTS}
            yield self.collator.normalize(inputs), skipped, waited  # uint8 pixels -> normalised float32

    def _all_processes_have_a_batch(self, batch) -> bool:
        """A streamed epoch ends for all processes when any of them runs dry (their shards differ in length)."""
        if self.accelerator.num_processes == 1:
            return batch is not None
        alive = torch.tensor([0 if batch is None else 1], device=self.accelerator.device)
        return int(self.accelerator.gather(alive).min()) == 1


# ---------------------------------------------------------------------------------------------- the three modes
def build_training_data(config: TrainingConfig, accelerator: Accelerator, image_size: int,
                        patch_size: int) -> TrainingData:
    """The training data of ``config``: ground-truth pairs, or copies of an indexed or a streamed dataset
    (``streaming: null``: Hub ids stream, local sources are indexed and read lazily)."""
    collator = PixTraceCollator(image_size, patch_size, reverse_prior=config.copynce_reverse_prior)
    maker = CopyPairMaker(image_size, config.query_recipe, config.reference_recipe, config.max_source_side,
                          negative_query_resize_prob=config.negative_query_resize_prob,
                          reference_copy_recipe=config.reference_copy_recipe,
                          copy_to_copy_share=config.copy_to_copy_share)
    if config.pair_source == "ground_truth":
        return ground_truth_pairs(config, accelerator, collator, maker)
    streaming = config.streaming
    if streaming is None:
        streaming = config.dataset is not None and not Path(config.dataset).expanduser().exists()
    if streaming:
        return streamed_copies(config, accelerator, collator, maker)
    return indexed_copies(config, accelerator, collator, maker)


def ground_truth_pairs(config: TrainingConfig, accelerator: Accelerator, collator: PixTraceCollator,
                       maker: CopyPairMaker) -> TrainingData:
    """DISC21 dev queries and their references (``ground_truth``), with ``positive_rate`` copies; with
    ``mix_sampling_rate`` > 0 also copy pairs of that fraction of ``mix_dataset``'s images per epoch
    (:class:`FinetuneMixDataset`, the authors' finetuning)."""
    queries = load_image_dataset(config.dataset, "query")
    references = load_image_dataset(config.dataset, "reference")
    truth = load_disc21_ground_truth(config.ground_truth)
    dataset = GroundTruthPairDataset(queries, references, truth, maker, config.seed,
                                     config.resolved("positive_rate"), decoder=_decoder(config))
    if config.mix_sampling_rate:
        dataset = FinetuneMixDataset(dataset, _mix_training_pairs(config, accelerator, maker.image_size),
                                     config.mix_sampling_rate, seed=config.seed)
    return _map_style(config, accelerator, collator, dataset, len(dataset), knn=None, eval_rows=[])


def _mix_training_pairs(config: TrainingConfig, accelerator: Accelerator, image_size: int) -> CopyPairDataset:
    """Copy pairs of ``mix_dataset`` for :class:`FinetuneMixDataset`: ``mix_query_recipe`` queries, references only
    resized (the authors' ``positive_ref_aug_p`` / ``negative_ref_aug_p`` 0), negatives from ``knn_graph`` with the
    roles of ``negative_roles``."""
    images = load_image_dataset(config.mix_dataset, config.dataset_split, image_column=config.image_column,
                                id_column=config.id_column)
    knn = None
    if config.knn_graph and config.resolved("hard_negative_mining") != "off":
        knn = KNNGraph.load(config.knn_graph).aligned_to(images["image_id"])
    elif accelerator.is_main_process:
        logger.info("mix_dataset without knn_graph (or with hard_negative_mining off): random negatives")
    maker = CopyPairMaker(image_size, config.mix_query_recipe, "off", config.max_source_side,
                          negative_query_resize_prob=config.negative_query_resize_prob)
    return CopyPairDataset(images, maker, seed=config.seed, positive_rate=config.mix_positive_rate, knn=knn,
                           hard_negative_k=config.resolved("hard_negative_k"),
                           hard_negative_prob=config.resolved("hard_negative_prob"), decoder=_decoder(config),
                           other_images=config.other_images, negative_roles=config.negative_roles)


def indexed_copies(config: TrainingConfig, accelerator: Accelerator, collator: PixTraceCollator,
                   maker: CopyPairMaker) -> TrainingData:
    """Copies of an indexed dataset; its last ``num_eval_images`` are held out (at least 2 images train)."""
    images = load_image_dataset(config.dataset, config.dataset_split, image_column=config.image_column,
                                id_column=config.id_column, **_hub_options(config))
    held_out = min(config.num_eval_images, max(0, len(images) - 2))
    eval_rows = []
    if held_out:
        eval_rows = [images[i] for i in range(len(images) - held_out, len(images))]
        images = images.select(range(len(images) - held_out))
    mining = config.resolved("hard_negative_mining")
    knn = None
    if config.knn_graph and mining != "off":
        knn = KNNGraph.load(config.knn_graph).aligned_to(images["image_id"])
    elif mining != "off" and accelerator.is_main_process:
        logger.info("hard_negative_mining null and no knn_graph: random negatives")
    dataset = CopyPairDataset(
        images, maker, seed=config.seed, positive_rate=config.resolved("positive_rate"),
        knn=knn if mining == "pairs" else None, hard_negative_k=config.resolved("hard_negative_k"),
        hard_negative_prob=config.resolved("hard_negative_prob"), decoder=_decoder(config),
        other_images=config.other_images, templates=_template_pairs(config), negative_roles=config.negative_roles)
    return _map_style(config, accelerator, collator, dataset, len(images), knn=knn, eval_rows=eval_rows,
                      template_groups=TemplateGroups(config.template_share, config.template_group_size))


def streamed_copies(config: TrainingConfig, accelerator: Accelerator, collator: PixTraceCollator,
                    maker: CopyPairMaker) -> TrainingData:
    """Copies of a streamed dataset, sharded over the processes; its first ``num_eval_images`` are held out."""
    if config.knn_graph or config.hard_negative_slots:
        raise ConfigError("knn_graph and hard_negative_slots need random access to the images: set streaming false")
    images = load_image_dataset(config.dataset, config.dataset_split, streaming=True,
                                image_column=config.image_column, id_column=config.id_column, **_hub_options(config))
    eval_rows = []
    if config.num_eval_images:
        eval_rows = list(images.take(config.num_eval_images))
        images = images.skip(config.num_eval_images)
    per_process, processes = config.per_device_train_batch_size, accelerator.num_processes
    dataset = StreamingCopyPairDataset(
        images, maker, per_process, seed=config.seed, positive_rate=config.resolved("positive_rate"),
        process_index=accelerator.process_index, num_processes=processes,
        shuffle_buffer_size=config.shuffle_buffer_size, decoder=_decoder(config), other_images=config.other_images,
        template_groups=TemplateGroups(config.template_share, config.template_group_size),
        templates=_template_pairs(config), negative_roles=config.negative_roles)
    splits = getattr(getattr(images, "info", None), "splits", None) or {}
    split = splits.get(config.dataset_split) if hasattr(splits, "get") else None
    num_rows = getattr(split, "num_examples", None)
    steps_per_epoch = num_rows / (per_process * processes * config.gradient_accumulation_steps) if num_rows else None
    return TrainingData(config, accelerator, collator, dataset, sampler=None, steps_per_epoch=steps_per_epoch,
                        eval_rows=eval_rows)


def _map_style(config: TrainingConfig, accelerator: Accelerator, collator: PixTraceCollator, dataset,
               num_rows: int, knn: KNNGraph | None, eval_rows: list[dict],
               template_groups: TemplateGroups | None = None) -> TrainingData:
    """A map-style dataset read through the run's batch sampler (GHNM batches with a graph for the descriptor;
    ``template_groups``: the slots that share a template)."""
    sampler = CopyPairBatchSampler(
        num_rows, config.per_device_train_batch_size, seed=config.seed, num_processes=accelerator.num_processes,
        process_index=accelerator.process_index,
        knn=knn if config.resolved("hard_negative_mining") == "ghnm" else None,
        hard_negative_k=config.resolved("hard_negative_k"), hard_negative_prob=config.resolved("hard_negative_prob"),
        paired_slots=config.hard_negative_slots, template_groups=template_groups)
    return TrainingData(config, accelerator, collator, dataset, sampler=sampler,
                        steps_per_epoch=sampler.batches_per_epoch / config.gradient_accumulation_steps,
                        eval_rows=eval_rows)


def _template_pairs(config: TrainingConfig) -> TemplatePairs | None:
    """How templated slots make their pairs (``None`` without shared-template groups)."""
    if not config.template_share:
        return None
    return TemplatePairs.from_weights(config.template_weights, config.template_reference_prob)


def _decoder(config: TrainingConfig) -> ImageDecoder:
    return ImageDecoder(max_pixels=config.max_image_pixels)


def _hub_options(config: TrainingConfig) -> dict:
    """``load_image_dataset`` keywords for a Hub dataset: configuration, revision, token."""
    return {"config_name": config.dataset_config, "revision": config.dataset_revision, "token": config.dataset_token}
