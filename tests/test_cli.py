"""The `copynce` command end to end on tiny random models and images, and its error messages."""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import has_extra, run_cli, save_tiny_models
from PIL import Image

from copynce_hf.cli import main
from copynce_hf.retrieval import DescriptorIndex, DescriptorSet, read_predictions
from copynce_hf.retrieval.presets import DEFAULT_CANDIDATES

ASSETS = Path(__file__).resolve().parents[1] / "copynce_hf" / "assets" / "images"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny random descriptor and matcher folders (save_pretrained), as users get them from the Hub."""
    return save_tiny_models(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """refs/: 5 random images; queries/: flipped or cropped copies of R0 and R3 plus a distractor."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    (root / "refs").mkdir()
    (root / "queries").mkdir()
    (root / "aux").mkdir()
    originals = {}
    for i in range(5):
        originals[f"R{i}"] = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
        originals[f"R{i}"].save(root / "refs" / f"R{i}.png")
    originals["R0"].transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(root / "queries" / "Q0.png")
    originals["R3"].crop((8, 4, 56, 44)).save(root / "queries" / "Q1.jpg")
    Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(root / "queries" / "Q2.png")
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "aux" / f"A{i:02d}.png")
    (root / "gt.csv").write_text("query_id,reference_id\nQ0,R0\nQ1,R3\nQ2,\n")
    return root


def test_a_multi_size_descriptor_folder_indexes_at_each_of_its_sizes(images, tmp_path, capsys):
    """A descriptor saved with ``inference_sizes`` and its processor at the largest size: ``copynce index`` stores the
    normalised sum of its descriptors at each size, the smaller read from the processed image."""
    from conftest import TINY_VIT

    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor

    torch.manual_seed(0)
    model = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=16, inference_sizes=[32, 48], **TINY_VIT))
    processor = CopyNCEImageProcessor(size={"height": 48, "width": 48})
    model.save_pretrained(tmp_path / "multi")
    processor.save_pretrained(tmp_path / "multi")
    code, _, err = run_cli(capsys, "index", images / "refs", "--model", tmp_path / "multi", "--output", tmp_path / "idx")
    assert code == 0, err
    pixels = processor(images=[Image.open(images / "refs" / f"R{i}.png").convert("RGB") for i in range(5)],
                       return_tensors="pt")["pixel_values"]
    model.eval().config.inference_sizes = None
    with torch.no_grad():
        at_48 = model(pixels).descriptors
        at_32 = model(torch.nn.functional.interpolate(pixels, size=(32, 32), mode="bicubic", antialias=True)).descriptors
    expected = torch.nn.functional.normalize(at_48 + at_32, dim=-1).numpy()
    np.testing.assert_allclose(DescriptorIndex.load(tmp_path / "idx").references.descriptors, expected, atol=1e-5)


