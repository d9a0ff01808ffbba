"""Training pairs that teach content over frame (beyond the paper): copy-to-copy positives whose CopyNCE prior
comes from both tables, and batches whose shared-template groups put different images into one template."""

import json

import numpy as np
import pytest
from conftest import iterator_states
from PIL import Image

from copynce_hf.data import (
    CopyPairBatchSampler,
    CopyPairDataset,
    CopyPairMaker,
    PixTraceCollator,
    StreamingCopyPairDataset,
    TemplateGroups,
    TemplatePairs,
    load_image_dataset,
)
from copynce_hf.data.loading import ImageDecoder
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.pixtrace import bind_pool_images, replay
from copynce_hf.pixtrace.templates import TEMPLATE_KINDS, Template, TemplateRecipe
from copynce_hf.training.config import CONFIG_DIR, load_config
from copynce_hf.training.options import parse_args

SIZE, PATCH = 40, 8
ALL_KINDS = TemplateRecipe({kind: 1.0 for kind in TEMPLATE_KINDS})


def _photo(seed: int, size=(60, 80)) -> Image.Image:
    coarse = np.random.default_rng(seed).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((size[1], size[0]), Image.BILINEAR)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for index in range(10):
        _photo(index, (54 + 2 * index, 72)).save(folder / f"photo{index:02d}.png")
    return load_image_dataset(str(folder))


