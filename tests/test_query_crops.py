"""Query crops in ``copynce detect``: each query's neighbours among the references and the other queries, the pairs a
query's crop decides, and the stage in the library call (its scores are the matcher's on the crops themselves)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.retrieval import Descriptor, DescriptorSet, DetectConfig, ImageFolderSource, detect
from copynce_hf.retrieval.content.queries import query_crop_pairs, query_neighbours


def _unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_query_is_masked_against_its_nearest_references_and_other_queries():
    queries = DescriptorSet(["q0", "q1", "q2"], _unit([[1, 0, 0], [0.9, 0.1, 0], [0, 0, 1]]))
    references = DescriptorSet(["r0", "r1"], _unit([[0.8, 0.6, 0], [0, 0.2, 1]]))
    found = query_neighbours(queries, references, k=1)  # 2 k = 2 nearest, never the query itself
    assert found[("query", "q0")] == [("query", "q1"), ("reference", "r0")]
    assert found[("query", "q2")] == [("reference", "r1"), ("query", "q0")]  # ties (cosine 0): by key
    assert set(found) == {("query", q) for q in queries.ids}
    assert query_neighbours(DescriptorSet([], np.zeros((0, 3), np.float32)), references, k=1) == {}


def test_a_crop_decides_a_pair_only_where_it_matches_the_reference_better_than_its_whole_query():
    queries = DescriptorSet(["framed", "plain"], _unit([[1, 0, 0, 0], [0, 0, 1, 0]]))
    references = DescriptorSet(["photo", "frame", "other"], _unit([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]))
    crops = DescriptorSet(["framed"], _unit([[0.2, 1, 0, 0]]))  # the framed query's crop is the photo
    # its 2 nearest references: the photo (crop 0.98 > whole 0) and the frame (0.196 < the whole query's 1)
    assert query_crop_pairs(queries, references, crops, candidates=2) == [("framed", "photo")]
    assert query_crop_pairs(queries, references, crops, candidates=3) == [("framed", "photo")]
    assert query_crop_pairs(queries, references, DescriptorSet([], np.zeros((0, 4), np.float32)), 2) == []


def _embedded_models():
    """The embedded descriptor and matcher, and their image processor."""
    from copynce_hf.runtime.loading import load_model

    descriptor, processor = load_model(None, "descriptor", "--model")
    return descriptor, load_model(None, "matcher", "--matcher")[0], processor


def _framed_queries(folder) -> None:
    """Queries: four bundled photos pasted small into one shared background (a template) and one plain photo;
    references: the four photos and two others."""
    from copynce_hf.data import ASSET_IMAGES

    files = sorted(ASSET_IMAGES.glob("*.jpg"))
    (folder / "queries").mkdir(parents=True)
    (folder / "references").mkdir()
    background = Image.open(files[0]).convert("RGB").resize((256, 256))
    for i, path in enumerate(files[1:5]):
        photo = Image.open(path).convert("RGB")
        photo.save(folder / "references" / f"photo{i}.png")
        framed = background.copy()
        framed.paste(photo.resize((64, 64)), (96, 96))
        framed.save(folder / "queries" / f"framed{i}.png")
    Image.open(files[5]).convert("RGB").save(folder / "queries" / "plain.png")
    for i, path in enumerate(files[6:8]):
        Image.open(path).convert("RGB").save(folder / "references" / f"other{i}.png")


def test_detect_scores_the_pairs_a_query_crop_decides_on_the_crop_itself(tmp_path):
    from copynce_hf.retrieval.verify.scorer import MatcherScorer

    _framed_queries(tmp_path)
    descriptor, matcher, processor = _embedded_models()
    queries, references = ImageFolderSource(tmp_path / "queries"), ImageFolderSource(tmp_path / "references")
    lines: list[str] = []

    def run(crops: bool):
        return detect(queries, references, [Descriptor("tiny", descriptor, processor)], (matcher, processor),
                      config=DetectConfig(candidates=6, k=6, query_crops=crops, layout_crops=False,
                                          fusion_precision="float32", encoder_precision="float32"), progress=False,
                   log=lines.append)

    whole, cropped = run(False), run(True)  # content crops alone (layout crops: tests/test_layout_crops.py)
    assert not whole.crop_boxes and "query crops" not in whole.seconds
    assert any(line.startswith("query crops: ") for line in lines), "\n".join(lines)
    # only the framed queries are cropped (the plain one shares nothing), each to a box around its photo
    assert sorted(cropped.crop_boxes) == [f"framed{i}" for i in range(4)], "\n".join(lines)
    for left, top, right, bottom in cropped.crop_boxes.values():
        assert left <= 0.375 and top <= 0.375 and right >= 0.625 and bottom >= 0.625
    before = {(p.query_id, p.reference_id): p.score for p in whole.predictions}
    after = {(p.query_id, p.reference_id): p.score for p in cropped.predictions}
    assert {pair: score for pair, score in after.items() if pair[0] == "plain"} == {
        pair: score for pair, score in before.items() if pair[0] == "plain"}
    assert cropped.matcher_cost["fused_pairs"] > whole.matcher_cost["fused_pairs"]
    # a changed score is the matcher's on the crop (cut by the oracle itself) and the whole reference
    changed = [pair for pair, score in after.items() if before.get(pair) != score]
    assert changed
    files = {**dict(zip(queries.ids, queries.files)), **dict(zip(references.ids, references.files))}
    scorer = MatcherScorer(matcher, processor, fusion_precision="float32")  # the oracle, in the detect run's precision
    for query_id, reference_id in changed:
        left, top, right, bottom = cropped.crop_boxes[query_id]
        crop = Image.open(files[query_id]).convert("RGB").crop(
            (int(left * 256), int(top * 256), round(right * 256), round(bottom * 256)))
        expected = scorer.score([(query_id, reference_id)], {query_id: crop}, {reference_id: files[reference_id]},
                                progress=False)[0]
        assert after[(query_id, reference_id)] == pytest.approx(expected, abs=1e-5)
    assert set(changed) <= set(cropped.crop_pairs)
    # query_crops.csv holds the boxes, report.html's settings count them and outline the crop on the query
    from copynce_hf.reports.gallery import CROP_OUTLINE, write_gallery
    from copynce_hf.retrieval.content.crops import write_crops
    from copynce_hf.runs.detect import query_crops_text

    assert write_crops(tmp_path / "query_crops.csv", cropped) == 4
    assert query_crops_text(whole, False) == "off"
    assert query_crops_text(whole, True) == "on, not run (they need a matcher)"  # as with --matcher none
    assert query_crops_text(cropped, True) == (f"4 queries cropped to their own content, {len(cropped.crop_pairs)} "
                                               "pairs scored on their crops")
    pair = changed[0]
    write_gallery(tmp_path / "report.html", [p for p in cropped.predictions if (p.query_id, p.reference_id) == pair],
                  files, files, count=1, crops={pair: {pair[0]: cropped.crop_boxes[pair[0]]}})
    outlined = {path.stem: bool((np.asarray(Image.open(path).convert("RGB")) == CROP_OUTLINE).all(axis=2).any())
                for path in (tmp_path / "gallery").glob("*/*.png")}
    assert outlined == {"query": True, "reference": False}
    # the framed queries' photos rank higher than without the crops
    def ranks(result) -> list[int]:
        found = {}
        for p in sorted(result.predictions, key=lambda p: (-p.score, p.reference_id)):
            found.setdefault(p.query_id, []).append(p.reference_id)
        return [found[f"framed{i}"].index(f"photo{i}") for i in range(4)]

    assert sum(ranks(cropped)) < sum(ranks(whole))  # at seed 0: [2, 0, 0, 0] against [1, 2, 0, 4]


def test_a_rerun_reuses_the_query_crops_scores_kept_in_the_rescoring_folder(tmp_path):
    import os

    _framed_queries(tmp_path)
    descriptor, matcher, processor = _embedded_models()
    queries, references = ImageFolderSource(tmp_path / "queries"), ImageFolderSource(tmp_path / "references")
    lines: list[str] = []

    def run():
        lines.clear()
        return detect(queries, references, [Descriptor("tiny", descriptor, processor)], (matcher, processor),
                      config=DetectConfig(candidates=6, k=6), progress=False, log=lines.append,
                      rescoring_folder=tmp_path / "rescoring")

    first, second = run(), run()
    kept = tmp_path / "rescoring" / "query-crops"
    assert first.crop_pairs and sorted(path.name for path in kept.glob("chunk-*")) == ["chunk-000000.json"]
    assert second.predictions == first.predictions and second.crop_boxes == first.crop_boxes
    assert second.matcher_cost["fused_pairs"] == 0, "\n".join(lines)  # the crops' scores read from their chunk
    assert any("resuming" in line and str(kept) in line for line in lines)
    # a cropped query's file rewritten (a new file time): its crop's scores are computed again
    changed = tmp_path / "queries" / "framed0.png"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    third = run()
    assert not any("resuming" in line and str(kept) in line for line in lines)
    assert [p.score for p in third.predictions] == pytest.approx([p.score for p in first.predictions], abs=1e-6)


@pytest.mark.slow
def test_two_processes_crop_the_queries_as_one_does(tmp_path):
    import os
    from pathlib import Path

    from conftest import launch_two_cpu_processes, phone_screenshot

    from copynce_hf.cli import main
    from copynce_hf.data import ASSET_IMAGES

    _framed_queries(tmp_path)
    # and a lone screenshot, whose layout crop decides its pair (tests/test_layout_crops.py: the shipped models')
    rocket = Image.open(ASSET_IMAGES / "rocket.jpg").convert("RGB")
    rocket.save(tmp_path / "references" / "rocket.png")
    phone_screenshot(rocket)[0].save(tmp_path / "queries" / "screenshot.png")
    options = [str(tmp_path / "queries"), "--references", str(tmp_path / "references"), "--candidates", "6", "--k",
               "6", "--gallery", "1", "--quiet", "--encoder-precision", "float32",  # as launched: --mixed_precision no
               "--layout-candidates", "5"]  # a layout crop's nearest five
    assert main(["detect", *options, "--output", str(tmp_path / "one")]) == 0
    repo = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                   "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    result = launch_two_cpu_processes(["-m", "copynce_hf.cli", "detect", *options, "--output", str(tmp_path / "two")],
                                      environment)
    assert result.returncode == 0, result.stderr[-3000:]
    from copynce_hf.retrieval.predictions import read_predictions

    crops = [(tmp_path / run / "query_crops.csv").read_text(encoding="utf-8") for run in ("one", "two")]
    assert crops[0] == crops[1]  # the same boxes: the framed queries' content crops, the layout crops
    # Which queries a crop decides is the shipped models' output, recorded with them: the plain query's layout crop
    # decides a pair with the matcher shipped on 30 November (and before 29 November), not with the one between
    listed = [line.split(",")[0] for line in crops[0].splitlines()[1:]]
    assert listed == [*(f"framed{i}" for i in range(4)), "plain", "screenshot"], crops[0]
    one, two = (read_predictions(tmp_path / run / "predictions.csv") for run in ("one", "two"))
    assert [p[:2] for p in one] == [p[:2] for p in two]  # the same pairs in the same order, the same scores
    assert [p.score for p in two] == pytest.approx([p.score for p in one], abs=1e-6)


def test_query_crops_apply_where_content_tokens_do():
    assert DetectConfig().crops_queries  # the default, as --preset fast
    assert not DetectConfig(content_tokens=False).crops_queries
    assert not DetectConfig(query_crops=False).crops_queries
    assert not DetectConfig(descriptor_lce="matcher-views", content_tokens=True).crops_queries
    from copynce_hf.runs.settings import PipelineModels, PipelineSettings

    # ONNX Runtime turns content tokens off, and query crops with them; asked for explicitly, they are refused
    assert not PipelineSettings(PipelineModels(runtime="onnx")).config().crops_queries
    assert not PipelineSettings(preset="accurate").config().crops_queries
    for settings in (PipelineSettings(PipelineModels(runtime="onnx"), overrides={"query_crops": True}),
                     PipelineSettings(preset="accurate", overrides={"query_crops": True})):
        with pytest.raises(ConfigError, match="--query-crops needs content tokens"):
            settings.config()
    identity = PipelineSettings().identity()["settings"]
    assert identity["query_crops"] is True  # calibrations record them
    assert PipelineSettings(overrides={"query_crops": False}).identity()["settings"]["query_crops"] is False
