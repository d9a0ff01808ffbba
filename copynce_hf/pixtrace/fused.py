"""Fused rendering of a chain of traced edits: one resampling per run of geometric edits.

Applied edit by edit, a chain such as crop -> flip -> affine -> perspective -> colour jitter ->
resize to 224x224 resamples full-resolution intermediates four times. PixTrace already holds the
chain's geometry analytically (paper, section "PixTrace Pipeline": every geometric edit is a
projective map T <- f(T)), so the pixel work can follow it instead: every maximal run of
consecutive geometric edits is rendered by *one* resampling of the run's input through the
composed backward map, straight to the size the run's result is needed at. What a geometric
edit adds besides moved pixels (the fill colour of an affine or perspective warp, padding, the
background an image is pasted onto) is composited in the same pass, each layer weighted by an
antialiased mask computed from the same half-planes the table uses.

Where the result is needed at
-----------------------------
Each run's result is materialised at its true size (the size the edit-by-edit path gives it)
unless every edit between it and the next run is *scale-free* (its result at another resolution
is the same up to resampling: overlays and pixelisation, whose geometry is relative to the image
size); then it is materialised at the resolution the rest of the chain needs (for the usual chain,
directly at the model input size), so the final resize is folded into it. Pointwise edits (colour
edits, blur with its radius scaled) are applied inside a run's pass. JPEG, noise, pixel shuffling
and geometric edits without a fused form (screenshot, meme) run on the true-size image, exactly as
edit by edit.

This module knows no edit type: each edit says what it needs through the edit protocol, a
geometric edit its stages and their canvases (``GeometricEdit.canvases``), every edit its
``scaling`` (``"pointwise"``, ``"relative"`` or ``"true_size"``), photometric edits their array
renderer (``PhotometricEdit.render_array``) and occluding edits their paint (``OccludingEdit.layer``).
Procedural images (noise, gradient) are evaluated here through the maps, from the seeded draws of
:mod:`.edits.sources`.

The tables are computed exactly as edit by edit (same maps, same occlusion masks at the true
sizes), so they and the overlap priors are bit-identical; only the pixels differ, by resampling.
Minification is antialiased: the input of a warp is smoothed first with a centred Gaussian as wide
as Pillow's antialiased resize filter (after a box reduction by a power of two for strong shrinking).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np
from PIL import Image

from .edits import Canvas, Edit
from .edits.sources import gradient_parameters, image_size, is_procedural, noise_grid, resolve_image
from .projective import resize_matrix
from .table import CoordinateTable

__all__ = ["render_fused", "resize_image"]

cv2.setNumThreads(1)  # data-loader workers are the parallelism; OpenCV's own threads only contend


# ---------------------------------------------------------------------------------------------- scale-free edits


def _blend(pixels: np.ndarray, colour: np.ndarray, coverage: np.ndarray) -> np.ndarray:
    """``pixels`` with ``colour`` (RGB or (H, W, 3)) blended in by ``coverage`` (uint8, 255 = replaced)."""
    left, top, width, height = cv2.boundingRect(np.ascontiguousarray(coverage))  # of the covered pixels
    if width == 0 or height == 0:
        return pixels
    window = (slice(top, top + height), slice(left, left + width))  # blended there only
    weight = coverage[window].astype(np.float32) * np.float32(1 / 255)
    colour = np.asarray(colour, dtype=np.uint8)
    colour = colour[window] if colour.ndim == 3 else np.broadcast_to(colour, (height, width, 3))
    blended = np.array(pixels)
    blended[window] = cv2.blendLinear(np.ascontiguousarray(pixels[window]), np.ascontiguousarray(colour),
                                      1.0 - weight, weight)
    return blended


def _spec_at(spec, size: tuple[int, int]) -> np.ndarray:
    """The image ``spec`` describes, resized (bilinear) to ``size`` (h, w): uint8 (h, w, 3).

    Procedural images (gradient, noise) are evaluated straight at ``size`` through the resize map,
    as the canvases are, instead of being drawn at their own size and then resized.
    """
    if is_procedural(spec):
        to_native = resize_matrix(image_size(spec), size)
        layer = _gradient(spec, to_native, size) if spec["kind"] == "gradient" else _noise(spec, to_native, size)
        return np.ascontiguousarray(layer)
    return np.asarray(resolve_image(spec).resize((size[1], size[0]), Image.BILINEAR))


def _overlay_at(edit, pixels: np.ndarray, true_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """An occluding edit on the working image ``pixels``: its layer (``OccludingEdit.layer``) drawn at the
    true size (as edit by edit), resampled to the working size (antialiased), blended. Returns (pixels,
    true-size coverage)."""
    layer = edit.layer(true_size)
    coverage = layer.coverage
    if not coverage.any():
        return pixels, coverage
    colour = layer.colour(_spec_at)
    working = pixels.shape[:2]
    if working == true_size:
        return _blend(pixels, colour, coverage), coverage
    to_true = resize_matrix(true_size, working)
    if colour.ndim == 3:
        colour = _warp(colour, to_true, working)
    return _blend(pixels, colour, _warp(coverage, to_true, working)), coverage


# ---------------------------------------------------------------------------------------------- plan


@dataclass
class _Run:
    """Consecutive fusable geometric edits (their stages, flattened, with canvases) and the pointwise
    edits between them."""

    input_size: tuple[int, int]
    stages: list[tuple[np.ndarray, tuple[int, int], Canvas]] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    #: Number of stages of each edit of ``edits``.
    counts: list[int] = field(default_factory=list)
    #: Pointwise edits joined to the run: (number of stages before it, edit, the edit's true size).
    deferred: list[tuple[int, Edit, tuple[int, int]]] = field(default_factory=list)
    #: (h, w) the run's result is materialised at (its true size unless scale-free edits follow).
    working: tuple[int, int] | None = None

    @property
    def output_size(self) -> tuple[int, int]:
        return self.stages[-1][1] if self.stages else self.input_size

    def matrix(self) -> np.ndarray:
        """Backward map from the run's output pixels (true size) to its input pixels."""
        matrix = np.eye(3)
        for stage, _, _ in self.stages:
            matrix = matrix @ stage
        return matrix


