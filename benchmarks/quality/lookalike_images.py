"""The look-alike images of :mod:`benchmarks.quality.lookalikes`: families of images that resemble each other
without being copies of each other.

Each *family* draws any number of images from seeds; two images of one family share a look (a texture, a drawing
style) and nothing else. Three kinds, fixed before anything was measured:

* **procedural textures** (``noise``, ``grass``, ``gravel``, ``sand``), 256 x 256: ``noise`` is the package's own
  smooth colour noise (``{"kind": "noise"}``, the ``procedural`` other images of training), the others are drawn here
  with Pillow: green blades on dark soil, grey-brown pebbles with shadows, beige grain with ripples;
* **photo textures** (``ground``, ``plants``, ``fabric``, ``food``, ``lattice``): a square crop about the centre,
  0.4 of the photo's shorter side, of a photo of one of the group's six ImageNet classes, resized to 256 x 256; the
  classes are listed by name below, all of them in the ``reference`` and ``distractor`` splits (evaluation only:
  nothing is designed on them);
* **same-style drawings** (``skyline``, ``shapes``, ``chart``), 384 x 288: a city skyline at dusk (dark blocks, lit
  windows, a moon), flat shapes of one palette with black outlines on white, a bar chart with a grid.
"""

from __future__ import annotations

import colorsys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["FAMILIES", "PHOTO_GROUPS", "family_kind", "draw_image", "photo_group_files"]

TEXTURE_SIZE = 256
DRAWING_SIZE = (384, 288)  # width, height
#: Photo texture groups: ImageNet class names (the part of a file name after the synset id), all in the ``reference``
#: or ``distractor`` split, picked by eye among 78 candidate classes as those whose centre crop is filled with one
#: texture (before any score was computed).
PHOTO_GROUPS = {
    "ground": ("stone_wall", "volcano", "cliff", "alp", "valley", "hen-of-the-woods"),
    "plants": ("broccoli", "cauliflower", "custard_apple", "cardoon", "artichoke", "gyromitra"),
    "fabric": ("prayer_rug", "quilt", "wool", "velvet", "knot", "jigsaw_puzzle"),
    "food": ("pizza", "burrito", "potpie", "mashed_potato", "strawberry", "pomegranate"),
    "lattice": ("manhole_cover", "shoji", "worm_fence", "tile_roof", "radiator", "plate_rack"),
}
#: Every family, by kind.
KINDS = {"procedural texture": ("noise", "grass", "gravel", "sand"), "photo texture": tuple(PHOTO_GROUPS),
         "drawing": ("skyline", "shapes", "chart")}
FAMILIES = tuple(family for families in KINDS.values() for family in families)


def family_kind(family: str) -> str:
    """The kind (a key of :data:`KINDS`) of ``family``."""
    return next(kind for kind, families in KINDS.items() if family in families)


def photo_group_files(image_folder: Path, evaluation_files: list[Path]) -> dict[str, list[Path]]:
    """Group name -> the files of its classes among ``evaluation_files`` (the ``reference`` and ``distractor``
    splits), in the order :data:`PHOTO_GROUPS` lists the classes; a listed class missing from them is an error."""
    by_class = {path.stem.split("_", 1)[1]: path for path in evaluation_files}
    missing = [name for names in PHOTO_GROUPS.values() for name in names if name not in by_class]
    if missing:
        raise FileNotFoundError(f"{image_folder}: no evaluation image of the classes {', '.join(missing)}")
    return {group: [by_class[name] for name in names] for group, names in PHOTO_GROUPS.items()}


def draw_image(family: str, rng: np.random.Generator, photo: Path | None = None) -> Image.Image:
    """One RGB image of ``family`` drawn from ``rng`` (``photo``: the photo a photo texture is cut from)."""
    if family in PHOTO_GROUPS:
        return photo_crop(photo, rng)
    return {"noise": noise, "grass": grass, "gravel": gravel, "sand": sand, "skyline": skyline, "shapes": shapes,
            "chart": chart}[family](rng)


