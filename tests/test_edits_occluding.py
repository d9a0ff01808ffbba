"""Occluding edits: the pixels marked untraced are exactly those the overlay covers."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

from copynce_hf.modeling.errors import EditParameterError
from copynce_hf.pixtrace import CoordinateTable
from copynce_hf.pixtrace.edits import (
    COVERED_ALPHA,
    OverlayEmoji,
    OverlayImage,
    OverlayStripes,
    OverlayText,
    RandomErasing,
    edit_from_dict,
    emoji_names,
)

HEIGHT, WIDTH = 150, 200
BACKGROUND = (1, 254, 3)  # a colour none of the overlays below contains

EDITS = [
    OverlayEmoji(emoji="smileys/alien.png", size=0.4, x=0.1, y=0.2),
    OverlayEmoji(emoji="flags/" + next(n.split("/")[1] for n in emoji_names() if n.startswith("flags/")),
                 size=0.5, x=0.8, y=0.7, opacity=0.7),  # clipped by the border, half transparent
    OverlayText(text="Copy 42!", font="IBMPlexSans-Bold.ttf", font_size=0.25, color=(200, 0, 40), x=0.05, y=0.3),
    OverlayText(text="two\nlines", font="Montserrat-Black.ttf", font_size=0.2, color=(0, 0, 255), opacity=0.8,
                x=0.5, y=0.1),
    OverlayImage(overlay={"kind": "gradient", "seed": 4, "size": [40, 90]}, size=0.5, x=0.6, y=0.1, opacity=0.9),
    OverlayImage(overlay={"kind": "noise", "seed": 1, "size": [50, 50]}, size=0.3, x=0.1, y=0.6, opacity=0.4),
    OverlayStripes(line_width=0.3, line_angle=0.0, line_density=0.6),
    OverlayStripes(line_width=0.4, line_color=(255, 0, 255), line_angle=35.0, line_density=0.7, line_type="dotted",
                   line_opacity=0.8),
    OverlayStripes(line_width=0.5, line_angle=90.0, line_density=0.5, line_type="dashed", line_opacity=0.4),
    RandomErasing(x=0.2, y=0.3, width=0.5, height=0.25, fill=(10, 20, 30)),
]


def background(height: int = HEIGHT, width: int = WIDTH) -> Image.Image:
    return Image.new("RGB", (width, height), BACKGROUND)


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: e.name)
def test_untraced_pixels_are_exactly_the_covered_ones(edit):
    image = background()
    table = CoordinateTable.identity(HEIGHT, WIDTH)
    edited, new_table = edit(image, table)
    coverage = edit.coverage(HEIGHT, WIDTH)
    assert edited.mode == "RGB" and edited.size == image.size and coverage.shape == (HEIGHT, WIDTH)
    assert coverage.any()

    changed = np.any(np.asarray(edited) != np.asarray(image), axis=-1)
    # The pixel work (AugLy for emoji and stripes, PIL here otherwise) touches no pixel the
    # coverage leaves out, and changes every pixel it draws over with weight > 1/2 ...
    assert not np.any(changed & (coverage == 0))
    assert np.all(changed[coverage >= COVERED_ALPHA])
    # ... and the table is occluded exactly where coverage > 1/2, untouched elsewhere.
    np.testing.assert_array_equal(new_table.valid, coverage < COVERED_ALPHA)
    np.testing.assert_array_equal(new_table.coords[new_table.valid], table.coords[new_table.valid])


def _opacity_key(edit) -> str:
    return "opacity" if edit.name == "overlay_text" else "line_opacity"


@pytest.mark.parametrize("edit", [e for e in EDITS if e.name in ("overlay_text", "overlay_stripes")],
                         ids=lambda e: e.name)
def test_fully_covered_pixels_take_the_overlay_colour(edit):
    """Opaque, the glyphs' and stripes' inner pixels (coverage 255) take the overlay's colour exactly; at the
    edit's own opacity the same pixels (its coverage at its maximum, 255 x opacity) take the colour blended
    over the background by that opacity."""
    colour = np.asarray(edit.color if edit.name == "overlay_text" else edit.line_color, dtype=float)
    opaque = dataclasses.replace(edit, **{_opacity_key(edit): 1.0})
    edited, _ = opaque(background(), CoordinateTable.identity(HEIGHT, WIDTH))
    full = opaque.coverage(HEIGHT, WIDTH) == 255
    assert full.sum() > 100  # every case draws whole glyphs or stripes
    assert np.all(np.asarray(edited)[full] == colour.astype(np.uint8))

    opacity = getattr(edit, _opacity_key(edit))
    edited, _ = edit(background(), CoordinateTable.identity(HEIGHT, WIDTH))
    coverage = edit.coverage(HEIGHT, WIDTH)
    np.testing.assert_array_equal(coverage == round(255 * opacity), full)
    blended = opacity * colour + (1 - opacity) * np.asarray(BACKGROUND, dtype=float)
    assert np.abs(np.asarray(edited)[full] - blended).max() <= 0.5  # rounded to 8 bits


def test_partially_transparent_pixels_change_but_stay_traced():
    edit = OverlayText(text="Anti-aliased", font_size=0.2, x=0.05, y=0.4)
    edited, table = edit(background(), CoordinateTable.identity(HEIGHT, WIDTH))
    coverage = edit.coverage(HEIGHT, WIDTH)
    faint = (coverage > 0) & (coverage < COVERED_ALPHA)
    assert faint.sum() > 20  # glyph borders
    changed = np.any(np.asarray(edited) != np.asarray(background()), axis=-1)
    assert changed[faint].mean() > 0.9 and table.valid[faint].all()


def test_low_opacity_overlay_covers_nothing():
    edit = OverlayImage(overlay={"kind": "solid", "color": [0, 0, 0], "size": [10, 10]}, size=0.5, opacity=0.4)
    edited, table = edit(background(), CoordinateTable.identity(HEIGHT, WIDTH))
    assert table.valid.all()
    assert np.any(np.asarray(edited) != np.asarray(background()))


def test_overlay_geometry_follows_parameters():
    emoji = OverlayEmoji(emoji="smileys/alien.png", size=0.4, x=0.25, y=0.5)
    rows, cols = np.nonzero(emoji.coverage(HEIGHT, WIDTH))
    assert rows.min() >= int(0.5 * HEIGHT) and cols.min() >= int(0.25 * WIDTH)
    assert rows.max() - rows.min() + 1 <= int(0.4 * HEIGHT)
    assert rows.max() - rows.min() + 1 > 0.7 * int(0.4 * HEIGHT)

    box = RandomErasing(x=0.1, y=0.2, width=0.3, height=0.4).box(100, 200)
    assert box == (20, 20, 80, 60)
    pasted = OverlayImage(overlay={"kind": "solid", "color": [9, 9, 9], "size": [20, 40]}, size=0.2, x=0.5, y=0.5)
    rows, cols = np.nonzero(pasted.coverage(100, 200))
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (50, 69, 100, 139)

    text = OverlayText(text="A", font_size=0.3, x=0.5, y=0.5)
    rows, cols = np.nonzero(text.coverage(100, 200))
    assert rows.min() >= 50 and cols.min() >= 100 and rows.max() < 50 + 40


def test_occlusion_composes_with_an_earlier_geometric_table():
    source = CoordinateTable.identity(80, 120)
    shift = np.array([[1.0, 0.0, 30.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    table = source.warp(shift, (HEIGHT, WIDTH))  # columns >= 90 fall off the source
    edit = RandomErasing(x=0.0, y=0.0, width=0.25, height=1.0)
    _, occluded = edit(background(), table)
    expected = table.valid.copy()
    expected[:, :50] = False
    np.testing.assert_array_equal(occluded.valid, expected)


def test_overlay_image_from_a_file_and_from_pil(tmp_path):
    overlay = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 60, 3), dtype=np.uint8))
    path = tmp_path / "overlay.png"
    overlay.save(path)
    from_file = OverlayImage(overlay={"kind": "file", "path": str(path)}, size=0.4, x=0.2, y=0.2)
    from_pil = OverlayImage(overlay=overlay, size=0.4, x=0.2, y=0.2)
    table = CoordinateTable.identity(HEIGHT, WIDTH)
    image_a, table_a = from_file(background(), table)
    image_b, table_b = from_pil(background(), table)
    np.testing.assert_array_equal(np.asarray(image_a), np.asarray(image_b))
    np.testing.assert_array_equal(table_a.valid, table_b.valid)
    assert (~table_a.valid).sum() == 60 * 120  # 0.4 * 150 rows, width kept at 2:1


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: e.name)
def test_replay_from_json_is_exact(edit):
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8))
    table = CoordinateTable.identity(HEIGHT, WIDTH)
    replayed = edit_from_dict(json.loads(json.dumps(edit.to_dict())))
    assert replayed == edit
    first, second = edit(image, table), replayed(image, table)
    np.testing.assert_array_equal(np.asarray(first[0]), np.asarray(second[0]))
    np.testing.assert_array_equal(first[1].valid, second[1].valid)


@pytest.mark.parametrize(
    "cls, params, bad",
    [
        (OverlayEmoji, {"size": 0.0}, "size"),
        (OverlayEmoji, {"opacity": 1.5}, "opacity"),
        (OverlayEmoji, {"x": float("nan")}, "x"),
        (OverlayEmoji, {"emoji": "smileys/no_such_emoji.png"}, "emoji"),
        (OverlayText, {"text": ""}, "text"),
        (OverlayText, {"font": "NoSuchFont.ttf"}, "font"),
        (OverlayText, {"color": (300, 0, 0)}, "color"),
        (OverlayText, {"font_size": -0.1}, "font_size"),
        (OverlayImage, {"overlay": "not a spec"}, "overlay"),
        (OverlayImage, {"y": 1.2}, "y"),
        (OverlayStripes, {"line_type": "wavy"}, "line_type"),
        (OverlayStripes, {"line_density": 1.0}, "line_density"),
        (OverlayStripes, {"line_angle": float("inf")}, "line_angle"),
        (RandomErasing, {"width": 0.0}, "width"),
        (RandomErasing, {"x": 0.8, "width": 0.5}, "width"),
        (RandomErasing, {"fill": (0, 0)}, "fill"),
    ],
)
def test_bad_parameters_are_refused_at_construction(cls, params, bad):
    with pytest.raises(EditParameterError, match=bad):
        cls(**params)
