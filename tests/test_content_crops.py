"""Content crops in ``copynce dedup``: the box of an image's own content, the crop cut from its pixels, the pairs a
crop decides, and the stage in the library call (its scores are the matcher's on the crop images themselves)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PIL import Image

from copynce_hf.modeling.errors import ShapeError
from copynce_hf.retrieval import Descriptor, DescriptorSet, DetectConfig, ImageFolderSource, dedup
from copynce_hf.retrieval.content.crops import (
    VIEW_CROP,
    VIEW_WHOLE,
    CropPair,
    CropSource,
    content_box,
    content_boxes,
    crop_pairs,
    crop_views,
)


def _mask(side: int, cells) -> torch.Tensor:
    grid = torch.zeros(side, side, dtype=torch.bool)
    for r, c in cells:
        grid[r, c] = True
    return grid.reshape(-1)


def test_the_box_is_the_largest_region_of_kept_tokens_grown_by_one_patch():
    block = [(r, c) for r in range(4, 8) for c in range(5, 10)]  # rows 4-7, columns 5-9 of a 14 x 14 grid
    stray = [(0, 0), (13, 13)]  # kept tokens of the frame (a user name, a caption word): not the content
    assert content_box(_mask(14, block + stray)) == (4 / 14, 3 / 14, 11 / 14, 9 / 14)
    # diagonal neighbours are not connected: the larger of two regions wins
    assert content_box(_mask(14, [(2, 2), (3, 3), (3, 4)])) == (2 / 14, 2 / 14, 6 / 14, 5 / 14)
    assert content_box(_mask(14, [(6, 6)])) == (5 / 14, 5 / 14, 8 / 14, 8 / 14)  # one token: 3 x 3 patches
    assert content_box(_mask(14, [])) is None
    assert content_box(torch.ones(196, dtype=torch.bool)) is None  # the whole image is its own content
    big = [(r, c) for r in range(1, 12) for c in range(1, 12)]  # 13 x 13 with the margin: 86 % of the image
    assert content_box(_mask(14, big)) is None and content_box(_mask(14, big), max_area=0.9) is not None
    assert content_box(_mask(14, [(0, 0)]), margin=0) is None  # narrower than 2 patches
    with pytest.raises(ShapeError, match="square token grid"):
        content_box(torch.ones(10, dtype=torch.bool))
    keeps = {"a": _mask(14, block), "b": None, "c": torch.ones(196, dtype=torch.bool)}
    assert content_boxes(["a", "b", "c"], keeps.get) == {"a": (4 / 14, 3 / 14, 11 / 14, 9 / 14)}


def test_a_crop_is_cut_from_the_full_resolution_pixels(tmp_path):
    pixels = np.zeros((140, 280, 3), dtype=np.uint8)
    pixels[70:, 70:210] = (200, 30, 90)  # the box (0.25, 0.5, 0.75, 1.0) of a 280 x 140 image
    Image.fromarray(pixels).save(tmp_path / "framed.png")
    source = CropSource({"framed": tmp_path / "framed.png"}, {"framed": (0.25, 0.5, 0.75, 1.0)})
    crop = source.load(0)
    assert source.ids == ["framed"] and len(source) == 1 and crop.size == (140, 70)
    assert np.array_equal(np.asarray(crop), np.broadcast_to(np.array([200, 30, 90], np.uint8), (70, 140, 3)))
    in_memory = CropSource({"framed": Image.fromarray(pixels)}, {"framed": (0.25, 0.5, 0.75, 1.0)})
    assert np.array_equal(np.asarray(in_memory.load(0)), np.asarray(crop))


def _unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_pair_goes_to_its_crops_only_when_a_crop_matches_better_than_the_whole_images():
    order = {"A": 0, "B": 1, "C": 2, "D": 3}
    whole = DescriptorSet(list(order), _unit([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0.6, 0.8, 0, 0]]))
    # A's crop is B's photo (A frames B); C's crop is nearest C itself (never a pair), then A's whole image
    crops = DescriptorSet(["A", "C"], _unit([[0, 1, 0.05, 0], [0.1, 0, 0.995, 0]]))
    pairs = crop_pairs(whole, crops, candidates=1, order=order)
    by_pair = {(p.a, p.b): p for p in pairs}
    assert by_pair[("A", "B")] == CropPair("A", "B", VIEW_CROP, VIEW_WHOLE, pytest.approx(0.99875, abs=1e-4))
    # (A, C): A's whole image and C's crop, cosine 0.0995 against 0 for the two whole images
    assert (by_pair[("A", "C")].view_a, by_pair[("A", "C")].view_b) == (VIEW_WHOLE, VIEW_CROP)
    assert [(p.a, p.b) for p in pairs] == sorted(by_pair, key=lambda k: (order[k[0]], order[k[1]]))
    # D's crop nearly is B (cosine 0.99995, above the whole images' 0.8): the crop decides (B, D)
    crops = DescriptorSet(["D"], _unit([[0, 1, 0, 0.01]]))
    assert ("B", "D") in {(p.a, p.b) for p in crop_pairs(whole, crops, candidates=3, order=order)}
    # a crop no better than its whole image decides nothing: the whole-image stage keeps its pairs
    same = DescriptorSet(["D"], whole.descriptors[3:4])
    assert crop_pairs(whole, same, candidates=3, order=order) == []
    assert crop_pairs(whole, DescriptorSet([], np.zeros((0, 4), np.float32)), candidates=3, order=order) == []
    # a pair grouping scores outside the candidates takes the same rule: its best views, if a crop is among them
    crops = DescriptorSet(["A", "C"], _unit([[0, 1, 0.05, 0], [0.1, 0, 0.995, 0]]))
    views = crop_views([("A", "B"), ("B", "C"), ("B", "D")], whole, crops)
    assert views[0] == CropPair("A", "B", VIEW_CROP, VIEW_WHOLE, pytest.approx(0.99875, abs=1e-4))
    assert views[1] is None and views[2] is None  # (B, C): 0 for the crop as for the wholes; D has no crop


def _embedded_models():
    """The embedded descriptor and matcher, and their image processor."""
    from copynce_hf.runtime.loading import load_model

    descriptor, processor = load_model(None, "descriptor", "--model")
    return descriptor, load_model(None, "matcher", "--matcher")[0], processor


def _framed_collection(folder) -> None:
    """Four bundled photos pasted small (a quarter of the side) into one shared background photo (a template), the
    four photos alone, and two other photos."""
    from copynce_hf.data import ASSET_IMAGES

    folder.mkdir()
    files = sorted(ASSET_IMAGES.glob("*.jpg"))
    background = Image.open(files[0]).convert("RGB").resize((256, 256))
    for i, path in enumerate(files[1:5]):
        photo = Image.open(path).convert("RGB")
        photo.save(folder / f"photo{i}.png")
        framed = background.copy()
        framed.paste(photo.resize((64, 64)), (96, 96))
        framed.save(folder / f"framed{i}.png")
    for i, path in enumerate(files[5:7]):
        Image.open(path).convert("RGB").save(folder / f"other{i}.png")


def test_dedup_verifies_crop_pairs_on_the_crops_themselves(tmp_path):
    from copynce_hf.retrieval.deduplication.settings import DedupSettings
    from copynce_hf.retrieval.verify.scorer import MatcherScorer

    _framed_collection(tmp_path / "images")
    descriptor, matcher, processor = _embedded_models()
    source = ImageFolderSource(tmp_path / "images")
    lines: list[str] = []
    config = DetectConfig(candidates=9, fusion_precision="float32")  # the oracle below scores in float32

    def run(crops: bool):
        return dedup(source, Descriptor("tiny", descriptor, processor), (matcher, processor), threshold=1.0,
                     config=config, settings=DedupSettings(content_crops=crops, matcher_orders="one", layout_crops=False),
                     progress=False, log=lines.append)  # content crops alone (layout crops: test_dedup_layouts.py)

    whole, cropped = run(False), run(True)
    assert "content crops" not in whole.seconds and not whole.crop_boxes and not whole.crop_pairs
    assert cropped.crop_boxes and cropped.crop_pairs, "\n".join(lines)
    assert any(line.startswith("content crops: ") for line in lines)
    assert set(whole.raw_scores) <= set(cropped.raw_scores)
    # every other pair keeps its whole-image score; each crop pair's is the matcher's on its two views, every token
    # kept: the oracle cuts the views itself and scores them as whole images
    decided = {(pair.a, pair.b) for pair in cropped.crop_pairs}
    assert all(cropped.raw_scores[pair] == score for pair, score in whole.raw_scores.items() if pair not in decided)
    files = dict(zip(source.ids, source.files))
    scorer = MatcherScorer(matcher, processor, fusion_precision="float32")
    for pair in cropped.crop_pairs:
        views = []
        for image_id, view in ((pair.a, pair.view_a), (pair.b, pair.view_b)):
            image = Image.open(files[image_id]).convert("RGB")
            if view == VIEW_CROP:
                left, top, right, bottom = cropped.crop_boxes[image_id]
                image = image.crop((int(left * 256), int(top * 256), round(right * 256), round(bottom * 256)))
            views.append(image)
        names = (f"{pair.a}:{pair.view_a}", f"{pair.b}:{pair.view_b}")  # the scorer caches tokens by image id
        expected = scorer.score([names], {names[0]: views[0]}, {names[1]: views[1]}, progress=False)[0]
        assert cropped.raw_scores[(pair.a, pair.b)] == pytest.approx(expected, abs=1e-5)
    from copynce_hf.retrieval.content.crops import write_crops
    from copynce_hf.retrieval.deduplication.collection import write_pairs
    from copynce_hf.runs.dedup import content_crops_text

    # pairs.csv names the views of each pair, content_crops.csv the boxes (and goes when a run has none)
    assert write_pairs(tmp_path / "pairs.csv", cropped) == len(cropped.pairs)
    with open(tmp_path / "pairs.csv", encoding="utf-8") as handle:
        views = {(row["query_id"], row["reference_id"]): row["views"] for row in csv.DictReader(handle)}
    assert {key for key, value in views.items() if value != "whole/whole"} == decided
    assert views[(cropped.crop_pairs[0].a, cropped.crop_pairs[0].b)] == (f"{cropped.crop_pairs[0].view_a}/"
                                                                           f"{cropped.crop_pairs[0].view_b}")
    assert write_crops(tmp_path / "content_crops.csv", cropped) == 4
    with open(tmp_path / "content_crops.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["image_id"] for row in rows] == list(cropped.crop_boxes)
    assert float(rows[0]["left"]) == pytest.approx(cropped.crop_boxes[rows[0]["image_id"]][0], abs=1e-6)
    assert write_crops(tmp_path / "content_crops.csv", whole) == 0 and not (tmp_path / "content_crops.csv").exists()

    assert content_crops_text(whole, False) == "off"  # report.html's line
    assert content_crops_text(cropped, True) == (f"4 images cropped to their own content, {len(cropped.crop_pairs)} "
                                                 "pairs verified on their crops")
    # report.html outlines the crop a pair was scored on, on that image's thumbnail only
    from copynce_hf.reports.gallery import CROP_OUTLINE, write_group_gallery
    from copynce_hf.runs.folders import crop_boxes_of_pairs

    boxes = crop_boxes_of_pairs(cropped)
    assert set(boxes) == decided
    for crop_pair in cropped.crop_pairs:  # the boxes of the views that were crops, and only theirs
        sides = {crop_pair.a: crop_pair.view_a, crop_pair.b: crop_pair.view_b}
        assert boxes[(crop_pair.a, crop_pair.b)] == {image_id: cropped.crop_boxes[image_id]
                                                     for image_id, view in sides.items() if view == VIEW_CROP}
    pair = cropped.crop_pairs[0]
    write_group_gallery(tmp_path / "report.html", [[(pair.a, None), (pair.b, 0.5)]], files, crops=boxes)
    thumbnails = sorted((tmp_path / "gallery").glob("*/*.png"))
    outlined = {path.stem: bool((np.asarray(Image.open(path).convert("RGB")) == CROP_OUTLINE).all(axis=2).any())
                for path in thumbnails if path.stem in ("query", "reference")}
    assert outlined == {"query": pair.view_a == VIEW_CROP, "reference": pair.view_b == VIEW_CROP}
    # only the framed images are cropped, each to a box around its photo (pixels 96-160 of 256: 0.375-0.625)
    assert sorted(cropped.crop_boxes) == [f"framed{i}" for i in range(4)]
    for left, top, right, bottom in cropped.crop_boxes.values():
        assert left <= 0.375 and top <= 0.375 and right >= 0.625 and bottom >= 0.625
        assert (right - left) * (bottom - top) < 0.6


def test_a_rerun_reuses_the_crop_scores_kept_in_the_rescoring_folder_until_a_cropped_image_changes(tmp_path):
    import os

    from copynce_hf.retrieval.deduplication.settings import DedupSettings

    _framed_collection(tmp_path / "images")
    descriptor, matcher, processor = _embedded_models()
    source = ImageFolderSource(tmp_path / "images")
    lines: list[str] = []

    def run():
        return dedup(source, Descriptor("tiny", descriptor, processor), (matcher, processor), threshold=1.0,
                     config=DetectConfig(candidates=9),
                     settings=DedupSettings(matcher_orders="both", layout_crops=False),
                     progress=False, log=lines.append, rescoring_folder=tmp_path / "rescoring")

    first = run()
    kept = sorted(path.name for path in (tmp_path / "rescoring").glob("crops-*"))
    views = {f"crops-{pair.view_a}-{pair.view_b}" for pair in first.crop_pairs}
    assert kept == sorted(views | {f"{name}-reversed" for name in views}), kept  # each kind of views, both orders
    lines.clear()
    second = run()
    assert second.raw_scores == first.raw_scores and second.crop_pairs == first.crop_pairs
    assert second.matcher_cost["fused_pairs"] == 0, "\n".join(lines)  # every score read from the chunks
    assert sum("resuming" in line and "crops-" in line for line in lines) == len(kept)
    # a cropped image rewritten (the same pixels, a new file time): its crop's scores are computed again
    changed = tmp_path / "images" / "framed0.png"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    lines.clear()
    third = run()
    assert third.raw_scores == pytest.approx(first.raw_scores, abs=1e-6)
    assert sum("resuming" in line and "crops-" in line for line in lines) < len(kept)


@pytest.mark.slow
def test_two_processes_crop_and_score_as_one_does(tmp_path):
    import json
    import os
    from pathlib import Path

    from conftest import launch_two_cpu_processes

    from copynce_hf.retrieval.deduplication.settings import DedupSettings

    _framed_collection(tmp_path / "images")
    descriptor, matcher, processor = _embedded_models()
    alone = dedup(ImageFolderSource(tmp_path / "images"), Descriptor("embedded", descriptor, processor),
                  (matcher, processor), threshold=1.0, config=DetectConfig(candidates=9),
                  settings=DedupSettings(matcher_orders="one"), progress=False)
    repo = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "tests"), os.environ.get("PYTHONPATH", "")])}
    result = launch_two_cpu_processes([str(repo / "tests" / "_content_crops_worker.py"), str(tmp_path / "images"),
                                       str(tmp_path)], environment)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):  # each process gets the whole result: the same crops, crop pairs and scores as one process
        found = json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8"))
        assert found["processes"] == 2 and found["boxes"] == {k: list(v) for k, v in alone.crop_boxes.items()}
        assert found["crop_pairs"] == [[p.a, p.b, p.view_a, p.view_b] for p in alone.crop_pairs]
        raw = {(a, b): score for a, b, score in found["raw"]}
        assert raw.keys() == alone.raw_scores.keys()
        assert [raw[pair] for pair in alone.raw_scores] == pytest.approx(list(alone.raw_scores.values()), abs=1e-5)
