"""`copynce index --dataset` (Parquet file, stream, save_to_disk folder), `detect --query-dataset`, chunked and
resumable indexing (a run killed with SIGKILL resumes from its last complete chunk), indexes built from files."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
from conftest import run_cli, save_tiny_models
from PIL import Image

from copynce_hf.cli import main
from copynce_hf.retrieval import DescriptorIndex, DescriptorSet, IndexConfig, read_predictions

IMAGES = 14


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_tiny_models(tmp_path_factory.mktemp("models"), seed=0)


def png_bytes(rng, height=36, width=44) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """The same 14 random images as a folder (``refs/img00.png``, ...) and as a table (``name``, ``picture``) with a
    15th row that is not an image (``broken``): ``refs.parquet``, ``shards/`` (three Parquet files),
    ``saved/`` (a DatasetDict with splits train and extra, save_to_disk)."""
    root = tmp_path_factory.mktemp("collection")
    rng = np.random.default_rng(0)
    (root / "refs").mkdir()
    names, pictures = [], []
    for i in range(IMAGES):
        data = png_bytes(rng)
        (root / "refs" / f"img{i:02d}.png").write_bytes(data)
        names.append(f"img{i:02d}")
        pictures.append({"bytes": data, "path": None})
    names.append("broken")
    pictures.append({"bytes": b"not an image", "path": None})
    features = datasets.Features({"name": datasets.Value("string"), "picture": datasets.Image()})
    table = datasets.Dataset.from_dict({"name": names, "picture": pictures}, features=features)
    table.to_parquet(str(root / "refs.parquet"))
    (root / "shards").mkdir()
    for number, start in enumerate(range(0, len(table), 5)):
        table.select(range(start, min(start + 5, len(table)))).to_parquet(str(root / "shards" / f"part-{number}.parquet"))
    datasets.DatasetDict({"train": table, "extra": table.select(range(3))}).save_to_disk(str(root / "saved"))
    return root


@pytest.fixture(scope="module")
def folder_index(models, collection, tmp_path_factory):
    """The index of the image folder: what every dataset form of the same images must give."""
    output = tmp_path_factory.mktemp("folder") / "idx"
    assert main(["--quiet", "index", str(collection / "refs"), "--model", models["descriptor"], "--output",
                 str(output)]) == 0
    return DescriptorIndex.load(output)


def assert_same_descriptors(index: DescriptorIndex, expected: DescriptorIndex, ids: list[str]) -> None:
    assert index.references.ids == ids
    np.testing.assert_allclose(index.references.descriptors, expected.references.descriptors, atol=1e-6)


def test_index_dataset_from_a_parquet_file(models, collection, folder_index, tmp_path, capsys, caplog):
    output = tmp_path / "idx"
    code, out, err = run_cli(capsys, "index", "--dataset", collection / "refs.parquet", "--id-column", "name",
                         "--model", models["descriptor"], "--output", output, "--chunk-size", 4)
    assert code == 0, err
    assert "index: read 15 images, skipped 1 (1 not an image), wrote 14 descriptors" in out
    assert "skipping image 'broken'" in caplog.text  # the corrupt row is named, and never fatal
    index = DescriptorIndex.load(output)
    assert_same_descriptors(index, folder_index, [f"img{i:02d}" for i in range(IMAGES)])
    assert index.references.skipped == ["broken"] and index.info["source"] == str(collection / "refs.parquet")
    assert not (tmp_path / ".idx.chunks").exists()  # the chunks are removed once the index is in place


def test_index_a_streamed_dataset_in_chunks(models, collection, folder_index, tmp_path, capsys):
    """Parquet shards read as a stream, 4 rows per chunk: the ids without an id column are the row numbers."""
    output = tmp_path / "idx"
    code, out, err = run_cli(capsys, "index", "--dataset", collection / "shards", "--streaming", "--model",
                         models["descriptor"], "--output", output, "--chunk-size", 4, "--index-type", "hnsw")
    assert code == 0, err
    assert "read 15 images, skipped 1 (1 not an image)" in out
    index = DescriptorIndex.load(output)
    assert_same_descriptors(index, folder_index, [str(i) for i in range(IMAGES)])
    assert index.references.skip_reasons == {"14": "not an image"}
    assert index.config.kind == "hnsw" and len(index) == IMAGES


def test_streamed_source_reads_chunks_in_order(collection):
    from copynce_hf.retrieval import StreamedImageSource, open_dataset_source

    source = open_dataset_source(str(collection / "refs.parquet"), id_column="name", streaming=True)
    assert isinstance(source, StreamedImageSource)
    chunks = list(source.chunks(4))
    assert [len(chunk) for chunk in chunks] == [4, 4, 4, 3]
    assert chunks[1].ids == ["img04", "img05", "img06", "img07"]
    assert [chunk.ids for chunk in source.chunks(4, start=2)] == [chunk.ids for chunk in chunks[2:]]
    assert chunks[0].load(0).size == (44, 36)


def test_index_a_save_to_disk_folder_by_split(models, collection, folder_index, tmp_path, capsys):
    output = tmp_path / "idx"
    code, out, err = run_cli(capsys, "index", "--dataset", collection / "saved", "--split", "extra", "--id-column", "name",
                         "--model", models["descriptor"], "--output", output)
    assert code == 0, err
    index = DescriptorIndex.load(output)
    assert index.references.ids == ["img00", "img01", "img02"]
    np.testing.assert_allclose(index.references.descriptors, folder_index.references.descriptors[:3], atol=1e-6)


@pytest.mark.parametrize("options, message", [
    (["--dataset", "{root}/saved", "--split", "validation"], "dataset_split 'validation' not in"),
    (["--dataset", "{root}/refs.parquet", "--image-column", "photo"], "no image column"),
    (["--dataset", "{root}/refs.parquet", "--id-column", "key"], "id_column 'key' is not a column"),
    (["--dataset", "{root}/refs.parquet", "{root}/refs"], "not both"),
    ([], "give either a folder of images or --dataset"),
    (["--dataset", "{root}/missing.parquet"], "neither a folder nor a Parquet file"),
])
def test_index_dataset_errors(models, collection, tmp_path, capsys, options, message):
    options = [option.format(root=collection) for option in options]
    code, _, err = run_cli(capsys, "index", *options, "--model", models["descriptor"], "--output", tmp_path / "o")
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_duplicate_ids_of_a_streamed_dataset_are_refused(models, tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = {"id": ["a", "b", "a"], "image": [{"bytes": png_bytes(rng), "path": None} for _ in range(3)]}
    features = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image()})
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "dup.parquet"))
    for streaming in ([], ["--streaming"]):
        code, _, err = run_cli(capsys, "index", "--dataset", tmp_path / "dup.parquet", *streaming, "--chunk-size", 2,
                           "--model", models["descriptor"], "--output", tmp_path / "o")
        assert code == 2 and "'a' appears twice" in err, err


def test_detect_reads_queries_from_a_dataset(models, collection, tmp_path, capsys):
    """Queries from a Parquet file: found by their id column, the corrupt row skipped and counted. (The tiny random
    descriptor puts every two images above cosine 0.97: the references' backgrounds differ by more than a copy
    stands out, so raw cosines decide here.)"""
    code, out, err = run_cli(capsys, "detect", "--query-dataset", collection / "refs.parquet", "--id-column", "name",
                         "--references", collection / "refs", "--matcher", "none", "--models", models["descriptor"],
                         "--candidates", 3, "--k", 1, "--gallery", 1, "--collection-normalisation", "off",
                         "--output", tmp_path / "found")
    assert code == 0, err
    predictions = read_predictions(tmp_path / "found" / "predictions.csv")
    assert {p.query_id: p.reference_id for p in predictions} == {f"img{i:02d}": f"img{i:02d}" for i in range(IMAGES)}
    assert "skipped 1 (1 not an image)" in out
    assert (tmp_path / "found" / "report.html").is_file()


def _index_command(models, dataset: Path, output: Path, *extra) -> list[str]:
    return ["index", "--dataset", str(dataset), "--id-column", "name", "--model", models["descriptor"],
            "--output", str(output), "--chunk-size", "2", "--batch-size", "1", *extra]


@pytest.fixture
def one_thread():
    """PyTorch on one thread, as the killed run's ``OMP_NUM_THREADS=1``: the same float sums (a matrix product
    split over two threads may differ in the last bit), so that resumed and uninterrupted chunks compare exactly."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_index_killed_with_sigkill_resumes_from_its_last_chunk(models, collection, tmp_path, capsys, one_thread):
    """A run killed once its first chunk is written: the same command resumes after the complete chunks and
    writes the index an uninterrupted run writes."""
    killed = tmp_path / "killed"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                               os.environ.get("PYTHONPATH", "")]),
                   "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "copynce_hf.cli", "--quiet",
                                *_index_command(models, collection / "refs.parquet", killed)],
                               env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not (tmp_path / ".killed.chunks" / "chunk-000000.safetensors").exists():
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no chunk written in 10 minutes"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert not killed.exists()  # killed before the end: the index folder is only written at the end
    written = sorted(path.name for path in (tmp_path / ".killed.chunks").glob("chunk-*.safetensors"))
    assert 1 <= len(written) < 8

    code, out, err = run_cli(capsys, *_index_command(models, collection / "refs.parquet", killed))
    assert code == 0, err
    assert f"resumed after {len(written)} complete chunk(s)" in out
    assert "read 15 images, skipped 1 (1 not an image), wrote 14 descriptors" in out
    uninterrupted = tmp_path / "uninterrupted"
    assert run_cli(capsys, *_index_command(models, collection / "refs.parquet", uninterrupted))[0] == 0
    resumed, expected = DescriptorIndex.load(killed), DescriptorIndex.load(uninterrupted)
    assert resumed.references.ids == expected.references.ids
    np.testing.assert_array_equal(resumed.references.descriptors, expected.references.descriptors)
    assert resumed.references.skipped == expected.references.skipped == ["broken"]
    assert (killed / "index.faiss").read_bytes() == (uninterrupted / "index.faiss").read_bytes()
    assert not (tmp_path / ".killed.chunks").exists()


