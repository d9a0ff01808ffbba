"""``copynce dedup`` as one call: a :class:`DedupRequest` in, ``groups.csv`` and ``pairs.csv`` written and a
:class:`DedupRun` out.

:func:`run_dedup` opens the images (a folder, or a dataset as ``copynce index --dataset`` opens one), checks the
inputs and the output folder, chooses the threshold (:func:`dedup_threshold`:
``--threshold``, or a calibration file's at ``--precision``) before any model loads, loads the models
(:mod:`copynce_hf.runs.settings`), self-calibrates the threshold on the collection when neither was given
(:func:`~copynce_hf.calibration.collection.self_calibrate`: the dedup pipeline run on copies of a sample of the collection, kept
in ``OUTPUT/self_calibration``) and runs :func:`~copynce_hf.retrieval.deduplication.collection.dedup`
with its caches in ``OUTPUT/indexes``, ``OUTPUT/tokens`` (the matcher's token store) and ``OUTPUT/rescoring``. The group
gallery (``report.html``) is drawn from the returned run by
:func:`copynce_hf.runs.folders.write_dedup_folder`, the one call of the command. ``OUTPUT/scores.json`` says what the
decision scores are and where the threshold comes from (:func:`score_meaning`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..calibration.meaning import ScoreMeaning, dedup_score
from ..calibration.thresholds import Calibration
from ..configuration.fields import positive_int, setting, setting_like
from ..modeling.errors import ConfigError
from ..outputs import check_output_folder, run_folder
from ..retrieval.deduplication.settings import DedupSettings
from ..retrieval.sources import ImageInput, count_text
from .settings import PipelineModels, PipelineSettings, content_tokens_text
from .shared_options import CalibratedDecision, DatasetInput, Whitening

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DedupRequest:
    """A ``copynce dedup`` run; each field with an option declares it (:func:`~copynce_hf.configuration.fields.setting`).

    Attributes:
        images: the folder searched for copies of its own images (``None`` with ``dataset``).
        output: the output folder.
        pipeline: the descriptor (one) and the matcher, the ``dedup`` preset and the detection settings given over it
            (:class:`~copynce_hf.runs.settings.PipelineSettings`: candidates, views, content tokens, sizes): the
            :class:`~copynce_hf.retrieval.detection.config.DetectConfig` of the run.
        settings: what dedup adds to them (:class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`: the
            collection normalisation of both stages, the matcher's orders, content crops, the grouping).
        threshold: pairs scored at or above it are copies (``None``: from ``calibration``, else self-calibrated).
        calibration, precision: a ``copynce calibrate`` file and the precision it decides at (default 0.9); without
            ``calibration`` and ``threshold``, ``precision`` is the target of the self-calibration (default 0.9).
        self_calibration_sample, self_calibration_seed: the images of the collection the self-calibration samples
            (all when it has fewer) and its seed (:func:`~copynce_hf.calibration.collection.self_calibrate`).
        whiten_from: sample images to learn a whitening from (``None``: none).
        dataset: instead of ``images``, a dataset (Hub id, Parquet file or folder, ``save_to_disk`` folder, image
            folder: :func:`~copynce_hf.retrieval.sources.open_dataset_source`), read by random access (not streamed).
        input: how images are read (sub-folders, size limit, the dataset's split and columns).
        gallery: groups shown in ``report.html``.
        progress: progress bars.
        log: receives one line per stage (on the main process only).
    """

    images: str | None = setting(help="folder of images (or --dataset)", flag="images", nargs="?")
    output: str = setting(help="folder for groups.csv, pairs.csv, report.html, indexes/")
    pipeline: PipelineSettings = dataclasses.field(
        default_factory=lambda: PipelineSettings(PipelineModels(descriptor_option="--model"), preset="dedup"))
    settings: DedupSettings = dataclasses.field(default_factory=DedupSettings)
    threshold: float | None = setting(None, "pairs scored at or above it are copies (default: from --calibration, "
                                      "else self-calibrated on the collection at --precision)", type=float)
    calibration: str | None = setting_like(CalibratedDecision, "calibration")
    precision: float | None = setting_like(CalibratedDecision, "precision")
    self_calibration_sample: int = setting(64, "images of the collection the self-calibration copies (default 64; "
                                           "all when it has fewer)", type=positive_int, metavar="N", default_text="")
    self_calibration_seed: int = 0
    whiten_from: str | None = setting_like(Whitening, "whiten_from")
    dataset: str | None = setting_like(DatasetInput, "dataset")
    input: ImageInput = dataclasses.field(default_factory=ImageInput)
    gallery: int = setting(8, "groups shown in report.html", type=positive_int)
    progress: bool = True
    log: Callable[[str], None] = logger.info


@dataclasses.dataclass
class DedupRun:
    """A finished dedup run: its request, images, models, :class:`~copynce_hf.retrieval.deduplication.collection.DedupResult`, where the threshold came
    from (and its :class:`~copynce_hf.calibration.collection.SelfCalibration` when self-calibrated), and the rows of
    ``groups.csv``."""

    request: DedupRequest
    source: object
    descriptor: object
    matcher: tuple | None
    result: object
    origin: str
    rows: int = 0
    report: Path | None = None
    self_calibration: object | None = None
    meaning: ScoreMeaning | None = None

    @property
    def heatmap_model(self) -> tuple:
        """The model whose heatmaps the report draws: the matcher, else the descriptor (none for an ONNX embedding
        model, which has no tokens)."""
        from ..runtime.onnx_embedding import token_heatmap_model

        return self.matcher or token_heatmap_model(self.descriptor.model, self.descriptor.processor)


def dedup_threshold(request: DedupRequest, config) -> tuple[float | None, str]:
    """``(threshold, where it comes from)`` of a dedup run: ``threshold``, or a calibration file's at ``precision``
    (the matcher stage with a matcher, the embedded one included; :func:`~copynce_hf.calibration.thresholds.calibrated_threshold`); ``(None,
    ...)`` when neither is given: the threshold is self-calibrated once the models are loaded."""
    from ..calibration.thresholds import calibrated_threshold

    models = request.pipeline.models
    if request.calibration is not None:
        if request.threshold is not None:
            raise ConfigError("give --threshold or --calibration, not both")
        precision = 0.9 if request.precision is None else request.precision
        return calibrated_threshold(Calibration.load(request.calibration), precision,
                                    models.descriptor_identities()[0], models.matcher_identity(), config,
                                    whitened=request.whiten_from is not None, settings=request.settings)
    if request.threshold is not None:
        if request.precision is not None:
            raise ConfigError("--precision is the target of --calibration FILE or of the self-calibration; "
                              "--threshold fixes the threshold itself: give one of them")
        return request.threshold, f"{request.threshold:.4g} (given)"
    precision = 0.9 if request.precision is None else request.precision
    if not 0 < precision <= 1:
        raise ConfigError(f"--precision must be in (0, 1], got {precision}")
    if request.self_calibration_sample < 1:
        raise ConfigError(f"--self-calibration-sample must be at least 1, got {request.self_calibration_sample}")
    return None, (f"self-calibrated at precision {precision:g} on a sample of up to {request.self_calibration_sample} "
                  "images of the collection (below)")


def run_dedup(request: DedupRequest) -> DedupRun | None:
    """Run ``copynce dedup`` and write ``groups.csv`` and ``pairs.csv``; the run on the main process, ``None`` on
    the others (``accelerate launch``). A refused input found during the model work removes the output folder
    where this run made it."""
    check_output_folder(request.output, inputs={"image folder": request.images,
                                                "--whiten-from folder": request.whiten_from})
    models = request.pipeline.models
    models.check_paths()
    if request.dataset is not None and request.input.streaming:
        raise ConfigError(f"dedup reads dataset {request.dataset!r} by random access (the matcher reads each pair's "
                          "two images): it cannot be streamed")
    source = request.input.folder_or_dataset(request.images, request.dataset, "--dataset")
    whiten_from = request.input.whitening_sample(request.whiten_from, request.pipeline.whiten_dim)
    config, settings = request.pipeline.config(), request.settings
    threshold, origin = dedup_threshold(request, config)
    [descriptor], matcher = models.load_descriptors(), models.load_matcher()
    with run_folder(request.output, ("groups.csv",)) as output:
        return _dedup_into(request, source, descriptor, matcher, (threshold, origin), whiten_from, (config, settings),
                           output)


def _dedup_into(request: DedupRequest, source, descriptor, matcher, decision: tuple[float, str], whiten_from,
                configs: tuple, output: Path) -> DedupRun | None:
    """The model work of :func:`run_dedup` into the existing folder ``output`` (``configs``: the
    :class:`~copynce_hf.retrieval.detection.config.DetectConfig` and :class:`~copynce_hf.retrieval.deduplication.collection.DedupSettings` of the run)."""
    from ..calibration.collection import FOLDER as SELF_CALIBRATION_FOLDER
    from ..calibration.collection import self_calibrate
    from ..calibration.self_threshold import card_fallback
    from ..precision import make_accelerator
    from ..retrieval.content.crops import write_crops
    from ..retrieval.deduplication.collection import dedup, write_layout_crops, write_pairs
    from ..retrieval.deduplication.grouping import write_groups
    from ..runtime.loading import DEFAULT_MATCHER

    (threshold, origin), (config, settings) = decision, configs
    accelerator = make_accelerator()
    log = request.log if accelerator.is_main_process else (lambda line: None)
    log(f"{len(source)} images, descriptor: {descriptor.name}, matcher: {request.pipeline.models.matcher_label()}, "
        f"threshold {origin}")
    calibration, started = None, time.perf_counter()
    if threshold is None:
        calibration = self_calibrate(
            source, descriptor, matcher, config, output / SELF_CALIBRATION_FOLDER, request.self_calibration_sample,
            0.9 if request.precision is None else request.precision, request.self_calibration_seed, whiten_from,
            output / "indexes" / descriptor.name / "whitening", accelerator, request.progress, log, settings,
            fallback=matcher and card_fallback(request.pipeline.models.matcher or DEFAULT_MATCHER))
        threshold, origin = calibration.threshold, calibration.origin
    calibrating = time.perf_counter() - started
    result = dedup(source, descriptor, matcher, threshold, config, index_folder=output / "indexes",
                   progress=request.progress, log=log, whiten_from=whiten_from, rescoring_folder=output / "rescoring",
                   accelerator=accelerator, settings=settings, tokens_folder=output / "tokens")
    if calibration is not None:  # the report's table of stage times, the self-calibration first (it runs first)
        result.seconds = {"self-calibration": calibrating, **result.seconds}
    if not accelerator.is_main_process:
        return None
    run = DedupRun(request, source, descriptor, matcher, result, origin, self_calibration=calibration)
    run.rows = write_groups(output / "groups.csv", result.members)
    write_pairs(output / "pairs.csv", result)
    write_crops(output / "content_crops.csv", result)
    write_layout_crops(output / "layout_crops.csv", result)
    run.meaning = score_meaning(run, threshold)
    run.meaning.save(output / "scores.json")
    return run


def score_meaning(run: DedupRun, threshold: float) -> ScoreMeaning:
    """What the run's decision scores are (:func:`~copynce_hf.calibration.meaning.dedup_score`) and where its
    ``threshold`` comes from: ``--threshold``, a calibration file's row, or the self-calibration."""
    request = run.request
    models = request.pipeline.models
    score = dedup_score(request.settings, models.has_matcher)
    score += ", of whitened descriptors" if request.whiten_from and not models.has_matcher else ""
    model = models.matcher_label() if models.has_matcher else run.descriptor.source
    decides = "a copy: pairs at or above it form the groups"
    if request.threshold is not None:
        return ScoreMeaning(score, model, threshold, "given with --threshold", decides=decides)
    if request.calibration is not None:
        stage = "matcher" if models.has_matcher else "descriptor"
        point = Calibration.load(request.calibration).point(0.9 if request.precision is None else request.precision,
                                                            stage)
        return ScoreMeaning(score, model, threshold, f"{request.calibration} (`copynce calibrate`)", point.precision,
                            point.recall, decides)
    calibration = run.self_calibration
    if calibration.falls_back:  # the self-calibration kept too few copies (its one-line warning says so)
        return ScoreMeaning(score, model, threshold, calibration.fallback.source, decides=decides)
    choice = calibration.choice
    return ScoreMeaning(score, model, threshold, "self-calibrated on copies of this collection's own images",
                        calibration.target if choice.reached else choice.precision, choice.recall, decides)


def matcher_orders_text(settings, matcher: tuple | None) -> str:
    """How the matcher's pairs were scored under ``settings`` (:class:`~copynce_hf.retrieval.deduplication.collection.DedupSettings`), in words
    (``report.html``)."""
    if matcher is None:
        return "no matcher"
    both = settings.scores_both_orders(matcher[0])
    chosen = "" if settings.matcher_orders != "auto" else (" (auto: the matcher tells query from reference)" if both else
                                          " (auto: the matcher's score does not depend on the order)")
    return ("both: each pair scored twice, each image the query once, the mean logit" if both
            else "one: the earlier image as the query") + chosen


def content_crops_text(result, asked: bool) -> str:
    """What content crops did in a :class:`~copynce_hf.retrieval.deduplication.collection.DedupResult`, in words (``report.html``)."""
    if not asked:
        return "off"
    if "content crops" not in result.seconds:
        return "on, not run (they need content tokens, whole-image views and a matcher)"
    from ..retrieval.content.crops import VIEW_CROP

    on_crops = sum(VIEW_CROP in (pair.view_a, pair.view_b) for pair in result.crop_pairs)
    return f"{len(result.crop_boxes)} images cropped to their own content, {on_crops} pairs verified on their crops"


def layout_crops_text(result, asked: bool) -> str:
    """What layout crops did in a :class:`~copynce_hf.retrieval.deduplication.collection.DedupResult`, in words
    (``report.html``)."""
    if not asked:
        return "off"
    if "layout crops" not in result.seconds:
        return "on, not run (they need whole-image views and a matcher)"
    return f"{len(result.layout_boxes)} pairs scored higher on a layout crop of one image than on the whole images"


def dedup_report_settings(run: DedupRun) -> dict[str, object]:
    """The settings ``report.html`` lists: images, models, threshold (and the self-calibration's file when
    self-calibrated), candidates, views, normalisation, grouping, whitening, groups, images skipped (unreadable,
    with their reasons)."""
    request, settings, config = run.request, run.request.settings, run.request.pipeline.config()
    skipped = run.result.skipped
    images = (f"{request.dataset} (split {request.input.split})" if request.dataset is not None
              else str(Path(request.images).resolve()))
    calibration = {} if run.self_calibration is None else {
        "self-calibration": f"{run.self_calibration.file} (the calibration collection's verified pairs, their kinds and "
                            "decision scores)"}
    collection = settings.collection
    descriptor_normalisation = (f"alpha {collection.alpha}, neighbours of ranks {collection.k_start}-"
                                f"{collection.k_end}" if collection.on else "off")
    matcher_normalisation = (f"alpha {settings.matcher_alpha}, verified pairs of ranks {settings.matcher_k_start}-"
                             f"{settings.matcher_k_end}, backgrounds above logit {settings.matcher_anchor:g}"
                             if settings.matcher_normalisation and run.matcher is not None else "off")
    return {"images": images, "descriptor": run.descriptor.source,
            "matcher": request.pipeline.models.matcher_label(), "threshold": run.origin, **calibration,
            "scores": run.meaning.line() if run.meaning else "",
            "candidates per image": config.candidates, "descriptor LCE": config.descriptor_lce,
            "matcher LCE": config.matcher_lce, "descriptor collection normalisation": descriptor_normalisation,
            "matcher collection normalisation": matcher_normalisation,
            "matcher orders": matcher_orders_text(settings, run.matcher),
            "grouping": settings.grouping,
            "content tokens": content_tokens_text(config),
            "content crops": content_crops_text(run.result, settings.content_crops),
            "layout crops": layout_crops_text(run.result, settings.layout_crops),
            "whitening": f"learned from {request.whiten_from}" if request.whiten_from else "off",
            "groups": len(run.result.groups), "images in groups": run.rows,
            "images skipped": count_text(skipped.values()) if skipped else "none"}
