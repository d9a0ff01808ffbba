"""The authors' training choices beside the paper's, each a configuration key.

Each test compares the code with a computation of its own: the neighbour lists with a brute-force
ranking that keeps the image itself in column 0 (as the authors' ``knns`` do), the schedule with the
formulas of timm's ``CosineLRScheduler`` (``warmup_prefix=True``) and of ``transformers``, the recipe
probabilities with counts over many draws.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY_VIT

from copynce_hf.data import CopyPairBatchSampler, CopyPairDataset, CopyPairMaker, PairKey, build_knn_graph
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.training import build_scheduler, load_config
from copynce_hf.training.optim import learning_rate_factor

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAPER_CONFIGS = sorted(CONFIGS.glob("*vit*16*.yaml"))


# ---------------------------------------------------------------------------------------------- neighbours
def _authors_knns(vectors: np.ndarray) -> np.ndarray:
    """Every image's images by decreasing cosine similarity, itself first (the authors' ``knns`` file)."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    order = np.argsort(-(unit @ unit.T), axis=1, kind="stable")
    assert (order[:, 0] == np.arange(len(vectors))).all()  # column 0 is the image itself
    return order


@pytest.fixture
def images(tmp_path):
    from test_data import _small_images

    from copynce_hf.data import load_image_dataset

    _small_images(tmp_path / "imgs", 24, side=40)
    return load_image_dataset(tmp_path / "imgs")


@pytest.mark.parametrize("roles", ["package", "authors"])
def test_matcher_negatives_are_the_authors_neighbours_1_to_127(images, roles):
    """``package``: the drawn image is the query, its neighbour the reference; ``authors`` (their copy_dataset.py,
    run by scripts/check_against_authors.py): the drawn image is the reference, its neighbour the query."""
    vectors = np.random.default_rng(3).normal(size=(len(images), 16)).astype(np.float32)
    graph = build_knn_graph(vectors, images["image_id"], k=12)
    knns = _authors_knns(vectors)[:, 1:8]  # knn_l = 1, knn_r = 8: the image itself skipped, 7 neighbours
    dataset = CopyPairDataset(images, CopyPairMaker(32, "resize", "resize"), seed=0, positive_rate=0.0,
                              knn=graph, hard_negative_k=7, hard_negative_prob=1.0, negative_roles=roles)
    rows = {image_id: row for row, image_id in enumerate(images["image_id"])}
    partners = collections.defaultdict(set)
    for slot in range(240):
        pair = dataset[PairKey(0, slot, slot % len(images))]
        drawn, partner = (pair.query_id, pair.reference_id) if roles == "package" else (pair.reference_id, pair.query_id)
        assert rows[drawn] == slot % len(images)
        partners[rows[drawn]].add(rows[partner])
    for image, drawn in partners.items():
        assert drawn <= set(knns[image].tolist()), image
    assert sum(len(drawn) for drawn in partners.values()) > 4 * len(partners)  # not always the first one
    # The k-NN relation is not symmetric: the two roles make different (reference, query) pairs.
    assert any(image not in knns[partner] for image, drawn in partners.items() for partner in drawn)


def test_authors_roles_edit_the_neighbour_and_resize_the_drawn_image(images):
    """With the paper matcher's settings a negative's reference is the drawn image only resized, its query the
    neighbour (copy-edited or only resized); positive pairs are the same whichever the roles."""
    vectors = np.random.default_rng(5).normal(size=(len(images), 16)).astype(np.float32)
    graph = build_knn_graph(vectors, images["image_id"], k=7)
    maker = CopyPairMaker(32, "paper_matcher", "off", negative_query_resize_prob=0.5)
    made = {roles: CopyPairDataset(images, maker, seed=2, positive_rate=0.3, knn=graph, hard_negative_k=7,
                                   hard_negative_prob=0.5, other_images="procedural", negative_roles=roles)
            for roles in ("package", "authors")}
    negatives = 0
    for slot in range(30):
        key = PairKey(0, slot, slot % len(images))
        package, authors = made["package"][key], made["authors"][key]
        assert package.label == authors.label
        if authors.label:
            assert np.array_equal(np.asarray(package.query), np.asarray(authors.query))
            continue
        negatives += 1
        drawn = images[key.index]["image_id"]
        assert (authors.reference_id, package.query_id) == (drawn, drawn)
        assert authors.query_id == package.reference_id != drawn
        assert authors.edits["recipes"]["reference"] == "off" and [e["name"] for e in authors.edits["reference"]] == [
            "resize"]
    assert negatives >= 10


