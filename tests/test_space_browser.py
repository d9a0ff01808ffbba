"""The Space (spaces/copynce/app.py) in a real browser: headless Debian Chromium driven by Playwright.

The app runs in a subprocess on a free local port; the test goes through the three tabs with the
bundled images (the bundled example, uploads that the inputs show as images, a click on the query,
the score, the heatmaps drawn with no Gradio label over their titles) and checks that bad uploads
(a text file as the query, a corrupt zip of references) show a message on the page.
It skips, saying why, where gradio, playwright or the chromium binary is missing, and fails there in CI
(``make install`` and ``make browser`` install them; ``.ci/run`` runs both). Playwright's own browser downloads are never
used: the test points Playwright at the system's chromium.

Set ``COPYNCE_SPACE_SCREENSHOT=path.png`` to save a screenshot of the Compare tab on the bundled example
(``spaces/copynce/screenshot.png``, the README's picture).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from conftest import free_port, missing_extra, require_extra

REPO_ROOT = Path(__file__).resolve().parents[1]
APP = REPO_ROOT / "spaces" / "copynce" / "app.py"
BUNDLED = REPO_ROOT / "copynce_hf" / "assets" / "images"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module", autouse=True)
def browser_extras():
    """Every test here needs gradio, playwright and chromium (skips without one; fails in CI)."""
    require_extra("gradio", "space")
    require_extra("playwright", "space")
    if _chromium() is None:
        missing_extra("no chromium binary (/usr/bin/chromium): apt-get install chromium (make browser does it as "
                      "root)")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """Start the app in a subprocess on a free port; yield its URL; stop it."""
    port = free_port()
    log = tmp_path_factory.mktemp("space") / "app.log"
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1",
               GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=os.pathsep.join(
                   [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("COPYNCE_DESCRIPTOR", None)
    env.pop("COPYNCE_MATCHER", None)
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, str(APP)], cwd=REPO_ROOT, env=env, stdout=output,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                pytest.fail(f"the app exited with status {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the app did not answer on {url} within 180 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A traced copy of a bundled image, a zip of three bundled references, and three bad uploads."""
    from copynce_hf.demo import interactive
    from copynce_hf.images import load_image

    folder = tmp_path_factory.mktemp("uploads")
    copy = interactive.make_copy(load_image(BUNDLED / "astronaut.jpg"), "evaluation", 3)
    copy.image.save(folder / "astronaut_copy.png")
    with zipfile.ZipFile(folder / "references.zip", "w") as archive:
        for name in ("astronaut.jpg", "coffee.jpg", "rocket.jpg"):
            archive.write(BUNDLED / name, f"refs/{name}")
        archive.writestr("refs/notes.txt", "not an image")
    (folder / "notes.txt").write_text("this is not an image\n")
    (folder / "notes.png").write_text("this is not an image either, whatever its name says\n")
    (folder / "broken.zip").write_bytes(b"PK\x03\x04 this is not really a zip archive")
    return {"copy": folder / "astronaut_copy.png", "zip": folder / "references.zip",
            "text": folder / "notes.txt", "fake_png": folder / "notes.png", "broken_zip": folder / "broken.zip"}


