"""Tests of the benchmark package (benchmarks/): mini-DISC, systems, quality, speed, report, training driver.

A tiny mini-DISC is built from the package's bundled sample images (copynce_hf/assets/images) with
a splits CSV written into tmp_path, so these tests never read ../shared/data.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import TINY_VIT, require_extra, require_sscd
from PIL import Image

from benchmarks.minidisc import MiniDiscConfig, build_minidisc
from benchmarks.quality.systems import evaluate_system, run_quality
from benchmarks.report import load_quality, render
from benchmarks.speed import dense_tables
from benchmarks.speed.parts import bench_faiss, bench_pixtrace, pixtrace_chain
from benchmarks.training.train import VARIANTS, plan_runs, prepare_train_split
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.data.instances import read_manifest
from copynce_hf.evaluation.systems import HashSystem, SystemOutput, score_predictions
from copynce_hf.pixtrace import CoordinateTable, CopyEditor, CopyRecipe, pair_overlaps
from copynce_hf.pixtrace.edits import Resize
from copynce_hf.retrieval import Prediction

ASSETS = sorted(ASSET_IMAGES.glob("*.jpg"))
TINY_MODEL = {**TINY_VIT, "descriptor_dim": 16}


def _splits(tmp_path, references: int = 8, distractors: int = 3):
    """A splits CSV over the bundled images: ``references`` references, then distractors, rest train."""
    path = tmp_path / "splits.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["filename", "split"])
        for index, file in enumerate(ASSETS):
            split = "reference" if index < references else "distractor" if index < references + distractors else "train"
            writer.writerow([file.name, split])
    return path


def _config(tmp_path, **changes) -> MiniDiscConfig:
    return MiniDiscConfig(image_folder=ASSET_IMAGES, splits_csv=_splits(tmp_path), seed=7, **changes)


#: A recipe whose queries are the originals themselves (photometric factor 1): every system that works
#: must find them.
IDENTITY_RECIPE = CopyRecipe.minidisc_queries().updated({"structural": {"count": [0, 0]},
                                               "photometric": {"weights": [["brightness", 1.0]], "count": [1, 1]},
                                               "brightness": {"factor": [1.0, 1.0]}})


# ---------------------------------------------------------------------------------------------- mini-DISC


def test_minidisc_structure_and_determinism(tmp_path):
    config = _config(tmp_path)
    task = build_minidisc(config)
    # every other reference (0, 2, 4, 6) gets a copy; the 3 distractors get one query each
    assert len(task.reference_ids) == 8 and len(task.queries) == 4 + 3
    copies = sorted(refs[0] for refs in task.ground_truth.values() if refs)
    assert copies == sorted(task.reference_ids[::2])
    assert sum(1 for refs in task.ground_truth.values() if not refs) == 3
    distractor_names = {p.name for p in ASSETS[8:11]}
    assert {q.source_path.name for q in task.queries if q.reference_id is None} == distractor_names
    again = build_minidisc(config)
    assert again.fingerprint == task.fingerprint
    first = task.queries[0]
    assert np.array_equal(np.asarray(task.query_image(0)), np.asarray(again.query_image(0)))
    assert first.edits, "every query is edited"
    # another seed gives other edits
    assert build_minidisc(dataclasses.replace(config, seed=8)).fingerprint != task.fingerprint


def test_minidisc_export_lays_out_folders_for_detect(tmp_path):
    from copynce_hf.metrics.copy_detection.formulas import read_ground_truth_csv
    from copynce_hf.retrieval import ImageFolderSource

    task = build_minidisc(_config(tmp_path))
    layout = task.export(tmp_path / "export")
    assert ImageFolderSource(layout["queries"]).ids == sorted(task.query_ids)
    assert ImageFolderSource(layout["references"]).ids == sorted(task.reference_ids)
    assert len(ImageFolderSource(layout["auxiliary"]).ids) == len(ASSETS) - 11  # the train split
    assert read_ground_truth_csv(layout["ground_truth"]) == task.ground_truth


def test_minidisc_fingerprint_is_pinned():
    """The benchmark's mini-DISC draws exactly the queries it always drew (the package's evaluation engine)."""
    from conftest import SPLITS_CSV

    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    from benchmarks.minidisc import build_minidisc as build_default

    task = build_default()
    assert (len(task.reference_ids), len(task.queries)) == (300, 250)
    assert task.fingerprint == "3ecfc93f771d"


def test_one_evaluation_engine_serves_demo_benchmarks_and_cli():
    import benchmarks.quality.systems
    import copynce_hf.demo.run
    import copynce_hf.demo.systems
    from copynce_hf.evaluation import demo_task, minidisc, systems
    from copynce_hf.runs import settings as pipeline_settings
    from copynce_hf.runtime import loading as model_loading

    assert benchmarks.quality.systems.HashSystem is systems.HashSystem is copynce_hf.demo.systems.HashSystem
    assert benchmarks.quality.systems.MiniDisc is minidisc.MiniDisc
    assert copynce_hf.demo.run.DemoTask is demo_task.DemoTask
    assert pipeline_settings.load_model is model_loading.load_model is copynce_hf.demo.run.load_model


def test_evaluation_recipe_differs_from_training_recipe(tmp_path):
    # Every edit the training recipe can draw (all steps forced on), on a small image.
    everything = CopyRecipe.training().with_probability(1.0)
    training_names = set()
    for seed in range(3):
        training_names |= {e["name"] for e in CopyEditor(seed=seed, recipe=everything)(Image.open(ASSETS[0])).edits}
    task = build_minidisc(_config(tmp_path))
    recipe = CopyRecipe.minidisc_queries()
    rng = np.random.default_rng(0)
    synthetic = [tuple(e.to_dict() for e in recipe.draw(rng, (375, 500))) for _ in range(200)]
    for edits in [q.edits for q in task.queries] + synthetic:
        names = {e["name"] for e in edits}
        assert names - training_names, f"query edits {names} use only training-recipe edits"
    # heavy crops (always the first edit when drawn) keep at most 45 % of the image
    crops = [edits[0]["params"] for edits in synthetic if edits[0]["name"] == "crop"]
    assert crops
    for p in crops:
        assert (p["right"] - p["left"]) * (p["bottom"] - p["top"]) <= 0.46 * 375 * 500


def test_materialize_writes_the_replayed_queries_once(tmp_path):
    task = build_minidisc(_config(tmp_path))
    expected = np.asarray(task.query_image(1))
    files = task.materialize(tmp_path / "cache")
    assert len(files) == len(task.queries) and all(p.suffix == ".png" for p in files.values())
    assert np.array_equal(np.asarray(Image.open(files[task.query_ids[1]]).convert("RGB")), expected)
    assert all(max(Image.open(p).size) <= CopyRecipe.minidisc_queries().max_side for p in files.values())
    stamps = {p: p.stat().st_mtime_ns for p in files.values()}
    task.materialize(tmp_path / "cache")
    assert stamps == {p: p.stat().st_mtime_ns for p in files.values()}
    assert json.loads((tmp_path / "cache" / task.fingerprint / "task.json").read_text())["num_queries"] == 7


# ---------------------------------------------------------------------------------------------- systems


@pytest.mark.parametrize("system,module", [(HashSystem.pdq(), "pdqhash"), (HashSystem.phash(), "imagehash")],
                         ids=["pdq", "phash"])
def test_hash_systems_find_unedited_copies(tmp_path, system, module):
    require_extra(module, "bench")
    task = build_minidisc(_config(tmp_path, recipe=IDENTITY_RECIPE))
    predictions = system.predict(task, k=5).predictions
    per_query = {q: [p.query_id for p in predictions].count(q) for q in task.query_ids}
    assert set(per_query.values()) == {5}
    assert all(0 <= p.score <= 1 for p in predictions)
    metrics, curve = score_predictions(predictions, task.ground_truth)
    assert metrics["recall_at_rank1"] == 1.0  # an unedited copy is at Hamming distance 0
    for query_id, reference_id, score in predictions:
        if task.ground_truth[query_id] == [reference_id]:
            assert score == 1.0
    assert len(curve["precision"]) == len(predictions)


def test_sscd_systems_find_unedited_copies(tmp_path):
    """SSCD's two graphs as mini-DISC systems (raw cosine k-NN): an unedited copy comes first."""
    from copynce_hf.evaluation.systems import SSCD_MODELS, DescriptorSystem

    require_sscd()
    task = build_minidisc(_config(tmp_path, recipe=IDENTITY_RECIPE))
    for name in SSCD_MODELS:
        predictions = DescriptorSystem.sscd(name, batch_size=4).predict(task, k=3).predictions
        assert len(predictions) == 3 * len(task.queries)
        assert score_predictions(predictions, task.ground_truth)[0]["recall_at_rank1"] == 1.0