def test_find_copies_session(models, images, tmp_path, capsys):
    idx = tmp_path / "idx"
    code, out, err = run_cli(capsys, "index", images / "refs", "--model", models["descriptor"], "--output", idx)
    assert code == 0, err
    assert "indexed 5 references" in out
    index = DescriptorIndex.load(idx)
    assert index.references.ids == ["R0", "R1", "R2", "R3", "R4"]
    assert index.references.descriptors.shape == (5, 16)
    np.testing.assert_allclose(np.linalg.norm(index.references.descriptors, axis=1), 1.0, atol=1e-5)
    assert json.loads((idx / "index.json").read_text())["config"]["kind"] == "flat"

    candidates = tmp_path / "candidates.csv"
    code, out, err = run_cli(
        capsys, "search", images / "queries", "--index", idx, "--k", 3, "--output", candidates,
        "--save-descriptors", tmp_path / "q.safetensors",
        *(["--hdf5", tmp_path / "disc21.hdf5"] if has_extra("h5py", "bench") else []),
    )
    assert code == 0, err
    with candidates.open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["query_id", "reference_id", "score"] and len(rows) == 1 + 3 * 3
    predictions = read_predictions(candidates)
    queries = DescriptorSet.load(tmp_path / "q.safetensors")
    assert queries.ids == ["Q0", "Q1", "Q2"]
    for p in predictions:  # scores are the cosine similarities of the stored descriptors
        expected = queries.descriptors[queries.ids.index(p.query_id)] @ index.references.descriptors[
            index.references.ids.index(p.reference_id)
        ]
        assert p.score == pytest.approx(float(expected), abs=1e-5)
    assert not has_extra("h5py", "bench") or (tmp_path / "disc21.hdf5").stat().st_size > 0
    assert f"scores: the descriptor's cosine ({models['descriptor']}); uncalibrated, no threshold decides" in out

    # score normalisation with an auxiliary index subtracts the same bias from every pair of a query
    aux = tmp_path / "aux_idx"
    assert run_cli(capsys, "index", images / "aux", "--model", models["descriptor"], "--output", aux)[0] == 0
    normalized = tmp_path / "normalized.csv"
    code, out, err = run_cli(capsys, "search", images / "queries", "--index", idx, "--k", 3, "--score-norm", aux,
                             "--output", normalized)
    assert code == 0, err
    assert "less 1 x the query's mean cosine to its auxiliary neighbours of ranks 0-9 (score normalisation)" in out
    raw = {(p.query_id, p.reference_id): p.score for p in predictions}
    aux_set = DescriptorSet.load(aux)
    for p in read_predictions(normalized):
        q = queries.descriptors[queries.ids.index(p.query_id)]
        bias = np.sort(aux_set.descriptors @ q)[::-1][:10].mean()
        assert p.score == pytest.approx(raw[(p.query_id, p.reference_id)] - bias, abs=1e-5)

    # feature stretching: score = -||beta * mean(top-5 aux sims) * z_q - z_r||^2
    stretched = tmp_path / "stretched.csv"
    code, _, err = run_cli(capsys, "search", images / "queries", "--index", idx, "--k", 5, "--stretch", aux,
                       "--output", stretched)
    assert code == 0, err
    for p in read_predictions(stretched):
        q = queries.descriptors[queries.ids.index(p.query_id)]
        z = 2.5 * np.sort(aux_set.descriptors @ q)[::-1][:5].mean() * q
        r = index.references.descriptors[index.references.ids.index(p.reference_id)]
        assert p.score == pytest.approx(-float(np.square(z - r).sum()), abs=1e-4)

    scored = tmp_path / "scored.csv"
    code, out, err = run_cli(
        capsys, "match", candidates, "--queries", images / "queries", "--references", images / "refs",
        "--matcher", models["matcher"], "--output", scored,
    )
    assert code == 0, err
    assert f"scores: the matcher's copy probability (sigmoid of its logit) ({models['matcher']}); uncalibrated" in out
    rescored = read_predictions(scored)
    assert {(p.query_id, p.reference_id) for p in rescored} == set(raw)
    assert all(0.0 <= p.score <= 1.0 for p in rescored)

    crops = tmp_path / "crops.csv"
    code, _, err = run_cli(
        capsys, "match", candidates, "--queries", images / "queries", "--references", images / "refs",
        "--matcher", models["matcher"], "--output", crops, "--local-crops", "--top", 1, "--reference-grid", 2,
    )
    assert code == 0, err
    crop_scores = {(p.query_id, p.reference_id): p.score for p in read_predictions(crops)}
    plain = {(p.query_id, p.reference_id): p.score for p in rescored}
    assert len(crop_scores) == 3  # --top 1: one candidate per query
    for pair, score in crop_scores.items():  # the whole-image pair is one of the views: max >= plain score
        assert score >= plain[pair] - 1e-5

    report = tmp_path / "report"
    code, out, err = run_cli(capsys, "evaluate", scored, candidates, "--ground-truth", images / "gt.csv",
                         "--output", report)
    assert code == 0, err
    metrics = json.loads((report / "metrics.json").read_text())
    assert set(metrics) == {"scored", "candidates"}
    assert {"micro_ap", "recall_at_p90", "threshold_at_p90", "recall_at_rank1", "recall_at_rank10", "mean_ap"} <= set(
        metrics["scored"]
    )
    from copynce_hf.metrics.copy_detection.formulas import copy_detection_metrics

    for name, path in (("scored", scored), ("candidates", candidates)):
        preds = read_predictions(path)
        direct = copy_detection_metrics([p.query_id for p in preds], [p.reference_id for p in preds],
                                        [p.score for p in preds], {"Q0": ["R0"], "Q1": ["R3"], "Q2": []})
        assert metrics[name] == pytest.approx(direct)
    assert metrics["candidates"]["num_predictions"] == 9
    assert (report / "pr_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "micro_ap" in out and "recall_at_p90" in out


def test_detect_with_a_descriptor_weight_says_its_scores_are_logits_and_drops_the_cards_threshold(images, tmp_path,
                                                                                                   capsys):
    """The embedded matcher's card holds a threshold of its probability: a weighted sum of logits is not one."""
    code, out, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output",
                             tmp_path / "found", "--candidates", 2, "--descriptor-weight", 4)
    assert code == 0, err
    meaning = json.loads((tmp_path / "found" / "scores.json").read_text())
    assert meaning["score"].startswith("the matcher's logit (of its copy probability")
    assert "plus 4 x the descriptor's cosine of the two whole images less the reference's background" in (
        meaning["score"])
    assert meaning["card"] is None and meaning["threshold"] is None


