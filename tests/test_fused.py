"""Fused rendering (``CopyEditor(fuse=True)``, the default) against edit-by-edit application (``fuse=False``).

The two paths draw the same edits; the tables (and so the overlap priors) must be bit-identical, and
the images equal up to resampling: close on geometric chains away from the traced border, at least as
faithful to the original at the traced positions, with occlusions on the same pixels.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _oracles import bilinear
from PIL import Image

from copynce_hf.data.loading import ASSET_IMAGES
from copynce_hf.images import load_image
from copynce_hf.pixtrace import CoordinateTable, CopyEditor, CopyRecipe, pair_overlaps, replay
from copynce_hf.pixtrace.edits import Crop, Pad, Resize
from copynce_hf.pixtrace.fused import render_fused, resize_image

OUTPUT = (64, 64)
PATCH = 16


def originals(side: int = 160) -> list[Image.Image]:
    """The bundled natural images, shrunk to ``side`` pixels (small: the tests stay fast)."""
    images = []
    for path in sorted(ASSET_IMAGES.glob("*.jpg")):
        image = load_image(path)
        image.thumbnail((side, side), Image.BILINEAR)
        images.append(image)
    return images


def presets() -> dict[str, CopyRecipe]:
    """The recipes the data pipeline uses, plus one with every step on (every edit of the catalogue)."""
    training = CopyRecipe.training()
    everything = training.with_probability(1.0)
    found = {"training": training, "light": CopyRecipe.off(), "every step": everything}
    for name in ("paper_descriptor", "paper_matcher"):  # the paper's presets, where the package has them
        if hasattr(CopyRecipe, name):
            found[name] = getattr(CopyRecipe, name)()
    return found


#: Steps that draw geometric edits only, in the training recipe and the paper's.
GEOMETRIC_STEPS = {"random_resized_crop", "horizontal_flip", "vertical_flip", "affine", "perspective",
                   "onto_background", "pad", "onto_other_image", "padding"}


def geometric_only(recipe):
    """``recipe`` with every step that draws a non-geometric edit switched off."""
    return recipe.with_probability(0.0, [name for name in recipe.step_names() if name not in GEOMETRIC_STEPS])


def both(recipe: CopyRecipe, image: Image.Image, seed: int, output_size=OUTPUT):
    fused = CopyEditor(seed=0, recipe=recipe, output_size=output_size)(image, seed=seed)
    reference = CopyEditor(seed=0, recipe=recipe, output_size=output_size, fuse=False)(image, seed=seed)
    return fused, reference


def erode(mask: np.ndarray, steps: int) -> np.ndarray:
    """``mask`` eroded by ``steps`` pixels (4-neighbourhood), off-image pixels counting as False."""
    for _ in range(steps):
        padded = np.pad(mask, 1, constant_values=False)
        mask = mask & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-12))


# ---------------------------------------------------------------------------------------------- tables


@pytest.mark.parametrize("name", sorted(presets()))
def test_fused_and_edit_by_edit_copies_have_the_same_table(name):
    recipe = presets()[name]
    images = originals(128)
    reference = CopyEditor(seed=0, recipe=CopyRecipe.off(), output_size=OUTPUT)
    for seed in range(8):
        image = images[seed % len(images)]
        fused, slow = both(recipe, image, seed)
        assert fused.edits == slow.edits
        assert fused.image.size == slow.image.size and fused.table.size == slow.table.size
        np.testing.assert_array_equal(fused.table.coords, slow.table.coords)  # NaN in the same places too
        base = reference(image)
        for got, want in zip(pair_overlaps(fused.table, base.table, PATCH), pair_overlaps(slow.table, base.table, PATCH)):
            np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------- pixels


@pytest.mark.parametrize("name", sorted(set(presets()) - {"light", "every step"}) + ["light"])
def test_geometric_chains_agree_away_from_the_traced_border(name):
    """Geometric-only chains: fused and edit-by-edit images at 28 dB PSNR or more, on the pixels at
    least 3 pixels away from the border between traced and untraced pixels (each resampling blends
    fill into a band along it, which edit by edit widens at every edit)."""
    recipe = geometric_only(presets()[name])
    images = originals(160)
    scores = []
    for seed in range(16):
        fused, slow = both(recipe, images[seed % len(images)], seed, output_size=(96, 96))
        valid = fused.table.valid
        away = erode(valid, 3) | erode(~valid, 3)
        a, b = np.asarray(fused.image)[away], np.asarray(slow.image)[away]
        scores.append(psnr(a, b))
    assert min(scores) >= 28.0, scores


def test_fused_resize_is_antialiased():
    """Shrinking a one-pixel checkerboard by 4 gives flat grey, not a moire of black and white."""
    board = ((np.indices((256, 256)).sum(0) % 2) * 255).astype(np.uint8)
    image = Image.fromarray(np.stack([board] * 3, -1), "RGB")
    shrunk, _ = render_fused(image, [Resize(64, 64)])
    pixels = np.asarray(shrunk, dtype=np.float64)
    assert abs(pixels.mean() - 127.5) < 2 and pixels.std() < 2
    # Through a crop and a padding too (one run: crop, pad, resize).
    shrunk, table = render_fused(image, [Crop(16, 16, 240, 240), Pad(0.1, 0.1, (0, 0, 255)), Resize(56, 56)])
    inner = erode(table.valid, 2)
    assert np.asarray(shrunk, dtype=np.float64)[inner].std() < 2


def test_shrinking_the_source_uses_the_fused_resampler_only_when_fused():
    """``CopyPairMaker.source``: the same size either way; with ``fuse`` the fused renderer's resampler,
    close to Pillow's bilinear resize (which ``fuse=False`` keeps, pixel for pixel), and antialiased."""
    from copynce_hf.data import CopyPairMaker

    for original in originals(384)[:4]:
        fused = CopyPairMaker(32, max_source_side=150).source(original)
        slow = CopyPairMaker(32, max_source_side=150, fuse=False).source(original)
        assert fused.size == slow.size and max(fused.size) == 150
        expected = original.resize(slow.size, Image.BILINEAR, reducing_gap=2.0)
        np.testing.assert_array_equal(np.asarray(slow), np.asarray(expected))
        assert psnr(np.asarray(fused), np.asarray(slow)) >= 40.0
    board = ((np.indices((200, 300)).sum(0) % 2) * 255).astype(np.uint8)
    shrunk = CopyPairMaker(32, max_source_side=100).source(Image.fromarray(np.stack([board] * 3, -1), "RGB"))
    assert shrunk.size == (100, 67) and np.asarray(shrunk, dtype=np.float64).std() < 2
    with pytest.raises(ValueError, match="mode 'L'"):
        resize_image(Image.new("L", (8, 8)), (4, 4))