def test_hash_score_is_one_minus_normalised_hamming(tmp_path):
    require_extra("imagehash", "bench")
    task = build_minidisc(_config(tmp_path))
    system = HashSystem.phash()
    predictions = system.predict(task, k=3).predictions
    query_hashes = dict(zip(task.query_ids, system.hashes(task.query_source())))
    reference_hashes = dict(zip(task.reference_ids, system.hashes(task.reference_source())))
    for q, r, score in predictions:
        assert score == pytest.approx(1 - np.count_nonzero(query_hashes[q] != reference_hashes[r]) / 64)
    # rank order within a query: scores never increase
    for q in task.query_ids:
        scores = [s for qq, _, s in predictions if qq == q]
        assert scores == sorted(scores, reverse=True)


def test_quality_run_writes_each_system_and_report(tmp_path):
    require_extra("pdqhash", "bench")
    task = build_minidisc(_config(tmp_path, recipe=IDENTITY_RECIPE))
    config_file = tmp_path / "bench.yaml"
    config_file.write_text("model:\n" + "".join(f"  {k}: {v}\n" for k, v in TINY_MODEL.items()))
    out = tmp_path / "results"
    results = run_quality(task, ["pdq", "random"], out, tmp_path / "queries", runs_dir=tmp_path / "none",
                          random_config=config_file, k=4, batch_size=4)
    assert set(results) == {"pdq", "random-vit"}
    for name in results:
        record = json.loads((out / f"{name}.json").read_text())
        assert record["task"]["fingerprint"] == task.fingerprint
        assert len(record["predictions"]["score"]) == 4 * len(task.queries)
        assert len(record["pr_curve"]["precision"]) == len(record["pr_curve"]["recall"]) == 4 * len(task.queries)
        assert 0.0 <= record["metrics"]["micro_ap"] <= 1.0
    # the random ViT embeds an unedited copy exactly like its reference: cosine 1 at rank 1
    assert results["random-vit"]["metrics"]["recall_at_rank1"] == 1.0
    # two seeds of one variant: the report's mean row is their mean
    for seed, keep in ((0, 4), (1, 2)):
        rows = results["random-vit"]["predictions"]
        kept = [i for i, _ in enumerate(rows["score"]) if i % 4 < keep]
        predictions = [Prediction(rows["query_id"][i], rows["reference_id"][i], rows["score"][i]) for i in kept]
        evaluate_system(f"descriptor-copynce-seed{seed}", SystemOutput(predictions), task, out,
                        {"family": "descriptor", "variant": "copynce", "seed": seed})
    records = {r["system"]: r for r in load_quality(out)}
    markdown = render(out, tmp_path / "B.md", tmp_path / "figures")
    mean = (records["descriptor-copynce-seed0"]["metrics"]["micro_ap"]
            + records["descriptor-copynce-seed1"]["metrics"]["micro_ap"]) / 2
    assert f"**descriptor-copynce (mean of 2)** | - | **{mean:.4f}**" in markdown
    assert "| pdq |" in markdown and (tmp_path / "figures" / "pr_curves.png").is_file()
    assert "](figures/pr_curves.png)" in markdown


