"""The templates of the template benchmark (:mod:`benchmarks.templates.systems`): images that many unrelated photos share.

Four kinds, each drawn here from a seed (never AugLy's bundled screenshot templates, which training may use):

* ``screenshot``: a social-media post frame drawn with Pillow, in one of three designs (a light photo post, a
  dark phone screen, a text post card): a header bar with an avatar circle and a user name, the photo box, an
  icon row and caption lines;
* ``meme``: a caption band above the photo (``MemeFormat``), or above and below it, the same caption for every
  photo of the template;
* ``background``: the photo pasted into one region of the same background photo;
* ``overlay``: the same text and emoji drawn over the photo.

A photo goes into a template through PixTrace edits (:meth:`Template.edits`: ``PasteIntoBox`` with the frame or
background as an image file, ``Resize`` + ``MemeFormat``, ``OverlayText``, ``OverlayEmoji``), so that every
image's construction is a replayable, traced list of edits. Frames and backgrounds are written as PNG files
into the task's folder and named by ``{"kind": "file", "path": ...}`` specs.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from copynce_hf.pixtrace.edits import (
    Edit,
    MemeFormat,
    OverlayEmoji,
    OverlayText,
    PasteIntoBox,
    Resize,
)
from copynce_hf.pixtrace.edits.occluding import emoji_names, text_ink_box

__all__ = ["TEMPLATE_KINDS", "Template", "make_templates", "fit_box", "caption_font"]

#: The kinds of template, in the order :func:`make_templates` draws them.
TEMPLATE_KINDS = ("screenshot", "meme", "background", "overlay")
#: The screenshot frame designs, drawn in turn.
FRAME_DESIGNS = ("light post", "dark screen", "text card")
#: Words of the drawn user names and captions.
WORDS = ("sunny", "river", "coffee", "weekend", "mood", "travel", "daily", "vibes", "happy", "wild", "city",
         "summer", "forest", "ocean", "friends", "family", "morning", "golden", "hour", "nature", "story",
         "little", "best", "moment", "photo", "dump", "throwback", "road", "trip", "home", "garden", "night",
         "look", "at", "this", "finally", "today", "love", "never", "forget", "when", "you", "see", "it",
         "my", "new", "favourite", "thing", "guess", "what", "happened", "again", "no", "way")
#: Caption fonts (AugLy's bundled fonts folder).
REGULAR, BOLD = "IBMPlexSans-Regular.ttf", "IBMPlexSans-Bold.ttf"


@dataclasses.dataclass(frozen=True)
class Template:
    """One template: a ``kind`` of :data:`TEMPLATE_KINDS` and what puts a photo into it.

    Attributes:
        id: ``<prefix><kind>-<n>``.
        kind: the template kind.
        description: how it looks, in words (the design, the caption).
        canvas: (height, width) of the frame or background image (screenshot, background), else ``None``.
        area: (left, top, width, height) of the region the photo is fitted into (screenshot, background).
        image_file: the frame or background PNG (screenshot, background), else ``None``.
        texts: the caption texts (meme: top and, for a two-band meme, bottom; overlay: the drawn text).
        style: the kind's other settings (meme width, band heights, colours; overlay positions, emoji).
    """

    id: str
    kind: str
    description: str
    canvas: tuple[int, int] | None = None
    area: tuple[int, int, int, int] | None = None
    image_file: str | None = None
    texts: tuple[str, ...] = ()
    style: dict = dataclasses.field(default_factory=dict)

    def edits(self, height: int, width: int) -> list[Edit]:
        """The PixTrace edits that put a ``height`` x ``width`` photo into this template."""
        if self.kind in ("screenshot", "background"):
            left, top, box_width, box_height = fit_box((height, width), self.area)
            return [PasteIntoBox(background={"kind": "file", "path": self.image_file}, canvas_height=self.canvas[0],
                                 canvas_width=self.canvas[1], left=left, top=top, box_height=box_height,
                                 box_width=box_width)]
        if self.kind == "meme":
            return self._meme_edits(height, width)
        style = self.style
        return [OverlayText(text=self.texts[0], font=BOLD, font_size=style["font_size"], color=style["color"],
                            x=style["x"], y=style["y"]),
                OverlayEmoji(emoji=style["emoji"], size=style["emoji_size"], x=style["emoji_x"], y=style["emoji_y"])]

    def _meme_edits(self, height: int, width: int) -> list[Edit]:
        """Resize to the template's width, the top band (``MemeFormat``), and for a two-band meme the bottom band
        (the canvas grown with ``PasteIntoBox`` onto a flat colour, the caption drawn with ``OverlayText``)."""
        style = self.style
        meme_width, band, colour = style["width"], style["band"], tuple(style["background"])
        photo_height = max(1, round(height * meme_width / width))
        edits: list[Edit] = [Resize(height=photo_height, width=meme_width),
                             MemeFormat(text=self.texts[0], caption_height=band, text_color=tuple(style["ink"]),
                                        bg_color=colour)]
        if len(self.texts) < 2:
            return edits
        top_part, total = photo_height + band, photo_height + 2 * band
        edits.append(PasteIntoBox(background={"kind": "solid", "color": list(colour), "size": [total, meme_width]},
                                  canvas_height=total, canvas_width=meme_width, left=0, top=0,
                                  box_height=top_part, box_width=meme_width))
        pixels = style["bottom_pixels"]
        left, top, right, bottom = text_ink_box(self.texts[1], BOLD, pixels)
        x = max(0.0, ((meme_width - (right - left)) / 2 - left) / meme_width)
        y = (top_part + (band - (bottom - top)) / 2 - top) / total
        edits.append(OverlayText(text=self.texts[1], font=BOLD, font_size=(pixels + 0.5) / min(total, meme_width),
                                 color=tuple(style["ink"]), x=min(x, 1.0), y=min(max(y, 0.0), 1.0)))
        return edits

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit_box(size: tuple[int, int], area: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """(left, top, width, height) of a ``size`` = (height, width) photo fitted into ``area`` = (left, top, width,
    height), its aspect ratio kept, centred."""
    height, width = size
    area_left, area_top, area_width, area_height = area
    scale = min(area_width / width, area_height / height)
    box_width, box_height = max(1, min(area_width, round(width * scale))), max(1, min(area_height, round(height * scale)))
    return area_left + (area_width - box_width) // 2, area_top + (area_height - box_height) // 2, box_width, box_height


# ---------------------------------------------------------------------------------------------- drawing helpers


def caption_font(name: str, pixels: int) -> ImageFont.FreeTypeFont:
    """A font of AugLy's bundled fonts folder (``"IBMPlexSans-Bold.ttf"``) at ``pixels`` pixels."""
    from augly.utils import FONTS_DIR

    return ImageFont.truetype(os.path.join(FONTS_DIR, name), pixels)


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=count))


