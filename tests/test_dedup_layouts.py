"""Layout crops in ``copynce dedup``: the pairs a layout crop proposes, and the stage in the library call (a lone
screenshot of a photo is scored on the photo cut from it, as the matcher scores those two images)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image, ImageDraw

from copynce_hf.retrieval import Descriptor, DescriptorSet, DetectConfig, ImageFolderSource, dedup
from copynce_hf.retrieval.content.crops import VIEW_LAYOUT, VIEW_WHOLE
from copynce_hf.retrieval.deduplication.layouts import layout_pairs


def _unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_layout_crop_proposes_its_nearest_other_image_where_it_matches_it_better_than_the_whole_image():
    whole = DescriptorSet(["a", "b", "c"], _unit([[1, 0, 0], [0.6, 0.8, 0], [0.8, 0, 0.6]]))
    crops = DescriptorSet(["layout0:a", "layout1:a", "layout0:c"], _unit([[0.1, 1, 0], [1, 0.3, 0], [0.8, -0.05, 0.6]]))
    image_of = {"layout0:a": "a", "layout1:a": "a", "layout0:c": "c"}.__getitem__
    for candidates in (1, 2):
        proposed = layout_pairs(whole, crops, image_of, candidates)
        # a's two crops both find b first (0.856 and 0.805, above a's whole image's 0.6): the pair once, on the
        # crop of the best cosine; c's crop is nearly c's whole image: its nearest others, a and b, are further than
        # c's own cosines with them (a crop must match better than the whole image); a's crops reach c (their
        # second) below a's whole image's 0.8
        assert list(proposed) == [("a", "b")]
        assert proposed[("a", "b")] == (pytest.approx(float(crops.descriptors[0] @ whole.descriptors[1]), abs=1e-6),
                                        "layout0:a")
    assert layout_pairs(whole, DescriptorSet([], np.zeros((0, 3), np.float32)), image_of, 1) == {}


def _lone_screenshot_collection(folder) -> None:
    """One bundled photo alone and pasted into a screenshot met once (flat colours, rows of text), and four other
    photos."""
    from copynce_hf.data import ASSET_IMAGES

    folder.mkdir()
    files = sorted(ASSET_IMAGES.glob("*.jpg"))
    photo = Image.open(files[1]).convert("RGB")
    photo.save(folder / "photo.png")
    screen = Image.new("RGB", (240, 320), (246, 246, 246))
    draw = ImageDraw.Draw(screen)
    draw.rectangle((0, 0, 239, 36), fill=(40, 90, 160))  # an app bar
    for row in range(5):  # rows of text under the photo
        draw.rectangle((16, 236 + 14 * row, 200 - 20 * (row % 3), 243 + 14 * row), fill=(30, 30, 30))
    screen.paste(photo.resize((200, 150)), (20, 60))
    screen.save(folder / "screenshot.png")
    for i, path in enumerate(files[2:6]):
        Image.open(path).convert("RGB").save(folder / f"other{i}.png")


def _embedded_models():
    from copynce_hf.runtime.loading import load_model

    descriptor, processor = load_model(None, "descriptor", "--model")
    return descriptor, load_model(None, "matcher", "--matcher")[0], processor


def test_dedup_scores_a_lone_screenshot_on_its_layout_crop(tmp_path):
    from copynce_hf.retrieval.deduplication.collection import write_layout_crops, write_pairs
    from copynce_hf.retrieval.deduplication.settings import DedupSettings
    from copynce_hf.retrieval.search.background import mean_logit_probability
    from copynce_hf.retrieval.verify.scorer import MatcherScorer
    from copynce_hf.runs.dedup import layout_crops_text
    from copynce_hf.runs.folders import crop_boxes_of_pairs

    _lone_screenshot_collection(tmp_path / "images")
    descriptor, matcher, processor = _embedded_models()
    source = ImageFolderSource(tmp_path / "images")
    lines: list[str] = []

    def run(layouts: bool, folder=None):
        return dedup(source, Descriptor("embedded", descriptor, processor), (matcher, processor), threshold=1.0,
                     config=DetectConfig(candidates=5, fusion_precision="float32"),
                     settings=DedupSettings(layout_crops=layouts, matcher_orders="both"), progress=False,
                     log=lines.append, rescoring_folder=folder and folder / "rescoring",
                     tokens_folder=folder and folder / "tokens")

    whole, laid_out = run(False), run(True, tmp_path / "work")
    # a rerun reads the crops' tokens and scores back: no encoder or fusion pass, the same scores
    kept = sorted(path.name for path in (tmp_path / "work" / "rescoring").glob("layouts*"))
    assert kept == ["layouts", "layouts-reversed"] and (tmp_path / "work" / "tokens" / "layouts").is_dir()
    again = run(True, tmp_path / "work")
    assert again.matcher_cost == {"encoded_views": 0, "fused_pairs": 0} and again.raw_scores == laid_out.raw_scores
    assert "layout crops" not in whole.seconds and not whole.layout_boxes
    pair = ("photo", "screenshot")  # the collection's order: file names sorted
    assert pair in laid_out.layout_boxes, "\n".join(lines)
    assert any(line.startswith("layout crops: ") for line in lines)
    # the crop is the photo's rectangle: x 20-220 of 240, y 60-210 of 320, within a few pixels
    left, top, right, bottom = laid_out.layout_boxes[pair]
    assert (left * 240, top * 320, right * 240, bottom * 320) == pytest.approx((20, 60, 220, 210), abs=6)
    # its score is the matcher's on the photo and the crop cut by the oracle itself, every token kept, both orders
    crop = Image.open(tmp_path / "images" / "screenshot.png").convert("RGB").crop(
        (int(left * 240), int(top * 320), round(right * 240), round(bottom * 320)))
    photo = Image.open(tmp_path / "images" / "photo.png").convert("RGB")
    scorer = MatcherScorer(matcher, processor, fusion_precision="float32")
    forward = scorer.score([("photo", "crop")], {"photo": photo}, {"crop": crop}, progress=False)[0]
    backward = scorer.score([("crop", "photo")], {"crop": crop}, {"photo": photo}, progress=False)[0]
    assert laid_out.raw_scores[pair] == pytest.approx(mean_logit_probability(forward, backward), abs=1e-5)
    # a layout crop's score counts only where it is higher; every other pair keeps its score
    assert laid_out.raw_scores[pair] > whole.raw_scores.get(pair, float("-inf"))
    assert all(laid_out.raw_scores[key] == score for key, score in whole.raw_scores.items()
               if key not in laid_out.layout_boxes)
    assert all(score > whole.raw_scores.get(key, float("-inf"))
               for key, score in laid_out.raw_scores.items() if key in laid_out.layout_boxes)

    # pairs.csv names the view, layout_crops.csv the box, report.html outlines it on the screenshot
    write_pairs(tmp_path / "pairs.csv", laid_out)
    with open(tmp_path / "pairs.csv", encoding="utf-8") as handle:
        views = {(row["query_id"], row["reference_id"]): row["views"] for row in csv.DictReader(handle)}
    assert views[pair] == f"{VIEW_WHOLE}/{VIEW_LAYOUT}"
    assert write_layout_crops(tmp_path / "layout_crops.csv", laid_out) == len(laid_out.layout_boxes)
    with open(tmp_path / "layout_crops.csv", encoding="utf-8") as handle:
        rows = {(row["query_id"], row["reference_id"]): row for row in csv.DictReader(handle)}
    assert rows[pair]["image_id"] == "screenshot" and float(rows[pair]["top"]) == pytest.approx(top, abs=1e-5)
    assert crop_boxes_of_pairs(laid_out)[pair] == {"screenshot": laid_out.layout_boxes[pair]}
    assert write_layout_crops(tmp_path / "layout_crops.csv", whole) == 0
    assert not (tmp_path / "layout_crops.csv").exists()
    assert layout_crops_text(whole, False) == "off"
    assert layout_crops_text(laid_out, True).startswith(f"{len(laid_out.layout_boxes)} pairs scored higher")
