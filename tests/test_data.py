"""Tests of copynce_hf.data: loading, copy pairs, the PixTrace collator, GHNM and its sampler."""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pytest
import torch
from conftest import iterator_states
from PIL import Image

from copynce_hf.data import (
    ASSET_IMAGES,
    CopyPairBatchSampler,
    CopyPairDataset,
    CopyPairMaker,
    GroundTruthPairDataset,
    ImageDecoder,
    KNNGraph,
    PairKey,
    PixTraceCollator,
    StreamingCopyPairDataset,
    build_knn_graph,
    load_disc21_ground_truth,
    load_image_dataset,
)
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import pair_overlaps

SIZE, PATCH = 64, 16


def _small_images(folder, count=8, side=96, names=None):
    """Natural images (the bundled ones, shrunk) written as JPEG files into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted(ASSET_IMAGES.glob("*.jpg"))
    paths = []
    for position in range(count):
        image = Image.open(sources[position % len(sources)]).convert("RGB")
        image.thumbnail((side, side))
        if position >= len(sources):  # more files than sources: make them differ
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        name = names[position] if names else f"img{position:02d}.jpg"
        image.save(folder / name, quality=90)
        paths.append(folder / name)
    return paths


def _corrupt(folder):
    """A truncated JPEG and a file of garbage bytes with an image extension (sorted among the good files)."""
    good = (folder / "img00.jpg").read_bytes()
    (folder / "img02_truncated.jpg").write_bytes(good[: len(good) // 3])
    (folder / "img04_garbage.png").write_bytes(b"this is not an image" * 10)


@pytest.fixture
def disc21(tmp_path):
    root = tmp_path / "disc21"
    _small_images(root / "training_images", 6, names=[f"T{i:06d}.jpg" for i in range(6)])
    _small_images(root / "reference_images", 4, names=[f"R{i:06d}.jpg" for i in range(4)])
    _small_images(root / "query_images", 3, names=[f"Q{i:05d}.jpg" for i in range(3)])
    (root / "dev_ground_truth.csv").write_text("query_id,reference_id\nQ00000,R000002\nQ00001,R000000\nQ00002,\n")
    return root


# ---------------------------------------------------------------------------------------------- loading
def test_disc21_layout_splits_ids_and_ground_truth(disc21):
    train = load_image_dataset(disc21, "train")
    assert train["image_id"] == [f"T{i:06d}" for i in range(6)]
    assert load_image_dataset(disc21, "reference")["image_id"] == [f"R{i:06d}" for i in range(4)]
    assert load_image_dataset(disc21, "query")["image_id"] == ["Q00000", "Q00001", "Q00002"]
    streamed = load_image_dataset(disc21, "train", streaming=True)
    assert isinstance(streamed, datasets.IterableDataset)
    assert sorted(row["image_id"] for row in streamed) == train["image_id"]
    truth = load_disc21_ground_truth(disc21 / "dev_ground_truth.csv")
    assert truth == {"Q00000": ["R000002"], "Q00001": ["R000000"], "Q00002": []}  # Q00002: a distractor
    with pytest.raises(ConfigError, match="split"):
        load_image_dataset(disc21, "validation")


def test_default_folder_and_saved_dataset_with_other_columns(tmp_path):
    default = load_image_dataset()
    assert len(default) == len(list(ASSET_IMAGES.glob("*.jpg"))) >= 10
    paths = _small_images(tmp_path / "imgs", 3)
    table = datasets.Dataset.from_dict({"picture": [str(p) for p in paths], "name": ["a", "b", "c"]})
    table = table.cast_column("picture", datasets.Image())
    table.save_to_disk(str(tmp_path / "saved"))
    loaded = load_image_dataset(tmp_path / "saved", id_column="name")
    assert set(loaded.column_names) == {"image_id", "image"}
    assert loaded["image_id"] == ["a", "b", "c"]
    decoded = ImageDecoder()(loaded[1]["image"], "b")
    assert decoded.size == Image.open(paths[1]).size
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ConfigError, match="no images"):
        load_image_dataset(tmp_path / "empty_dir")


def test_image_folder_with_split_folders_gives_the_requested_split_only(tmp_path):
    """As datasets' imagefolder splits it: test images never leak into a training split."""
    root = tmp_path / "photos"
    _small_images(root / "train" / "cats", 3)
    _small_images(root / "test", 2, names=["t0.jpg", "t1.jpg"])
    assert load_image_dataset(root, "train")["image_id"] == ["train/cats/img00", "train/cats/img01", "train/cats/img02"]
    assert load_image_dataset(root, "test")["image_id"] == ["test/t0", "test/t1"]
    reference = datasets.load_dataset("imagefolder", data_dir=str(root))
    assert {split: len(rows) for split, rows in reference.items()} == {"train": 3, "test": 2}
    with pytest.raises(ConfigError, match=r"'validation' is not a split folder .* \['test', 'train'\]"):
        load_image_dataset(root, "validation")
    flat = tmp_path / "flat"  # without split folders the split is not used, as before
    _small_images(flat / "a", 2)
    assert len(load_image_dataset(flat, "test")) == 2
    # a file NAME with a split word ("bullet_train" is an ImageNet class) does not split a flat folder
    named = tmp_path / "named"
    _small_images(named, 3, names=["n02917067_bullet_train.jpg", "n01440764_tench.jpg", "exam_test_1.jpg"])
    assert sorted(load_image_dataset(named, "train")["image_id"]) == [
        "exam_test_1", "n01440764_tench", "n02917067_bullet_train"]


