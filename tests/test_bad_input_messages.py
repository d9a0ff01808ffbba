"""Bad input met by a new user, in the library: each case is one clear error (or a rebuilt cache), never a
traceback from a dependency and never a silent wrong result.

The command-line side of the same cases is in ``test_bad_inputs.py``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import require_extra, tiny_models
from PIL import Image

from copynce_hf.cli import build_parser
from copynce_hf.metrics import COPY_DETECTION_METRIC_PATH
from copynce_hf.metrics.copy_detection.formulas import copy_detection_metrics, read_ground_truth_csv
from copynce_hf.modeling.errors import ConfigError, CopyNCEError, PredictionsError, ShapeError
from copynce_hf.modeling.losses_copynce import copy_bce_loss, info_nce_loss, token_affinity_logits
from copynce_hf.outputs import StagedFolder
from copynce_hf.retrieval import (
    CollectionNormalisation,
    Descriptor,
    DescriptorIndex,
    DescriptorSet,
    DetectConfig,
    ImageFolderSource,
    Prediction,
    ViewPreset,
    detect,
    read_predictions,
    view_index,
)

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------- error types
@pytest.mark.parametrize("call", [
    lambda: token_affinity_logits(torch.zeros(2, 4), torch.zeros(2, 4, 8)),
    lambda: copy_bce_loss(torch.zeros(3), torch.zeros(4)),
    lambda: info_nce_loss(torch.zeros(2, 8), torch.zeros(3, 8), 1.0),
])
def test_shape_errors_are_value_errors(call):
    with pytest.raises(ValueError) as caught:  # what transformers code and its users catch
        call()
    assert isinstance(caught.value, ShapeError) and isinstance(caught.value, CopyNCEError)
    assert "shape" in str(caught.value) or "(B" in str(caught.value)


def test_option_errors_of_the_losses_are_configuration_errors():
    with pytest.raises(ConfigError, match="temperature must be positive"):
        token_affinity_logits(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8), temperature=0.0)


def test_shape_errors_of_the_models_are_value_errors():
    descriptor, matcher, _ = tiny_models(0)
    with pytest.raises(ValueError, match="pixel_values must be"):
        descriptor(pixel_values=torch.zeros(1, 2, 32, 32))
    with pytest.raises(ValueError, match="reference_pixel_values"):
        matcher(pixel_values=torch.zeros(2, 3, 32, 32), reference_pixel_values=torch.zeros(1, 3, 32, 32))


# ------------------------------------------------------------------------------------- file modes
@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield 0o640
    os.umask(previous)


def test_descriptor_files_get_the_mode_of_the_umask(tmp_path, umask_027):
    path = DescriptorSet(["a", "b"], np.eye(2, 4, dtype=np.float32)).save(tmp_path / "descriptors.safetensors")
    assert stat.S_IMODE(path.stat().st_mode) == umask_027  # safetensors alone gives 0600


def test_staged_folders_give_their_files_the_mode_of_the_umask(tmp_path, umask_027):
    from safetensors.numpy import save_file

    with StagedFolder(tmp_path / "model") as staging:
        save_file({"weight": np.zeros(3, dtype=np.float32)}, str(staging / "model.safetensors"))
        (staging / "config.json").write_text("{}")
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "model" / name).stat().st_mode) == umask_027, name


# ------------------------------------------------------------------------------------- CSV files
PREDICTIONS = "query_id,reference_id,score\nQ1,R1,0.9\nQ2,R2,0.4\n"
GROUND_TRUTH = "query_id,reference_id\nQ1,R1\nQ2,R2\n"


def _space_app():
    spec = importlib.util.spec_from_file_location("copy_detection_space_app",
                                                  Path(COPY_DETECTION_METRIC_PATH) / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    return app


def test_excel_csv_with_a_byte_order_mark_is_read(tmp_path):
    predictions, truth = tmp_path / "predictions.csv", tmp_path / "truth.csv"
    predictions.write_text(PREDICTIONS, encoding="utf-8-sig")  # what Excel's "CSV UTF-8" writes
    truth.write_text(GROUND_TRUTH, encoding="utf-8-sig")
    assert read_predictions(predictions)[0] == Prediction("Q1", "R1", 0.9)
    assert read_ground_truth_csv(truth) == {"Q1": ["R1"], "Q2": ["R2"]}
    assert _space_app().compute_from_files(predictions, truth)["micro_ap"] == pytest.approx(1.0)


def test_utf16_csv_is_refused_in_one_line(tmp_path):
    predictions, truth = tmp_path / "predictions.csv", tmp_path / "truth.csv"
    predictions.write_text(PREDICTIONS, encoding="utf-16")
    truth.write_text(GROUND_TRUTH, encoding="utf-16")
    with pytest.raises(PredictionsError, match="predictions file .*predictions.csv is UTF-16 text; save it as UTF-8"):
        read_predictions(predictions)
    with pytest.raises(ValueError, match="ground-truth file .*truth.csv is UTF-16 text"):
        read_ground_truth_csv(truth)
    with pytest.raises(ValueError, match="not UTF-8 text"):
        _space_app().compute_from_files(predictions, tmp_path / "unused.csv")
    latin = tmp_path / "latin.csv"
    latin.write_bytes("query_id,reference_id,score\nd\xe9j\xe0,R1,0.5\n".encode("latin-1"))
    with pytest.raises(PredictionsError, match="is not UTF-8 text"):
        read_predictions(latin)


def test_a_row_with_more_fields_than_the_header_is_refused(tmp_path):
    path = tmp_path / "predictions.csv"
    path.write_text("query_id,reference_id,score\nQ1,R1,0,90\n")  # a decimal comma: the score would read 0
    with pytest.raises(PredictionsError, match=r"line 2: 4 fields, but the header has 3 \(a decimal comma"):
        read_predictions(path)
    path.write_text("query_id,reference_id,score\nQ1,R1\n")
    with pytest.raises(PredictionsError, match="line 2: 2 fields, but the header has 3$"):
        read_predictions(path)


def test_reference_ids_matching_nothing_warn_that_muap_is_zero():
    with pytest.warns(UserWarning, match="none of the 2 predicted reference ids is in the ground truth.*muAP is 0"):
        metrics = copy_detection_metrics(["Q1", "Q2"], ["ref-a", "ref-b"], [0.9, 0.4], {"Q1": ["R1"], "Q2": ["R2"]})
    assert metrics["micro_ap"] == 0.0


# ------------------------------------------------------------------------------------- index caches
@pytest.fixture
def reference_folder(tmp_path):
    folder = tmp_path / "references"
    folder.mkdir()
    for seed in range(4):
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
            folder / f"r{seed}.png")
    return folder


def test_a_damaged_index_cache_is_rebuilt_with_a_warning(tmp_path, reference_folder, caplog):
    descriptor, _, processor = tiny_models(3)
    model = Descriptor("tiny", descriptor, processor)
    cache = tmp_path / "cache"
    built = view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    (cache / "index.faiss").write_bytes(b"not a faiss index")
    with pytest.raises(PredictionsError, match=r"index folder .* is damaged; build it again with `copynce index` "
                                               r"\(index.faiss: .*not recognized\)"):
        DescriptorIndex.load(cache)
    with caplog.at_level(logging.WARNING, logger="copynce_hf.retrieval.detection"):
        rebuilt = view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    assert "cannot be read" in caplog.text and "computing it again" in caplog.text
    assert rebuilt.references.ids == built.references.ids and DescriptorIndex.load(cache).references.ids == built.references.ids


def test_identity_of_a_cache_is_removed_before_its_files_are_rewritten(tmp_path, reference_folder, monkeypatch):
    descriptor, _, processor = tiny_models(3)
    model = Descriptor("tiny", descriptor, processor)
    cache = tmp_path / "cache"
    view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    assert (cache / "identity.json").is_file()
    (reference_folder / "r0.png").unlink()  # other images: the index is rebuilt, and killed while it is written

    def killed_while_saving(self, folder):
        (Path(folder) / "index.faiss").write_bytes(b"half written")
        raise KeyboardInterrupt

    monkeypatch.setattr(DescriptorIndex, "save", killed_while_saving)
    with pytest.raises(KeyboardInterrupt):
        view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    assert not (cache / "identity.json").exists()  # so no later run takes the half-written files for the old images


def test_a_cache_of_other_images_is_rebuilt_with_a_warning_naming_the_change(tmp_path, reference_folder, caplog):
    """A reference file replaced since the index was cached (same id, another modification time): the stored
    identity differs in ``files`` only; the warning names it (as a resumable job's does) and the index is rebuilt."""
    descriptor, _, processor = tiny_models(3)
    model = Descriptor("tiny", descriptor, processor)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="copynce_hf"):
        view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
        assert "computed from other inputs" not in caplog.text  # a new cache: nothing to warn about
        view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    assert f"reusing the index in {cache}" in caplog.text
    changed = reference_folder / "r0.png"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="copynce_hf"):
        view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    assert (f"the files of the index in {cache} were computed from other inputs (changed: files); "
            "computing them again") in caplog.text
    assert "reusing" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="copynce_hf"):  # rebuilt for the new file: reused from now on
        view_index(model, ImageFolderSource(reference_folder), ViewPreset("none"), cache, progress=False)
    assert f"reusing the index in {cache}" in caplog.text and "other inputs" not in caplog.text


