"""``copynce detect`` as one call: a :class:`DetectRequest` (inputs, pipeline, decision, outputs) in, the run's
data files written and a :class:`DetectRun` out.

:func:`run_detect` checks every input and the output folder, reads the calibrated decision and the ground truth
before any model loads, loads the models (:mod:`copynce_hf.runs.settings`), runs :func:`~copynce_hf.retrieval.detection.pipeline.detect` with its caches in
``OUTPUT/indexes`` and ``OUTPUT/rescoring``, and writes ``OUTPUT/predictions.csv`` (with the column ``copy`` when a
calibration decides), ``OUTPUT/copies.csv`` (with a calibration), ``OUTPUT/query_crops.csv`` (with query crops),
``OUTPUT/scores.json`` (what the scores are and the threshold in force: :func:`score_meaning`) and
``OUTPUT/metrics.json`` (with a ground truth).
The match gallery (``report.html``) is drawn from the returned run by
:func:`copynce_hf.runs.folders.write_detect_folder`, the one call of the command.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

from ..calibration.meaning import ScoreMeaning, card_threshold, detect_score
from ..calibration.thresholds import Decision, calibrated_decision, decision_report
from ..configuration.fields import positive_int, setting, setting_like
from ..metrics.copy_detection.formulas import check_id_overlap
from ..modeling.errors import ConfigError, PredictionsError
from ..outputs import StagedFile, check_output_folder, run_folder
from ..retrieval.predictions import Prediction, metric_warnings_logged, read_ground_truth, write_predictions
from ..retrieval.sources import ImageInput
from .settings import PipelineSettings, content_tokens_text
from .shared_options import CalibratedDecision, DatasetInput, Whitening

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DetectRequest:
    """A ``copynce detect`` run; each field with an option declares it (:func:`~copynce_hf.configuration.fields.setting`).

    Attributes:
        references: folder of reference images.
        output: the output folder.
        pipeline: models, preset and settings (:class:`~copynce_hf.runs.settings.PipelineSettings`).
        queries, query_dataset: the query images: a folder, or a dataset (:class:`~copynce_hf.retrieval.sources.ImageInput`).
        images: how images are read (sub-folders, size limit, dataset columns).
        ground_truth: CSV ``query_id,reference_id``: metrics are written (``None``: none).
        calibration, precision: a ``copynce calibrate`` file and the precision it decides at (default 0.9).
        whiten_from: sample images to learn a whitening from (``None``: none).
        gallery: cards per gallery in ``report.html``.
        progress: progress bars.
        log: receives one line per stage (on the main process only).
    """

    references: str = setting(help="folder of reference images")
    output: str = setting(help="folder for predictions.csv, report.html, metrics.json, indexes/")
    pipeline: PipelineSettings = dataclasses.field(default_factory=PipelineSettings)
    queries: str | None = setting(None, "folder of query images (or --query-dataset)", flag="queries", nargs="?")
    query_dataset: str | None = setting_like(DatasetInput, "dataset", flag="--query-dataset")
    images: ImageInput = dataclasses.field(default_factory=ImageInput)
    ground_truth: str | None = setting(None, "CSV query_id,reference_id: also write metrics.json (muAP, RP90, "
                                       "recall@1, candidate recall)")
    calibration: str | None = setting_like(CalibratedDecision, "calibration")
    precision: float | None = setting_like(CalibratedDecision, "precision")
    whiten_from: str | None = setting_like(Whitening, "whiten_from")
    gallery: int = setting(8, "cards per gallery in report.html", type=positive_int)
    progress: bool = True
    log: Callable[[str], None] = logger.info


@dataclasses.dataclass
class DetectInputs:
    """What a detect run reads, opened and checked before any model loads."""

    queries: object
    references: object
    auxiliary: object
    whiten_from: object
    ground_truth: dict[str, list[str]] | None
    config: object
    decision: Decision | None


@dataclasses.dataclass
class DetectRun:
    """A finished detect run: its request, inputs, models and :class:`~copynce_hf.retrieval.detection.DetectResult`, the predictions
    written (``count``), the pairs decided copies, the metrics and the settings the report lists."""

    request: DetectRequest
    inputs: DetectInputs
    descriptors: list
    matcher: tuple | None
    result: object
    count: int = 0
    copies: list[Prediction] = dataclasses.field(default_factory=list)
    metrics: dict | None = None
    report: Path | None = None
    meaning: ScoreMeaning | None = None

    @property
    def heatmap_model(self) -> tuple:
        """The model whose heatmaps the report draws: the matcher, else the first descriptor (none for an ONNX
        embedding model, which has no tokens)."""
        from ..runtime.onnx_embedding import token_heatmap_model

        return self.matcher or token_heatmap_model(self.descriptors[0].model, self.descriptors[0].processor)

    @property
    def gallery_threshold(self) -> float:
        """The score the report's borderline matches are nearest to: the decision's threshold, else 0.5 with a
        matcher's probabilities, else (descriptor scores, the matcher's logits weighed with them) the median score."""
        if self.inputs.decision is not None:
            return self.inputs.decision.threshold
        if self.matcher is not None and not self.inputs.config.descriptor_weight:
            return 0.5
        return float(sorted(p.score for p in self.result.predictions)[len(self.result.predictions) // 2])


def open_detect_inputs(request: DetectRequest) -> DetectInputs:
    """Every input and the output folder checked, the images listed, the ground truth and the calibrated decision
    read; nothing loads a model (a mistake costs no model work)."""
    settings, images = request.pipeline, request.images
    check_output_folder(request.output, inputs={
        "query folder": request.queries, "reference folder": request.references, "--aux folder": settings.aux,
        "--whiten-from folder": request.whiten_from})
    settings.models.check_paths()
    queries = images.folder_or_dataset(request.queries, request.query_dataset, "--query-dataset")
    references = images.folder(request.references)
    auxiliary = images.folder(settings.aux) if settings.aux else None
    ground_truth = read_ground_truth(request.ground_truth) if request.ground_truth else None
    if ground_truth is not None:
        check_ground_truth_ids(ground_truth, request.ground_truth, queries.ids, references.ids)
    config = settings.config()
    if config.normalises_references and config.reference_background == "auxiliary" and auxiliary is None:
        raise ConfigError("--reference-background auxiliary needs auxiliary images: give --aux FOLDER")
    whiten_from = images.whitening_sample(request.whiten_from, settings.whiten_dim)
    if whiten_from is not None and request.calibration is not None and not settings.models.has_matcher:
        raise ConfigError("a calibration holds descriptor thresholds without whitening; with --whiten-from and "
                          "--matcher none give no --calibration")
    if request.calibration is None and request.precision is not None:
        raise ConfigError("--precision needs --calibration FILE (written by `copynce calibrate`)")
    decision = None
    if request.calibration is not None:
        decision = calibrated_decision(request.calibration, request.precision, settings.identity())
    return DetectInputs(queries, references, auxiliary, whiten_from, ground_truth, config, decision)


def check_ground_truth_ids(ground_truth: dict[str, list[str]], path, query_ids, reference_ids) -> None:
    """Refuse, before any model work, a ground truth whose ids cannot be those of the images (``q00.jpg`` against
    ``q00``, ...): the metric's own check (:func:`check_id_overlap`) on every query and reference id. Its
    warnings on a partial overlap are left to the metrics at the end, where they are logged once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            check_id_overlap(list(query_ids), list(reference_ids), ground_truth)
        except ValueError as error:
            raise PredictionsError(f"{path}: {error}") from None


