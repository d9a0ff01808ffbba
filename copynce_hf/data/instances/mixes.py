"""New instances made of parts of 2 to 4 different photos: collages and cut-and-paste mixes.

* a **collage** cuts a canvas into 2 to 4 rectangles (each cut splits the largest rectangle across its
  longer side, somewhere between 35 % and 65 % of it) and fills each with a crop of another photo;
* a **cutmix** is one photo with rectangles of 1 or 2 other photos pasted over it, each covering 15 % to
  40 % of it (SSCD trains with mixup and cutmix; here the mix is a training image of its own).

Which photos a mix takes is drawn by :func:`mix_groups`: the photos used least so far first, ties broken
at random, so that over ``count`` mixes every photo is used the same number of times give or take one.
All draws come from a ``numpy`` generator the caller seeds, so the same seed gives the same mixes.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from ...modeling.errors import ConfigError

__all__ = ["MixPart", "collage", "crop_to_fill", "cutmix", "mix_groups"]

#: One part of a mix: ``(photo position in the group, (left, top, right, bottom) on the canvas)``.
MixPart = tuple[int, tuple[int, int, int, int]]


def mix_groups(count: int, photos: int, sizes: tuple[int, ...], rng: np.random.Generator,
               max_uses: int | None = None, kind: str = "mix") -> list[list[int]]:
    """``count`` groups of distinct photo indices in ``range(photos)``, each of a size drawn from ``sizes``
    (capped at ``photos``), the least used photos first so that uses differ by at most one.

    Raises:
        ConfigError: fewer than 2 photos, or a photo used more than ``max_uses`` times (naming ``kind``).
    """
    if count < 0:
        raise ConfigError(f"{kind}: the number of mixes must be >= 0, got {count}")
    if count and photos < 2:
        raise ConfigError(f"{kind}: a mix takes parts of at least 2 different photos; {photos} given")
    uses = np.zeros(photos, dtype=np.int64)
    groups = []
    for _ in range(count):
        size = min(int(rng.choice(sizes)), photos)
        order = np.lexsort((rng.random(photos), uses))  # least used first, ties at random
        group = [int(index) for index in order[:size]]
        uses[group] += 1
        groups.append([group[i] for i in rng.permutation(size)])  # the first photo is not always the least used
    if max_uses is not None and count and uses.max() > max_uses:
        raise ConfigError(f"{kind}: {count} mixes of {min(sizes)}-{max(sizes)} photos use a photo "
                          f"{int(uses.max())} times with only {photos} photos, above max_uses {max_uses}; "
                          "ask for fewer mixes or give more photos")
    return groups


def crop_to_fill(photo: Image.Image, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """A random crop of ``photo`` with the aspect of ``size`` = (W, H), 50 % to 100 % of the largest such
    crop on a side, resized to ``size``."""
    width, height = size
    scale = rng.uniform(0.5, 1.0) * min(photo.width / width, photo.height / height)
    crop_w, crop_h = max(1, round(width * scale)), max(1, round(height * scale))
    left = int(rng.integers(0, photo.width - crop_w + 1))
    top = int(rng.integers(0, photo.height - crop_h + 1))
    return photo.resize(size, Image.Resampling.BICUBIC, box=(left, top, left + crop_w, top + crop_h))


def _canvas(side: int, rng: np.random.Generator) -> tuple[int, int]:
    """(W, H) of a canvas whose longer side is ``side``, the other 75 % to 100 % of it."""
    short = round(side * rng.uniform(0.75, 1.0))
    return (side, short) if rng.random() < 0.5 else (short, side)


def collage(photos: list[Image.Image], side: int, rng: np.random.Generator) -> tuple[Image.Image, list[MixPart]]:
    """A collage of ``photos`` (2 to 4): the canvas (longer side ``side``) cut into one rectangle per photo.

    Returns:
        The RGB collage and its parts ``[(photo position, box)]``; the boxes partition the canvas.
    """
    if not 2 <= len(photos) <= 4:
        raise ConfigError(f"collage: takes 2 to 4 photos, got {len(photos)}")
    width, height = _canvas(side, rng)
    boxes = [(0, 0, width, height)]
    while len(boxes) < len(photos):  # cut the largest rectangle across its longer side
        largest = max(range(len(boxes)), key=lambda i: (boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1]))
        left, top, right, bottom = boxes.pop(largest)
        if right - left >= bottom - top:
            cut = left + round((right - left) * rng.uniform(0.35, 0.65))
            boxes += [(left, top, cut, bottom), (cut, top, right, bottom)]
        else:
            cut = top + round((bottom - top) * rng.uniform(0.35, 0.65))
            boxes += [(left, top, right, cut), (left, cut, right, bottom)]
    canvas = Image.new("RGB", (width, height))
    parts = []
    for position, box in enumerate(boxes):
        canvas.paste(crop_to_fill(photos[position], (box[2] - box[0], box[3] - box[1]), rng), box[:2])
        parts.append((position, box))
    return canvas, parts


def cutmix(photos: list[Image.Image], side: int, rng: np.random.Generator) -> tuple[Image.Image, list[MixPart]]:
    """The first of ``photos`` (2 or 3) resized to a longer side of ``side``, with a rectangle of each other
    photo pasted over it (15 % to 40 % of the canvas' area, aspect 1:2 to 2:1, anywhere on it).

    Returns:
        The RGB mix and its parts ``[(photo position, box)]``: the first is the whole canvas (the base,
        partly covered by the later ones).
    """
    if not 2 <= len(photos) <= 3:
        raise ConfigError(f"cutmix: takes 2 or 3 photos, got {len(photos)}")
    base = photos[0]
    scale = side / max(base.size)
    width, height = max(1, round(base.width * scale)), max(1, round(base.height * scale))
    canvas = base.resize((width, height), Image.Resampling.BICUBIC)
    parts: list[MixPart] = [(0, (0, 0, width, height))]
    for position, photo in enumerate(photos[1:], start=1):
        area, aspect = rng.uniform(0.15, 0.4) * width * height, np.exp(rng.uniform(np.log(0.5), np.log(2.0)))
        patch_w = int(np.clip(round(np.sqrt(area * aspect)), 1, width))
        patch_h = int(np.clip(round(area / patch_w), 1, height))
        left, top = int(rng.integers(0, width - patch_w + 1)), int(rng.integers(0, height - patch_h + 1))
        canvas.paste(crop_to_fill(photo, (patch_w, patch_h), rng), (left, top))
        parts.append((position, (left, top, left + patch_w, top + patch_h)))
    return canvas, parts