def test_detect_end_to_end(models, images, tmp_path, capsys):
    out_dir = tmp_path / "found"
    args = ["detect", images / "queries", "--references", images / "refs", "--output", out_dir,
            "--models", models["descriptor"], models["descriptor"], "--matcher", models["matcher"],
            "--aux", images / "aux", "--descriptor-lce", "matcher-views", "--matcher-lce", "paper", "--candidates", 3,
            "--k", 2, "--ground-truth", images / "gt.csv", "--gallery", 2]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    predictions = read_predictions(out_dir / "predictions.csv")
    assert sorted({p.query_id for p in predictions}) == ["Q0", "Q1", "Q2"]
    # what the scores are, where they are written and printed: without --calibration no threshold decides
    meaning = json.loads((out_dir / "scores.json").read_text())
    assert meaning["format"] == "copynce-scores" and meaning["model"] == models["matcher"]
    assert meaning["score"] == "the matcher's copy probability (sigmoid of its logit), the highest over the views of a pair scored"
    assert meaning["threshold"] is None and meaning["card"] is None  # the tiny matcher has no card
    assert meaning["meaning"] in out and "uncalibrated, no threshold decides" in meaning["meaning"]
    assert all(len([p for p in predictions if p.query_id == q]) == 2 for q in ("Q0", "Q1", "Q2"))
    assert all(0.0 <= p.score <= 1.0 for p in predictions)  # matcher probabilities
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert {"micro_ap", "recall_at_p90", "recall_at_rank1", "candidate_recall"} <= set(metrics)
    assert metrics["num_candidates_per_query"] == 3
    html = (out_dir / "report.html").read_text()
    assert "Top matches" in html and "Borderline matches" in html
    assert "<th>scores</th><td>scores: the matcher&#39;s copy probability" in html
    assert html.count('alt="token affinity heatmap"') == 3  # 2 top + the 1 remaining query
    assert all((out_dir / path).is_file() for path in
               [line.split('src="')[1].split('"')[0] for line in html.splitlines() if 'src="' in line])
    # both descriptor models got an index over the 10 views of every reference, reused by the next run
    assert sorted(p.name for p in (out_dir / "indexes").iterdir()) == ["descriptor", "descriptor-2"]
    assert len(DescriptorIndex.load(out_dir / "indexes" / "descriptor" / "references")) == 50
    assert "muAP" in out and "candidate recall" in out
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    assert read_predictions(out_dir / "predictions.csv") == predictions

    # descriptors only: scores are the merged (best) descriptor similarities
    plain = tmp_path / "plain"
    code, out, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output", plain,
                             "--models", models["descriptor"], "--matcher", "none", "--k", 1)
    assert code == 0, err
    assert f"scores: the descriptor's cosine ({models['descriptor']}); uncalibrated" in out
    assert len(read_predictions(plain / "predictions.csv")) == 3 and not (plain / "metrics.json").exists()
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", tmp_path / "missing", "--output", plain)
    assert_one_line_error(code, err, "does not exist")