def _content_score(result, original: Image.Image) -> float | None:
    """Normalised cross-correlation of the copy's luminance with the original's at the traced positions."""
    valid = result.table.valid
    if valid.sum() < 200:
        return None
    y, x = result.table.coords[valid].astype(np.float64).T
    edited = np.asarray(result.image.convert("L"), dtype=np.float64)[valid]
    expected = bilinear(np.asarray(original.convert("L"), dtype=np.float64), y, x)
    edited, expected = edited - edited.mean(), expected - expected.mean()
    return float((edited * expected).sum() / max(np.sqrt((edited**2).sum() * (expected**2).sum()), 1e-9))


@pytest.mark.parametrize("name", sorted(set(presets()) - {"light", "every step"}))
def test_content_oracle_is_at_least_as_good_fused(name):
    """Over 60 draws, fused copies match the original at their traced positions at least as well as
    edit-by-edit copies (same edits, fewer resamplings)."""
    recipe = presets()[name]
    images = originals(160)
    fused_scores, slow_scores = [], []
    for seed in range(60):
        image = images[seed % len(images)]
        fused, slow = both(recipe, image, seed)
        a, b = _content_score(fused, image), _content_score(slow, image)
        if a is not None and b is not None:
            fused_scores.append(a)
            slow_scores.append(b)
    assert len(fused_scores) >= 45
    assert np.mean(fused_scores) >= np.mean(slow_scores)
    assert np.median(fused_scores) >= np.median(slow_scores)


def test_occlusions_land_on_the_same_pixels():
    """An erased box, after flips, affine and perspective warps and the final resize, covers the same
    output pixels in both paths (up to the one-pixel band resampling blends)."""
    base = geometric_only(CopyRecipe.training())
    recipe = base.replace(random_erasing=dataclasses.replace(base.random_erasing, p=1.0, scale=(0.1, 0.3)))
    images = originals(160)
    checked = 0
    for seed in range(16):
        fused, slow = both(recipe, images[seed % len(images)], seed, output_size=(96, 96))
        erasing = next(d for d in fused.edits if d["name"] == "random_erasing")
        fill = np.asarray(erasing["params"]["fill"], dtype=np.int16)
        original = np.asarray(images[seed % len(images)], dtype=np.int16)
        if np.abs(original - fill).max(-1).min() <= 12:  # the image itself has that colour: no oracle
            continue
        covered = [np.abs(np.asarray(r.image, dtype=np.int16) - fill).max(-1) <= 3 for r in (fused, slow)]
        # Where edit by edit shows the fill colour (or clearly does not), so does the fused copy.
        judged = erode(covered[1], 2) | erode(~covered[1], 2)
        assert np.mean(covered[0][judged] == covered[1][judged]) > 0.995
        # And those pixels are the ones the (shared) table says the box hides.
        inside = erode(covered[1], 2)
        assert not fused.table.valid[inside].any()
        checked += int(inside.sum() > 0)
    assert checked >= 8


