"""Image input handling: every mode to RGB, EXIF orientation, refused files with clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from copynce_hf.images import image_size, load_image, to_rgb
from copynce_hf.modeling.errors import CopyNCEError, ImageLoadError


def save(image: Image.Image, path, **kwargs):
    image.save(path, **kwargs)
    return path


def test_greyscale_and_palette_convert_to_rgb(tmp_path):
    grey = Image.fromarray(np.full((20, 30), 77, np.uint8), "L")
    rgb = load_image(save(grey, tmp_path / "g.png"))
    assert rgb.mode == "RGB" and rgb.getpixel((3, 3)) == (77, 77, 77)
    palette = Image.new("RGB", (30, 20), (10, 200, 30)).convert("P", palette=Image.Palette.ADAPTIVE)
    assert load_image(save(palette, tmp_path / "p.png")).getpixel((0, 0)) == (10, 200, 30)
    transparent = Image.new("P", (30, 20), 0)
    transparent.putpalette([0, 0, 0, 200, 0, 0])
    transparent.info["transparency"] = 0
    assert load_image(save(transparent, tmp_path / "t.png")).getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize("mode", ["LA", "RGBA"])
def test_alpha_is_composited_on_white(tmp_path, mode):
    image = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    image.paste((255, 0, 0, 255), (0, 0, 10, 20))
    image.paste((0, 0, 0, 128), (10, 0, 20, 20))
    if mode == "LA":
        image = image.convert("LA")
    rgb = load_image(save(image, tmp_path / "a.png"))
    left, right = rgb.getpixel((2, 2)), rgb.getpixel((15, 2))
    assert right == pytest.approx((127, 127, 127), abs=2)  # half-transparent black on white
    if mode == "RGBA":
        assert left == (255, 0, 0)


def test_cmyk_and_sixteen_bit(tmp_path):
    cmyk = Image.new("CMYK", (20, 20), (0, 255, 255, 0))  # pure red in CMYK
    assert load_image(save(cmyk, tmp_path / "c.jpg", quality=100)).getpixel((5, 5)) == pytest.approx(
        (255, 0, 0), abs=6
    )
    deep = Image.new("I;16", (20, 20))
    deep.paste(32896, (0, 0, 20, 20))
    value = to_rgb(deep).getpixel((0, 0))
    assert value == (128, 128, 128)  # 32896 / 65535 of full scale, not clipped to 255


def test_exif_orientation_is_applied(tmp_path):
    image = Image.new("RGB", (40, 20), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 10, 20))  # white band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when displayed
    path = tmp_path / "rotated.jpg"
    image.save(path, exif=exif, quality=95)
    shown = load_image(path)
    assert shown.size == (20, 40)
    top_row = np.asarray(shown)[:5].mean()
    bottom_row = np.asarray(shown)[-5:].mean()
    assert top_row > 200 and bottom_row < 50  # the left band is now at the top


def test_refusals_name_the_file(tmp_path):
    with pytest.raises(ImageLoadError, match="missing.png"):
        load_image(tmp_path / "missing.png")
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ImageLoadError, match="corrupt.jpg"):
        load_image(corrupt)
    full = tmp_path / "full.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(full)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(full.read_bytes()[: len(full.read_bytes()) // 2])
    with pytest.raises(ImageLoadError, match="truncated"):
        load_image(truncated)
    tiny = save(Image.new("RGB", (8, 40)), tmp_path / "tiny.png")
    with pytest.raises(ImageLoadError, match="too small: 8x40, minimum 16"):
        load_image(tiny)
    big = save(Image.new("L", (300, 300)), tmp_path / "bomb.png")
    with pytest.raises(ImageLoadError, match="too large: 300x300"):
        load_image(big, max_pixels=10_000)
    assert issubclass(ImageLoadError, CopyNCEError)


def test_bytes_and_pil_inputs():
    image = Image.new("RGB", (20, 20), (1, 2, 3))
    assert load_image(image).getpixel((0, 0)) == (1, 2, 3)
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    assert load_image(buffer.getvalue()).getpixel((0, 0)) == (1, 2, 3)


def test_max_side_decodes_large_jpegs_at_a_reduced_scale(tmp_path):
    """Draft mode: the smallest DCT scale whose longer side is still at least ``max_side``; the
    result looks like the full decode shrunk; PNGs and small JPEGs are decoded in full."""
    ys, xs = np.mgrid[0:600, 0:800]
    pixels = np.stack([xs * 255 // 799, ys * 255 // 599, (xs + ys) % 256 // 4 + 64], -1).astype(np.uint8)
    Image.fromarray(pixels, "RGB").save(tmp_path / "big.jpg", quality=95)
    Image.fromarray(pixels, "RGB").save(tmp_path / "big.png")
    full = load_image(tmp_path / "big.jpg")
    assert full.size == (800, 600)
    assert load_image(tmp_path / "big.jpg", max_side=150).size == (200, 150)  # 1/4: 200 >= 150 > 100
    assert load_image(tmp_path / "big.jpg", max_side=400).size == (400, 300)  # 1/2
    assert load_image(tmp_path / "big.jpg", max_side=401).size == (800, 600)  # 1/2 would be too small
    assert load_image(tmp_path / "big.jpg", max_side=1000).size == (800, 600)
    assert load_image(tmp_path / "big.png", max_side=150).size == (800, 600)
    reduced = np.asarray(load_image(tmp_path / "big.jpg", max_side=400), dtype=np.float64)
    shrunk = np.asarray(full.resize((400, 300), Image.BOX), dtype=np.float64)
    assert np.abs(reduced - shrunk).mean() < 2.0
    # The minimum side is judged on the file, not on the reduced decode.
    Image.fromarray(pixels[:40], "RGB").save(tmp_path / "strip.jpg")  # 800x40
    assert min(load_image(tmp_path / "strip.jpg", max_side=100, min_side=16).size) >= 16
    with pytest.raises(ImageLoadError, match="too small"):
        load_image(tmp_path / "strip.jpg", max_side=100, min_side=64)


def test_pillow_bomb_check_follows_the_package_limit(tmp_path, monkeypatch):
    """Pillow refuses images above twice its own process-wide limit (89.5 megapixels by default, so a
    200-megapixel photograph) before the package's limit applies; load_image reads the header with
    Pillow's check off and applies its own ``max_pixels``, and leaves Pillow's setting as it was."""
    import warnings

    path = save(Image.new("RGB", (64, 64), (9, 9, 9)), tmp_path / "photo.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # a Pillow limit far below the image
    with pytest.raises(Image.DecompressionBombError):
        Image.open(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning either
        assert load_image(path).size == (64, 64)
    assert Image.MAX_IMAGE_PIXELS == 100
    with pytest.raises(ImageLoadError, match=r"too large: 64x64 = 4096 pixels; the limit is 4000 pixels; raise it"):
        load_image(path, max_pixels=4000)


def test_skip_reasons_are_plain_words(tmp_path):
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    text = tmp_path / "text.jpg"
    text.write_text("hello")
    dot = save(Image.new("RGB", (1, 1)), tmp_path / "dot.png")
    cases = {empty: ("empty file", "is an empty file"), text: ("not an image", "is not an image"),
             dot: ("too small", "is too small: 1x1, minimum 16"), tmp_path / "none.png": ("missing", "no such file")}
    for path, (reason, words) in cases.items():
        for read in (load_image, image_size):  # the header alone gives the same refusal
            with pytest.raises(ImageLoadError, match=words) as caught:
                read(path)
            assert caught.value.reason == reason and "BufferedReader" not in str(caught.value)


def test_image_size_is_the_displayed_size_read_from_the_header(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated a quarter turn: displayed 30 wide, 60 high
    save(Image.new("RGB", (60, 30)), tmp_path / "turned.jpg", exif=exif)
    assert image_size(tmp_path / "turned.jpg") == load_image(tmp_path / "turned.jpg").size == (30, 60)
    with pytest.raises(ImageLoadError, match="too large") as caught:
        image_size(tmp_path / "turned.jpg", max_pixels=100)
    assert caught.value.reason == "too large"