def test_detect_stopped_by_ctrl_c_says_that_the_same_command_resumes_and_it_does(models, images, tmp_path, capsys,
                                                                                 monkeypatch):
    from copynce_hf.retrieval.verify import chunked_scoring

    save = chunked_scoring.ChunkFolder.save

    def saved_then_interrupted(self, index, chunk):  # Ctrl-C once the first chunk of matcher scores is kept
        save(self, index, chunk)
        raise KeyboardInterrupt

    output = tmp_path / "found"
    command = ["detect", images / "queries", "--references", images / "refs", "--output", output, "--models",
               models["descriptor"], "--matcher", models["matcher"], "--chunk-size", "1"]
    monkeypatch.setattr(chunked_scoring.ChunkFolder, "save", saved_then_interrupted)
    code, _, err = run_cli(capsys, *command)
    assert code == 130 and err.strip().splitlines()[-1] == (
        "copynce detect: interrupted; continue with the same command: it resumes from the indexes, matcher tokens "
        f"and scored chunks kept in {output}")
    monkeypatch.setattr(chunked_scoring.ChunkFolder, "save", save)
    assert main([*map(str, command)]) == 0  # not quiet: its log lines are read
    assert re.search(r"copynce detect: .*resuming: 1 of \d+ chunks", capsys.readouterr().err)


@pytest.mark.parametrize("command, resumes", [
    (["dedup", "imgs", "--output", "dups"], "the indexes, matcher tokens and scored chunks kept in dups (the "
                                            "self-calibration's in its self_calibration folder)"),
    (["index", "refs", "--output", "idx/refs"], "the complete chunks of descriptors kept in idx/.refs.chunks"),
    (["match", "c.csv", "--queries", "q", "--references", "r", "--output", "out/s.csv"],
     "the scored chunks kept in out/.s.csv.rescoring"),
    (["calibrate", "refs", "--output", "c.json"], None), (["search", "q", "--index", "i", "--output", "p.csv"], None),
    (["visualize", "q.jpg", "r.jpg", "--patch", "1,1", "--output", "why"], None)])
def test_the_ctrl_c_line_of_every_command_says_what_running_it_again_does(command, resumes):
    from copynce_hf.cli import build_parser
    from copynce_hf.commands.console import interrupted_line

    line = interrupted_line(build_parser().parse_args(command))
    assert line == (f"copynce {command[0]}: interrupted; " + (
        f"continue with the same command: it resumes from {resumes}" if resumes else
        "it keeps no work to resume from: the same command starts again"))


def test_detect_refuses_ground_truth_ids_before_any_model_work(models, images, tmp_path, capsys, monkeypatch):
    """Ground-truth ids with extensions (``Q0.png`` against ``Q0``) are refused before any model loads, with the
    likely fix, and leave no output folder; a metric failure at the end says that predictions.csv is written."""
    from copynce_hf.runs import settings as pipeline_settings

    wrong = tmp_path / "gt_with_extensions.csv"
    wrong.write_text("query_id,reference_id\nQ0.png,R0.png\nQ1.png,R1.png\nQ2.png,\n")
    loads = []
    monkeypatch.setattr(pipeline_settings, "load_model", lambda *a, **k: loads.append(a) or (_ for _ in ()).throw(
        AssertionError("a model was loaded before the ground truth was checked")))
    out_dir = tmp_path / "found"
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output", out_dir,
                           "--models", models["descriptor"], "--matcher", "none", "--ground-truth", wrong)
    assert_one_line_error(code, err, "gt_with_extensions.csv", "not in the ground truth", "extension")
    assert loads == [] and not out_dir.exists()
    monkeypatch.undo()
    # a ground truth whose ids match but which holds no copy pair fails in the metric, after the predictions
    no_pairs = tmp_path / "gt_no_pairs.csv"
    no_pairs.write_text("query_id,reference_id\nQ0,\nQ1,\nQ2,\n")
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output", out_dir,
                           "--models", models["descriptor"], "--matcher", "none", "--ground-truth", no_pairs)
    assert_one_line_error(code, err, "no copy pair", "predictions.csv is written; the metrics are not")
    assert (out_dir / "predictions.csv").is_file() and not (out_dir / "metrics.json").exists()


