"""``copynce match`` as one call: a :class:`MatchRequest` in, the candidate pairs of a predictions CSV re-scored by
the matcher (:func:`~.rescoring.rescore_predictions`) into a new predictions CSV and a :class:`MatchDone` out.

The scored chunks are kept in ``.<output name>.rescoring`` beside the output until the end, so that the same request
after a kill resumes (:mod:`copynce_hf.retrieval.verify.chunked_scoring`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..calibration.meaning import ScoreMeaning, card_threshold, match_score
from ..configuration.fields import positive_int, setting, setting_like
from ..modeling.errors import PredictionsError
from ..outputs import check_output_file
from ..retrieval.detection.config import DetectConfig
from ..retrieval.sources import ImageInput
from ..runtime.loading import DEFAULT_MATCHER, check_model_path
from .search import PREDICTIONS_FILE
from .shared_options import ModelLoading

logger = logging.getLogger(__name__)


def rotations(text: str) -> tuple[int, ...]:
    """``--rotations``: comma-separated degrees, or ``none``."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated degrees such as 90,180,270, got {text!r}") from None


@dataclasses.dataclass
class MatchRequest:
    """A ``copynce match`` run; each field with an option declares it (:func:`~copynce_hf.configuration.fields.setting`).

    Attributes:
        predictions: the candidate pairs (a predictions CSV).
        queries, references: folders of the query and reference images (found by id).
        output: predictions CSV to write.
        matcher, runtime: the matcher (``None``: the embedded one; a descriptor scores by cosine) and what runs it.
        top: only each query's ``top`` best candidates are re-scored (``None``: all).
        matcher_lce: the matcher's view pairs (``none``, ``paper``, ``all``).
        local_crops, query_grid, reference_grid, crop_scale, rotations: the grid crops ensembling
            (:class:`~.rescoring.LocalCrops`), when ``local_crops``.
        chunk_size, batch_size, num_workers: pairs per chunk of work, per forward pass; ``DataLoader`` workers.
        fusion_precision: the matcher's fusion blocks (:data:`~copynce_hf.retrieval.presets.FUSION_PRECISIONS`).
        input: how images are read (sub-folders, size limit).
        progress: progress bars.
        log: receives the lines of the chunked work.
    """

    predictions: str = setting(help="candidate pairs (query_id,reference_id,score CSV)", flag="predictions")
    queries: str = setting(help="folder of query images")
    references: str = setting(help="folder of reference images")
    output: str = setting(help="predictions CSV to write")
    matcher: str | None = setting(None, f"matcher model folder or Hub id (default: {DEFAULT_MATCHER})")
    runtime: str = setting_like(ModelLoading, "runtime")
    top: int | None = setting(None, "only re-score each query's TOP best candidates", type=positive_int)
    matcher_lce: str = setting_like(DetectConfig, "matcher_lce")
    local_crops: bool = setting(False, "compare query views (whole, grid crops, rotations) with reference views "
                                "(whole, grid crops) and keep the maximum score", action="store_true", default_text="")
    query_grid: int = setting(2, "query crops per side", type=positive_int)
    reference_grid: int = setting(1, "reference crops per side", type=positive_int)
    crop_scale: float = setting(1.5, "a crop spans crop-scale/grid of each side", type=float)
    rotations: tuple[int, ...] = setting((90, 180, 270), "rotations of the whole query, degrees (default 90,180,270; "
                                         "'none' for no rotation)", type=rotations, default_text="")
    chunk_size: int = setting_like(DetectConfig, "chunk_size")
    fusion_precision: str = setting_like(DetectConfig, "fusion_precision")
    batch_size: int = setting_like(ModelLoading, "batch_size", 32,
                                   "image pairs (view pairs with --local-crops) per forward pass")
    num_workers: int = setting_like(ModelLoading, "num_workers")
    input: ImageInput = dataclasses.field(default_factory=ImageInput)
    progress: bool = True
    log: Callable[[str], None] = logger.info


