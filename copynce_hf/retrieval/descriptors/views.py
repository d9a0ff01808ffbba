"""Local crops ensembling (LCE) views: the matcher's 26 query / 10 reference views and the descriptor's
45 query / 9 reference views.

Supplementary "Local Crops Ensembling": query and reference are cut into a fixed set of views,
every compared view pair is scored, and the pair's score is the maximum (highest cosine for a
descriptor, highest copy probability for the matcher). Two view presets reproduce the views of
the authors' inference code, whose matcher and descriptor use different ones. With ``w``, ``h``
the image's width and height (integer division, as PIL crop boxes ``(left, top, right, bottom)``):

``matcher-views`` (the matcher's LCE, also selectable for descriptors):

* query (26 views): the full image; the five one-third crops (the centre box
  ``[w/3, 2w/3] x [h/3, 2h/3]`` and four boxes centred at (1/3, 1/3), (2/3, 1/3), (1/3, 2/3),
  (2/3, 2/3) of the width and height: ``[w/6, w/2]`` or ``[w/2, 5w/6]``, likewise in height);
  the four quarters; the nine ninths (row-major); seven rotations of the full image by 45, 90,
  ..., 315 degrees counter-clockwise with expansion (bicubic, black corners);
* reference (10 views): the full image, the five one-third crops and the four quarters.

``authors`` (the descriptor's LCE of the authors' evaluation, supplementary "More about Candidates
List for Matcher"): the query views come in four groups, and every query view keeps its own
``k``-NN references, ``k`` set per group (:data:`AUTHORS_GROUP_TOP_K`: 100, 10, 10, 4, i.e.
100 + 10 * 10 + 9 * 10 + 25 * 4 = 390 candidates per query before duplicates are removed):

* group 1 (1 view): the full image;
* group 2 (10 views): the left, centre and right vertical halves ``[0, w/2]``, ``[w/4, 3w/2]``,
  ``[w/2, w]`` (full height; the centre box reaches 3w/2, past the right edge, exactly as theirs,
  so its right part is black padding), the top, centre and bottom horizontal halves ``[0, h/2]``,
  ``[h/4, 3h/4]``, ``[h/2, h]``, and four corner boxes of 0.707 of each side (half the area):
  ``[0, int(0.707 w)]`` or ``[int(0.293 w), w]``, likewise in height (top left, top right,
  bottom left, bottom right);
* group 3 (9 views): half-width, half-height boxes at quarter steps, row-major:
  ``[i w/4, (i + 2) w/4] x [j h/4, (j + 2) h/4]`` for ``j, i`` in 0..2;
* group 4 (25 views): boxes of 2/6 of each side on a 1/6 grid, row-major:
  ``[i w/6, (i + 2) w/6] x [j h/6, (j + 2) h/6]`` for ``j, i`` in 0..4;
* reference (9 views): the full image; the centre box ``[w/6, 5w/6] x [h/6, 5h/6]``; four
  half-size boxes ``[w/8, 5w/8]`` or ``[3w/8, 7w/8]``, likewise in height (top left, top right,
  bottom left, bottom right); rotations of the full image by 90, 180 and 270 degrees.

Which view pairs the matcher scores (:func:`matcher_view_pairs`): ``none`` the full images only
(1 pair); ``paper`` every query view with the full reference plus the full query with every
reference crop (26 + 9 = 35 pairs, as the authors' code does); ``all`` every combination (260).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from PIL import Image

from ...modeling.errors import ConfigError

#: ``--descriptor-lce`` choices: views embedded per image at search time.
DESCRIPTOR_LCE_MODES = ("none", "matcher-views", "authors")
#: Earlier name of ``matcher-views``, still read from saved indexes (``index.json`` ``views``).
LEGACY_VIEW_PRESETS = {"paper": "matcher-views"}
#: ``--matcher-lce`` choices: which (query view, reference view) pairs the matcher scores.
MATCHER_LCE_MODES = ("none", "paper", "all")
#: Rotations of the full query in the matcher's views, degrees counter-clockwise.
PAPER_ROTATIONS = (45, 90, 135, 180, 225, 270, 315)
#: Rotations of the full reference in the authors' descriptor views, degrees counter-clockwise.
AUTHORS_REFERENCE_ROTATIONS = (90, 180, 270)
#: References kept per query view in each of the four query view groups of the ``authors`` preset.
AUTHORS_GROUP_TOP_K = (100, 10, 10, 4)

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


def authors_query_view_groups(width: int, height: int) -> list[list[View]]:
    """The 45 query views of the ``authors`` preset in their four groups (1, 10, 9 and 25 views)."""
    w, h = width, height
    halves = [(0, 0, w // 2, h), (w // 4, 0, 3 * w // 2, h), (w // 2, 0, w, h),
              (0, 0, w, h // 2), (0, h // 4, w, 3 * h // 4), (0, h // 2, w, h)]
    near, far_w, far_h = (int(0.707 * w), int(0.707 * h)), int(0.293 * w), int(0.293 * h)
    corners = [(0, 0, near[0], near[1]), (far_w, 0, w, near[1]), (0, far_h, near[0], h), (far_w, far_h, w, h)]
    quarter_steps = [(i * w // 4, j * h // 4, (i + 2) * w // 4, (j + 2) * h // 4) for j in range(3) for i in range(3)]
    sixth_steps = [(i * w // 6, j * h // 6, (i + 2) * w // 6, (j + 2) * h // 6) for j in range(5) for i in range(5)]
    return [[View("full")], [View("crop", box) for box in halves + corners],
            [View("crop", box) for box in quarter_steps], [View("crop", box) for box in sixth_steps]]


def authors_reference_views(width: int, height: int) -> list[View]:
    """The 9 reference views of the ``authors`` preset (full, centre 2/3 box, four half boxes, 3 rotations)."""
    w, h = width, height
    crops = [(w // 6, h // 6, 5 * w // 6, 5 * h // 6),
             (w // 8, h // 8, 5 * w // 8, 5 * h // 8), (3 * w // 8, h // 8, 7 * w // 8, 5 * h // 8),
             (w // 8, 3 * h // 8, 5 * w // 8, 7 * h // 8), (3 * w // 8, 3 * h // 8, 7 * w // 8, 7 * h // 8)]
    return [View("full"), *(View("crop", box) for box in crops),
            *(View("rotate", angle=a) for a in AUTHORS_REFERENCE_ROTATIONS)]


def paper_query_views(width: int, height: int) -> list[View]:
    """The 26 query views of the matcher's views (order: full, 5 thirds, 4 quarters, 9 ninths, 7 rotations)."""
    crops = one_third_boxes(width, height) + quarter_boxes(width, height) + ninth_boxes(width, height)
    return [View("full"), *(View("crop", box) for box in crops), *(View("rotate", angle=a) for a in PAPER_ROTATIONS)]


