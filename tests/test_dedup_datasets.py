"""``copynce dedup --dataset``: the groups of a dataset (Parquet file, ``save_to_disk`` folder, image folder) equal
those of the same images in a folder, a corrupt row is skipped and counted, a run killed after its index or in its
matcher stage resumes to the same groups, two ``accelerate launch`` processes share the work, and the descriptor
index is embedded in resumable chunks."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
from conftest import cli_killed_when, launch_two_cpu_processes, run_cli, save_tiny_models, tiny_models
from PIL import Image

from copynce_hf.cli import main
from copynce_hf.retrieval import Descriptor, DescriptorIndex, ImageFolderSource, ViewPreset, view_index

REPO = Path(__file__).resolve().parents[1]
IMAGES = 10  # R0..R9, R1 twice more byte for byte (R1_again, R1_third), then the corrupt row


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_tiny_models(tmp_path_factory.mktemp("models"), seed=0)


def _png(rng) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """The same 12 images as a folder (``images/R0.png``, ...; R1 copied byte for byte as R1_again and R1_third), and
    as a table (``name``, ``picture``) with a 13th row that is not an image (``broken``): ``images.parquet``,
    ``saved/`` (a DatasetDict with splits train and extra, save_to_disk) and ``imagefolder/`` (the folder with the
    corrupt file added)."""
    root = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(0)
    names = [f"R{i}" for i in range(IMAGES)]
    pictures = [_png(rng) for _ in names]
    names += ["R1_again", "R1_third"]
    pictures += [pictures[1], pictures[1]]
    for folder in ("images", "imagefolder"):
        (root / folder).mkdir()
        for name, data in zip(names, pictures):
            (root / folder / f"{name}.png").write_bytes(data)
    (root / "imagefolder" / "broken.png").write_bytes(b"not an image")
    features = datasets.Features({"name": datasets.Value("string"), "picture": datasets.Image()})
    table = datasets.Dataset.from_dict({"name": [*names, "broken"],
                                        "picture": [{"bytes": data, "path": None} for data in pictures]
                                        + [{"bytes": b"not an image", "path": None}]}, features=features)
    table.to_parquet(str(root / "images.parquet"))
    datasets.DatasetDict({"extra": table.select(range(3)), "train": table}).save_to_disk(str(root / "saved"))
    return root


def read_groups(folder: Path) -> list[list[str]]:
    """The groups of ``folder/groups.csv``: member ids, in order."""
    groups: dict[str, list[str]] = {}
    with (folder / "groups.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            groups.setdefault(row["group_id"], []).append(row["image_id"])
    return list(groups.values())


def read_scores(path: Path) -> dict[tuple[str, str], float]:
    """``(a, b) -> score`` of a ``pairs.csv``, or ``(group's first member, member) -> score`` of a ``groups.csv``."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if "score" in rows[0]:
        return {(row["query_id"], row["reference_id"]): float(row["score"]) for row in rows}
    firsts = {row["group_id"]: row["image_id"] for row in reversed(rows)}
    return {(firsts[row["group_id"]], row["image_id"]): float(row["score_to_first"]) for row in rows
            if row["score_to_first"]}


def assert_same_run(found: Path, expected: Path) -> None:
    """The same groups and verified pairs, scores equal to float32 rounding."""
    assert read_groups(found) == read_groups(expected)
    for name in ("groups.csv", "pairs.csv"):
        got, want = read_scores(found / name), read_scores(expected / name)
        assert list(got) == list(want), name
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=0, atol=1e-6)


def _descriptor_only(models, output: Path) -> list[str]:
    return ["--model", models["descriptor"], "--matcher", "none", "--threshold", "0.9999", "--candidates", "2",
            "--collection-normalisation", "off", "--gallery", "1", "--output", str(output)]  # raw cosines: 1 for twins