# ---------------------------------------------------------------------------------------------- speed


def test_dense_reference_tables_agree_with_pixtrace():
    rng = np.random.default_rng(3)
    original = (375, 500)
    for _ in range(3):
        query_edits = pixtrace_chain(rng, original)
        qr_dense, rq_dense = dense_tables.pair_priors(query_edits, [Resize(224, 224)], original, 16)
        query = CoordinateTable.identity(*original)
        for edit in query_edits:
            query = edit.trace(query)
        qr, rq = pair_overlaps(query, Resize(224, 224).trace(CoordinateTable.identity(*original)), 16)
        assert qr_dense.shape == qr.shape == (196, 196) and rq_dense.shape == rq.shape
        assert np.all(qr_dense.sum(1) <= 1 + 1e-6)
        # nearest sampling moves a few border pixels between patches, nothing more
        assert np.abs(qr_dense - qr).sum(1).mean() < 0.08
        assert abs(qr_dense.sum() - qr.sum()) / qr.sum() < 0.02


def test_dense_inverse_scatter_last_pixel_wins():
    table = np.zeros((2, 3, 2), dtype=np.float32)  # every pixel maps to frame cell (0, 0)
    table[1, 2] = (1, 1)
    inverse = dense_tables.invert_scatter(table, (2, 2))
    assert tuple(inverse[0, 0]) == (1.0, 1.0)  # (row 1, col 1) is the last of the five pixels on (0, 0)
    assert tuple(inverse[1, 1]) == (1.0, 2.0)
    assert np.isnan(inverse[0, 1]).all() and np.isnan(inverse[1, 0]).all()


def test_bench_pixtrace_reports_both_implementations():
    figures = bench_pixtrace(pairs=4)
    assert figures["pixtrace_ms_per_pair"] > 0 and figures["dense_ms_per_pair"] > 0
    assert figures["speedup"] == pytest.approx(figures["dense_ms_per_pair"] / figures["pixtrace_ms_per_pair"])
    assert figures["mean_l1_row_difference_qr"] < 0.1


def test_bench_faiss_exact_is_exact():
    figures = bench_faiss(sizes=(3000,), dim=32, num_queries=40, kinds=("hnsw",), noise=0.5)
    entry = figures["sizes"]["3000"]
    assert entry["flat"]["recall_at_10"] == 1.0 and entry["flat"]["found_at_1"] == 1.0
    assert 0.0 <= entry["hnsw"]["recall_at_10"] <= 1.0 and entry["hnsw"]["queries_per_second"] > 0
    # Above hnsw_max_size the HNSW row says why it is missing, and the report renders it.
    limited = bench_faiss(sizes=(300,), dim=16, num_queries=10, kinds=("hnsw",), hnsw_max_size=100)
    assert "skipped" in limited["sizes"]["300"]["hnsw"] and limited["sizes"]["300"]["flat"]["recall_at_10"] == 1.0
    from benchmarks.report import speed_section

    limited.update(command="c", wall_seconds=1.0)
    assert "HNSW not built above 100 vectors" in speed_section({"parts": {"faiss": limited}})


# ---------------------------------------------------------------------------------------------- training driver


def test_training_runs_differ_only_by_copynce_weight(tmp_path):
    runs = plan_runs("descriptor", ["baseline", "copynce"], [0, 1], 123, tmp_path / "runs", tmp_path / "data")
    assert [r.name for r in runs] == ["descriptor-baseline-seed0", "descriptor-copynce-seed0",
                                      "descriptor-baseline-seed1", "descriptor-copynce-seed1"]
    baseline, copynce = runs[0].command(), runs[1].command()
    extra = [a for a in baseline if a not in copynce or baseline.count(a) != copynce.count(a)]
    assert set(extra) <= {"--model.copynce_weight", "0", str(tmp_path / "runs" / "descriptor-baseline-seed0")}
    assert "--model.copynce_weight" in baseline and VARIANTS["baseline"] == {"copynce_weight": 0}
    assert baseline[baseline.index("--max_steps") + 1] == "123" == copynce[copynce.index("--max_steps") + 1]
    assert runs[0].display_command().startswith("accelerate launch")


