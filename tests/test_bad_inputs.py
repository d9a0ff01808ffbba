"""Bad input through the ``copynce`` command: every case gives the expected status and a plain message,
and no existing output changes.

The bad files are generated in temporary folders. The large images cost almost nothing: the
20000x20000 PNG is a valid header with one row of data (it is refused from its header, so its
pixels are never decoded), and the 100-megapixel photograph is a grey PNG written row by row.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli, save_tiny_models, tiny_model_options
from PIL import Image

from copynce_hf.cli import main
from copynce_hf.images import MAX_IMAGE_PIXELS, load_image

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- files
def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def grey_png(path: Path, width: int, height: int, rows: int | None = None) -> Path:
    """An 8-bit grey PNG of ``width`` x ``height`` written row by row (mid grey); ``rows`` < height
    writes only the first rows (a truncated file whose header still announces the full size)."""
    compressor = zlib.compressobj(1)
    row = b"\0" + b"\x80" * width
    parts = []
    remaining = height if rows is None else rows
    while remaining:
        count = min(remaining, 256)
        parts.append(compressor.compress(row * count))
        remaining -= count
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", b"".join(parts))
                     + _chunk(b"IEND", b""))
    return path


def noise(width=48, height=40, seed=0, mode="RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).convert(mode)


def digest(path: Path) -> dict[str, str]:
    """Hashes of a file or of every file under a folder: an output compared before and after a command."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_tiny_models(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A folder of four readable images and an index of it (the "existing output" of the tests)."""
    root = tmp_path_factory.mktemp("good")
    folder = root / "refs"
    folder.mkdir()
    for i in range(4):
        noise(seed=i).save(folder / f"R{i}.png")
    return folder


@pytest.fixture
def index(models, good, tmp_path, capsys):
    output = tmp_path / "index"
    assert run_cli(capsys, "index", good, "--model", models["descriptor"], "--output", output)[0] == 0
    return output


def one_line_error(code, err, *fragments):
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert ": error: " in last, last
    for fragment in fragments:
        assert fragment in last, (fragment, last)
    return last


# ---------------------------------------------------------------------------------------------- images
def test_every_kind_of_image_file_is_read_or_skipped_with_its_reason(models, tmp_path, capsys, caplog):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "empty.jpg").write_bytes(b"")
    full = noise(64, 64)
    full.save(folder / "whole.jpg", quality=90)
    data = (folder / "whole.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (folder / "text.jpg").write_text("this is a text file, not a JPEG\n")
    Image.new("RGB", (1, 1)).save(folder / "dot.png")
    deep = Image.fromarray((np.arange(40 * 48, dtype=np.uint16).reshape(40, 48) * 30).astype(np.uint16))
    deep.save(folder / "deep16.png")
    assert Image.open(folder / "deep16.png").mode.startswith("I")
    noise(seed=2).convert("CMYK").save(folder / "cmyk.jpg")
    rgba = noise(seed=3).convert("RGBA")
    rgba.putalpha(128)
    rgba.save(folder / "alpha.png")
    noise(seed=4).convert("P", palette=Image.Palette.ADAPTIVE).save(folder / "palette.gif")
    exif = Image.Exif()
    exif[0x0112] = 6
    noise(60, 30, seed=5).save(folder / "rotated.jpg", exif=exif)
    grey_png(folder / "huge.png", 20000, 20000, rows=1)
    (folder / "café_图像_ünïcødé.png").write_bytes((folder / "alpha.png").read_bytes())
    long_name = "x" * 200 + ".png"
    noise(seed=6).save(folder / long_name)
    (folder / ".hidden.png").write_bytes((folder / "alpha.png").read_bytes())
    (folder / "notes.txt").write_text("not an image extension: never listed")

    assert load_image(folder / "rotated.jpg").size == (30, 60)  # EXIF orientation applied
    caplog.set_level(logging.WARNING)
    code, out, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "idx")
    assert code == 0, err
    assert out.strip().splitlines()[-1] == (
        "index: read 13 images, skipped 5 (1 empty file, 1 not an image, 1 truncated, 1 too large, 1 too small), "
        "wrote 8 descriptors"
    )
    log = caplog.text
    assert "empty.jpg' is an empty file (0 bytes)" in log and "BufferedReader" not in log
    assert "text.jpg' is not an image" in log
    assert "truncated.jpg' is truncated or corrupt" in log
    assert "dot.png' is too small: 1x1, minimum 16" in log
    assert "huge.png' is too large: 20000x20000 = 400.0 megapixels" in log and "--max-pixels" in log
    from copynce_hf.retrieval import DescriptorSet

    ids = DescriptorSet.load(tmp_path / "idx").ids
    assert set(ids) == {"alpha", "cmyk", "deep16", "palette", "rotated", "whole", "café_图像_ünïcødé", "x" * 200}