@pytest.mark.parametrize("name", sorted(set(presets()) - {"light", "every step"}))
def test_whole_copies_stay_close_to_edit_by_edit(name):
    """Every pixel, traced or not (fills, backgrounds, overlays, erased boxes), of full recipe chains:
    fused copies differ from edit-by-edit ones by resampling only."""
    recipe = presets()[name]
    images = originals(160)
    scores = [psnr(np.asarray(fused.image), np.asarray(slow.image))
              for fused, slow in (both(recipe, images[seed % len(images)], seed) for seed in range(24))]
    assert np.median(scores) >= 30.0 and min(scores) >= 18.0, scores


# ---------------------------------------------------------------------------------------------- fast renderers


def test_edge_enhance_by_opencv_equals_pillow():
    """The fused path's edge enhancement is Pillow's filter, pixel for pixel (both kernels)."""
    from copynce_hf.pixtrace.edits import EdgeEnhance

    image = originals(160)[0]
    for more in (False, True):
        edit = EdgeEnhance(more=more)
        expected = np.asarray(edit.transform(image))
        assert np.array_equal(edit.render_array(np.asarray(image).copy(), (image.height, image.width)), expected), more


@pytest.mark.parametrize("sigma", [(5.0, 5.0), (12.0, 7.0), (20.0, 20.0)])
def test_wide_blur_on_a_reduced_image_matches_the_exact_gaussian(sigma):
    """A blur of 4 pixels or more is computed on a box-reduced image: PSNR >= 40 dB against OpenCV's
    exact Gaussian, and a narrow one is the exact Gaussian itself."""
    import cv2

    from copynce_hf.pixtrace.edits.photometric import gaussian_blur as _gaussian_blur

    pixels = np.asarray(originals(320)[1])
    sigma_y, sigma_x = sigma
    exact = cv2.GaussianBlur(pixels, (0, 0), sigmaX=sigma_x, sigmaY=sigma_y).astype(np.float64)
    error = np.mean((_gaussian_blur(pixels, sigma_y, sigma_x).astype(np.float64) - exact) ** 2)
    assert 10 * np.log10(255.0 ** 2 / max(error, 1e-12)) >= 40.0
    narrow = cv2.GaussianBlur(pixels, (0, 0), sigmaX=1.5, sigmaY=1.5)
    assert np.array_equal(_gaussian_blur(pixels, 1.5, 1.5), narrow)


def test_pointwise_albumentations_join_the_run_and_stay_close():
    """A pointwise albumentations operation between geometric edits is rendered inside the run at the
    working size (no true-size pass); the table is unchanged and the copy close to edit by edit."""
    from copynce_hf.pixtrace.edits import Albumentation
    from copynce_hf.pixtrace.fused import _plan, _Run

    image = originals(160)[2]
    for op in ("RGBShift", "HueSaturationValue", "RandomToneCurve", "ToSepia"):
        edits = [Crop(left=16, top=8, right=144, bottom=100), Albumentation(op=op, seed=4), Resize(width=64, height=64)]
        assert all(isinstance(item, _Run) for item in _plan(edits, (image.height, image.width))), op
        fused, fused_table = render_fused(image, edits)
        slow = replay(image, [edit.to_dict() for edit in edits], fuse=False)
        slow, slow_table = slow.image, slow.table
        assert np.array_equal(fused_table.coords, slow_table.coords, equal_nan=True)
        error = np.mean((np.asarray(fused, dtype=np.float64) - np.asarray(slow, dtype=np.float64)) ** 2)
        assert 10 * np.log10(255.0 ** 2 / max(error, 1e-12)) >= 28.0, op
    # A statistics-based one (CLAHE) keeps its own pass at the true size.
    edits = [Crop(left=16, top=8, right=144, bottom=100), Albumentation(op="CLAHE", seed=4), Resize(width=64, height=64)]
    assert not all(isinstance(item, _Run) for item in _plan(edits, (image.height, image.width)))