# ---------------------------------------------------------------------------------------------- copy-to-copy
def _oracle_overlap(query_table, reference_table, patch: int) -> np.ndarray:
    """(L_q, L_r): per query patch and reference patch, the share of the query patch's pixels whose source
    point falls in the source footprint of a traced pixel of the reference patch, by brute force over every
    (query pixel, reference pixel). A reference pixel's footprint is its pixel square mapped into the source
    by the reference's map, an affine map here (fitted to the table's traced centres, and checked to be one)."""
    reference = reference_table.coords.astype(np.float64)
    rows, cols = np.nonzero(~np.isnan(reference[..., 0]))
    grid = np.stack([rows, cols, np.ones_like(rows)], axis=1).astype(np.float64)
    centres = reference[rows, cols]
    fit, *_ = np.linalg.lstsq(grid, centres, rcond=None)  # (3, 2): (row, col, 1) -> (y, x)
    assert np.abs(grid @ fit - centres).max() < 1e-2  # the reference's map is affine
    to_pixels = np.linalg.inv(fit[:2].T)  # source offsets -> reference pixel offsets
    query = query_table.coords.astype(np.float64)
    q_rows, q_cols = np.nonzero(~np.isnan(query[..., 0]))
    offsets = (query[q_rows, q_cols][:, None, :] - centres[None, :, :]) @ to_pixels.T  # (N_q, N_r, 2)
    query_pixel, reference_pixel = np.nonzero((np.abs(offsets) < 0.5).all(axis=-1))
    height, width = query_table.size
    q_patch = q_rows[query_pixel] // patch * (width // patch) + q_cols[query_pixel] // patch
    r_patch = rows[reference_pixel] // patch * (reference_table.size[1] // patch) + cols[reference_pixel] // patch
    grid_q, grid_r = (height // patch) * (width // patch), (reference_table.size[0] // patch) * (reference_table.size[1] // patch)
    counts = np.zeros((grid_q, grid_r))
    np.add.at(counts, (q_patch, r_patch), 1.0)
    return counts / patch**2


def _edited_reference_seed(maker: CopyPairMaker, source: Image.Image) -> int:
    """A reference seed whose light copy moves pixels (a crop or a flip), found deterministically."""
    for seed in range(200):
        names = {edit.name for edit in maker.editor("light_copy").draw((source.height, source.width), seed=seed)}
        if {"crop", "hflip"} <= names:
            return seed
    raise AssertionError("no light copy with a crop and a flip in 200 seeds")


@pytest.mark.parametrize("query_recipe, kind", [("training", None), ("training", "frame"), ("training", "background"),
                                                ("light_copy", None), ("light_copy", "meme")])
def test_copy_to_copy_priors_equal_an_oracle_from_the_two_tables(query_recipe, kind):
    maker = CopyPairMaker(SIZE, query_recipe, "off", copy_to_copy_share=1.0)
    original = _photo(11, (90, 120))
    template = None
    if kind is not None:
        template = TemplateRecipe({kind: 1.0}).draw(np.random.default_rng(2), backgrounds=lambda rng: ("b", _photo(3)))
    reference_seed = _edited_reference_seed(maker, maker.source(original))
    pair = maker(original, original, 1, 5, reference_seed, query_template=template, reference_template=template)
    assert pair.edits["recipes"] == {"query": query_recipe, "reference": "light_copy"}
    assert not np.array_equal(pair.reference_table.coords, maker.copy(original, "off", 0)[1].coords, equal_nan=True)
    batch = PixTraceCollator(SIZE, PATCH)([pair])
    assert bool(batch["pair_mask"][0])
    oracle = _oracle_overlap(pair.query_table, pair.reference_table, PATCH)
    prior = batch["overlap_qr"][0].numpy()
    assert prior.sum() > 1.0  # several patches' worth of overlap
    assert np.abs(oracle - prior).max() <= 1.0 / PATCH**2 + 1e-6  # at most a tie pixel per entry
    assert np.abs(oracle - prior).sum() * PATCH**2 <= 3
    # the reference -> query direction: the same oracle with the roles swapped, where the query's map is affine
    if query_recipe == "light_copy":
        swapped = _oracle_overlap(pair.reference_table, pair.query_table, PATCH)
        assert np.abs(swapped - batch["overlap_rq"][0].numpy()).max() <= 1.0 / PATCH**2 + 1e-6


def test_copy_to_copy_share_is_drawn_per_pair():
    maker = CopyPairMaker(SIZE, "training", "off", copy_to_copy_share=0.3)
    drawn = [maker.reference_recipe_for(seed) for seed in range(2000)]
    assert set(drawn) == {"off", "light_copy"}
    assert 0.25 < drawn.count("light_copy") / len(drawn) < 0.35
    assert drawn == [maker.reference_recipe_for(seed) for seed in range(2000)]  # replayable from the seed
    assert {CopyPairMaker(SIZE).reference_recipe_for(seed) for seed in range(200)} == {"off"}  # default: the paper


# ---------------------------------------------------------------------------------------------- template groups
def _batches(images, positive_rate: float, share: float, batches: int = 4, batch_size: int = 8, **pairs):
    maker = CopyPairMaker(SIZE, "training", "off", copy_to_copy_share=0.3)
    dataset = CopyPairDataset(images, maker, seed=1, positive_rate=positive_rate, other_images="procedural",
                              templates=TemplatePairs(ALL_KINDS, **pairs))
    sampler = CopyPairBatchSampler(len(images), batch_size, seed=2, template_groups=TemplateGroups(share, 3),
                                   num_batches=batches)
    return dataset, [(keys, [dataset[key] for key in keys]) for keys in sampler]


def _template_only_traced(template: dict, background) -> np.ndarray:
    """bool (S, S): where the template leaves room for the image (its edits and the final resize on a blank
    S x S image): the only pixels a templated copy may trace."""
    records = Template.from_dict(template, background).edit_dicts((SIZE, SIZE))
    records = bind_pool_images(records, {template["params"]["image"]["id"]: background} if background else {})
    final = {"name": "resize", "params": {"height": SIZE, "width": SIZE, "resample": "bicubic"}}
    table = replay(Image.new("RGB", (SIZE, SIZE)), records + [final], fuse=False).table
    return ~np.isnan(table.coords[..., 0])


def test_a_descriptor_batch_has_template_groups_of_different_images(images):
    dataset, batches = _batches(images, positive_rate=1.0, share=0.75, reference_prob=0.5)
    decoder, templated_references, kinds, backgrounds = ImageDecoder(), [], set(), 0
    ids = list(images["image_id"])
    for keys, pairs in batches:
        assert [key.template_group for key in keys] == [0, 0, 0, 3, 3, 3, -1, -1]  # round(0.75 * 8) = 6 slots
        collated = PixTraceCollator(SIZE, PATCH)(pairs)
        for group in (0, 3):
            members = [(key, pair) for key, pair in zip(keys, pairs) if key.template_group == group]
            assert len({pair.query_id for _, pair in members}) == 3  # different images
            assert all(key.group_images == tuple(key.index for key, _ in members) for key, _ in members)
            templates = [pair.edits["templates"]["query"] for _, pair in members]
            assert all(template == templates[0] for template in templates)  # one template per group
            kinds.add(templates[0]["kind"])
            background = None
            if templates[0]["kind"] == "background":
                photo_id = templates[0]["params"]["image"]["id"]
                assert photo_id not in {pair.query_id for _, pair in members}  # not one of the group's photos
                background = decoder(images[ids.index(photo_id)]["image"], photo_id)
                backgrounds += 1
            room = _template_only_traced(templates[0], background)
            assert (~room).any()
            for key, pair in members:
                assert pair.label == 1 and pair.reference_id == pair.query_id
                traced = ~np.isnan(pair.query_table.coords[..., 0])
                assert not (traced & ~room).any()  # template pixels untraced
                if pair.edits["templates"]["reference"] is not None:
                    assert pair.edits["templates"]["reference"] == templates[0]
                    assert not (~np.isnan(pair.reference_table.coords[..., 0]) & ~room).any()
                templated_references.append(pair.edits["templates"]["reference"] is not None)
                row = keys.index(key)
                prior = collated["overlap_qr"][row].numpy().reshape(SIZE // PATCH, SIZE // PATCH, -1)
                untraced_patches = ~traced.reshape(SIZE // PATCH, PATCH, SIZE // PATCH, PATCH).any(axis=(1, 3))
                assert not prior[untraced_patches].any()  # a patch of template pixels overlaps nothing
        plain = [pair for key, pair in zip(keys, pairs) if key.template_group < 0]
        assert all("templates" not in pair.edits for pair in plain)
    assert 0.25 < np.mean(templated_references) < 0.75  # reference_prob 0.5 over 24 slots
    # every kind drawn among the 8 groups (seeded), so the background photo's check above ran (twice)
    assert kinds == set(TEMPLATE_KINDS) and backgrounds == 2


def test_matcher_negatives_of_a_group_are_members_in_the_same_template(images):
    dataset, batches = _batches(images, positive_rate=0.3, share=1.0, batch_size=6, batches=5, reference_prob=1.0)
    negatives = 0
    for keys, pairs in batches:
        collated = PixTraceCollator(SIZE, PATCH)(pairs)
        by_group = {}
        for key, pair in zip(keys, pairs):
            by_group.setdefault(key.template_group, []).append((key, pair))
        assert sorted(by_group) == [0, 3]
        for members in by_group.values():
            member_ids = {pair.query_id for _, pair in members}
            for key, pair in members:
                templates = pair.edits["templates"]
                assert templates["query"] == templates["reference"] == members[0][1].edits["templates"]["query"]
                if pair.label:
                    assert pair.reference_id == pair.query_id
                else:
                    negatives += 1
                    assert pair.reference_id in member_ids and pair.reference_id != pair.query_id
                    index = keys.index(key)
                    assert not collated["overlap_qr"][index].any() and not bool(collated["pair_mask"][index])
    assert negatives >= 10  # 30 slots at positive rate 0.3


def test_group_members_are_different_images():
    groups = TemplateGroups(1.0, 3)
    assert groups.assign([4, 4, 5, 6, 7, 6, 8, 8]) == [
        (0, (4, 5)), (-1, ()), (0, (4, 5)), (3, (6, 7)), (3, (6, 7)), (-1, ()), (-1, ()), (-1, ())]
    assert TemplateGroups(0.5, 3).groups(32) == [range(0, 3), range(3, 6), range(6, 9), range(9, 12), range(12, 15)]
    assert TemplateGroups(0.0, 3).groups(32) == []
    assert TemplateGroups(0.25, 2).groups(8) == [range(0, 2)]


def test_a_templated_pair_replays_from_its_edits(images):
    dataset, batches = _batches(images, positive_rate=0.5, share=1.0, batch_size=6, batches=3, reference_prob=1.0)
    decoder = ImageDecoder()
    pool = {row["image_id"]: decoder(row["image"], row["image_id"]) for row in images}
    kinds = set()
    for _, pairs in batches:
        for pair in pairs:
            kinds.add(pair.edits["templates"]["query"]["kind"])
            for side, image_id in (("query", pair.query_id), ("reference", pair.reference_id)):
                source = dataset.maker.source(pool[image_id])
                again = replay(source, bind_pool_images(pair.edits[side], pool),
                               fuse=dataset.maker.fused(pair.edits["recipes"][side]))
                assert np.array_equal(np.asarray(again.image), np.asarray(getattr(pair, side)))
                assert np.array_equal(again.table.coords, getattr(pair, f"{side}_table").coords, equal_nan=True)
    assert len(kinds) >= 2


def test_pairs_are_the_papers_without_templates(images):
    """With no share the keys and pairs are the ones the paper's configuration makes."""
    maker = CopyPairMaker(SIZE, "training", "off")
    dataset = CopyPairDataset(images, maker, seed=1, other_images="procedural")
    plain = CopyPairBatchSampler(len(images), 4, seed=2, num_batches=1)
    zero = CopyPairBatchSampler(len(images), 4, seed=2, num_batches=1, template_groups=TemplateGroups(0.0, 3))
    keys = next(iter(zero))
    assert keys == next(iter(plain)) and all(key.template_group == -1 for key in keys)
    with_options = CopyPairDataset(images, maker, seed=1, other_images="procedural", templates=TemplatePairs())
    for key in keys:
        first, second = dataset[key], with_options[key]
        assert np.array_equal(np.asarray(first.query), np.asarray(second.query)) and first.edits == second.edits


# ---------------------------------------------------------------------------------------------- streaming
def _stream(tmp_path, count=11):
    folder = tmp_path / "stream"
    folder.mkdir()
    for index in range(count):
        _photo(20 + index, (50, 64)).save(folder / f"s{index:02d}.png")
    (folder / "s03_garbage.png").write_bytes(b"not an image" * 8)  # skipped inside a group
    return load_image_dataset(str(folder), streaming=True, num_shards=2)


def _streaming_dataset(stream, batch_size=6, positive_rate=0.3):
    maker = CopyPairMaker(SIZE, "training", "off", copy_to_copy_share=0.3)
    return StreamingCopyPairDataset(stream, maker, batch_size, seed=3, positive_rate=positive_rate,
                                    shuffle_buffer_size=3, negative_pool=4, other_images="procedural",
                                    template_groups=TemplateGroups(1.0, 3),
                                    templates=TemplatePairs(ALL_KINDS, reference_prob=0.5))


def _described(pair) -> tuple:
    templates = pair.edits.get("templates") or {}
    return (pair.query_id, pair.reference_id, pair.label, json.dumps(templates.get("query"), sort_keys=True),
            json.dumps(templates.get("reference"), sort_keys=True),
            hash(pair.query.tobytes()), hash(pair.reference.tobytes()))


def test_a_streamed_window_has_template_groups_of_consecutive_positions(tmp_path):
    pairs = list(_streaming_dataset(_stream(tmp_path)))
    assert len(pairs) == 11  # the unreadable file is skipped
    groups = [pairs[0:3], pairs[3:6], pairs[6:9], pairs[9:11]]  # windows of 6 positions: runs of 3; then 2 left
    negatives = 0
    for group in groups:
        ids = [pair.query_id for pair in group]
        assert len(set(ids)) == len(ids)
        template = group[0].edits["templates"]["query"]
        for pair in group:
            assert pair.edits["templates"]["query"] == template
            if pair.label:
                assert pair.reference_id == pair.query_id
            else:
                negatives += 1
                assert pair.reference_id in ids and pair.reference_id != pair.query_id
                assert pair.edits["templates"]["reference"] == template
    assert negatives >= 3
    assert len({json.dumps(group[0].edits["templates"]["query"], sort_keys=True) for group in groups}) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_a_streamed_run_resumes_inside_a_template_group(tmp_path, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    stream = _stream(tmp_path)

    def loader(state=None):
        dataset = _streaming_dataset(stream)
        result = StatefulDataLoader(dataset, batch_size=2, num_workers=workers, collate_fn=list, drop_last=True,
                                    snapshot_every_n_steps=1)
        if state is not None:
            result.load_state_dict(state)
        return result

    full = [[_described(pair) for pair in batch] for batch in loader()]
    interrupted, seen = loader(), []
    for batch in interrupted:
        seen.append([_described(pair) for pair in batch])
        if len(seen) == 2:  # 4 pairs: inside a worker's second group (workers 0) or its first (2 workers)
            state = interrupted.state_dict()
            break
    assert any("group" in worker for worker in iterator_states(state))
    resumed = [[_described(pair) for pair in batch] for batch in loader(state)]
    assert seen + resumed == full


# ---------------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("overrides, key", [
    ({"copy_to_copy_share": 1.5}, "copy_to_copy_share"),
    ({"copy_to_copy_share": -0.1}, "copy_to_copy_share"),
    ({"reference_copy_recipe": "light"}, "reference_copy_recipe"),
    ({"template_share": 2}, "template_share"),
    ({"template_group_size": 1}, "template_group_size"),
    ({"template_group_size": 2.5}, "template_group_size"),
    ({"template_reference_prob": -1}, "template_reference_prob"),
    ({"template_weights": {"bogus": 1.0}}, "template_weights"),
    ({"template_weights": {"frame": 0}}, "template_weights"),
    ({"template_weights": [1, 2]}, "template_weights"),
    ({"template_share": 0.5, "pair_source": "ground_truth", "ground_truth": "gt.csv"}, "template_share"),
])
def test_bad_values_are_refused_naming_the_field(overrides, key):
    with pytest.raises(ConfigError, match=f"invalid configuration value {key}="):
        load_config(CONFIG_DIR / "tiny_cpu.yaml", overrides)


def test_defaults_are_the_papers_and_the_options_reach_the_command_line():
    config = load_config(CONFIG_DIR / "tiny_cpu.yaml")
    assert (config.copy_to_copy_share, config.template_share) == (0.0, 0.0)
    assert (config.reference_copy_recipe, config.template_group_size, config.template_reference_prob,
            config.template_weights) == ("light_copy", 3, 0.5, None)
    config = parse_args(["--copy_to_copy_share", "0.3", "--template_share", "0.5", "--template_group_size", "4",
                         "--template_weights", "{frame: 1, meme: 0.5}"])
    assert (config.copy_to_copy_share, config.template_share, config.template_group_size) == (0.3, 0.5, 4)
    assert config.template_weights == {"frame": 1, "meme": 0.5}


@pytest.mark.parametrize("name", ["content_over_frame_descriptor.yaml", "content_over_frame_matcher.yaml"])
def test_presets_continue_the_embedded_models(name):
    config = load_config(CONFIG_DIR / name)
    assert config.model_name_or_path.endswith(f"pretrained/{config.model_type}")
    assert config.copy_to_copy_share > 0 and config.template_share > 0