def test_detect_refused_during_the_model_work_leaves_no_folder_it_made(models, images, tmp_path, capsys):
    """References that are all unreadable are found only when they are read: the folder the run made goes too."""
    broken = tmp_path / "broken_refs"
    broken.mkdir()
    for name in ("R0", "R1"):
        (broken / f"{name}.png").write_bytes(b"not an image")
    out_dir = tmp_path / "found"
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", broken, "--output", out_dir,
                           "--models", models["descriptor"], "--matcher", "none")
    assert code == 2 and not out_dir.exists(), err
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", broken, "--output", kept,
                           "--models", models["descriptor"], "--matcher", "none")
    assert code == 2 and (kept / "notes.txt").read_text() == "mine", err
    # dedup the same
    code, _, err = run_cli(capsys, "dedup", broken, "--output", out_dir, "--model", models["descriptor"],
                           "--matcher", "none", "--threshold", "0.9")
    assert code == 2 and not out_dir.exists(), err


def test_detect_paper_preset_with_explicit_overrides(models, images, tmp_path, capsys):
    out_dir = tmp_path / "paper"
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output", out_dir,
                       "--models", models["descriptor"], "--matcher", models["matcher"], "--aux", images / "aux",
                       "--preset", "paper", "--candidates", 2, "--k", 1, "--k-end", 3)
    assert code == 0, err
    # the preset's values where no option was given, the options where they were
    html = (out_dir / "report.html").read_text()
    for key, value in (("preset", "paper (candidates, k, k_end given)"), ("descriptor LCE", "authors"),
                       ("matcher LCE", "paper"), ("candidates per query", "2"), ("predictions per query", "1")):
        assert f"<tr><th>{key}</th><td>{value}</td></tr>" in html
    assert "alpha 1.0, auxiliary ranks 1-3 of" in html
    assert len(DescriptorIndex.load(out_dir / "indexes" / "descriptor" / "references")) == 5 * 9  # authors' views
    assert DescriptorIndex.load(out_dir / "indexes" / "descriptor" / "auxiliary").info["views"] == "authors"
    predictions = read_predictions(out_dir / "predictions.csv")
    assert sorted(p.query_id for p in predictions) == ["Q0", "Q1", "Q2"]
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output",
                       tmp_path / "fast", "--models", models["descriptor"], "--matcher", "none", "--k", 1)
    assert code == 0, err
    html = (tmp_path / "fast" / "report.html").read_text()
    for key, value in (("preset", "fast (k given)"), ("descriptor LCE", "none"), ("matcher LCE", "none"),
                       ("score normalisation", "off"), ("candidates per query", str(DEFAULT_CANDIDATES))):
        assert f"<tr><th>{key}</th><td>{value}</td></tr>" in html
    code, _, err = run_cli(capsys, "detect", images / "queries", "--references", images / "refs", "--output",
                       tmp_path / "bad", "--models", models["descriptor"], "--matcher", "none", "--k-start", 5,
                       "--k-end", 2)
    assert_one_line_error(code, err, "k_start=5", "k_end=2")


def test_index_and_search_with_matcher_views(models, images, tmp_path, capsys):
    idx = tmp_path / "idx"
    code, out, err = run_cli(capsys, "index", images / "refs", "--model", models["descriptor"], "--output", idx,
                         "--descriptor-lce", "matcher-views")
    assert code == 0, err
    index = DescriptorIndex.load(idx)
    assert len(index) == 50 and index.info["views"] == "matcher-views" and index.references.ids[:2] == ["R0#0", "R0#1"]
    candidates = tmp_path / "c.csv"
    code, _, err = run_cli(capsys, "search", images / "queries", "--index", idx, "--k", 2, "--output", candidates,
                       "--descriptor-lce", "matcher-views")
    assert code == 0, err
    rows = read_predictions(candidates)
    assert len(rows) == 6 and {p.reference_id for p in rows} <= {f"R{i}" for i in range(5)}
    scored = tmp_path / "s.csv"
    code, _, err = run_cli(capsys, "match", candidates, "--queries", images / "queries", "--references", images / "refs",
                       "--matcher", models["matcher"], "--matcher-lce", "paper", "--output", scored)
    assert code == 0, err
    assert {(p.query_id, p.reference_id) for p in read_predictions(scored)} == {(p.query_id, p.reference_id)
                                                                                for p in rows}