def _wait_text(page, selector: str, pattern: str, timeout: float = 60.0) -> str:
    """Wait until the element's text matches the regular expression; return the text."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = page.inner_text(selector) if page.query_selector(selector) else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{selector} never showed {pattern!r}; last text: {text!r}")


def _click_until(page, selector: str, position: dict, text_selector: str, pattern: str, tries: int = 4) -> str:
    """Click ``selector`` at ``position`` until ``text_selector`` shows ``pattern`` and still shows it a second
    later (a slower event started before the click can overwrite the click's result once); return the text."""
    for attempt in range(tries):
        page.click(selector, position=position)
        try:
            _wait_text(page, text_selector, pattern, timeout=20.0)
        except AssertionError:
            if attempt + 1 == tries:
                raise
            continue
        time.sleep(1.0)
        text = page.inner_text(text_selector)
        if re.search(pattern, text):
            return text
    raise AssertionError(f"{text_selector} did not keep showing {pattern!r} after {tries} clicks")


def _image_width(page, selector: str, timeout: float = 30.0) -> int:
    """Natural width of the loaded <img> inside ``selector`` (0 while absent or empty)."""
    script = "(e) => (e.complete && e.getAttribute('src')) ? e.naturalWidth : 0"
    deadline = time.monotonic() + timeout
    width = 0
    while time.monotonic() < deadline:
        element = page.query_selector(f"{selector} img")
        width = element.evaluate(script) if element else 0
        if width > 0:
            return width
        time.sleep(0.2)
    return width


def _file_width(path: Path) -> int:
    from PIL import Image

    with Image.open(path) as image:
        return image.width


def _upload(page, elem_id: str, path: Path) -> None:
    """Upload into an image input: done once it shows the image (an <img> whose source is the uploaded file)."""
    page.set_input_files(f"#{elem_id} input[type=file]", str(path))
    deadline = time.monotonic() + 30
    while not page.query_selector(f"#{elem_id} img[src*='{path.name}']"):
        assert time.monotonic() < deadline, f"#{elem_id} never showed the uploaded {path.name}"
        time.sleep(0.2)


def _upload_file(page, elem_id: str, path: Path) -> None:
    """Upload into a file input (the zip of references): done once it lists the file's name."""
    page.set_input_files(f"#{elem_id} input[type=file]", str(path))
    _wait_text(page, f"#{elem_id}", re.escape(path.stem), timeout=30)


def _assert_no_label_over(page, selector: str) -> None:
    """No label drawn over the image: Gradio floats a shown label (``data-testid=block-label``) over its top left."""
    assert page.query_selector(f"{selector} img"), f"{selector} shows no image"
    shown = [label.inner_text() for label in page.query_selector_all(f"{selector} [data-testid=block-label]")
             if label.is_visible()]
    assert not shown, f"the label {shown} is drawn over {selector}"


def _save_screenshot(page, path: str) -> None:
    """The page from its top to the bottom of the Compare results, as a dithered 256-colour PNG (about 300 KB).

    The palette is refined by k-means and the image dithered onto it, so the heatmaps keep their colours.
    """
    from PIL import Image

    bottom = page.evaluate("""() => window.scrollY + Math.max(...['#compare-affinity', '#compare-entropy'].map(
        (selector) => document.querySelector(selector).getBoundingClientRect().bottom))""")
    width = page.viewport_size["width"]
    page.screenshot(path=path, clip={"x": 0, "y": 0, "width": width, "height": bottom + 16}, full_page=True)
    with Image.open(path) as shot:
        shot = shot.convert("RGB")
    palette = shot.quantize(256, method=Image.Quantize.MEDIANCUT, kmeans=5)
    shot.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG).save(path, optimize=True)


def _clear(page, elem_id: str) -> None:
    """The clear button of a file input ('Clear') or an image input ('Remove Image')."""
    page.click(f"#{elem_id} button[aria-label='Clear'], #{elem_id} button[aria-label='Remove Image']")


