"""Token affinity and affinity entropy maps of a query-reference pair (interpreting a match).

Paper section "Visualization and Interpretability": for a probe patch i of the query, the
token affinity heatmap is ``p_ij = softmax_j(cos(z^q_i, z^r_j) / tau)`` over the reference
patches j; the affinity entropy of every query patch is ``E_i = -sum_j p_ij log p_ij``
(equation "affinity entropy"). With a CopyNCE model the probe's heatmap peaks at the copied
location and low-entropy query patches outline the copied region.

Tokens come from the descriptor's CopyNCE layer (query and reference encoded separately)
or from the matcher's fusion output (query and reference encoded jointly).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..images import load_image
from ..metrics.plots import save_figure
from ..modeling.configuration_copynce import model_kind
from ..modeling.errors import ConfigError
from ..modeling.losses_copynce import affinity_entropy, token_affinity_logits


@dataclass
class AffinityMaps:
    """Maps of one pair at the model's input resolution.

    Attributes:
        query_image, reference_image: the images resized to the model input (W, H).
        patch: (row, col) of the probe query patch.
        affinity: (h_r, w_r) float32, the probe's ``p_ij`` over the reference patch grid; sums to 1.
        entropy: (h_q, w_q) float32, ``E_i`` of every query patch, in nats, in [0, log(L_r)].
        patch_size: pixels per patch side.
        score: the pair's score from the same forward pass: a matcher's copy probability ``sigmoid(logit)``, a
            descriptor's cosine of the two descriptors (``None`` where the model gives neither).
        score_name: what ``score`` is: ``"copy probability"`` or ``"descriptor cosine"``.
    """

    query_image: Image.Image
    reference_image: Image.Image
    patch: tuple[int, int]
    affinity: np.ndarray
    entropy: np.ndarray
    patch_size: int
    score: float | None = None
    score_name: str | None = None


def _grid(pixel_values: torch.Tensor, patch_size: int, tokens: torch.Tensor) -> tuple[int, int]:
    height, width = pixel_values.shape[-2] // patch_size, pixel_values.shape[-1] // patch_size
    if height * width != tokens.shape[1]:
        raise ConfigError(f"{tokens.shape[1]} patch tokens do not form the {height}x{width} patch grid of the input")
    return height, width


@torch.inference_mode()
def affinity_maps(
    model,
    image_processor,
    query,
    reference,
    patch: tuple[int, int] | None = None,
    temperature: float | None = None,
) -> AffinityMaps:
    """Compute the probe's token affinity heatmap and the affinity entropy map of a pair.

    Args:
        model: a CopyNCE descriptor or matcher (PyTorch, or its ONNX Runtime form).
        image_processor: its image processor.
        query, reference: image paths or PIL images.
        patch: (row, col) of the probe patch in the query's patch grid; ``None``: the most
            confident query patch, the one of lowest affinity entropy (first in row-major order on ties).
        temperature: ``tau``; ``None`` uses the model's ``copynce_temperature`` (1/16).
    """
    tau = float(temperature if temperature is not None else getattr(model.config, "copynce_temperature", 1 / 16))
    if tau <= 0:
        raise ConfigError(f"temperature must be positive, got {tau}")
    query_image, reference_image = load_image(query), load_image(reference)
    pixels = image_processor(images=[query_image, reference_image], return_tensors="pt")["pixel_values"]
    pixels = pixels.to(model.device)
    model.eval()
    query_tokens, reference_tokens, score, score_name = _tokens_and_score(model, pixels)
    patch_size = int(model.config.patch_size)
    query_grid = _grid(pixels, patch_size, query_tokens)
    reference_grid = _grid(pixels, patch_size, reference_tokens)
    entropy = affinity_entropy(query_tokens, reference_tokens, tau)[0].float().cpu().numpy().reshape(query_grid)
    if patch is None:
        row, col = (int(v) for v in np.unravel_index(int(np.argmin(entropy)), query_grid))
    else:
        row, col = (int(v) for v in patch)
    if not (0 <= row < query_grid[0] and 0 <= col < query_grid[1]):
        raise ConfigError(
            f"patch {row},{col} is outside the query's {query_grid[0]}x{query_grid[1]} patch grid "
            f"(rows and columns count from 0)"
        )
    # p_ij of the probe i over the reference patches j
    probabilities = torch.softmax(token_affinity_logits(query_tokens, reference_tokens, tau), dim=-1)
    affinity = probabilities[0, row * query_grid[1] + col].float().cpu().numpy().reshape(reference_grid)
    size = (pixels.shape[-1], pixels.shape[-2])
    return AffinityMaps(
        query_image.resize(size, Image.Resampling.BICUBIC),
        reference_image.resize(size, Image.Resampling.BICUBIC),
        (row, col),
        affinity.astype(np.float32),
        entropy.astype(np.float32),
        patch_size,
        score,
        score_name if score is not None else None,
    )


def _tokens_and_score(model, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float | None, str]:
    """One forward pass of the pair ``pixels`` (2, 3, H, W), query first: the query's and the reference's patch
    tokens (1, L, C) each, and the pair's score with its name: a matcher's ``sigmoid(logit)``, "copy probability",
    or a descriptor's cosine of the two unit-norm descriptors, "descriptor cosine" (``None`` where the output has
    neither)."""
    if model_kind(model) == "matcher":
        output = model(pixel_values=pixels[:1], reference_pixel_values=pixels[1:])
        logits = getattr(output, "logits", None)
        score = None if logits is None else torch.sigmoid(logits.float()[0]).item()
        return output.query_patch_tokens, output.reference_patch_tokens, score, "copy probability"
    output = model(pixel_values=pixels)
    found = getattr(output, "descriptors", None)  # (2, D), unit norm
    score = None if found is None else (found[0].float() @ found[1].float()).item()
    return output.patch_tokens[:1], output.patch_tokens[1:], score, "descriptor cosine"


def affinity_figures(maps: AffinityMaps, title: str = ""):
    """The two matplotlib figures of a pair: ``(token affinity, affinity entropy)``.

    Token affinity: the query with the probe patch boxed in green, and the reference overlaid
    with the probe's affinity heatmap. Affinity entropy: the query overlaid with its entropy map
    (low entropy, i.e. likely copied, drawn bright).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    width, height = maps.query_image.size
    extent = (0, width, height, 0)

    # constrained layout, and each colorbar under its image: titles never run into a colorbar or another
    # plot, whatever the images' aspect ratio (a colorbar beside an image is as tall as its cell, not
    # the image, and reached up into the title)
    affinity_figure = Figure(figsize=(8, 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(affinity_figure)
    left, right = affinity_figure.subplots(1, 2)
    left.imshow(maps.query_image, extent=extent)
    row, col = maps.patch
    left.add_patch(
        Rectangle((col * maps.patch_size, row * maps.patch_size), maps.patch_size, maps.patch_size,
                  fill=False, edgecolor=(0, 1, 0), linewidth=2)
    )
    left.set_title(f"query, probe patch {row},{col}")
    right.imshow(maps.reference_image, extent=extent)
    shown = right.imshow(maps.affinity, extent=extent, cmap="jet", alpha=0.5, interpolation="bilinear")
    right.set_title("reference: affinity of the probe")
    affinity_figure.colorbar(shown, ax=right, location="bottom", fraction=0.05, pad=0.02)
    for axes in (left, right):
        axes.set_axis_off()
    if title:
        affinity_figure.suptitle(title)

    entropy_figure = Figure(figsize=(5, 5.2), dpi=110, layout="constrained")
    FigureCanvasAgg(entropy_figure)
    axes = entropy_figure.subplots(1, 1)
    axes.imshow(maps.query_image, extent=extent)
    shown = axes.imshow(maps.entropy, extent=extent, cmap="viridis_r", alpha=0.6, interpolation="nearest")
    axes.set_title("query: affinity entropy (low = copied)")
    axes.set_axis_off()
    entropy_figure.colorbar(shown, ax=axes, location="bottom", fraction=0.05, pad=0.02, label="nats")
    return affinity_figure, entropy_figure


def save_affinity_figures(maps: AffinityMaps, folder: str | os.PathLike, title: str = "") -> dict[str, Path]:
    """Write ``token_affinity.png``, ``affinity_entropy.png`` and ``maps.npz`` into ``folder``.

    The PNGs are the figures of :func:`affinity_figures`; ``maps.npz`` holds the raw
    ``affinity`` and ``entropy`` arrays.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    affinity_figure, entropy_figure = affinity_figures(maps, title)
    affinity_path = folder / "token_affinity.png"
    save_figure(affinity_figure, affinity_path, bbox_inches="tight")
    entropy_path = folder / "affinity_entropy.png"
    save_figure(entropy_figure, entropy_path, bbox_inches="tight")

    return {"token_affinity": affinity_path, "affinity_entropy": entropy_path, "maps": save_map_arrays(maps, folder)}


def save_map_arrays(maps: AffinityMaps, folder: Path) -> Path:
    """Write ``maps.npz`` into ``folder``: the raw ``affinity`` and ``entropy`` arrays and the probe ``patch``."""
    path = folder / "maps.npz"
    np.savez(path, affinity=maps.affinity, entropy=maps.entropy, patch=np.array(maps.patch))
    return path


def visualize_pair(query: str | os.PathLike, reference: str | os.PathLike, output: str | os.PathLike,
                   patch: tuple[int, int], model: str | os.PathLike | None = None, temperature: float | None = None,
                   max_pixels: int | None = None) -> tuple[dict[str, Path], AffinityMaps]:
    """``copynce visualize`` as one call: the maps of the query patch ``patch`` (row, column) over ``reference``
    with ``model`` (a descriptor or matcher folder or Hub id; ``None``: the embedded matcher, whose score is the
    pair's copy probability), written into the folder ``output`` (:func:`save_affinity_figures`, moved into place
    once complete). The output and the model are checked before any image is read. Returns the files written, by
    name (``token_affinity``, ...), and the maps (with the pair's score: :attr:`AffinityMaps.score`)."""
    from ..outputs import StagedFolder, check_output_folder
    from ..runtime.loading import DEFAULT_MATCHER, check_model_path, load_model

    check_output_folder(output)
    check_model_path(model)
    images = [load_image(path, max_pixels=max_pixels) for path in (query, reference)]
    loaded, processor = load_model(model, None, "--model", default=DEFAULT_MATCHER)
    maps = affinity_maps(loaded, processor, *images, patch, temperature=temperature)
    with StagedFolder(output) as staging:
        written = save_affinity_figures(maps, staging, title=f"{Path(query).name} vs {Path(reference).name}")
    return {key: Path(output) / path.name for key, path in written.items()}, maps