def test_max_pixels_sets_the_limit_both_ways(models, tmp_path, capsys):
    folder = tmp_path / "one"
    folder.mkdir()
    noise(64, 64).save(folder / "img.png")
    code, _, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "a",
                       "--max-pixels", "4095")
    one_line_error(code, err, "skipped 1 (1 too large)")
    code, out, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "b",
                         "--max-pixels", "4_096")
    assert code == 0 and "wrote 1 descriptors" in out, err
    with pytest.raises(SystemExit) as stopped:
        run_cli(capsys, "index", folder, "--output", tmp_path / "c", "--max-pixels", "lots")
    assert stopped.value.code == 2 and "expected a number of pixels" in capsys.readouterr().err


@pytest.mark.slow
def test_a_100_megapixel_photograph_is_read_by_default(models, tmp_path, capsys):
    folder = tmp_path / "camera"
    folder.mkdir()
    grey_png(folder / "IMG_0001.png", 11648, 8736)  # a 100-megapixel sensor's frame
    assert 11648 * 8736 < MAX_IMAGE_PIXELS
    code, out, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "idx")
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "index: read 1 images, skipped 0, wrote 1 descriptors"
    code, out, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "idx2",
                         "--max-pixels", "50000000")
    one_line_error(code, err, "none of the 1 images", "skipped 1 (1 too large)")
    assert not (tmp_path / "idx2").exists()


def test_ids_are_unique_across_extensions_and_subfolders(models, tmp_path, capsys, caplog):
    folder = tmp_path / "dup"
    folder.mkdir()
    noise(seed=1).save(folder / "a.jpg")
    noise(seed=2).save(folder / "a.png")
    code, out, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "o")
    one_line_error(code, err, "a.jpg and a.png", "both would have the id 'a'")

    nested = tmp_path / "nested"
    for sub in ("cats", "dogs", ".cache"):
        (nested / sub).mkdir(parents=True)
        noise(seed=len(sub)).save(nested / sub / "tom.png")
    noise(seed=9).save(nested / "top.png")
    caplog.set_level(logging.WARNING)
    code, out, err = run_cli(capsys, "index", nested, "--model", models["descriptor"], "--output", tmp_path / "flat")
    assert code == 0 and "read 1 images" in out
    assert "2 sub-folder(s) not read (cats, dogs); pass --recursive" in caplog.text
    code, out, err = run_cli(capsys, "index", nested, "--model", models["descriptor"], "--output", tmp_path / "deep",
                         "--recursive")
    assert code == 0, err
    from copynce_hf.retrieval import DescriptorSet

    assert DescriptorSet.load(tmp_path / "deep").ids == ["cats/tom", "dogs/tom", "top"]  # .cache is hidden