def test_space_three_tabs_in_chromium(app_url, files):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(app_url)
            page.wait_for_selector("#compare-query-file")

            # --- Compare, the bundled example: a copy of astronaut.jpg against its original
            page.click("#compare-examples tbody tr:first-child")
            widths = {"copy": _file_width(files["copy"]), "astronaut": _file_width(BUNDLED / "astronaut.jpg")}
            for elem_id, width in (("compare-query-file", widths["copy"]), ("compare-reference-file", widths["astronaut"])):
                assert _image_width(page, f"#{elem_id}") == width, f"#{elem_id} does not show the example"
            page.click("#compare-button")
            text = _wait_text(page, "#compare-score", r"Copy probability \(matcher\): [0-9.]+")
            probability = float(re.search(r"Copy probability \(matcher\): ([0-9.]+)", text).group(1))
            assert probability > 0.5 and "likely a copy" in text and "lowest entropy" in text
            for selector in ("#compare-affinity", "#compare-entropy"):
                assert _image_width(page, selector) > 0, f"{selector} shows no image"
                _assert_no_label_over(page, selector)
            if os.environ.get("COPYNCE_SPACE_SCREENSHOT"):
                time.sleep(1.0)
                _save_screenshot(page, os.environ["COPYNCE_SPACE_SCREENSHOT"])

            # --- Compare, uploads: the inputs show the uploaded images; a click on the query probes its patch
            _clear(page, "compare-query-file")
            _clear(page, "compare-reference-file")
            _upload(page, "compare-query-file", files["copy"])
            _upload(page, "compare-reference-file", BUNDLED / "astronaut.jpg")
            assert _image_width(page, "#compare-query-file") == widths["copy"]
            assert _image_width(page, "#compare-reference-file") == widths["astronaut"]
            page.click("#compare-button")
            text = _wait_text(page, "#compare-score", r"Copy probability \(matcher\): [0-9.]+")
            assert float(re.search(r"descriptor cosine: (-?[0-9.]+)", text).group(1)) > 0.3
            # the top-left corner of the query: the probe becomes patch 0,0 (the Compare above may still be running,
            # and its result, identical to the example's, would overwrite the click's: click until the click's stays)
            _click_until(page, "#compare-query-file img", {"x": 2, "y": 2}, "#compare-score",
                         r"probe patch 0,0 \(clicked\)")
            assert _image_width(page, "#compare-affinity") > 0

            # --- bad uploads: the image input refuses a text file; one named .png reaches the handler, which says why
            _clear(page, "compare-query-file")
            page.set_input_files("#compare-query-file input[type=file]", str(files["text"]))
            _wait_text(page, "body", r"Invalid file type: notes\.txt\. Only image/\* allowed")
            assert not page.query_selector("#compare-query-file img")
            _upload(page, "compare-query-file", files["fake_png"])
            page.click("#compare-button")
            _wait_text(page, "#compare-status", r"The query file notes\.png is not a usable image")
            assert "Traceback" not in page.inner_text("body")

            # --- Search: the bundled gallery, then a zip of references, then a corrupt zip
            page.get_by_role("tab", name="Search").click()
            _upload(page, "search-query-file", files["copy"])
            assert _image_width(page, "#search-query-file") == widths["copy"]
            page.click("#search-button")
            text = _wait_text(page, "#search-best", r"Best match \S+: copy probability [0-9.]+")
            assert "astronaut.jpg" in text
            assert len(page.query_selector_all("#search-results img")) == 5
            _assert_no_label_over(page, "#search-results")
            _upload_file(page, "search-zip-file", files["zip"])
            page.click("#search-index-button")
            _wait_text(page, "#search-gallery-info", r"references\.zip \(3 images\); skipped 1: refs/notes\.txt")
            page.click("#search-button")
            _wait_text(page, "#search-status", r"references\.zip \(3 images\)")
            assert "refs/astronaut.jpg" in _wait_text(page, "#search-best", r"Best match refs/astronaut\.jpg")
            _clear(page, "search-zip-file")
            _upload_file(page, "search-zip-file", files["broken_zip"])
            page.click("#search-index-button")
            _wait_text(page, "#search-gallery-info", r"broken\.zip is not a zip archive")

            # --- Make a copy: a preset and a seed give a copy, its edits and the overlap prior
            page.get_by_role("tab", name="Make a copy").click()
            page.fill("#copy-seed input", "7")
            page.click("#copy-button")
            _wait_text(page, "#copy-status", r"\d+ edits; \d+% of the copy's pixels trace back")
            for selector in ("#copy-view", "#copy-overlap"):
                assert _image_width(page, selector) > 0
                _assert_no_label_over(page, selector)
            assert "training" in page.inner_text("#copy-edits")
            assert "Traceback" not in page.inner_text("body")
        finally:
            browser.close()