def test_multi_process_runs_take_a_core_each_and_resume_from_their_latest_checkpoint(tmp_path):
    from benchmarks.training.train import core_groups

    assert core_groups([0, 1], parallel=2) == ["0", "1"]
    assert core_groups([0, 1], parallel=1, processes=2) == ["0,1"]
    assert core_groups([3], parallel=1, processes=2) == ["3,3"]  # too few cores: shared, with a warning
    run = plan_runs("descriptor", ["copynce"], [0], 50, tmp_path / "runs", tmp_path / "data", processes=2,
                    resume=True)[0]
    command = run.command()
    assert command[command.index("--num_processes") + 1] == "2"
    assert "--multi_gpu" in command and "--cpu" not in command  # torchrun + gloo: two real processes
    assert run.environment() == {"ACCELERATE_USE_CPU": "true"}
    assert run.display_command().startswith("ACCELERATE_USE_CPU=true accelerate launch")
    assert command[-2:] == ["--resume", "latest"]
    fresh = plan_runs("descriptor", ["copynce"], [0], 50, tmp_path / "runs", tmp_path / "data")[0].command()
    assert fresh[fresh.index("--num_processes") + 1] == "1" and "--resume" not in fresh


def test_gpu_matcher_runs_use_bf16_and_the_configured_knn_graph(tmp_path):
    from benchmarks.training.train import CONFIGS, REPO_ROOT, ensure_knn_graph

    run = plan_runs("matcher", ["copynce"], [0], 10, tmp_path / "runs", tmp_path / "data", gpu=True)[0]
    command = run.command()
    assert "--cpu" not in command and command[command.index("--mixed_precision") + 1] == "bf16"
    configured = yaml.safe_load(CONFIGS["matcher"].read_text())
    # The matcher starts from the committed baseline descriptor, whose folder must exist.
    assert (REPO_ROOT / configured["init_from_dino"] / "model.safetensors").is_file()
    assert ensure_knn_graph("matcher", tmp_path / "data", dry_run=True) == REPO_ROOT / configured["knn_graph"]


def test_train_split_folder_links_only_train_images(tmp_path):
    folder = prepare_train_split(tmp_path, ASSET_IMAGES, _splits(tmp_path, references=6, distractors=4))
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in ASSETS[10:])
    # a changed split definition removes links that are no longer train images
    folder2 = prepare_train_split(tmp_path, ASSET_IMAGES, _splits(tmp_path, references=6, distractors=5))
    assert sorted(p.name for p in folder2.iterdir()) == sorted(p.name for p in ASSETS[11:])


def test_train_split_subset_keeps_the_held_out_images_and_nests(tmp_path):
    splits = _splits(tmp_path, references=2, distractors=1)  # 9 train images: 6 to train on, the last 3 held out
    train = sorted(p.name for p in ASSETS[3:])
    small = sorted(p.name for p in prepare_train_split(tmp_path / "a", ASSET_IMAGES, splits, 2, held_out=3).iterdir())
    large = sorted(p.name for p in prepare_train_split(tmp_path / "b", ASSET_IMAGES, splits, 4, held_out=3).iterdir())
    assert small[-3:] == large[-3:] == train[-3:]  # the runs' evaluation images, last in name order
    assert len(small) == 5 and len(large) == 7 and set(small) < set(large)  # a smaller draw is inside a larger one
    assert set(small[:-3]) != set(train[:2])  # a seeded draw, not the first names
    with pytest.raises(SystemExit, match="--train-images 7: the split has 6 training images"):
        prepare_train_split(tmp_path / "c", ASSET_IMAGES, splits, 7, held_out=3)


def test_train_split_instances_come_from_the_training_photos_only_and_keep_the_held_out_last(tmp_path):
    splits = _splits(tmp_path, references=2, distractors=1)  # 9 train images: 6 to train on, the last 3 held out
    train = sorted(ASSETS[3:], key=lambda path: path.name)
    folder = prepare_train_split(tmp_path, ASSET_IMAGES, splits, 4, held_out=3, instances="grid2,procedural3")
    manifest = read_manifest(folder)
    names = sorted(p.name for p in folder.iterdir() if p.name != "instances.json")
    assert names[-3:] == [path.name for path in train[-3:]]  # the runs' evaluation images, whole, last, same names
    assert all((folder / name).resolve() == path.resolve() for name, path in zip(names[-3:], train[-3:]))
    sources = {source for record in manifest["instances"] if record["kind"] != "held_out" for source in record["sources"]}
    drawn = sorted(p.name for p in prepare_train_split(tmp_path / "plain", ASSET_IMAGES, splits, 4, held_out=3).iterdir())
    assert {Path(source).name for source in sources} == set(drawn[:-3])  # the same 4 photos --train-images 4 draws
    assert len(names) == 4 * 4 + 3 + 3  # cells (the bundled images are large enough), procedural images, held out
    made = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    prepare_train_split(tmp_path, ASSET_IMAGES, splits, 4, held_out=3, instances="grid2,procedural3")
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == made  # a second start (--resume) keeps them
    prepare_train_split(tmp_path, ASSET_IMAGES, splits, 4, held_out=3, instances="grid2,procedural3", instance_seed=1)
    assert read_manifest(folder)["settings"]["seed"] == 1  # another seed: made again
    plain = prepare_train_split(tmp_path, ASSET_IMAGES, splits, 4, held_out=3)
    assert sorted(p.name for p in plain.iterdir()) == drawn  # back to links: no instance left behind
    with pytest.raises(SystemExit, match="--instances: .*cannot read 'grid'"):
        prepare_train_split(tmp_path, ASSET_IMAGES, splits, instances="grid")


