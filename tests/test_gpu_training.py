"""benchmarks/training/gpu.py: the one-command GPU run, here on the CPU with tiny sizes and the bundled images."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from PIL import Image

from benchmarks.training import gpu as gpu_training
from copynce_hf.data import ASSET_IMAGES


def test_the_run_trains_both_models_and_scores_them_beside_the_embedded_ones(tmp_path):
    from copynce_hf.training.run import held_out_score

    out, work = tmp_path / "out", tmp_path / "work"
    report = gpu_training.main(["run", "--device", "cpu", "--dataset", str(ASSET_IMAGES), "--output-dir", str(out),
                                "--work-dir", str(work),
                                "--held-out", "4", "--batch-size", "4", "--workers", "0", "--precision", "no",
                                "--descriptor-steps", "2", "--matcher-steps", "2", "--knn-k", "3"])
    assert report["stage"] == "done"  # $OUT holds only what a device call sends back (at most 8 files)
    assert sorted(path.name for path in out.iterdir()) == ["descriptor.tar.gz", "knn_graph.safetensors",
                                                           "matcher.tar.gz", "report.json"]
    for kind in ("descriptor", "matcher"):
        entry = report[kind]
        assert entry["steps"] == entry["planned_steps"] == 2 and entry["pairs"] == 2 * 4
        assert 0.0 <= entry["current"]["micro_ap"] <= 1.0 and isinstance(entry["better"], bool)
        with tarfile.open(out / f"{kind}.tar.gz") as archive:
            names = set(archive.getnames())
        # the descriptor's trained weights, when chosen over their average, in the run's own layout
        weights = f"{kind}/without_ema" if kind == "descriptor" and entry["chosen"] == "trained" else kind
        assert {f"{weights}/config.json", f"{weights}/model.safetensors", f"{kind}/training_summary.json"} <= names
    descriptor = report["descriptor"]
    assert descriptor["chosen"] in ("ema", "trained") and descriptor["new"]["eval_without_ema"] is not None
    assert descriptor["chosen_score"]["micro_ap"] == max(descriptor["new"]["eval"]["micro_ap"],
                                                         descriptor["new"]["eval_without_ema"]["micro_ap"])
    assert report["knn_graph"] == {"images": 12, "skipped": 0, "k": 3, "group_by": None, "from": descriptor["chosen"]}
    assert (out / "knn_graph.safetensors").is_file()
    # The current models' scores come from the run's own held-out task: the trained matcher, scored the same
    # way, gives the numbers its run logged, to float rounding: the run scores its model in memory, this the folder
    # it saved, whose weights from_pretrained leaves in the safetensors buffer at addresses that are not 64-byte
    # aligned; the CPU kernels then sum in another order (in a tiny matcher the first output that differs is the
    # classifier's; the same weights cloned into aligned memory give bit-identical logits), and a threshold differs
    # by two float32 steps (0.93621927 against 0.93621916, at one thread too).
    plan = gpu_training.RunPlan(ASSET_IMAGES, out, device="cpu", batch_size=4, workers=0, precision="no", held_out=4)
    overrides = {**plan.overrides("matcher", work / "rescored"), "knn_graph": str(out / "knn_graph.safetensors"),
                 "model_name_or_path": str(work / "matcher")}
    assert held_out_score(plan.config("matcher", overrides)) == pytest.approx(report["matcher"]["new"]["eval"], rel=1e-6)


def test_steps_come_from_the_measured_pairs_per_second():
    history = [{"step": 10, "train/pairs_per_second": 50.0}, {"step": 20, "train/pairs_per_second": 900.0},
               {"step": 20, "eval/micro_ap": 0.5}, {"step": 30, "train/pairs_per_second": 1100.0},
               {"step": 40, "train/pairs_per_second": 1000.0}]
    rate = gpu_training._pairs_per_second({"history": history})  # the first window (workers starting) left out
    assert rate == 1000.0 and gpu_training._steps(210, rate, 128) == 1640
    with pytest.raises(SystemExit, match="--descriptor-steps"):
        gpu_training._pairs_per_second({"history": [{"step": 5, "eval/micro_ap": 0.1}]})


def test_the_descriptor_weights_with_the_better_held_out_score_are_chosen():
    summary = {"model_folder": "run", "model_folder_without_ema": "run/without_ema",
               "eval": {"micro_ap": 0.8}, "eval_without_ema": {"micro_ap": 0.9}}
    assert gpu_training._chosen_descriptor(summary)[:2] == ("trained", Path("run/without_ema"))
    summary["eval_without_ema"] = {"micro_ap": 0.8}  # a tie keeps the average
    assert gpu_training._chosen_descriptor(summary)[0] == "ema"
    assert gpu_training._better({"micro_ap": 0.91}, {"micro_ap": 0.9}) is True
    assert gpu_training._better({"micro_ap": 0.9}, {"micro_ap": 0.9}) is False


def test_prepare_shrinks_the_train_split_under_its_names_and_writes_the_device_command(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    names = ["a_first.JPEG", "b_second.JPEG", "c_other.JPEG"]
    for name, source in zip(names, sorted(ASSET_IMAGES.glob("*.jpg"))):
        Image.open(source).save(images / name)
    splits = tmp_path / "splits.csv"
    splits.write_text("filename,split\na_first.JPEG,train\nb_second.JPEG,train\nc_other.JPEG,reference\n")
    bundle = tmp_path / ".gpu"
    made = gpu_training.prepare(bundle, images, splits, max_side=64, quality=80, packages=False)
    written = sorted(path.name for path in (bundle / "train_split").iterdir())
    assert written == names[:2] and made["images"] == 2
    assert all(max(Image.open(bundle / "train_split" / name).size) == 64 for name in written)
    script = (bundle / "run.sh").read_text()
    assert "benchmarks.training.gpu run --dataset .gpu/train_split --output-dir \"$OUT\" --work-dir /tmp" in script
    assert made["travelling_bytes"] > made["bundle_bytes"] > 0
    assert "SKIP_THROUGHPUT=1" not in script
    gpu_training.prepare(bundle, images, splits, max_side=64, packages=False, throughput=False)
    assert (bundle / "run.sh").read_text().startswith("#!/bin/bash\nexport SKIP_THROUGHPUT=1")


def test_prepare_with_instances_cuts_the_shrunk_training_photos_and_keeps_the_held_out_whole_and_last(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    names = ["a_first.JPEG", "b_second.JPEG", "c_held.JPEG"]
    for name, source in zip(names, sorted(ASSET_IMAGES.glob("*.jpg"))):
        Image.open(source).save(images / name)
    splits = tmp_path / "splits.csv"
    splits.write_text("filename,split\n" + "".join(f"{name},train\n" for name in names))
    bundle = tmp_path / ".gpu"
    made = gpu_training.prepare(bundle, images, splits, max_side=160, packages=False, instances="grid2", held_out=1)
    files = sorted((bundle / "train_split").iterdir())
    assert made["images"] == 3 and len(files) == 2 * 4 + 1 + 1  # two photos in 2 x 2 cells, the held-out one, manifest
    images_written = [path for path in files if path.suffix != ".json"]
    assert images_written[-1].name == "c_held.JPEG" and not any(path.is_symlink() for path in files)  # copies travel
    assert max(Image.open(images_written[-1]).size) == 160
    assert all(max(Image.open(path).size) <= 80 for path in images_written[:-1])  # cells of the shrunk photos


def test_knn_group_by_kind_keeps_the_photos_hard_negatives_among_photos(tmp_path):
    """``--knn-group-by kind`` on an instance folder: the matcher's graph per kind, as the shipped matcher's."""
    from conftest import TINY_VIT_3_BLOCKS

    from copynce_hf.data import KNNGraph
    from copynce_hf.data.instances import InstancePlan, make_instances
    from copynce_hf.modeling import CopyNCEDescriptorConfig, CopyNCEDescriptorModel

    folder = tmp_path / "instances"
    records = make_instances(sorted(ASSET_IMAGES.glob("*.jpg"))[:6], folder,
                             InstancePlan(photos=True, procedural=6, side=48), seed=0)
    kinds = {Path(record["file"]).stem: record["kind"] for record in records}
    CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=8, **TINY_VIT_3_BLOCKS)).save_pretrained(tmp_path / "d")
    plan = gpu_training.RunPlan(folder, tmp_path, device="cpu", workers=0, knn_k=3, knn_group_by="kind")
    report = {"descriptor": {"chosen": "ema"}}
    path = gpu_training._build_knn_graph(plan, tmp_path / "d", tmp_path, report, lambda stage: None)
    graph = KNNGraph.load(path)
    assert report["knn_graph"]["group_by"] == "kind" and (graph.neighbors >= 0).all()
    for row, image_id in enumerate(graph.ids):
        assert {kinds[graph.ids[n]] for n in graph.neighbors[row]} == {kinds[image_id]}
    assert gpu_training.build_parser().parse_args(["run", "--dataset", "x", "--output-dir", "y", "--knn-group-by",
                                                   "kind"]).knn_group_by == "kind"


def test_chosen_trained_weights_travel_in_the_run_layout_so_the_card_names_them(tmp_path):
    import json

    from copynce_hf.export import training_settings

    weights, summary = tmp_path / "without_ema", tmp_path / "training_summary.json"
    weights.mkdir()
    (weights / "config.json").write_text("{}", encoding="utf-8")
    summary.write_text(json.dumps({"steps": 3, "ema_decay": 0.998}), encoding="utf-8")
    for trained, expected in ((True, "the trained weights"), (False, "the moving average")):
        archive = gpu_training._pack(weights, summary, tmp_path / f"descriptor-{trained}.tar.gz", trained)
        unpacked = tmp_path / f"unpacked-{trained}"
        with tarfile.open(archive) as opened:
            opened.extractall(unpacked, filter="data")
        name = archive.name.removesuffix(".tar.gz")
        folder = unpacked / name / "without_ema" if trained else unpacked / name
        assert (folder / "config.json").is_file() and (unpacked / name / "training_summary.json").is_file()
        assert training_settings(folder)["weights"].startswith(expected)


def test_content_over_frame_pairs_and_the_next_descriptor_size_come_from_their_configs(tmp_path):
    plan = gpu_training.RunPlan(ASSET_IMAGES, tmp_path, pairs="content-over-frame", descriptor_init="scratch",
                                descriptor_size="next")
    descriptor = plan.config("descriptor", plan.overrides("descriptor", tmp_path / "d"))
    assert descriptor.template_share > 0 and descriptor.copy_to_copy_share > 0  # the new pairs, from their file
    assert descriptor.model_name_or_path is None and descriptor.learning_rate == 1e-3  # fresh, at the bench rate
    assert {key: descriptor.model[key] for key in ("hidden_size", "num_hidden_layers", "image_size")} == \
        {"hidden_size": 384, "num_hidden_layers": 12, "image_size": 112}
    assert descriptor.model["copynce_weight"] == 5.0  # bench_descriptor.yaml's losses kept
    matcher = plan.config("matcher", plan.overrides("matcher", tmp_path / "m"))
    assert matcher.template_share > 0 and matcher.model_name_or_path.endswith("pretrained/matcher")
    with pytest.raises(SystemExit, match="--descriptor-init scratch"):
        gpu_training.RunPlan(ASSET_IMAGES, tmp_path, descriptor_size="next").check()


def test_a_query_recipe_given_reaches_both_models_and_the_command_line_refuses_an_unknown_one(tmp_path):
    plan = gpu_training.RunPlan(ASSET_IMAGES, tmp_path, query_recipe="training_everyday")
    for kind in ("descriptor", "matcher"):
        assert plan.config(kind, plan.overrides(kind, tmp_path / kind)).query_recipe == "training_everyday"
    plain = gpu_training.RunPlan(ASSET_IMAGES, tmp_path)
    assert plain.config("descriptor", plain.overrides("descriptor", tmp_path / "d")).query_recipe == "training"
    parser = gpu_training.build_parser()
    assert parser.parse_args(["run", "--dataset", "d", "--output-dir", "o", "--query-recipe",
                              "training_everyday"]).query_recipe == "training_everyday"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--dataset", "d", "--output-dir", "o", "--query-recipe", "minidisc_queries"])


def test_the_bundle_keeps_every_font_the_new_pairs_draw():
    from copynce_hf.pixtrace.edits.frames import FRAME_FONTS
    from copynce_hf.pixtrace.templates import TEMPLATE_FONTS

    fonts = gpu_training._training_fonts()
    assert set(TEMPLATE_FONTS) | set(FRAME_FONTS) <= fonts  # the templates' meme bands and app frames
    assert all(font.endswith(".ttf") for font in fonts) and len(fonts) < 40  # not AugLy's whole folder