def test_chunks_are_reused_only_for_the_same_inputs(models, tmp_path, caplog):
    """Complete chunks of the same model, source and settings are reused; those of other inputs are removed."""
    from copynce_hf.retrieval import ImageListSource, extract_in_chunks
    from copynce_hf.runtime.loading import load_model

    rng = np.random.default_rng(2)
    source = ImageListSource([f"i{n}" for n in range(7)], [png_bytes(rng) for _ in range(7)])
    model, processor = load_model(models["descriptor"], "descriptor", "--model")
    folder = tmp_path / "chunks"
    identity = {"model": "tiny", "source": {"ids": "seven"}, "batch_size": 2}

    def extract(identity):
        return extract_in_chunks(model, processor, source, folder, identity, chunk_size=3, progress=False,
                                 batch_size=2)

    first = extract(identity)
    assert first.resumed == 0 and [path.name for path in first.parts] == [
        "chunk-000000.safetensors", "chunk-000001.safetensors", "chunk-000002.safetensors"]
    assert [len(DescriptorSet.load(path)) for path in first.parts] == [3, 3, 1]
    before = DescriptorSet.load(first.parts[0]).descriptors
    first.parts[2].unlink()  # as a kill before the last chunk leaves it
    again = extract(identity)
    assert again.resumed == 2 and again.images == 7 and again.count == 7
    with caplog.at_level("WARNING"):
        other = extract({**identity, "batch_size": 3})
    assert other.resumed == 0 and "computed from other inputs (changed: batch_size)" in caplog.text
    assert sorted(path.name for path in folder.iterdir())[-1] == "work.json"  # the file name of before
    np.testing.assert_allclose(DescriptorSet.load(other.parts[0]).descriptors, before, atol=1e-6)


