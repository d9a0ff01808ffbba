"""Training that starts from a saved model (``--model_name_or_path``) trains that model: its architecture and
every one of its weights, for the shipped models, a converted checkpoint of the authors and a run's own folder;
a model key that would re-initialise weights is refused with one line; docs/training.md's recipe runs."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import torch
import yaml
from conftest import REPO_ROOT, shrunk_asset_images
from safetensors.torch import load_file

from copynce_hf.authors_checkpoints import convert_authors_checkpoint
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.training.model import build_model
from copynce_hf.training.options import parse_args
from copynce_hf.training.run import cli, set_up

EMBEDDED = REPO_ROOT / "copynce_hf" / "pretrained"
#: The architecture keys of the shipped models' config.json that a run from them must keep.
ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                "patch_size", "descriptor_dim", "num_fusion_layers", "final_layer_norm", "layer_norm_eps")
#: Options that keep a run from a 112-pixel model to a step or two on a CPU.
QUICK = ["--per_device_train_batch_size", "4", "--num_eval_images", "0", "--dataloader_num_workers", "0",
         "--report_to", "none", "--logging_steps", "1"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The bundled images shrunk to 160 px (larger than the shipped models' 112-pixel input)."""
    return shrunk_asset_images(tmp_path_factory.mktemp("images"), 160)


def _assert_every_weight_is(state: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    """``state`` (a model's state dict) holds exactly the tensors of ``saved`` (a model.safetensors): names,
    shapes and values."""
    assert sorted(state) == sorted(saved)
    for name, value in saved.items():
        assert state[name].shape == value.shape, name
        assert torch.equal(state[name].to(value.dtype), value), name  # float16 on disk, float32 master weights


# ---------------------------------------------------------------------------------------------- what a run starts from
@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_a_run_from_a_shipped_model_starts_from_every_one_of_its_weights(kind):
    config = parse_args(["--model_name_or_path", str(EMBEDDED / kind)])
    assert config.model_type == kind and config.model == {}  # the kind and architecture are the folder's
    assert config.learning_rate == 1e-4 and config.max_steps == 300  # the tiny run's, at a continuation's rate
    model, processor = build_model(config)
    _assert_every_weight_is(model.state_dict(), load_file(str(EMBEDDED / kind / "model.safetensors")))
    shipped = json.loads((EMBEDDED / kind / "config.json").read_text())
    assert {key: getattr(model.config, key) for key in ARCHITECTURE if key in shipped} == {
        key: shipped[key] for key in ARCHITECTURE if key in shipped}
    assert processor.size == {"height": 112, "width": 112}


def test_a_run_from_a_multi_size_descriptor_evaluates_and_saves_its_largest_size(tmp_path):
    from conftest import TINY_VIT

    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel

    CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=16, inference_sizes=[32, 48], **TINY_VIT)
                           ).save_pretrained(tmp_path / "multi")
    model, processor = build_model(parse_args(["--model_name_or_path", str(tmp_path / "multi")]))
    assert model.config.inference_sizes == [32, 48] and model.config.image_size == 32  # pairs are made at 32
    assert processor.size == {"height": 48, "width": 48}


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_a_run_from_a_converted_authors_checkpoint_starts_from_every_one_of_its_weights(kind, tmp_path):
    from test_authors_checkpoints import save_authors_checkpoint, synthetic_state_dict

    checkpoint = save_authors_checkpoint(synthetic_state_dict(kind, small=True), tmp_path / "authors.pth.tar")
    folder = convert_authors_checkpoint(checkpoint, kind, tmp_path / kind)
    config = parse_args(["--model_name_or_path", str(folder)])
    model, _ = build_model(config)
    assert config.model_type == kind
    _assert_every_weight_is(model.state_dict(), load_file(str(folder / "model.safetensors")))