def test_warping_only_the_sampled_region_gives_the_same_pixels(monkeypatch):
    """Smoothing and resampling only the region an output samples (plus a margin) gives the pixels
    the whole input gives, up to 8-bit rounding, over random zooms, rotations and slight perspective."""
    from copynce_hf.pixtrace import fused

    pixels = np.asarray(originals(320)[3])
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(60):
        scale, angle = rng.uniform(0.2, 3.0), rng.uniform(-0.3, 0.3)
        matrix = np.array([[scale * np.cos(angle), -scale * np.sin(angle), rng.uniform(0, 150)],
                           [scale * np.sin(angle), scale * np.cos(angle), rng.uniform(0, 100)],
                           [rng.uniform(-1e-4, 1e-4), rng.uniform(-1e-4, 1e-4), 1.0]])
        cases.append((matrix, (int(rng.integers(24, 120)), int(rng.integers(24, 120)))))
    regional = [fused._warp(pixels, matrix, size) for matrix, size in cases]
    cropped = sum(fused._region_of(pixels, m, s, 8)[0].shape != pixels.shape for m, s in cases)
    monkeypatch.setattr(fused, "_region_of", lambda array, matrix, size, margin: (array, matrix))
    for (matrix, size), fast in zip(cases, regional):
        whole = fused._warp(pixels, matrix, size)
        assert np.abs(fast.astype(int) - whole.astype(int)).max() <= 1
    assert cropped >= 20  # the shortcut was taken in many of the cases


# ---------------------------------------------------------------------------------------------- the edit protocol


def test_an_edit_outside_the_catalogue_is_fused_through_the_protocol_alone():
    """Fused rendering asks each edit (``canvases``, ``scaling``, ``render_array``, ``layer``), so a new
    edit type joins a run by declaring its fused form, with no table to extend in ``fused.py``."""
    from typing import ClassVar

    from copynce_hf.pixtrace import fused
    from copynce_hf.pixtrace.edits import Canvas, ColorJitter, GeometricEdit, Layer, OverlayText
    from copynce_hf.pixtrace.projective import translation_matrix

    @dataclasses.dataclass(frozen=True)
    class Frame(GeometricEdit):  # a 10-pixel green border (not registered: a caller's own edit)
        name: ClassVar[str] = "test_frame"

        def stages(self, size):
            return [(translation_matrix(-10, -10), (size[0] + 20, size[1] + 20))]

        def render(self, image):
            framed = Image.new("RGB", (image.width + 20, image.height + 20), (0, 200, 0))
            framed.paste(image, (10, 10))
            return framed

        def canvases(self, stages):
            return [Canvas(color=(0, 200, 0))]

    @dataclasses.dataclass(frozen=True)
    class Inverted(ColorJitter):  # a pointwise colour edit through the default render_array
        name: ClassVar[str] = "test_inverted"

        def transform(self, image):
            return Image.fromarray(255 - np.asarray(image), "RGB")

        def render_array(self, pixels, true_size, density=None, visible=None):
            return 255 - pixels

    @dataclasses.dataclass(frozen=True)
    class Stamp(OverlayText):  # a relative overlay described by its layer
        name: ClassVar[str] = "test_stamp"

        def layer(self, size):
            return Layer(self.coverage(*size), color=(0, 0, 255))

        def render(self, image, coverage):
            from copynce_hf.pixtrace.edits import blend_color

            return blend_color(image, (0, 0, 255), coverage)

    image = originals(160)[0]
    edits = [Crop(left=10, top=10, right=130, bottom=110), Frame(), Inverted(), Resize(width=64, height=64),
             Stamp(text="AB", font_size=0.5)]
    plan = fused._plan(edits, (image.height, image.width))
    assert isinstance(plan[0], fused._Run) and len(plan[0].edits) == 3 and len(plan[0].deferred) == 1
    fast, fast_table = render_fused(image, edits)
    slow, table = image, CoordinateTable.identity(image.height, image.width)
    for edit in edits:
        slow, table = edit(slow, table)
    assert np.array_equal(fast_table.coords, table.coords, equal_nan=True)
    assert np.median(np.abs(np.asarray(fast, dtype=int) - np.asarray(slow, dtype=int))) <= 8
    corner = np.asarray(fast)[0, 0]  # the frame's canvas, inverted after it was drawn
    assert tuple(corner) == (255, 55, 255)


def test_fused_module_names_no_edit_type():
    """``fused.py`` keeps no tables keyed by edit type: it imports no concrete edit class and no private name."""
    import ast
    import inspect

    from copynce_hf.pixtrace import edits, fused

    tree = ast.parse(inspect.getsource(fused))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    concrete = {name for name in edits.__all__ if isinstance(getattr(edits, name), type)
                and issubclass(getattr(edits, name), edits.Edit) and name != "Edit"}
    assert not imported & concrete
    assert not {name for name in imported if name.startswith("_")}