def _plan(edits: Sequence[Edit], size: tuple[int, int]) -> list:
    """The chain as a list of :class:`_Run` and ``(edit, true size)`` items, a run first (maybe empty)."""
    items: list = [_Run(size)]
    for edit in edits:
        stages = edit.stages(size) if edit.kind == "geometric" else None
        canvases = None if stages is None else edit.canvases(stages)
        if canvases is not None:  # a geometric edit with a fused form
            if not isinstance(items[-1], _Run):
                items.append(_Run(size))
            run = items[-1]
            run.stages += list(zip((m for m, _ in stages), (s for _, s in stages), canvases))
            run.edits.append(edit)
            run.counts.append(len(stages))
            size = stages[-1][1]
        elif edit.scaling == "pointwise":
            if not isinstance(items[-1], _Run):
                items.append(_Run(size))
            items[-1].deferred.append((len(items[-1].stages), edit, size))
        else:
            items.append((edit, size))
            if stages is not None:
                size = stages[-1][1]
    # Working sizes, from the end: a run followed only by scale-free edits is materialised at the
    # resolution the next run samples it at (never above its true size).
    following = None  # (run, its working->true map) of the next run
    for position in range(len(items) - 1, -1, -1):
        run = items[position]
        if not isinstance(run, _Run):
            continue
        true = run.output_size
        between = items[position + 1:]
        stop = next((i for i, item in enumerate(between) if isinstance(item, _Run)), len(between))
        scale_free = all(edit.scaling == "relative" for edit, _ in between[:stop])
        if following is None or not scale_free:
            run.working = true
        else:
            next_run, next_map = following
            density = _axis_density(next_run.matrix() @ next_map, next_run.working)
            run.working = tuple(
                max(1, min(side, math.ceil(side / rho - 1e-6))) for side, rho in zip(true, density)
            )
        following = (run, resize_matrix(true, run.working))
    return items