def test_streamed_negatives_follow_the_roles(tmp_path):
    """A streamed negative pairs the current image with one of the pool: the query (package) or the reference."""
    import datasets
    from test_data import _small_images

    from copynce_hf.data import StreamingCopyPairDataset

    files = _small_images(tmp_path / "imgs", 8, side=40)
    stream = datasets.Dataset.from_dict({"image": [{"bytes": p.read_bytes(), "path": None} for p in files],
                                         "image_id": [p.stem for p in files]}).to_iterable_dataset()
    order = [p.stem for p in files]
    for roles in ("package", "authors"):
        dataset = StreamingCopyPairDataset(stream, CopyPairMaker(16, "resize", "resize"), batch_size=4, seed=1,
                                           positive_rate=0.3, shuffle_buffer_size=1, negative_roles=roles)
        pairs = list(iter(dataset))
        assert [pair.query_id if roles == "package" or pair.label else pair.reference_id for pair in pairs] == order
        negatives = [pair for pair in pairs if not pair.label]
        assert negatives and all(pair.query_id != pair.reference_id for pair in negatives)


def test_ghnm_partners_are_the_authors_neighbours_1_to_7():
    vectors = np.random.default_rng(4).normal(size=(40, 8)).astype(np.float32)
    ids = [f"T{i:03d}" for i in range(40)]
    knns = _authors_knns(vectors)[:, 1:8]
    sampler = CopyPairBatchSampler(40, 8, seed=1, knn=build_knn_graph(vectors, ids, k=8), hard_negative_k=7,
                                   hard_negative_prob=1.0, num_batches=20)
    checked = 0
    for batch in range(20):
        chosen = sampler.global_batch(batch)
        for anchor, partner in zip(chosen[::2], chosen[1::2]):
            if partner in knns[anchor]:
                checked += 1
            else:  # only when every one of the 7 is already in the batch
                assert set(knns[anchor].tolist()) <= set(chosen), (batch, anchor)
    assert checked > 60  # of 80 anchors


def test_negative_query_only_resized_with_the_configured_probability(images):
    maker = CopyPairMaker(32, "paper_matcher", "off", negative_query_resize_prob=0.5)
    drawn = [maker.query_recipe_for(0, seed) for seed in range(2000)]
    assert set(drawn) == {"off", "paper_matcher"}
    assert drawn.count("off") / len(drawn) == pytest.approx(0.5, abs=0.035)
    assert {maker.query_recipe_for(1, seed) for seed in range(200)} == {"paper_matcher"}  # positives: edited
    always_edited = CopyPairMaker(32, "paper_matcher", "off")
    assert {always_edited.query_recipe_for(0, seed) for seed in range(200)} == {"paper_matcher"}
    # A pair whose query was drawn plain is the query original resized, as the reference is.
    dataset = CopyPairDataset(images, maker, seed=0, positive_rate=0.0)
    pairs = [dataset[PairKey(0, slot, slot)] for slot in range(12)]
    plain = [pair for pair in pairs if [edit["name"] for edit in pair.edits["query"]] == ["resize"]]
    assert 0 < len(plain) < len(pairs)
    for pair in plain:
        row = list(images["image_id"]).index(pair.query_id)
        original = maker.source(dataset.decoder(images[row]["image"], pair.query_id))
        expected, _, _ = maker.copy(original, "off", 0)
        assert np.array_equal(np.asarray(pair.query), np.asarray(expected))
    with pytest.raises(ConfigError, match="negative_query_resize_prob"):
        CopyPairMaker(32, negative_query_resize_prob=1.5)


# ---------------------------------------------------------------------------------------------- schedule
def _timm_cosine_with_warmup_prefix(step, lr, min_lr, warmup, total, warmup_lr_init):
    """timm ``CosineLRScheduler(t_initial=total, lr_min=min_lr, warmup_t=warmup, warmup_lr_init=...,
    warmup_prefix=True, cycle_limit=1)._get_lr(step)``, written out."""
    if step < warmup:
        return warmup_lr_init + step * (lr - warmup_lr_init) / warmup
    t = step - warmup
    if t >= total:  # past the one cycle
        return min_lr
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t / total))