def test_trained_run_folders_are_discovered_and_matcher_rescores_top_k(tmp_path):
    import torch

    from copynce_hf.evaluation.systems import DescriptorSystem
    from copynce_hf.modeling import (
        CopyNCEDescriptorConfig,
        CopyNCEDescriptorModel,
        CopyNCEImageProcessor,
        CopyNCEMatcherConfig,
        CopyNCEMatcherModel,
    )

    runs = tmp_path / "runs"
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    torch.manual_seed(0)
    descriptor = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**TINY_MODEL))
    descriptor.save_pretrained(runs / "descriptor-copynce-seed0")
    processor.save_pretrained(runs / "descriptor-copynce-seed0")
    matcher_config = {k: v for k, v in TINY_MODEL.items() if k != "descriptor_dim"}
    matcher = CopyNCEMatcherModel(CopyNCEMatcherConfig(**matcher_config, num_fusion_layers=1))
    matcher.save_pretrained(runs / "matcher-copynce-seed0")
    processor.save_pretrained(runs / "matcher-copynce-seed0")
    (runs / "descriptor-stray").mkdir()  # not a run name: ignored

    task = build_minidisc(_config(tmp_path))
    out = tmp_path / "results"
    results = run_quality(task, ["descriptors", "matchers"], out, tmp_path / "queries", runs_dir=runs, k=3,
                          batch_size=4)
    assert list(results) == ["descriptor-copynce-seed0", "matcher-copynce-seed0"]
    # the saved folder, loaded with AutoModel, ranks exactly like the in-memory model
    direct = DescriptorSystem("direct", descriptor, processor, batch_size=4).predict(task, k=3).predictions
    saved = results["descriptor-copynce-seed0"]["predictions"]
    assert saved["reference_id"] == [p.reference_id for p in direct]
    assert np.allclose(saved["score"], [p.score for p in direct], atol=1e-5)
    # the matcher re-scores the same candidate pairs with probabilities
    rescored = results["matcher-copynce-seed0"]
    assert rescored["candidates"] == "descriptor-copynce-seed0"
    pairs = set(zip(saved["query_id"], saved["reference_id"]))
    assert set(zip(rescored["predictions"]["query_id"], rescored["predictions"]["reference_id"])) == pairs
    scores = np.array(rescored["predictions"]["score"])
    assert np.all((scores > 0) & (scores < 1)) and not np.allclose(scores, saved["score"])


def test_a_run_with_a_weight_average_is_discovered_as_two_descriptors(tmp_path):
    """A run trained with ``ema_decay`` holds the average (scored under the run's name) and its
    trained weights in ``without_ema/`` (scored as ``<run>-without-ema``); a run without keeps one entry."""
    from benchmarks.quality.systems import discover_runs

    for name, summary in (("descriptor-copynce-seed0", {"ema_decay": 0.998, "history": []}),
                          ("descriptor-baseline-seed0", {"ema_decay": None})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "training_summary.json").write_text(json.dumps(summary))
    (tmp_path / "descriptor-copynce-seed0" / "without_ema").mkdir()
    (tmp_path / "descriptor-copynce-seed0" / "without_ema" / "config.json").write_text("{}")
    found = discover_runs(tmp_path)["descriptor"]
    assert [(e["name"], Path(e["folder"]).relative_to(tmp_path).as_posix(), e["weights"]) for e in found] == [
        ("descriptor-baseline-seed0", "descriptor-baseline-seed0", "trained"),
        ("descriptor-copynce-seed0", "descriptor-copynce-seed0", "ema"),
        ("descriptor-copynce-seed0-without-ema", "descriptor-copynce-seed0/without_ema", "trained")]
    assert found[2]["variant"] == "copynce" and found[2]["seed"] == 0 and "history" not in found[2]["training"]


def test_scaling_table_and_figure_read_the_runs_and_their_scores(tmp_path):
    """``benchmarks.training.scaling``: one row per scored run (pairs = steps x batch, the recipe and precision
    read from the run's own files), a mean row where seeds repeat a budget, and the figure."""
    from benchmarks.training.scaling import load_rows, save_scaling_figure, scaling_table

    task = build_minidisc(_config(tmp_path, recipe=IDENTITY_RECIPE))
    queries = [q.query_id for q in task.queries]
    references = list(task.reference_ids)
    folders = []
    for steps, runs in ((4, [("copynce", 0), ("baseline", 0)]), (8, [("copynce", 0), ("copynce", 1), ("copynce", 2)])):
        budget = tmp_path / f"steps{steps}"
        folders.append(budget)
        for variant, seed in runs:
            name = f"descriptor-{variant}-seed{seed}"
            run = budget / "runs" / name
            run.mkdir(parents=True)
            recipe = " --query_recipe paper_descriptor" if steps == 8 and seed == 1 else ""
            (run / "run.json").write_text(json.dumps({
                "name": name, "variant": variant, "seed": seed, "wall_seconds": 60.0 * steps,
                "command": f"taskset -c 0 python scripts/train.py --config c.yaml --max_steps {steps} "
                           f"--per_device_train_batch_size 16 --mixed_precision bf16{recipe}"}))
            ema = seed == 2  # a run with a weight average: two records, the average and the trained weights
            (run / "training_summary.json").write_text(json.dumps({
                "steps": steps, "num_processes": 1, "mixed_precision": "bf16", "eval": {"micro_ap": 0.5},
                **({"ema_decay": 0.998, "eval_without_ema": {"micro_ap": 0.25}} if ema else {})}))
            for system in [name, name + "-without-ema"] if ema else [name]:
                rng = np.random.default_rng(steps + seed + len(system))
                chosen = [references[int(i)] for i in rng.integers(len(references), size=len(queries))]
                predictions = [Prediction(*row) for row in zip(queries, chosen, rng.random(len(queries)).tolist())]
                evaluate_system(system, SystemOutput(predictions), task, budget / "quality",
                                {"family": "descriptor", "variant": variant, "seed": seed})
    rows = load_rows(folders)
    assert len(rows) == 6
    assert {(r.variant, r.recipe, r.steps, r.pairs) for r in rows} == {
        ("copynce", "training", 4, 64), ("baseline", "training", 4, 64), ("copynce", "training", 8, 128),
        ("copynce", "paper_descriptor", 8, 128)}
    assert all(r.precision == "bf16" and r.wall_minutes == r.steps for r in rows)
    # the average is its own series; the trained weights join the series without EMA (seeds 0 and 2)
    assert {(r.seed, r.series, r.held_out_micro_ap) for r in rows if r.seed == 2} == {
        (2, "copynce / training recipe / bf16 / per_device_train_batch_size 16 / EMA 0.998", 0.5),
        (2, "copynce / training recipe / bf16 / per_device_train_batch_size 16", 0.25)}
    table = scaling_table(rows)
    assert table.count("\n") == 2 + 6 + 1  # header, rule, a row per record, the mean of seeds 0 and 2 at 8 steps
    assert "copynce / paper_descriptor recipe / bf16" in table and "**copynce / training recipe / bf16 / per_device_train_batch_size 16 (mean of 2)**" in table
    figure = save_scaling_figure(rows, tmp_path / "scaling.png")
    assert Image.open(figure).size[0] > 800
    with pytest.raises(SystemExit, match="no descriptor quality records"):
        load_rows([tmp_path / "missing"])


