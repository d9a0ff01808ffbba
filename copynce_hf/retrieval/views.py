"""Local crops ensembling (LCE) views: the paper's 26 query views and 10 reference views.

Supplementary "Local Crops Ensembling": query and reference are cut into a fixed set of views,
every compared view pair is scored, and the pair's score is the maximum (highest cosine for a
descriptor, highest copy probability for the matcher). The ``paper`` preset reproduces the
views of the authors' inference code. With ``w``, ``h`` the image's width and height (integer
division, as PIL crop boxes ``(left, top, right, bottom)``):

* query (26 views): the full image; the five one-third crops (the centre box
  ``[w/3, 2w/3] x [h/3, 2h/3]`` and four boxes centred at (1/3, 1/3), (2/3, 1/3), (1/3, 2/3),
  (2/3, 2/3) of the width and height: ``[w/6, w/2]`` or ``[w/2, 5w/6]``, likewise in height);
  the four quarters; the nine ninths (row-major); seven rotations of the full image by 45, 90,
  ..., 315 degrees counter-clockwise with expansion (bicubic, black corners);
* reference (10 views): the full image, the five one-third crops and the four quarters.

Which view pairs the matcher scores (:func:`matcher_view_pairs`): ``none`` the full images only
(1 pair); ``paper`` every query view with the full reference plus the full query with every
reference crop (26 + 9 = 35 pairs, as the authors' code does); ``all`` every combination (260).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from PIL import Image

from ..modeling.errors import ConfigError

#: ``--descriptor-lce`` choices: views embedded per image at search time.
DESCRIPTOR_LCE_MODES = ("none", "paper")
#: ``--matcher-lce`` choices: which (query view, reference view) pairs the matcher scores.
MATCHER_LCE_MODES = ("none", "paper", "all")
#: Rotations of the full query in the paper preset, degrees counter-clockwise.
PAPER_ROTATIONS = (45, 90, 135, 180, 225, 270, 315)

Box = tuple[int, int, int, int]


class View(NamedTuple):
    """One view of an image: ``kind`` ``full``, ``crop`` (``box`` = (left, top, right, bottom)) or
    ``rotate`` (``angle`` degrees counter-clockwise, canvas expanded to hold the whole image)."""

    kind: str
    box: Box | None = None
    angle: int = 0


def one_third_boxes(width: int, height: int) -> list[Box]:
    """The five one-third crops: centre, then centred at (1/3, 1/3), (2/3, 1/3), (1/3, 2/3), (2/3, 2/3)."""
    w, h = width, height
    return [
        (w // 3, h // 3, 2 * w // 3, 2 * h // 3),
        (w // 6, h // 6, w // 2, h // 2),
        (w // 2, h // 6, 5 * w // 6, h // 2),
        (w // 6, h // 2, w // 2, 5 * h // 6),
        (w // 2, h // 2, 5 * w // 6, 5 * h // 6),
    ]


def quarter_boxes(width: int, height: int) -> list[Box]:
    """The four quarters, row-major: top left, top right, bottom left, bottom right."""
    w, h = width, height
    return [(0, 0, w // 2, h // 2), (w // 2, 0, w, h // 2), (0, h // 2, w // 2, h), (w // 2, h // 2, w, h)]


def ninth_boxes(width: int, height: int) -> list[Box]:
    """The nine ninths of a 3x3 grid, row-major."""
    xs = (0, width // 3, 2 * width // 3, width)
    ys = (0, height // 3, 2 * height // 3, height)
    return [(xs[col], ys[row], xs[col + 1], ys[row + 1]) for row in range(3) for col in range(3)]


def paper_query_views(width: int, height: int) -> list[View]:
    """The 26 query views of the paper preset (order: full, 5 thirds, 4 quarters, 9 ninths, 7 rotations)."""
    crops = one_third_boxes(width, height) + quarter_boxes(width, height) + ninth_boxes(width, height)
    return [View("full"), *(View("crop", box) for box in crops), *(View("rotate", angle=a) for a in PAPER_ROTATIONS)]


def paper_reference_views(width: int, height: int) -> list[View]:
    """The 10 reference views of the paper preset (full, 5 thirds, 4 quarters)."""
    crops = one_third_boxes(width, height) + quarter_boxes(width, height)
    return [View("full"), *(View("crop", box) for box in crops)]


def render_view(image: Image.Image, view: View) -> Image.Image:
    """Cut or rotate ``image`` as ``view`` says (a degenerate crop of a tiny image keeps 1 pixel)."""
    if view.kind == "full":
        return image
    if view.kind == "crop":
        left, top, right, bottom = view.box
        return image.crop((left, top, max(right, left + 1), max(bottom, top + 1)))
    if view.kind == "rotate":
        return image.rotate(view.angle, expand=True, resample=Image.Resampling.BICUBIC)
    raise ConfigError(f"unknown view kind {view.kind!r}")


@dataclass(frozen=True)
class ViewPreset:
    """A named set of LCE views: ``none`` (the full image only) or ``paper`` (26 query / 10 reference views)."""

    name: str = "none"

    def __post_init__(self) -> None:
        if self.name not in DESCRIPTOR_LCE_MODES:
            raise ConfigError(f"unknown LCE view preset {self.name!r}; choose one of {', '.join(DESCRIPTOR_LCE_MODES)}")

    def query_views(self, width: int, height: int) -> list[View]:
        return paper_query_views(width, height) if self.name == "paper" else [View("full")]

    def reference_views(self, width: int, height: int) -> list[View]:
        return paper_reference_views(width, height) if self.name == "paper" else [View("full")]

    def query_images(self, image: Image.Image) -> list[Image.Image]:
        return [render_view(image, view) for view in self.query_views(image.width, image.height)]

    def reference_images(self, image: Image.Image) -> list[Image.Image]:
        return [render_view(image, view) for view in self.reference_views(image.width, image.height)]

    @property
    def num_query_views(self) -> int:
        return len(self.query_views(12, 12))

    @property
    def num_reference_views(self) -> int:
        return len(self.reference_views(12, 12))


def check_mode(mode: str, choices: tuple[str, ...], option: str) -> str:
    """``mode`` if it is one of ``choices``, else a :class:`ConfigError` naming ``option``."""
    if mode not in choices:
        raise ConfigError(f"{option} must be one of {', '.join(choices)}, got {mode!r}")
    return mode


def matcher_view_preset(mode: str) -> ViewPreset:
    """The views a matcher LCE mode needs: the paper views for ``paper`` and ``all``, else the full image."""
    check_mode(mode, MATCHER_LCE_MODES, "matcher_lce")
    return ViewPreset("none" if mode == "none" else "paper")


def matcher_view_pairs(mode: str, num_query_views: int, num_reference_views: int) -> list[tuple[int, int]]:
    """(query view, reference view) index pairs the matcher scores; view 0 is the full image.

    ``none``: ``[(0, 0)]``; ``paper``: every query view with the full reference, then the full
    query with every other reference view (``Vq + Vr - 1`` pairs: 35 for 26 x 10); ``all``: every
    combination (``Vq * Vr``: 260).
    """
    check_mode(mode, MATCHER_LCE_MODES, "matcher_lce")
    if mode == "none":
        return [(0, 0)]
    if mode == "paper":
        return [(q, 0) for q in range(num_query_views)] + [(0, r) for r in range(1, num_reference_views)]
    return [(q, r) for q in range(num_query_views) for r in range(num_reference_views)]