def _axis_density(matrix: np.ndarray, size: tuple[int, int]) -> tuple[float, float]:
    """(rows, cols) of the map's input traversed per output pixel along y and x, smallest over the
    output's corners and centre (a projective map's scale varies; the smallest never over-reduces)."""
    height, width = size
    points = np.array([[0.0, width - 1.0, 0.0, width - 1.0, (width - 1) / 2],
                       [0.0, 0.0, height - 1.0, height - 1.0, (height - 1) / 2], [1.0, 1.0, 1.0, 1.0, 1.0]])
    # At each point, the gradients of the input position (u / w, v / w) with respect to (x, y),
    # where (u, v, w) = matrix @ (x, y, 1); a point where w vanishes counts as the identity map.
    u, v, w = matrix @ points
    flat = np.abs(w) < 1e-12
    w = np.where(flat, 1.0, w)
    grad_x_in = np.stack([matrix[0, 0] - u / w * matrix[2, 0], matrix[0, 1] - u / w * matrix[2, 1]]) / w
    grad_y_in = np.stack([matrix[1, 0] - v / w * matrix[2, 0], matrix[1, 1] - v / w * matrix[2, 1]]) / w
    dx = np.where(flat, 1.0, np.hypot(*grad_x_in))
    dy = np.where(flat, 1.0, np.hypot(*grad_y_in))
    return max(float(dy.min()), 1e-6), max(float(dx.min()), 1e-6)


# ---------------------------------------------------------------------------------------------- resampling


def _warp(array: np.ndarray, matrix: np.ndarray, size: tuple[int, int], interpolation=cv2.INTER_LINEAR):
    """``array`` (H, W[, C]) resampled at ``matrix`` @ (x, y, 1) of every pixel of an image of ``size``.

    Antialiased: where the map shrinks an axis by a factor d > 1, the input is first smoothed along it
    by a Gaussian of variance (d^2 - 1) / 6 source pixels^2, which with the bilinear tent adds up to
    the variance d^2 / 6 of Pillow's antialiased (triangle) resize filter and, being centred on every
    sample, keeps the content in phase. Where d >= 4 the input is first box-reduced by a power of two
    (both axes alike, OpenCV's fast path) so that the smoothing stays short. Outside the input the
    border pixels are repeated (callers mask those pixels with their layers).
    """
    height, width = size
    if array.shape[:2] == size and np.allclose(matrix, np.eye(3), atol=1e-9):
        return array
    dy, dx = _axis_density(matrix, size)
    array, matrix = _region_of(array, matrix, size, margin=4 + math.ceil(3 * max(dy, dx)))
    factor = 1
    while min(dy, dx) / factor >= _BOX_AT and min(array.shape[:2]) // (2 * factor) >= 2:
        factor *= 2
    if factor > 1:
        array, reduce = _reduce(array, factor)
        matrix = reduce @ matrix
        dy, dx = dy / factor, dx / factor
    sigma_y, sigma_x = (math.sqrt(max(d * d - 1.0, 0.0) / 6.0) for d in (dy, dx))
    if max(sigma_y, sigma_x) >= 0.2:
        array = _smooth(array, max(sigma_y, 1e-3), max(sigma_x, 1e-3))
    flags = interpolation | cv2.WARP_INVERSE_MAP
    matrix = matrix / matrix[2, 2]
    # OpenCV's vectorised warps handle 1 and 4 channels; 3-channel images go through a padded
    # 4-channel copy: the same samples, bit for bit, and up to 2.5 times faster here (scalings and
    # projective maps; rotations take about as long either way).
    padded = array.ndim == 3 and array.shape[2] == 3 and array.dtype == np.uint8
    if padded:
        array = cv2.cvtColor(array, cv2.COLOR_RGB2RGBA)
    if abs(matrix[2, 0]) < 1e-12 and abs(matrix[2, 1]) < 1e-12:
        warped = cv2.warpAffine(array, matrix[:2], (width, height), flags=flags, borderMode=cv2.BORDER_REPLICATE)
    else:
        warped = cv2.warpPerspective(array, matrix, (width, height), flags=flags, borderMode=cv2.BORDER_REPLICATE)
    return cv2.cvtColor(warped, cv2.COLOR_RGBA2RGB) if padded else warped


def _smooth(array: np.ndarray, sigma_y: float, sigma_x: float) -> np.ndarray:
    """``array`` (H, W[, C]) smoothed by a Gaussian of standard deviations ``(sigma_y, sigma_x)``:
    ``cv2.GaussianBlur``'s kernels (same sizes, reflected border) applied by ``cv2.sepFilter2D``,
    10-25 % faster here on 3-channel images (within 2 levels of it: float instead of fixed point)."""
    kernels = [cv2.getGaussianKernel(int(round(6 * sigma + 1)) | 1, sigma) for sigma in (sigma_x, sigma_y)]
    return cv2.sepFilter2D(array, -1, *kernels)


