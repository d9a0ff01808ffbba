"""The end of a run: the trained model folder(s) (weights, config, code, image processor, model card), uploading
it, and ``training_summary.json``.

The folder is written with :func:`copynce_hf.hub.save_for_hub` (``save_pretrained`` of the model and
the image processor, plus the card as ``README.md``), so it loads with ``AutoModel.from_pretrained`` and
``AutoImageProcessor.from_pretrained`` and can be uploaded as it is. The card records the training
settings of the run and, when the periodic evaluation ran, its copy-detection numbers with the size of
that evaluation, as rows of the training-settings table: a few held-out images are no benchmark, so they
stay out of the card's ``model-index`` (which :func:`copynce_hf.hub.build_model_card` fills only from
evaluations on named benchmark datasets).

The summary records what the run did (steps, pairs, precision, learning rate, skipped images, the last
evaluation, the logged history) and whether all processes ended with the same weights (a checksum of
each process's weights, gathered).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from accelerate import Accelerator

from .. import hub
from ..outputs import StagedFile, StagedFolder
from .checkpoints import TrainingProgress
from .config import TrainingConfig
from .ema import SUMMARY_FILE, WITHOUT_EMA_FOLDER

logger = logging.getLogger(__name__)

__all__ = ["build_summary", "save_run", "save_trained_model", "training_card", "training_seconds_of", "weights_checksum"]

#: Metric keys of the periodic evaluation that go into the card's results.
_CARD_METRICS = ("micro_ap", "recall_at_p90", "recall_at_rank1", "recall_at_rank10", "mean_ap")
#: Counts of the periodic evaluation (``copy_detection`` output keys) that give its size in the card.
_EVALUATION_SIZE = (("num_queries_with_copy", "queries with a copy"), ("num_ground_truth_pairs", "copy pairs"),
                    ("num_predictions", "scored pairs"))


def training_card(model, config, metrics: dict | None, model_id: str, averaged: bool = True):
    """The model card of a run: architecture and objective from the model, settings from ``config``.

    With ``config.ema_decay``, ``averaged`` says whether ``model`` holds the weight average (the run's
    model folder) or the trained weights (its ``without_ema/`` subfolder)."""
    settings = {
        "training script": "`python -m copynce_hf.training` (`scripts/train.py`)",
        "dataset": config.dataset or "bundled sample images (copynce_hf/assets/images)",
        "pairs": f"{config.pair_source} (query recipe {config.query_recipe}, reference recipe {config.reference_recipe})",
        "optimizer": f"AdamW (betas {config.adam_beta1}, {config.adam_beta2}), weight decay {config.weight_decay}",
        "learning rate": f"base {config.learning_rate:g}"
        + (f" x sqrt(batch / {config.lr_reference_batch_size})" if config.scale_learning_rate else "")
        + f", cosine to {config.min_learning_rate:g}",
        "batch size per device": config.per_device_train_batch_size,
        "gradient accumulation": config.gradient_accumulation_steps,
        "steps / epochs": config.max_steps or config.num_train_epochs,
        "gradient clipping": config.max_grad_norm,
        "hard negative mining": config.resolved("hard_negative_mining")
        + (f" (k={config.resolved('hard_negative_k')})" if config.knn_graph else " (no k-NN graph: off)"),
        "mixed precision": config.mixed_precision,
        "weight EMA": "none" if not config.ema_decay else
        f"decay {config.ema_decay:g}, warmed up as min(decay, (1 + n) / (10 + n)) after n updates; "
        + ("these are the averaged weights" if averaged else "these are the trained weights, not their average"),
        "seed": config.seed,
    }
    if metrics:
        values = ", ".join(f"{hub.METRICS[key]} {metrics[key]:.4f}" for key in _CARD_METRICS
                           if metrics.get(key) is not None)
        if values:
            size = ", ".join(f"{int(metrics[key])} {name}" for key, name in _EVALUATION_SIZE if key in metrics)
            settings["periodic evaluation (last)"] = (f"{values} on the held-out training images ({size}); a "
                                                      "sanity check of the run, not a benchmark result")
    base_model = config.init_from_dino if config.init_from_dino and "/" in config.init_from_dino else None
    datasets = [config.dataset] if config.dataset and "/" in config.dataset and not Path(config.dataset).exists() else None
    return hub.build_model_card(model, model_id=model_id, training_settings=settings,
                            datasets=datasets, base_model=base_model)


def save_trained_model(model, processor, config, output_dir, metrics: dict | None = None,
                       push_to_hub: str | None = None, private: bool = False, averaged: bool = True) -> Path:
    """Save the model folder into ``output_dir``; with ``push_to_hub=<repo id>`` also upload it.

    The files are written into a temporary folder beside ``output_dir`` and moved into it when all are
    written, so an interrupted save leaves a previous model of the folder intact. ``averaged``: see
    :func:`training_card`."""
    folder = Path(output_dir)
    card = training_card(model, config, metrics, model_id=push_to_hub or folder.resolve().name, averaged=averaged)
    with StagedFolder(folder) as staging:  # files replace the previous ones only once all are written
        hub.save_for_hub(model, staging, image_processor=processor, card=card)
    if push_to_hub:
        info = hub.push_to_hub(model, push_to_hub, image_processor=processor, card=card, private=private)
        logger.info("uploaded the model to https://huggingface.co/%s (%s)", push_to_hub, getattr(info, "oid", info))
    return folder


def weights_checksum(model: torch.nn.Module) -> torch.Tensor:
    """(2,) float64: sum and sum of squares of every parameter (compared across processes)."""
    with torch.no_grad():
        values = [p.detach().double() for p in model.parameters()]
        return torch.stack([sum(v.sum() for v in values), sum((v * v).sum() for v in values)])


def training_seconds_of(summary: dict, fallback: float | None = None) -> float | None:
    """A run's training time from its summary: ``training_seconds`` (the loop, every session of a resumed
    run; ``None`` where it resumed from a checkpoint that did not count it), or ``fallback`` for a summary
    written before that key existed (e.g. the process's ``wall_seconds``)."""
    return summary["training_seconds"] if "training_seconds" in summary else fallback


def build_summary(config: TrainingConfig, accelerator: Accelerator, model: torch.nn.Module,
                  progress: TrainingProgress, learning_rate: float, warmup_steps: int,
                  scored: dict[str, dict[str, float]], skipped_evaluation_images: int, wall_seconds: float) -> dict:
    """The run's summary (every process calls it: the weights' checksums are gathered)."""
    checksums = accelerator.gather(weights_checksum(accelerator.unwrap_model(model)).to(accelerator.device)[None])
    return {
        "model_type": config.model_type,
        "model_name_or_path": config.model_name_or_path,  # where the weights started (provenance for cards)
        "init_from_dino": None if config.model_name_or_path else config.init_from_dino,
        "freeze_encoder": config.freeze_encoder,  # only the matcher's fusion stage trained
        "seed": config.seed,
        "steps": progress.step,
        "pairs_per_process": progress.micro_batches * config.pairs_per_batch,
        "num_processes": accelerator.num_processes,
        "mixed_precision": config.mixed_precision,
        "learning_rate": learning_rate,
        "warmup_steps": warmup_steps,
        "skipped_images": progress.skipped_images + skipped_evaluation_images,
        "skipped_training_images": progress.skipped_images,
        "skipped_evaluation_images": skipped_evaluation_images,
        "final_train_loss": next((h["train/loss"] for h in reversed(progress.history) if "train/loss" in h), None),
        "eval": scored.get("eval", {}),
        "ema_decay": config.ema_decay,
        "eval_without_ema": scored.get("eval_without_ema"),
        "weights_checksums": checksums.cpu().tolist(),
        "processes_agree": bool(torch.allclose(checksums, checksums[:1].expand_as(checksums), rtol=1e-12, atol=0)),
        "wall_seconds": wall_seconds,  # this process's, from start-up to the end (this session of a resumed run)
        "training_seconds": progress.training_seconds(),  # the loop's, every session of a resumed run
        "history": progress.history,
    }


def save_run(summary: dict, config: TrainingConfig, model: torch.nn.Module, processor, ema=None) -> Path:
    """Save the model folder (the weight average with ``ema``, whose trained weights then go to its
    :data:`WITHOUT_EMA_FOLDER`), add the folders to ``summary`` and write it; main process only."""
    output_dir = Path(config.output_dir)
    if not summary["processes_agree"]:
        logger.error("the processes' weights differ: %s", summary["weights_checksums"])
    folder = save_trained_model(model if ema is None else ema.module, processor, config, output_dir, summary["eval"],
                                push_to_hub=config.push_to_hub, private=config.hub_private_repo)
    summary["model_folder"] = str(folder)
    if ema is not None:  # the trained weights too, to compare with their average
        summary["model_folder_without_ema"] = str(save_trained_model(
            model, processor, config, output_dir / WITHOUT_EMA_FOLDER, summary["eval_without_ema"], averaged=False))
    with StagedFile(output_dir / SUMMARY_FILE) as temporary:
        temporary.write_text(json.dumps(summary, indent=2))
    logger.info("saved the %s to %s (%.0f s)", config.model_type, folder, summary["wall_seconds"])
    return folder