# ------------------------------------------------------------------------------------- detect's words
def test_detect_names_its_views_in_plain_words_and_counts_what_it_could(tmp_path, reference_folder):
    descriptor, matcher, processor = tiny_models(3)
    (reference_folder / "empty.png").write_bytes(b"")
    lines = []
    result = detect(ImageFolderSource(reference_folder), ImageFolderSource(reference_folder),
                    [Descriptor("tiny", descriptor, processor)], (matcher, processor),
                    config=DetectConfig(candidates=50, collection=CollectionNormalisation(on=True)), progress=False,
                    log=lines.append)
    assert lines[0].startswith("tiny: 16 candidate pairs (whole images, less each reference's background: its mean "
                               "cosine to the other references of ranks 2-9, median ") and "none" not in " ".join(lines)
    assert result.candidates_per_query == 4  # the 4 readable references, not the 50 asked for
    assert result.skipped_references == {"empty": "empty file"} and result.skipped_queries == {"empty": "empty file"}


#: A duration in words (``1.5 s``, ``25 ms``, ``6 minutes``): a timing measured once, which belongs to the guides and
#: BENCHMARKS.md, where it is dated and its machine named, not to ``--help``.
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b")


def test_no_command_help_states_a_timing():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    helps = {"copynce": parser.format_help(), **{name: command.format_help() for name, command in commands.items()}}
    found = {name: TIMING.findall(" ".join(text.split())) for name, text in helps.items()}
    assert {name: timings for name, timings in found.items() if timings} == {}
    assert TIMING.findall("about 1.5 s per query, 25 ms per pass, roughly 6 minutes; 26 views, 35 fusions, 90 %") == [
        "1.5 s", "25 ms", "6 minutes"]