@pytest.mark.parametrize("dataset, options", [
    ("images.parquet", ["--id-column", "name"]),
    ("saved", ["--id-column", "name", "--split", "train"]),
    ("imagefolder", []),
])
def test_dedup_a_dataset_groups_as_the_same_folder_and_counts_the_corrupt_row(models, collection, tmp_path, capsys,
                                                                               caplog, dataset, options):
    code, out, err = run_cli(capsys, "dedup", collection / "images", *_descriptor_only(models, tmp_path / "folder"))
    assert code == 0, err
    assert read_groups(tmp_path / "folder") == [["R1", "R1_again", "R1_third"]]  # identical files, cosine 1

    output = tmp_path / "dataset"
    code, out, err = run_cli(capsys, "dedup", "--dataset", collection / dataset, *options,
                             *_descriptor_only(models, output))
    assert code == 0, err
    assert read_groups(output) == [["R1", "R1_again", "R1_third"]]
    np.testing.assert_allclose(list(read_scores(output / "groups.csv").values()), [1.0, 1.0], atol=1e-5)
    assert "dedup: read 13 images, skipped 1 (1 not an image), wrote 3 group rows" in out
    assert "skipping image 'broken'" in caplog.text  # the corrupt row is named in the log, and never fatal
    report = (output / "report.html").read_text()
    assert f"<th>images</th><td>{collection / dataset} (split" in report
    assert "<th>images skipped</th><td>1 (1 not an image)</td>" in report
    assert "<th>images skipped</th><td>none</td>" in (tmp_path / "folder" / "report.html").read_text()
    index = DescriptorIndex.load(output / "indexes" / "descriptor" / "references")
    assert index.references.skipped == ["broken"] and len(index) == 12
    assert not (output / "indexes" / "descriptor" / ".references.chunks").exists()  # removed once the index is in


@pytest.mark.parametrize("arguments, message", [
    (["{root}/images", "--dataset", "{root}/images.parquet"],
     "give either a folder of images or --dataset NAME_OR_PATH, not both"),
    ([], "give either a folder of images or --dataset NAME_OR_PATH"),
    (["--dataset", "{root}/saved", "--split", "validation"], "dataset_split 'validation' not in"),
    (["--dataset", "{root}/images.parquet", "--id-column", "key"], "id_column 'key' is not a column"),
    (["--dataset", "{root}/missing.parquet"], "neither a folder nor a Parquet file"),
])
def test_dedup_dataset_errors(models, collection, tmp_path, capsys, arguments, message):
    arguments = [argument.format(root=collection) for argument in arguments]
    code, _, err = run_cli(capsys, "dedup", *arguments, *_descriptor_only(models, tmp_path / "o"))
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_a_streamed_dataset_is_refused_before_any_model_work(collection, tmp_path):
    from copynce_hf.modeling.errors import ConfigError
    from copynce_hf.retrieval.sources import ImageInput
    from copynce_hf.runs.dedup import DedupRequest, run_dedup

    request = DedupRequest(None, str(tmp_path / "o"), dataset=str(collection / "images.parquet"),
                           input=ImageInput(streaming=True), threshold=0.9)
    with pytest.raises(ConfigError, match="by random access .* cannot be streamed"):
        run_dedup(request)
    assert not (tmp_path / "o").exists()


def test_the_index_is_embedded_in_chunks_and_an_interrupted_extraction_resumes(collection, tmp_path, monkeypatch):
    """A run stopped after two complete chunks of descriptors (of 4 images each): the next run embeds only the
    third chunk and builds the index an uninterrupted run builds."""
    import copynce_hf.retrieval.descriptors.chunked_extraction as chunked

    descriptor, _, processor = tiny_models(1)
    model, source = Descriptor("tiny", descriptor, processor), ImageFolderSource(collection / "images")
    embedded, real = [], chunked.extract_view_descriptors

    def stopped_at_the_third_chunk(model, processor, chunk, *args, **kwargs):
        if len(embedded) == 2:
            raise KeyboardInterrupt
        embedded.append(list(chunk.ids))
        return real(model, processor, chunk, *args, **kwargs)

    monkeypatch.setattr(chunked, "extract_view_descriptors", stopped_at_the_third_chunk)
    cache = tmp_path / "cache" / "references"
    with pytest.raises(KeyboardInterrupt):
        view_index(model, source, ViewPreset("none"), cache, progress=False, chunk_size=4, batch_size=2)
    assert not (cache / "identity.json").exists()  # no index yet: only the work folder's complete chunks
    work = tmp_path / "cache" / ".references.chunks"
    assert sorted(path.name for path in work.glob("chunk-*")) == ["chunk-000000.safetensors", "chunk-000001.safetensors"]

    embedded.clear()
    lines: list[str] = []
    monkeypatch.setattr(chunked, "extract_view_descriptors", lambda *args, **kwargs: (
        embedded.append(list(args[2].ids)), real(*args, **kwargs))[1])
    resumed = view_index(model, source, ViewPreset("none"), cache, progress=False, chunk_size=4, batch_size=2,
                         log=lines.append)
    assert embedded == [source.ids[8:]] and lines == [f"reference views: resumed after 2 complete chunk(s) in {work}"]
    assert not work.exists() and (cache / "identity.json").is_file()
    whole = view_index(model, source, ViewPreset("none"), None, progress=False, batch_size=2)
    assert resumed.references.ids == whole.references.ids == source.ids
    np.testing.assert_allclose(resumed.references.descriptors, whole.references.descriptors, atol=1e-6)
    assert DescriptorIndex.load(cache).references.ids == source.ids