def _image_table(paths, ids):
    """A dataset of embedded image bytes (as Parquet files on the Hub hold them) with an ``id`` column."""
    table = datasets.Dataset.from_dict({"image": [{"bytes": p.read_bytes(), "path": None} for p in paths], "id": ids})
    return table.cast_column("image", datasets.Image())


def test_parquet_file_folder_and_hub_snapshot_folder(tmp_path):
    paths = _small_images(tmp_path / "imgs", 6)
    expected = {f"p{i}": Image.open(path).size for i, path in enumerate(paths)}
    _image_table(paths, list(expected)).to_parquet(str(tmp_path / "images.parquet"))
    # A single Parquet file, indexed and streamed.
    for streaming in (False, True):
        loaded = load_image_dataset(tmp_path / "images.parquet", streaming=streaming)
        rows = list(loaded)
        assert [row["image_id"] for row in rows] == list(expected)
        assert ImageDecoder()(rows[2]["image"], "p2").size == expected["p2"]
    # A folder of Parquet shards.
    shards = tmp_path / "shards"
    shards.mkdir()
    for index in range(3):
        _image_table(paths[2 * index:2 * index + 2], list(expected)[2 * index:2 * index + 2]).to_parquet(
            str(shards / f"part-{index}.parquet"))
    assert sorted(load_image_dataset(shards)["image_id"]) == sorted(expected)
    assert load_image_dataset(shards, streaming=True).num_shards == 3
    # A Hub dataset snapshot (as snapshot_download leaves it): README configs, data/<split>-*.parquet files.
    snapshot = tmp_path / "snapshot"
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "small").mkdir()
    _image_table(paths[:4], list(expected)[:4]).to_parquet(str(snapshot / "data" / "train-00000-of-00001.parquet"))
    _image_table(paths[4:], list(expected)[4:]).to_parquet(str(snapshot / "data" / "test-00000-of-00001.parquet"))
    _image_table(paths[:1], ["only"]).to_parquet(str(snapshot / "small" / "train-00000-of-00001.parquet"))
    (snapshot / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"
        "  - split: test\n    path: data/test-*\n- config_name: small\n  data_files:\n  - split: train\n"
        "    path: small/train-*\n---\n# images\n")
    assert load_image_dataset(snapshot)["image_id"] == ["p0", "p1", "p2", "p3"]
    assert load_image_dataset(snapshot, "test")["image_id"] == ["p4", "p5"]
    assert load_image_dataset(snapshot, config_name="small")["image_id"] == ["only"]
    with pytest.raises(ConfigError, match="validation"):
        load_image_dataset(snapshot, "validation")
    (tmp_path / "notes.txt").write_text("not a dataset")
    with pytest.raises(ConfigError, match="neither a folder nor a Parquet file"):
        load_image_dataset(tmp_path / "notes.txt")


