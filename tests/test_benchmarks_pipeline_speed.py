"""Tests of the end-to-end speed benchmark of ``copynce detect`` and ``copynce dedup`` (benchmarks/speed/pipeline.py):
its two tasks built from a tiny data folder of the bundled images, the isolation of the code a run imports, and the
quality it reads from a run's files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import require_extra

from benchmarks.speed.pipeline import (
    build_dedup_task,
    build_detect_task,
    code_environment,
    dedup_quality,
    parse_env,
    run_command,
    task_command,
)
from copynce_hf.data import ASSET_IMAGES
from copynce_hf.evaluation.minidisc import MiniDiscConfig, build_minidisc

ASSETS = sorted(ASSET_IMAGES.glob("*.jpg"))


@pytest.fixture
def data(tmp_path):
    """A data folder laid out as ``../shared/data``: ``imagenet-sample/`` (the bundled images) and its splits CSV
    (8 references, 3 distractors, the rest train)."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "imagenet-sample").symlink_to(ASSET_IMAGES)
    with (folder / "imagenet-sample-splits.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["filename", "split"])
        for index, file in enumerate(ASSETS):
            writer.writerow([file.name, "reference" if index < 8 else "distractor" if index < 11 else "train"])
    return folder


def test_the_detect_task_keeps_minidiscs_first_copies_and_distractors_with_their_edits(tmp_path, data):
    task = build_detect_task(tmp_path / "tasks", data, copies=2, distractors=2)
    assert (task["references"], task["copies"], task["distractors"], task["queries"]) == (8, 2, 2, 4)
    with open(task["folders"]["ground_truth"], newline="") as handle:
        truth = {row["query_id"]: row["reference_id"] for row in csv.DictReader(handle)}
    whole = build_minidisc(MiniDiscConfig(image_folder=data / "imagenet-sample",
                                          splits_csv=data / "imagenet-sample-splits.csv"))
    first_copied = {ASSETS[0].stem, ASSETS[2].stem}  # references 0 and 2 (mini-DISC copies every other one)
    assert set(filter(None, truth.values())) == first_copied
    distractors = sorted((q for q in whole.queries if q.reference_id is None), key=lambda q: q.source_path.name)[:2]
    assert {q for q, r in truth.items() if not r} == {q.query_id for q in distractors}
    edits = {q.query_id: q.edits for q in whole.queries}
    described = json.loads(next((tmp_path / "tasks").glob("detect-*/cache/*/task.json")).read_text())
    assert all(tuple(q["edits"]) == edits[q["query_id"]] for q in described["queries"])  # mini-DISC's own queries
    assert sorted(p.stem for p in (tmp_path / "tasks").glob("detect-*/queries/*.png")) == sorted(truth)
    with pytest.raises(SystemExit, match="has 4 copies"):
        build_detect_task(tmp_path / "tasks", data, copies=5)


def test_the_dedup_task_copies_each_original_once_or_twice_and_is_reused(tmp_path, data):
    task = build_dedup_task(tmp_path / "tasks", data, originals=3, twice=1, seed=0)
    assert (task["images"], task["copies"], task["true_pairs"]) == (7, 4, 3 + 1 + 1)
    collection = tmp_path / "tasks" / "dedup-o3-t1-s0" / "collection"
    assert sorted(p.name for p in collection.iterdir()) == sorted(
        [p.name for p in ASSETS[:3]] + [f"{ASSETS[0].stem}_copy0.png", f"{ASSETS[0].stem}_copy1.png",
                                        f"{ASSETS[1].stem}_copy0.png", f"{ASSETS[2].stem}_copy0.png"])
    assert task["groups"][0] == [ASSETS[0].stem, f"{ASSETS[0].stem}_copy0", f"{ASSETS[0].stem}_copy1"]
    stamp = (collection / f"{ASSETS[0].stem}_copy0.png").stat().st_mtime_ns
    assert build_dedup_task(tmp_path / "tasks", data, originals=3, twice=1, seed=0) == task
    assert (collection / f"{ASSETS[0].stem}_copy0.png").stat().st_mtime_ns == stamp  # not made again


def test_a_run_imports_the_package_of_its_code_root_and_is_timed(tmp_path):
    """The run's working directory and PYTHONPATH put the code root's copynce_hf first (not the installed one)."""
    root = tmp_path / "code"
    (root / "copynce_hf").mkdir(parents=True)
    (root / "copynce_hf" / "__init__.py").write_text("")
    (root / "copynce_hf" / "cli.py").write_text(
        "import os, sys, copynce_hf\nprint('copynce from', copynce_hf.__file__, os.environ['COPYNCE_THREADS'])\n"
        "print('copynce done')\nsys.exit(int(sys.argv[1]))\n")
    run = run_command(["0"], root, 2, tmp_path / "run" / "log.txt")
    log = (tmp_path / "run" / "log.txt").read_text()
    assert f"copynce from {root / 'copynce_hf' / '__init__.py'} 2" in log
    assert run["wall_seconds"] > 0 and run["cpu_seconds"] >= 0 and run["peak_rss_mib"] > 0
    assert run["log_lines"][-1] == "copynce done"
    assert code_environment(root, 3)["PYTHONPATH"].split(":")[0] == str(root)
    with pytest.raises(SystemExit, match="exited 3"):
        run_command(["3"], root, 1, tmp_path / "run" / "log.txt")


def test_the_commands_take_absolute_paths_and_the_extra_options(tmp_path, monkeypatch):
    """A run's working directory is its code's folder: relative task paths would not be found from there."""
    monkeypatch.chdir(tmp_path)
    argv = task_command("dedup", {"folders": {"collection": "tasks/collection"}}, Path("out"), "--batch-size 8")
    assert argv == ["dedup", str(tmp_path / "tasks" / "collection"), "--output", str(tmp_path / "out"),
                    "--batch-size", "8"]
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        parse_env(["A"])


def test_dedup_quality_reads_the_pairs_and_the_groups(tmp_path):
    truth = [["a", "a1"], ["b", "b1"]]
    (tmp_path / "pairs.csv").write_text("query_id,reference_id,score,raw_score,views\n"
                                        "a,a1,0.9,0.9,whole/whole\na,b,0.8,0.8,whole/whole\nb,b1,0.7,0.7,crop/whole\n")
    (tmp_path / "groups.csv").write_text("group_id,image_id,score_to_first,joined_by,joined_score,rule\n"
                                         "0,a,,,,first\n0,a1,0.9,a,0.9,representative\n0,b,0.8,a,0.8,representative\n")
    quality = dedup_quality(tmp_path, truth)
    assert quality["pair_AP"] == pytest.approx((1 + 2 / 3) / 2)
    assert (quality["group_precision"], quality["group_recall"]) == (pytest.approx(1 / 3), 0.5)
    assert (quality["groups"], quality["verified_pairs"]) == (1, 3)


def test_a_profile_is_summed_by_stage_path_and_by_operation(tmp_path):
    """benchmarks.speed.profile: a sample's time goes to the path of the stage functions on its stack and to the
    innermost operation; a stage called inside another is a path of its own. The session is written in pyinstrument's
    own format with exact sample times (what a profiler records of ``self_calibrate() -> matcher_scores() -> fuse()``,
    then ``matcher_scores()`` alone, then code outside every stage), so that no machine load moves the sums."""
    require_extra("pyinstrument", "bench")
    from pyinstrument.session import Session

    from benchmarks.speed.profile import OUTSIDE, stage_tables

    def frame(function, line, owner=None):  # pyinstrument's frame identifier: name, file, line, attributes
        return f"{function}\x00bench.py\x00{line}" + (f"\x01c{owner}" if owner else "") + f"\x01l{line}"

    thread, run = "MainThread\x00<thread>\x001", frame("run", 1)
    calibrate, scores = frame("self_calibrate", 10), frame("matcher_scores", 20)
    fuse, busy = frame("fuse", 30), frame("busy", 40)
    samples = [([thread, run, calibrate, scores, fuse, busy], 0.3), ([thread, run, calibrate, scores, busy], 0.1),
               ([thread, run, scores, fuse, busy], 0.2), ([thread, run, scores, fuse, busy], 0.1),
               ([thread, run, scores, busy], 0.1), ([thread, run, busy], 0.1)]
    session = Session(frame_records=samples, start_time=0.0, duration=sum(s for _, s in samples), min_interval=0.1,
                      max_interval=0.3, sample_count=len(samples), start_call_stack=[thread, run],
                      target_description="test", cpu_time=0.9, sys_path=[], sys_prefixes=[])
    path = tmp_path / "run.pyisession"
    session.save(str(path))
    tables = stage_tables(path)
    inner, outer = tables["stages"]["self-calibration > matcher"], tables["stages"]["matcher"]
    for found in (inner, outer):
        assert found["operations"]["matcher fusion"] == pytest.approx(0.3)
        assert found["operations"]["other"] == pytest.approx(0.1)
    assert tables["stages"][OUTSIDE]["seconds"] == pytest.approx(0.1)
    assert tables["operations"]["matcher fusion"] == pytest.approx(0.6)