# --------------------------------------------------------------------------- processes: killed, resumed, shared


def _environment() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "ACCELERATE_USE_CPU": "true"}


def _matcher_options(collection, models, output: Path) -> list[str]:
    """dedup of the Parquet table with the tiny matcher and its 35 LCE view pairs: 12 readable images, 3 candidates
    each, one image's pairs per chunk of matcher work (chunk size 2: 25 pairs in 8 chunks). The tiny random matcher
    scores every pair 0.44-0.45: at 0.4452 it joins 9 pairs into two groups (7 and 2 images; the nearest score is
    2e-5 from the threshold, float32 differences are below 1e-6)."""
    return ["dedup", "--dataset", str(collection / "images.parquet"), "--id-column", "name", "--model",
            models["descriptor"], "--matcher", models["matcher"], "--threshold", "0.4452", "--candidates", "3",
            "--matcher-lce", "paper", "--chunk-size", "2", "--batch-size", "4", "--gallery", "1", "--output",
            str(output)]


@pytest.fixture
def one_thread():
    """PyTorch on one thread, as the killed runs' ``OMP_NUM_THREADS=1``, so that scores compare to the last bits."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_dedup_killed_after_its_index_then_in_its_matcher_stage_resumes_to_the_same_groups(
        models, collection, tmp_path, capsys, one_thread):
    output = tmp_path / "killed"
    index = output / "indexes" / "descriptor" / "references" / "identity.json"
    cli_killed_when(_matcher_options(collection, models, output), index.exists, tmp_path / "first.log", _environment())
    assert index.is_file() and not (output / "groups.csv").exists()
    built = index.stat().st_mtime_ns

    first_chunk = output / "rescoring" / "chunk-000000.json"
    first_chunk.unlink(missing_ok=True)  # if the first run scored it: so that this run is killed after a chunk of its own
    cli_killed_when(_matcher_options(collection, models, output), first_chunk.exists, tmp_path / "second.log",
                    _environment())
    scored = len(list((output / "rescoring").glob("chunk-*.json")))
    assert not (output / "groups.csv").exists() and 1 <= scored

    capsys.readouterr()
    assert main(_matcher_options(collection, models, output)) == 0  # not quiet: its log lines are read
    out, err = capsys.readouterr()
    assert index.stat().st_mtime_ns == built  # the index of the first run, never embedded again
    chunks = len(list((output / "rescoring").glob("chunk-*.json")))
    assert scored < chunks and f"copynce dedup: matcher: resuming: {scored} of {chunks} chunks" in err
    assert "dedup: read 13 images, skipped 1 (1 not an image)" in out

    uninterrupted = tmp_path / "uninterrupted"
    assert run_cli(capsys, *_matcher_options(collection, models, uninterrupted))[0] == 0
    assert_same_run(output, uninterrupted)
    assert [len(group) for group in read_groups(output)] == [5, 2]  # groups were found (the defaults' grouping)


@pytest.mark.slow
def test_two_processes_dedup_a_dataset_as_one_does(models, collection, tmp_path, capsys):
    one = tmp_path / "one"
    code, _, err = run_cli(capsys, *_matcher_options(collection, models, one))
    assert code == 0, err
    two = tmp_path / "two"
    result = launch_two_cpu_processes(["-m", "copynce_hf.cli", *_matcher_options(collection, models, two)],
                                      _environment())
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_run(two, one)
    # the pairs were shared, each fused once in all (35 view pairs each); one process logged and wrote
    verified = [line for line in result.stderr.splitlines() if "pairs verified" in line]
    pairs = len(read_scores(one / "pairs.csv"))
    assert len(verified) == 1 and verified[0].startswith(f"copynce dedup: matcher: {pairs} pairs verified on 2 processes")
    assert verified[0].endswith(f", {35 * pairs} fusion passes)"), verified
    assert len([line for line in result.stdout.splitlines() if line.startswith("wrote ")]) == 1 and result.stdout.count("dedup: read 13 images, skipped 1") == 1
    assert sorted(path.name for path in (two / "rescoring").iterdir()) == sorted(
        path.name for path in (one / "rescoring").iterdir())