def _region_of(array: np.ndarray, matrix: np.ndarray, size: tuple[int, int], margin: int):
    """The part of ``array`` that an output of ``size`` samples through ``matrix`` (plus ``margin``
    pixels for the smoothing and box reduction), and the map to it: ``(region, matrix)``.

    A crop samples a fraction of its input; smoothing only that region, not the whole input, gives
    the same samples. Every sample falls inside the region or beyond the input's own border (the
    region reaches that border then), so border replication is unchanged. Maps whose horizon
    crosses the output, and regions nearly as large as the input, keep the whole input.
    """
    height, width = size
    corners = matrix @ np.array([[-0.5, width - 0.5, -0.5, width - 0.5], [-0.5, -0.5, height - 0.5, height - 0.5],
                                 [1.0, 1.0, 1.0, 1.0]])
    if (corners[2] <= 1e-9).any():
        return array, matrix
    xs, ys = corners[0] / corners[2], corners[1] / corners[2]
    rows, cols = array.shape[:2]
    left = int(max(0, math.floor(xs.min()) - margin))
    top = int(max(0, math.floor(ys.min()) - margin))
    right = int(min(cols, math.ceil(xs.max()) + margin + 1))
    bottom = int(min(rows, math.ceil(ys.max()) + margin + 1))
    if right - left < 2 or bottom - top < 2 or (right - left) * (bottom - top) > 0.8 * rows * cols:
        return array, matrix
    shift = np.array([[1.0, 0.0, -left], [0.0, 1.0, -top], [0.0, 0.0, 1.0]])
    return array[top:bottom, left:right], shift @ matrix


#: Shrinking by this factor or more along both axes first box-reduces the input by a power of two
#: (at 2 the box filter's fixed phase costs the content oracle; the Gaussian alone keeps it).
_BOX_AT = 4.0