def test_empty_folder_and_folder_of_only_bad_files(models, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(capsys, "index", empty, "--model", models["descriptor"], "--output", tmp_path / "o1")
    one_line_error(code, err, "holds no image file")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "zero.png").write_bytes(b"")
    (bad / "text.jpg").write_text("hello")
    Image.new("RGB", (1, 1)).save(bad / "dot.png")
    code, _, err = run_cli(capsys, "index", bad, "--model", models["descriptor"], "--output", tmp_path / "o2")
    one_line_error(code, err, "none of the 3 images", "skipped 3 (1 empty file, 1 not an image, 1 too small)")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_images_left_out_are_counted_by_their_reason_never_as_unreadable(models, tmp_path, capsys, caplog):
    """An image too small or empty is named so in the warnings and the closing line of index and calibrate (whose
    originals are picked by their headers: an empty file is passed over, not a traceback)."""
    folder = tmp_path / "refs"
    folder.mkdir()
    for i in range(5):
        noise(seed=i).save(folder / f"R{i}.png")
    (folder / "empty.jpg").write_bytes(b"")
    Image.new("RGB", (8, 8)).save(folder / "tiny.png")
    caplog.set_level(logging.WARNING)
    code, out, err = run_cli(capsys, "index", folder, "--model", models["descriptor"], "--output", tmp_path / "idx")
    assert code == 0, err
    assert "skipped 2 of 7 images: empty (empty file), tiny (too small)" in caplog.text
    assert out.strip().splitlines()[-1] == (
        "index: read 7 images, skipped 2 (1 empty file, 1 too small), wrote 5 descriptors")
    code, out, err = run_cli(capsys, "calibrate", folder, "--output", tmp_path / "calibration.json", "--sample", "2",
                             "--models", models["descriptor"], "--matcher", models["matcher"])
    assert code == 0, err
    assert out.strip().splitlines()[-1] == (
        "calibrate: read 7 reference images, skipped 2 (1 empty file, 1 too small), wrote 1 file")
    assert "unreadable" not in caplog.text + out + err


def test_a_missing_local_model_folder_is_named(good, tmp_path, capsys):
    code, _, err = run_cli(capsys, "index", good, "--model", tmp_path / "no" / "such" / "model", "--output", tmp_path / "o")
    one_line_error(code, err, "the model folder does not exist", "no/such/model")
    code, _, err = run_cli(capsys, "index", good, "--model", "./missing-model", "--output", tmp_path / "o")
    one_line_error(code, err, "'./missing-model': the model folder does not exist")
    assert "Repo id" not in err and not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------- outputs
def test_wrong_output_paths_fail_before_any_work_and_change_nothing(models, good, index, tmp_path, capsys):
    before = digest(index)
    a_file = tmp_path / "a_file.csv"
    a_file.write_text("keep me\n")
    # an existing file where a folder is expected
    code, _, err = run_cli(capsys, "index", good, "--model", models["descriptor"], "--output", a_file)
    one_line_error(code, err, "is an existing file; a folder is expected")
    # a folder under an existing file
    code, _, err = run_cli(capsys, "index", good, "--model", models["descriptor"], "--output", a_file / "sub")
    one_line_error(code, err, "is a file, so no folder can be created under it")
    # an existing folder where a file is expected, and a file under a file
    code, _, err = run_cli(capsys, "search", good, "--index", index, "--output", index)
    one_line_error(code, err, "is an existing folder; a file path is expected")
    code, _, err = run_cli(capsys, "search", good, "--index", index, "--output", a_file / "x.csv")
    one_line_error(code, err, "is a file, so no folder can be created under it")
    code, _, err = run_cli(capsys, "search", good, "--index", index, "--output", tmp_path / "p.csv", "--hdf5", index)
    one_line_error(code, err, "--hdf5", "is an existing folder")
    assert a_file.read_text() == "keep me\n" and digest(index) == before
    assert not (tmp_path / "p.csv").exists()


def test_an_output_folder_inside_an_input_folder_is_refused_before_any_work(models, good, tmp_path, capsys):
    """A later run would list it among the images (``--recursive`` would read its gallery as inputs): refused in one
    line naming both, whichever input folder holds it, and nothing is written."""
    queries = tmp_path / "queries"
    shutil.copytree(good, queries)
    before = digest(queries)
    code, _, err = run_cli(capsys, "detect", queries, "--references", good, "--output", queries / "found",
                           "--models", models["descriptor"], "--matcher", models["matcher"])
    one_line_error(code, err, f"--output '{queries / 'found'}' is inside the query folder '{queries}': a later run "
                   "would take it for a sub-folder of images", f"choose an output folder outside '{queries}'")
    code, _, err = run_cli(capsys, "detect", queries, "--references", good, "--output", tmp_path / "found",
                           "--whiten-from", tmp_path, "--matcher", "none", "--models", models["descriptor"])
    one_line_error(code, err, f"is inside the --whiten-from folder '{tmp_path}'")
    code, _, err = run_cli(capsys, "dedup", queries, "--output", queries, "--model", models["descriptor"])
    one_line_error(code, err, f"--output '{queries}' is the image folder '{queries}'")
    code, _, err = run_cli(capsys, "index", queries, "--output", queries / "sub" / "index", "--model",
                           models["descriptor"])
    one_line_error(code, err, "is inside the reference folder")
    assert digest(queries) == before and not (tmp_path / "found").exists()


