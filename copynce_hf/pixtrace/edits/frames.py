"""Procedural app frames: the screenshot-like templates a photo is shown in (a feed post, a chat, a story).

A frame is drawn from ``(style, seed)`` at any size, deterministically: its layout (where the photo goes, the
colours, the user name, the caption) is in fractions of the frame, so the same frame drawn for two photos of
different sizes looks the same. The photo box is filled with the frame's own colour; a photo pasted into it
(:class:`~copynce_hf.pixtrace.edits.PasteIntoBox`) covers part of it, and every pixel of the frame maps to
nowhere in the photo's table. Image spec: ``{"kind": "frame", "style": "post", "seed": 3, "size": [h, w]}``.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ...modeling.errors import EditParameterError

#: The frame styles: a social-media feed post, a phone chat with the photo in a message, a full-screen story.
FRAME_STYLES = ("post", "chat", "story")

#: The fonts of the frames' text (AugLy's bundled fonts).
FRAME_FONTS = ("IBMPlexSans-Bold.ttf", "Raleway-ExtraBold.ttf", "OpenSans-Regular.ttf", "Montserrat-Medium.ttf")
_WORDS = ("look", "this", "today", "wow", "new", "best", "photo", "friends", "weekend", "again", "love", "view",
          "morning", "city", "trip", "home", "story", "share", "amazing", "finally", "who", "else", "remember")


@dataclasses.dataclass(frozen=True)
class FrameLayout:
    """A frame's layout in fractions of the frame: ``aspect`` (height / width), the photo ``box`` (top, left,
    height, width), the ``background``, ``ink`` (text) and ``box_fill`` colours, the ``accent`` colour, the
    user ``name`` and the ``caption``."""

    style: str
    aspect: float
    box: tuple[float, float, float, float]
    background: tuple[int, int, int]
    ink: tuple[int, int, int]
    box_fill: tuple[int, int, int]
    accent: tuple[int, int, int]
    name: str
    caption: str


def _words(rng: np.random.Generator, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS, size=int(rng.integers(low, high + 1))).tolist())


@functools.cache
def frame_layout(style: str, seed: int) -> FrameLayout:
    """The layout of frame ``(style, seed)``: a light or dark theme, the photo box and the texts."""
    if style not in FRAME_STYLES:
        raise EditParameterError(f"frame style {style!r} is not one of {FRAME_STYLES}")
    rng = np.random.default_rng([int(seed), 0xF4A3E])
    dark = bool(rng.random() < 0.4)
    background = tuple(int(v) for v in (rng.integers(10, 45, 3) if dark else rng.integers(232, 256, 3)))
    ink = (235, 235, 235) if dark else (25, 25, 25)
    box_fill = tuple(int(v) for v in (rng.integers(0, 30, 3) if dark else rng.integers(200, 245, 3)))
    accent = tuple(int(v) for v in rng.integers(30, 230, 3))
    name = "".join(rng.choice(list("abcdefghijklmnoprstuvwy_"), size=int(rng.integers(5, 12))).tolist())
    if style == "post":  # header, photo, icon row, caption
        aspect = float(rng.uniform(1.15, 1.6))
        top = float(rng.uniform(0.08, 0.14))
        height = float(rng.uniform(0.55, 0.68))
        box = (top, 0.0 if rng.random() < 0.6 else 0.04, height, 1.0)
        box = (box[0], box[1], box[2], 1.0 - 2 * box[1])
    elif style == "chat":  # message bubbles around a photo message
        aspect = float(rng.uniform(1.6, 2.1))
        width = float(rng.uniform(0.55, 0.7))
        left = 0.05 if rng.random() < 0.5 else 0.95 - width
        box = (float(rng.uniform(0.3, 0.42)), left, float(rng.uniform(0.28, 0.36)), width)
    else:  # story: a full-width photo between a progress bar and a reply box
        aspect = float(rng.uniform(1.7, 2.0))
        box = (float(rng.uniform(0.12, 0.2)), 0.0, float(rng.uniform(0.5, 0.62)), 1.0)
    return FrameLayout(style, aspect, box, background, ink, box_fill, accent, name, _words(rng, 3, 9))


@functools.lru_cache(maxsize=128)
def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    from augly.utils import FONTS_DIR

    return ImageFont.truetype(os.path.join(FONTS_DIR, name), max(6, size))


def draw_frame(style: str, seed: int, size: tuple[int, int]) -> Image.Image:
    """Frame ``(style, seed)`` drawn at ``size`` = (H, W) pixels (RGB), its photo box filled with ``box_fill``."""
    layout = frame_layout(style, seed)
    height, width = size
    frame = Image.new("RGB", (width, height), layout.background)
    draw = ImageDraw.Draw(frame)
    font = _font(FRAME_FONTS[int(seed) % len(FRAME_FONTS)], round(0.045 * width))
    top, left, box_h, box_w = layout.box
    box = (round(left * width), round(top * height), round((left + box_w) * width), round((top + box_h) * height))
    unit = max(2, round(0.06 * width))  # avatar and icon size
    if style == "post":
        _draw_post(draw, layout, box, unit, font, width, height)
    elif style == "chat":
        _draw_chat(draw, layout, box, unit, font, width, height)
    else:
        _draw_story(draw, layout, box, unit, font, width, height)
    draw.rectangle((box[0], box[1], box[2] - 1, box[3] - 1), fill=layout.box_fill)
    return frame


def _draw_post(draw, layout: FrameLayout, box, unit, font, width, height) -> None:
    header = box[1]
    cy = header // 2
    draw.ellipse((unit // 2, cy - unit // 2, unit // 2 + unit, cy + unit // 2), fill=layout.accent)
    draw.text((2 * unit, cy), layout.name, font=font, fill=layout.ink, anchor="lm")
    for i in range(3):  # the "more" dots
        x = width - unit + i * max(2, unit // 5)
        draw.ellipse((x, cy - 1, x + 2, cy + 1), fill=layout.ink)
    icons = box[3] + unit
    for i in range(3):  # like, comment, share
        x = unit // 2 + i * 2 * unit
        if i == 0:
            draw.ellipse((x, icons - unit // 2, x + unit, icons + unit // 2), outline=layout.ink, width=2)
        elif i == 1:
            draw.rectangle((x, icons - unit // 2, x + unit, icons + unit // 2), outline=layout.ink, width=2)
        else:
            draw.polygon([(x, icons + unit // 2), (x + unit, icons), (x, icons - unit // 2)], outline=layout.ink)
    draw.text((unit // 2, icons + unit), f"{layout.name} {layout.caption}", font=font, fill=layout.ink)
    draw.text((unit // 2, min(height - unit, icons + 2 * unit)), "view all comments", font=font, fill=layout.accent)


def _draw_chat(draw, layout: FrameLayout, box, unit, font, width, height) -> None:
    draw.rectangle((0, 0, width, round(0.08 * height)), fill=layout.accent)
    draw.text((2 * unit, round(0.04 * height)), layout.name, font=font, fill=(255, 255, 255), anchor="lm")
    bubble = round(0.07 * height)
    for i, y in enumerate((round(0.12 * height), round(0.2 * height), box[3] + unit, box[3] + unit + bubble + unit)):
        mine = i % 2 == 1
        x0 = width // 3 if mine else unit // 2
        draw.rounded_rectangle((x0, y, x0 + width // 2 + unit, y + bubble), radius=unit // 2,
                               fill=layout.accent if mine else layout.box_fill)
        draw.text((x0 + unit // 2, y + bubble // 2), _words(np.random.default_rng([len(layout.name), i]), 2, 4),
                  font=font, fill=layout.ink, anchor="lm")
    pad = max(2, unit // 4)
    draw.rounded_rectangle((box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad), radius=unit // 2,
                           fill=layout.accent)
    draw.rounded_rectangle((unit // 2, height - 2 * unit, width - unit // 2, height - unit // 2), radius=unit // 2,
                           outline=layout.ink, width=2)


def _draw_story(draw, layout: FrameLayout, box, unit, font, width, height) -> None:
    bar = max(2, unit // 6)
    for i in range(4):  # progress segments
        x0 = unit // 2 + i * (width - unit) // 4
        draw.rectangle((x0, unit // 2, x0 + (width - unit) // 4 - bar, unit // 2 + bar),
                       fill=layout.ink if i < 2 else layout.box_fill)
    draw.ellipse((unit // 2, 1.2 * unit, 1.5 * unit, 2.2 * unit), fill=layout.accent)
    draw.text((2 * unit, 1.7 * unit), layout.name, font=font, fill=layout.ink, anchor="lm")
    draw.text((unit // 2, box[3] + unit // 2), layout.caption, font=font, fill=layout.ink)
    draw.rounded_rectangle((unit // 2, height - 2 * unit, width - 2 * unit, height - unit // 2), radius=unit,
                           outline=layout.ink, width=2)
    draw.ellipse((width - 1.6 * unit, height - 1.8 * unit, width - 0.6 * unit, height - 0.8 * unit),
                 outline=layout.ink, width=2)
