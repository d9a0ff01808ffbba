"""The gallery's Pillow pictures of a pair's maps: the probe where it is, the colours where the maps peak, the files."""

import numpy as np
import pytest
from PIL import Image

from copynce_hf.reports.affinity import AffinityMaps
from copynce_hf.reports.affinity_panels import PANEL_SIDE, affinity_panels, save_affinity_panels

GRID, PATCH = 7, 16  # a 112-pixel input of 16-pixel patches


def _maps(size=(112, 112), flat=False) -> AffinityMaps:
    rows, cols = size[1] // PATCH, size[0] // PATCH
    affinity = np.full((rows, cols), 0.01, dtype=np.float32)
    entropy = np.full((rows, cols), 3.0, dtype=np.float32)
    if not flat:
        affinity[5, 1] = 0.9  # the probe's peak over the reference
        entropy[2, 4] = 0.1  # the most confidently matched query patch
    gray = Image.new("RGB", size, (128, 128, 128))
    return AffinityMaps(gray, gray.copy(), (2, 4), affinity, entropy, PATCH)


def _cell_centre(picture_left: int, top: int, row: int, col: int, scale: float) -> tuple[int, int]:
    return round(picture_left + (col + 0.5) * PATCH * scale), round(top + (row + 0.5) * PATCH * scale)


def test_the_probe_box_and_the_peaks_are_drawn_where_the_maps_put_them():
    affinity, entropy = affinity_panels(_maps())
    scale, gap, top = PANEL_SIDE / 112, 8, 16  # panels start after the gap, under one caption line
    pixels = np.asarray(affinity)
    probe_left, probe_top = round(gap + 4 * PATCH * scale), round(top + 2 * PATCH * scale)
    assert tuple(pixels[probe_top + 5, probe_left]) == (0, 255, 0)  # the green box's left side
    reference_left = gap + PANEL_SIDE + gap
    x, y = _cell_centre(reference_left, top, 5, 1, scale)
    red, green, blue = (int(v) for v in pixels[y, x])
    assert red > 110 and green < 80 and blue < 80  # jet's top, dark red, half blended with the gray image
    x, y = _cell_centre(reference_left, top, 0, 6, scale)
    red, green, blue = (int(v) for v in pixels[y, x])
    assert blue > 110 and red < 80 and green < 80  # jet's bottom, dark blue, elsewhere
    pixels = np.asarray(entropy)
    x, y = _cell_centre(gap, top, 2, 4, scale)
    red, green, blue = (int(v) for v in pixels[y, x])
    assert red > 180 and green > 180 and blue < 120  # viridis_r's bright yellow: low entropy
    x, y = _cell_centre(gap, top, 0, 0, scale)
    red, green, blue = (int(v) for v in pixels[y, x])
    assert blue > red and green < 100  # dark purple: high entropy


@pytest.mark.parametrize("size", [(224, 112), (112, 224)])
def test_pictures_keep_the_images_aspect_and_flat_maps_draw(size):
    affinity, entropy = affinity_panels(_maps(size, flat=True))
    longer, shorter = PANEL_SIDE, PANEL_SIDE // 2
    panel_width = longer if size[0] > size[1] else shorter
    assert affinity.width == 8 + panel_width + 8 + panel_width + 8 and entropy.width == 8 + panel_width + 8
    assert affinity.height > (shorter if size[0] > size[1] else longer)


def test_saving_writes_both_pictures_and_the_raw_maps(tmp_path):
    maps = _maps()
    written = save_affinity_panels(maps, tmp_path / "pair")
    assert sorted(path.name for path in (tmp_path / "pair").iterdir()) == ["affinity_entropy.png", "maps.npz",
                                                                            "token_affinity.png"]
    for name in ("token_affinity", "affinity_entropy"):
        with Image.open(written[name]) as image:
            assert image.mode == "RGB"
    stored = np.load(written["maps"])
    np.testing.assert_array_equal(stored["affinity"], maps.affinity)
    np.testing.assert_array_equal(stored["entropy"], maps.entropy)
    assert tuple(stored["patch"]) == (2, 4)