def _scheduled(total, warmup, lr, min_lr, **options) -> list[float]:
    parameter = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.AdamW([parameter], lr=lr)
    scheduler = build_scheduler(optimizer, total, warmup, min_lr, **options)
    values = []
    for _ in range(total):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def test_authors_schedule_matches_timm_warmup_prefix_cosine():
    epochs, steps_per_epoch, lr, min_lr = 30, 10, 1e-3, 2e-6
    total, warmup = epochs * steps_per_epoch, steps_per_epoch
    values = _scheduled(total, warmup, lr, min_lr, warmup_start_factor=0.01, cosine_span="run")
    for step in (0, 1, 5, 9, 10, 11, 150, 290, 299):
        expected = _timm_cosine_with_warmup_prefix(step, lr, min_lr, warmup, total, 0.01 * lr)
        assert values[step] == pytest.approx(expected, rel=1e-9), step
    assert values[0] == pytest.approx(1e-5)
    # The run stops 29/30 of the way through the cosine: the last rate is well above min_lr.
    last = min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * 289 / 300))
    assert values[-1] == pytest.approx(last) and values[-1] > 2.5 * min_lr


def test_default_schedule_is_transformers_full_anneal():
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    total, warmup, lr, min_lr = 50, 7, 5e-4, 2e-6
    parameter = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([parameter], lr=lr)
    reference = get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, total, min_lr=min_lr)
    expected = []
    for _ in range(total):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    assert _scheduled(total, warmup, lr, min_lr) == pytest.approx(expected, rel=1e-12)
    assert expected[0] == 0.0
    assert learning_rate_factor(total, total, warmup, min_lr / lr) == pytest.approx(min_lr / lr)


def test_scheduler_state_round_trips():
    parameter = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([parameter], lr=1.0)
    scheduler = build_scheduler(optimizer, 20, 4, 0.0, warmup_start_factor=0.01, cosine_span="run")
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    other_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    other = build_scheduler(other_optimizer, 20, 4, 0.0, warmup_start_factor=0.01, cosine_span="run")
    other.load_state_dict(scheduler.state_dict())
    optimizer.step(), scheduler.step(), other_optimizer.step(), other.step()
    assert other.get_last_lr() == scheduler.get_last_lr()


# ---------------------------------------------------------------------------------------------- recipes
def _step_rates(recipe, draws: int) -> dict[str, float]:
    from copynce_hf.pixtrace import CopyEditor

    editor = CopyEditor(seed=0, recipe=recipe, output_size=(224, 224))
    counts = collections.Counter()
    for seed in range(draws):
        counts.update({edit.to_dict()["name"] for edit in editor.draw((300, 400), seed=seed)})
    return {name: count / draws for name, count in counts.items()}


def test_matcher_recipe_shuffles_pixels_and_blurs_a_quarter_of_the_time():
    from copynce_hf.pixtrace import CopyRecipe

    matcher = _step_rates(CopyRecipe.paper_matcher(), 2500)
    descriptor = _step_rates(CopyRecipe.paper_descriptor(), 2500)
    # matching_default_config.yaml: shuffle_pixels p 0.25, random_blur p 0.25 (the descriptor's: 0.15, 0.2).
    assert matcher["shuffle_pixels"] == pytest.approx(0.25, abs=0.03)
    assert matcher["blur"] == pytest.approx(0.25, abs=0.03)
    assert descriptor["shuffle_pixels"] == pytest.approx(0.15, abs=0.03)
    assert descriptor["blur"] == pytest.approx(0.20, abs=0.03)


# ---------------------------------------------------------------------------------------------- configurations
@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.name)
def test_paper_configs_select_the_authors_training(path):
    config = load_config(path, {"knn_graph": "knn.safetensors"})
    descriptor = config.model_type == "descriptor"
    assert config.resolved("hard_negative_k") == (7 if descriptor else 127)
    assert config.negative_query_resize_prob == (0.0 if descriptor else 0.5)
    assert config.negative_roles == ("package" if descriptor else "authors")  # the descriptor has no negative pairs
    assert (config.warmup_start_factor, config.cosine_span) == (0.01, "run")
    assert config.mixed_precision == "no"  # their fp16: false
    assert config.reference_recipe == "off"


