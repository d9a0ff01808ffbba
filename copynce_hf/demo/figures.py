"""Figures of the demo report: the PixTrace overlap prior of a query and its true reference.

The token affinity and affinity entropy figures come from
:func:`copynce_hf.reports.affinity.save_affinity_figures`; the precision-recall curves from
:func:`copynce_hf.metrics.plots.save_pr_curves`. This module draws the third kind: what PixTrace
knows about a copy pair (paper, section "PixTrace Pipeline"), at the model's input resolution.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from ..metrics.plots import save_figure

__all__ = ["figure_image", "overlap_figure", "save_overlap_figure", "save_thumbnail"]


def overlap_figure(
    query_image: Image.Image,
    reference_image: Image.Image,
    overlap_qr: np.ndarray,
    patch: tuple[int, int],
    patch_size: int,
    title: str = "",
):
    """Draw the overlap prior of a pair as two heatmaps: a matplotlib ``Figure``.

    Args:
        query_image, reference_image: both resized to the model input (W, H).
        overlap_qr: float32 (L_q, L_r), the prior ``q-hat`` of :func:`copynce_hf.pixtrace.pair_overlaps`.
        patch: (row, col) of the probe query patch.
        patch_size: pixels per patch side.

    Left: the query, each patch shaded by the fraction of its pixels copied from the reference
    (row sums of the prior; 0 = overlay, background or padding). Right: the reference, shaded by
    the probe patch's prior row: where the probe's pixels came from (compare with the matcher's
    token affinity of the same probe).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    width, height = query_image.size
    query_grid = (height // patch_size, width // patch_size)
    ref_width, ref_height = reference_image.size
    reference_grid = (ref_height // patch_size, ref_width // patch_size)
    copied = overlap_qr.sum(axis=1).reshape(query_grid)
    row, col = patch
    probe = overlap_qr[row * query_grid[1] + col].reshape(reference_grid)

    # constrained layout and colorbars under the images: no title runs into a colorbar or the other plot
    figure = Figure(figsize=(8, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    left.imshow(query_image, extent=(0, width, height, 0))
    shown = left.imshow(copied, extent=(0, width, height, 0), cmap="magma", alpha=0.55, vmin=0.0, vmax=1.0,
                        interpolation="nearest")
    left.add_patch(Rectangle((col * patch_size, row * patch_size), patch_size, patch_size, fill=False,
                             edgecolor=(0, 1, 0), linewidth=2))
    left.set_title("query: copied fraction per patch")
    figure.colorbar(shown, ax=left, location="bottom", fraction=0.05, pad=0.02)
    right.imshow(reference_image, extent=(0, ref_width, ref_height, 0))
    shown = right.imshow(probe, extent=(0, ref_width, ref_height, 0), cmap="jet", alpha=0.5, vmin=0.0,
                         vmax=max(float(probe.max()), 1e-6), interpolation="nearest")
    right.set_title(f"reference: prior of probe {row},{col}")
    figure.colorbar(shown, ax=right, location="bottom", fraction=0.05, pad=0.02)
    for axes in (left, right):
        axes.set_axis_off()
    if title:
        figure.suptitle(title)
    return figure


def save_overlap_figure(
    query_image: Image.Image,
    reference_image: Image.Image,
    overlap_qr: np.ndarray,
    patch: tuple[int, int],
    patch_size: int,
    path: str | Path,
    title: str = "",
) -> Path:
    """Write the :func:`overlap_figure` of a pair as a PNG at ``path``."""
    figure = overlap_figure(query_image, reference_image, overlap_qr, patch, patch_size, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path, bbox_inches="tight")
    return path


def figure_image(figure) -> Image.Image:
    """A matplotlib figure rendered to an RGB PIL image (tight bounding box, the figure's dpi)."""
    buffer = io.BytesIO()
    save_figure(figure, buffer, format="png", bbox_inches="tight")
    buffer.seek(0)
    with Image.open(buffer) as image:
        return image.convert("RGB")


def save_thumbnail(image: Image.Image, path: str | Path, max_side: int = 160) -> Path:
    """A PNG thumbnail whose longer side is at most ``max_side`` pixels."""
    thumbnail = image.convert("RGB")
    thumbnail.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    thumbnail.save(path)
    return path