def test_visualize_writes_maps(models, images, tmp_path, capsys):
    for kind in ("descriptor", "matcher"):
        out_dir = tmp_path / kind
        code, out, err = run_cli(
            capsys, "visualize", images / "queries" / "Q0.png", images / "refs" / "R0.png",
            "--model", models[kind], "--patch", "1,0", "--output", out_dir,
        )
        assert code == 0, err
        maps = np.load(out_dir / "maps.npz")
        assert maps["affinity"].shape == (2, 2) and maps["entropy"].shape == (2, 2)
        assert maps["affinity"].sum() == pytest.approx(1.0, abs=1e-5)
        assert (maps["entropy"] >= -1e-6).all() and (maps["entropy"] <= np.log(4) + 1e-5).all()
        for name in ("token_affinity.png", "affinity_entropy.png"):
            assert (out_dir / name).read_bytes()[:4] == b"\x89PNG"
        # the files it says it wrote are the files it wrote
        assert sorted(path.name for path in out_dir.iterdir()) == ["affinity_entropy.png", "maps.npz",
                                                                   "token_affinity.png"]
        assert all(str(out_dir / name) in out for name in ("affinity_entropy.png", "maps.npz", "token_affinity.png"))
        printed = float(re.search(r"(?:copy probability|descriptor cosine) (\S+) of the pair", out).group(1))
        assert printed == pytest.approx(_pair_score(models[kind], images / "queries" / "Q0.png",
                                                    images / "refs" / "R0.png"), abs=1e-4)
        assert (f"copy probability {printed:.4f} of the pair (the matcher {models[kind]}" if kind == "matcher" else
                f"descriptor cosine {printed:.4f} of the pair (the descriptor {models[kind]}; a cosine, not a "
                "probability") in out
    code, _, err = run_cli(capsys, "visualize", images / "queries" / "Q0.png", images / "refs" / "R0.png",
                       "--model", models["descriptor"], "--patch", "2,0", "--output", tmp_path / "bad")
    assert code == 2 and "outside the query's 2x2 patch grid" in err


def _pair_score(model: str, query: Path, reference: Path) -> float:
    """The pair's score the models themselves give: a matcher's sigmoid(logit), a descriptor's cosine."""
    from copynce_hf.modeling.configuration_copynce import model_kind
    from copynce_hf.runtime.loading import load_model

    loaded, processor = load_model(model)
    pixels = processor(images=[Image.open(query), Image.open(reference)], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        if model_kind(loaded) == "matcher":
            return torch.sigmoid(loaded(pixel_values=pixels[:1], reference_pixel_values=pixels[1:]).logits).item()
        found = loaded(pixel_values=pixels).descriptors
        return (found[0] @ found[1]).item()


def test_visualize_explains_with_the_embedded_matcher_and_prints_its_copy_probability(tmp_path, capsys):
    """Without --model, the embedded matcher: the maps come with the pair's copy probability, the score of the
    image-copy-detection pipeline."""
    from transformers import pipeline

    from copynce_hf.calibration.meaning import card_threshold
    from copynce_hf.runtime.loading import DEFAULT_MATCHER

    original = Image.open(ASSETS / "chelsea.jpg")
    original.crop((30, 20, 300, 235)).rotate(8).save(tmp_path / "copy.png")
    code, out, err = run_cli(capsys, "visualize", tmp_path / "copy.png", ASSETS / "chelsea.jpg", "--patch", "3,3",
                             "--output", tmp_path / "why")
    assert code == 0, err
    detector = pipeline("image-copy-detection", model=str(DEFAULT_MATCHER))
    expected = detector(str(tmp_path / "copy.png"), str(ASSETS / "chelsea.jpg"))["score"]
    assert f"copy probability {expected:.4f} of the pair (the embedded matcher, on the whole images)" in out
    assert expected > 0.99
    card = card_threshold(None, "matcher")
    assert (f"uncalibrated, not the chance that the pair is a copy; look-alike images can score as high as copies; its "
            f"model card puts precision 0.9 on mini-DISC at {card.threshold:.4f}") in out


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("copynce ") and ": error: " in last
    for fragment in fragments:
        assert fragment in last


def test_error_missing_and_empty_folder(models, tmp_path, capsys):
    code, _, err = run_cli(capsys, "index", tmp_path / "nowhere", "--model", models["descriptor"], "--output", tmp_path / "o")
    assert_one_line_error(code, err, "does not exist", "nowhere")
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "index", tmp_path / "empty", "--model", models["descriptor"], "--output", tmp_path / "o")
    assert_one_line_error(code, err, "holds no image file")
    assert not (tmp_path / "o").exists()