def test_local_files_stamp_follows_the_files(tmp_path):
    """What ties chunks to a local dataset: a changed, added or renamed file changes it."""
    from copynce_hf.retrieval.sources import local_files_stamp

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-0.parquet").write_bytes(b"1234")
    first = local_files_stamp(tmp_path / "data")
    assert first == local_files_stamp(tmp_path / "data") and len(first) == 64
    (tmp_path / "data" / "train-0.parquet").write_bytes(b"12345")
    second = local_files_stamp(tmp_path / "data")
    (tmp_path / "data" / "train-1.parquet").write_bytes(b"PAR1")
    assert len({first, second, local_files_stamp(tmp_path / "data")}) == 3
    assert local_files_stamp(tmp_path / "data" / "train-1.parquet") != local_files_stamp(tmp_path / "data")
    assert local_files_stamp("someone/a-hub-dataset") is None


def test_a_descriptor_model_has_a_fingerprint(models):
    """What ties index chunks to the model's weights: a descriptor's BatchNorm holds a 0-d counter
    (num_batches_tracked), which is hashed like any tensor."""
    import torch

    from copynce_hf.retrieval.work_folder import model_fingerprint
    from copynce_hf.runtime.loading import load_model

    model, _ = load_model(models["descriptor"], "descriptor", "--model")
    assert any(tensor.dim() == 0 for tensor in model.state_dict().values())
    first = model_fingerprint(model)
    assert first == model_fingerprint(load_model(models["descriptor"], "descriptor", "--model")[0])
    with torch.no_grad():
        next(tensor for tensor in model.state_dict().values() if tensor.dim() == 0).add_(1)
    assert model_fingerprint(model) != first