def test_the_data_pipeline_makes_pairs_at_the_models_image_size(images, tmp_path):
    config = parse_args(["--dataset", str(images), "--model_name_or_path", str(EMBEDDED / "descriptor"),
                         "--output_dir", str(tmp_path / "run"), *QUICK])
    run = set_up(config)
    loader = run.data.loader(run.progress, 1)
    inputs, _, _ = next(run.data.batches(loader, run.progress, 1))
    assert run.data.collator.image_size == 112 and run.data.collator.patch_size == 8
    assert inputs["pixel_values"].shape == (4, 3, 112, 112) == inputs["reference_pixel_values"].shape


# ---------------------------------------------------------------------------------------------- explicit model keys
def test_a_model_key_that_would_reinitialise_weights_is_refused_with_one_line(tmp_path, capsys):
    output = tmp_path / "out"
    status = cli(["--model_name_or_path", str(EMBEDDED / "descriptor"), "--model.descriptor_dim", "128",
                  "--model.patch_size", "16", "--model.copynce_weight", "1", "--output_dir", str(output)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert "model.descriptor_dim=128 (the folder's: 256)" in lines[0]
    assert "model.patch_size=16 (the folder's: 8)" in lines[0]
    assert "copynce_weight" not in lines[0] and "ignore_mismatched_sizes" in lines[0]  # a loss weight keeps shapes
    assert not output.exists()


def test_a_configuration_files_model_keys_are_explicit_too(tmp_path):
    # --config tiny_cpu.yaml asks for its 64-pixel, 16-pixel-patch, 128-d model: not the shipped one
    config = parse_args(["--config", "tiny_cpu.yaml", "--model_name_or_path", str(EMBEDDED / "descriptor")])
    with pytest.raises(ConfigError, match=r"model\.patch_size=16 \(the folder's: 8\)") as error:
        build_model(config)
    assert "model.descriptor_dim=128 (the folder's: 256)" in str(error.value)
    assert "image_size" not in str(error.value)  # interpolated, not re-initialised


def test_a_changed_image_size_interpolates_the_position_embeddings_and_keeps_the_rest():
    model, processor = build_model(parse_args(["--model_name_or_path", str(EMBEDDED / "descriptor"),
                                               "--model.image_size", "128"]))
    shipped = load_file(str(EMBEDDED / "descriptor" / "model.safetensors"))
    position = "vit.embeddings.position_embeddings"
    state = model.state_dict()
    assert state.pop(position).shape == (1, 1 + 16 * 16, 192) and processor.size["height"] == 128
    _assert_every_weight_is(state, {name: value for name, value in shipped.items() if name != position})
    with pytest.raises(ConfigError, match=r"model\.image_size=100: must be a multiple of the patch_size=8"):
        build_model(parse_args(["--model_name_or_path", str(EMBEDDED / "descriptor"), "--model.image_size", "100"]))


def test_ignore_mismatched_sizes_reinitialises_only_what_the_keys_change():
    config = parse_args(["--model_name_or_path", str(EMBEDDED / "descriptor"), "--model.descriptor_dim", "64",
                         "--ignore_mismatched_sizes", "true"])
    model, _ = build_model(config)
    shipped = load_file(str(EMBEDDED / "descriptor" / "model.safetensors"))
    head = {name for name in shipped if name.startswith("head.") and shipped[name].shape[:1] == (256,)}
    assert model.config.descriptor_dim == 64 and {n for n in head if model.state_dict()[n].shape[0] == 64} == head
    kept = {name: value for name, value in shipped.items() if name not in head and not name.startswith("head.")}
    state = model.state_dict()
    assert all(torch.equal(state[name].to(value.dtype), value) for name, value in kept.items())


def test_a_model_type_other_than_the_folders_is_refused():
    config = parse_args(["--model_name_or_path", str(EMBEDDED / "descriptor"), "--model_type", "matcher"])
    with pytest.raises(ConfigError, match="holds a descriptor"):
        build_model(config)


def test_a_folder_that_is_no_model_is_named(tmp_path):
    for path, message in ((tmp_path / "absent", "no such model folder"), (tmp_path, "the folder holds no config.json")):
        with pytest.raises(ConfigError, match=f"model_name_or_path='{re.escape(str(path))}': {message}"):
            parse_args(["--model_name_or_path", str(path)])


def test_the_authors_finetuning_config_keeps_the_trained_head():
    """Their finetune.yaml keeps the trained 512-d head: the config asks for no head size and re-initialises nothing
    (the paper's 256-d Descriptor Track head is an explicit override, named in the file's comments)."""
    text = (REPO_ROOT / "configs" / "finetune_descriptor_disc21_dev.yaml").read_text()
    config = yaml.safe_load(text)
    assert "descriptor_dim" not in config["model"] and not config.get("ignore_mismatched_sizes", False)
    assert "--model.descriptor_dim 256" in text and "--ignore_mismatched_sizes true" in text


# ---------------------------------------------------------------------------------------------- runs
def test_finetuning_the_shipped_descriptor_moves_each_weight_by_one_step_only(images, tmp_path):
    output = tmp_path / "mine"
    assert cli(["--dataset", str(images), "--model_name_or_path", str(EMBEDDED / "descriptor"), "--max_steps", "1",
                "--warmup_steps", "0", "--output_dir", str(output), *QUICK]) == 0
    shipped, trained = load_file(str(EMBEDDED / "descriptor" / "model.safetensors")), load_file(
        str(output / "model.safetensors"))
    assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in shipped.items()}
    learning_rate = json.loads((output / "training_summary.json").read_text())["learning_rate"]
    # one AdamW step moves a weight by about the learning rate at most; a re-initialised tensor is far off
    moved = {name: float((trained[name] - shipped[name].float()).abs().max()) for name in shipped
             if shipped[name].is_floating_point() and "running_" not in name}
    assert max(moved.values()) <= 1.5 * learning_rate and max(moved.values()) > 0, moved
    saved = json.loads((output / "config.json").read_text())
    assert saved["image_size"] == 112 and saved["patch_size"] == 8 and saved["descriptor_dim"] == 256
    assert json.loads((output / "preprocessor_config.json").read_text())["size"] == {"height": 112, "width": 112}


def _documented_recipe() -> list[str]:
    """The training command of docs/training.md's section on training from a shipped or converted model."""
    text = (REPO_ROOT / "docs/training.md").read_text()
    section = text.split("## Train on your own images, starting from a shipped or converted model", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    command = next(line for line in block.replace("\\\n", " ").splitlines()
                   if line.startswith("python -m copynce_hf.training"))
    return shlex.split(command.split("#", 1)[0])[3:]


def test_the_documented_recipe_trains_the_shipped_model_on_a_folder_of_images(images, tmp_path, monkeypatch):
    words = _documented_recipe()
    options = dict(zip(words[::2], words[1::2]))
    assert options["--model_name_or_path"] == "copynce_hf/pretrained/descriptor" and "--config" not in options
    monkeypatch.chdir(REPO_ROOT)  # the command is written from the repository root
    output = tmp_path / "my_descriptor"
    words[words.index("--dataset") + 1] = str(images)
    words[words.index("--output_dir") + 1] = str(output)
    # one step of the documented run, its 4 held-out images scored before it and after
    assert cli([*words, "--max_steps", "1", "--per_device_train_batch_size", "4", "--dataloader_num_workers", "0",
                "--report_to", "none"]) == 0
    trained = load_file(str(output / "model.safetensors"))
    shipped = load_file(str(EMBEDDED / "descriptor" / "model.safetensors"))
    assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in shipped.items()}
    summary = json.loads((output / "training_summary.json").read_text())
    assert [entry["step"] for entry in summary["history"] if "eval/micro_ap" in entry] == [0, 1]
    assert summary["learning_rate"] == 1e-4  # a continuation's, not the fresh tiny run's 1e-3
    assert (output / "README.md").is_file()  # the model card
