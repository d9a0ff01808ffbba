"""Layout crops: where a photo sits in a frame, read from the one image (``copynce_hf.retrieval.content.layout``), the
crops of each query (``content.queries``) and ``detect`` finding the copy in a lone screenshot."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import phone_screenshot
from PIL import Image, ImageDraw

from copynce_hf.data import ASSET_IMAGES
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval import Descriptor, DescriptorSet, DetectConfig, ImageFolderSource, detect
from copynce_hf.retrieval.content.layout import (
    LAYOUT_CROPS,
    MAX_SHARE,
    SAME_BOX,
    analysis_pixels,
    blob_boxes,
    box_iou,
    dense_boxes,
    layout_boxes,
    rectangle_boxes,
)
from copynce_hf.retrieval.content.queries import QueryView, query_crop_pairs, query_views


def _photo(name: str) -> Image.Image:
    return Image.open(ASSET_IMAGES / f"{name}.jpg").convert("RGB")


def test_a_photo_in_a_lone_screenshot_is_the_region_not_of_the_frame_colours():
    for name, dark in (("rocket", False), ("astronaut", False), ("coffee", True), ("chelsea", False)):
        framed, box = phone_screenshot(_photo(name), dark=dark)
        found = blob_boxes(framed, 2)
        assert found and box_iou(found[0], box) > 0.9, (name, found, box)  # the rows of text are small pieces
        boxes = layout_boxes(framed)
        assert 0 < len(boxes) <= LAYOUT_CROPS and any(box_iou(other, box) > 0.75 for other in boxes)
        assert all(box_iou(a, b) < SAME_BOX for i, a in enumerate(boxes) for b in boxes[i + 1:])  # none repeated


def _poster(photo: Image.Image) -> tuple[Image.Image, tuple[float, float, float, float]]:
    """A black poster: the photo in a thin white outline, a title below."""
    poster = Image.new("RGB", (420, 460), (8, 8, 8))
    shown = photo.resize((300, round(photo.height * 300 / photo.width)), Image.BICUBIC)
    poster.paste(shown, (60, 40))
    draw = ImageDraw.Draw(poster)
    draw.rectangle((52, 32, 60 + shown.width + 7, 40 + shown.height + 7), outline=(235, 235, 235), width=2)
    draw.text((150, 40 + shown.height + 30), "PERSEVERANCE", fill=(240, 240, 240))
    return poster, (60 / 420, 40 / 460, 360 / 420, (40 + shown.height) / 460)


def test_a_pasted_photo_is_a_rectangle_of_straight_sides_and_a_dense_region():
    backdrop = _photo("brick").resize((480, 360))
    backdrop.paste(_photo("chelsea").resize((210, 140)), (200, 60))
    box = (200 / 480, 60 / 360, 410 / 480, 200 / 360)
    rectangles = rectangle_boxes(analysis_pixels(backdrop), 3)
    assert any(box_iou(found, box) > 0.8 for _, found in rectangles), (rectangles, box)
    assert [score for score, _ in rectangles] == sorted((score for score, _ in rectangles), reverse=True)
    assert blob_boxes(_photo("grass")) == []  # a border of many colours (a photo, a texture) is no frame
    for name in ("astronaut", "coffee", "chelsea"):
        poster, box = _poster(_photo(name))
        pixels = analysis_pixels(poster)
        assert max(pixels.shape[:2]) == 256 and pixels.dtype == np.float32
        (score, rectangle), = rectangle_boxes(pixels, 1)
        assert score > 0 and box_iou(rectangle, box) > 0.85, (name, rectangle, box)
        assert box_iou(dense_boxes(pixels, 1)[0], box) > 0.85, name
        assert box_iou(blob_boxes(poster)[0], box) > 0.85, name


def test_no_box_where_the_layout_shows_no_photo_in_a_frame():
    flat = Image.new("RGB", (300, 200), (200, 40, 90))
    assert layout_boxes(flat) == [] and dense_boxes(analysis_pixels(flat)) == []
    text = Image.new("RGB", (300, 400), (255, 255, 255))
    draw = ImageDraw.Draw(text)
    for row in range(25):
        draw.text((8, 6 + 15 * row), "rows of text and nothing else in this frame", fill=(0, 0, 0))
    assert blob_boxes(text) == [] and dense_boxes(analysis_pixels(text)) == []  # rows of text: small pieces, gaps
    banner = Image.new("RGB", (300, 400), (255, 255, 255))
    ImageDraw.Draw(banner).rectangle((40, 100, 260, 300), fill=(30, 120, 220))
    assert blob_boxes(banner) == []  # a flat box of one colour is part of the frame
    # a photo filling most of its frame is the image itself: no box of it (MAX_SHARE)
    big, box = phone_screenshot(_photo("astronaut"), width=360, height=420, top=70, photo_width=330)
    assert (box[2] - box[0]) * (box[3] - box[1]) >= MAX_SHARE
    assert all(box_iou(found, box) < 0.9 for found in layout_boxes(big))


def _unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_crops_of_a_query_and_the_pairs_each_decides():
    views = query_views({"q0": (0.1, 0.1, 0.5, 0.5)},
                        {"q0": [(0.11, 0.1, 0.5, 0.5), (0.5, 0.5, 0.9, 0.9)], "q1": [(0.2, 0.2, 0.6, 0.7)]})
    # q0's first layout box repeats its content box: left out; ids name the kind, the number and the query
    assert views == {"content:q0": QueryView("q0", "content", (0.1, 0.1, 0.5, 0.5)),
                     "layout1:q0": QueryView("q0", "layout", (0.5, 0.5, 0.9, 0.9)),
                     "layout0:q1": QueryView("q1", "layout", (0.2, 0.2, 0.6, 0.7))}
    references = DescriptorSet([f"r{i}" for i in range(8)], _unit(np.eye(8) + 0.05))
    queries = DescriptorSet(["q0", "q1"], _unit([[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]]))
    crops = DescriptorSet(list(views), _unit([
        [0.9, 1, 0.8, 0, 0, 0, 0, 0],  # q0's content crop: r1 best, r0 below the whole query's cosine
        [0, 0.5, 0, 1, 0.9, 0.8, 0.7, 0.6],  # q0's layout crop: r3 ... r7, r1 lower than the content crop's
        [0, 0, 1, 0.9, 0.8, 0.7, 0.6, 0.5]]))  # q1's layout crop: its nearest five only
    pairs = query_crop_pairs(queries, references, crops, candidates=8, views=views, layout_candidates=5)
    by_query = {}
    for crop_id, reference_id in pairs:
        by_query.setdefault(views[crop_id].query, {})[reference_id] = crop_id
    assert by_query["q0"]["r1"] == "content:q0" and by_query["q0"]["r2"] == "content:q0"
    assert "r0" not in by_query["q0"]  # the whole query matches r0 better than every crop
    assert {by_query["q0"][r] for r in ("r3", "r4", "r5")} == {"layout1:q0"}
    assert len(by_query["q1"]) == 5 and "r7" not in by_query["q1"]  # r7: its whole query's
    fewer = query_crop_pairs(queries, references, crops, candidates=8, views=views, layout_candidates=2)
    assert sorted(r for c, r in fewer if views[c].query == "q1") == ["r2", "r3"]  # its nearest two
    assert {r for c, r in fewer if c == "layout1:q0"} == {"r3", "r4"}
    assert {"r1", "r2"} <= {r for c, r in fewer if c == "content:q0"}  # a content crop keeps its --candidates
    assert len(pairs) == len(set((views[c].query, r) for c, r in pairs))  # each (query, reference) once


def test_a_layout_crop_adds_evidence_and_never_takes_it_away():
    from copynce_hf.retrieval import Prediction
    from copynce_hf.retrieval.content.queries import QueryCrops, settled, with_crop_scores

    content_box, layout_box, other_box = (0.1, 0.1, 0.5, 0.5), (0.2, 0.2, 0.9, 0.9), (0.0, 0.5, 0.4, 1.0)
    rescored = [Prediction("q0", "r0", 0.9), Prediction("q0", "r1", 0.2), Prediction("q1", "r0", 0.6),
                Prediction("q1", "r2", 0.5)]
    scored = {("q0", "r0"): 0.3, ("q0", "r1"): 0.8, ("q1", "r0"): 0.4, ("q1", "r3"): 0.7, ("q1", "r2"): 0.55}
    kinds = {("q0", "r0"): "content", ("q0", "r1"): "layout", ("q1", "r0"): "layout", ("q1", "r3"): "layout",
             ("q1", "r2"): "layout"}
    boxes = {("q0", "r0"): content_box, ("q0", "r1"): layout_box, ("q1", "r0"): layout_box, ("q1", "r3"): other_box,
             ("q1", "r2"): layout_box}
    found = settled(rescored, QueryCrops(boxes={"q0": content_box}, scores=scored, pair_boxes=boxes, kinds=kinds))
    # the content crop replaces the whole query's 0.9; q1's layout crop scored below its whole query against r0: out
    assert found.scores == {("q0", "r0"): 0.3, ("q0", "r1"): 0.8, ("q1", "r3"): 0.7, ("q1", "r2"): 0.55}
    assert found.boxes == {"q0": layout_box, "q1": other_box} and found.layout == ["q0", "q1"]
    final = {(p.query_id, p.reference_id): p.score for p in with_crop_scores(rescored, found)}
    assert final == {("q0", "r0"): 0.3, ("q0", "r1"): 0.8, ("q1", "r0"): 0.6, ("q1", "r2"): 0.55, ("q1", "r3"): 0.7}


def test_layout_crops_follow_query_crops():
    from copynce_hf.runs.settings import PipelineModels, PipelineSettings

    assert DetectConfig().crops_layouts and not DetectConfig(layout_crops=False).crops_layouts
    assert not DetectConfig(query_crops=False).crops_layouts
    with pytest.raises(ConfigError, match="--layout-crops needs query crops"):
        PipelineSettings(preset="accurate", overrides={"layout_crops": True}).config()
    assert PipelineSettings(PipelineModels(runtime="onnx")).config().crops_layouts is False
    assert PipelineSettings().identity()["settings"]["layout_crops"] is True  # calibrations record them
    assert PipelineSettings(overrides={"layout_crops": False}).identity()["settings"]["layout_crops"] is False


def test_detect_finds_the_photo_of_a_lone_screenshot_on_its_layout_crop(tmp_path):
    """A user's case: one screenshot of ``rocket`` as the only query, no other image sharing its frame."""
    from copynce_hf.retrieval.verify.scorer import MatcherScorer
    from copynce_hf.runtime.loading import load_model

    (tmp_path / "queries").mkdir()
    (tmp_path / "references").mkdir()
    framed, box = phone_screenshot(_photo("rocket"))
    framed.save(tmp_path / "queries" / "screenshot_rocket.png")
    for name in ("rocket", "horse", "astronaut", "brick", "coffee", "chelsea", "clock_motion", "camera"):
        _photo(name).save(tmp_path / "references" / f"{name}.png")
    descriptor, processor = load_model(None, "descriptor", "--model")
    matcher = load_model(None, "matcher", "--matcher")[0]
    queries, references = ImageFolderSource(tmp_path / "queries"), ImageFolderSource(tmp_path / "references")
    lines: list[str] = []

    def run(layout: bool):
        return detect(queries, references, [Descriptor("tiny", descriptor, processor)], (matcher, processor),
                      config=DetectConfig(candidates=8, k=8, layout_crops=layout), progress=False, log=lines.append)

    whole, cropped = run(False), run(True)
    assert not whole.crop_boxes and not whole.layout_cropped  # no other image shows its frame
    assert cropped.layout_cropped == ["screenshot_rocket"], "\n".join(lines)
    assert box_iou(cropped.crop_boxes["screenshot_rocket"], box) > 0.8
    best = max(cropped.predictions, key=lambda p: p.score)
    assert best.reference_id == "rocket" and ("screenshot_rocket", "rocket") in cropped.crop_pairs, "\n".join(lines)
    before = max(p.score for p in whole.predictions if p.reference_id == "rocket")
    assert best.score > before  # the whole screenshot against the photo scored lower (0.231 before layout crops)
    left, top, right, bottom = cropped.crop_pairs[("screenshot_rocket", "rocket")]
    crop = framed.crop((int(left * framed.width), int(top * framed.height), round(right * framed.width),
                        round(bottom * framed.height)))
    expected = MatcherScorer(matcher, processor).score([("crop", "rocket")], {"crop": crop},
                                                      {"rocket": tmp_path / "references" / "rocket.png"},
                                                      progress=False)[0]
    assert best.score == pytest.approx(expected, abs=1e-5)  # the matcher's score on the crop itself
