"""The embedded-model export (copynce_hf.export, scripts/export_embedded.py) and the demo (python -m copynce_hf.demo).

Tiny randomly initialised models are trained by nobody: they are saved into a temporary folder,
exported to float16 by the export, and the demo runs on a reduced task with them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_VIT_8_PIXEL_PATCHES, has_extra, has_sscd
from PIL import Image
from safetensors import safe_open
from transformers import AutoModel

import copynce_hf  # noqa: F401  (registers the Auto classes)
from copynce_hf.demo import main
from copynce_hf.evaluation.demo_task import (
    DEFAULT_DISTRACTOR_SOURCES,
    DemoTaskConfig,
    build_demo_task,
    true_pair_overlap,
)
from copynce_hf.export import MAX_BYTES, Export, card_training_rows, export_model, training_settings
from copynce_hf.model_code import stale_model_code
from copynce_hf.modeling import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
)
from copynce_hf.modeling.errors import ConfigError, CopyNCEError

REPO = Path(__file__).resolve().parents[1]
TINY = TINY_VIT_8_PIXEL_PATCHES
SMALL_TASK = ["--num-references", "3", "--num-distractor-sources", "1", "--copies", "1", "--distractor-copies", "1",
              "--top-k", "2"]


def seed0_export(part: str, source: Path, target: Path) -> Export:
    """The export of ``part`` as ``scripts/export_embedded.py`` configures it for seed 0, between other folders."""
    if part == "matcher":
        return Export("matcher", source, target, "matcher", "matcher-copynce-seed0", "copynce-vit-tiny112-matcher",
                      candidates="descriptor-copynce-seed0")
    return Export(part, source, target, "descriptor", "descriptor-copynce-seed0", "copynce-vit-tiny112-descriptor")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Full-precision tiny descriptor and matcher folders, as a training run would write them."""
    root = tmp_path_factory.mktemp("runs")
    torch.manual_seed(0)
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    models = {
        "descriptor": CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=16, **TINY)),
        "matcher": CopyNCEMatcherModel(CopyNCEMatcherConfig(num_fusion_layers=1, **TINY)),
    }
    for name, model in models.items():
        model.eval().save_pretrained(root / name)
        processor.save_pretrained(root / name)
    (root / "descriptor" / "training_summary.json").write_text(json.dumps({"steps": 123, "learning_rate": 0.001,
                                                                           "mixed_precision": "bf16"}))
    (root / "descriptor" / "run.json").write_text(json.dumps(  # as python -m benchmarks.training.train writes it
        {"command": "taskset -c 0 python scripts/train.py --max_steps 123 --query_recipe paper_descriptor"}))
    results = root / "results"
    results.mkdir()
    metrics = {"micro_ap": 0.4321, "recall_at_p90": 0.1234, "recall_at_rank1": 0.55, "recall_at_rank10": 0.75,
               "mean_ap": 0.5, "threshold_at_p90": 0.6789}
    (results / "descriptor-copynce-seed0.json").write_text(json.dumps({"metrics": metrics}))
    return root, models


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """The tiny models exported: {kind: (folder, ExportReport)}."""
    root, _ = trained
    target = tmp_path_factory.mktemp("embedded")
    out = {}
    for kind in ("descriptor", "matcher"):
        out[kind] = (target / kind, export_model(seed0_export(kind, root / kind, target / kind),
                                                 results_dir=root / "results"))
    return out


# ---------------------------------------------------------------------------------------------- export


def test_export_writes_fp16_safetensors_within_the_size_limit(exported):
    for kind, (folder, report) in exported.items():
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        assert size == report.total_bytes <= MAX_BYTES
        assert json.loads((folder / "config.json").read_text())["dtype"] == "float16"
        with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
            dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
        assert "F16" in dtypes and not {"F32", "F64", "BF16"} & dtypes, (kind, dtypes)
        names = {p.name for p in folder.iterdir()}
        assert {"preprocessor_config.json", "README.md", "model.safetensors", "config.json"} <= names
        # the folder carries real copies of the package's own modelling code (and auto_map)
        assert stale_model_code(folder) == []
        assert "AutoModel" in json.loads((folder / "config.json").read_text())["auto_map"]