def photo_crop(photo: Path, rng: np.random.Generator) -> Image.Image:
    """A square crop of ``photo``, 0.4 of its shorter side, about its centre (where the class's subject is; moved
    by up to a tenth of the width and height), resized to 256 x 256."""
    image = Image.open(photo).convert("RGB")
    side = int(0.4 * min(image.size))
    x = image.width / 2 + rng.uniform(-0.1, 0.1) * image.width - side / 2
    y = image.height / 2 + rng.uniform(-0.1, 0.1) * image.height - side / 2
    left, top = int(np.clip(x, 0, image.width - side)), int(np.clip(y, 0, image.height - side))
    return image.crop((left, top, left + side, top + side)).resize((TEXTURE_SIZE, TEXTURE_SIZE), Image.BICUBIC)


def noise(rng: np.random.Generator) -> Image.Image:
    """The package's smooth colour noise (a bicubic enlargement of a random 16 x 16 grid) of a random seed."""
    from copynce_hf.pixtrace.edits.sources import resolve_image

    return resolve_image({"kind": "noise", "seed": int(rng.integers(2**31)), "size": [TEXTURE_SIZE, TEXTURE_SIZE]})


def _colour(rng: np.random.Generator, hue: tuple[float, float], saturation: tuple[float, float],
            value: tuple[float, float]) -> tuple[int, int, int]:
    """An RGB colour with hue (degrees), saturation and value drawn uniformly from the ranges."""
    red, green, blue = colorsys.hsv_to_rgb(rng.uniform(*hue) / 360, rng.uniform(*saturation), rng.uniform(*value))
    return round(red * 255), round(green * 255), round(blue * 255)


def grass(rng: np.random.Generator) -> Image.Image:
    """900 grass blades (green strokes 10-30 pixels long, leaning up to 25 degrees) on dark soil."""
    image = Image.new("RGB", (TEXTURE_SIZE, TEXTURE_SIZE), _colour(rng, (25, 45), (0.4, 0.6), (0.15, 0.25)))
    draw = ImageDraw.Draw(image)
    for _ in range(900):
        x, y = rng.uniform(-10, TEXTURE_SIZE + 10, size=2)
        length, lean = rng.uniform(10, 30), np.radians(rng.uniform(-25, 25))
        end = (x + length * np.sin(lean), y - length * np.cos(lean))
        draw.line([(x, y), end], fill=_colour(rng, (75, 130), (0.45, 0.9), (0.3, 0.85)), width=int(rng.integers(1, 3)))
    return image


def gravel(rng: np.random.Generator) -> Image.Image:
    """500 pebbles (ellipses 4-12 pixels in radius, grey to brown, each with a shadow below it) on grey ground."""
    image = Image.new("RGB", (TEXTURE_SIZE, TEXTURE_SIZE), _colour(rng, (20, 40), (0.05, 0.2), (0.3, 0.45)))
    draw = ImageDraw.Draw(image)
    for _ in range(500):
        x, y = rng.uniform(-8, TEXTURE_SIZE + 8, size=2)
        rx, ry = rng.uniform(4, 12), rng.uniform(4, 12)
        draw.ellipse((x - rx + 2, y - ry + 2, x + rx + 2, y + ry + 2), fill=(40, 36, 32))
        draw.ellipse((x - rx, y - ry, x + rx, y + ry), fill=_colour(rng, (15, 45), (0.0, 0.3), (0.4, 0.85)))
    return image.filter(ImageFilter.GaussianBlur(0.6))


def sand(rng: np.random.Generator) -> Image.Image:
    """Beige grain (per-pixel noise) over ripples (a sine of 14-24 pixels' wavelength at a random angle)."""
    base = np.array(_colour(rng, (35, 45), (0.25, 0.45), (0.7, 0.9)), dtype=np.float32)
    ys, xs = np.mgrid[0:TEXTURE_SIZE, 0:TEXTURE_SIZE].astype(np.float32)
    angle, wavelength = rng.uniform(0, np.pi), rng.uniform(14, 24)
    phase = (xs * np.cos(angle) + ys * np.sin(angle)) * 2 * np.pi / wavelength + rng.uniform(0, 2 * np.pi)
    ripples = 18 * np.sin(phase + 1.5 * np.sin(ys / rng.uniform(30, 60)))
    grain = rng.normal(0, 14, size=(TEXTURE_SIZE, TEXTURE_SIZE))
    pixels = base[None, None, :] + (ripples + grain)[..., None]
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB").filter(ImageFilter.GaussianBlur(0.7))


