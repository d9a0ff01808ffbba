"""Frames drawn once, for one image: the lone framed queries of :mod:`benchmarks.templates.lone`.

Each call of a design draws a new frame from its generator (its size, colours, texts, the photo's place and size)
and puts the photo into it, so that no two queries share a frame. The designs are none of those a training draw
uses (AugLy's web and mobile screenshots and meme format, PixTrace's ``post``, ``chat`` and ``story`` frames, one
band memes, backgrounds of other photos or gradients, overlays, padding) nor those of the template benchmark
(:mod:`.designs`: a light post, a dark screen, a text card):

* ``phone note``: a phone screenshot of a notes or messaging app, the photo among rows of text (a tenth to a third
  of the screen);
* ``browser article``: a desktop browser window (tabs, address bar) on a news page: a site bar, a headline, a
  byline, the photo in one column beside paragraphs, a sidebar;
* ``demotivational``: a black poster, the photo in a thin white outline, a serif title and a line below it;
* ``polaroid``: the photo in a white instant-print border with a handwritten caption, on a drawn texture (wood,
  linen, cork or a noisy gradient), sometimes turned a few degrees, with a shadow;
* ``photo backdrop``: the photo pasted onto another photo, with a white border or a shadow, the backdrop sometimes
  blurred;
* ``forum card`` and ``video page`` (never drawn in the development draws): a forum post card with a vote column,
  a title and the photo as a preview or a thumbnail; a video site with the photo letterboxed in the player, controls,
  a title, a channel row and a column of recommended videos.

A design returns the framed image and the photo's box in it, ``(left, top, right, bottom)`` in pixels.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from .designs import WORDS, caption_font

__all__ = ["LONE_DESIGNS", "DEV_DESIGNS", "draw_lone_frame"]

SANS, SANS_BOLD, SERIF, SERIF_BOLD = ("IBMPlexSans-Regular.ttf", "IBMPlexSans-Bold.ttf", "IBMPlexSerif-Regular.ttf",
                                      "IBMPlexSerif-Bold.ttf")
HANDWRITING = ("DancingScript-Regular.ttf", "GreatVibes-Regular.ttf", "KaushanScript-Regular.ttf")

Box = tuple[int, int, int, int]


def _words(rng: np.random.Generator, low: int, high: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(rng.integers(low, high + 1))))


def _tone(rng: np.random.Generator, low: int, high: int) -> tuple[int, int, int]:
    base = int(rng.integers(low, high))
    return tuple(int(np.clip(base + rng.integers(-8, 9), 0, 255)) for _ in range(3))


def _accent(rng: np.random.Generator) -> tuple[int, int, int]:
    hue = rng.random()
    return tuple(int(255 * (0.25 + 0.6 * (0.5 + 0.5 * math.cos(2 * math.pi * (hue + k / 3))))) for k in range(3))


def _fit(photo: Image.Image, width: int, height: int) -> Image.Image:
    """``photo`` scaled to fit ``width`` x ``height``, its aspect ratio kept."""
    scale = min(width / photo.width, height / photo.height)
    return photo.resize((max(8, round(photo.width * scale)), max(8, round(photo.height * scale))), Image.BICUBIC)


def _paragraph(draw: ImageDraw.ImageDraw, rng, x: int, y: int, width: int, lines: int, size: int, ink,
               font: str = SANS, spacing: float = 1.45) -> int:
    """``lines`` lines of words drawn from ``(x, y)``, each at most ``width`` pixels wide; the y below them."""
    typeface = caption_font(font, size)
    for _ in range(lines):
        text = _words(rng, 3, 12)
        while len(text) > 3 and draw.textlength(text, font=typeface) > width:
            text = text.rsplit(" ", 1)[0]
        draw.text((x, y), text, font=typeface, fill=ink)
        y += round(size * spacing)
    return y


def _icons(draw: ImageDraw.ImageDraw, rng, left: int, right: int, y: int, size: int, ink, count: int) -> None:
    """``count`` simple outline icons (circle, square, triangle, lines) spread between ``left`` and ``right``."""
    step = (right - left) / count
    for number in range(count):
        x = round(left + step * (number + 0.5) - size / 2)
        kind = int(rng.integers(4))
        if kind == 0:
            draw.ellipse((x, y, x + size, y + size), outline=ink, width=2)
        elif kind == 1:
            draw.rounded_rectangle((x, y, x + size, y + size), radius=size // 4, outline=ink, width=2)
        elif kind == 2:
            draw.polygon([(x, y + size), (x + size / 2, y), (x + size, y + size)], outline=ink, width=2)
        else:
            for row in range(3):
                draw.line((x, y + row * size / 2.5 + 2, x + size, y + row * size / 2.5 + 2), fill=ink, width=2)


# ---------------------------------------------------------------------------------------------- designs


def _phone_note(rng: np.random.Generator, photo: Image.Image, backdrop=None) -> tuple[Image.Image, Box]:
    width, height = 540, int(rng.integers(1000, 1171))
    dark = bool(rng.random() < 0.4)
    page, ink = (_tone(rng, 12, 40), (232, 232, 232)) if dark else (_tone(rng, 238, 256), (28, 28, 28))
    grey, accent = (150, 150, 150), _accent(rng)
    frame = Image.new("RGB", (width, height), page)
    draw = ImageDraw.Draw(frame)
    draw.text((22, 8), f"{int(rng.integers(1, 13))}:{int(rng.integers(10, 60))}", font=caption_font(SANS_BOLD, 17),
              fill=ink)
    draw.rounded_rectangle((width - 62, 12, width - 26, 28), radius=4, outline=ink, width=2)
    draw.rectangle((width - 59, 15, width - 59 + int(rng.integers(8, 30)), 25), fill=ink)
    bar = accent if rng.random() < 0.5 else page
    draw.rectangle((0, 40, width, 104), fill=bar)
    title_ink = (255, 255, 255) if bar == accent else ink
    draw.text((20, 54), "<", font=caption_font(SANS_BOLD, 28), fill=title_ink)
    draw.text((56, 58), _words(rng, 1, 3).title(), font=caption_font(SANS_BOLD, 24), fill=title_ink)
    draw.text((width - 48, 52), "...", font=caption_font(SANS_BOLD, 26), fill=title_ink)
    y = _paragraph(draw, rng, 22, 126, width - 44, int(rng.integers(1, 5)), 19, ink)
    share = rng.uniform(0.1, 0.33)
    box_width = min(width - 44, round(math.sqrt(share * width * height * photo.width / photo.height)))
    shown = _fit(photo, box_width, max(60, height - y - 200))
    left = 22 if rng.random() < 0.6 else (width - shown.width) // 2
    top = y + 14
    frame.paste(shown, (left, top))
    y = _paragraph(draw, rng, 22, top + shown.height + 18, width - 44, 9, 19, ink)
    draw.text((22, min(y, height - 110)), f"{int(rng.integers(1, 28))} {_words(rng, 1, 1)}", fill=grey,
              font=caption_font(SANS, 15))
    draw.rectangle((0, height - 72, width, height), fill=_tone(rng, 20, 50) if dark else _tone(rng, 225, 245))
    _icons(draw, rng, 0, width, height - 52, 30, ink, int(rng.integers(3, 6)))
    return frame, (left, top, left + shown.width, top + shown.height)


def _browser_article(rng: np.random.Generator, photo: Image.Image, backdrop=None) -> tuple[Image.Image, Box]:
    width, height = 1024, int(rng.integers(660, 781))
    page, ink, grey, accent = _tone(rng, 244, 256), (20, 20, 24), (110, 110, 118), _accent(rng)
    frame = Image.new("RGB", (width, height), page)
    draw = ImageDraw.Draw(frame)
    chrome = _tone(rng, 200, 230)
    draw.rectangle((0, 0, width, 40), fill=_tone(rng, 60, 90))
    for tab in range(int(rng.integers(2, 5))):
        x = 12 + tab * 210
        draw.rounded_rectangle((x, 6, x + 200, 40), radius=8, fill=chrome if tab == 0 else _tone(rng, 90, 120))
        draw.text((x + 14, 14), _words(rng, 2, 3).title()[:22], font=caption_font(SANS, 13),
                  fill=ink if tab == 0 else (220, 220, 220))
    draw.rectangle((0, 40, width, 84), fill=chrome)
    draw.rounded_rectangle((110, 48, width - 120, 76), radius=14, fill=(255, 255, 255))
    draw.text((128, 53), f"https://www.{_words(rng, 1, 1)}{_words(rng, 1, 1)}.com/{_words(rng, 2, 3).replace(' ', '-')}",
              font=caption_font(SANS, 14), fill=grey)
    _icons(draw, rng, 0, 100, 54, 18, ink, 3)
    draw.rectangle((0, 84, width, 140), fill=accent)
    draw.text((30, 96), _words(rng, 1, 2).upper(), font=caption_font(SERIF_BOLD, 26), fill=(255, 255, 255))
    for number in range(5):
        draw.text((width - 520 + number * 100, 104), _words(rng, 1, 1).title(), font=caption_font(SANS_BOLD, 15),
                  fill=(255, 255, 255))
    y = _paragraph(draw, rng, 30, 158, width - 340, int(rng.integers(1, 3)), 30, ink, SERIF_BOLD, 1.25)
    draw.text((30, y + 4), f"By {_words(rng, 2, 2).title()} | {int(rng.integers(1, 28))} May", fill=grey,
              font=caption_font(SANS, 14))
    top, column = y + 36, width - 330
    box_width = round(column * rng.uniform(0.42, 0.62))
    shown = _fit(photo, box_width, height - top - 20)
    left = 30 if rng.random() < 0.5 else column - shown.width
    frame.paste(shown, (left, top))
    text_left = left + shown.width + 24 if left == 30 else 30
    _paragraph(draw, rng, text_left, top, column - shown.width - 30, (height - top) // 26 - 1, 16, ink)
    for number in range(3):
        ad_top = top + number * 150
        if ad_top + 130 > height:
            break
        draw.rectangle((width - 280, ad_top, width - 30, ad_top + 130), fill=_tone(rng, 200, 240))
        draw.text((width - 266, ad_top + 12), _words(rng, 2, 3).title(), font=caption_font(SANS_BOLD, 16), fill=ink)
        _paragraph(draw, rng, width - 266, ad_top + 44, 220, 3, 13, grey)
    return frame, (left, top, left + shown.width, top + shown.height)


def _demotivational(rng: np.random.Generator, photo: Image.Image, backdrop=None) -> tuple[Image.Image, Box]:
    width = int(rng.integers(560, 761))
    shown = _fit(photo, round(width * rng.uniform(0.55, 0.78)), round(width * 0.8))
    top, gap = round(width * rng.uniform(0.06, 0.1)), int(rng.integers(6, 12))
    title_size = int(rng.integers(40, 60))
    height = top + shown.height + gap + title_size + 90
    frame = Image.new("RGB", (width, height), _tone(rng, 0, 18))
    draw = ImageDraw.Draw(frame)
    left = (width - shown.width) // 2
    draw.rectangle((left - gap, top - gap, left + shown.width + gap - 1, top + shown.height + gap - 1),
                   outline=(235, 235, 235), width=int(rng.integers(2, 4)))
    frame.paste(shown, (left, top))
    title = _words(rng, 1, 2).upper()
    font = caption_font(SERIF if rng.random() < 0.5 else SERIF_BOLD, title_size)
    draw.text(((width - draw.textlength(title, font=font)) / 2, top + shown.height + 2 * gap), title, font=font,
              fill=(245, 245, 245))
    line = _words(rng, 4, 8)
    small = caption_font(SANS, 18)
    draw.text(((width - draw.textlength(line, font=small)) / 2, height - 44), line, font=small, fill=(210, 210, 210))
    return frame, (left, top, left + shown.width, top + shown.height)


def _texture(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A drawn surface: wood grain, linen, cork or a noisy gradient."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    kind, base = int(rng.integers(4)), np.array(_accent(rng), np.float32)
    noise = rng.normal(0, 1, (height, width)).astype(np.float32)
    if kind == 0:
        base = np.array([int(rng.integers(120, 170)), int(rng.integers(75, 110)), int(rng.integers(40, 70))], np.float32)
        grain = np.sin((y + 12 * np.sin(x / rng.uniform(60, 140))) / rng.uniform(3, 7)) * 18 + noise * 6
    elif kind == 1:
        grain = (np.sin(x / 1.6) + np.sin(y / 1.6)) * 7 + noise * 9
        base = base * 0.3 + 170
    elif kind == 2:
        base = np.array([int(rng.integers(160, 200)), int(rng.integers(120, 150)), int(rng.integers(80, 100))], np.float32)
        grain = noise * 22
    else:
        grain = (x / width - 0.5) * 80 + (y / height - 0.5) * 40 + noise * 10
    pixels = np.clip(base[None, None] + grain[..., None], 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def _shadowed(canvas: Image.Image, card: Image.Image, left: int, top: int, rng) -> None:
    """Paste ``card`` at ``(left, top)`` with a soft shadow under it."""
    shadow = Image.new("L", canvas.size, 0)
    offset = int(rng.integers(4, 12))
    ImageDraw.Draw(shadow).rectangle((left + offset, top + offset, left + card.width + offset,
                                      top + card.height + offset), fill=140)
    shadow = shadow.filter(ImageFilter.GaussianBlur(8))
    canvas.paste(Image.new("RGB", canvas.size, (0, 0, 0)), (0, 0), shadow)
    canvas.paste(card, (left, top))


def _polaroid(rng: np.random.Generator, photo: Image.Image, backdrop=None) -> tuple[Image.Image, Box]:
    width, height = (800, 600) if rng.random() < 0.6 else (600, 800)
    canvas = _texture(rng, width, height)
    share = rng.uniform(0.12, 0.3)
    side = math.sqrt(share * width * height / (photo.width * photo.height))
    shown = photo.resize((max(8, round(photo.width * side)), max(8, round(photo.height * side))), Image.BICUBIC)
    border = max(8, round(0.06 * shown.width))
    bottom = round(shown.height * rng.uniform(0.2, 0.3))
    card = Image.new("RGB", (shown.width + 2 * border, shown.height + border + bottom), _tone(rng, 238, 256))
    card.paste(shown, (border, border))
    draw = ImageDraw.Draw(card)
    text = _words(rng, 1, 3)
    draw.text((border + 6, shown.height + border + bottom * 0.2), text, fill=(40, 40, 90),
              font=caption_font(HANDWRITING[int(rng.integers(len(HANDWRITING)))], max(14, round(bottom * 0.45))))
    angle = float(rng.uniform(-4, 4)) if rng.random() < 0.5 else 0.0
    if angle:
        card = card.rotate(angle, Image.BICUBIC, expand=True, fillcolor=(0, 0, 0))
    card = card.crop((0, 0, min(card.width, width - 20), min(card.height, height - 20)))
    left, top = int(rng.integers(10, width - card.width - 9)), int(rng.integers(10, height - card.height - 9))
    if angle:
        mask = Image.new("L", (shown.width + 2 * border, shown.height + border + bottom), 255)
        mask = mask.rotate(angle, Image.BICUBIC, expand=True).crop((0, 0, card.width, card.height))
        canvas.paste(card, (left, top), mask)
        corner = (left + (card.width - shown.width) // 2, top + border)
        return canvas, (corner[0], corner[1], min(width, corner[0] + shown.width), min(height, corner[1] + shown.height))
    _shadowed(canvas, card, left, top, rng)
    return canvas, (left + border, top + border, left + border + shown.width, top + border + shown.height)


def _photo_backdrop(rng: np.random.Generator, photo: Image.Image, backdrop: Image.Image) -> tuple[Image.Image, Box]:
    scale = 800 / max(backdrop.size)
    canvas = backdrop.convert("RGB").resize((max(16, round(backdrop.width * scale)), max(16, round(backdrop.height * scale))),
                                            Image.BICUBIC)
    if rng.random() < 0.3:
        canvas = canvas.filter(ImageFilter.GaussianBlur(float(rng.uniform(2, 6))))
    share = rng.uniform(0.15, 0.35)
    side = math.sqrt(share * canvas.width * canvas.height / (photo.width * photo.height))
    side = min(side, 0.85 * canvas.width / photo.width, 0.85 * canvas.height / photo.height)
    shown = photo.resize((max(8, round(photo.width * side)), max(8, round(photo.height * side))), Image.BICUBIC)
    border = int(rng.integers(6, 16)) if rng.random() < 0.5 else 0
    card = Image.new("RGB", (shown.width + 2 * border, shown.height + 2 * border), (250, 250, 250))
    card.paste(shown, (border, border))
    left = int(rng.integers(0, canvas.width - card.width + 1))
    top = int(rng.integers(0, canvas.height - card.height + 1))
    if border or rng.random() < 0.5:
        _shadowed(canvas, card, left, top, rng)
    else:
        canvas.paste(card, (left, top))
    return canvas, (left + border, top + border, left + border + shown.width, top + border + shown.height)


def _forum_card(rng: np.random.Generator, photo: Image.Image, backdrop=None) -> tuple[Image.Image, Box]:
    width, height = 900, int(rng.integers(560, 721))
    ink, grey, accent = (26, 26, 27), (120, 124, 126), _accent(rng)
    frame = Image.new("RGB", (width, height), _tone(rng, 218, 236))
    draw = ImageDraw.Draw(frame)
    draw.rectangle((0, 0, width, 48), fill=(255, 255, 255))
    draw.ellipse((14, 8, 46, 40), fill=accent)
    draw.rounded_rectangle((240, 10, 660, 38), radius=14, fill=_tone(rng, 236, 248))
    draw.text((258, 14), f"Search {_words(rng, 1, 1)}", font=caption_font(SANS, 14), fill=grey)
    card_top = 64
    draw.rounded_rectangle((40, card_top, width - 40, height - 12), radius=8, fill=(255, 255, 255),
                           outline=_tone(rng, 200, 220), width=1)
    draw.rectangle((41, card_top + 1, 92, height - 13), fill=_tone(rng, 240, 250))
    draw.polygon([(66, card_top + 14), (56, card_top + 28), (76, card_top + 28)], outline=grey, width=2)
    draw.text((52, card_top + 36), f"{rng.uniform(1, 40):.1f}k", font=caption_font(SANS_BOLD, 12), fill=ink)
    draw.polygon([(56, card_top + 58), (76, card_top + 58), (66, card_top + 72)], outline=grey, width=2)
    draw.text((106, card_top + 12), f"r/{_words(rng, 1, 1)}{_words(rng, 1, 1)} · Posted by u/{_words(rng, 1, 1)}"
              f"{int(rng.integers(1, 999))} · {int(rng.integers(1, 23))}h", font=caption_font(SANS, 13), fill=grey)
    thumbnail = rng.random() < 0.5
    text_width = width - 300 if thumbnail else width - 160
    y = _paragraph(draw, rng, 106, card_top + 40, text_width, int(rng.integers(1, 4)), 21, ink, SANS_BOLD, 1.3)
    if thumbnail:
        shown = _fit(photo, int(rng.integers(140, 201)), int(rng.integers(110, 161)))
        left, top = width - 60 - shown.width, card_top + 40
        y = _paragraph(draw, rng, 106, y + 8, text_width, int(rng.integers(2, 6)), 15, grey)
    else:
        shown = _fit(photo, round((width - 160) * rng.uniform(0.45, 0.75)), height - y - 80)
        left, top = 106, y + 10
        y = top + shown.height
    frame.paste(shown, (left, top))
    draw.text((106, max(y, top + shown.height) + 14), f"{int(rng.integers(2, 999))} Comments    Share    Save    ...",
              font=caption_font(SANS_BOLD, 13), fill=grey)
    return frame, (left, top, left + shown.width, top + shown.height)


def _video_page(rng: np.random.Generator, photo: Image.Image, backdrop=None) -> tuple[Image.Image, Box]:
    width, height = 1024, int(rng.integers(640, 741))
    dark = bool(rng.random() < 0.5)
    page, ink = (_tone(rng, 10, 30), (240, 240, 240)) if dark else (_tone(rng, 246, 256), (15, 15, 15))
    grey = (150, 150, 150)
    frame = Image.new("RGB", (width, height), page)
    draw = ImageDraw.Draw(frame)
    draw.rounded_rectangle((20, 14, 52, 36), radius=6, fill=(230, 30, 30))
    draw.polygon([(32, 19), (32, 31), (42, 25)], fill=(255, 255, 255))
    draw.text((58, 14), _words(rng, 1, 1).title() + "Tube", font=caption_font(SANS_BOLD, 18), fill=ink)
    draw.rounded_rectangle((300, 10, 720, 40), radius=15, outline=grey, width=1)
    player_width = round(width * rng.uniform(0.6, 0.68))
    player = (20, 56, 20 + player_width, 56 + round(player_width * 9 / 16))
    draw.rectangle(player, fill=(0, 0, 0))
    shown = _fit(photo, player[2] - player[0], player[3] - player[1])
    left = player[0] + (player[2] - player[0] - shown.width) // 2
    top = player[1] + (player[3] - player[1] - shown.height) // 2
    frame.paste(shown, (left, top))
    bar = player[3] - 34
    draw.rectangle((player[0] + 10, bar, player[2] - 10, bar + 4), fill=(120, 120, 120))
    draw.rectangle((player[0] + 10, bar, player[0] + 10 + round((player_width - 20) * rng.random()), bar + 4),
                   fill=(230, 30, 30))
    draw.text((player[0] + 14, bar + 10), f"{int(rng.integers(0, 9))}:{int(rng.integers(10, 60))} / "
              f"{int(rng.integers(9, 59))}:{int(rng.integers(10, 60))}", font=caption_font(SANS, 13), fill=(240, 240, 240))
    y = _paragraph(draw, rng, 20, player[3] + 12, player_width, 1, 20, ink, SANS_BOLD)
    draw.ellipse((20, y + 6, 60, y + 46), fill=_accent(rng))
    draw.text((70, y + 8), _words(rng, 2, 2).title(), font=caption_font(SANS_BOLD, 15), fill=ink)
    draw.text((70, y + 28), f"{int(rng.integers(1, 999))}K subscribers", font=caption_font(SANS, 12), fill=grey)
    draw.rounded_rectangle((260, y + 10, 360, y + 42), radius=16, fill=ink)
    draw.text((274, y + 16), "Subscribe", font=caption_font(SANS_BOLD, 14), fill=page)
    column = player[2] + 20
    for number in range((height - 56) // 100):
        item_top = 56 + number * 100
        draw.rounded_rectangle((column, item_top, column + 150, item_top + 84), radius=6, fill=_accent(rng))
        draw.text((column + 112, item_top + 64), f"{int(rng.integers(1, 20))}:{int(rng.integers(10, 60))}",
                  font=caption_font(SANS, 11), fill=(255, 255, 255))
        _paragraph(draw, rng, column + 160, item_top, width - column - 170, 2, 13, ink, SANS_BOLD, 1.3)
        draw.text((column + 160, item_top + 44), _words(rng, 1, 2).title(), font=caption_font(SANS, 12), fill=grey)
    return frame, (left, top, left + shown.width, top + shown.height)


#: Design name -> ``draw(rng, photo, backdrop) -> (framed image, photo box)``.
LONE_DESIGNS = {"phone note": _phone_note, "browser article": _browser_article, "demotivational": _demotivational,
                "polaroid": _polaroid, "photo backdrop": _photo_backdrop, "forum card": _forum_card,
                "video page": _video_page}
#: The designs of the development draws (the last two are only ever drawn for the reported draws).
DEV_DESIGNS = ("phone note", "browser article", "demotivational", "polaroid", "photo backdrop")


def draw_lone_frame(design: str, rng: np.random.Generator, photo: Image.Image,
                    backdrop: Image.Image | None = None) -> tuple[Image.Image, Box]:
    """``photo`` (RGB) put into a new frame of ``design`` (:data:`LONE_DESIGNS`; ``photo backdrop`` needs a
    ``backdrop`` photo): the framed image and the photo's box ``(left, top, right, bottom)`` in it, in pixels."""
    if design not in LONE_DESIGNS:
        raise ValueError(f"unknown lone frame design {design!r}; known: {', '.join(LONE_DESIGNS)}")
    if design == "photo backdrop" and backdrop is None:
        raise ValueError("the photo backdrop design needs a backdrop photo")
    return LONE_DESIGNS[design](rng, photo.convert("RGB"), backdrop)