def test_defaults_keep_the_paper_form():
    config = load_config(CONFIGS / "tiny_cpu.yaml")
    assert (config.warmup_start_factor, config.cosine_span, config.negative_query_resize_prob) == (
        0.0, "after_warmup", 0.0)
    assert config.negative_roles == "package"


def test_finetuning_mix_follows_the_authors_roles():
    config = load_config(CONFIGS / "finetune_matcher_disc21_dev.yaml", {
        "knn_graph": "knn.safetensors", "dataset": "dev", "ground_truth": "gt.csv", "mix_dataset": "train"})
    assert config.negative_roles == "authors" and config.mix_sampling_rate > 0


def test_old_recipe_name_light_loads_as_off(tmp_path):
    saved = yaml.safe_load((CONFIGS / "tiny_cpu.yaml").read_text())
    saved.update(reference_recipe="light", query_recipe="light")
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(saved))
    config = load_config(path)
    assert (config.query_recipe, config.reference_recipe) == ("off", "off")
    with pytest.raises(ConfigError, match="reference_recipe"):
        CopyPairMaker(32, reference_recipe="light")  # the code knows only the new name


def test_bare_off_in_yaml_is_named(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text((CONFIGS / "tiny_cpu.yaml").read_text().replace('reference_recipe: "off"', "reference_recipe: off"))
    with pytest.raises(ConfigError, match='reference_recipe=False.*quotes'):
        load_config(path)


@pytest.mark.parametrize("key, value", [("cosine_span", "forever"), ("warmup_start_factor", 1.5),
                                        ("negative_query_resize_prob", -0.1), ("negative_roles", "theirs")])
def test_bad_schedule_and_negative_values_are_named(key, value):
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIGS / "tiny_cpu.yaml", {key: value})


# ---------------------------------------------------------------------------------------------- losses
def test_paper_descriptor_configs_gather_as_constants_with_an_unbounded_scale():
    from copynce_hf import CopyNCEDescriptorConfig

    for path in (CONFIGS / "descriptor_vits16_224.yaml", CONFIGS / "descriptor_vitb16_224.yaml"):
        model = load_config(path, {"knn_graph": "knn.safetensors"}).model
        config = CopyNCEDescriptorConfig(**model)
        assert (config.gather_gradients, config.infonce_max_scale, config.logit_scale_init) == (False, None, 3.2)
    default = CopyNCEDescriptorConfig()
    assert (default.gather_gradients, default.infonce_max_scale) == (True, 100.0)
    for key, value in (("gather_gradients", "no"), ("infonce_max_scale", 0), ("infonce_max_scale", True)):
        with pytest.raises(ConfigError, match=key):
            CopyNCEDescriptorConfig(**{key: value})


def test_descriptor_loss_uses_the_configured_scale_bound():
    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel
    from copynce_hf.modeling.losses_copynce import info_nce_loss

    tiny = {**TINY_VIT, "descriptor_dim": 8, "copynce_weight": 0.0, "koleo_weight": 0.0}
    generator = torch.Generator().manual_seed(0)
    query, reference = torch.randn(3, 3, 32, 32, generator=generator), torch.randn(3, 3, 32, 32, generator=generator)
    for bound in (None, 100.0):
        torch.manual_seed(0)
        model = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**tiny, infonce_max_scale=bound)).train()
        with torch.no_grad():
            model.logit_scale.fill_(6.0)  # exp(6) = 403, above CLIP's bound
        output = model(pixel_values=query, reference_pixel_values=reference)
        expected = info_nce_loss(output.descriptors, output.reference_descriptors, 6.0, max_scale=bound)
        assert output.infonce_loss.item() == pytest.approx(expected.item(), rel=1e-5)


# ---------------------------------------------------------------------------------------------- other-image pool
def _pool_specs(edits: list[dict]) -> list[tuple[str, str, str]]:
    """``(edit name, field, image id)`` of every pool image a list of edits names."""
    return [(edit["name"], key, value["id"]) for edit in edits for key, value in edit["params"].items()
            if isinstance(value, dict) and value.get("kind") == "pool"]


