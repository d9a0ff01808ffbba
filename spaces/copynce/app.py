"""CopyNCE copy detection in the browser: compare a pair, search a gallery, make a traced copy.

Run locally with ``make space`` (or ``python spaces/copynce/app.py``); on the Hub this file is the
Space's ``app.py``. The models are the package's embedded descriptor and matcher unless the
environment names others (a saved folder or a Hub id)::

    COPYNCE_DESCRIPTOR=path/or/hub-id COPYNCE_MATCHER=path/or/hub-id python spaces/copynce/app.py

The page only lays things out: every computation is a function of
:mod:`copynce_hf.demo.interactive`. Each tab's handler returns a status message for the page
instead of raising, so a bad upload shows what is wrong, never a stack trace.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from copynce_hf.demo import interactive as core  # noqa: E402
from copynce_hf.evaluation.demo_task import BUNDLED_IMAGES  # noqa: E402
from copynce_hf.images import load_image  # noqa: E402
from copynce_hf.modeling.errors import ConfigError, CopyNCEError  # noqa: E402
from copynce_hf.retrieval import IMAGE_EXTENSIONS  # noqa: E402

logger = logging.getLogger("copynce_space")

INTRO = """# CopyNCE: is this image a copy?
Image copy detection with CopyNCE (ICCV 2025): the descriptor finds candidates, the matcher scores a
(query, reference) pair, and the matcher's token affinity shows *which* regions correspond.
Models: `{descriptor}` and `{matcher}`, on the CPU."""

ZIP_LIMITS = (f"A .zip of your own references: at most {core.MAX_GALLERY_IMAGES} images "
              f"({', '.join(IMAGE_EXTENSIONS)}), {core.MAX_ZIP_BYTES // 2**20} MB zipped and "
              f"{core.MAX_ZIP_UNCOMPRESSED_BYTES // 2**20} MB unpacked. It is indexed for your session only.")


def _problem(error: Exception) -> str:
    """The page's message for a refused input or an unexpected failure (the traceback goes to the log)."""
    if isinstance(error, CopyNCEError):
        return f"⚠️ {error}"
    logger.exception("unexpected error")
    return f"⚠️ Something went wrong ({type(error).__name__}: {error}). Please try other images."


def _image_upload(label: str, elem_id: str) -> gr.Image:
    """An image input that shows the uploaded image (from a file or the clipboard).

    Its events are wired with ``preprocess=False``: ``gr.Image`` would otherwise open every upload
    with PIL before the handler runs, so a file that is no image (a text file named ``.png``) would
    fail inside Gradio instead of getting :func:`~copynce_hf.demo.interactive.read_upload`'s message.
    Unprocessed, the handler gets Gradio's description of the file (see :func:`_upload_path`).
    """
    return gr.Image(label=label, elem_id=elem_id, type="filepath", sources=["upload", "clipboard"], height=280)


def _upload_path(upload) -> str | None:
    """The file of an upload: a path, or an unprocessed ``gr.Image`` value ``{"path": ..., ...}``.

    Gradio has already moved the file into its upload cache (refusing paths outside it) before the
    handler runs, whether the value is processed or not.
    """
    return upload.get("path") if isinstance(upload, dict) else upload


def _unlabelled_view(label: str, elem_id: str, **layout) -> gr.Image:
    """An output image without Gradio's label on it: a figure with its own titles, or an image with a caption.

    Gradio draws an image's label over its top left corner, where it hid the figures' titles
    ("reference: affinity of the probe", "query: affinity entropy (low = copied)"). With
    ``show_label=False`` the label is still there for screen readers and the API description, not drawn.
    """
    return gr.Image(label=label, show_label=False, type="pil", interactive=False, elem_id=elem_id, **layout)