def test_a_file_the_command_did_not_write_is_never_overwritten(models, good, index, tmp_path, capsys):
    """``calibrate``, ``search`` and ``match`` write one file: they rewrite their own kind of file (a calibration,
    a predictions CSV) and refuse any other, in one line naming it, before any work."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    code, _, err = run_cli(capsys, "calibrate", good, "--output", notes, "--models", models["descriptor"],
                           "--matcher", models["matcher"])
    one_line_error(code, err, f"--output '{notes}' is an existing file that is not a calibration file written by "
                   "`copynce calibrate`; it is not overwritten")
    code, _, err = run_cli(capsys, "search", good, "--index", index, "--output", notes)
    one_line_error(code, err, f"'{notes}' is an existing file that is not a predictions CSV")
    predictions = tmp_path / "p.csv"
    assert run_cli(capsys, "search", good, "--index", index, "--output", predictions, "--k", "2")[0] == 0
    code, _, err = run_cli(capsys, "match", predictions, "--queries", good, "--references", good, "--output", notes,
                           "--matcher", models["matcher"])
    one_line_error(code, err, f"'{notes}' is an existing file that is not a predictions CSV")
    assert notes.read_text() == "my notes\n"
    # their own files are rewritten: a predictions CSV by search (and match), a calibration by calibrate
    assert run_cli(capsys, "search", good, "--index", index, "--output", predictions, "--k", "1")[0] == 0
    assert len(predictions.read_text().splitlines()) == 1 + 4
    from copynce_hf.calibration.thresholds import CALIBRATION_FILE, Calibration, OperatingPoint

    calibration = tmp_path / "calibration.json"
    Calibration({"descriptors": [], "matcher": None, "preset": "fast", "settings": {}},
                {"descriptor": [OperatingPoint(0.9, 0.5, 1.0)]}).save(calibration)
    assert CALIBRATION_FILE.recognise(calibration) and not CALIBRATION_FILE.recognise(notes)
    notes.write_text('{"format": "something else"}\n')
    assert not CALIBRATION_FILE.recognise(notes)


def _read_only_folder(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read_only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    # root writes into any folder whatever its mode bits: use a read-only file system instead
    if os.access("/sys", os.R_OK):
        return Path("/sys")
    pytest.skip("running as root without a read-only file system to write into")


def test_read_only_output_folder(models, good, index, tmp_path, capsys):
    folder = _read_only_folder(tmp_path)
    try:
        for argv in (("index", good, "--model", models["descriptor"], "--output", folder / "copynce_index"),
                     ("search", good, "--index", index, "--output", folder / "copynce_candidates.csv"),
                     ("evaluate", tmp_path / "p.csv", "--ground-truth", tmp_path / "g.csv",
                      "--output", folder / "copynce_report")):
            code, _, err = run_cli(capsys, *argv)
            one_line_error(code, err, "is not writable", str(folder))
            assert not (folder / Path(argv[-1]).name).exists()
    finally:
        if folder.is_relative_to(tmp_path):
            folder.chmod(0o755)


def test_a_failure_after_the_work_leaves_the_previous_output_intact(models, good, index, tmp_path, capsys):
    predictions = tmp_path / "candidates.csv"
    assert run_cli(capsys, "search", good, "--index", index, "--output", predictions)[0] == 0
    before = digest(predictions)
    # a descriptor of another width: the search fails after every query has been embedded
    from conftest import TINY_VIT

    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor

    other = tmp_path / "other"
    CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=24, **TINY_VIT)).save_pretrained(other)
    CopyNCEImageProcessor(size={"height": 32, "width": 32}).save_pretrained(other)
    code, _, err = run_cli(capsys, "search", good, "--index", index, "--model", other, "--output", predictions)
    one_line_error(code, err, "descriptors but the index holds")
    assert digest(predictions) == before
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary file left behind


# ---------------------------------------------------------------------------------------------- search, match
def test_search_and_match_count_and_name_what_they_skip(models, good, index, tmp_path, capsys, caplog):
    queries = tmp_path / "queries"
    queries.mkdir()
    noise(seed=0).save(queries / "Q0.png")
    noise(seed=1).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(queries / "Q1.png")
    (queries / "Q2.jpg").write_bytes(b"")
    candidates = tmp_path / "candidates.csv"
    code, out, err = run_cli(capsys, "search", queries, "--index", index, "--k", "2", "--output", candidates)
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "search: read 3 query images, skipped 1 (1 empty file), wrote 4 predictions"
    with candidates.open("a", newline="") as handle:
        csv.writer(handle).writerow(["Q9", "R0", "0.5"])  # a query whose file does not exist
    caplog.set_level(logging.WARNING)
    code, out, err = run_cli(capsys, "match", candidates, "--queries", queries, "--references", good, "--matcher",
                         models["matcher"], "--output", tmp_path / "scored.csv")
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "match: read 5 candidate pairs, skipped 1 (1 missing), wrote 4 pairs"
    assert f"{queries}/Q9.*" in caplog.text and "do not exist" in caplog.text


# ---------------------------------------------------------------------------------------------- evaluate
def _write(path: Path, rows, header=("query_id", "reference_id", "score")) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_evaluate_refuses_predictions_that_cannot_be_scored(tmp_path, capsys, caplog):
    truth = _write(tmp_path / "gt.csv", [("q00", "r00"), ("q01", "r01"), ("q02", "")], ("query_id", "reference_id"))
    report = tmp_path / "report"
    report.mkdir()
    (report / "metrics.json").write_text('{"old": 1}\n')
    before = digest(report)
    with_extensions = _write(tmp_path / "ext.csv", [("q00.jpg", "r00", 0.9), ("q01.jpg", "r01", 0.8)])
    code, _, err = run_cli(capsys, "evaluate", with_extensions, "--ground-truth", truth, "--output", report)
    one_line_error(code, err, "'q00.jpg'", "ground truth 'q00'", "strip the file extensions")
    good = _write(tmp_path / "good.csv", [("q00", "r00", 0.9)])  # beside a good file, the error names the bad one
    code, _, err = run_cli(capsys, "evaluate", with_extensions, good, "--ground-truth", truth, "--output", report)
    one_line_error(code, err, "ext.csv", "strip the file extensions")
    assert "good.csv" not in err
    duplicate = _write(tmp_path / "dup.csv", [("q00", "r00", 0.9), ("q00", "r00", 0.8)])
    code, _, err = run_cli(capsys, "evaluate", duplicate, "--ground-truth", truth, "--output", report)
    one_line_error(code, err, "duplicate", "'q00'", "'r00'")
    infinite = _write(tmp_path / "inf.csv", [("q00", "r00", "inf")])
    code, _, err = run_cli(capsys, "evaluate", infinite, "--ground-truth", truth, "--output", report)
    one_line_error(code, err, "not a finite number")
    empty = _write(tmp_path / "empty.csv", [])
    code, _, err = run_cli(capsys, "evaluate", empty, "--ground-truth", truth, "--output", report)
    one_line_error(code, err, "no predictions")
    assert digest(report) == before

    caplog.set_level(logging.WARNING)
    partial = _write(tmp_path / "partial.csv", [("q00", "r00", 0.9), ("q01", "r01", 0.8), ("zz", "r01", 0.1)])
    code, out, err = run_cli(capsys, "evaluate", partial, "--ground-truth", truth, "--output", report)
    assert code == 0, err
    assert "1 of the 3 predicted query ids are not in the ground truth" in caplog.text
    assert out.strip().splitlines()[-1] == "evaluate: read 3 predictions in 1 file(s), skipped 0, wrote 2 files"
    assert '"old"' not in (report / "metrics.json").read_text()


# ---------------------------------------------------------------------------------------------- the console command
def test_global_options_work_after_the_subcommand(models, good, tmp_path, capsys):
    code = main(["index", "-q", str(good), "--model", models["descriptor"], "--output", str(tmp_path / "idx")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "index: read 4 images, skipped 0, wrote 4 descriptors" in captured.out
    assert "%|" not in captured.err  # no progress bar
    code = main(["index", str(good), "--model", models["descriptor"], "--output", str(tmp_path / "idx2")])
    assert code == 0 and "%|" in capsys.readouterr().err  # without -q, the bar is shown


# ---------------------------------------------------------------------------------------------- training
def test_training_summary_counts_skipped_images(tmp_path, caplog):
    import importlib

    run_module = importlib.import_module("copynce_hf.training.run")
    folder = tmp_path / "train"
    folder.mkdir()
    for i in range(8):
        noise(40, 40, seed=i).save(folder / f"img{i}.png")
    (folder / "img3_empty.png").write_bytes(b"")  # among the training images
    Image.new("RGB", (8, 8)).save(folder / "img5_tiny.png")  # too small, not unreadable
    (folder / "img_empty.png").write_bytes(b"")  # the last two: held out for evaluation
    (folder / "zz_text.png").write_text("not an image")
    from accelerate.state import AcceleratorState, GradientState

    try:
        summary = run_module.main([
            "--config", str(REPO / "configs" / "tiny_cpu.yaml"), "--dataset", str(folder), "--output_dir",
            str(tmp_path / "out"), *tiny_model_options(num_hidden_layers=1, intermediate_size=32, descriptor_dim=16), "--dataloader_num_workers", "0", "--num_eval_images", "4",
            "--per_device_train_batch_size", "4", "--report_to", "none", "--max_steps", "6", "--logging_steps", "4",
            "--eval_steps", "1000"])
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert summary["skipped_evaluation_images"] == 2
    assert summary["skipped_training_images"] >= 1
    assert summary["skipped_images"] == summary["skipped_training_images"] + 2
    assert "img5_tiny.png' is too small" in caplog.text and "images skipped so far (each named once" in caplog.text
    assert "unreadable" not in caplog.text


def test_training_output_dir_is_checked_before_any_work(tmp_path, capsys):
    from copynce_hf.training.run import cli

    a_file = tmp_path / "not_a_folder"
    a_file.write_text("keep me\n")
    assert cli(["--output_dir", str(a_file), "--report_to", "none"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"error: invalid configuration value output_dir '{a_file}' is an existing file; a folder is expected here"
    ]
    assert a_file.read_text() == "keep me\n"


# ---------------------------------------------------------------------------------------------- detect
def test_detect_with_long_and_odd_ids_an_empty_reference_and_few_references(models, tmp_path, capsys):
    """Ids of 150 characters (a pair's gallery folder name would pass 255), ids with '#', '?' and spaces
    (URL-encoded in the report), an empty reference file (counted in the summary) and fewer
    references than --candidates (the metrics report the candidates each query could get)."""
    from urllib.parse import unquote

    queries, references = tmp_path / "queries", tmp_path / "references"
    queries.mkdir()
    references.mkdir()
    pairs = [("q" * 150 + suffix, "r" * 150 + suffix) for suffix in ("", " #1?x", " 2")]
    for index, (query, reference) in enumerate(pairs):
        noise(48, 40, seed=index).save(references / f"{reference}.png")
        noise(48, 40, seed=index).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(queries / f"{query}.png")
    (references / "empty.png").write_bytes(b"")
    truth = tmp_path / "truth.csv"
    truth.write_text("query_id,reference_id\n" + "".join(f"{q},{r}\n" for q, r in pairs))
    output = tmp_path / "found"
    code = main(["detect", str(queries), "--references", str(references), "--output", str(output), "-q",
                 "--models", models["descriptor"], "--matcher", models["matcher"], "--candidates", "50",
                 "--ground-truth", str(truth), "--gallery", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    html = (output / "report.html").read_text()
    links = [line.split('src="')[1].split('"')[0] for line in html.splitlines() if 'src="' in line]
    assert links and all("#" not in link and "?" not in link and " " not in link for link in links)
    assert all((output / unquote(link)).is_file() for link in links)
    assert all(len(path.name) < 255 for path in (output / "gallery").iterdir())
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["num_candidates_per_query"] == 3  # 3 readable references, not the 50 asked for
    assert "detect: read 3 query and 4 reference images, skipped 1 (1 empty file)" in out


# ---------------------------------------------------------------------------------------------- model folders
def test_a_damaged_weights_file_is_one_line(models, good, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(models["descriptor"], damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # an interrupted download
    code, _, err = run_cli(capsys, "index", good, "--model", damaged, "--output", tmp_path / "idx")
    one_line_error(code, err, "cannot load the model", "a weights file is damaged or incomplete")


def test_a_folder_of_another_architecture_is_refused_before_its_weights_load(models, good, tmp_path):
    other = tmp_path / "bert"
    shutil.copytree(models["descriptor"], other)
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "bert"
    config.pop("auto_map", None)
    (other / "config.json").write_text(json.dumps(config))
    # a process of its own: transformers prints its load report there as it would for a user
    result = subprocess.run([sys.executable, "-m", "copynce_hf.cli", "--quiet", "index", str(good), "--model",
                             str(other), "--output", str(tmp_path / "idx")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}, timeout=300)
    one_line_error(result.returncode, result.stderr,
                   "model type 'bert' is neither a CopyNCE matcher nor a CopyNCE descriptor")
    assert "LOAD REPORT" not in result.stdout + result.stderr
    assert len((result.stdout + result.stderr).strip().splitlines()) == 1


def test_evaluate_reads_excel_csv_and_refuses_utf16_and_split_scores_in_one_line(tmp_path, capsys, caplog):
    truth = tmp_path / "gt.csv"
    truth.write_text("query_id,reference_id\nq00,r00\nq01,r01\n", encoding="utf-8-sig")  # Excel "CSV UTF-8"
    excel = tmp_path / "excel.csv"
    excel.write_text("query_id,reference_id,score\nq00,r00,0.9\nq01,r01,0.8\n", encoding="utf-8-sig")
    code, out, err = run_cli(capsys, "evaluate", excel, "--ground-truth", truth, "--output", tmp_path / "report")
    assert code == 0, err
    assert json.loads((tmp_path / "report" / "metrics.json").read_text())["excel"]["micro_ap"] == 1.0
    utf16 = tmp_path / "utf16.csv"
    utf16.write_text(excel.read_text(encoding="utf-8-sig"), encoding="utf-16")
    code, _, err = run_cli(capsys, "evaluate", utf16, "--ground-truth", truth, "--output", tmp_path / "report")
    one_line_error(code, err, "is UTF-16 text; save it as UTF-8 CSV")
    comma = tmp_path / "comma.csv"
    comma.write_text("query_id,reference_id,score\nq00,r00,0,9\nq01,r01,0,8\n")
    code, _, err = run_cli(capsys, "evaluate", comma, "--ground-truth", truth, "--output", tmp_path / "report")
    one_line_error(code, err, "line 2: 4 fields, but the header has 3 (a decimal comma in the score?")
    caplog.set_level(logging.WARNING)
    renamed = tmp_path / "renamed.csv"
    renamed.write_text("query_id,reference_id,score\nq00,ref-a,0.9\nq01,ref-b,0.8\n")
    code, _, err = run_cli(capsys, "evaluate", renamed, "--ground-truth", truth, "--output", tmp_path / "report")
    assert code == 0, err
    assert "none of the 2 predicted reference ids is in the ground truth" in caplog.text and "muAP is 0" in caplog.text


def test_search_names_a_damaged_index_folder_and_how_to_rebuild_it(models, good, index, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(index, damaged)
    (damaged / "index.faiss").write_bytes(b"\0" * 64)
    code, _, err = run_cli(capsys, "search", good, "--index", damaged, "--output", tmp_path / "found.csv")
    one_line_error(code, err, "is damaged; build it again with `copynce index`", "index.faiss")