def test_exported_models_load_in_float32_and_match_the_source(exported, trained):
    _, models = trained
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(4, 3, 32, 32, generator=generator)
    for kind, (folder, report) in exported.items():
        loaded = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
        assert type(loaded) is type(models[kind])
        assert all(p.dtype == torch.float32 for p in loaded.parameters())
        with torch.inference_mode():
            if kind == "descriptor":
                got, want = loaded(pixel_values=pixels).descriptors, models[kind](pixel_values=pixels).descriptors
            else:
                got = loaded(pixel_values=pixels[:2], reference_pixel_values=pixels[2:]).logits
                want = models[kind](pixel_values=pixels[:2], reference_pixel_values=pixels[2:]).logits
        assert got.dtype == torch.float32
        # float16 rounding of the weights only: close, but not bit-identical
        torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)
        assert report.max_output_difference < 5e-3


def test_export_card_carries_benchmark_numbers_and_research_licence(exported):
    card = (exported["descriptor"][0] / "README.md").read_text()
    header = card.split("---\n")[1]
    assert "license: other" in header and "license_name: research-only" in header
    for value in ("0.4321", "0.1234", "0.55", "0.75"):
        assert f"value: {value}" in header
    assert "mean_ap" not in header  # only muAP, RP90, recall@1/10 and the threshold at P90 go into the card
    assert "| Score threshold at 90% precision | 0.6789 |" in card  # as SSCD states its DISC threshold
    assert "lowest score (cosine similarity of two descriptors)" in card and "copynce calibrate" in card
    assert "| optimiser steps | 123 |" in card
    assert "| mixed precision | bf16 |" in card and "| query copy recipe | `CopyRecipe.paper_descriptor()` |" in card
    assert "research use only" in card
    # the matcher's system file does not exist: its card says it was not evaluated
    matcher_card = (exported["matcher"][0] / "README.md").read_text()
    assert "model-index" not in matcher_card and "lowest score" not in matcher_card


def test_export_refuses_an_oversized_folder_and_leaves_no_target(trained, tmp_path):
    root, _ = trained
    export = seed0_export("descriptor", root / "descriptor", tmp_path / "descriptor")
    with pytest.raises(CopyNCEError, match="above the limit"):
        export_model(export, results_dir=root / "results", max_bytes=10_000)
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_the_wrong_kind_and_missing_runs(trained, tmp_path):
    root, _ = trained
    export = seed0_export("descriptor", root / "matcher", tmp_path / "descriptor")
    with pytest.raises(ConfigError, match="holds a matcher"):
        export_model(export, results_dir=root / "results")
    export.source = tmp_path / "not-trained-yet"
    with pytest.raises(ConfigError, match="no config.json"):
        export_model(export, results_dir=root / "results")


# ---------------------------------------------------------------------------------------------- task


def test_demo_task_roles_and_traced_priors():
    config = DemoTaskConfig(num_references=3, num_distractor_sources=2, copies_per_reference=1,
                            copies_per_distractor=1)
    task = build_demo_task(config)
    assert not set(task.reference_files) & set(DEFAULT_DISTRACTOR_SOURCES)
    assert len(task.queries) == 5 and len({q.query_id for q in task.queries}) == 5
    ground_truth = task.ground_truth
    for query in task.queries:
        assert ground_truth[query.query_id] == ([query.source_id] if query.is_copy else [])
        assert query.table.size == (query.image.height, query.image.width)
    # same seed, same queries
    again = build_demo_task(config)
    assert [q.edits for q in again.queries] == [q.edits for q in task.queries]
    assert all(np.array_equal(np.asarray(a.image), np.asarray(b.image)) for a, b in zip(again.queries, task.queries))
    # the prior of a copy covers the share of its (resized) pixels that PixTrace traced
    for query in (q for q in task.queries if q.is_copy):
        with Image.open(task.reference_files[query.reference_id]) as reference:
            size = (reference.height, reference.width)
        overlap = true_pair_overlap(query, size, 64, 8)
        assert overlap.shape == (64, 64) and overlap.sum(axis=1).max() <= 1 + 1e-5
        traced = query.table.resize(64, 64).valid.mean()
        assert overlap.sum() / 64 == pytest.approx(traced, abs=0.02)


# ---------------------------------------------------------------------------------------------- demo