def test_crop_group_pastes_take_training_images_recorded_by_id_and_replay(images):
    from copynce_hf.pixtrace import bind_pool_images, replay

    maker = CopyPairMaker(32, "paper_matcher", "off")
    pooled = CopyPairDataset(images, maker, seed=0, positive_rate=1.0)
    procedural = CopyPairDataset(images, maker, seed=0, positive_rate=1.0, other_images="procedural")
    rows = {image_id: row for row, image_id in enumerate(images["image_id"])}
    found = 0
    for slot in range(36):
        key = PairKey(0, slot, slot % len(images))
        pair, plain = pooled[key], procedural[key]
        specs = _pool_specs(pair.edits["query"])
        assert not _pool_specs(plain.edits["query"])
        pastes = [edit for edit in plain.edits["query"] if edit["name"] in ("paste_into_box", "overlay_image_box")]
        assert [name for name, _, _ in specs] == [edit["name"] for edit in pastes]  # every crop-group paste
        for (_, field, image_id), edit in zip(specs, pastes):
            assert image_id in rows  # a training image (the copy's own included, as the authors')
            assert edit["params"][field]["kind"] in ("noise", "gradient")  # the same draw, procedural
        if not specs:
            assert pair.edits == plain.edits
            continue
        found += 1
        # Replay from the recorded edits and the images its ids name.
        decode = pooled.decoder
        original = maker.source(decode(images[rows[pair.query_id]]["image"], pair.query_id))
        others = {image_id: decode(images[rows[image_id]]["image"], image_id) for _, _, image_id in specs}
        again = replay(original, bind_pool_images(pair.edits["query"], others), fuse=maker.fused(maker.query_recipe))
        assert np.array_equal(np.asarray(again.image), np.asarray(pair.query))
        assert np.array_equal(again.table.coords, pair.query_table.coords, equal_nan=True)
        assert not np.array_equal(np.asarray(pair.query), np.asarray(plain.query))
    assert 4 <= found <= 24  # about a third of the matcher's queries (crop group p 0.5, two of three members)


def test_pool_images_must_be_bound_before_rendering():
    from copynce_hf.modeling.errors import EditParameterError
    from copynce_hf.pixtrace import bind_pool_images, replay

    edits = [{"name": "overlay_image_box", "params": {"overlay": {"kind": "pool", "id": "T7"}, "x": 0.1, "y": 0.1,
                                                      "width": 0.5, "height": 0.5, "opacity": 0.4}}]
    from PIL import Image

    image = Image.new("RGB", (40, 30), (10, 200, 30))
    with pytest.raises(EditParameterError, match="bind_pool_images"):
        replay(image, edits)
    with pytest.raises(EditParameterError, match="'T7'"):
        bind_pool_images(edits, {"T8": image})
    other = Image.new("RGB", (8, 8), (250, 0, 0))
    edited = replay(image, bind_pool_images(edits, {"T7": other})).image
    assert edited.getpixel((10, 10)) != (10, 200, 30) and edited.getpixel((39, 29)) == (10, 200, 30)


def test_streamed_pastes_take_recent_images_of_the_stream(tmp_path):
    from test_data import _image_table, _small_images

    from copynce_hf.data import StreamingCopyPairDataset, load_image_dataset

    files = _small_images(tmp_path / "imgs", 16, side=40)
    (tmp_path / "parquet").mkdir()
    _image_table(files, [path.stem for path in files]).to_parquet(str(tmp_path / "parquet" / "train-0.parquet"))
    stream = load_image_dataset(tmp_path / "parquet", streaming=True)
    dataset = StreamingCopyPairDataset(stream, CopyPairMaker(32, "paper_matcher", "off"), batch_size=2, seed=1,
                                       shuffle_buffer_size=1, negative_pool=3)
    seen: list[str] = []
    found = 0
    for pair in dataset:
        for _, _, image_id in _pool_specs(pair.edits["query"]):
            assert image_id in seen[-3:] and image_id != pair.query_id  # the bounded pool of recent images
            found += 1
        seen.append(pair.query_id)
    assert len(seen) == 16 and found >= 2


def test_other_images_key_is_checked():
    assert load_config(CONFIGS / "tiny_cpu.yaml").other_images == "training_images"
    with pytest.raises(ConfigError, match="other_images"):
        load_config(CONFIGS / "tiny_cpu.yaml", {"other_images": "files"})
    with pytest.raises(ConfigError, match="other_images"):
        CopyPairDataset(["a", "b"], CopyPairMaker(32), other_images="files")