#: A document a --help text points to (``docs/detection.md``, ``BENCHMARKS.md``, or a bare ``README``, which names
#: no file), with the sections it names after it: ``docs/detection.md ('Presets', 'Local crops')`` or
#: ``docs/detection.md, 'Presets'``.
DOC_POINTER = re.compile(r"(?P<file>\b(?:docs/)?[\w-]+\.md\b|\bREADME\b(?!\.md))"
                         r"(?P<sections>(?:,?\s*\(?\s*'[^']+'(?:\s*,\s*'[^']+')*)?)")


def _headings(document: Path) -> set[str]:
    return {re.sub(r"[`*]", "", line.lstrip("#").strip()).lower()
            for line in document.read_text(encoding="utf-8").splitlines() if re.match(r"#{1,6} ", line)}


def doc_pointer_problems(text: str, root: Path = REPO) -> tuple[int, list[str]]:
    """``(pointers found, problems)`` of the documents ``text`` points to: each must be a file of ``root`` holding
    a heading for every section named after it."""
    found = list(DOC_POINTER.finditer(text))
    problems = []
    for pointer in found:
        document = root / pointer["file"]
        if not pointer["file"].endswith(".md") or not document.is_file():
            problems.append(f"{pointer['file']}: no such document")
            continue
        problems += [f"{pointer['file']} has no section {section!r}" for section in
                     re.findall(r"'([^']+)'", pointer["sections"]) if section.lower() not in _headings(document)]
    return len(found), problems


def _help_texts() -> dict[str, str]:
    """Every command's --help text as written (description, epilog, each option's help), unwrapped."""
    from copynce_hf.training.options import build_parser as training_parser

    parser = build_parser()
    parsers = {"copynce": parser, **parser._subparsers._group_actions[0].choices,
               "python -m copynce_hf.training": training_parser()}
    return {name: " ".join(filter(None, [command.description, command.epilog,
                                         *(action.help for action in command._actions)]))
            for name, command in parsers.items()}