def test_demo_end_to_end_writes_report_and_prints_table(exported, tmp_path, capsys):
    output = tmp_path / "demo"
    argv = ["--descriptor", str(exported["descriptor"][0]), "--matcher", str(exported["matcher"][0]),
            "--output", str(output), *SMALL_TASK]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    results = json.loads((output / "results.json").read_text())
    systems = ["CopyNCE descriptor", "CopyNCE descriptor + matcher"]
    if has_extra("pdqhash", "bench"):
        systems.insert(0, "PDQ")
    else:
        assert "PDQ skipped" in printed
    if has_sscd():  # SSCD's graphs, raw cosine k-NN as the CopyNCE descriptor is
        systems += ["SSCD int8", "SSCD distilled"]
    else:
        assert "SSCD int8 skipped: SSCD's graphs are not installed" in printed
    assert set(systems) <= set(results)
    for system in systems:  # the printed table shows the numbers of results.json
        line = next(line for line in printed.splitlines() if re.match(rf"{re.escape(system)}\s+\d", line))
        muap, rp90, recall1 = (float(value) for value in line[len(system):].split()[:3])
        metrics = results[system]["metrics"]
        assert muap == pytest.approx(metrics["micro_ap"], abs=6e-4)
        assert rp90 == pytest.approx(metrics["recall_at_p90"], abs=6e-4)
        assert recall1 == pytest.approx(metrics["recall_at_rank1"], abs=6e-4)
    # 3 copies + 1 distractor; every system returns at most top-2 per query; the matcher re-scores
    # exactly the descriptor's candidates
    assert all(len(results[s]["predictions"]) <= 4 * 2 for s in systems)
    pairs = {s: {(p["query_id"], p["reference_id"]) for p in results[s]["predictions"]} for s in systems}
    assert pairs["CopyNCE descriptor"] == pairs["CopyNCE descriptor + matcher"]

    report = output / "report.html"
    assert f"report: {report.resolve()}" in printed
    html = report.read_text()
    for source in re.findall(r'src="([^"]+)"', html):
        assert (output / source).is_file(), source
    task = json.loads((output / "task.json").read_text())
    assert len(task["queries"]) == 4
    for query in task["queries"]:
        folder = output / "queries" / query["query_id"]
        assert f'id="{query["query_id"]}"' in html
        assert (folder / "token_affinity.png").is_file() and (folder / "affinity_entropy.png").is_file()
        # the overlap prior exists only for copies: a distractor has no true pair
        assert (folder / "overlap_prior.png").is_file() == (query["reference_id"] is not None)
    with Image.open(output / "pr_curves.png") as curve:
        assert curve.format == "PNG" and curve.width > 100


