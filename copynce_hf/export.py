"""Float16 model folders with research-only cards: the embedded default models and the baseline checkpoint.

:func:`export_model` turns a trained model folder (a benchmark run's, ``python -m benchmarks.training.train``)
into a small folder shipped with the package (``scripts/export_embedded.py`` is its command):

1. it loads the model and image processor with ``AutoModel`` / ``AutoImageProcessor`` in float32
   and checks the model kind (descriptor or matcher);
2. casts the weights to float16 (``model.to(torch.float16)``) and writes them with
   :func:`copynce_hf.hub.save_for_hub` (``save_pretrained`` with safetensors, ``config.json`` recording
   ``dtype: float16``, the modelling code with ``auto_map`` so that the folder also loads with
   ``trust_remote_code=True`` without copynce_hf, ``preprocessor_config.json`` and ``README.md``);
3. writes a model card (:func:`copynce_hf.hub.build_model_card`) whose results are the system's mini-DISC
   numbers read from ``<results_dir>/<system>.json`` (µAP, RP90, recall@1, recall@10) when the quality
   benchmark has produced that file, and whose licence says the weights are for research use only;
4. checks the written folder: total size at most ``max_bytes`` (15 MB), float16 tensors only (integer
   buffers excepted), and ``AutoModel.from_pretrained(folder, dtype=torch.float32)`` reproduces the
   float32 model's outputs on a fixed random batch up to float16 rounding;
5. only then replaces the target folder (written next to it first, then renamed).

:func:`refresh_model` re-saves an exported folder with the current modelling code, keeping its weights and card.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open

from . import hub
from .modeling.errors import ConfigError, CopyNCEError
from .training.ema import SUMMARY_FILE, run_folder_of
from .training.options import command_option
from .training.saving import training_seconds_of

__all__ = ["CARD_METRICS", "MAX_BYTES", "Export", "ExportReport", "card_settings", "card_training_rows", "export_model",
           "read_results",
           "refresh_model", "training_settings"]

#: Largest embedded model folder, in bytes (15 MB each keeps the package small).
MAX_BYTES = 15 * 10**6
#: Largest |output(fp16 weights) - output(fp32 weights)| accepted on the check batch. Descriptors are unit
#: vectors and matcher logits are O(1); float16 keeps about 3 significant digits per weight.
OUTPUT_TOLERANCE = 5e-2

MINI_DISC = "mini-DISC (imagenet-sample: 300 references, 150 edited copies + 100 distractor queries)"
#: ``copy_detection`` metric keys carried into the card (see ``copynce_hf.hub.METRICS``).
CARD_METRICS = ("micro_ap", "recall_at_p90", "recall_at_rank1", "recall_at_rank10", "threshold_at_p90")

LICENSE_NAME = "research-only"
#: The folder's file holding :data:`LICENSE_TEXT` (the card's ``license_link``).
LICENSE_FILE = "LICENSE"
LICENSE_TEXT = """## Licence of the weights