def test_extraction_lets_go_of_its_images(models):
    """The Accelerator keeps every loader it prepares: extraction hands its own back, so that indexing chunk after
    chunk does not hold every chunk's images."""
    import gc
    import weakref

    from accelerate import Accelerator

    from copynce_hf.retrieval import ImageListSource, extract_descriptors
    from copynce_hf.runtime.loading import load_model

    rng = np.random.default_rng(4)
    model, processor = load_model(models["descriptor"], "descriptor", "--model")
    source = ImageListSource(["a", "b"], [png_bytes(rng) for _ in range(2)])
    released, accelerator = weakref.ref(source), Accelerator()  # one Accelerator for every chunk, as in a run
    assert len(extract_descriptors(model, processor, source, accelerator=accelerator, progress=False)) == 2
    del source
    gc.collect()
    assert released() is None


@pytest.mark.parametrize("kind", ["flat", "ivfpq"])
def test_index_from_descriptor_files_equals_the_in_memory_build(tmp_path, kind):
    from copynce_hf.retrieval import write_index_from_files

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((700, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"r{n}" for n in range(700)]
    parts = []
    for number, (start, end) in enumerate([(0, 250), (250, 250), (250, 600), (600, 700)]):  # one part is empty
        parts.append(DescriptorSet(ids[start:end], vectors[start:end], skipped=[f"bad{number}"]).save(
            tmp_path / f"part{number}.safetensors"))
    config = IndexConfig(kind=kind, max_train_vectors=300)
    assert write_index_from_files(parts, tmp_path / "idx", config, {"model": "m"}) == (700, 16)
    built = DescriptorIndex.load(tmp_path / "idx")
    expected = DescriptorIndex.build(DescriptorSet(ids, vectors), config)
    assert built.references.ids == ids and built.references.skipped == [f"bad{n}" for n in range(4)]
    np.testing.assert_array_equal(built.references.descriptors, vectors)
    queries = vectors[:50] + 0.05 * rng.standard_normal((50, 16)).astype(np.float32)
    for got, want in zip(built.search(queries, 5), expected.search(queries, 5)):
        np.testing.assert_array_equal(got, want)
    assert built.info == {"model": "m"} and built.config.kind == kind


def test_index_chunks_and_the_caches_of_detect_and_dedup_share_one_identity(models, collection, tmp_path,
                                                                             monkeypatch):
    """``copynce index``'s chunks (``work.json``) and the index ``detect`` and ``dedup`` cache (``identity.json``)
    are tied to the same inputs, named the same way (:func:`views_identity`); the chunks add their chunk and batch
    sizes."""
    import json

    from copynce_hf.retrieval import Descriptor, ImageFolderSource, ViewPreset, dedup, view_index
    from copynce_hf.retrieval.descriptors.chunked_extraction import ChunkedDescriptors
    from copynce_hf.retrieval.work_folder import views_identity
    from copynce_hf.runtime.loading import load_model

    monkeypatch.setattr(ChunkedDescriptors, "remove", lambda self: None)  # keep the work folder to read it
    code = main(["--quiet", "index", str(collection / "refs"), "--model", models["descriptor"], "--output",
                 str(tmp_path / "idx"), "--chunk-size", "5", "--batch-size", "3"])
    assert code == 0
    chunks = json.loads((tmp_path / ".idx.chunks" / "work.json").read_text())
    model, processor = load_model(models["descriptor"], "descriptor")
    source = ImageFolderSource(collection / "refs")
    expected = json.loads(json.dumps(views_identity(model, processor, source, "none", "reference")))
    assert chunks == {**expected, "chunk_size": 5, "batch_size": 3}
    assert expected["model"] and expected["num_images"] == IMAGES and len(expected["files"]) == 32

    descriptor = Descriptor("tiny", model, processor, source="a label for reports only")
    view_index(descriptor, source, ViewPreset("none"), tmp_path / "detect-cache", progress=False)
    assert json.loads((tmp_path / "detect-cache" / "identity.json").read_text()) == expected
    dedup(source, descriptor, None, threshold=0.99, index_folder=tmp_path / "dedup", progress=False)
    assert json.loads((tmp_path / "dedup" / "tiny" / "references" / "identity.json").read_text()) == expected
