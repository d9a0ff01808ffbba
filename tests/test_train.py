"""Tests of scripts/train.py and copynce_hf.training: configuration checks, tiny runs, resume, 2 processes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_VIT, launch_two_cpu_processes, shrunk_asset_images, tiny_model_options
from PIL import Image
from safetensors.torch import load_file

from copynce_hf import CopyNCEMatcherModel
from copynce_hf.data.knn_features import load_feature_model
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.training import TrainingConfig, load_config, parse_overrides

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"copynce_script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def train_script():
    return _load_script("train")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; each in-process run starts from a clean state."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A dozen small natural images (the bundled ones shrunk to 80 px) in a folder."""
    return shrunk_asset_images(tmp_path_factory.mktemp("images"), 80)


def _tiny(images, output_dir, *extra, config="tiny_cpu.yaml") -> list[str]:
    head = ["--model.descriptor_dim", "32"] if config == "tiny_cpu.yaml" else ["--model.num_fusion_layers", "1"]
    return [
        "--config", str(CONFIGS / config), "--dataset", str(images), "--output_dir", str(output_dir),
        *tiny_model_options(), *head,
        "--dataloader_num_workers", "0", "--num_eval_images", "4", "--per_device_train_batch_size", "8",
        "--report_to", "none", "--logging_steps", "1", "--eval_steps", "1000", *extra,
    ]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


# ---------------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    # The finetuning configs need the user's DISC21 dev ground truth (a required key left null).
    needs = {"ground_truth": "dev_ground_truth.csv", "dataset": "disc21"} if "finetune" in path.name else {}
    if yaml.safe_load(path.read_text()).get("mix_sampling_rate"):  # the authors' mix also needs training images
        needs["mix_dataset"] = "disc21"
    if needs:
        with pytest.raises(ConfigError, match="ground_truth"):
            load_config(path)
    # The paper configs mine hard negatives and need the user's k-NN graph (a required key left null).
    if yaml.safe_load(path.read_text()).get("hard_negative_mining") in ("ghnm", "pairs") and not needs:
        if not yaml.safe_load(path.read_text()).get("knn_graph"):
            with pytest.raises(ConfigError, match="knn_graph"):
                load_config(path)
            needs = {"knn_graph": "knn.safetensors"}
    config = load_config(path, needs)
    assert config.model_type in ("descriptor", "matcher")
    assert config.model.get("image_size", 224) % config.model.get("patch_size", 16) == 0


def test_paper_settings_in_configs():
    descriptor = load_config(CONFIGS / "descriptor_vits16_224.yaml", {"knn_graph": "knn.safetensors"})
    matcher = load_config(CONFIGS / "matcher_vits16_224.yaml", {"knn_graph": "knn.safetensors"})
    assert (descriptor.learning_rate, matcher.learning_rate) == (6e-4, 1e-3)
    # the authors' knns[:, 1:8] and [:, 1:128] (the paper says 8 and 128; tests/test_authors_training.py)
    assert (descriptor.resolved("hard_negative_k"), matcher.resolved("hard_negative_k")) == (7, 127)
    assert (descriptor.resolved("positive_rate"), matcher.resolved("positive_rate")) == (1.0, 0.3)
    assert descriptor.weight_decay == matcher.weight_decay == 0.04 and descriptor.max_grad_norm == 3.0
    # lr = base * sqrt(batch / 1024): 8 GPUs x 96 for the descriptor.
    assert descriptor.effective_learning_rate(8) == pytest.approx(6e-4 * (768 / 1024) ** 0.5)
    assert load_config(CONFIGS / "matcher_vits16_336.yaml", {"knn_graph": "k.safetensors"}).model["image_size"] == 336


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["--learnig_rate", "1e-3"], "learnig_rate"),
        (["--learning_rate", "-0.1"], "learning_rate"),
        (["--model.image_size", "50"], "image_size"),
        (["--model_type", "classifier"], "model_type"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
        (["--max_steps", "ten"], "max_steps"),
        (["--positive_rate", "2"], "positive_rate"),
        (["--positive_rate", "0.3"], "positive_rate"),  # the descriptor trains on copy pairs only
        (["--hard_negative_mining", "pairs"], "hard_negative_mining"),
        (["--max_source_side", "16"], "max_source_side"),
        (["--ema_decay", "1"], "ema_decay"),
        (["--ema_decay", "0"], "ema_decay"),
        (["--freeze_encoder", "true"], "freeze_encoder"),  # tiny_cpu.yaml trains a descriptor
    ],
)
def test_bad_values_stop_at_start_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIGS / "tiny_cpu.yaml", parse_overrides(overrides))


