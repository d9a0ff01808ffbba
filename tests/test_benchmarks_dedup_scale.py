"""Tests of the ``copynce dedup --dataset`` scale benchmark (benchmarks/dedup_scale.py): its collection, how it
reads a run's stages, the matcher rate of a run killed in its matcher stage, and one whole run with tiny models."""

from __future__ import annotations

import io
import json
import os
import time

import numpy as np
import pytest
from conftest import save_tiny_models
from PIL import Image

from benchmarks.dedup_scale import build_collection, collection_plan, main, matcher_rate, stage_times
from copynce_hf.images import load_image
from copynce_hf.modeling.errors import ImageLoadError


def test_the_plan_holds_distinct_images_planted_copies_and_corrupt_rows():
    plan = collection_plan(200, 0.05, 3, seed=1)
    kinds = [kind for kind, _ in plan]
    assert len(plan) == 200 and kinds.count("copy") == 10 and kinds.count("corrupt") == 3
    bases = sorted(number for kind, number in plan if kind == "base")
    assert bases == list(range(187))  # each distinct image once
    copied = [number for kind, number in plan if kind == "copy"]
    assert len(set(copied)) == 10 and set(copied) <= set(bases)
    assert plan == collection_plan(200, 0.05, 3, seed=1) and plan != collection_plan(200, 0.05, 3, seed=2)
    assert kinds[:20] != sorted(kinds[:20]) or kinds[20:40] != sorted(kinds[20:40])  # shuffled
    with pytest.raises(ValueError, match="cannot hold"):
        collection_plan(10, 0.5, 1, seed=0)


def test_the_collection_is_a_saved_dataset_with_its_truth_and_is_reused(tmp_path):
    import datasets

    folder = tmp_path / "collection"
    manifest = build_collection(folder, 30, copy_fraction=0.1, corrupt=2, seed=0)
    table = datasets.load_from_disk(str(folder)).cast_column("image", datasets.Image(decode=False))
    ids = table["image_id"]
    assert ids == [f"img{row:06d}" for row in range(30)] and len(manifest["truth"]) == 3
    images = {image_id: row["bytes"] for image_id, row in zip(ids, table["image"])}
    for original, copy in manifest["truth"]:
        first, second = (Image.open(io.BytesIO(images[i])) for i in (original, copy))
        assert first.format == second.format == "JPEG" and 96 <= min(first.size) and max(first.size) <= 160
        assert images[original] != images[copy]
    for corrupt in manifest["corrupt"]:
        with pytest.raises(ImageLoadError):  # what dedup skips and counts
            load_image(images[corrupt])
    sizes = {Image.open(io.BytesIO(images[i])).size for i in ids if i not in manifest["corrupt"]}
    assert len(sizes) > 10  # sizes drawn between 96 and 160 pixels
    stamp = (folder / "manifest.json").stat().st_mtime_ns
    assert build_collection(folder, 30, copy_fraction=0.1, corrupt=2, seed=0) == manifest
    assert (folder / "manifest.json").stat().st_mtime_ns == stamp  # reused, not built again
    assert build_collection(folder, 30, copy_fraction=0.1, corrupt=2, seed=1)["truth"] != manifest["truth"]


def test_stage_times_run_from_one_progress_line_to_the_next():
    lines = [(3.0, "Loading weights: 100%"), (10.0, "copynce dedup: 99 images, descriptor: d, matcher: m"),
             (70.5, "copynce dedup: d: 800 candidate pairs among 98 images (the 10 nearest other images of each)"),
             (400.0, "copynce dedup: matcher: 790 pairs verified (120 encoder passes, 790 fusion passes)"),
             (401.0, "copynce dedup: 4 groups of copies (9 images) at threshold 0.5"),
             (403.0, "wrote 4 groups of copies (9 images) to out/groups.csv, 790 verified pairs to ...")]
    seconds, numbers = stage_times(lines)
    assert seconds == {"load": 10.0, "descriptors": 60.5, "matcher": 329.5, "groups": 1.0, "write": 2.0}
    assert numbers["descriptors"] == [800, 98] and numbers["matcher"] == [790, 120, 790] and numbers["groups"] == [4, 9]
    assert stage_times(lines[:3]) == ({"load": 10.0, "descriptors": 60.5}, {"load": [99], "descriptors": [800, 98]})


def test_the_matcher_rate_counts_the_chunks_this_run_wrote(tmp_path):
    rescoring = tmp_path / "rescoring"
    rescoring.mkdir()
    start = time.time() - 1000
    for number, (scores, written) in enumerate([(5, start - 50), (10, start + 100), (10, start + 200)]):
        path = rescoring / f"chunk-{number:06d}.json"
        path.write_text(json.dumps({"scores": [0.5] * scores}))
        os.utime(path, (written, written))
    rate = matcher_rate(tmp_path, {"started_at": start - 20, "matcher_start_seconds": 20.0}, candidates=1000)
    # the chunk written before the stage began (a resumed one) does not count: 20 pairs in 200 s
    assert rate["chunks"] == 2 and rate["pairs_scored"] == 20 and rate["pairs_per_second"] == pytest.approx(0.1)
    assert rate["extrapolated_matcher_seconds"] == pytest.approx(10000) and "extrapolated" in rate["note"]
    assert matcher_rate(tmp_path, {"started_at": start, "matcher_start_seconds": None}, 1000)["pairs_scored"] == 0


@pytest.mark.slow
def test_a_whole_run_with_tiny_models_records_its_stages_groups_and_memory(tmp_path):
    models = save_tiny_models(tmp_path / "models", seed=0)
    record = main(["--images", "40", "--copy-fraction", "0.1", "--corrupt", "2", "--label", "tiny", "--work-dir",
                   str(tmp_path / "work"), "--output-dir", str(tmp_path / "out"), "--", "--model", models["descriptor"],
                   "--matcher", models["matcher"], "--threshold", "0.4", "--candidates", "3", "--chunk-size", "10"])
    entry = record["runs"]["40:tiny"]
    run, found = entry["run"], entry["found"]
    assert run["returncode"] == 0 and not run["killed_in_matcher_stage"]
    assert set(run["stage_seconds"]) == {"load", "descriptors", "matcher", "groups", "write"}
    assert run["stage_numbers"]["load"] == [40] and run["stage_numbers"]["descriptors"][1] == 38  # 2 corrupt rows
    assert found["pairs_verified"] == run["stage_numbers"]["matcher"][0] > 0
    assert 0 <= found["pair_precision"] <= 1 and set(found["report_stage_seconds"]) >= {"index", "matcher"}
    assert run["peak_rss_mib"] > 100 and run["peak_rss_mib"] >= max(v for v in run["peak_rss_mib_at_stage_end"].values()
                                                                     if v is not None)
    assert "skipping image" in (tmp_path / "work" / "dedup-40-tiny.log").read_text()
    assert json.loads((tmp_path / "out" / "dedup_scale.json").read_text())["runs"]["40:tiny"]["images"] == 40
    assert np.isfinite(entry["run"]["wall_seconds"])
