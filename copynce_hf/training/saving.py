"""Writing the trained model folder (weights, config, code, image processor, model card) and uploading it.

The folder is written with :func:`copynce_hf.hub.save_for_hub` (``save_pretrained`` of the model and
the image processor, plus the card as ``README.md``), so it loads with ``AutoModel.from_pretrained`` and
``AutoImageProcessor.from_pretrained`` and can be uploaded as it is. The card records the training
settings of the run and, when the periodic evaluation ran, its copy-detection numbers with the size of
that evaluation, as rows of the training-settings table: a few held-out images are no benchmark, so they
stay out of the card's ``model-index`` (which :func:`copynce_hf.hub.build_model_card` fills only from
evaluations on named benchmark datasets).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .. import hub
from ..outputs import StagedFolder

logger = logging.getLogger(__name__)

__all__ = ["save_trained_model", "training_card"]

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
