"""A match gallery's pictures of a pair's maps: the token affinity and affinity entropy maps of
:class:`~.affinity.AffinityMaps` laid over the images with Pillow, a colour scale and a caption with each.

The same maps as :func:`~.affinity.affinity_figures` draws with matplotlib, in the same colours (the probe's
affinity in ``jet`` over the reference, the entropy in ``viridis_r`` over the query), drawn in milliseconds rather
than the tenth of a second a laid-out matplotlib figure takes: a report has sixteen cards. The card around them names
the pair, so the pictures carry no ids, only ASCII labels.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .affinity import AffinityMaps, save_map_arrays

__all__ = ["PANEL_SIDE", "affinity_panels", "save_affinity_panels"]

#: The longer side of each image in a picture, in pixels (the maps' images are at the model's input size).
PANEL_SIDE = 224
_GAP, _SCALE_HEIGHT, _FONT_SIZE = 8, 10, 12
_BACKGROUND, _TEXT, _PROBE = (255, 255, 255), (34, 34, 34), (0, 255, 0)


def _colours(name: str) -> np.ndarray:
    """(256, 3) uint8: matplotlib's colour map ``name`` sampled at 256 levels."""
    from matplotlib import colormaps

    return (colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3] * 255).round().astype(np.uint8)


def _levels(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """(h, w) values -> (h, w) uint8 levels of ``[low, high]`` (one level where the map is flat)."""
    span = high - low
    scaled = (values - low) / span if span > 0 else np.zeros_like(values)
    return (np.clip(scaled, 0.0, 1.0) * 255).round().astype(np.uint8)


def _panel(image: Image.Image) -> Image.Image:
    """``image`` scaled so that its longer side is :data:`PANEL_SIDE`."""
    scale = PANEL_SIDE / max(image.size)
    return image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                                       Image.Resampling.BICUBIC)


def _overlaid(image: Image.Image, values: np.ndarray, colours: np.ndarray, alpha: float,
              resample: Image.Resampling) -> Image.Image:
    """``image`` (a panel) with the (h, w) map ``values`` coloured over it at opacity ``alpha``, stretched to it."""
    heat = Image.fromarray(colours[_levels(values, float(values.min()), float(values.max()))]).resize(image.size,
                                                                                                      resample)
    return Image.blend(image, heat, alpha)


def _scale(width: int, colours: np.ndarray, low: float, high: float, unit: str, font) -> Image.Image:
    """A horizontal colour scale ``width`` pixels wide, its ends labelled ``low`` and ``high`` (with ``unit``)."""
    strip = Image.fromarray(np.repeat(colours[np.linspace(0, 255, width).round().astype(int)][None], _SCALE_HEIGHT, 0))
    scale = Image.new("RGB", (width, _SCALE_HEIGHT + _FONT_SIZE + 4), _BACKGROUND)
    scale.paste(strip, (0, 0))
    draw = ImageDraw.Draw(scale)
    draw.text((0, _SCALE_HEIGHT + 2), f"{low:.3g}", fill=_TEXT, font=font)
    right = f"{high:.3g}{(' ' + unit) if unit else ''}"
    draw.text((width - draw.textlength(right, font=font), _SCALE_HEIGHT + 2), right, fill=_TEXT, font=font)
    return scale


def _picture(panels: list[Image.Image], captions: list[str], scale: Image.Image, font) -> Image.Image:
    """Panels side by side, each with its caption above, and ``scale`` under the last."""
    line = _FONT_SIZE + 4
    width = sum(panel.width for panel in panels) + _GAP * (len(panels) + 1)
    height = line + max(panel.height for panel in panels) + _GAP + scale.height + _GAP
    picture = Image.new("RGB", (width, height), _BACKGROUND)
    draw, left = ImageDraw.Draw(picture), _GAP
    for panel, caption in zip(panels, captions):
        draw.text((left, 2), caption, fill=_TEXT, font=font)
        picture.paste(panel, (left, line))
        left += panel.width + _GAP
    picture.paste(scale, (left - _GAP - scale.width, line + max(panel.height for panel in panels) + _GAP))
    return picture


def affinity_panels(maps: AffinityMaps) -> tuple[Image.Image, Image.Image]:
    """``(token affinity, affinity entropy)`` pictures of a pair's maps (RGB).

    Token affinity: the query with the probe patch boxed in green beside the reference overlaid with the probe's
    affinity ``p_ij`` (``jet``, opacity 0.5, bilinear). Each map's colours span its own smallest to largest value,
    as its scale shows. Affinity entropy: the
    query overlaid with ``E_i`` (``viridis_r``: low entropy, likely copied, bright; opacity 0.6, one colour per
    patch), in nats.
    """
    font = ImageFont.load_default(size=_FONT_SIZE)
    query, reference = _panel(maps.query_image), _panel(maps.reference_image)
    scale_x, scale_y = query.width / maps.query_image.width, query.height / maps.query_image.height
    row, col = maps.patch
    boxed = query.copy()
    ImageDraw.Draw(boxed).rectangle((col * maps.patch_size * scale_x, row * maps.patch_size * scale_y,
                                     (col + 1) * maps.patch_size * scale_x - 1,
                                     (row + 1) * maps.patch_size * scale_y - 1), outline=_PROBE, width=2)
    jet, viridis = _colours("jet"), _colours("viridis_r")
    affinity = _picture(
        [boxed, _overlaid(reference, maps.affinity, jet, 0.5, Image.Resampling.BILINEAR)],
        [f"query, probe patch {row},{col}", "reference: affinity of the probe"],
        _scale(reference.width, jet, float(maps.affinity.min()), float(maps.affinity.max()), "", font), font)
    entropy = _picture(
        [_overlaid(query, maps.entropy, viridis, 0.6, Image.Resampling.NEAREST)],
        ["query: affinity entropy (low = copied)"],
        _scale(query.width, viridis, float(maps.entropy.min()), float(maps.entropy.max()), "nats", font), font)
    return affinity, entropy


def save_affinity_panels(maps: AffinityMaps, folder: str | os.PathLike) -> dict[str, Path]:
    """Write ``token_affinity.png`` and ``affinity_entropy.png`` (:func:`affinity_panels`) and ``maps.npz`` (the raw
    maps, :func:`~.affinity.save_map_arrays`) into ``folder``; returns their paths by name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, picture in zip(("token_affinity", "affinity_entropy"), affinity_panels(maps)):
        written[name] = folder / f"{name}.png"
        picture.save(written[name], compress_level=1)  # fast: the default level takes most of the time
    return {**written, "maps": save_map_arrays(maps, folder)}
