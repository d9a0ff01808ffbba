"""Calibrating score thresholds on the user's own references, without labels (``copynce calibrate``).

PixTrace makes copies whose answer is known: a sample of the references is edited with the calibration's own
recipe (:data:`COPY_RECIPE`, :meth:`CopyRecipe.calibration_copies <copynce_hf.pixtrace.CopyRecipe.calibration_copies>`:
everyday edits with ranges of their own, drawn by no benchmark and no training recipe, so that mini-DISC checks the
thresholds on copies of another recipe), and distractor images (a given folder, or references left out of
the index) are edited the same way; their originals are not indexed, so they must not match. The
detection pipeline then runs on these queries against the (remaining) references, and each stage's
pooled predictions give the thresholds at the target precisions (:mod:`copynce_hf.calibration.thresholds`).
The file also keeps each stage's muAP, RP90 and recall@1 on these copies (``provenance["metrics"]``): how
the pipeline does on copies of this collection, a way to compare models or settings without labels.

What the thresholds promise depends on the share of copies among the queries (here ``sample`` copies
for ``distractors`` distractors) and on how far the recipe's edits resemble the copies met in practice.
Everything is drawn from ``seed``: the same seed, references and models give the same file.
``copynce calibrate`` as one call is :func:`copynce_hf.runs.calibrate.calibrate_to_file`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..evaluation.minidisc import QueryEntry, draw_queries
from ..images import image_size, load_image
from ..modeling.errors import ConfigError, ImageLoadError
from ..pixtrace import CopyRecipe, replay
from ..retrieval.descriptors.cached import Descriptor
from ..retrieval.detection.config import DetectConfig
from ..retrieval.detection.pipeline import detect
from ..retrieval.predictions import prediction_metrics
from ..retrieval.search.candidates import top_per_query
from ..retrieval.sources import ImageFolderSource, ImageListSource
from .synthetic import COPY_RECIPE  # the recipe of dedup's self-calibration too; the file records it
from .thresholds import DEFAULT_SEED, PRECISIONS, Calibration, operating_points

__all__ = ["CalibrationQueries", "calibrate", "calibration_queries"]


@dataclasses.dataclass
class CalibrationQueries:
    """The copies a calibration runs on.

    Attributes:
        queries: the query edits (:class:`~copynce_hf.evaluation.minidisc.QueryEntry`), copies and distractors.
        indexed_ids: the reference ids searched (all references, less those held out as distractors).
        sample_ids: references copied (each has one copy among the queries).
        distractor_ids: ids of the distractor originals (in the distractor folder, or held-out references).
        distractor_source: ``"folder"`` or ``"held-out references"``.
        skipped: id -> reason (:data:`~copynce_hf.modeling.errors.SKIP_REASONS`) of each image met while picking
            the sample and the distractors whose header cannot be read (another image was picked instead).
    """

    queries: list[QueryEntry]
    indexed_ids: list[str]
    sample_ids: list[str]
    distractor_ids: list[str]
    distractor_source: str
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ground_truth(self) -> dict[str, list[str]]:
        return {q.query_id: [q.reference_id] if q.reference_id else [] for q in self.queries}


def calibration_queries(references: ImageFolderSource, sample: int, distractors: ImageFolderSource | None = None,
                        num_distractors: int | None = None, seed: int = DEFAULT_SEED) -> CalibrationQueries:
    """Pick the copied references and the distractors (seeded) and draw every query's edits.

    Args:
        references: the collection to calibrate for.
        sample: references copied (at most those available).
        distractors: images that are not references; ``None``: hold ``num_distractors`` references out of
            the index and use them.
        num_distractors: distractor queries (default: ``sample``); held-out references are capped at half
            the collection.
        seed: draws the sample, the distractors and the edits (of :data:`COPY_RECIPE`).
    """
    if sample < 1:
        raise ConfigError(f"--sample must be at least 1, got {sample}")
    if len(references) == 0:
        raise ConfigError(f"{references.folder} holds no image to calibrate on")
    if distractors is not None and len(distractors) == 0:
        raise ConfigError(f"--distractors {distractors.folder} holds no image")
    num_distractors = sample if num_distractors is None else num_distractors
    rng = np.random.default_rng([seed, 0])
    order = [references.ids[i] for i in rng.permutation(len(references))]
    files, skipped = references.lookup(), {}
    if distractors is None:
        held_out = _readable(order, files, min(num_distractors, len(order) // 2), references.max_pixels, skipped)
        rest = [i for i in order if i not in set(held_out)]
        distractor_files = [(files[i], i) for i in held_out]
        source = "held-out references"
    else:
        permuted = [distractors.ids[i] for i in np.random.default_rng([seed, 1]).permutation(len(distractors))]
        picked = set(_readable(permuted, distractors.lookup(), num_distractors, distractors.max_pixels, skipped))
        distractor_files = [(distractors.files[i], image_id) for i, image_id in enumerate(distractors.ids)
                            if image_id in picked]
        held_out, rest = [], order
        source = "folder"
    if len(rest) < 2 and distractors is None:
        raise ConfigError(f"{references.folder} holds {len(references)} image(s): calibrating without "
                          "--distractors needs at least 3 (some are held out as distractors)")
    sample_ids = sorted(_readable([i for i in rest if i not in skipped], files, sample, references.max_pixels, skipped))
    sources = [(Path(files[i]), i) for i in sample_ids] + [(Path(path), None) for path, _ in distractor_files]
    queries = draw_queries(sources, CopyRecipe.preset(COPY_RECIPE), seed, "the calibration sample",
                           references.max_pixels)
    left_out = set(held_out)
    indexed = [i for i in references.ids if i not in left_out]
    return CalibrationQueries(queries, indexed, sample_ids, [i for _, i in distractor_files], source, skipped)


def _readable(ids: Sequence[str], files: dict, wanted: int, max_pixels: int | None,
              skipped: dict[str, str]) -> list[str]:
    """The first ``wanted`` of ``ids`` whose file's header reads (:func:`~copynce_hf.images.image_size`); the reason of
    each one met that does not is added to ``skipped``."""
    found = []
    for image_id in ids:
        if len(found) == wanted:
            break
        try:
            image_size(files[image_id], max_pixels=max_pixels)
            found.append(image_id)
        except ImageLoadError as error:
            skipped[image_id] = error.reason
    return found


def _loader(path: Path, max_pixels: int | None) -> Callable:
    return lambda: load_image(path, max_pixels=max_pixels)


def _write_queries(queries: Sequence[QueryEntry], folder: Path, progress: bool) -> dict[str, str]:
    """Render every query into ``folder`` (PNG); returns query id -> reason of each whose original could not be read
    (its header read, its pixels did not: ``truncated``)."""
    from tqdm.auto import tqdm

    unreadable = {}
    for entry in tqdm(queries, desc="calibration copies", disable=not progress, unit="image"):
        try:
            replay(entry.source_path, list(entry.edits), fuse=False).image.save(folder / f"{entry.query_id}.png")
        except ImageLoadError as error:
            unreadable[entry.query_id] = error.reason
    return unreadable


def calibrate(references: ImageFolderSource, descriptors: Sequence[Descriptor], matcher: tuple | None,
              pipeline: dict, config: DetectConfig, auxiliary=None, distractors: ImageFolderSource | None = None,
              sample: int = 100, num_distractors: int | None = None, seed: int = DEFAULT_SEED,
              precisions: Sequence[float] = PRECISIONS, progress: bool = True,
              log: Callable[[str], None] = print) -> Calibration:
    """Make the calibration copies, run :func:`~copynce_hf.retrieval.detection` on them and choose the thresholds.

    Args:
        references: the collection (an :class:`ImageFolderSource`).
        descriptors, matcher, auxiliary, config: the pipeline, as given to :func:`detect`.
        pipeline: its identity (:func:`~copynce_hf.calibration.thresholds.pipeline_identity`), stored in the file.
        distractors, sample, num_distractors, seed: see :func:`calibration_queries`.
        precisions: target precisions.
        progress, log: progress bars; one line per step.

    Returns:
        the :class:`~copynce_hf.calibration.thresholds.Calibration`; stage ``descriptor`` scores the top ``k``
        merged descriptor candidates per query (what ``detect --matcher none`` outputs), stage ``matcher``
        (with a matcher) the matcher's top ``k``.
    """
    made = calibration_queries(references, sample, distractors, num_distractors, seed)
    copies = len(made.sample_ids)
    log(f"{copies} copies of references and {len(made.distractor_ids)} copies of distractors "
        f"({made.distractor_source}), searched among {len(made.indexed_ids)} references")
    files = references.lookup()
    indexed = ImageListSource(made.indexed_ids, [_loader(files[i], references.max_pixels) for i in made.indexed_ids])
    with tempfile.TemporaryDirectory(prefix="copynce-calibration-") as folder:
        unreadable = _write_queries(made.queries, Path(folder), progress)
        if unreadable:
            log(f"{len(unreadable)} original(s) could not be read ({', '.join(sorted(set(unreadable.values())))}); "
                "their copies are left out (a left-out copy of a reference counts as missed)")
        queries = ImageFolderSource(folder, max_pixels=references.max_pixels)
        result = detect(queries, indexed, descriptors, matcher, auxiliary, config, progress=progress, log=log)
    ground_truth = made.ground_truth
    stages = {"descriptor": top_per_query(result.candidates, config.k)}
    if matcher is not None:
        stages["matcher"] = result.predictions
    points = {}
    counts = {"copies": copies, "distractors": len(made.distractor_ids), "indexed_references": len(made.indexed_ids),
              "unreadable_originals": len(unreadable), "skipped_queries": len(result.skipped_queries),
              "skip_reasons": {"originals": {**made.skipped, **{_original(made, q): r for q, r in unreadable.items()}},
                               "references": result.skipped_references, "copies": result.skipped_queries}}
    metrics = {}
    for stage, predictions in stages.items():
        is_copy = [p.reference_id in ground_truth.get(p.query_id, ()) for p in predictions]
        points[stage] = operating_points(is_copy, [p.score for p in predictions], copies, precisions)
        counts[f"{stage}_pairs"] = len(predictions)
        metrics[stage] = _stage_metrics(predictions, ground_truth)
    provenance = {
        "references": str(Path(references.folder).resolve()),
        "distractors": str(Path(distractors.folder).resolve()) if distractors is not None else None,
        "distractor_source": made.distractor_source, "seed": seed,
        "recipe": CopyRecipe.preset(COPY_RECIPE).to_dict(), "recipe_name": COPY_RECIPE,
        "detect_config": dataclasses.asdict(config), "counts": counts, "metrics": metrics,
        "sample_ids": made.sample_ids, "distractor_ids": made.distractor_ids,
    }
    return Calibration(pipeline, points, provenance, source=None)


def _original(made: CalibrationQueries, query_id: str) -> str:
    """The image a calibration query copies: a reference's id, or a distractor's file."""
    entry = next(q for q in made.queries if q.query_id == query_id)
    return entry.reference_id or str(entry.source_path)


#: The numbers of :func:`~copynce_hf.retrieval.predictions.prediction_metrics` a calibration keeps per stage.
STAGE_METRICS = ("micro_ap", "recall_at_p90", "recall_at_rank1")


def _stage_metrics(predictions, ground_truth: dict[str, list[str]]) -> dict[str, float] | None:
    """muAP, RP90 and recall@1 of one stage's predictions on the calibration copies (the task's pooled metrics,
    as on DISC21); ``None`` when the stage predicted nothing."""
    if not predictions:
        return None
    found = prediction_metrics(predictions, ground_truth)
    return {key: float(found[key]) for key in STAGE_METRICS}
