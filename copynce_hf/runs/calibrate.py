"""``copynce calibrate`` as one call: a :class:`CalibrateRequest` in, the calibration file written
(:func:`copynce_hf.calibration.planted.calibrate`: thresholds from planted copies of the user's references)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..calibration.meaning import detect_score
from ..calibration.thresholds import (
    CALIBRATION_FILE,
    DEFAULT_SEED,
    Calibration,
    copies_needed,
    unresolved_precisions,
)
from ..configuration.fields import positive_int, setting
from ..outputs import check_output_file
from ..retrieval.sources import ImageInput
from .settings import PipelineSettings

__all__ = ["CalibrateRequest", "calibrate_to_file", "format_calibration", "skip_reasons"]


def skip_reasons(calibration: Calibration) -> list[str]:
    """The reason of each image a calibration left out (:data:`~copynce_hf.modeling.errors.SKIP_REASONS`): originals
    whose copies could not be made, references the search skipped (each image once) and copies the pipeline skipped."""
    found = calibration.provenance["counts"]["skip_reasons"]
    originals = found["originals"]
    return [*originals.values(), *(reason for image_id, reason in found["references"].items()
                                   if image_id not in originals), *found["copies"].values()]


def format_calibration(calibration: Calibration) -> str:
    """The thresholds as a small text table (one line per stage and precision), a line per stage whose sample is too
    small for some precisions (:func:`small_sample_line`), then each stage's muAP, RP90 and recall@1 on the
    calibration copies and what its scores are, with what a threshold means (files written before they were recorded
    have none of these)."""
    lines = [f"{'stage':<11}{'precision':>10}{'threshold':>11}{'recall':>8}"]
    for stage, rows in calibration.stages.items():
        for row in rows:
            threshold = "-" if row.threshold is None else f"{row.threshold:.4f}"
            lines.append(f"{stage:<11}{row.precision:>10g}{threshold:>11}{row.recall:>8.3f}")
    copies = (calibration.provenance.get("counts") or {}).get("copies")
    for stage, rows in calibration.stages.items():
        line = small_sample_line(stage, rows, copies) if copies else None
        lines += [line] if line else []
    for stage, found in (calibration.provenance.get("metrics") or {}).items():
        if found:
            lines.append(f"{stage} on the calibration copies: muAP {found['micro_ap']:.3f}, "
                         f"RP90 {found['recall_at_p90']:.3f}, recall@1 {found['recall_at_rank1']:.3f}")
    for stage, score in (calibration.provenance.get("scores") or {}).items():
        lines.append(f"{stage} scores: {score}")
    if calibration.provenance.get("scores"):
        lines.append("a pair scored at or above a row's threshold is a copy with about that precision where queries "
                     "hold copies and non-copies as these calibration copies do (`copynce detect --calibration` decides "
                     "with the matcher row, or the descriptor row with --matcher none)")
    return "\n".join(lines)


def small_sample_line(stage: str, rows, copies: int) -> str | None:
    """The line saying which precisions of ``stage`` its ``copies`` calibration copies cannot resolve
    (:func:`~copynce_hf.calibration.thresholds.unresolved_precisions`), ``None`` when it resolves them all."""
    unresolved = unresolved_precisions(rows, copies)
    if not unresolved:
        return None
    which = " and ".join(f"{row.precision:g} ({found} found, {copies_needed(row.precision)} needed)"
                         for row, found in unresolved)
    return (f"{stage}: {copies} copies are too few for precision {which}: their threshold is that of precision 1 on "
            "these copies (a precision p allows one false positive only among p/(1-p) copies found); calibrate on "
            "more copies (--sample, a larger collection) to tell them apart")


@dataclasses.dataclass
class CalibrateRequest:
    """A ``copynce calibrate`` run; each field with an option declares it (:func:`~copynce_hf.configuration.fields.setting`).

    Attributes:
        references: folder of the collection's reference images.
        output: the calibration JSON file to write.
        pipeline: the models, preset and settings calibrated
            (:class:`~copynce_hf.runs.settings.PipelineSettings`), as ``detect`` will run them.
        distractors, sample, num_distractors, seed: see :func:`calibration_queries`.
        images: how images are read (sub-folders, size limit).
        progress: progress bars.
        log: receives one line per step.
    """

    references: str = setting(help="folder of reference images", flag="references")
    output: str = setting(help="calibration JSON file to write")
    pipeline: PipelineSettings = dataclasses.field(default_factory=PipelineSettings)
    distractors: str | None = setting(None, "images that are not references and not copies of them; default: "
                                      "references held out of the index", metavar="FOLDER")
    sample: int = setting(100, "references copied", type=positive_int)
    num_distractors: int | None = setting(None, "distractor copies (default: --sample; held-out references: at most "
                                          "half the folder)", type=positive_int)
    seed: int = setting(DEFAULT_SEED, "seed of the sample, the distractors and the edits", type=int)
    images: ImageInput = dataclasses.field(default_factory=ImageInput)
    progress: bool = True
    log: Callable[[str], None] = print


def calibrate_to_file(request: CalibrateRequest) -> tuple[Calibration, int]:
    """Run ``copynce calibrate``: the output (a new file, or a calibration file to rewrite: any other file is
    refused), models and folders checked before any model loads, then :func:`calibrate` with the request's
    pipeline, its file written (with the runtime that ran the models).
    Returns ``(the calibration, the number of reference images listed)``."""
    from ..calibration.planted import calibrate

    check_output_file(request.output, own=CALIBRATION_FILE)
    settings, images = request.pipeline, request.images
    settings.models.check_paths()
    references = images.folder(request.references)
    distractors = images.folder(request.distractors) if request.distractors else None
    auxiliary = images.folder(settings.aux) if settings.aux else None
    config = settings.config()
    pipeline = settings.identity()
    descriptors, matcher = settings.models.load_descriptors(), settings.models.load_matcher()
    calibration = calibrate(references, descriptors, matcher, pipeline, config, auxiliary, distractors,
                            sample=request.sample, num_distractors=request.num_distractors, seed=request.seed,
                            progress=request.progress, log=request.log)
    calibration.provenance["runtime"] = settings.models.runtime
    calibration.provenance["scores"] = {
        stage: detect_score(config, len(settings.models.descriptors), stage == "matcher", auxiliary is not None)
        for stage in calibration.stages}
    calibration.save(request.output)
    return calibration, len(references)
