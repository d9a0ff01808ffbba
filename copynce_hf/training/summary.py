"""The end of a run: ``training_summary.json`` and the saved model folder(s).

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

from ..outputs import StagedFile
from .checkpoints import TrainingProgress
from .config import TrainingConfig
from .ema import SUMMARY_FILE, WITHOUT_EMA_FOLDER
from .saving import save_trained_model

logger = logging.getLogger(__name__)

__all__ = ["build_summary", "save_run", "training_seconds_of", "weights_checksum"]


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