def skyline(rng: np.random.Generator) -> Image.Image:
    """A city at dusk: a sky gradient (blue to orange), a moon, dark blocks 22-60 pixels wide with lit windows."""
    width, height = DRAWING_SIZE
    sky = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    top, bottom = np.array([20, 30, 80], np.float32), np.array([240, 140, 70], np.float32)
    image = Image.fromarray(np.broadcast_to(top + sky * (bottom - top), (height, width, 3)).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    moon_x, moon_y, radius = rng.uniform(30, width - 30), rng.uniform(20, 80), rng.uniform(10, 20)
    draw.ellipse((moon_x - radius, moon_y - radius, moon_x + radius, moon_y + radius), fill=(250, 245, 220))
    street = height - 24
    left = -rng.uniform(0, 20)
    while left < width:
        right = left + rng.uniform(22, 60)
        top_edge = rng.uniform(height * 0.25, street - 30)
        draw.rectangle((left, top_edge, right - 2, street), fill=_colour(rng, (220, 260), (0.2, 0.5), (0.1, 0.25)))
        for wy in np.arange(top_edge + 8, street - 8, 14):
            for wx in np.arange(left + 6, right - 10, 11):
                if rng.random() < 0.45:
                    draw.rectangle((wx, wy, wx + 5, wy + 7), fill=(255, 220, 120))
        left = right
    draw.rectangle((0, street, width, height), fill=(30, 30, 35))
    return image


#: The palette of :func:`shapes`: every drawing uses the same five colours.
PALETTE = ((230, 57, 70), (241, 196, 15), (46, 134, 193), (39, 174, 96), (142, 68, 173))


def shapes(rng: np.random.Generator) -> Image.Image:
    """6-10 flat shapes (circles, squares, triangles, 25-90 pixels) of one palette, black outlines, on white."""
    width, height = DRAWING_SIZE
    image = Image.new("RGB", DRAWING_SIZE, (250, 250, 248))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(6, 11))):
        size, x, y = rng.uniform(25, 90), rng.uniform(0, width), rng.uniform(0, height)
        fill = PALETTE[int(rng.integers(len(PALETTE)))]
        kind = int(rng.integers(3))
        if kind == 0:
            draw.ellipse((x - size / 2, y - size / 2, x + size / 2, y + size / 2), fill=fill, outline=(0, 0, 0), width=3)
        elif kind == 1:
            draw.rectangle((x - size / 2, y - size / 2, x + size / 2, y + size / 2), fill=fill, outline=(0, 0, 0),
                           width=3)
        else:
            draw.polygon([(x, y - size / 2), (x - size / 2, y + size / 2), (x + size / 2, y + size / 2)], fill=fill,
                         outline=(0, 0, 0), width=3)
    return image


def chart(rng: np.random.Generator) -> Image.Image:
    """A bar chart: 5-9 blue bars of random heights, a light grid, two axes and a title bar."""
    width, height = DRAWING_SIZE
    image = Image.new("RGB", DRAWING_SIZE, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    left, right, top, bottom = 40, width - 16, 40, height - 30
    draw.rectangle((0, 0, width, 24), fill=(52, 73, 94))
    draw.text((10, 6), "Monthly report", fill=(255, 255, 255))
    for y in np.linspace(top, bottom, 6):
        draw.line([(left, y), (right, y)], fill=(225, 225, 225), width=1)
    bars = int(rng.integers(5, 10))
    slot = (right - left) / bars
    for number, value in enumerate(rng.uniform(0.1, 1.0, size=bars)):
        x = left + number * slot + slot * 0.15
        draw.rectangle((x, bottom - value * (bottom - top), x + slot * 0.7, bottom), fill=(52, 152, 219))
    draw.line([(left, top), (left, bottom), (right, bottom)], fill=(0, 0, 0), width=2)
    return image