def test_every_document_section_a_help_names_exists():
    helps = _help_texts()
    checked = {name: doc_pointer_problems(text) for name, text in helps.items()}
    assert {name: problems for name, (_, problems) in checked.items() if problems} == {}
    assert sum(count for count, _ in checked.values()) >= 3  # detect's and dedup's point to docs/detection.md
    md = ".md"  # the names are put together here: the repository's reference check scans this file too
    assert doc_pointer_problems(f"docs/detection{md} ('Presets', 'Local crops and what they cost') and "
                                f"BENCHMARKS{md}; docs/detection{md}, 'Presets'") == (3, [])
    assert doc_pointer_problems(f"the README ('Presets'); README{md}, 'Presets'; docs/none{md}") == (3, [
        "README: no such document", f"README{md} has no section 'Presets'", f"docs/none{md}: no such document"])


# ------------------------------------------------------------------------------------- the metric Space
def test_metric_space_declares_the_gradio_it_runs_on():
    """The metric Space's README pins the Gradio of the project's Space, which builds its interface here."""
    import yaml

    gradio = require_extra("gradio", "space")

    folder = Path(COPY_DETECTION_METRIC_PATH)
    front = yaml.safe_load((folder / "README.md").read_text(encoding="utf-8").split("---")[1])
    requirements = (Path(__file__).resolve().parents[1] / "spaces" / "copynce" / "requirements.txt").read_text()
    pinned = next(line.split("==")[1] for line in requirements.splitlines() if line.startswith("gradio=="))
    assert front["sdk"] == "gradio" and str(front["sdk_version"]) == pinned
    if gradio.__version__ == pinned:
        assert isinstance(_space_app().build_demo(), gradio.Interface)


# ------------------------------------------------------------------------------------- the Space's figures
def _drawn_text_boxes(figure) -> list[tuple[str, object, object]]:
    """``(text, window box, axes it belongs to)`` of every text the figure draws: the suptitle, the titles,
    and the tick and axis labels of the axes drawn with their axis (the colorbars)."""
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    boxes = []
    if figure._suptitle is not None and figure._suptitle.get_text():
        boxes.append((figure._suptitle.get_text(), figure._suptitle.get_window_extent(renderer), None))
    for axes in figure.axes:
        texts = [axes.title, axes._left_title, axes._right_title]
        if axes.axison:
            texts += [*axes.get_xticklabels(), *axes.get_yticklabels(), axes.xaxis.label, axes.yaxis.label]
        boxes += [(text.get_text(), text.get_window_extent(renderer), axes) for text in texts
                  if text.get_visible() and text.get_text().strip()]
    return boxes


def _collisions(figure, margin: float = 5.0) -> list[tuple[str, str]]:
    """Pairs of drawn texts that overlap, and texts that overlap a plot (axes) other than their own; boxes
    closer than ``margin`` pixels count as overlapping (a caption touching a colorbar reads as one)."""
    renderer = figure.canvas.get_renderer()
    boxes = [(text, box.padded(margin / 2), owner) for text, box, owner in _drawn_text_boxes(figure)]
    found = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a[1].overlaps(b[1])]
    for text, box, owner in boxes:
        found += [(text, f"plot {axes.get_label() or axes.get_title()!r}") for axes in figure.axes
                  if axes is not owner and axes.get_window_extent(renderer).padded(margin / 2).overlaps(box)]
    return found


@pytest.mark.parametrize("size", [(112, 112), (224, 112), (112, 224)])
def test_the_space_figures_keep_their_titles_clear_of_plots_and_colorbars(size):
    from copynce_hf.demo.figures import overlap_figure
    from copynce_hf.reports.affinity import AffinityMaps, affinity_figures

    rng = np.random.default_rng(0)
    grid = (size[1] // 16, size[0] // 16)
    query, reference = Image.new("RGB", size, (90, 40, 40)), Image.new("RGB", size, (40, 40, 90))
    maps = AffinityMaps(query, reference, (1, 2), rng.random(grid, dtype=np.float32),
                        rng.random(grid, dtype=np.float32), 16)
    overlap = rng.random((grid[0] * grid[1],) * 2, dtype=np.float32) / (grid[0] * grid[1])
    figures = [*affinity_figures(maps, title="q00012 / r00034"),
               overlap_figure(query, reference, overlap, (1, 2), 16, title="PixTrace overlap prior")]
    for figure in figures:
        assert _collisions(figure) == []