def paper_reference_views(width: int, height: int) -> list[View]:
    """The 10 reference views of the matcher's views (full, 5 thirds, 4 quarters)."""
    crops = one_third_boxes(width, height) + quarter_boxes(width, height)
    return [View("full"), *(View("crop", box) for box in crops)]


def render_view(image: Image.Image, view: View) -> Image.Image:
    """Cut or rotate ``image`` as ``view`` says (a degenerate crop of a tiny image keeps 1 pixel; a box
    reaching past the image is padded with black, as PIL does)."""
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
    """A named set of LCE views: ``none`` (the full image only), ``matcher-views`` (26 query / 10 reference
    views) or ``authors`` (45 query views in four groups / 9 reference views); ``paper``, the earlier name of
    ``matcher-views``, is read as it."""

    name: str = "none"

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", LEGACY_VIEW_PRESETS.get(self.name, self.name))
        if self.name not in DESCRIPTOR_LCE_MODES:
            raise ConfigError(f"unknown LCE view preset {self.name!r}; choose one of {', '.join(DESCRIPTOR_LCE_MODES)}")

    def query_view_groups(self, width: int, height: int) -> list[list[View]]:
        """The query views in groups that keep their own number of neighbours (one group but for ``authors``)."""
        if self.name == "authors":
            return authors_query_view_groups(width, height)
        return [paper_query_views(width, height) if self.name == "matcher-views" else [View("full")]]

    def query_views(self, width: int, height: int) -> list[View]:
        return [view for group in self.query_view_groups(width, height) for view in group]

    def reference_views(self, width: int, height: int) -> list[View]:
        if self.name == "authors":
            return authors_reference_views(width, height)
        return paper_reference_views(width, height) if self.name == "matcher-views" else [View("full")]

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

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """Query views per group, in view order (``(1, 10, 9, 25)`` for ``authors``)."""
        return tuple(len(group) for group in self.query_view_groups(12, 12))

    @property
    def group_top_k(self) -> tuple[int, ...] | None:
        """References kept per query view in each group, or ``None`` where the preset keeps the best pair per
        image pair (then the search keeps the top ``k`` of the maximum over view pairs)."""
        return AUTHORS_GROUP_TOP_K if self.name == "authors" else None


def check_mode(mode: str, choices: tuple[str, ...], option: str) -> str:
    """``mode`` if it is one of ``choices``, else a :class:`ConfigError` naming ``option``."""
    if mode not in choices:
        raise ConfigError(f"{option} must be one of {', '.join(choices)}, got {mode!r}")
    return mode


def matcher_view_preset(mode: str) -> ViewPreset:
    """The views a matcher LCE mode needs: the matcher's views for ``paper`` and ``all``, else the full image."""
    check_mode(mode, MATCHER_LCE_MODES, "matcher_lce")
    return ViewPreset("none" if mode == "none" else "matcher-views")


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
