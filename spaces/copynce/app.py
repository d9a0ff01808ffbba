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


def _verdict(probability: float) -> str:
    return "likely a copy" if probability >= 0.5 else "likely not a copy"


class SpaceApp:
    """The handlers of the three tabs, bound to one :class:`~copynce_hf.demo.interactive.Detector`."""

    def __init__(self, detector: core.Detector):
        self.detector = detector
        self.bundled = core.bundled_gallery(detector)
        self.bundled_files = core.bundled_image_files()
        self.examples = Path(tempfile.mkdtemp(prefix="copynce_space_"))

    # ------------------------------------------------------------------------------------ compare

    def compare(self, query_file, reference_file, patch=None):
        """(status, query preview, score text, token affinity image, entropy image)."""
        try:
            query = core.read_upload(query_file, "query")
            reference = core.read_upload(reference_file, "reference")
            result = core.compare(self.detector, query, reference, patch)
            affinity, entropy = core.comparison_images(result)
        except Exception as error:  # noqa: BLE001 - every failure becomes a message on the page
            return _problem(error), None, "", None, None
        row, col = result.maps.patch
        how = "clicked" if patch is not None else "most confident (lowest entropy)"
        score = (f"**Copy probability (matcher): {result.copy_probability:.3f}**, {_verdict(result.copy_probability)}"
                 f" · descriptor cosine: {result.cosine:.3f} · probe patch {row},{col} ({how})")
        return "Click the query above to probe another patch.", query, score, affinity, entropy

    def compare_at(self, query_file, reference_file, evt: gr.SelectData):
        """:meth:`compare` with the patch under the click on the query preview."""
        try:
            query = core.read_upload(query_file, "query")
            x, y = evt.index[:2]
            patch = core.patch_at(x, y, query.width, query.height, self.detector.grid)
        except Exception as error:  # noqa: BLE001
            return _problem(error), None, "", None, None
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
        """(status, query preview, results [(image, caption)], best-match text)."""
        gallery = gallery or self.bundled
        try:
            query = core.read_upload(query_file, "query")
            result = core.search(self.detector, gallery, query, k=5)
        except Exception as error:  # noqa: BLE001
            return _problem(error), None, [], ""
        best = result.hits[0]
        items = [(hit.image, f"{rank}. {hit.reference_id} · cosine {hit.cosine:.3f}")
                 for rank, hit in enumerate(result.hits, 1)]
        text = (f"**Best match {best.reference_id}: copy probability {result.best_copy_probability:.3f}** "
                f"(matcher), {_verdict(result.best_copy_probability)}; descriptor cosine {best.cosine:.3f}.")
        return f"Searched {self.gallery_text(gallery)}.", query, items, text

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
                gr.Markdown("Upload a suspected copy (query) and an original (reference). The heatmap shows where "
                            "the matcher finds the query patch boxed in green inside the reference; **click the "
                            "query** to probe another patch. Low affinity entropy marks the copied region. "
                            f"Images up to {core.MAX_IMAGE_BYTES // 2**20} MB.")
                with gr.Row():
                    query_file = gr.File(label="Query image (suspected copy)", elem_id="compare-query-file")
                    reference_file = gr.File(label="Reference image (original)", elem_id="compare-reference-file")
                compare_button = gr.Button("Compare", variant="primary", elem_id="compare-button")
                compare_status = gr.Markdown(elem_id="compare-status")
                score = gr.Markdown(elem_id="compare-score")
                with gr.Row():
                    query_view = gr.Image(label="Query: click a patch", type="pil", interactive=False, scale=2,
                                          elem_id="compare-query-view")
                    affinity = gr.Image(label="Token affinity of the probe patch", type="pil", interactive=False,
                                        scale=4, elem_id="compare-affinity")
                    entropy = gr.Image(label="Affinity entropy of the query", type="pil", interactive=False,
                                       scale=3, elem_id="compare-entropy")
                outputs = [compare_status, query_view, score, affinity, entropy]
                compare_button.click(self.compare, [query_file, reference_file], outputs)
                query_view.select(self.compare_at, [query_file, reference_file], outputs)
                gr.Examples(self.example_pairs(), [query_file, reference_file], label="Bundled examples")

            with gr.Tab("Search", id="search"):
                gallery_state = gr.State(None)
                gr.Markdown("Upload a query (an image up to "
                            f"{core.MAX_IMAGE_BYTES // 2**20} MB); the descriptor ranks the gallery, the matcher "
                            "verifies the best match.")
                with gr.Row():
                    with gr.Column():
                        search_query = gr.File(label="Query image", elem_id="search-query-file")
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
                with gr.Row():
                    search_view = gr.Image(label="Query", type="pil", interactive=False, scale=1)
                    results = gr.Gallery(label="Top 5 references", columns=5, height=260, scale=3,
                                         elem_id="search-results")
                search_button.click(self.search, [search_query, gallery_state],
                                    [search_status, search_view, results, best])
                index_button.click(self.index_zip, [zip_file], [gallery_state, gallery_info])
                bundled_button.click(self.use_bundled, [], [gallery_state, gallery_info])

            with gr.Tab("Make a copy", id="copy"):
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
                    copy_view = gr.Image(label="The copy", type="pil", interactive=False, elem_id="copy-view")
                    overlap = gr.Image(label="PixTrace overlap prior, copy (left) and original (right)", type="pil",
                                       interactive=False, elem_id="copy-overlap")
                with gr.Row():
                    edits = gr.JSON(label="Edits (replay with copynce_hf.pixtrace.replay)", elem_id="copy-edits")
                    copy_download = gr.File(label="The copy as PNG", elem_id="copy-download")
                copy_button.click(self.make_copy, [image_name, preset, seed],
                                  [copy_status, copy_view, edits, overlap, copy_download])
        return page


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    try:
        detector = core.Detector.from_environment()
    except CopyNCEError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    app = SpaceApp(detector)
    app.build().queue(default_concurrency_limit=2).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"), ssr_mode=False,
        allowed_paths=[str(app.examples), str(BUNDLED_IMAGES)],
        max_file_size=max(core.MAX_ZIP_BYTES, core.MAX_IMAGE_BYTES))


if __name__ == "__main__":
    main()
