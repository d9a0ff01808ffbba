"""benchmarks/training/held_out.py: held-out scores over several draws of copies, with tiny models and the bundled images."""

from __future__ import annotations

import json

import pytest
from conftest import save_tiny_models

from benchmarks.training import held_out
from copynce_hf.data import ASSET_IMAGES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return {seed: save_tiny_models(tmp_path_factory.mktemp(f"tiny{seed}"), seed=seed) for seed in (0, 1)}


@pytest.mark.parametrize("kind", ["descriptor", "matcher"])
def test_every_model_is_scored_on_every_draw_and_compared_with_the_first(tiny, kind, tmp_path):
    from copynce_hf.training import load_config
    from copynce_hf.training.run import held_out_score

    output = tmp_path / "scores.json"
    report = held_out.main(["--kind", kind, "--dataset", str(ASSET_IMAGES), "--held-out", "5", "--seeds", "2",
                            "--model", f"current={tiny[0][kind]}", "--model", f"same={tiny[0][kind]}",
                            "--model", f"other={tiny[1][kind]}", "--output", str(output)])
    assert json.loads(output.read_text())["models"] == report["models"]
    models = report["models"]
    assert list(models) == ["current", "same", "other"] and report["seeds"] == [0, 1]
    for entry in models.values():
        assert len(entry["per_seed"]) == 2
        for key in held_out.AVERAGED:
            assert entry["mean"][key] == pytest.approx(sum(s[key] for s in entry["per_seed"]) / 2)
    # the same weights score the same on every draw, and "better" needs a mean strictly above the current one
    assert models["same"]["per_seed"] == models["current"]["per_seed"]
    assert models["other"]["per_seed"] != models["current"]["per_seed"]  # the folders' own weights are scored
    assert models["current"]["better"] is None and models["same"]["better"] is False
    assert models["other"]["better"] == (models["other"]["mean"]["micro_ap"] > models["current"]["mean"]["micro_ap"])
    # each draw is the training run's own held-out task with that seed
    config_file = held_out.DESCRIPTOR_CONFIG if kind == "descriptor" else held_out.MATCHER_CONFIG
    overrides = {"dataset": str(ASSET_IMAGES), "model_name_or_path": tiny[1][kind], "model": None,
                 "init_from_dino": None, "seed": 1, "num_eval_images": 5, "mixed_precision": "no", "dataloader_num_workers": 0}
    if kind == "matcher":
        overrides.update(knn_graph=None, hard_negative_mining="off")
    run_config = load_config(config_file, overrides)
    assert models["other"]["per_seed"][1] == pytest.approx(dict(held_out_score(run_config)))


def test_bad_arguments_are_named(tiny, tmp_path, capsys):
    base = ["--kind", "descriptor", "--dataset", str(ASSET_IMAGES), "--output", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit):
        held_out.main([*base, "--model", tiny[0]["descriptor"]])
    assert "--model takes NAME=FOLDER" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        held_out.main([*base, "--model", f"a={tmp_path / 'missing'}"])
    assert "is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--model names must differ"):
        held_out.main([*base, "--model", f"a={tiny[0]['descriptor']}", "--model", f"a={tiny[1]['descriptor']}"])