def test_scaling_figure_labels_only_budgets_apart_on_its_log_axis():
    from benchmarks.training.scaling import spaced_ticks

    # two runs at nearly the same budget (984,064 and 1,001,472 pairs) get one label, not two printed over each other
    assert spaced_ticks([10368, 20736, 474112, 984064, 1001472]) == [10368, 20736, 474112, 984064]
    assert spaced_ticks([100, 110, 124, 126]) == [100, 126] and spaced_ticks([]) == []


def test_scaling_series_name_the_options_a_probe_changed():
    from benchmarks.training.scaling import other_options

    command = ("taskset -c 1 python -m accelerate.commands.launch --num_processes 1 --cpu scripts/train.py --config "
               "c.yaml --dataset d --output_dir o --seed 0 --max_steps 324 --warmup_steps 40 --mixed_precision bf16 "
               "--model.copynce_weight 0 --learning_rate 2e-3 --model.koleo_scope all_embeddings --ema_decay 0.99 "
               "--checkpointing_steps 100 --resume latest")
    assert other_options(command) == "learning_rate 2e-3, model.koleo_scope all_embeddings"
    assert other_options("python scripts/train.py --config c.yaml --max_steps 4") == ""


def test_scaling_rows_count_accumulated_pairs_and_name_a_probed_warm_up(tmp_path):
    """Pairs seen come from the run's summary (an accumulation probe's 162 steps of 2 x 32 pairs sit at the
    324-step budget), and a warm-up that is not the stretched schedule's makes its own series."""
    from benchmarks.training.scaling import load_rows, warmup_option

    assert warmup_option(40, 324) == warmup_option(20, 162) == warmup_option(320, 2592) == warmup_option(None, 9) == ""
    assert warmup_option(80, 324) == "warmup_steps 80"
    task = build_minidisc(_config(tmp_path, recipe=IDENTITY_RECIPE))
    queries, references = [q.query_id for q in task.queries], list(task.reference_ids)
    folders = []
    for probe, steps, warmup, extra in (("accum", 162, 20, " --gradient_accumulation_steps 2"),
                                        ("warmup", 324, 80, "")):
        budget = tmp_path / probe
        folders.append(budget)
        run = budget / "runs" / "descriptor-copynce-seed0"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({
            "name": run.name, "variant": "copynce", "seed": 0, "wall_seconds": 60.0,
            "command": f"python scripts/train.py --config c.yaml --max_steps {steps} --warmup_steps {warmup} "
                       f"--per_device_train_batch_size 32 --mixed_precision bf16{extra}"}))
        # a run resumed over sessions counts its training time in its summary (the driver's wall time is the
        # last session's); an older summary without that count falls back to the driver's
        timing = {"training_seconds": 1800.0} if probe == "warmup" else {}
        (run / "training_summary.json").write_text(json.dumps({
            "steps": steps, "warmup_steps": warmup, "pairs_per_process": 10368, "num_processes": 1,
            "mixed_precision": "bf16", "eval": {"micro_ap": 0.5}, **timing}))
        evaluate_system(run.name, SystemOutput([Prediction(q, r, 0.5) for q, r in zip(queries, references)]), task,
                        budget / "quality", {"family": "descriptor", "variant": "copynce", "seed": 0})
    rows = {row.steps: row for row in load_rows(folders)}
    assert rows[162].pairs == rows[324].pairs == 10368
    assert rows[162].series == "copynce / training recipe / bf16 / per_device_train_batch_size 32, gradient_accumulation_steps 2"
    assert rows[324].series == "copynce / training recipe / bf16 / warmup_steps 80, per_device_train_batch_size 32"
    assert (rows[162].wall_minutes, rows[324].wall_minutes) == (1.0, 30.0)