def test_demo_without_models_fails_with_a_clear_message(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert main(["--descriptor", str(missing), "--output", str(tmp_path / "out"), *SMALL_TASK]) == 2
    error = capsys.readouterr().err
    assert str(missing) in error and "export_embedded.py" in error and "python -m copynce_hf.training" in error
    assert not (tmp_path / "out").exists()


def test_a_model_name_that_is_neither_a_folder_nor_on_the_hub_says_both(monkeypatch, tmp_path):
    import huggingface_hub

    from copynce_hf.runtime.loading import load_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as raised:
        load_model("my-descriptor", "descriptor")
    message = str(raised.value)
    assert message.startswith("cannot load the model 'my-descriptor' (--model): there is no such folder here, "
                              "HF_HUB_OFFLINE is set and its cache holds no such model"), message
    assert "written by training, `python -m copynce_hf.training --output_dir DIR`" in message
    assert "nothing here trains" not in message and "\n" not in message


def test_exporting_an_exported_folder_keeps_its_training_rows(exported, tmp_path):
    """Re-exporting a shipped folder (e.g. the matcher, to score it on a new descriptor's candidates)
    carries the training rows of its card, since the run folder itself may be gone."""
    export = seed0_export("matcher", exported["descriptor"][0], tmp_path / "again")
    export.kind, export.candidates = "descriptor", None
    export_model(export, results_dir=tmp_path / "no-results")
    card = (tmp_path / "again" / "README.md").read_text()
    assert "| optimiser steps | 123 |" in card and "| mixed precision | bf16 |" in card
    assert card.count("| export |") == 1
    assert card_training_rows(tmp_path / "no-card-here") == {}


def test_export_cards_say_whether_a_run_s_weights_are_its_moving_average(tmp_path):
    """A run trained with ``ema_decay`` saves the average as its folder and the trained weights in
    ``without_ema/``: either exports with the run's training rows and a row naming its weights."""
    run = tmp_path / "descriptor-copynce-seed0"
    (run / "without_ema").mkdir(parents=True)
    (run / "training_summary.json").write_text(json.dumps({"steps": 77, "ema_decay": 0.998}))
    (run / "run.json").write_text(json.dumps({"command": "python scripts/train.py --ema_decay 0.998"}))
    averaged, trained = training_settings(run), training_settings(run / "without_ema")
    assert averaged["optimiser steps"] == trained["optimiser steps"] == 77
    assert averaged["weights"] == "the moving average of the trained weights (decay 0.998)"
    assert trained["weights"].startswith("the trained weights")
    assert averaged["benchmark run"] == trained["benchmark run"] == f"{tmp_path.parent.name}/descriptor-copynce-seed0"


def test_export_cards_name_the_model_a_continued_run_started_from(tmp_path):
    """A run started from a saved model (``model_name_or_path``) names it, with the budget its card gave,
    so the card's steps are not read as the model's whole training; a DINO start is named too."""
    start = tmp_path / "earlier"
    start.mkdir()
    (start / "README.md").write_text("# m\n\n## Training settings\n\n| Setting | Value |\n|---|---|\n"
                                     "| optimiser steps | 3600 |\n| training wall time | 6.2 min |\n\n## Next\n")
    run = tmp_path / "continued"
    run.mkdir()
    (run / "training_summary.json").write_text(json.dumps({"steps": 1600, "model_name_or_path": str(start)}))
    settings = training_settings(run)
    assert settings["optimiser steps"] == 1600
    assert settings["started from"] == (f"`{start}` as saved before this run (3600 optimiser steps, 6.2 min "
                                        "training wall time)")
    (run / "training_summary.json").write_text(json.dumps({"steps": 5, "init_from_dino": "dino.pth"}))
    settings = training_settings(run)
    assert settings["initialised from"] == "`dino.pth`" and "started from" not in settings


def test_the_export_script_parses_and_calls_the_export(trained, tmp_path):
    """``scripts/export_embedded.py`` only parses its options and calls :func:`copynce_hf.export.export_model`."""
    import runpy

    script = runpy.run_path(str(REPO / "scripts" / "export_embedded.py"))
    root, _ = trained
    reports = script["main"](["--parts", "descriptor", "--descriptor", str(root / "descriptor"),
                              "--descriptor-out", str(tmp_path / "d"), "--results-dir", str(root / "results")])
    assert [(report.kind, report.target) for report in reports] == [("descriptor", tmp_path / "d")]
    card = (tmp_path / "d" / "README.md").read_text()
    assert "copynce-vit-tiny112-descriptor" in card and "0.4321" in card
    assert script["default_exports"]()["matcher"].target == REPO / "copynce_hf" / "pretrained" / "matcher"


def test_export_settings_replace_or_add_card_rows(trained, tmp_path):
    """``--descriptor-setting ROW=VALUE`` gives the card rows a run's files cannot (the hardware, the batch)
    or give wrongly: a named row is replaced in place, a new row goes before the export row; a value
    without ``=`` is refused with the option's name."""
    import runpy

    script = runpy.run_path(str(REPO / "scripts" / "export_embedded.py"))
    root, _ = trained
    script["main"](["--parts", "descriptor", "--descriptor", str(root / "descriptor"), "--descriptor-out",
                    str(tmp_path / "d"), "--results-dir", str(root / "results"),
                    "--descriptor-setting", "mixed precision=bf16 autocast on the GPU",
                    "--descriptor-setting", "hardware = one NVIDIA H200"])
    rows = card_training_rows(tmp_path / "d" / "README.md")
    assert rows["mixed precision"] == "bf16 autocast on the GPU" and rows["hardware"] == "one NVIDIA H200"
    names = list(rows)
    assert names.index("mixed precision") < names.index("hardware") and rows["optimiser steps"] == "123"
    card = (tmp_path / "d" / "README.md").read_text()
    assert card.index("| hardware |") < card.index("| export |") and card.count("| mixed precision |") == 1
    with pytest.raises(CopyNCEError, match=r"--matcher-setting 'hardware': expected ROW=VALUE"):
        script["main"](["--parts", "matcher", "--matcher-setting", "hardware"])