@dataclasses.dataclass
class MatchDone:
    """What :func:`match_pairs` wrote: pairs (rows), pairs read, pairs re-scored, the reason of each pair left out,
    and what the scores are (:func:`~copynce_hf.calibration.meaning.match_score`)."""

    count: int
    read: int
    rescored: int
    skip_reasons: list[str]
    meaning: ScoreMeaning | None = None


def _missing_files(candidates, queries: dict, references: dict, request: MatchRequest) -> list[str]:
    """The image files the candidate pairs name that do not exist (``QUERIES/id.*``), with a warning."""
    missing = sorted({f"{request.queries}/{p.query_id}.*" for p in candidates if p.query_id not in queries}
                     | {f"{request.references}/{p.reference_id}.*" for p in candidates
                        if p.reference_id not in references})
    if missing:
        logger.warning("%d image file(s) named by %s do not exist: %s%s", len(missing), request.predictions,
                       ", ".join(missing[:5]), ", ..." if len(missing) > 5 else "")
    return missing


def rescoring_folder(output: str | os.PathLike) -> Path:
    """Where the scored chunks of a ``copynce match`` writing ``output`` are kept until it ends: ``.<name>.rescoring``
    beside it."""
    output = Path(output)
    return output.with_name(f".{output.name}.rescoring")


def match_pairs(request: MatchRequest) -> MatchDone | None:
    """Run ``copynce match``; what was written on the main process, ``None`` on the others."""
    from ..modeling.configuration_copynce import model_kind
    from ..precision import make_accelerator
    from ..retrieval.predictions import read_predictions, write_predictions
    from ..retrieval.search.candidates import top_per_query
    from ..retrieval.verify.local_crops import LocalCrops
    from ..retrieval.verify.rescoring import rescore_predictions
    from ..runtime.loading import load_model

    check_output_file(request.output, own=PREDICTIONS_FILE)
    check_model_path(request.matcher, "--matcher")
    candidates = read_predictions(request.predictions)
    if not candidates:
        raise PredictionsError(f"predictions file {request.predictions} holds no pair")
    read = len(candidates)
    if request.top is not None:
        candidates = top_per_query(candidates, request.top)
    queries = request.input.folder(request.queries).lookup()
    references = request.input.folder(request.references).lookup()
    missing = _missing_files(candidates, queries, references, request)
    model, processor = load_model(request.matcher, None, "--matcher", default=DEFAULT_MATCHER, runtime=request.runtime)
    if model_kind(model) == "descriptor":
        logger.warning("--matcher %s is a descriptor model: pairs are scored by descriptor cosine", request.matcher)
    crops = None
    if request.local_crops:
        crops = LocalCrops(request.query_grid, request.reference_grid, request.crop_scale, request.rotations)
    accelerator = make_accelerator()
    work = rescoring_folder(request.output)  # scored chunks, until the end
    try:
        result = rescore_predictions(
            candidates, model, processor, queries, references, batch_size=request.batch_size,
            num_workers=request.num_workers, local_crops=crops, progress=request.progress,
            matcher_lce=request.matcher_lce, max_pixels=request.input.max_pixels, accelerator=accelerator,
            work_folder=work, chunk_size=request.chunk_size, log=request.log,
            fusion_precision=request.fusion_precision,
        )
    except PredictionsError as error:
        if missing:
            raise PredictionsError(f"{error}; missing files: {', '.join(missing[:5])}") from error
        raise
    if not accelerator.is_main_process:
        return None
    count = write_predictions(request.output, result.predictions)
    shutil.rmtree(work, ignore_errors=True)
    kind, views = model_kind(model), request.local_crops or request.matcher_lce != "none"
    card = card_threshold(request.matcher or DEFAULT_MATCHER, kind) if kind == "matcher" or not views else None
    meaning = ScoreMeaning(match_score(kind == "matcher", views), str(request.matcher or DEFAULT_MATCHER), card=card)
    return MatchDone(count, read, len(candidates), [reason.split(":")[0] for *_, reason in result.skipped], meaning)