def test_exponent_floats_are_numbers_in_files_and_on_the_command_line(tmp_path):
    # PyYAML alone reads 1e-4 (no dot) as a string; configurations mean a number.
    path = tmp_path / "config.yaml"
    path.write_text("learning_rate: 1e-4\nmin_learning_rate: 2.0e-6\nmodel:\n  copynce_temperature: 6.25E-2\n")
    config = load_config(path, parse_overrides(["--weight_decay", "4e-2", "--push_to_hub", "1e5"]))
    assert config.learning_rate == 1e-4 and config.min_learning_rate == 2e-6 and config.weight_decay == 0.04
    assert config.model["copynce_temperature"] == 0.0625
    assert config.push_to_hub == "1e5"  # a string option keeps the text


def test_bad_values_stop_the_script_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--learning_rate", "-1", "--output_dir", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(REPO / "scripts" / "train.py"), run_name="__main__")
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("error: invalid configuration value learning_rate=-1") and "Traceback" not in message
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("config", ["descriptor_vits16_224.yaml", "matcher_vits16_224.yaml"])
def test_paper_configs_refuse_hard_negative_mining_without_a_knn_graph(config, tmp_path, monkeypatch, capsys):
    # The dataset does not exist: the run must stop on the configuration, before reading any data.
    monkeypatch.setattr(sys, "argv", ["train.py", "--config", str(CONFIGS / config), "--dataset",
                                      str(tmp_path / "missing"), "--output_dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(REPO / "scripts" / "train.py"), run_name="__main__")
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("error: invalid configuration value knn_graph=None") and "Traceback" not in message
    assert not (tmp_path / "out").exists()
    # Random negatives stay available explicitly.
    assert load_config(CONFIGS / config, {"hard_negative_mining": None}).knn_graph is None


def test_unknown_model_key_is_named(train_script, tmp_path, images):
    with pytest.raises(ConfigError, match="model.hiden_size"):
        train_script.main(_tiny(images, tmp_path, "--model.hiden_size", "32", "--max_steps", "1"))


def test_help_lists_every_option_with_its_type_default_and_help(capsys):
    from copynce_hf.training.run import cli

    with pytest.raises(SystemExit) as stopped:
        cli(["--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    fields = dataclasses.fields(TrainingConfig)
    assert all(field.metadata.get("help") for field in fields)
    for field in fields:
        assert f"--{field.name} " in text, field.name
        assert " ".join(field.metadata["help"].split()) in text, field.name
    for option, metavar in [("max_steps", "INT|null"), ("learning_rate", "FLOAT"), ("dataset", "STR|null"),
                            ("streaming", "[BOOL|null]"), ("model", "MAPPING")]:
        assert f"--{option} {metavar}" in text
    assert "(default: 0.0006)" in text and "--model.<key> value" in text


def test_command_line_forms_and_mistakes_named():
    overrides = parse_overrides(["--learning-rate", "1e-4", "--max_steps=7", "--streaming", "--warmup_steps", "null",
                                 "--model.hidden_size", "32", "--model.copynce_weight=-0.5", "--dataset", "2024"])
    assert overrides == {"learning_rate": 1e-4, "max_steps": 7, "streaming": True, "warmup_steps": None,
                         "dataset": "2024", "model": {"hidden_size": 32, "copynce_weight": -0.5}}
    for arguments, named in [(["--max_steps"], "--max_steps"), (["--dataset.name", "x"], "'dataset.name'"),
                             (["stray"], "'stray'"), (["--seed", "[1,"], "cannot parse --seed"),
                             (["--config", "a.yaml"], "--config")]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            parse_overrides(arguments)
    from copynce_hf.training import parse_args

    assert parse_args(["--config", "tiny_cpu_matcher.yaml", "--max_steps", "3"]).max_steps == 3  # a shipped name


def test_default_config_is_the_tiny_cpu_run():
    config = load_config(CONFIGS / "tiny_cpu.yaml")
    assert isinstance(config, TrainingConfig) and config.dataset is None and config.max_steps <= 400


# ---------------------------------------------------------------------------------------------- runs
def test_tiny_run_decreases_loss_and_saves_a_loadable_model(train_script, tmp_path, images):
    from transformers import AutoImageProcessor, AutoModel

    import copynce_hf  # noqa: F401  (Auto registration)

    output = tmp_path / "run"
    # Light (resize-only) queries keep the run short and its loss curve smooth enough to test; the
    # heavy recipe is exercised by the other runs and by the default run.
    summary = train_script.main(_tiny(images, output, "--max_steps", "30", "--warmup_steps", "3",
                                      "--query_recipe", "off", "--report_to", "tensorboard", "--eval_steps", "15"))
    losses = [h["train/loss"] for h in summary["history"] if "train/loss" in h]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first * 0.8, (first, last)
    assert 0.0 <= summary["eval"]["micro_ap"] <= 1.0 and summary["steps"] == 30
    assert summary["seed"] == 0  # tiny_cpu.yaml's seed, recorded beside the run's numbers
    assert any((output / "logs").rglob("events.out.tfevents*"))
    model = AutoModel.from_pretrained(output)
    assert type(model).__name__ == "CopyNCEDescriptorModel" and model.config.hidden_size == 32
    processor = AutoImageProcessor.from_pretrained(output)
    pixels = processor(Image.open(next(images.glob("*.jpg"))), return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, 32, 32)
    with torch.no_grad():
        descriptor = model.eval()(pixel_values=pixels).descriptors
    assert descriptor.shape == (1, 32) and torch.allclose(descriptor.norm(dim=-1), torch.ones(1), atol=1e-5)


def test_resume_after_interruption_reproduces_the_uninterrupted_run(train_script, tmp_path, images):
    full = tmp_path / "full"
    train_script.main(_tiny(images, full, "--max_steps", "12", "--checkpointing_steps", "5",
                            "--checkpoints_total_limit", "5", "--warmup_steps", "3"))
    # A run killed during step 6..9 leaves its step-5 checkpoint on disk: resume from there.
    killed = tmp_path / "killed"
    (killed / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000005", killed / "checkpoints" / "step_00000005")
    summary = train_script.main(_tiny(images, killed, "--max_steps", "12", "--checkpointing_steps", "5",
                                      "--warmup_steps", "3", "--resume", "latest"))
    expected, resumed = _weights(full), _weights(killed)
    assert expected.keys() == resumed.keys()
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=0, atol=1e-6, msg=name)
    full_losses = {h["step"]: h["train/loss"] for h in json.loads((full / "training_summary.json").read_text())
                   ["history"] if "train/loss" in h}
    for h in summary["history"]:
        if "train/loss" in h and h["step"] > 5:
            assert h["train/loss"] == pytest.approx(full_losses[h["step"]], abs=1e-5)
    # the resumed run's training time counts the first session's loop up to its checkpoint as well
    full_summary = json.loads((full / "training_summary.json").read_text())
    assert 0 < full_summary["training_seconds"] <= full_summary["wall_seconds"]
    assert summary["training_seconds"] > 0


def test_training_time_adds_up_over_sessions_and_is_unknown_after_an_older_checkpoint():
    from copynce_hf.training.checkpoints import TrainingProgress

    first = TrainingProgress()
    first.start_segment()
    state = first.state_dict()
    state["training_seconds"] = 100.0  # a first session that trained for 100 s before its checkpoint
    second = TrainingProgress()
    second.load_state_dict(state)
    second.start_segment()
    assert 100.0 <= second.training_seconds() < 110.0 and second.state_dict()["training_seconds"] >= 100.0
    older = {key: value for key, value in state.items() if key != "training_seconds"}
    third = TrainingProgress()
    third.load_state_dict(older)
    assert third.training_seconds() is None and third.step == state["step"]


def test_weight_ema_is_the_warmed_up_average_of_the_steps_and_survives_resume(train_script, tmp_path, images):
    from copynce_hf.training import ema_decay_at, run_folder_of

    decay, steps = 0.3, 5
    run = tmp_path / "ema"  # bf16 autocast: the average's evaluation runs under it too
    summary = train_script.main(_tiny(images, run, "--max_steps", str(steps), "--warmup_steps", "1", "--ema_decay",
                                      str(decay), "--mixed_precision", "bf16", "--checkpointing_steps", "1", "--checkpoints_total_limit", "10",
                                      "--eval_steps", "2"))
    # The average by hand, from the trained weights each checkpoint holds (step 1 is copied as it is).
    trained = [_weights(run / "checkpoints" / f"step_{step:08d}") for step in range(1, steps + 1)]
    expected = dict(trained[0])
    for updates, weights in enumerate(trained[1:], start=1):
        d = ema_decay_at(decay, updates)
        for name, value in weights.items():
            expected[name] = d * expected[name] + (1 - d) * value if value.is_floating_point() else value
    averaged, without = _weights(run), _weights(run / "without_ema")
    assert averaged.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(averaged[name], expected[name], rtol=0, atol=1e-6, msg=name)
        torch.testing.assert_close(without[name], trained[-1][name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(averaged[n], without[n]) for n in averaged)
    # Both sets of weights are scored, at every evaluation; the cards say which weights they hold.
    assert summary["eval"] and summary["eval_without_ema"] and summary["ema_decay"] == decay
    assert any("eval_without_ema/micro_ap" in h and "eval/micro_ap" in h for h in summary["history"] if h["step"] == 2)
    assert "these are the averaged weights" in (run / "README.md").read_text()
    assert "not their average" in (run / "without_ema" / "README.md").read_text()
    assert run_folder_of(run / "without_ema") == (run, True) and run_folder_of(run) == (run, False)
    # A run resumed from step 3 restores the average and its update count with the checkpoint.
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_00000003", resumed / "checkpoints" / "step_00000003")
    train_script.main(_tiny(images, resumed, "--max_steps", str(steps), "--warmup_steps", "1", "--ema_decay",
                            str(decay), "--mixed_precision", "bf16", "--checkpointing_steps", "1", "--resume", "latest"))
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, averaged[name], rtol=0, atol=1e-6, msg=name)



def test_the_run_of_a_without_ema_folder_is_its_parent_when_the_parent_holds_the_summary(tmp_path):
    """``run_folder_of``: where the summary describing a model folder's weights lives (the export card and the
    scaling table's continued rows both read it)."""
    from copynce_hf.training import WITHOUT_EMA_FOLDER, run_folder_of

    run = tmp_path / "run"
    (run / WITHOUT_EMA_FOLDER).mkdir(parents=True)
    assert run_folder_of(run / WITHOUT_EMA_FOLDER) == (run / WITHOUT_EMA_FOLDER, False)  # no run summary beside it
    (run / "training_summary.json").write_text("{}")
    assert run_folder_of(str(run / WITHOUT_EMA_FOLDER)) == (run, True)
    assert run_folder_of(run) == (run, False)
    (tmp_path / "exported").mkdir()  # a folder of another name keeps its own summary, if any
    assert run_folder_of(tmp_path / "exported") == (tmp_path / "exported", False)

def test_matcher_tiny_run(train_script, tmp_path, images):
    output = tmp_path / "matcher"
    summary = train_script.main(_tiny(images, output, "--max_steps", "4", config="tiny_cpu_matcher.yaml"))
    parts = [h for h in summary["history"] if "train/bce_loss" in h]
    assert parts and all(h["train/loss"] >= h["train/bce_loss"] for h in parts)
    assert json.loads((output / "config.json").read_text())["model_type"] == "copynce-matcher"


def test_a_matcher_continued_with_a_frozen_encoder_changes_only_its_fusion_stage(train_script, tmp_path, images):
    start = tmp_path / "start"
    train_script.main(_tiny(images, start, "--max_steps", "1", config="tiny_cpu_matcher.yaml"))
    output = tmp_path / "frozen"
    summary = train_script.main(_tiny(images, output, "--max_steps", "2", "--model_name_or_path", str(start),
                                      "--freeze_encoder", "true", "--learning_rate", "1e-2",
                                      config="tiny_cpu_matcher.yaml"))
    assert summary["freeze_encoder"] is True
    encoder_layers = CopyNCEMatcherModel.from_pretrained(start).config.num_encoder_layers
    encoder = ("vit.embeddings.",) + tuple(f"vit.blocks.{i}." for i in range(encoder_layers))
    before, after = _weights(start), _weights(output)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and not {name for name in changed if name.startswith(encoder)}, sorted(changed)
    assert any(name.startswith(f"vit.blocks.{encoder_layers}.") for name in changed)  # the first fusion block
    assert "classifier.weight" in changed


def test_continued_training_from_a_float16_folder_trains_float32_weights_in_bf16(train_script, tmp_path, images):
    # The embedded models are stored in float16; a run starting from one keeps float32 master weights
    # (a float16 model failed at its first bf16-autocast forward on the CPU).
    first = tmp_path / "first"
    train_script.main(_tiny(images, first, "--max_steps", "2", "--mixed_precision", "bf16",
                            config="tiny_cpu_matcher.yaml"))
    stored = tmp_path / "float16"
    CopyNCEMatcherModel.from_pretrained(first).half().save_pretrained(stored)
    assert {t.dtype for t in _weights(stored).values()} == {torch.float16}
    output = tmp_path / "continued"
    summary = train_script.main(_tiny(images, output, "--max_steps", "2", "--model_name_or_path", str(stored),
                                      "--mixed_precision", "bf16", config="tiny_cpu_matcher.yaml"))
    assert summary["model_name_or_path"] == str(stored) and summary["init_from_dino"] is None
    continued = _weights(output)
    assert {t.dtype for t in continued.values()} == {torch.float32}
    start = _weights(stored)
    assert any(not torch.equal(continued[k], start[k].float()) for k in start)


def test_wall_time_budget_stops_early_and_still_saves(train_script, tmp_path, images):
    output = tmp_path / "budget"
    summary = train_script.main(_tiny(images, output, "--max_steps", "50", "--max_train_seconds", "1e-6"))
    # The budget is spent after the first optimiser step: the run stops there, keeps its 50-step
    # schedule (the logged learning rate is still warming up) and saves the model as usual.
    assert summary["steps"] == 1
    assert (output / "model.safetensors").exists() and (output / "training_summary.json").exists()
    with pytest.raises(ConfigError, match="max_train_seconds"):
        TrainingConfig(max_train_seconds=0)


def test_two_processes_gloo_agree_on_weights(tmp_path, images):
    output = tmp_path / "ddp"
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = launch_two_cpu_processes([str(REPO / "scripts" / "train.py"),
                                       *_tiny(images, output, "--max_steps", "4", "--per_device_train_batch_size", "4")],
                                      environment)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "training_summary.json").read_text())
    assert summary["num_processes"] == 2 and summary["steps"] == 4
    assert summary["processes_agree"] and len(summary["weights_checksums"]) == 2
    assert summary["weights_checksums"][0] == summary["weights_checksums"][1]
    assert (output / "model.safetensors").exists()


def test_periodic_evaluation_scores_every_pair_as_the_models_do(images):
    # The held-out task scored through the evaluation engine equals every (query, reference) pair scored
    # by a direct forward: descriptor cosines, matcher copy probabilities; the model stays in training mode.
    from conftest import tiny_models

    from copynce_hf.data import load_image_dataset
    from copynce_hf.metrics.copy_detection.formulas import copy_detection_metrics
    from copynce_hf.training import build_copy_detection_task, evaluate_copy_detection

    descriptor, matcher, processor = tiny_models(seed=3)
    rows = [row for _, row in zip(range(6), load_image_dataset(str(images)))]
    task = build_copy_detection_task(rows, 32, seed=5)
    assert (len(task.query_ids), len(task.reference_ids)) == (6, 4)
    num_q, num_r = len(task.query_ids), len(task.reference_ids)
    with torch.no_grad():
        q = processor(images=task.queries, return_tensors="pt")["pixel_values"]
        r = processor(images=task.references, return_tensors="pt")["pixel_values"]
        cosines = descriptor(pixel_values=q).descriptors @ descriptor(pixel_values=r).descriptors.T
        logits = matcher(pixel_values=q.repeat_interleave(num_r, 0), reference_pixel_values=r.repeat(num_q, 1, 1, 1)).logits
    query_ids = [query for query in task.query_ids for _ in task.reference_ids]
    for model, scores in ((descriptor, cosines), (matcher, torch.sigmoid(logits).reshape(num_q, num_r))):
        expected = copy_detection_metrics(query_ids, task.reference_ids * num_q, scores.reshape(-1).numpy(),
                                          task.ground_truth)
        model.train()
        metrics = evaluate_copy_detection(model, processor, task)
        assert model.training
        for key in ("micro_ap", "recall_at_p90", "recall_at_rank1", "mean_ap", "num_predictions"):
            assert metrics[key] == pytest.approx(expected[key], abs=1e-6), (type(model).__name__, key)


# ---------------------------------------------------------------------------------------------- GHNM, streaming
def test_build_knn_then_ghnm_training(tmp_path, images, train_script, monkeypatch):
    from transformers import ViTConfig, ViTModel

    vit = tmp_path / "vit"
    ViTModel(ViTConfig(**{**TINY_VIT, "num_hidden_layers": 1}), add_pooling_layer=False).save_pretrained(vit)
    knn = _load_script("build_knn")
    path = knn.main(["--dataset", str(images), "--model", str(vit), "--image_size", "32", "--k", "3",
                     "--num_workers", "0", "--output", str(tmp_path / "knn.safetensors")])
    from copynce_hf.data import KNNGraph

    graph = KNNGraph.load(path)
    assert len(graph.ids) == 12 and graph.neighbors.shape == (12, 3)
    assert all(row not in graph.neighbors[row] for row in range(12)) and (graph.neighbors >= 0).all()
    # accelerate launch --mixed_precision bf16 sets this; an explicit value in the config still wins.
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    summary = train_script.main(_tiny(images, tmp_path / "ghnm", "--max_steps", "3", "--knn_graph", str(path),
                                      "--hard_negative_mining", "ghnm", "--hard_negative_k", "3",
                                      "--mixed_precision", "no"))
    assert summary["steps"] == 3 and summary["pairs_per_process"] == 24 and summary["mixed_precision"] == "no"
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # a new run in a new process would start from a fresh state
    # The authors' batch structure: 4 slots of (anchor pair, hard-negative pair), SSCD InfoNCE over
    # all 2N descriptors, KoLeo over all of them; precision from the launcher (config null).
    summary = train_script.main(_tiny(images, tmp_path / "slots", "--max_steps", "3", "--knn_graph", str(path),
                                      "--hard_negative_mining", "ghnm", "--hard_negative_k", "3",
                                      "--hard_negative_slots", "true", "--per_device_train_batch_size", "4",
                                      "--model.infonce_negatives", "all_embeddings",
                                      "--model.koleo_scope", "all_embeddings"))
    assert summary["steps"] == 3 and summary["pairs_per_process"] == 24 and summary["mixed_precision"] == "bf16"
    assert all(math.isfinite(h["train/loss"]) for h in summary["history"] if "train/loss" in h)
    saved = json.loads(next((tmp_path / "slots").rglob("config.json")).read_text())
    assert saved["infonce_negatives"] == "all_embeddings" and saved["koleo_scope"] == "all_embeddings"


def test_build_knn_computes_float32_features_from_a_float16_folder(tmp_path):
    from transformers import ViTConfig, ViTModel

    vit = tmp_path / "vit16"
    ViTModel(ViTConfig(**{**TINY_VIT, "num_hidden_layers": 1}), add_pooling_layer=False).half().save_pretrained(vit)
    model, _, kind = load_feature_model(str(vit), 32)
    assert kind == "cls" and {p.dtype for p in model.parameters()} == {torch.float32}


def test_build_knn_default_model_offline_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="local model folder"):
        load_feature_model("facebook/dino-vits16", 224)


def test_streaming_training_run(train_script, tmp_path, images):
    summary = train_script.main(_tiny(images, tmp_path / "stream", "--max_steps", "3", "--streaming", "true",
                                      "--shuffle_buffer_size", "4"))
    assert summary["steps"] == 3 and summary["eval"]


@pytest.mark.parametrize("shards", [1, 4])
def test_streamed_resume_reproduces_the_uninterrupted_run(train_script, tmp_path, images, shards):
    """A streamed Parquet run (2 data-loader workers) resumed mid-epoch equals the uninterrupted run."""
    import datasets

    files = sorted(images.glob("*.jpg"))
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for index in range(shards):
        part = files[index::shards]
        table = datasets.Dataset.from_dict({"image": [{"bytes": p.read_bytes(), "path": None} for p in part],
                                            "image_id": [p.stem for p in part]})
        table.cast_column("image", datasets.Image()).to_parquet(str(parquet / f"train-{index:05d}.parquet"))

    def run(output, *extra):
        return train_script.main(_tiny(parquet, output, "--max_steps", "7", "--checkpointing_steps", "3",
                                       "--warmup_steps", "2", "--streaming", "true", "--shuffle_buffer_size", "3",
                                       "--dataloader_num_workers", "2", "--per_device_train_batch_size", "2",
                                       *extra))

    full = tmp_path / "full"
    run(full)
    # Stopped during steps 4..6 (the second streamed epoch starts inside them): resume from step 3.
    killed = tmp_path / "killed"
    (killed / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000003", killed / "checkpoints" / "step_00000003")
    assert (killed / "checkpoints" / "step_00000003" / "data_loader_state_0.pt").is_file()
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    summary = run(killed, "--resume", "latest")
    expected, resumed = _weights(full), _weights(killed)
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=0, atol=1e-6, msg=name)
    full_losses = {h["step"]: h["train/loss"] for h in json.loads((full / "training_summary.json").read_text())
                   ["history"] if "train/loss" in h}
    resumed_losses = {h["step"]: h["train/loss"] for h in summary["history"] if "train/loss" in h}
    assert {step: full_losses[step] for step in resumed_losses} == resumed_losses and max(resumed_losses) == 7
