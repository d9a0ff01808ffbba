"""The output folders of ``copynce detect`` and ``copynce dedup``: the run (:mod:`copynce_hf.runs.detect`,
:mod:`copynce_hf.runs.dedup`: the data files) and its gallery, ``report.html``, in one call each.
"""

from __future__ import annotations

from pathlib import Path

from ..reports.gallery import write_gallery, write_group_gallery
from .dedup import DedupRequest, DedupRun, dedup_report_settings, run_dedup
from .detect import DetectRequest, DetectRun, report_settings, run_detect


def write_detect_folder(request: DetectRequest) -> DetectRun | None:
    """Run ``copynce detect`` (:func:`~copynce_hf.runs.detect.run_detect`) and draw its match gallery into
    ``OUTPUT/report.html`` (the top and borderline matches, with heatmaps, settings, times per stage and metrics).
    Returns the run (``run.report``: the page) on the main process, ``None`` on the others."""
    run = run_detect(request)
    if run is None:
        return None
    inputs = run.inputs
    run.report = write_gallery(Path(request.output) / "report.html", run.result.predictions,
                               inputs.queries.lookup(), inputs.references.lookup(), *run.heatmap_model,
                               threshold=run.gallery_threshold, count=request.gallery, settings=report_settings(run),
                               stages=run.result.seconds, metrics=run.metrics, ground_truth=inputs.ground_truth,
                               crops={pair: {pair[0]: box} for pair, box in run.result.crop_pairs.items()})
    return run


def write_dedup_folder(request: DedupRequest) -> DedupRun | None:
    """Run ``copynce dedup`` (:func:`~copynce_hf.runs.dedup.run_dedup`) and draw its group gallery into
    ``OUTPUT/report.html`` (the largest groups). Returns the run on the main process, ``None`` on the others."""
    run = run_dedup(request)
    if run is None:
        return None
    run.report = write_group_gallery(Path(request.output) / "report.html", run.result.groups, run.source.lookup(),
                                     *run.heatmap_model, count=request.gallery, settings=dedup_report_settings(run),
                                     stages=run.result.seconds, crops=crop_boxes_of_pairs(run.result))
    return run


def crop_boxes_of_pairs(result) -> dict[tuple[str, str], dict[str, tuple[float, float, float, float]]]:
    """``(a, b)`` -> ``{image id: box}`` of the content or layout crops each crop-scored pair of a dedup result was
    scored on (a layout crop's where it decided the pair)."""
    from ..retrieval.content.crops import VIEW_CROP, VIEW_LAYOUT

    def box(pair, image_id: str, view: str):
        return result.crop_boxes[image_id] if view == VIEW_CROP else result.layout_boxes[(pair.a, pair.b)]

    return {(pair.a, pair.b): {image_id: box(pair, image_id, view) for image_id, view in
                               ((pair.a, pair.view_a), (pair.b, pair.view_b)) if view in (VIEW_CROP, VIEW_LAYOUT)}
            for pair in result.crop_pairs}