def test_corrupt_images_are_skipped_logged_and_counted(tmp_path, caplog):
    folder = tmp_path / "imgs"
    _small_images(folder, 6)
    _corrupt(folder)
    images = load_image_dataset(folder)
    assert len(images) == 8
    bad = {i for i, image_id in enumerate(images["image_id"]) if "_" in image_id}
    dataset = CopyPairDataset(images, CopyPairMaker(SIZE, "resize", "resize"), seed=0, positive_rate=1.0)
    collator = PixTraceCollator(SIZE, PATCH)
    with caplog.at_level(logging.WARNING, logger="copynce_hf.data.loading"):
        pairs = [dataset[PairKey(0, slot, slot % 8)] for slot in range(16)]  # each bad file hit twice
    assert all(pair.query_id not in ("img02_truncated", "img04_garbage") for pair in pairs)
    # Each bad file is the query of 2 keys; a random replacement may hit a bad file again (counted too).
    assert dataset.skipped >= 4 and dataset.skipped == sum(pair.skipped_images for pair in pairs)
    assert int(collator(pairs)["num_skipped_images"]) == dataset.skipped
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "img02_truncated" in logged and "img04_garbage" in logged
    assert len(bad) == 2


# ---------------------------------------------------------------------------------------------- pairs + collator
def test_collator_priors_equal_pair_overlaps_and_pixels_match_processor(tmp_path):
    from copynce_hf.modeling import CopyNCEImageProcessor

    _small_images(tmp_path / "imgs", 6)
    images = load_image_dataset(tmp_path / "imgs")
    dataset = CopyPairDataset(images, CopyPairMaker(SIZE), seed=3, positive_rate=0.5)
    pairs = [dataset[PairKey(0, slot, slot % 6)] for slot in range(8)]
    assert {p.label for p in pairs} == {0, 1}, "want both positives and negatives in this sample"
    collator = PixTraceCollator(SIZE, PATCH)
    batch = collator(pairs)
    L = (SIZE // PATCH) ** 2
    assert batch["pixel_values"].shape == batch["reference_pixel_values"].shape == (8, 3, SIZE, SIZE)
    assert batch["pixel_values"].dtype == batch["reference_pixel_values"].dtype == torch.uint8
    np.testing.assert_array_equal(batch["pixel_values"][3].permute(1, 2, 0).numpy(), np.asarray(pairs[3].query))
    assert batch["overlap_qr"].shape == batch["overlap_rq"].shape == (8, L, L)
    for row, pair in enumerate(pairs):
        assert pair.query.size == pair.reference.size == (SIZE, SIZE)
        if pair.label:
            assert pair.query_id == pair.reference_id
            qr, rq = pair_overlaps(pair.query_table, pair.reference_table, PATCH)
            np.testing.assert_array_equal(batch["overlap_qr"][row].numpy(), qr)
            np.testing.assert_array_equal(batch["overlap_rq"][row].numpy(), rq)
            assert bool(batch["pair_mask"][row]) == bool(qr.sum() > 0 and rq.sum() > 0)
        else:
            assert pair.query_id != pair.reference_id
            assert float(batch["overlap_qr"][row].abs().sum()) == 0 and not bool(batch["pair_mask"][row])
    assert batch["labels"].tolist() == [float(p.label) for p in pairs]
    assert bool(batch["pair_mask"].any())
    processor = CopyNCEImageProcessor(size={"height": SIZE, "width": SIZE})
    # Normalised on the device (here the CPU), the pixels are the image processor's.
    normalised = collator.normalize(batch)
    assert normalised["pixel_values"].dtype == torch.float32 and normalised["labels"] is batch["labels"]
    expected = processor([pairs[0].query, pairs[0].reference], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(normalised["pixel_values"][0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(normalised["reference_pixel_values"][0], expected[1], atol=1e-5, rtol=1e-5)
    assert collator.normalize(normalised)["pixel_values"] is normalised["pixel_values"]  # float: left alone


def test_pairs_are_deterministic_and_identical_in_workers(tmp_path):
    _small_images(tmp_path / "imgs", 6)
    images = load_image_dataset(tmp_path / "imgs")
    dataset = CopyPairDataset(images, CopyPairMaker(SIZE), seed=11, positive_rate=0.5)
    collator = PixTraceCollator(SIZE, PATCH)
    again = dataset[PairKey(3, 1, 2)]
    first = dataset[PairKey(3, 1, 2)]
    assert np.array_equal(np.asarray(first.query), np.asarray(again.query)) and first.edits == again.edits
    other = CopyPairDataset(images, CopyPairMaker(SIZE), seed=12, positive_rate=0.5)[PairKey(3, 1, 2)]
    assert first.edits != other.edits
    sampler = CopyPairBatchSampler(len(images), 4, seed=11, num_batches=3)
    batches = {}
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, num_workers=workers)
        batches[workers] = list(loader)
    for a, b in zip(batches[0], batches[2], strict=True):
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_positive_rate_and_hard_negative_references(tmp_path):
    _small_images(tmp_path / "imgs", 10, side=40)
    images = load_image_dataset(tmp_path / "imgs")
    rng = np.random.default_rng(0)
    graph = build_knn_graph(rng.normal(size=(10, 8)).astype(np.float32), images["image_id"], k=2)
    maker = CopyPairMaker(32, "resize", "resize")
    dataset = CopyPairDataset(images, maker, seed=0, positive_rate=0.3, knn=graph, hard_negative_k=2,
                              hard_negative_prob=1.0)
    rows = {image_id: row for row, image_id in enumerate(images["image_id"])}
    pairs = [dataset[PairKey(0, slot, slot % 10)] for slot in range(150)]
    rate = np.mean([p.label for p in pairs])
    assert 0.2 < rate < 0.4
    for pair in pairs:
        if not pair.label:  # probability 1: the reference is one of the query image's 2 neighbours
            assert rows[pair.reference_id] in graph.neighbors[rows[pair.query_id]].tolist()
    with pytest.raises(ConfigError, match="positive_rate"):
        CopyPairDataset(images, maker, positive_rate=1.5)


def test_ground_truth_pairs_for_finetuning(disc21):
    queries, references = load_image_dataset(disc21, "query"), load_image_dataset(disc21, "reference")
    truth = load_disc21_ground_truth(disc21 / "dev_ground_truth.csv")
    dataset = GroundTruthPairDataset(queries, references, truth, CopyPairMaker(32, "resize", "resize"))
    assert len(dataset) == 2  # the distractor Q00002 has no pair
    pairs = [dataset[i] for i in range(2)]
    assert {(p.query_id, p.reference_id) for p in pairs} == {("Q00000", "R000002"), ("Q00001", "R000000")}
    batch = PixTraceCollator(32, PATCH)(pairs)
    assert not bool(batch["pair_mask"].any()) and float(batch["overlap_qr"].sum()) == 0  # CopyNCE off


def _finetune_mix(disc21, tmp_path, rate=0.5, **overrides):
    """The finetuning config's training data on the small DISC21 folder, mixed with its training images."""
    from accelerate import Accelerator

    from copynce_hf.training import load_config
    from copynce_hf.training.config import CONFIG_DIR
    from copynce_hf.training.data import build_training_data

    config = load_config(CONFIG_DIR / "finetune_matcher_disc21_dev.yaml", {
        "dataset": str(disc21), "ground_truth": str(disc21 / "dev_ground_truth.csv"), "mix_dataset": str(disc21),
        "mix_sampling_rate": rate, "per_device_train_batch_size": 5, "output_dir": str(tmp_path / "out"),
        **overrides})
    return build_training_data(config, Accelerator(cpu=True), SIZE, PATCH)


def test_finetune_mix_samples_training_pairs_at_the_authors_rate(disc21, tmp_path):
    """The authors' finetune.yaml: the ground-truth pairs plus int(N * sampling_rate) training pairs per
    epoch, each from a random image of its block of 1 / sampling_rate images."""
    from copynce_hf.data import FinetuneMixDataset

    data = _finetune_mix(disc21, tmp_path, rate=0.5)
    dataset = data.dataset
    assert isinstance(dataset, FinetuneMixDataset)
    assert (len(dataset.ground_truth), dataset.num_training, len(dataset)) == (2, 3, 5)  # 2 + int(6 * 0.5)
    assert data.steps_per_epoch == 1.0  # one batch of 5 pairs is one epoch
    kinds, images = [], {j: [] for j in range(3)}
    for batch in range(300):  # 300 epochs: every row once per epoch
        keys = [PairKey(batch, slot, index) for slot, index in enumerate(data.sampler.global_batch(batch))]
        assert sorted(key.index for key in keys) == list(range(5))
        for key in keys:
            kinds.append(dataset.is_training_row(key.index))
            if dataset.is_training_row(key.index):
                images[key.index - 2].append(dataset.training_image(key))
    assert np.mean(kinds) == 3 / 5
    for block, drawn in images.items():  # row 2 + j: image 2j or 2j + 1, each about half of the epochs
        counts = np.bincount(drawn, minlength=6)
        assert set(np.nonzero(counts)[0]) == {2 * block, 2 * block + 1}
        assert abs(counts[2 * block] - 150) < 4 * np.sqrt(75)
    with pytest.raises(ConfigError, match="selects none"):
        FinetuneMixDataset(dataset.ground_truth, dataset.training, 0.0833)  # int(6 * 0.0833) = 0
    with pytest.raises(ConfigError, match=r"sampling_rate=1\.5"):
        FinetuneMixDataset(dataset.ground_truth, dataset.training, 1.5)


def test_finetune_mix_pairs_reach_the_collator_as_their_kind(disc21, tmp_path):
    data = _finetune_mix(disc21, tmp_path, rate=1.0, mix_positive_rate=1.0)
    dataset = data.dataset
    assert (len(dataset), dataset.training.maker.query_recipe, dataset.training.maker.reference_recipe) == (
        8, "paper_matcher", "off")
    keys = [PairKey(0, slot, index) for slot, index in enumerate(range(8))]
    pairs = [dataset[key] for key in keys]
    truth_ids = {(p.query_id, p.reference_id) for p in pairs[:2]}
    assert truth_ids == {("Q00000", "R000002"), ("Q00001", "R000000")}  # positive_rate 1.0: the dev positives
    assert all(p.query_table is None for p in pairs[:2])
    assert all(p.query_id.startswith("T") and p.query_id == p.reference_id and p.query_table is not None
               for p in pairs[2:])  # training copies of DISC21 training images, traced
    batch = data.collator(pairs)
    assert batch["labels"].tolist() == [1.0] * 8
    assert not batch["pair_mask"][:2].any() and float(batch["overlap_qr"][:2].sum()) == 0
    assert int(batch["pair_mask"][2:].sum()) >= 4 and float(batch["overlap_qr"][2:].sum()) > 0
    # mix_positive_rate: the training pairs' copies; negatives take another training image.
    negatives = _finetune_mix(disc21, tmp_path, rate=1.0, mix_positive_rate=0.0).dataset
    pair = negatives[PairKey(0, 5, 5)]
    assert pair.label == 0 and pair.query_id != pair.reference_id and pair.reference_id.startswith("T")


def test_finetune_mix_settings_are_checked(disc21, tmp_path):
    from copynce_hf.training import load_config
    from copynce_hf.training.config import CONFIG_DIR

    needs = {"dataset": str(disc21), "ground_truth": str(disc21 / "dev_ground_truth.csv")}
    with pytest.raises(ConfigError, match="mix_dataset=None: must name the training images"):
        load_config(CONFIG_DIR / "finetune_matcher_disc21_dev.yaml", needs)
    paper_form = load_config(CONFIG_DIR / "finetune_matcher_disc21_dev.yaml",
                             {**needs, "mix_sampling_rate": 0, "positive_rate": 0.3})
    assert paper_form.mix_dataset is None and paper_form.positive_rate == 0.3
    with pytest.raises(ConfigError, match="mix_dataset=.*only used by pair_source ground_truth"):
        load_config(CONFIG_DIR / "tiny_cpu.yaml", {"mix_dataset": str(disc21), "mix_sampling_rate": 0.5})
    with pytest.raises(ConfigError, match="mix_query_recipe='heavy'"):
        load_config(CONFIG_DIR / "finetune_matcher_disc21_dev.yaml",
                    {**needs, "mix_dataset": str(disc21), "mix_query_recipe": "heavy"})
    authors = load_config(CONFIG_DIR / "finetune_matcher_disc21_dev.yaml", {**needs, "mix_dataset": str(disc21)})
    assert (authors.mix_sampling_rate, authors.mix_positive_rate, authors.positive_rate) == (0.0833, 0.3, 1.0)
    assert (authors.resolved("hard_negative_k"), authors.resolved("hard_negative_prob")) == (127, 0.5)


def _log_read(row, log):
    """A ``datasets.map`` function that records every row the stream reads (in the worker that reads it)."""
    with open(log, "a") as handle:
        handle.write(row["image_id"] + "\n")
    return row


@pytest.mark.parametrize(("shards", "workers"), [(1, 2), (4, 2), (2, 0)])
def test_streaming_pairs_resume_exactly_without_rereading(tmp_path, shards, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    folder = tmp_path / "imgs"
    _small_images(folder, 19, side=40)
    _corrupt(folder)
    files = sorted(folder.iterdir())  # 19 images and 2 unreadable files, as Parquet shards
    (tmp_path / "parquet").mkdir()
    for index in range(shards):
        part = files[index::shards]
        _image_table(part, [path.stem for path in part]).to_parquet(str(tmp_path / "parquet" / f"train-{index}.parquet"))
    stream = load_image_dataset(tmp_path / "parquet", streaming=True)
    assert stream.num_shards == shards

    def loader(state=None, log=tmp_path / "read.log"):
        images = stream.map(_log_read, fn_kwargs={"log": str(log)})
        dataset = StreamingCopyPairDataset(images, CopyPairMaker(32, "resize", "resize"), batch_size=2, seed=5,
                                           positive_rate=0.5, shuffle_buffer_size=4, negative_pool=3)
        dataset.set_epoch(1)
        result = StatefulDataLoader(dataset, batch_size=2, num_workers=workers, collate_fn=list, drop_last=True,
                                    snapshot_every_n_steps=3)
        if state is not None:
            result.load_state_dict(state)
        return result

    def ids(batch):
        return [(p.query_id, p.reference_id, p.label) for p in batch]

    full = [ids(batch) for batch in loader()]
    assert sum(len(b) for b in full) >= 18 and {p[2] for b in full for p in b} == {0, 1}
    interrupted = loader()
    seen = []
    for batch in interrupted:
        seen.append(ids(batch))
        if len(seen) == 3:  # a snapshot step: the saved state holds every worker's exact position
            state = interrupted.state_dict()
            break
    assert seen == full[:3]
    log = tmp_path / "read_after_resume.log"
    resumed = [ids(batch) for batch in loader(state, log)]
    assert seen + resumed == full
    # Nothing read before the checkpoint is read again: the resumed workers read exactly the rows that
    # were neither trained on nor waiting in a shuffle buffer.
    buffered = [row["image_id"] for worker in iterator_states(state) for row in worker["buffer"]]
    consumed = {p[0] for batch in seen for p in batch}
    read_after = log.read_text().split()
    assert len(read_after) == len(set(read_after))
    assert not set(read_after) & (consumed | set(buffered))
    assert len(read_after) + len(buffered) + len(consumed) == 21  # 19 images and 2 unreadable files


# ---------------------------------------------------------------------------------------------- GHNM
def test_knn_graph_matches_brute_force_and_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(30, 16)).astype(np.float32)
    ids = [f"T{i:03d}" for i in range(30)]
    valid = np.ones(30, dtype=bool)
    valid[7] = False
    graph = build_knn_graph(vectors, ids, k=5, valid=valid)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    similarity[:, 7] = -np.inf
    for row in range(30):
        if row == 7:
            assert (graph.neighbors[row] == -1).all()
            continue
        assert graph.neighbors[row].tolist() == np.argsort(-similarity[row])[:5].tolist()
        np.testing.assert_allclose(graph.similarities[row], np.sort(similarity[row])[::-1][:5], rtol=1e-5)
    graph.save(tmp_path / "knn.safetensors", model="test")
    loaded = KNNGraph.load(tmp_path / "knn.safetensors")
    assert loaded.ids == ids and np.array_equal(loaded.neighbors, graph.neighbors)
    order = ids[::-1]
    aligned = loaded.aligned_to(order)
    for row, image_id in enumerate(order):
        original = ids.index(image_id)
        expected = [order.index(ids[n]) if n >= 0 else -1 for n in graph.neighbors[original]]
        assert aligned.neighbors[row].tolist() == expected
    with pytest.raises(ConfigError, match="build_knn"):
        KNNGraph.load(tmp_path / "missing.safetensors")


def test_knn_graph_per_group_searches_each_group_apart():
    """``groups``: every image's neighbours are the brute-force nearest among its own group's readable images
    only; an image alone in its group (or unreadable) gets none."""
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(25, 8)).astype(np.float32)
    groups = ["photo"] * 12 + ["procedural"] * 12 + ["alone"]
    valid = np.ones(25, dtype=bool)
    valid[3] = False
    graph = build_knn_graph(vectors, [f"I{i:02d}" for i in range(25)], k=4, valid=valid, groups=groups)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    similarity[:, 3] = -np.inf
    similarity[np.array(groups)[:, None] != np.array(groups)[None, :]] = -np.inf
    for row in range(25):
        if row in (3, 24):
            assert (graph.neighbors[row] == -1).all()
            continue
        assert graph.neighbors[row].tolist() == np.argsort(-similarity[row])[:4].tolist()
        assert {groups[n] for n in graph.neighbors[row]} == {groups[row]}
        np.testing.assert_allclose(graph.similarities[row], np.sort(similarity[row])[::-1][:4], rtol=1e-5)
    with pytest.raises(ValueError, match="one label per image"):
        build_knn_graph(vectors, [f"I{i:02d}" for i in range(25)], k=4, groups=groups[:-1])


def test_ghnm_sampler_algorithm_1_sharding_and_resume():
    rng = np.random.default_rng(2)
    ids = [str(i) for i in range(40)]
    graph = build_knn_graph(rng.normal(size=(40, 8)).astype(np.float32), ids, k=8)
    sampler = CopyPairBatchSampler(40, 8, seed=4, num_processes=2, process_index=0, knn=graph, hard_negative_k=8,
                                   hard_negative_prob=1.0, num_batches=10)
    anchors = []
    for b in range(10):
        batch = sampler.global_batch(b)
        assert len(batch) == 16 and len(set(batch)) == 16  # no image twice in a batch
        for x, x_hn in zip(batch[0::2], batch[1::2]):
            assert x_hn in graph.neighbors[x, :8].tolist()  # Algorithm 1: x_hn among x's k-NN
        anchors += batch[0::2]
    assert sorted(anchors[:40]) == list(range(40))  # one epoch: every image once as x
    other = CopyPairBatchSampler(40, 8, seed=4, num_processes=2, process_index=1, knn=graph, num_batches=10)
    for ours, theirs, b in zip(sampler, other, range(10)):
        assert [k.index for k in ours] + [k.index for k in theirs] == sampler.global_batch(b)
        assert [k.slot for k in theirs] == list(range(8, 16))
    resumed = CopyPairBatchSampler(40, 8, seed=4, num_processes=2, process_index=0, knn=graph, num_batches=10,
                                   start_batch=6)
    assert list(resumed) == list(sampler)[6:]
    with pytest.raises(ConfigError, match="even"):
        CopyPairBatchSampler(40, 7, knn=graph)


def test_paired_slots_give_each_anchor_and_its_hard_negative():
    rng = np.random.default_rng(3)
    ids = [str(i) for i in range(40)]
    graph = build_knn_graph(rng.normal(size=(40, 8)).astype(np.float32), ids, k=8)
    # 3 slots per process (odd is fine), 2 processes: 6 pairs per process, 6 anchors per global batch.
    first = CopyPairBatchSampler(40, 3, seed=5, num_processes=2, process_index=0, knn=graph, num_batches=4,
                                 paired_slots=True)
    second = CopyPairBatchSampler(40, 3, seed=5, num_processes=2, process_index=1, knn=graph, num_batches=4,
                                  paired_slots=True)
    assert first.pairs_per_process == 6 and first.batches_per_epoch == 40 / 6
    for ours, theirs, b in zip(first, second, range(4)):
        assert len(ours) == len(theirs) == 6
        batch = [k.index for k in ours] + [k.index for k in theirs]
        assert batch == first.global_batch(b) and len(set(batch)) == 12
        for local in (ours, theirs):  # every process holds whole (anchor, hard negative) couples
            for x, x_hn in zip(local[0::2], local[1::2]):
                assert x_hn.index in graph.neighbors[x.index, :8].tolist()
    # Without a graph the slot still yields two pairs (the partner random): the batch keeps its size.
    plain = CopyPairBatchSampler(40, 3, seed=5, num_batches=2, paired_slots=True)
    assert [len(keys) for keys in plain] == [6, 6]