def run_detect(request: DetectRequest) -> DetectRun | None:
    """Run ``copynce detect``: :func:`open_detect_inputs`, the models, :func:`~copynce_hf.retrieval.detection.pipeline.detect`, then
    :func:`write_detect_data`. Returns the run on the main process, ``None`` on the others (``accelerate launch``).
    A refused input found during the model work removes the output folder where this run made it."""
    inputs = open_detect_inputs(request)
    models = request.pipeline.models
    descriptors, matcher = models.load_descriptors(), models.load_matcher()
    with run_folder(request.output, ("predictions.csv",)) as output:
        return _detect_into(request, inputs, descriptors, matcher, output)


def _detect_into(request: DetectRequest, inputs: DetectInputs, descriptors, matcher, output: Path):
    """The model work of :func:`run_detect` into the existing folder ``output``."""
    from ..precision import make_accelerator
    from ..retrieval.detection.pipeline import detect

    settings, config = request.pipeline, inputs.config
    accelerator = make_accelerator(config.encoder_precision)
    log = request.log if accelerator.is_main_process else (lambda line: None)
    log(f"{len(inputs.queries)} queries, {len(inputs.references)} references, descriptors: "
        f"{', '.join(d.name for d in descriptors)}, matcher: {settings.models.matcher_label()}")
    log(f"preset {settings.preset}" + (f" with {', '.join(sorted(settings.overrides))} given" if settings.overrides
                                       else "")
        + f": descriptor LCE {config.descriptor_lce}, {config.candidates} candidates, matcher LCE "
        f"{config.matcher_lce}, top {config.k}, score normalisation "
        + (f"over auxiliary ranks {config.k_start}-{config.k_end}" if inputs.auxiliary is not None
           else "off (no --aux folder given)") + f", collection normalisation {collection_text(config)}")
    result = detect(inputs.queries, inputs.references, descriptors, matcher, inputs.auxiliary, config,
                    index_folder=output / "indexes", progress=request.progress, log=log,
                    rescoring_folder=output / "rescoring", accelerator=accelerator, whiten_from=inputs.whiten_from,
                    tokens_folder=output / "tokens")
    if not accelerator.is_main_process:
        return None
    run = DetectRun(request, inputs, descriptors, matcher, result)
    write_detect_data(run)
    return run


