"""Tests of copynce_hf.hub: model cards (metadata, model-index, sections), the upload folder, the upload."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY_VIT, tiny_models
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results
from PIL import Image
from safetensors.torch import load_file

import copynce_hf.hub as hub
from copynce_hf import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)
from copynce_hf.hub import CITATION, build_model_card, push_to_hub, save_for_hub, validate_model_card
from copynce_hf.modeling.errors import TRANSFORMERS_REQUIREMENT, ConfigError, CopyNCEError

TINY = {**TINY_VIT, "descriptor_dim": 16}
RESULTS = [
    {"dataset_name": "DISC21 dev", "dataset_type": "disc21", "dataset_split": "dev", "micro_ap": 0.705,
     "recall_at_p90": 0.636, "recall_at_rank1": 0.81},
    {"dataset_name": "mini-DISC", "micro_ap": 0.215, "recall_at_p90": 0.12, "threshold_at_p90": None},
]
SETTINGS = {"optimizer": "AdamW (0.9, 0.999), weight decay 0.04", "max_steps": 1000, "learning_rate": 6e-4,
            "per_device_train_batch_size": 64}


def descriptor_config(**overrides):
    return CopyNCEDescriptorConfig(**{**TINY, **overrides})


def matcher_config(**overrides):
    values = {**TINY, "num_fusion_layers": 1, **overrides}
    values.pop("descriptor_dim")
    return CopyNCEMatcherConfig(**values)


@pytest.fixture
def descriptor_card():
    return build_model_card(descriptor_config(), model_id="org/copynce-vits-descriptor", results=RESULTS,
                            training_settings=SETTINGS, datasets=["imagenet-1k"],
                            base_model="facebook/dino-vits16")


def metadata_of(card) -> dict:
    text = str(card)
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"section {title!r} missing"
    return match.group(1)


# ----------------------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------------------


def test_descriptor_card_metadata_parses_and_validates(descriptor_card):
    reloaded = ModelCard(str(descriptor_card))  # what ModelCard.load does with a README's text
    data = reloaded.data
    assert data.license == "apache-2.0"
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "image-feature-extraction"
    assert {"copy-detection", "copynce", "descriptor"} <= set(data.tags)
    assert data.datasets == ["imagenet-1k"]
    assert data.base_model == "facebook/dino-vits16"
    assert data.model_name == "copynce-vits-descriptor"
    # Offline validation with huggingface_hub's own parsers returns the same data.
    assert validate_model_card(descriptor_card).to_dict() == data.to_dict()


def test_model_index_round_trips(descriptor_card):
    model_index = metadata_of(descriptor_card)["model-index"]
    name, results = model_index_to_eval_results(model_index)
    assert name == "copynce-vits-descriptor"
    assert {r.metric_type for r in results} == {"copy_detection"}  # the metric's id; the result key is its config
    got = {(r.dataset_name, r.metric_config): r.metric_value for r in results}
    assert got == {
        ("DISC21 dev", "micro_ap"): 0.705,
        ("DISC21 dev", "recall_at_p90"): 0.636,
        ("DISC21 dev", "recall_at_rank1"): 0.81,
        ("mini-DISC", "micro_ap"): 0.215,
        ("mini-DISC", "recall_at_p90"): 0.12,
    }  # the None threshold is left out
    disc = next(r for r in results if r.dataset_name == "DISC21 dev")
    assert (disc.dataset_type, disc.dataset_split, disc.task_type) == ("disc21", "dev", "image-feature-extraction")
    assert next(r for r in results if r.dataset_name == "mini-DISC").dataset_type == "mini-DISC"
    # Serialising the parsed results gives back the YAML model-index.
    assert eval_results_to_model_index(name, results) == model_index


def test_matcher_card_without_results_has_no_model_index():
    card = build_model_card(matcher_config(), model_id="org/copynce-vits-matcher")
    metadata = metadata_of(card)
    assert metadata["pipeline_tag"] == "other"
    assert "matcher" in metadata["tags"] and "copy-detection" in metadata["tags"]
    assert "model-index" not in metadata and "base_model" not in metadata
    assert "not been evaluated" in section(card.text, "Evaluation results")
    assert "No training settings were recorded" in section(card.text, "Training settings")
    validate_model_card(card)


def test_license_other_needs_a_name_and_a_link():
    with pytest.raises(CopyNCEError, match="license_link"):
        build_model_card(descriptor_config(), model_id="x", license="other", license_name="research-only")
    card = build_model_card(descriptor_config(), model_id="x", license="other", license_name="research-only",
                            license_link="LICENSE")
    metadata = metadata_of(card)
    assert (metadata["license"], metadata["license_name"], metadata["license_link"]) == ("other", "research-only",
                                                                                         "LICENSE")
    validate_model_card(card)
    with pytest.raises(CopyNCEError, match="license_link"):
        validate_model_card(str(card).replace("license_link: LICENSE\n", ""))


def test_cards_keep_the_licence_of_the_weights_a_model_was_loaded_from(tmp_path):
    """A model loaded from the research-only embedded folder (e.g. a continued training run) keeps that
    licence and its LICENSE file; weights from nowhere carded get DEFAULT_LICENSE."""
    from copynce_hf.training import TrainingConfig
    from copynce_hf.training.saving import save_trained_model

    shipped = Path(hub.__file__).resolve().parent / "pretrained" / "matcher"
    research_only = {"license": "other", "license_name": "research-only", "license_link": "LICENSE"}
    assert hub.weights_license(shipped) == research_only
    model = CopyNCEMatcherModel.from_pretrained(shipped, dtype=torch.float32)
    assert {key: metadata_of(build_model_card(model, model_id="m")).get(key) for key in research_only} == research_only
    assert metadata_of(build_model_card(matcher_config(), model_id="m"))["license"] == hub.DEFAULT_LICENSE
    assert metadata_of(build_model_card(model, model_id="m", license="mit"))["license"] == "mit"  # said explicitly
    with pytest.raises(CopyNCEError, match="need license="):
        build_model_card(model, model_id="m", license_name="x")

    run = save_trained_model(model, CopyNCEImageProcessor(size={"height": 112, "width": 112}), TrainingConfig(),
                             tmp_path / "continued")
    assert metadata_of((run / "README.md").read_text())["license"] == "other"
    assert (run / "LICENSE").read_bytes() == (shipped / "LICENSE").read_bytes()
    saved = save_for_hub(model, tmp_path / "upload")  # what push_to_hub uploads
    assert (saved / "LICENSE").is_file()
    # a card linking a licence file that no folder holds is refused, not written with a dangling link
    fresh = CopyNCEMatcherModel(matcher_config())
    card = build_model_card(fresh, model_id="m", license="other", license_name="x", license_link="TERMS")
    with pytest.raises(CopyNCEError, match="license_link 'TERMS'"):
        save_for_hub(fresh, tmp_path / "dangling", card=card)


def test_training_card_keeps_the_periodic_evaluation_out_of_the_model_index():
    from copynce_hf.training.config import TrainingConfig
    from copynce_hf.training.saving import training_card

    metrics = {"micro_ap": 1.0, "recall_at_p90": 1.0, "num_queries_with_copy": 3, "num_ground_truth_pairs": 3,
               "num_predictions": 12}
    card = training_card(descriptor_config(), TrainingConfig(), metrics, model_id="run")
    assert "model-index" not in metadata_of(card)
    row = next(line for line in section(card.text, "Training settings").splitlines() if "periodic evaluation" in line)
    assert "µAP 1.0000" in row and "3 queries with a copy" in row and "12 scored pairs" in row
    validate_model_card(card)


def test_validate_rejects_malformed_metadata(descriptor_card):
    broken = str(descriptor_card).replace("    - type: copy_detection\n      value: 0.705\n", "    - type: copy_detection\n",
                                          1)
    assert broken != str(descriptor_card)
    with pytest.raises(CopyNCEError, match="invalid"):
        validate_model_card(broken)
    with pytest.raises(CopyNCEError, match="header"):
        validate_model_card("# no metadata\n")
    no_tag = str(descriptor_card).replace("- copy-detection\n", "", 1)
    with pytest.raises(CopyNCEError, match="copy-detection"):
        validate_model_card(no_tag)


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------


def test_card_sections_carry_config_settings_results_and_citation(descriptor_card):
    text = descriptor_card.text
    for title in ("Model description", "Intended use", "How to use", "Training settings", "Evaluation results",
                  "Limitations", "Citation"):
        section(text, title)
    description = section(text, "Model description")
    assert "2 blocks, hidden size 32, 2 heads" in description
    assert "16-d descriptor" in description and "facebook/dino-vits16" in description
    assert "| CopyNCE gamma | 3 |" in description and "| CopyNCE weight w_NCE | 5 |" in description
    usage = section(text, "How to use")
    assert 'AutoModel.from_pretrained("org/copynce-vits-descriptor", trust_remote_code=True)' in usage
    assert "import copynce_hf" in usage
    assert f"it needs `{TRANSFORMERS_REQUIREMENT}`" in usage  # the remote code needs transformers 5
    training = section(text, "Training settings")
    assert "| learning_rate | 0.0006 |" in training and "| max_steps | 1000 |" in training
    assert "imagenet-1k" in training
    results = section(text, "Evaluation results")
    assert "| DISC21 dev | dev | µAP | 0.7050 |" in results
    assert "| mini-DISC |  | RP90 (recall at 90% precision) | 0.1200 |" in results
    citation = section(text, "Citation")
    assert CITATION in citation
    assert "Tracing Copied Pixels and Regularizing Patch Affinity in Copy Detection" in citation
    assert "Lu, Yichen and Nie, Siwei and Lu, Minlong and Yang, Xudong and Zhang, Xiaobo and Zhang, Peng" in citation


def test_a_multi_size_descriptor_card_says_at_which_sizes_it_describes():
    card = build_model_card(descriptor_config(inference_sizes=[32, 48]), model_id="m")
    description = section(card.text, "Model description")
    assert "| Multi-size descriptors | at inference the L2-normalised sum of the descriptors at 32x32, 48x48" in (
        description)
    assert "Multi-size" not in section(build_model_card(descriptor_config(), model_id="m").text, "Model description")


def test_matcher_card_describes_pairs_and_fusion():
    card = build_model_card(matcher_config(copynce_gamma=float("inf")), model_id="m", base_model=["a/b", "c/d"])
    assert metadata_of(card)["base_model"] == ["a/b", "c/d"]
    description = section(card.text, "Model description")
    assert "enc-1-fus-1" in description and "| CopyNCE gamma | ∞ |" in description
    assert "reference_pixel_values=reference" in section(card.text, "How to use")
    assert f"it needs `{TRANSFORMERS_REQUIREMENT}`" in section(card.text, "How to use")
    assert "pairs" in card.text


def test_card_refuses_bad_inputs():
    with pytest.raises(ConfigError, match="model_type"):
        build_model_card(object(), model_id="x")
    with pytest.raises(CopyNCEError, match="unknown keys"):
        build_model_card(descriptor_config(), model_id="x", results={"dataset_name": "d", "muap": 0.5})
    with pytest.raises(CopyNCEError, match="dataset_name"):
        build_model_card(descriptor_config(), model_id="x", results={"micro_ap": 0.5})
    with pytest.raises(CopyNCEError, match="no metric"):
        build_model_card(descriptor_config(), model_id="x", results={"dataset_name": "d"})
    with pytest.raises(CopyNCEError, match="not finite"):
        build_model_card(descriptor_config(), model_id="x", results={"dataset_name": "d", "micro_ap": float("nan")})
    with pytest.raises(CopyNCEError, match="model_id"):
        build_model_card(descriptor_config(), model_id="")


# ----------------------------------------------------------------------------------------------
# Upload folder and upload
# ----------------------------------------------------------------------------------------------


def _write_images(folder: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)
    Image.fromarray(base).save(folder / "reference.jpg")
    Image.fromarray(base[4:44, 2:38]).save(folder / "query.jpg")


def _first_python_block(text: str) -> str:
    return re.search(r"```python\n(.*?)```", section(text, "How to use"), flags=re.S).group(1)


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_save_for_hub_writes_a_loadable_folder_whose_card_snippet_runs(tmp_path, monkeypatch, kind):
    torch.manual_seed(0)
    if kind == "descriptor":
        model = CopyNCEDescriptorModel(descriptor_config()).eval()
    else:
        model = CopyNCEMatcherModel(matcher_config()).eval()
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    folder = tmp_path / f"copynce-{kind}"
    card = build_model_card(model, model_id=str(folder), training_settings={"max_steps": 3})
    assert save_for_hub(model, folder, image_processor=processor, card=card) == folder
    names = {path.name for path in folder.iterdir()}
    assert {"README.md", "config.json", "model.safetensors", "preprocessor_config.json"} <= names
    assert (folder / "README.md").read_text(encoding="utf-8") == str(card)
    weights = load_file(folder / "model.safetensors")
    for key, value in model.state_dict().items():
        if key in weights:
            assert torch.equal(weights[key], value), key
    assert len(weights) > 0
    # The card's "How to use" snippet runs as written against the saved folder (local path as model id).
    _write_images(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_first_python_block(card.text), "card-snippet", "exec"), namespace)  # noqa: S102
    if kind == "descriptor":
        descriptors = namespace["descriptors"]
        assert descriptors.shape == (2, 16)
        assert torch.allclose(descriptors.norm(dim=-1), torch.ones(2), atol=1e-5)
    else:
        assert namespace["logits"].shape == (1,)


def test_save_for_hub_builds_a_default_card(tmp_path):
    model = CopyNCEDescriptorModel(descriptor_config())
    folder = save_for_hub(model, tmp_path / "my-descriptor")
    card = ModelCard((folder / "README.md").read_text(encoding="utf-8"))
    assert card.data.model_name == "my-descriptor" and card.data.pipeline_tag == "image-feature-extraction"
    assert not (folder / "preprocessor_config.json").exists()


class _RecordingApi:
    """Stands in for the Hub (no network here): records calls and what the folder holds at upload time."""

    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def upload_folder(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        files = sorted(path.name for path in folder.iterdir())
        readme = (folder / "README.md").read_text(encoding="utf-8")
        self.calls.append(("upload_folder", kwargs, files, readme))
        return "commit-info"


def test_push_to_hub_uploads_one_prepared_folder_in_one_commit(monkeypatch):
    _RecordingApi.calls = []
    monkeypatch.setattr(hub, "HfApi", _RecordingApi)
    model = CopyNCEDescriptorModel(descriptor_config())
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    result = push_to_hub(model, "org/tiny", image_processor=processor, private=True, token="t",
                         commit_message="first upload")
    assert result == "commit-info"
    kinds = [call[0] for call in _RecordingApi.calls]
    assert kinds == ["init", "create_repo", "upload_folder"]
    assert _RecordingApi.calls[0][1] == "t"
    create = _RecordingApi.calls[1][1]
    assert create["repo_id"] == "org/tiny" and create["exist_ok"] is True and create["private"] is True
    _, upload, files, readme = _RecordingApi.calls[2]
    assert upload["repo_id"] == "org/tiny" and upload["commit_message"] == "first upload"
    assert {"README.md", "config.json", "model.safetensors", "preprocessor_config.json"} <= set(files)
    assert 'AutoModel.from_pretrained("org/tiny", trust_remote_code=True)' in readme
    assert not Path(upload["folder_path"]).exists()  # the temporary folder is cleaned up


def test_a_mistyped_bare_model_name_fails_at_once_when_the_hub_is_unreachable(monkeypatch, caplog):
    """No Hub (an endpoint on a closed local port): one clear error, no retries logged, no torch loaded first."""
    from huggingface_hub import constants

    from copynce_hf.modeling.errors import ConfigError
    from copynce_hf.runtime.loading import load_model

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ConfigError, match=r"'nosuchmodel' \(--model\): there is no such folder here, the Hub "
                                          r"cannot be reached from this machine and its cache holds no such model"):
        load_model("nosuchmodel", "descriptor")
    assert not [record for record in caplog.records if "Retrying" in record.getMessage()]


def test_a_hub_id_in_the_local_cache_loads_without_the_hub(tmp_path, monkeypatch):
    """Offline, a Hub id whose snapshot is in the Hugging Face cache loads from there (the layout
    ``huggingface_hub`` writes: ``models--org--name/refs/main`` naming a snapshot folder)."""
    from huggingface_hub import constants

    from copynce_hf.runtime.loading import load_model

    descriptor, _, processor = tiny_models(0)
    repository = tmp_path / "hub" / "models--someone--tiny-descriptor"
    snapshot = repository / "snapshots" / "0123456789abcdef"
    descriptor.save_pretrained(snapshot)
    processor.save_pretrained(snapshot)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model, loaded_processor = load_model("someone/tiny-descriptor", "descriptor")
    assert model.config.descriptor_dim == descriptor.config.descriptor_dim
    for name, weight in descriptor.state_dict().items():
        assert torch.equal(model.state_dict()[name], weight), name