def _user_name(rng: np.random.Generator) -> str:
    return f"{_words(rng, 1)}_{_words(rng, 1)}{int(rng.integers(1, 99))}"


def _colour(rng: np.random.Generator, low: int = 40, high: int = 230) -> tuple[int, int, int]:
    return tuple(int(c) for c in rng.integers(low, high, size=3))


def _heart(draw: ImageDraw.ImageDraw, x: int, y: int, size: int, colour, width: int = 3) -> None:
    """A heart outline in the ``size`` square at (x, y) (the parametric heart curve)."""
    t = np.linspace(0, 2 * math.pi, 60)
    hx, hy = 16 * np.sin(t) ** 3, -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
    scale = size / 34
    points = [(x + size / 2 + px * scale, y + size / 2 + py * scale) for px, py in zip(hx, hy)]
    draw.line(points + points[:1], fill=colour, width=width)


def _icon(draw: ImageDraw.ImageDraw, kind: str, x: int, y: int, size: int, colour) -> None:
    """One icon of an action row in the ``size`` square at (x, y): heart, bubble, plane, bookmark, arrows, box."""
    s = size
    if kind == "heart":
        _heart(draw, x, y, s, colour)
    elif kind == "bubble":
        draw.ellipse((x, y, x + s, y + s * 0.85), outline=colour, width=3)
        draw.line((x + s * 0.2, y + s * 0.7, x + s * 0.05, y + s), fill=colour, width=3)
    elif kind == "plane":
        draw.polygon([(x, y + s * 0.4), (x + s, y), (x + s * 0.6, y + s)], outline=colour, width=3)
    elif kind == "bookmark":
        draw.polygon([(x + s * 0.2, y), (x + s * 0.8, y), (x + s * 0.8, y + s), (x + s * 0.5, y + s * 0.7),
                      (x + s * 0.2, y + s)], outline=colour, width=3)
    elif kind == "arrows":
        draw.line((x, y + s * 0.3, x + s * 0.8, y + s * 0.3), fill=colour, width=3)
        draw.line((x + s * 0.2, y + s * 0.75, x + s, y + s * 0.75), fill=colour, width=3)
        draw.polygon([(x + s * 0.8, y + s * 0.1), (x + s, y + s * 0.3), (x + s * 0.8, y + s * 0.5)], fill=colour)
    else:
        draw.rounded_rectangle((x, y, x + s, y + s), radius=s // 4, outline=colour, width=3)


def _avatar(draw: ImageDraw.ImageDraw, x: int, y: int, size: int, rng: np.random.Generator, ring) -> None:
    draw.ellipse((x - 3, y - 3, x + size + 3, y + size + 3), outline=ring, width=3)
    draw.ellipse((x, y, x + size, y + size), fill=_colour(rng))
    draw.ellipse((x + size * 0.3, y + size * 0.15, x + size * 0.7, y + size * 0.55), fill=_colour(rng, 150, 255))


# ---------------------------------------------------------------------------------------------- frame designs


def _action_icons(draw: ImageDraw.ImageDraw, left: int, step: int, bookmark: int, top: int, size: int,
                  ink) -> None:
    """A post's action row: heart, comment bubble and share plane from ``left`` every ``step`` pixels, and a
    bookmark at ``bookmark``, all ``size`` pixels high at ``top``."""
    for number, kind in enumerate(("heart", "bubble", "plane")):
        _icon(draw, kind, left + step * number, top, size, ink)
    _icon(draw, "bookmark", bookmark, top, size, ink)


def _light_post(rng: np.random.Generator) -> tuple[Image.Image, tuple[int, int, int, int], str]:
    """A light photo post: header with avatar and name, a square photo box, icons, likes and caption lines."""
    width, height, box = 540, 800, (0, 70, 540, 540)
    frame = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(frame)
    name, ink, grey = _user_name(rng), (20, 20, 20), (140, 140, 140)
    _avatar(draw, 16, 14, 42, rng, (214, 41, 118))
    draw.text((72, 14), name, font=caption_font(BOLD, 18), fill=ink)
    draw.text((72, 38), _words(rng, 2).title(), font=caption_font(REGULAR, 14), fill=ink)
    draw.text((width - 50, 16), "...", font=caption_font(BOLD, 22), fill=ink)
    draw.rectangle((0, box[1], width - 1, box[1] + box[3] - 1), fill=(239, 239, 239))
    _action_icons(draw, 16, 48, width - 46, 624, 28, ink)
    draw.text((16, 664), f"{int(rng.integers(100, 99999)):,} likes", font=caption_font(BOLD, 16), fill=ink)
    draw.text((16, 688), f"{name}  {_words(rng, 6)}", font=caption_font(REGULAR, 16), fill=ink)
    draw.text((16, 712), _words(rng, 7), font=caption_font(REGULAR, 16), fill=ink)
    draw.text((16, 740), f"View all {int(rng.integers(2, 400))} comments", font=caption_font(REGULAR, 15), fill=grey)
    draw.text((16, 766), f"{int(rng.integers(2, 23))} HOURS AGO", font=caption_font(REGULAR, 12), fill=grey)
    return frame, box, f"light post by {name}"


def _dark_screen(rng: np.random.Generator) -> tuple[Image.Image, tuple[int, int, int, int], str]:
    """A dark phone screen: status bar, app bar, header, a square photo box, icons, caption, a navigation bar."""
    width, height, box = 480, 860, (0, 140, 480, 480)
    frame = Image.new("RGB", (width, height), (18, 18, 18))
    draw = ImageDraw.Draw(frame)
    name, ink, grey = _user_name(rng), (245, 245, 245), (160, 160, 160)
    draw.rectangle((0, 0, width, 28), fill=(0, 0, 0))
    draw.text((18, 4), f"{int(rng.integers(1, 12))}:{int(rng.integers(10, 59))}", font=caption_font(BOLD, 15), fill=ink)
    draw.rectangle((width - 52, 8, width - 22, 20), outline=ink, width=2)
    draw.rectangle((width - 50, 10, width - 34, 18), fill=ink)
    draw.text((16, 38), "<", font=caption_font(BOLD, 26), fill=ink)
    draw.text((48, 42), "Posts", font=caption_font(BOLD, 20), fill=ink)
    _avatar(draw, 14, 88, 40, rng, (90, 90, 250))
    draw.text((66, 88), name, font=caption_font(BOLD, 16), fill=ink)
    draw.text((66, 110), _words(rng, 2).title(), font=caption_font(REGULAR, 13), fill=grey)
    draw.rectangle((0, box[1], width - 1, box[1] + box[3] - 1), fill=(0, 0, 0))
    _action_icons(draw, 14, 46, width - 42, 634, 26, ink)
    draw.text((14, 672), f"Liked by {_user_name(rng)} and others", font=caption_font(REGULAR, 14), fill=ink)
    draw.text((14, 696), f"{name} {_words(rng, 5)}", font=caption_font(REGULAR, 14), fill=ink)
    draw.text((14, 718), _words(rng, 6), font=caption_font(REGULAR, 14), fill=ink)
    draw.text((14, 744), f"{int(rng.integers(1, 6))} days ago", font=caption_font(REGULAR, 12), fill=grey)
    draw.rectangle((0, 800, width, height), fill=(0, 0, 0))
    for number, kind in enumerate(("box", "bubble", "plane", "heart", "box")):
        _icon(draw, kind, 28 + 96 * number, 816, 26, ink)
    return frame, box, f"dark phone screen by {name}"


def _text_card(rng: np.random.Generator) -> tuple[Image.Image, tuple[int, int, int, int], str]:
    """A text post card on a grey page: avatar, name and handle, two lines of text, a wide photo box, counts."""
    width, height, box = 600, 640, (28, 160, 544, 306)
    frame = Image.new("RGB", (width, height), (245, 248, 250))
    draw = ImageDraw.Draw(frame)
    name, ink, grey = _user_name(rng), (15, 20, 25), (101, 119, 134)
    draw.rounded_rectangle((10, 10, width - 10, height - 10), radius=18, fill=(255, 255, 255),
                           outline=(225, 232, 237), width=2)
    _avatar(draw, 28, 28, 48, rng, (255, 255, 255))
    draw.text((88, 28), name.replace("_", " ").title(), font=caption_font(BOLD, 18), fill=ink)
    draw.text((88, 52), f"@{name} · {int(rng.integers(1, 59))}m", font=caption_font(REGULAR, 15), fill=grey)
    draw.text((28, 94), _words(rng, 8), font=caption_font(REGULAR, 18), fill=ink)
    draw.text((28, 122), _words(rng, 6) + " #" + _words(rng, 1), font=caption_font(REGULAR, 18), fill=ink)
    draw.rounded_rectangle((box[0], box[1], box[0] + box[2] - 1, box[1] + box[3] - 1), radius=14,
                           fill=(230, 236, 240))
    draw.text((28, 482), f"{int(rng.integers(1, 12))}:{int(rng.integers(10, 59))} PM · "
              f"{int(rng.integers(1, 28))} Jun", font=caption_font(REGULAR, 15), fill=grey)
    draw.line((28, 512, width - 28, 512), fill=(225, 232, 237), width=2)
    draw.text((28, 524), f"{int(rng.integers(10, 999))} Reposts   {int(rng.integers(100, 9999))} Likes",
              font=caption_font(BOLD, 15), fill=ink)
    draw.line((28, 556, width - 28, 556), fill=(225, 232, 237), width=2)
    for number, kind in enumerate(("bubble", "arrows", "heart", "plane")):
        _icon(draw, kind, 60 + 140 * number, 574, 26, grey)
    return frame, box, f"text card by {name}"


_DESIGNS = {"light post": _light_post, "dark screen": _dark_screen, "text card": _text_card}


# ---------------------------------------------------------------------------------------------- the templates


def _screenshot(template_id: str, number: int, rng: np.random.Generator, folder: Path) -> Template:
    frame, area, description = _DESIGNS[FRAME_DESIGNS[number % len(FRAME_DESIGNS)]](rng)
    path = folder / f"{template_id}.png"
    frame.save(path)
    return Template(template_id, "screenshot", description, (frame.height, frame.width), area, str(path))


def _meme(template_id: str, number: int, rng: np.random.Generator) -> Template:
    """Even templates: one band above the photo; odd ones: bands above and below (a bottom caption)."""
    white = bool(rng.random() < 0.7)
    style = {"width": 500, "band": int(rng.integers(80, 111)), "background": [255, 255, 255] if white else [0, 0, 0],
             "ink": [0, 0, 0] if white else [255, 255, 255], "bottom_pixels": 34}
    texts = (_words(rng, 4).upper(),) + ((_words(rng, 3).upper(),) if number % 2 else ())
    return Template(template_id, "meme", f"meme caption band{'s' if len(texts) > 1 else ''}: {' / '.join(texts)}",
                    texts=texts, style=style)


def _background(template_id: str, photo: Path, rng: np.random.Generator, folder: Path) -> Template:
    """``photo`` at 640 x 480 as the background; the region: 45-60 % of each side, at a random place."""
    height, width = 480, 640
    path = folder / f"{template_id}.png"
    Image.open(photo).convert("RGB").resize((width, height), Image.BILINEAR).save(path)
    area_width, area_height = int(width * rng.uniform(0.45, 0.6)), int(height * rng.uniform(0.45, 0.6))
    area = (int(rng.integers(0, width - area_width)), int(rng.integers(0, height - area_height)), area_width,
            area_height)
    return Template(template_id, "background", f"pasted onto {photo.stem}", (height, width), area, str(path))


def _overlay(template_id: str, rng: np.random.Generator) -> Template:
    """A watermark-like text (a handle and a phrase) and one emoji, at fixed relative places."""
    text = f"@{_user_name(rng)}" if rng.random() < 0.5 else _words(rng, 3)
    style = {"font_size": float(rng.uniform(0.07, 0.11)), "color": list(_colour(rng, 0, 256)),
             "x": float(rng.uniform(0.03, 0.2)), "y": float(rng.choice([rng.uniform(0.03, 0.15), rng.uniform(0.75, 0.86)])),
             "emoji": emoji_names()[int(rng.integers(len(emoji_names())))], "emoji_size": float(rng.uniform(0.15, 0.25)),
             "emoji_x": float(rng.uniform(0.6, 0.8)), "emoji_y": float(rng.uniform(0.3, 0.6))}
    return Template(template_id, "overlay", f"text {text!r} and emoji {style['emoji']}", texts=(text,), style=style)


def make_templates(folder: Path, prefix: str, per_kind: int, backgrounds: list[Path],
                   rng: np.random.Generator) -> list[Template]:
    """``per_kind`` templates of every kind of :data:`TEMPLATE_KINDS`, drawn from ``rng``; frames and backgrounds
    written into ``folder``; ``backgrounds``: one photo per background template (at least ``per_kind``)."""
    if len(backgrounds) < per_kind:
        raise ValueError(f"{per_kind} background templates need {per_kind} photos, got {len(backgrounds)}")
    folder.mkdir(parents=True, exist_ok=True)
    templates = []
    for number in range(per_kind):
        templates.append(_screenshot(f"{prefix}screenshot-{number}", number, rng, folder))
        templates.append(_meme(f"{prefix}meme-{number}", number, rng))
        templates.append(_background(f"{prefix}background-{number}", backgrounds[number], rng, folder))
        templates.append(_overlay(f"{prefix}overlay-{number}", rng))
    return sorted(templates, key=lambda template: (TEMPLATE_KINDS.index(template.kind), template.id))