def write_detect_data(run: DetectRun) -> None:
    """``predictions.csv`` (its column ``copy`` from the decision), ``copies.csv`` (with a decision),
    ``query_crops.csv`` (the boxes of the query crops, when there are some), ``scores.json`` (:func:`score_meaning`)
    and ``metrics.json`` (with a ground truth: the metrics, and how the decision did) into the output folder."""
    from ..retrieval.content.crops import write_crops

    output, decision, predictions = Path(run.request.output), run.inputs.decision, run.result.predictions
    decided = None if decision is None else decision.threshold
    run.count = write_predictions(output / "predictions.csv", predictions, decision_threshold=decided)
    write_crops(output / "query_crops.csv", run.result)
    run.meaning = score_meaning(run.request, run.inputs.config, decision)
    run.meaning.save(output / "scores.json")
    run.copies = [p for p in predictions if decided is not None and p.score >= decided]
    if decision is not None:
        write_predictions(output / "copies.csv", run.copies)
    ground_truth = run.inputs.ground_truth
    if ground_truth is None:
        return
    try:
        with metric_warnings_logged(run.request.ground_truth):
            run.metrics = run.result.metrics(ground_truth)
    except PredictionsError as error:
        raise PredictionsError(f"{error} ({output / 'predictions.csv'} is written; the metrics are not)") from None
    if decision is not None:
        run.metrics["decision"] = decision_report(predictions, ground_truth, decision.stage, decision.point,
                                                  run.metrics["num_ground_truth_pairs"])
    with StagedFile(output / "metrics.json") as temporary:
        temporary.write_text(json.dumps(run.metrics, indent=2) + "\n", encoding="utf-8")