def _reduce(array: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """``array`` box-reduced by ``factor`` (a power of two) along both axes, and the map from the
    original's pixel centres to the reduced image's. Rows and columns that do not fill a box are dropped."""
    height, width = array.shape[0] // factor, array.shape[1] // factor
    reduced = cv2.resize(array[: height * factor, : width * factor], (width, height), interpolation=cv2.INTER_AREA)
    # Reduced pixel x covers original pixels [f x, f (x + 1)): its centre is f x + (f - 1) / 2.
    to_original = np.array([[factor, 0.0, (factor - 1) / 2], [0.0, factor, (factor - 1) / 2], [0.0, 0.0, 1.0]])
    return reduced, np.linalg.inv(to_original)


def _inside(matrix: np.ndarray, source_size: tuple[int, int], size: tuple[int, int]) -> np.ndarray | float:
    """Antialiased mask (H, W) float32 in [0, 1] of the pixels of an image of ``size`` whose centre
    ``matrix`` sends inside the pixel area of an image of ``source_size``; 1.0 / 0.0 when uniform.

    The four bounds, pulled back through the projective map, are lines in this image; a pixel's
    weight is its signed distance to them plus one half, clipped (the table's traced test is the
    same inequality at the pixel centre: weight > 1/2).
    """
    source_h, source_w = source_size
    bounds = np.array([[1.0, 0.0, 0.5], [-1.0, 0.0, source_w - 0.5], [0.0, 1.0, 0.5], [0.0, -1.0, source_h - 0.5]])
    planes = bounds @ matrix
    projective = abs(matrix[2, 0]) > 1e-15 or abs(matrix[2, 1]) > 1e-15
    if projective:
        planes = np.concatenate([planes, matrix[2:3]])  # w > 0: this side of the horizon
    height, width = size
    corners = np.array([[-0.5, width - 0.5, -0.5, width - 0.5], [-0.5, -0.5, height - 0.5, height - 0.5], [1, 1, 1, 1]])
    norms = np.maximum(np.hypot(planes[:, 0], planes[:, 1]), 1e-12)
    at_corners = (planes @ corners) / norms[:, None]
    if at_corners.min() >= 0.5:
        return 1.0
    if (at_corners.max(axis=1) <= -0.5).any():
        return 0.0
    xs = np.arange(width, dtype=np.float32)
    ys = np.arange(height, dtype=np.float32)[:, None]
    weight = None
    for (a, b, c), norm, values in zip(planes, norms, at_corners):
        if values.min() >= 0.5:
            continue  # this bound cuts nothing
        distance = np.float32(a / norm) * xs + (np.float32(b / norm) * ys + np.float32(c / norm + 0.5))
        weight = distance if weight is None else np.minimum(weight, distance)
    return np.clip(weight, 0.0, 1.0)


def _canvas_layer(canvas: Canvas, matrix: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The canvas seen through ``matrix`` from the pixels of an image of ``size``: a colour (3,) float32
    or uint8 (H, W, 3)."""
    if canvas.color is not None:
        return np.asarray(canvas.color, dtype=np.float32)
    spec = canvas.image
    if canvas.image_size is not None:  # the image is first resized to the canvas: compose that resize
        matrix = resize_matrix(image_size(spec), canvas.image_size) @ matrix
    if isinstance(spec, dict) and spec.get("kind") == "gradient":
        return _gradient(spec, matrix, size)
    if isinstance(spec, dict) and spec.get("kind") == "noise":
        return _noise(spec, matrix, size)
    if isinstance(spec, dict) and spec.get("kind") == "solid":
        return np.asarray(spec.get("color", (127, 127, 127)), dtype=np.float32)
    return _warp(np.asarray(resolve_image(spec)), matrix, size)


def _gradient(spec: dict, matrix: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``sources``' gradient image (the same seeded draws) seen through ``matrix``, evaluated analytically (it is linear in
    the background's coordinates): its parameter t at every pixel, then a 1024-entry colour table."""
    bg_h, bg_w = image_size(spec)
    start, end, angle = gradient_parameters(spec)
    start, end = start.astype(np.float64), end.astype(np.float64)
    cos, sin = math.cos(angle), math.sin(angle)
    corners = [x * cos + y * sin for x in (0.0, bg_w - 1.0) for y in (0.0, bg_h - 1.0)]
    low, span = min(corners), max(max(corners) - min(corners), 1e-6)
    # t = (cos * x_bg + sin * y_bg - low) / span, with (x_bg, y_bg, 1) ~ matrix @ (x, y, 1).
    row = np.array([cos, sin, -low]) @ matrix / span
    height, width = size
    xs = np.arange(width, dtype=np.float32)
    ys = np.arange(height, dtype=np.float32)[:, None]
    t = np.float32(row[0]) * xs + (np.float32(row[1]) * ys + np.float32(row[2]))
    if abs(matrix[2, 0]) > 1e-15 or abs(matrix[2, 1]) > 1e-15:
        t /= np.float32(matrix[2, 0]) * xs + (np.float32(matrix[2, 1]) * ys + np.float32(matrix[2, 2]))
    levels = np.clip(np.rint(start + np.linspace(0.0, 1.0, 1024)[:, None] * (end - start)), 0, 255).astype(np.uint8)
    return levels[np.clip(t * 1023 + 0.5, 0, 1023).astype(np.int32)]


def _noise(spec: dict, matrix: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``sources``' smooth noise image: its coarse grid warped (bicubic) straight to the mapped positions."""
    bg_h, bg_w = image_size(spec)
    coarse = noise_grid(spec)
    to_coarse = resize_matrix(coarse.shape[:2], (bg_h, bg_w))
    return _warp(coarse, to_coarse @ matrix, size, cv2.INTER_CUBIC)


def _render_run(run: _Run, image: np.ndarray, image_to_input: np.ndarray) -> np.ndarray:
    """The run's result at ``run.working`` from its input ``image`` (uint8 (h, w, 3)).

    ``image_to_input`` maps the pixels of ``image`` to the run's input frame (true size).
    """
    size = run.working
    to_frame = resize_matrix(run.output_size, size)  # working output -> the last stage's frame
    # Maps from the working output to each stage's output frame, last stage first.
    frames = [to_frame]
    for stage, _, _ in reversed(run.stages):
        frames.append(stage @ frames[-1])
    frames.reverse()  # frames[k]: to the input frame of stage k (k = 0..n-1); frames[n]: to the output frame
    content = np.ascontiguousarray(_warp(image, np.linalg.inv(image_to_input) @ frames[0], size))
    # Antialiased masks of the stages that show a canvas: where the stage's input is in sight.
    inputs = [run.input_size] + [stage_size for _, stage_size, _ in run.stages[:-1]]
    weights = {k: _inside(frames[k], inputs[k], size) for k, (_, _, canvas) in enumerate(run.stages)
               if canvas is not None}
    deferred = {}
    for position, edit, true_size in run.deferred:
        deferred.setdefault(position, []).append((edit, true_size))
    for k in range(len(run.stages) + 1):
        for edit, true_size in deferred.get(k, ()):
            # The pixels of the edit's image still in sight: inside every later stage's input.
            later = [w for j, w in weights.items() if j >= k and not isinstance(w, float)]
            visible = np.logical_and.reduce([w >= 0.5 for w in later]) if later else None
            content = edit.render_array(content, true_size, _axis_density(frames[k], size), visible)
        if k == len(run.stages) or k not in weights:
            continue
        weight = weights[k]
        canvas = run.stages[k][2]
        opacity = canvas.opacity if canvas.color is None else 1.0
        if isinstance(weight, float) and weight == 1.0 and opacity == 1.0:
            continue
        layer = _canvas_layer(canvas, frames[k + 1], size)
        if layer.ndim == 1:
            layer = np.broadcast_to(np.clip(np.rint(layer), 0, 255).astype(np.uint8), content.shape)
        if isinstance(weight, float) and weight * opacity == 0.0:  # the input is nowhere in sight
            content = np.ascontiguousarray(layer)
        elif isinstance(weight, float):  # in sight everywhere, blended over the canvas
            content = cv2.addWeighted(np.ascontiguousarray(content), opacity, np.ascontiguousarray(layer),
                                      1.0 - opacity, 0.0)
        else:
            if opacity < 1.0:
                weight = weight * np.float32(opacity)
            content = cv2.blendLinear(np.ascontiguousarray(content), np.ascontiguousarray(layer), weight,
                                      1.0 - weight)
    return content


# ---------------------------------------------------------------------------------------------- driver


def resize_image(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """The RGB ``image`` resized to ``(height, width)`` by fused rendering's resampler: an area-aligned
    resize (pixel centres, as ``Image.resize``), antialiased when it shrinks. Three to four times
    faster than Pillow's bilinear resize on photographs; the pixels differ from it by resampling only."""
    if image.mode != "RGB":
        raise ValueError(f"resize_image needs an RGB image, got mode {image.mode!r}")
    size = (int(size[0]), int(size[1]))
    array = np.asarray(image)
    return Image.fromarray(_warp(array, resize_matrix(array.shape[:2], size), size), "RGB")


def render_fused(image: Image.Image, edits: Sequence[Edit]) -> tuple[Image.Image, CoordinateTable]:
    """Apply ``edits`` to the RGB ``image`` with fused geometry: ``(edited image, table)``.

    The table is the one edit-by-edit application gives, bit for bit; the image differs from it
    by resampling only (one bilinear, antialiased resampling per run of geometric edits).
    """
    table = CoordinateTable.identity(image.height, image.width)
    current: Image.Image | np.ndarray = image  # the image so far (PIL or uint8 (h, w, 3)), at its working size
    to_true = np.eye(3)  # working pixels -> true pixels of the current image
    for item in _plan(edits, (image.height, image.width)):
        if isinstance(item, _Run):
            first = 0
            for edit, count in zip(item.edits, item.counts):  # the edits' own table updates
                table = edit.trace(table, [(matrix, size) for matrix, size, _ in item.stages[first:first + count]])
                first += count
            pixels = current if isinstance(current, np.ndarray) else np.asarray(current)
            if item.stages or item.deferred or item.working != pixels.shape[:2]:
                current = _render_run(item, pixels, to_true)
                to_true = resize_matrix(item.output_size, item.working)
            continue
        edit, true_size = item
        if edit.scaling == "relative" and edit.kind == "occluding":  # at the working resolution (maybe the true one)
            pixels = current if isinstance(current, np.ndarray) else np.asarray(current)
            current, coverage = _overlay_at(edit, pixels, true_size)
            table = table.occlude(edit.untraced(coverage))  # what ``OccludingEdit.apply`` does, at the true size
        elif edit.kind == "photometric":  # relative ones at the working resolution, others at their true size
            pixels = current if isinstance(current, np.ndarray) else np.asarray(current)
            current = edit.render_array(np.ascontiguousarray(pixels), true_size)
        else:  # planned at its true size: exactly as edit by edit
            if isinstance(current, np.ndarray):
                current = Image.fromarray(current, "RGB")
            current, table = edit(current, table)
            to_true = np.eye(3)
    if isinstance(current, np.ndarray):
        current = Image.fromarray(current, "RGB")
    if (current.height, current.width) != table.size:
        raise AssertionError(f"fused rendering produced {current.size} for a table of size {table.size}")
    return current, table
