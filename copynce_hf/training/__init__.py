"""Pieces of the training loop of ``scripts/train.py``: configuration, optimiser and schedule,
weight EMA, periodic copy-detection evaluation, and saving the trained model with its card."""

from .config import CONFIG_DIR, DEFAULT_CONFIG, TrainingConfig, load_config, parse_overrides
from .ema import WITHOUT_EMA_FOLDER, build_weight_ema, ema_decay_at
from .evaluation import CopyDetectionTask, build_copy_detection_task, evaluate_copy_detection
from .optim import build_optimizer, build_scheduler, warmup_steps_for
from .saving import save_trained_model

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_CONFIG",
    "WITHOUT_EMA_FOLDER",
    "CopyDetectionTask",
    "TrainingConfig",
    "build_copy_detection_task",
    "build_optimizer",
    "build_scheduler",
    "build_weight_ema",
    "ema_decay_at",
    "evaluate_copy_detection",
    "load_config",
    "parse_overrides",
    "save_trained_model",
    "warmup_steps_for",
]