def score_meaning(request: DetectRequest, config, decision: Decision | None) -> ScoreMeaning:
    """What the run's scores are (:func:`~copynce_hf.calibration.meaning.detect_score`), the threshold in force (the
    calibration's, else none) and, for a score a model card measured (the matcher's probability; one descriptor's
    raw cosine on whole images), the card's threshold at precision 0.9."""
    settings = request.pipeline
    models = settings.models
    score = detect_score(config, len(models.descriptors), models.has_matcher, settings.aux is not None)
    if models.has_matcher:  # the card's threshold is of the matcher's probability, not of a weighted sum of logits
        model = models.matcher_label()
        card = None if config.descriptor_weight else card_threshold(models.matcher, "matcher")
    else:
        model, card = ", ".join(models.descriptor_labels()), None
        score += ", of whitened descriptors" if request.whiten_from else ""
        raw = (settings.aux is None and not config.normalises_references and config.descriptor_lce == "none"
               and not config.descriptor_content_tokens and not request.whiten_from)
        if len(models.descriptors) == 1 and raw:
            card = card_threshold(models.descriptors[0], "descriptor")
    if decision is None:
        return ScoreMeaning(score, model, card=card)
    point = decision.point
    return ScoreMeaning(score, model, point.threshold, f"{request.calibration} (`copynce calibrate`)",
                        point.precision, point.recall, "decided a copy (predictions.csv's copy column, copies.csv)")


def collection_text(config) -> str:
    """How logs and reports name the reference-side collection normalisation of a
    :class:`~copynce_hf.retrieval.detection.config.DetectConfig`: ``off``, or its source, ranks and weight."""
    if not config.normalises_references:
        return "off"
    source = "the other references" if config.reference_background == "collection" else "the auxiliary images"
    return (f"reference backgrounds from {source}, ranks {config.collection.k_start}-{config.collection.k_end}, "
            f"alpha {config.collection.alpha}")


def query_crops_text(result, asked: bool) -> str:
    """How ``report.html`` names the query crops of a :class:`~copynce_hf.retrieval.detection.DetectResult` (``asked``: whether the config
    applies them), as ``dedup``'s :func:`~copynce_hf.runs.dedup.content_crops_text` names its crops."""
    if not asked:
        return "off"
    if "query crops" not in result.seconds:
        return "on, not run (they need a matcher)"
    layout = f" ({len(result.layout_cropped)} by their own layout)" if result.layout_cropped else ""
    return (f"{len(result.crop_boxes)} queries cropped to their own content{layout}, {len(result.crop_pairs)} pairs "
            "scored on their crops")


def report_settings(run: DetectRun) -> dict[str, object]:
    """The settings ``report.html`` lists: inputs, models, preset, views, score normalisation, whitening and the
    decision threshold."""
    request, config, settings = run.request, run.inputs.config, run.request.pipeline
    whitening = "off"
    if request.whiten_from:
        whitening = f"learned from {request.whiten_from}" + (f", {settings.whiten_dim} dimensions"
                                                             if settings.whiten_dim else "")
    found = {
        "queries": request.query_dataset or str(Path(request.queries).resolve()),
        "references": str(Path(request.references).resolve()),
        "descriptors": ", ".join(d.source for d in run.descriptors),
        "matcher": settings.models.matcher_label(),
        "preset": settings.preset_text(),
        "descriptor LCE": config.descriptor_lce, "matcher LCE": config.matcher_lce,
        "score normalisation": (f"alpha {config.alpha}, auxiliary ranks {config.k_start}-{config.k_end} of "
                                f"{settings.aux}" if settings.aux else "off"),
        "collection normalisation": collection_text(config),
        "candidates per query": config.candidates, "predictions per query": config.k,
        "content tokens": content_tokens_text(config),
        "query crops": query_crops_text(run.result, config.crops_queries),
        "whitening": whitening,
        "scores": run.meaning.line() if run.meaning else "",
    }
    decision = run.inputs.decision
    if decision is not None:
        point = decision.point
        found["decision threshold"] = (f"{point.threshold:.4f} ({decision.stage} score at precision "
                                       f"{point.precision:g} in {request.calibration}, expected recall "
                                       f"{point.recall:.3f}): {len(run.copies)} copies")
    return found
