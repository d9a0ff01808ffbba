"""The Space's handlers (spaces/copynce/app.py) called directly, without a browser, and its packaging files."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from conftest import free_port, require_extra, require_program

REPO_ROOT = Path(__file__).resolve().parents[1]
SPACE = REPO_ROOT / "spaces" / "copynce"
BUNDLED = REPO_ROOT / "copynce_hf" / "assets" / "images"


def _requirement_names(lines) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_space_requirements_cover_the_package_dependencies():
    setup_text = (REPO_ROOT / "setup.py").read_text()
    block = re.search(r"install_requires=\[(.*?)\]", setup_text, re.S).group(1)
    needed = _requirement_names(re.findall(r'"([^"]+)"', block))
    listed = _requirement_names((SPACE / "requirements.txt").read_text().splitlines())
    assert needed <= listed, f"spaces/copynce/requirements.txt lacks {sorted(needed - listed)}"
    assert "gradio" in listed


def test_space_readme_front_matter_matches_the_requirements():
    text = (SPACE / "README.md").read_text()
    front = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert front, "the Space README must start with YAML front matter"
    import yaml

    meta = yaml.safe_load(front.group(1))
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"
    pinned = re.search(r"^gradio==([0-9.]+)", (SPACE / "requirements.txt").read_text(), re.M)
    assert pinned and str(meta["sdk_version"]) == pinned.group(1)


def test_space_bundle_holds_the_app_and_an_importable_package(tmp_path):
    make = require_program("make", "apt-get install make")
    bundle = tmp_path / "space"
    subprocess.run([make, "-s", "space-bundle", f"SPACE_BUNDLE={bundle}"], cwd=REPO_ROOT, check=True,
                   capture_output=True, text=True)
    for name in ("app.py", "README.md", "requirements.txt", "copynce_hf/pretrained/matcher/model.safetensors",
                 "copynce_hf/model_cards/matcher.md", "copynce_hf/assets/images/astronaut.jpg"):
        assert (bundle / name).is_file(), name
    assert not list(bundle.rglob("__pycache__"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", "import copynce_hf; print(copynce_hf.__file__)"], cwd=bundle,
                           env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert Path(found).resolve().is_relative_to(bundle.resolve())


@pytest.fixture(scope="module")
def gr():
    return require_extra("gradio", "space")


def test_gradio_does_not_pull_torch_or_torchvision(gr):
    from importlib.metadata import requires

    names = _requirement_names(requirement for requirement in requires("gradio") or [] if "extra ==" not in requirement)
    assert not names & {"torch", "torchvision"}


@pytest.fixture(scope="module")
def app(gr):
    spec = importlib.util.spec_from_file_location("copynce_space_app", SPACE / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from copynce_hf.demo.interactive import Detector

    space = module.SpaceApp(Detector.from_environment({}))
    yield module, space
    space.close()
    assert not space.examples.exists()


@pytest.fixture(scope="module")
def copy_file(tmp_path_factory) -> Path:
    from copynce_hf.demo.interactive import make_copy
    from copynce_hf.images import load_image

    path = tmp_path_factory.mktemp("space") / "astronaut_copy.png"
    make_copy(load_image(BUNDLED / "astronaut.jpg"), "evaluation", 3).image.save(path)
    return path


def _unprocessed(path: Path) -> dict:
    """What an image input's event wired with ``preprocess=False`` hands the handler: Gradio's file description."""
    gr = require_extra("gradio", "space")
    return gr.Image(type="filepath").data_model(path=str(path), orig_name=path.name).model_dump()


def test_compare_handler_scores_and_draws(app, copy_file, gr):
    module, space = app
    status, score, affinity, entropy = space.compare(str(copy_file), str(BUNDLED / "astronaut.jpg"))
    assert "Click the query image" in status
    probability = float(re.search(r"Copy probability \(matcher\): ([0-9.]+)", score).group(1))
    assert probability > 0.5 and "likely a copy" in score and "lowest entropy" in score
    assert affinity.width > 100 and entropy.width > 100
    # the page's inputs arrive unprocessed; the bottom right pixel of the 199x263 copy is the last patch
    click = gr.SelectData(None, {"index": [198, 262], "value": None})
    _, score, affinity, _ = space.compare_at(_unprocessed(copy_file), _unprocessed(BUNDLED / "astronaut.jpg"), click)
    assert "probe patch 13,13 (clicked)" in score and affinity is not None


def test_image_inputs_are_unprocessed_so_the_handlers_refuse_bad_files(app, tmp_path, gr):
    """Every event of an image input hands the handler the file unopened; read_upload refuses it by name."""
    _, space = app
    page = space.build()
    image_inputs = {block._id for block in page.blocks.values()
                    if isinstance(block, gr.Image) and block.interactive is not False}
    wired = [fn for fn in page.fns.values() if image_inputs & {block._id for block in fn.inputs}]
    assert len(image_inputs) == 3 and len(wired) == 3 and not any(fn.preprocess for fn in wired)
    fake = tmp_path / "photo.png"
    fake.write_text("a text file named like an image")
    status, *_ = space.compare(_unprocessed(fake), _unprocessed(BUNDLED / "coffee.jpg"))
    assert status.startswith("⚠️ The query file photo.png is not a usable image")
    from copynce_hf.demo.interactive import MAX_IMAGE_BYTES

    large = tmp_path / "large.jpg"
    with large.open("wb") as handle:  # a sparse file, 5 MB over the limit
        handle.truncate(MAX_IMAGE_BYTES + 5 * 2**20)
    status, *_ = space.compare(_unprocessed(BUNDLED / "coffee.jpg"), _unprocessed(large))
    assert status.startswith("⚠️ The reference file large.jpg is too large: 25.0 MB, the limit is 20.0 MB")
    status, *_ = space.search(_unprocessed(fake), None)
    assert status.startswith("⚠️ The query file photo.png is not a usable image")


def test_compare_handler_turns_bad_uploads_into_messages(app, tmp_path):
    _, space = app
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    status, score, affinity, entropy = space.compare(str(text), str(BUNDLED / "coffee.jpg"))
    assert status.startswith("⚠️ The query file notes.txt is not a usable image")
    assert (score, affinity, entropy) == ("", None, None)
    status, *_ = space.compare(str(BUNDLED / "coffee.jpg"), None)
    assert "Please upload a reference image" in status


def test_search_handler_with_the_bundled_gallery_and_a_zip(app, copy_file, tmp_path):
    _, space = app
    status, items, best = space.search(str(copy_file), None)
    assert "bundled sample images (12 images)" in status
    assert len(items) == 5 and re.fullmatch(r"1\. astronaut\.jpg · 0\.\d{3}", items[0][1])
    assert best.startswith("**Best match astronaut.jpg: copy probability")
    archive = tmp_path / "mine.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in ("astronaut.jpg", "rocket.jpg"):
            handle.write(BUNDLED / name, name)
    steps = []
    gallery, info = space.index_zip(str(archive), progress=lambda fraction, desc="": steps.append((fraction, desc)))
    assert info == "Gallery: mine.zip (2 images)." and steps[-1] == (1.0, "indexed 2 of 2 images")
    status, items, best = space.search(str(copy_file), gallery)
    assert "mine.zip (2 images)" in status and len(items) == 2 and "Best match astronaut.jpg" in best
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"garbage")
    gallery, info = space.index_zip(str(broken), progress=lambda *args, **kwargs: None)
    assert gallery is None and info.startswith("⚠️ broken.zip is not a zip archive")
    assert space.use_bundled() == (None, "Gallery: the bundled sample images (12 images).")


def test_make_copy_handler(app):
    _, space = app
    status, image, summary, overlap, path = space.make_copy("rocket.jpg", "evaluation", 5)
    assert re.match(r"\d+ edits; \d+% of the copy's pixels trace back", status)
    assert summary["original"] == "rocket.jpg" and summary["seed"] == 5 and summary["edits"]
    assert overlap.width > 100 and Path(path).is_file() and image.size == tuple(summary["size"][::-1])
    status, *rest = space.make_copy("rocket.jpg", "training", 2.5)
    assert status.startswith("⚠️ The seed must be a whole number") and rest == [None] * 4
    status, *_ = space.make_copy("nope.jpg", "training", 1)
    assert "Pick one of the bundled images" in status


def test_page_builds_with_the_three_tabs(app, gr):
    _, space = app
    page = space.build()
    labels = {block.label for block in page.blocks.values() if isinstance(block, gr.Tab)}
    assert labels == {"Compare", "Search", "Make a copy"}


@pytest.mark.slow
def test_the_server_stopped_by_sigterm_closes_and_removes_its_examples(gr, tmp_path):
    """A Space is stopped with SIGTERM: the server closes as after Ctrl-C and its examples folder is removed."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    port = free_port()
    env = dict(os.environ, TMPDIR=str(temporary), GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    log = tmp_path / "app.log"
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, str(SPACE / "app.py")], cwd=REPO_ROOT, env=env, stdout=output,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not list(temporary.glob("copynce_space_*")) or not _answers(f"http://127.0.0.1:{port}/"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert list(temporary.glob("copynce_space_*")) == [], log.read_text()[-3000:]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