def test_bench_dataloader_measures_a_training_config_model_and_its_loader(tmp_path):
    """``python -m benchmarks.speed.dataloader --config``: the paper configs' pairs per step (slots count twice),
    a step of each model type timed under bf16 autocast, and the loader/model comparison written out."""
    from benchmarks.speed import dataloader as bench

    descriptor, matcher = bench.training_config("descriptor_vits16_224.yaml"), bench.training_config("matcher_vits16_224.yaml")
    assert (descriptor.pairs_per_batch, matcher.pairs_per_batch) == (192, 32)
    for config, extra in ((descriptor, {"descriptor_dim": 16}), (matcher, {"num_fusion_layers": 1})):
        small = dataclasses.replace(config, model={**config.model, **TINY_VIT, **extra})
        assert bench.model_step_throughput(small, batch_size=4, steps=1, precision="bf16") > 0
    out = tmp_path / "bench.json"
    result = bench.main(["--config", "tiny_cpu.yaml", "--skip_split", "--workers", "0", "--batches", "1",
                         "--model_step", "--model_steps", "1", "--image_folder", str(ASSET_IMAGES), "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["split"] == {} and saved["batch_size"] == bench.training_config(None).pairs_per_batch
    assert saved["model_pairs_per_second"] > 0 and saved["pairs_per_second"]["0"] > 0 and saved["device"] == "cpu"
    assert result["query_recipe"] == "training"


class _WorkersInStep:
    """A data loader of ``workers`` processes on a simulated clock: each worker makes one batch every ``seconds``,
    all in step, so batch ``i`` is ready at ``(i // workers + 1) * seconds``; taking a batch moves the clock to
    when it is ready (:meth:`clock` stands for ``time.perf_counter``). Its steady rate is known exactly."""

    def __init__(self, workers: int, seconds: float):
        self.workers, self.seconds, self.now, self.taken = workers, seconds, 0.0, 0

    def clock(self) -> float:
        return self.now

    def __iter__(self):
        while True:
            self.now = max(self.now, (self.taken // self.workers + 1) * self.seconds)
            self.taken += 1
            yield self.taken - 1


def test_loader_rate_is_timed_over_whole_rounds_of_the_workers(monkeypatch):
    """Fewer timed batches than workers would time only some workers' second batch against a round's time
    (about batches / workers of the steady rate); the rate is timed over at least three whole rounds, after a
    warm-up of one batch per worker, so it is the steady rate (checked on a simulated clock, not timed)."""
    from benchmarks.speed import dataloader as bench

    assert bench.timed_batches(10, 16) == 48 and bench.timed_batches(40, 16) == 48
    assert bench.timed_batches(50, 16) == 64 and bench.timed_batches(6, 2) == 6 and bench.timed_batches(1, 0) == 1
    workers, batch, seconds = 4, 4, 0.02
    steady = workers * batch / seconds  # 800 items/s: every worker makes one batch per `seconds`
    for asked in (1, 3, 4, 5, 13):
        loader = _WorkersInStep(workers, seconds)
        monkeypatch.setattr(bench.time, "perf_counter", loader.clock)
        rate = bench.delivered_per_second(loader, batch, workers, batches=asked)
        assert loader.taken == workers + bench.timed_batches(asked, workers)  # warm-up, then whole rounds
        # timing the 1 batch asked for would give a quarter of the steady rate, 3 of a round 0.75, 5 0.625
        assert rate == pytest.approx(steady, rel=1e-9), asked


def test_bench_dataloader_selects_large_originals_and_times_the_draws_in_both_paths(tmp_path):
    """``--min_long_side`` keeps only the larger originals; the stage split of each path carries the
    chains' draws (timed alone) and the fused / edit-by-edit ratios with and without them."""
    from benchmarks.speed import dataloader as bench

    rng = np.random.default_rng(0)
    for name, (width, height) in {"small.png": (40, 30), "wide.png": (100, 60), "tall.png": (50, 80)}.items():
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(tmp_path / name)
    images, _ = bench.load_originals(10, str(tmp_path), min_long_side=64)
    assert sorted(Path(row["image"]["path"]).name for row in images) == ["tall.png", "wide.png"]
    split = bench.compare_paths(images, 32, 16, 2, ("training",), rounds=1)["training"]
    for path in ("fused", "edit_by_edit"):
        stages = split[path]["ms_per_pair"]
        assert 0 < stages["draw"] and set(bench.STAGES) <= set(stages)
    fused, reference = split["fused"]["ms_per_pair"], split["edit_by_edit"]["ms_per_pair"]
    assert split["edit_ratio"] == pytest.approx(fused["edit"] / reference["edit"])
    assert split["render_ratio"] == pytest.approx(max(fused["edit"] - fused["draw"], 0) / (reference["edit"] - reference["draw"]))


def test_scaling_rows_from_a_recorded_table_and_a_continued_run(tmp_path, capsys):
    """``--table`` reads back the rows :func:`scaling_table` printed (mean rows recomputed, not read), so the
    figure can be redrawn after the runs' folders are gone; ``--continued`` adds a run that continued a trained
    model at the pairs of both runs, in a series naming the continuation and its batch; a row read from files
    replaces the table's row of the same series, steps and seed."""
    from benchmarks.training.scaling import (
        ScalingRow,
        continued_row,
        main,
        merge_rows,
        scaling_table,
        table_rows,
    )

    def row(series_options: str, steps: int, seed: int, muap: float, **changes) -> ScalingRow:
        fields = dict(run="r", variant="copynce", recipe="training", precision="bf16", seed=seed, steps=steps,
                      pairs=steps * 32, wall_minutes=1.5, held_out_micro_ap=0.5, options=series_options,
                      metrics={"micro_ap": muap, "recall_at_p90": 0.25, "recall_at_rank1": 0.5})
        return ScalingRow(**{**fields, **changes})

    recorded = [row("", 4, 0, 0.1), row("", 4, 1, 0.3), row("learning_rate 2e-3", 8, 0, 0.2, held_out_micro_ap=None),
                row("", 8, 0, 0.4, ema_decay=0.998, wall_minutes=None, variant="baseline", recipe="paper_descriptor")]
    page = tmp_path / "BENCHMARKS.md"
    page.write_text("# Benchmarks\n\nSome prose.\n\n" + scaling_table(recorded) + "\nMore prose | with a bar.\n")
    read = table_rows(page)
    assert [(r.series, r.steps, r.pairs, r.seed, r.metrics["micro_ap"], r.held_out_micro_ap, r.wall_minutes)
            for r in read] == [(r.series, r.steps, r.pairs, r.seed, r.metrics["micro_ap"], r.held_out_micro_ap,
                                r.wall_minutes) for r in recorded]
    assert scaling_table(read) == scaling_table(recorded)  # the mean row of the two seeds is back

    run = tmp_path / "descriptor-run"
    (run / "without_ema").mkdir(parents=True)
    (run / "without_ema" / "config.json").write_text(json.dumps({"copynce_weight": 5.0}))
    (run / "training_summary.json").write_text(json.dumps({
        "steps": 10, "pairs_per_process": 1280, "num_processes": 1, "mixed_precision": "bf16", "wall_seconds": 120,
        "seed": 0, "ema_decay": 0.998, "eval": {"micro_ap": 0.5}, "eval_without_ema": {"micro_ap": 0.6}}))
    task = build_minidisc(_config(tmp_path, recipe=IDENTITY_RECIPE))
    evaluate_system("descriptor-copynce-seed0", SystemOutput(
        [Prediction(q.query_id, r, 0.5) for q, r in zip(task.queries, task.reference_ids)]), task,
        tmp_path / "quality", {"family": "descriptor"})
    quality = tmp_path / "quality" / "descriptor-copynce-seed0.json"
    continued = continued_row(run / "without_ema", quality, 128)
    assert (continued.series, continued.steps, continued.pairs, continued.held_out_micro_ap, continued.wall_minutes) == (
        "copynce / training recipe / bf16 / continued from 128 pairs, batch 128", 10, 1408, 0.6, 2.0)
    merged = merge_rows(recorded, [row("", 4, 1, 0.9)])
    assert [r.metrics["micro_ap"] for r in merged if (r.steps, r.seed, r.options) == (4, 1, "")] == [0.9]  # replaced
    assert len(merge_rows(recorded, [continued])) == 5

    main(["--table", str(page), "--continued", str(run / "without_ema"), str(quality), "128"])
    assert "| copynce / training recipe / bf16 / continued from 128 pairs, batch 128 | 10 | 1408 | 0 |" in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["--continued", str(run / "without_ema"), str(quality), "many"])
    with pytest.raises(SystemExit, match="not a python -m benchmarks.quality.systems record"):
        continued_row(run / "without_ema", tmp_path / "missing.json", 128)
    summary = json.loads((run / "training_summary.json").read_text())
    (run / "training_summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "seed"}))
    with pytest.raises(SystemExit, match="no seed"):  # an older summary and a named system: never a silent 0
        continued_row(run / "without_ema", quality, 128)
    (run / "training_summary.json").write_text(json.dumps(summary | {"seed": 3}))
    assert continued_row(run / "without_ema", quality, 128).seed == 3
    page.write_text(page.read_text().replace("| 0.1000 |", "| n/a |", 1))
    with pytest.raises(SystemExit, match="not a row of the scaling table"):
        table_rows(page)
    with pytest.raises(SystemExit, match="no scaling table"):
        table_rows(tmp_path / "quality" / "descriptor-copynce-seed0.json")


def test_contention_benchmark_measures_a_command_idle_and_beside_busy_processes(tmp_path):
    """benchmarks.speed.contention: the child's CPU time is counted (a command that burns about 0.3 s of CPU), idle
    and contended runs are kept apart, and the ratio is the worst contended over the median idle."""
    import sys

    from benchmarks.speed import contention

    burn = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.3:\n    pass\n"
    output = tmp_path / "contention.json"
    assert contention.main(["--busy", "1", "--repeats", "2", "--settle", "0", "--output", str(output), "--",
                            sys.executable, "-c", burn]) == 0
    result = json.loads(output.read_text())
    assert len(result["idle"]) == len(result["contended"]) == 2 and result["busy"] == 1
    assert all(run["cpu_seconds"] >= 0.3 for run in result["idle"] + result["contended"])
    worst = max(run["cpu_seconds"] for run in result["contended"])
    assert result["cpu_ratio_worst"] == round(worst / result["idle_cpu_median"], 3)
    with pytest.raises(SystemExit, match="exited 3"):
        contention.main(["--repeats", "1", "--busy", "0", "--settle", "0", "--output", str(output), "--",
                         sys.executable, "-c", "raise SystemExit(3)"])


def test_descriptor_costs_time_each_model_on_images_it_did_not_warm_up_on(tmp_path, capsys):
    from benchmarks.speed.descriptor_costs import descriptor_value, image_costs, main

    assert descriptor_value("embedded") is None and descriptor_value("some/folder") == "some/folder"
    row = image_costs(str(ASSET_IMAGES), "embedded", count=3, warm_up=2, batch_size=2)
    assert row["images"] == 3 and row["cpu_ms_per_image"] > 0 and row["wall_ms_per_image"] > 0
    with pytest.raises(SystemExit, match="holds 12 images; --warm-up 10 \\+ --count 100 are needed"):
        main([str(ASSET_IMAGES), "--models", "embedded"])