def test_error_ivfpq_on_too_few_references(models, images, tmp_path, capsys):
    code, _, err = run_cli(capsys, "index", images / "refs", "--model", models["descriptor"], "--index-type", "ivfpq",
                       "--output", tmp_path / "o")
    assert_one_line_error(code, err, "at least 256 references", "flat")


def test_error_ground_truth_unknown_columns(images, tmp_path, capsys):
    preds = tmp_path / "p.csv"
    preds.write_text("query_id,reference_id,score\nQ0,R0,0.9\n")
    gt = tmp_path / "gt.csv"
    gt.write_text("query,ref\nQ0,R0\n")
    code, _, err = run_cli(capsys, "evaluate", preds, "--ground-truth", gt, "--output", tmp_path / "r")
    assert_one_line_error(code, err, "unknown column", "'query'")


def test_error_duplicate_predictions(images, tmp_path, capsys):
    preds = tmp_path / "dup.csv"
    preds.write_text("query_id,reference_id,score\nQ0,R0,0.9\nQ1,R3,0.5\nQ0,R0,0.4\n")
    code, _, err = run_cli(capsys, "evaluate", preds, "--ground-truth", images / "gt.csv", "--output", tmp_path / "r")
    assert_one_line_error(code, err, "duplicate", "'Q0'", "'R0'")
    code, _, err = run_cli(capsys, "match", preds, "--queries", images / "queries", "--references", images / "refs",
                       "--output", tmp_path / "m.csv")
    assert_one_line_error(code, err, "duplicate")


def test_error_missing_embedded_model(images, tmp_path, capsys, monkeypatch):
    from copynce_hf.runtime import loading as models

    monkeypatch.setitem(models.DEFAULTS, "descriptor", tmp_path / "pretrained" / "descriptor")
    code, _, err = run_cli(capsys, "index", images / "refs", "--output", tmp_path / "o")
    assert_one_line_error(code, err, "embedded model folder", "--model")


def test_help_describes_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("detect", "index", "search", "match", "evaluate", "visualize"):
        assert command in out
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--output" in capsys.readouterr().out


def _options(command: str) -> dict:
    """option string -> argparse action of one command."""
    from copynce_hf.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {option: action for action in commands.choices[command]._actions for option in action.option_strings}


PIPELINE = ("detect", "calibrate", "dedup")


@pytest.mark.parametrize(("option", "commands"), [
    ("--calibration", ("detect", "dedup")), ("--precision", ("detect", "dedup")), ("--matcher", PIPELINE),
    ("--candidates", PIPELINE), ("--descriptor-lce", PIPELINE), ("--matcher-lce", (*PIPELINE, "match")),
    ("--runtime", ("detect", "index", "search", "match")), ("--content-tokens", PIPELINE),
    ("--descriptor-content-tokens", PIPELINE),
])
def test_a_shared_option_is_declared_once_with_one_help(option, commands):
    """An option of several commands has the same help in each (only a command's own default replaces the
    presets' values at the end), the same choices, type and metavar."""
    def without_defaults(text: str) -> str:
        return re.sub(r" \((default|fast:)[^()]*(\([^()]*\)[^()]*)*\)$", "", text)

    actions = [_options(command)[option] for command in commands]
    assert {without_defaults(action.help) for action in actions} == {without_defaults(actions[0].help)}
    assert len({(tuple(action.choices or ()), action.type, action.metavar) for action in actions}) == 1
    assert option in ("--candidates", "--descriptor-lce", "--matcher-lce", "--content-tokens") or len(
        {a.help for a in actions}) == 1
