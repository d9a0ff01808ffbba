"""copynce_hf.demo.interactive: the functions behind the Space, on the embedded models and bundled images."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from PIL import Image

from copynce_hf.demo import interactive
from copynce_hf.evaluation.demo_task import input_overlap
from copynce_hf.images import load_image
from copynce_hf.modeling.errors import ConfigError, ImageLoadError
from copynce_hf.pixtrace import CoordinateTable, replay
from copynce_hf.reports.affinity import affinity_maps
from copynce_hf.runtime.loading import DEFAULT_MATCHER

BUNDLED = interactive.bundled_image_files()


@pytest.fixture(scope="module")
def detector() -> interactive.Detector:
    return interactive.Detector.from_environment({})


@pytest.fixture(scope="module")
def astronaut() -> Image.Image:
    return load_image(BUNDLED["astronaut.jpg"])


@pytest.fixture(scope="module")
def astronaut_copy(astronaut) -> Image.Image:
    return interactive.make_copy(astronaut, "evaluation", 3).image


def test_detector_loads_the_embedded_models_and_refuses_the_wrong_kind(detector, tmp_path):
    assert detector.descriptor_name == "embedded descriptor" and detector.matcher_name == "embedded matcher"
    assert detector.grid == 14
    with pytest.raises(ConfigError, match="holds a matcher; a descriptor is needed"):
        interactive.Detector.load(descriptor=DEFAULT_MATCHER)
    with pytest.raises(ConfigError, match="COPYNCE_MATCHER"):
        interactive.Detector.from_environment({"COPYNCE_MATCHER": str(tmp_path / "missing")})


def test_patch_at_maps_pixels_to_the_stretched_patch_grid():
    assert interactive.patch_at(0, 0, 300, 200, 14) == (0, 0)
    assert interactive.patch_at(299.9, 199.9, 300, 200, 14) == (13, 13)
    assert interactive.patch_at(150, 50, 300, 200, 14) == (3, 7)
    assert interactive.patch_at(1000, -5, 300, 200, 14) == (0, 13)  # clamped
    with pytest.raises(ConfigError):
        interactive.patch_at(1, 1, 0, 10, 14)


def test_affinity_maps_default_probe_is_the_lowest_entropy_patch(detector, astronaut, astronaut_copy):
    model, processor = detector.matcher
    chosen = affinity_maps(model, processor, astronaut_copy, astronaut)
    row, col = np.unravel_index(int(np.argmin(chosen.entropy)), chosen.entropy.shape)
    assert chosen.patch == (row, col)
    explicit = affinity_maps(model, processor, astronaut_copy, astronaut, (row, col))
    np.testing.assert_allclose(explicit.affinity, chosen.affinity)
    other = affinity_maps(model, processor, astronaut_copy, astronaut, (0, 0))
    assert other.patch == (0, 0) and not np.allclose(other.affinity, chosen.affinity)


def test_compare_scores_a_copy_above_an_unrelated_pair(detector, astronaut, astronaut_copy):
    copy = interactive.compare(detector, astronaut_copy, astronaut)
    unrelated = interactive.compare(detector, astronaut_copy, load_image(BUNDLED["coffee.jpg"]), patch=(2, 3))
    assert 0.0 <= unrelated.copy_probability < copy.copy_probability <= 1.0
    assert unrelated.cosine < copy.cosine
    assert unrelated.maps.patch == (2, 3)
    affinity, entropy = interactive.comparison_images(copy)
    assert affinity.mode == "RGB" and min(affinity.size) > 100 and min(entropy.size) > 100


def test_read_upload_messages_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(ImageLoadError, match="Please upload a query image"):
        interactive.read_upload(None, "query")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ImageLoadError, match=r"The query file notes\.txt is not a usable image") as caught:
        interactive.read_upload(text, "query")
    assert str(tmp_path) not in str(caught.value)
    with pytest.raises(ImageLoadError, match=r"reference file astronaut\.jpg is too large: .* the limit is 0\.0 MB"):
        interactive.read_upload(BUNDLED["astronaut.jpg"], "reference", max_bytes=1000)
    assert interactive.read_upload(BUNDLED["astronaut.jpg"], "query").mode == "RGB"


def test_search_finds_the_original_in_the_bundled_gallery(detector, astronaut_copy):
    gallery = interactive.bundled_gallery(detector)
    assert len(gallery) == len(BUNDLED) == 12
    result = interactive.search(detector, gallery, astronaut_copy, k=5)
    assert [hit.reference_id for hit in result.hits][0] == "astronaut.jpg"
    cosines = [hit.cosine for hit in result.hits]
    assert len(cosines) == 5 and cosines == sorted(cosines, reverse=True)
    assert result.best_copy_probability > 0.5


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_gallery_from_zip_indexes_images_and_lists_what_it_skipped(detector, astronaut_copy, tmp_path):
    members = {f"refs/{name}": BUNDLED[name].read_bytes() for name in ("astronaut.jpg", "coffee.jpg", "rocket.jpg")}
    members.update({"refs/readme.txt": b"text", "refs/broken.png": b"\x89PNG broken", "__MACOSX/._x.jpg": b"x"})
    calls = []
    gallery = interactive.gallery_from_zip(detector, _zip(tmp_path / "refs.zip", members),
                                           progress=lambda done, total: calls.append((done, total)))
    assert gallery.ids == ["refs/astronaut.jpg", "refs/coffee.jpg", "refs/rocket.jpg"]
    assert gallery.name == "refs.zip" and calls[-1] == (3, 3)
    assert any(item.startswith("refs/readme.txt") for item in gallery.skipped)
    assert any(item.startswith("refs/broken.png") and "corrupt" in item for item in gallery.skipped)
    assert gallery.descriptors.descriptors.shape == (3, 256)
    assert interactive.search(detector, gallery, astronaut_copy, k=5).hits[0].reference_id == "refs/astronaut.jpg"


def test_gallery_from_zip_refuses_bad_archives(detector, tmp_path):
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ImageLoadError, match=r"broken\.zip is not a zip archive"):
        interactive.gallery_from_zip(detector, broken)
    with pytest.raises(ImageLoadError, match="Please upload a .zip"):
        interactive.gallery_from_zip(detector, None)
    two = _zip(tmp_path / "two.zip", {"a.jpg": BUNDLED["coffee.jpg"].read_bytes(),
                                      "b.jpg": BUNDLED["rocket.jpg"].read_bytes()})
    with pytest.raises(ImageLoadError, match="holds 2 images; the limit is 1"):
        interactive.gallery_from_zip(detector, two, max_images=1)
    with pytest.raises(ImageLoadError, match="too large"):
        interactive.gallery_from_zip(detector, two, max_bytes=100)
    with pytest.raises(ImageLoadError, match="unpacks to"):
        interactive.gallery_from_zip(detector, two, max_uncompressed=1000)
    texts = _zip(tmp_path / "texts.zip", {"a.txt": b"a", "b.png": b"not a png"})
    with pytest.raises(ImageLoadError, match="holds no readable image"):
        interactive.gallery_from_zip(detector, texts)


def test_make_copy_is_seeded_replayable_and_checked(astronaut):
    pool = [path for name, path in BUNDLED.items() if name != "astronaut.jpg"]
    first = interactive.make_copy(astronaut, "training", 11, image_pool=pool)
    again = interactive.make_copy(astronaut, "training", 11, image_pool=pool)
    other = interactive.make_copy(astronaut, "training", 12, image_pool=pool)
    assert first.edits == again.edits and first.edits != other.edits
    assert np.array_equal(np.asarray(first.image), np.asarray(again.image))
    replayed = replay(astronaut, first.edits)
    assert np.array_equal(np.asarray(replayed.image), np.asarray(first.image))
    for preset in ("paper_descriptor", "paper_matcher"):
        paper = interactive.make_copy(astronaut, preset, 3, image_pool=pool)
        assert paper.edits and np.array_equal(np.asarray(replay(astronaut, paper.edits).image),
                                               np.asarray(paper.image))
    evaluation = interactive.make_copy(astronaut, "evaluation", 11)
    assert evaluation.edits and max(evaluation.image.size) <= 320
    summary = interactive.copy_summary(first, "training", 11, "astronaut.jpg")
    assert summary["preset"] == "training" and summary["edits"] == first.edits
    assert 0.0 < summary["traced_fraction"] <= 1.0
    with pytest.raises(ConfigError, match="unknown copy preset 'heavy'"):
        interactive.make_copy(astronaut, "heavy", 0)
    with pytest.raises(ConfigError, match="seed must be an integer"):
        interactive.make_copy(astronaut, "training", -1)


def test_input_overlap_of_an_unedited_image_is_the_identity():
    overlap = input_overlap(CoordinateTable.identity(90, 150), (90, 150), 112, 8)
    assert overlap.shape == (196, 196)
    np.testing.assert_allclose(overlap, np.eye(196), atol=1e-5)


def test_copy_overlap_image_draws_both_images(astronaut):
    copy = interactive.make_copy(astronaut, "evaluation", 4)
    drawn = interactive.copy_overlap_image(astronaut, copy, 112, 8)
    assert drawn.mode == "RGB" and drawn.width > drawn.height > 100
    assert len(np.unique(np.asarray(drawn).reshape(-1, 3), axis=0)) > 100  # a picture, not a blank canvas
