"""``copynce dedup`` as one call: a :class:`DedupRequest` in, ``groups.csv`` and ``pairs.csv`` written and a
:class:`DedupRun` out.

:func:`run_dedup` opens the images (a folder, or a dataset as ``copynce index --dataset`` opens one), checks the
inputs and the output folder, chooses the threshold (:func:`dedup_threshold`:
``--threshold``, a calibration file's at ``--precision``, or the matcher's 0.5) before any model loads, loads the
models (:mod:`.pipeline_settings`) and runs :func:`~.dedup.dedup` with its caches in ``OUTPUT/indexes`` and
``OUTPUT/rescoring``. The group gallery (``report.html``) is drawn from the returned run by
:func:`copynce_hf.retrieval.reports.run_folders.write_dedup_folder`, the one call of the command.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from ...modeling.errors import ConfigError
from ...outputs import check_output_folder, run_folder
from ..search.presets import DEFAULT_CHUNK_SIZE
from ..search.sources import ImageInput, count_text
from .calibration import Calibration
from .pipeline_settings import PipelineModels

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DedupRequest:
    """A ``copynce dedup`` run.

    Attributes:
        images: the folder searched for copies of its own images (``None`` with ``dataset``).
        output: the output folder.
        models: the descriptor (one) and the matcher (:class:`~.pipeline_settings.PipelineModels`).
        threshold: pairs scored at or above it are copies (``None``: from ``calibration``, else 0.5 with a matcher).
        calibration, precision: a ``copynce calibrate`` file and the precision it decides at (default 0.9).
        candidates, descriptor_lce, matcher_lce, batch_size, num_workers, chunk_size, whiten_dim: as in
            :class:`~.detect.DetectConfig`.
        whiten_from: sample images to learn a whitening from (``None``: none).
        dataset: instead of ``images``, a dataset (Hub id, Parquet file or folder, ``save_to_disk`` folder, image
            folder: :func:`~..search.sources.open_dataset_source`), read by random access (not streamed).
        input: how images are read (sub-folders, size limit, the dataset's split and columns).
        gallery: groups shown in ``report.html``.
        progress: progress bars.
        log: receives one line per stage (on the main process only).
    """

    images: str | None
    output: str
    models: PipelineModels = dataclasses.field(default_factory=lambda: PipelineModels(descriptor_option="--model"))
    threshold: float | None = None
    calibration: str | None = None
    precision: float | None = None
    candidates: int = 10
    descriptor_lce: str = "none"
    matcher_lce: str = "none"
    batch_size: int = 64
    num_workers: int = 0
    chunk_size: int = DEFAULT_CHUNK_SIZE
    whiten_dim: int | None = None
    whiten_from: str | None = None
    dataset: str | None = None
    input: ImageInput = dataclasses.field(default_factory=ImageInput)
    gallery: int = 8
    progress: bool = True
    log: Callable[[str], None] = logger.info

    def config(self):
        """The :class:`~.detect.DetectConfig` of the run."""
        from .detect import DetectConfig

        return DetectConfig(candidates=self.candidates, descriptor_lce=self.descriptor_lce,
                            matcher_lce=self.matcher_lce, batch_size=self.batch_size, num_workers=self.num_workers,
                            whiten_dim=self.whiten_dim, chunk_size=self.chunk_size)


@dataclasses.dataclass
class DedupRun:
    """A finished dedup run: its request, images, models, :class:`~.dedup.DedupResult`, where the threshold came
    from, and the rows of ``groups.csv``."""

    request: DedupRequest
    source: object
    descriptor: object
    matcher: tuple | None
    result: object
    origin: str
    rows: int = 0
    report: Path | None = None

    @property
    def heatmap_model(self) -> tuple:
        """The model whose heatmaps the report draws: the matcher, else the descriptor."""
        return self.matcher or (self.descriptor.model, self.descriptor.processor)


def dedup_threshold(request: DedupRequest, config) -> tuple[float, str]:
    """``(threshold, where it comes from)`` of a dedup run: ``threshold``, a calibration file's at ``precision``
    (the matcher stage with a matcher, the embedded one included; :func:`~.dedup.calibrated_threshold`), or 0.5
    with a matcher. Without a matcher a threshold or a calibration is required."""
    from .dedup import calibrated_threshold

    models = request.models
    if request.calibration is not None:
        if request.threshold is not None:
            raise ConfigError("give --threshold or --calibration, not both")
        precision = 0.9 if request.precision is None else request.precision
        return calibrated_threshold(Calibration.load(request.calibration), precision,
                                    models.descriptor_identities()[0], models.matcher_identity(), config,
                                    whitened=request.whiten_from is not None)
    if request.precision is not None:
        raise ConfigError("--precision needs --calibration FILE (written by `copynce calibrate`)")
    if request.threshold is not None:
        return request.threshold, f"{request.threshold:.4g} (given)"
    if not models.has_matcher:
        raise ConfigError("--matcher none decides by descriptor cosine, which has no default threshold: "
                          "pass --threshold T or --calibration FILE")
    return 0.5, "0.5 (the matcher's default)"


def run_dedup(request: DedupRequest) -> DedupRun | None:
    """Run ``copynce dedup`` and write ``groups.csv`` and ``pairs.csv``; the run on the main process, ``None`` on
    the others (``accelerate launch``). A refused input found during the model work removes the output folder
    where this run made it."""
    check_output_folder(request.output)
    request.models.check_paths()
    if request.dataset is not None and request.input.streaming:
        raise ConfigError(f"dedup reads dataset {request.dataset!r} by random access (the matcher reads each pair's "
                          "two images): it cannot be streamed")
    source = request.input.folder_or_dataset(request.images, request.dataset, "--dataset")
    whiten_from = request.input.whitening_sample(request.whiten_from, request.whiten_dim)
    config = request.config()
    threshold, origin = dedup_threshold(request, config)
    [descriptor], matcher = request.models.load_descriptors(), request.models.load_matcher()
    with run_folder(request.output, ("groups.csv",)) as output:
        return _dedup_into(request, source, descriptor, matcher, (threshold, origin), whiten_from, config, output)


def _dedup_into(request: DedupRequest, source, descriptor, matcher, decision: tuple[float, str], whiten_from,
                config, output: Path) -> DedupRun | None:
    """The model work of :func:`run_dedup` into the existing folder ``output``."""
    from ...precision import make_accelerator
    from ..search.predictions import write_predictions
    from .dedup import dedup, write_groups

    threshold, origin = decision
    accelerator = make_accelerator()
    log = request.log if accelerator.is_main_process else (lambda line: None)
    log(f"{len(source)} images, descriptor: {descriptor.name}, matcher: {request.models.matcher_label()}, "
        f"threshold {origin}")
    result = dedup(source, descriptor, matcher, threshold, config, index_folder=output / "indexes",
                   progress=request.progress, log=log, whiten_from=whiten_from, rescoring_folder=output / "rescoring",
                   accelerator=accelerator)
    if not accelerator.is_main_process:
        return None
    run = DedupRun(request, source, descriptor, matcher, result, origin)
    run.rows = write_groups(output / "groups.csv", result.groups)
    write_predictions(output / "pairs.csv", result.pairs)
    return run


def dedup_report_settings(run: DedupRun) -> dict[str, object]:
    """The settings ``report.html`` lists: images, models, threshold, candidates, views, whitening, groups, images
    skipped (unreadable, with their reasons)."""
    request = run.request
    skipped = run.result.skipped
    images = (f"{request.dataset} (split {request.input.split})" if request.dataset is not None
              else str(Path(request.images).resolve()))
    return {"images": images, "descriptor": run.descriptor.source,
            "matcher": request.models.matcher_label(), "threshold": run.origin,
            "candidates per image": request.candidates, "descriptor LCE": request.descriptor_lce,
            "matcher LCE": request.matcher_lce,
            "whitening": f"learned from {request.whiten_from}" if request.whiten_from else "off",
            "groups": len(run.result.groups), "images in groups": run.rows,
            "images skipped": count_text(skipped.values()) if skipped else "none"}