class SpaceApp:
    """The handlers of the three tabs, bound to one :class:`~copynce_hf.demo.interactive.Detector`.

    The example pair and the copies made in the third tab are written to a temporary folder
    (``examples``) that :meth:`close` removes; it is also removed when the app is garbage-collected or the
    interpreter exits (:class:`tempfile.TemporaryDirectory`).
    """

    def __init__(self, detector: core.Detector):
        self.detector = detector
        self.bundled = core.bundled_gallery(detector)
        self.bundled_files = core.bundled_image_files()
        self._examples = tempfile.TemporaryDirectory(prefix="copynce_space_")
        self.examples = Path(self._examples.name)

    def close(self) -> None:
        """Remove the examples folder (the server has stopped; calling it again does nothing)."""
        self._examples.cleanup()

    # ------------------------------------------------------------------------------------ compare

    def compare(self, query_file, reference_file, patch=None):
        """(status, score text, token affinity image, entropy image)."""
        try:
            query = core.read_upload(_upload_path(query_file), "query")
            reference = core.read_upload(_upload_path(reference_file), "reference")
            result = core.compare(self.detector, query, reference, patch)
            affinity, entropy = core.comparison_images(result)
        except Exception as error:  # noqa: BLE001 - every failure becomes a message on the page
            return _problem(error), "", None, None
        row, col = result.maps.patch
        how = "clicked" if patch is not None else "most confident (lowest entropy)"
        verdict = core.verdict(result.copy_probability, self.detector.matcher_card)
        score = (f"**Copy probability (matcher): {result.copy_probability:.3f}**, {verdict}"
                 f" · descriptor cosine: {result.cosine:.3f} · probe patch {row},{col} ({how})")
        return "Click the query image above to probe another patch.", score, affinity, entropy

    def compare_at(self, query_file, reference_file, evt: gr.SelectData):
        """:meth:`compare` with the patch under the click on the query image."""
        try:
            query = core.read_upload(_upload_path(query_file), "query")
            x, y = evt.index[:2]
            patch = core.patch_at(x, y, query.width, query.height, self.detector.grid)
        except Exception as error:  # noqa: BLE001
            return _problem(error), "", None, None
        return self.compare(query_file, reference_file, patch)

    # ------------------------------------------------------------------------------------ search

    def gallery_text(self, gallery: core.Gallery | None) -> str:
        """What a gallery holds, e.g. ``"the bundled sample images (12 images)"``."""
        gallery = gallery or self.bundled
        skipped = f"; skipped {len(gallery.skipped)}: {', '.join(gallery.skipped[:5])}" if gallery.skipped else ""
        return f"{gallery.name} ({len(gallery)} images){skipped}"

    def index_zip(self, zip_file, progress=gr.Progress()):  # noqa: B008 - gradio finds its tracker by this default
        """(gallery state, gallery text); on a bad zip the bundled gallery stays and the text says why."""
        try:
            gallery = core.gallery_from_zip(
                self.detector, zip_file,
                progress=lambda done, total: progress(done / total, desc=f"indexed {done} of {total} images"))
        except Exception as error:  # noqa: BLE001
            return None, f"{_problem(error)} Searching {self.gallery_text(None)}."
        return gallery, f"Gallery: {self.gallery_text(gallery)}."

    def use_bundled(self):
        return None, f"Gallery: {self.gallery_text(None)}."

    def search(self, query_file, gallery: core.Gallery | None):
        """(status, results [(image, caption)], best-match text)."""
        gallery = gallery or self.bundled
        try:
            query = core.read_upload(_upload_path(query_file), "query")
            result = core.search(self.detector, gallery, query, k=5)
        except Exception as error:  # noqa: BLE001
            return _problem(error), [], ""
        best = result.hits[0]
        items = [(hit.image, f"{rank}. {hit.reference_id} · {hit.cosine:.3f}") for rank, hit in enumerate(result.hits, 1)]
        text = (f"**Best match {best.reference_id}: copy probability {result.best_copy_probability:.3f}** "
                f"(matcher), {core.verdict(result.best_copy_probability, self.detector.matcher_card)}; descriptor "
                f"cosine {best.cosine:.3f}.")
        return f"Searched {self.gallery_text(gallery)}.", items, text

    # ------------------------------------------------------------------------------------ make a copy

    def make_copy(self, image_name: str, preset: str, seed):
        """(status, copy image, its edits as JSON, overlap prior image, path of the copy as a PNG)."""
        try:
            if image_name not in self.bundled_files:
                raise ConfigError(f"Pick one of the bundled images, not {image_name!r}.")
            if seed is None or float(seed) != int(seed):
                raise ConfigError(f"The seed must be a whole number, got {seed!r}.")
            original = load_image(self.bundled_files[image_name])
            pool = [path for name, path in self.bundled_files.items() if name != image_name]
            copy = core.make_copy(original, preset, int(seed), image_pool=pool)
            config = self.detector.matcher[0].config
            overlap = core.copy_overlap_image(original, copy, int(config.image_size), int(config.patch_size))
        except Exception as error:  # noqa: BLE001
            return _problem(error), None, None, None, None
        path = self.examples / f"copy_{Path(image_name).stem}_{preset}_{int(seed)}.png"
        copy.image.save(path)
        summary = core.copy_summary(copy, preset, int(seed), image_name)
        status = (f"{len(copy.edits)} edits; {summary['traced_fraction']:.0%} of the copy's pixels trace back "
                  f"to the original. Download the copy and try it in Compare or Search.")
        return status, copy.image, summary, overlap, str(path)

    # ------------------------------------------------------------------------------------ page

    def example_pairs(self) -> list[list[str]]:
        """[[query, reference], ...]: a copy of a bundled image with its original, and with another image."""
        original = self.bundled_files["astronaut.jpg"]
        copy = core.make_copy(load_image(original), "evaluation", 3)
        path = self.examples / "astronaut_copy.png"
        copy.image.save(path)
        return [[str(path), str(original)], [str(path), str(self.bundled_files["coffee.jpg"])]]

    def build(self) -> gr.Blocks:
        with gr.Blocks(title="CopyNCE copy detection", analytics_enabled=False) as page:
            gr.Markdown(INTRO.format(descriptor=self.detector.descriptor_name, matcher=self.detector.matcher_name))
            with gr.Tab("Compare", id="compare"):
                self._compare_tab()
            with gr.Tab("Search", id="search"):
                self._search_tab()
            with gr.Tab("Make a copy", id="copy"):
                self._copy_tab()
        return page

    def _compare_tab(self) -> None:
        gr.Markdown("Upload a suspected copy (query) and an original (reference). The heatmap shows where the "
                    "matcher finds the query patch boxed in green inside the reference; **click the query image** "
                    "to probe another patch. Low affinity entropy marks the copied region. "
                    f"Images up to {core.MAX_IMAGE_BYTES // 2**20} MB.")
        with gr.Row():
            query_file = _image_upload("Query image (suspected copy)", "compare-query-file")
            reference_file = _image_upload("Reference image (original)", "compare-reference-file")
        compare_button = gr.Button("Compare", variant="primary", elem_id="compare-button")
        compare_status = gr.Markdown(elem_id="compare-status")
        score = gr.Markdown(elem_id="compare-score")
        with gr.Row():
            affinity = _unlabelled_view("Token affinity of the probe patch", "compare-affinity", scale=8)
            entropy = _unlabelled_view("Affinity entropy of the query", "compare-entropy", scale=5)
        outputs = [compare_status, score, affinity, entropy]
        # unprocessed: the handlers read the uploads themselves (see _image_upload)
        compare_button.click(self.compare, [query_file, reference_file], outputs, preprocess=False)
        query_file.select(self.compare_at, [query_file, reference_file], outputs, preprocess=False)
        gr.Examples(self.example_pairs(), [query_file, reference_file], label="Bundled examples",
                    elem_id="compare-examples")

    def _search_tab(self) -> None:
        gallery_state = gr.State(None)
        gr.Markdown(f"Upload a query (an image up to {core.MAX_IMAGE_BYTES // 2**20} MB); the descriptor ranks "
                    "the gallery, the matcher verifies the best match.")
        with gr.Row():
            with gr.Column():
                search_query = _image_upload("Query image", "search-query-file")
                search_button = gr.Button("Search", variant="primary", elem_id="search-button")
            with gr.Column():
                gallery_info = gr.Markdown(f"Gallery: {self.gallery_text(None)}.", elem_id="search-gallery-info")
                gr.Markdown(ZIP_LIMITS, elem_id="search-zip-limits")
                zip_file = gr.File(label="References (.zip)", elem_id="search-zip-file")
                with gr.Row():
                    index_button = gr.Button("Index the zip", elem_id="search-index-button")
                    bundled_button = gr.Button("Use the bundled images", elem_id="search-bundled-button")
        search_status = gr.Markdown(elem_id="search-status")
        best = gr.Markdown(elem_id="search-best")
        gr.Markdown("**Top 5 references** (rank. id · descriptor cosine)", elem_id="search-results-caption")
        # no label drawn over the first result (see _unlabelled_view)
        results = gr.Gallery(label="Top 5 references", show_label=False, columns=5, height=280,
                             elem_id="search-results")
        search_button.click(self.search, [search_query, gallery_state], [search_status, results, best],
                            preprocess=False)
        index_button.click(self.index_zip, [zip_file], [gallery_state, gallery_info])
        bundled_button.click(self.use_bundled, [], [gallery_state, gallery_info])

    def _copy_tab(self) -> None:
        gr.Markdown("Edit a bundled image with a recipe preset and a seed. PixTrace records where every "
                    "pixel of the copy came from; the overlap prior between copy and original is what "
                    "CopyNCE's patch-level loss follows during training.")
        with gr.Row():
            image_name = gr.Dropdown(list(self.bundled_files), value="astronaut.jpg", label="Bundled image",
                                     elem_id="copy-image")
            preset = gr.Radio(list(core.COPY_PRESETS), value="training", label="Recipe preset",
                              elem_id="copy-preset")
            seed = gr.Number(value=0, precision=0, minimum=0, label="Seed", elem_id="copy-seed")
        gr.Markdown("\n".join(f"* **{name}**: {text}" for name, text in core.COPY_PRESETS.items()))
        copy_button = gr.Button("Make a copy", variant="primary", elem_id="copy-button")
        copy_status = gr.Markdown(elem_id="copy-status")
        with gr.Row():
            with gr.Column():
                gr.Markdown("**The copy**", elem_id="copy-view-caption")
                copy_view = _unlabelled_view("The copy", "copy-view")
            with gr.Column():
                gr.Markdown("**PixTrace overlap prior**: copy (left) and original (right)",
                            elem_id="copy-overlap-caption")
                overlap = _unlabelled_view("PixTrace overlap prior, copy (left) and original (right)", "copy-overlap")
        with gr.Row():
            edits = gr.JSON(label="Edits (replay with copynce_hf.pixtrace.replay)", elem_id="copy-edits")
            copy_download = gr.File(label="The copy as PNG", elem_id="copy-download")
        copy_button.click(self.make_copy, [image_name, preset, seed],
                          [copy_status, copy_view, edits, overlap, copy_download])


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    try:
        detector = core.Detector.from_environment()
    except CopyNCEError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    app = SpaceApp(detector)
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped server (SIGTERM) closes as after Ctrl-C
    demo = app.build().queue(default_concurrency_limit=2)
    try:
        demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"), ssr_mode=False,
                    allowed_paths=[str(app.examples), str(BUNDLED_IMAGES)],
                    max_file_size=max(core.MAX_ZIP_BYTES, core.MAX_IMAGE_BYTES))
    except KeyboardInterrupt:  # stopped while Gradio was still starting (its own checks of the server): no loop of
        demo.close()  # its own caught it, so the server it started is closed here, as Gradio closes it after Ctrl-C
    finally:
        app.close()


def _interrupt(signum, frame) -> None:
    """SIGTERM as Ctrl-C: Gradio's server loop then closes the server and :func:`main` removes the examples."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