These weights were trained by the copynce_hf authors on the 600 `train`-split images of an ImageNet sample
(one image per ImageNet-1k class): the descriptors from scratch (a run may continue an earlier one), the
matcher starting from the baseline descriptor (trained on the same images). ImageNet images may be used for
non-commercial research only, so **these weights are released for research use only** (card metadata
`license: other`, `license_name: research-only`). The copynce_hf code itself is Apache-2.0. They are small
demonstration models (a 6-block, 192-wide ViT at 112x112, trained on CPU cores and lent GPUs for the steps
and time the card's training rows give), not the paper's models: see BENCHMARKS.md in the repository for
what they achieve.
"""


@dataclasses.dataclass
class Export:
    """One conversion: where from, where to, which kind, and the benchmark system whose numbers go in the card."""

    part: str
    source: Path
    target: Path
    kind: str  # "descriptor" or "matcher"
    system: str  # name of <results-dir>/<system>.json
    model_id: str
    candidates: str | None = None  # matcher: the descriptor system whose top-10 it re-scores
    #: card rows that the run's files cannot give (hardware, batch, training images) or that they give wrongly
    #: for this model: they replace the rows of the same name read by :func:`training_settings` and add the others
    settings: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ExportReport:
    """What :func:`export_model` wrote and measured."""

    target: Path
    kind: str
    total_bytes: int
    weight_bytes: int
    num_parameters: int
    max_output_difference: float
    results: dict | None

    def summary(self) -> str:
        results = self.results or {}
        numbers = ", ".join(f"{key} {results[key]:.4f}" for key in CARD_METRICS if key in results) or "no results"
        return (f"{self.kind} -> {self.target}: {self.total_bytes / 1e6:.2f} MB "
                f"(weights {self.weight_bytes / 1e6:.2f} MB, {self.num_parameters / 1e6:.2f} M parameters), "
                f"fp16 vs fp32 max |diff| {self.max_output_difference:.2e}; card: {numbers}")


# ---------------------------------------------------------------------------------------------- pieces


def load_float32(folder: Path, kind: str):
    """``(model, image_processor)`` of a saved folder, in float32, checked to be a ``kind`` model."""
    from transformers import AutoImageProcessor, AutoModel

    from .modeling.configuration_copynce import model_kind

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} is not a saved model folder (no config.json); has the training run finished?")
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    processor = AutoImageProcessor.from_pretrained(folder)
    if model_kind(model) != kind:
        raise ConfigError(f"{folder} holds a {model_kind(model)}, expected a {kind}")
    return model, processor


def read_results(results_dir: Path, system: str) -> dict | None:
    """The ``metrics`` of ``<results_dir>/<system>.json`` (written by ``python -m benchmarks.quality.systems``), or None."""
    path = Path(results_dir) / f"{system}.json"
    if not path.is_file():
        return None
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))["metrics"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} is not a benchmark result file (no 'metrics'): {error}") from error
    values = {key: float(metrics[key]) for key in CARD_METRICS if metrics.get(key) is not None}
    return values or None


def training_settings(source: Path) -> dict:
    """Card rows from the run's ``training_summary.json`` (written by ``scripts/train.py``), if any.

    ``source`` may be a run's ``without_ema/`` subfolder (the trained weights of a run whose model
    folder holds their moving average): the rows are the run's, and a row says which weights these are.
    """
    settings: dict = {"training data": "600 `train`-split images of the ImageNet sample (research use only)"}
    source, trained_of_averaged = run_folder_of(source)
    path = source / SUMMARY_FILE
    if not path.is_file():  # an exported folder exported again: its card keeps the run's rows
        settings.update(card_training_rows(Path(source) / "README.md"))
    else:
        summary = json.loads(path.read_text(encoding="utf-8"))
        for key, name in (("steps", "optimiser steps"), ("learning_rate", "learning rate"),
                          ("warmup_steps", "warm-up steps"), ("final_train_loss", "final training loss")):
            if summary.get(key) is not None:
                settings[name] = summary[key]
        if summary.get("model_name_or_path"):  # continued training: name the start and its own budget
            start = Path(summary["model_name_or_path"])
            earlier = card_training_rows(start / "README.md")
            budget = ", ".join(f"{earlier[key]} {key}" for key in ("optimiser steps", "training wall time")
                               if key in earlier)
            settings["started from"] = f"`{start}` as saved before this run" + (f" ({budget})" if budget else "")
        elif summary.get("init_from_dino"):
            settings["initialised from"] = f"`{summary['init_from_dino']}`"
        if summary.get("pairs_per_process") and summary.get("num_processes"):
            settings["training pairs seen"] = int(summary["pairs_per_process"]) * int(summary["num_processes"])
        seconds = training_seconds_of(summary, summary.get("wall_seconds"))
        if seconds is not None:
            settings["training wall time"] = f"{float(seconds) / 60:.1f} min"
        if summary.get("mixed_precision") is not None:
            settings["mixed precision"] = {"no": "none (float32)"}.get(summary["mixed_precision"],
                                                                      summary["mixed_precision"])
        if summary.get("ema_decay"):
            settings["weights"] = (f"the trained weights (the run also kept their moving average, decay "
                                   f"{summary['ema_decay']:g}, not these)" if trained_of_averaged else
                                   f"the moving average of the trained weights (decay {summary['ema_decay']:g})")
    run_path = Path(source) / "run.json"  # written by python -m benchmarks.training.train
    if run_path.is_file():
        command = json.loads(run_path.read_text(encoding="utf-8")).get("command", "")
        recipe = command_option(command, "query_recipe") or "training"
        settings["query copy recipe"] = f"`CopyRecipe.{recipe}()`"
        # <driver output-dir>/runs/<run>: the output folder names the budget (BENCHMARKS.md, scaling curve)
        settings["benchmark run"] = f"{Path(source).resolve().parent.parent.name}/{Path(source).name}"
    settings["export"] = "float16 safetensors (`scripts/export_embedded.py`)"
    return settings


def card_settings(export: Export) -> dict:
    """The card's training rows: :func:`training_settings` of the source with ``export.settings`` applied
    (a given row replaces the row of its name in place, a new one goes before the export row)."""
    settings = training_settings(export.source)
    export_row = settings.pop("export")
    settings.update(export.settings)
    settings["export"] = export_row
    return settings


def card_training_rows(card_path: Path) -> dict:
    """The rows of the "Training settings" table of a model card written by :func:`export_model` (except the
    export row, which the new export writes), or ``{}`` when there is no such card."""
    if not card_path.is_file():
        return {}
    text = card_path.read_text(encoding="utf-8")
    if "## Training settings" not in text:
        return {}
    rows = {}
    for line in text.split("## Training settings", 1)[1].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("Setting", "export") and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = cells[1]
    return rows


def build_card(model, export: Export, results: dict | None, settings: dict):
    """The model card: :func:`copynce_hf.hub.build_model_card` plus the research-only licence."""
    entries = None
    if results:
        name = MINI_DISC if export.candidates is None else f"{MINI_DISC}, re-scoring the top-10 of {export.candidates}"
        entries = [{"dataset_name": name, "dataset_type": "mini-disc", "dataset_split": "queries",
                    **results}]
    card = hub.build_model_card(model, model_id=export.model_id, results=entries, training_settings=settings,
                                license="other", license_name=LICENSE_NAME, license_link=LICENSE_FILE)
    if not getattr(model.config, "copynce_weight", 1.0):
        note = ("> **Baseline without CopyNCE.** This checkpoint was trained with `copynce_weight = 0`: the same model, "
                "data, steps and seed as the CopyNCE checkpoint, but only the image-level losses. It exists to "
                "compare against the CopyNCE model.\n\n")
        title_end = card.text.index("\n\n", card.text.index("# ")) + 2
        card.text = card.text[:title_end] + note + card.text[title_end:]
    card.text = card.text.replace("## Limitations", LICENSE_TEXT + "\n## Limitations", 1)
    if LICENSE_TEXT not in card.text:
        card.text += "\n" + LICENSE_TEXT
    hub.validate_model_card(card)
    return card


def check_inputs(model) -> dict[str, torch.Tensor]:
    """A fixed random batch of model inputs (2 images, or 2 pairs for a matcher)."""
    size = int(model.config.image_size)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(4, 3, size, size, generator=generator)
    if "matcher" in model.config.model_type:
        return {"pixel_values": pixels[:2], "reference_pixel_values": pixels[2:]}
    return {"pixel_values": pixels[:2]}


@torch.inference_mode()
def model_outputs(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Descriptors (B, D) or matcher logits (B,), in float32."""
    output = model(**inputs)
    values = output.logits if "matcher" in model.config.model_type else output.descriptors
    return values.float()


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def check_folder(folder: Path, kind: str, reference: torch.Tensor, inputs: dict, max_bytes: int) -> tuple[int, float]:
    """Size, dtype and reload checks of a written folder; returns (total bytes, max output difference)."""
    total = folder_bytes(folder)
    if total > max_bytes:
        raise CopyNCEError(f"the exported {kind} folder {folder} holds {total / 1e6:.2f} MB, above the limit of "
                           f"{max_bytes / 1e6:.2f} MB")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    recorded = config.get("dtype", config.get("torch_dtype"))
    if recorded != "float16":
        raise CopyNCEError(f"{folder}/config.json records dtype {recorded!r}, expected 'float16'")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        for name in weights.keys():
            dtype = weights.get_slice(name).get_dtype()
            if dtype.startswith("F") and dtype != "F16":
                raise CopyNCEError(f"{folder}: tensor {name} is stored as {dtype}, expected F16")
    reloaded, _ = load_float32(folder, kind)
    if next(reloaded.parameters()).dtype != torch.float32:
        raise CopyNCEError(f"{folder} did not load in float32 with dtype=torch.float32")
    difference = float((model_outputs(reloaded, inputs) - reference).abs().max())
    if not math.isfinite(difference) or difference > OUTPUT_TOLERANCE:
        raise CopyNCEError(f"{folder}: the float16 weights change the outputs by {difference:.3g} "
                           f"(> {OUTPUT_TOLERANCE}); refusing the export")
    return total, difference


