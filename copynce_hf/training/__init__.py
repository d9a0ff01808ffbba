"""Training a CopyNCE descriptor or matcher with Accelerate (``python -m copynce_hf.training``), by concern:

* :mod:`.config`: every option, its default, help text and checks (:class:`TrainingConfig`);
* :mod:`.options`: the command line (``--config`` YAML and ``--key value`` overrides, ``--help``);
* :mod:`.model`: the model to train (fresh, from DINO or from a saved folder, keeping its weights) and its image
  processor;
* :mod:`.data`: the training pairs of the three dataset modes and the data loader at any point of a run;
* :mod:`.optim`: optimiser and learning-rate schedule; :mod:`.ema`: the weight average;
* :mod:`.checkpoints`: where the run is, atomic checkpoints, finding one to resume from, and an ``output_dir``
  holding an earlier run (continued or replaced only when asked);
* :mod:`.log_window`: the values logged every ``logging_steps``;
* :mod:`.evaluation`: the periodic evaluation on held-out images (systems of :mod:`copynce_hf.evaluation`);
* :mod:`.saving`: the model folder and its card, and ``training_summary.json``;
* :mod:`.run`: the run itself (set-up, the loop, the end) and the command.
"""

from .config import CONFIG_DIR, DEFAULT_CONFIG, TrainingConfig, load_config
from .ema import WITHOUT_EMA_FOLDER, build_weight_ema, ema_decay_at, run_folder_of
from .evaluation import CopyDetectionTask, build_copy_detection_task, evaluate_copy_detection
from .optim import build_optimizer, build_scheduler, warmup_steps_for
from .options import build_parser, parse_args, parse_overrides
from .saving import save_trained_model

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_CONFIG",
    "WITHOUT_EMA_FOLDER",
    "CopyDetectionTask",
    "TrainingConfig",
    "build_copy_detection_task",
    "build_optimizer",
    "build_parser",
    "build_scheduler",
    "build_weight_ema",
    "ema_decay_at",
    "evaluate_copy_detection",
    "load_config",
    "parse_args",
    "parse_overrides",
    "run_folder_of",
    "save_trained_model",
    "warmup_steps_for",
]