def export_model(export: Export, results_dir: Path, max_bytes: int = MAX_BYTES) -> ExportReport:
    """Convert ``export.source`` into the float16 model folder ``export.target`` (see the module docstring);
    the card's results come from ``<results_dir>/<export.system>.json`` when that file exists."""
    model, processor = load_float32(export.source, export.kind)
    inputs = check_inputs(model)
    reference = model_outputs(model, inputs)
    results = read_results(results_dir, export.system)
    card = build_card(model, export, results, card_settings(export))
    num_parameters = sum(parameter.numel() for parameter in model.parameters())

    target = Path(export.target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-export-", dir=target.parent))
    try:
        total, difference, weight_bytes = _write_checked(model, processor, card, staging, target, export.kind,
                                                         reference, inputs, max_bytes)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return ExportReport(target, export.kind, total, weight_bytes, num_parameters, difference, results)


def _write_checked(model, processor, card, staging: Path, target: Path, kind: str, reference, inputs, max_bytes):
    """Write the float16 folder (weights, config, modelling code with ``auto_map``, processor, card) into
    ``staging``, check it, and move it to ``target``; returns (total bytes, max difference, weight bytes)."""
    (staging / LICENSE_FILE).write_text(LICENSE_TEXT, encoding="utf-8")  # the card's license_link
    hub.save_for_hub(model.to(torch.float16), staging, image_processor=processor, card=card)
    total, difference = check_folder(staging, kind, reference, inputs, max_bytes)
    weight_bytes = (staging / "model.safetensors").stat().st_size
    staging.chmod(0o755)  # mkdtemp makes it private; the folder is package data
    for path in staging.iterdir():
        path.chmod(0o644)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return total, difference, weight_bytes


def refresh_model(folder: Path, kind: str, max_bytes: int = MAX_BYTES) -> ExportReport:
    """Re-save an exported folder with the current modelling code and layout, keeping its weights and card.

    The folder is loaded, written again in float16 with the
    code and ``auto_map`` of this version, checked like an export, and swapped in place.
    """
    from huggingface_hub import ModelCard

    folder = Path(folder)
    model, processor = load_float32(folder, kind)
    inputs = check_inputs(model)
    reference = model_outputs(model, inputs)
    card = ModelCard.load(folder / "README.md")
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-refresh-", dir=folder.parent))
    try:
        total, difference, weight_bytes = _write_checked(model, processor, card, staging, folder, kind, reference,
                                                         inputs, max_bytes)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    num_parameters = sum(parameter.numel() for parameter in model.parameters())
    return ExportReport(folder, kind, total, weight_bytes, num_parameters, difference, None)
