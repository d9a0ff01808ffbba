"""The default threshold of ``copynce dedup``: calibrated on the collection itself, at a stated precision.

Beyond the paper. Without ``--threshold`` or ``--calibration``, :func:`self_calibrate` runs the dedup pipeline
itself (:func:`~copynce_hf.retrieval.deduplication.collection.dedup`, with the run's models,
:class:`~copynce_hf.retrieval.detection.config.DetectConfig` and
:class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`) on a *calibration collection*: a seeded sample
of the collection's images, each with one planted copy (a PixTrace copy, a copy put into a template shared with
other sampled images, or two copies without their original: :mod:`copynce_hf.calibration.synthetic`). Every pair
that run verifies gets the score the run thresholds (its decision score: collection-normalised as the run's are,
``pairs.csv``'s ``score``) and a label from the provenance of its two images: a copy when both were made from the
same sampled image, else not (template-sharing non-copies named as such), unless the two sampled images score as
copies of each other (:func:`~copynce_hf.calibration.synthetic.mark_paired`: a folder may hold copies; those
pairs count as neither). The threshold, what it measured and when it is not used:
:mod:`copynce_hf.calibration.self_threshold`.

No class weighting: the ratio of copies to non-copies is that of the calibration collection's own candidate
pairs. The true pairs the candidates missed (never verified) lower the recall, not the precision.

It runs as the collection's own run does, and resumes as it does: the calibration collection's descriptors, matcher
tokens and scored chunks are kept in ``OUTPUT/self_calibration/indexes``, ``tokens`` and ``rescoring`` (their
identity: the self-calibration's own, see below), so that a run cut short by Ctrl-C goes on from its last complete
chunk. Once done, everything is kept in ``OUTPUT/self_calibration/self_calibration.json`` (the verified pairs'
kinds, decision and raw scores, how each synthetic image was made, the threshold): a rerun with the same
collection, models, settings, whitening sample, sample, seed and copy recipe (its name and its steps) reuses its
scores and only chooses the threshold again (another ``--precision`` included).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

from ..modeling.errors import ConfigError
from ..outputs import StagedFile
from ..pixtrace import CopyRecipe
from ..retrieval.deduplication.collection import dedup
from ..retrieval.deduplication.settings import DedupSettings
from ..retrieval.descriptors.cached import Descriptor
from ..retrieval.detection.config import DetectConfig
from ..retrieval.sources import ImageListSource
from ..retrieval.work_folder import as_stored, digest, model_fingerprint, source_identity
from .self_threshold import Fallback, SelfCalibration, self_threshold
from .synthetic import (
    COPY_RECIPE,
    ROLE_CYCLE,
    TEMPLATE_GROUP,
    SyntheticPair,
    SyntheticSet,
    mark_paired,
    pair_kind,
    synthetic_set,
)

logger = logging.getLogger(__name__)

#: The folder of the self-calibration inside a dedup output folder, and its file.
FOLDER, FILE_NAME = "self_calibration", "self_calibration.json"
FORMAT, VERSION = "copynce-dedup-self-calibration", 3
DEFAULT_SAMPLE, DEFAULT_PRECISION, DEFAULT_SEED = 64, 0.9, 0
#: How the class ratio is set, in the saved file's words.
CLASS_RATIO = ("unweighted: copies and non-copies as the calibration collection's own candidate pairs hold them; "
               "true pairs never verified lower the recall, not the precision")


def _identity(source, descriptor: Descriptor, matcher: tuple | None, config: DetectConfig, settings: DedupSettings,
              whiten_from, sample: int, seed: int) -> dict:
    """What the calibration collection's verified pairs and their scores depend on (see :func:`self_calibrate`)."""
    decides = {name: value for name, value in dataclasses.asdict(config).items()
               if name not in ("batch_size", "num_workers", "cache_size", "chunk_size", "k", "collection")}
    identity = {"version": VERSION, "collection": source_identity(source), "sample": sample, "seed": seed,
                "recipe": COPY_RECIPE, "recipe_steps": digest(CopyRecipe.preset(COPY_RECIPE).to_dict()),
                "roles": list(ROLE_CYCLE), "descriptor": model_fingerprint(descriptor.model),
                "descriptor_processor": digest(descriptor.processor.to_dict()), "config": decides,
                "settings": {name: value for name, value in dataclasses.asdict(settings).items() if name != "grouping"},
                "whiten_from": None if whiten_from is None else source_identity(whiten_from), "matcher": None}
    if matcher is not None:
        processor = matcher[1].to_dict() if hasattr(matcher[1], "to_dict") else repr(matcher[1])
        identity.update(matcher=model_fingerprint(matcher[0]), matcher_processor=digest(processor))
    return as_stored(identity)


def _reused(file: Path | None, identity: dict) -> dict | None:
    """The saved self-calibration in ``file`` when it was made for ``identity``, else ``None``."""
    if file is None or not file.is_file():
        return None
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("identity") != identity:
        return None
    return saved


def _check(sample: int, precision: float) -> None:
    if sample < 1:
        raise ConfigError(f"--self-calibration-sample must be at least 1, got {sample}")
    if not 0 < precision <= 1:
        raise ConfigError(f"--precision must be in (0, 1], got {precision}")


def _saved(made: SelfCalibration, identity: dict, records: dict[str, dict]) -> dict:
    """The content of ``self_calibration.json``."""
    return {"format": FORMAT, "version": VERSION, "identity": identity, "class_ratio": CLASS_RATIO,
            "score": "the dedup run's decision score (pairs.csv's score)", **made.to_dict(), "recipe": COPY_RECIPE,
            "roles": list(ROLE_CYCLE), "template_group": TEMPLATE_GROUP, "sample": made.sample, "images": records,
            "pairs": [{"query": p.query, "reference": p.reference, "kind": p.kind, "copy": p.is_copy,
                       "score": p.score, "raw_score": p.raw, "views": p.views} for p in made.pairs]}


def self_calibrate(source, descriptor: Descriptor, matcher: tuple | None, config: DetectConfig,
                   folder: str | os.PathLike | None = None, sample: int = DEFAULT_SAMPLE,
                   precision: float = DEFAULT_PRECISION, seed: int = DEFAULT_SEED, whiten_from=None,
                   whitening_folder: str | os.PathLike | None = None, accelerator=None, progress: bool = True,
                   log: Callable[[str], None] = logger.info, settings: DedupSettings | None = None,
                   fallback: Fallback | None = None) -> SelfCalibration:
    """The threshold of a dedup run of ``source`` with these models, ``config`` and ``settings``, self-calibrated at
    ``precision`` by running :func:`~copynce_hf.retrieval.deduplication.collection.dedup` on the calibration
    collection (see the module).

    Args:
        source: the collection (``ids`` + ``load(i)``); nothing is written into it.
        descriptor, matcher, config, settings: the run's models and settings (``settings``' grouping is not used).
        folder: where ``self_calibration.json`` and the work of a run cut short are kept and reused from (``None``:
            nowhere).
        sample: images of the collection sampled (all of them when it has fewer).
        precision: the precision aimed at.
        seed: draws the sample, the copies and the templates.
        whiten_from, whitening_folder: the run's whitening sample and the folder its descriptors are cached in (the
            run's own, so that they are read once).
        accelerator, progress, log: as for :func:`~copynce_hf.retrieval.deduplication.collection.dedup`.
        fallback: the threshold used when the self-calibrated one keeps too few copies
            (:mod:`~copynce_hf.calibration.self_threshold`; ``None``: none).
    """
    from ..precision import make_accelerator

    _check(sample, precision)
    accelerator, settings = accelerator or make_accelerator(), settings or DedupSettings()
    identity = _identity(source, descriptor, matcher, config, settings, whiten_from, sample, seed)
    file = Path(folder) / FILE_NAME if folder is not None else None
    saved = _reused(file, identity)
    if saved is not None:
        log(f"self-calibration: reusing the verified pairs of {file}")
        pairs = [SyntheticPair(row["query"], row["reference"], row["kind"], row["score"], row["raw_score"],
                               row.get("views", "whole/whole")) for row in saved["pairs"]]
        made = self_threshold(pairs, saved["sample"], saved["counts"]["true_pairs"], precision, fallback,
                              saved["counts"]["linked_images"])
        made.reused, records = True, saved["images"]
    else:
        collection = synthetic_set(source, sample, seed)
        run = dataclasses.replace(settings, grouping="connected")
        work = {"identity": digest(identity), "folder": None if folder is None else Path(folder),
                "whitening": whitening_folder}
        pairs, true_pairs, linked = _verified(collection, descriptor, matcher, config, run, whiten_from, work,
                                              accelerator, progress, log)
        made = self_threshold(pairs, collection.sample, true_pairs, precision, fallback, linked)
        records = collection.records
    made.file = file
    if file is not None and accelerator.is_main_process:
        with StagedFile(file) as temporary:
            temporary.write_text(json.dumps(_saved(made, identity, records), indent=1) + "\n", encoding="utf-8")
    log(made.origin)
    if made.warning is not None:
        logger.warning(made.warning)
    return made


def _verified(collection: SyntheticSet, descriptor: Descriptor, matcher: tuple | None, config: DetectConfig,
              settings: DedupSettings, whiten_from, work: dict, accelerator, progress: bool,
              log: Callable[[str], None]) -> tuple[list[SyntheticPair], int, int]:
    """Run :func:`~copynce_hf.retrieval.deduplication.collection.dedup` on ``collection``'s images, scoring its pairs
    without grouping them: ``(its verified pairs, labelled and scored, the copy pairs among its readable images, the
    pairs of sampled images the collection pairs itself)``. ``work``: the self-calibration's identity digest, the
    folder its indexes, tokens and scored chunks are kept in for a resumed run (``None``: not kept) and the run's
    whitening folder."""
    ids = list(collection.images)
    images = ImageListSource(ids, [collection.images[i] for i in ids])
    images.identity = {"self_calibration": work["identity"]}  # its caches hold for this calibration collection only
    kept = work["folder"]
    log(f"self-calibration: {len(collection.sample)} sampled images, a calibration collection of {len(ids)} images "
        f"run through dedup ({'matcher' if matcher is not None else 'descriptor'} decision scores)")
    result = dedup(images, descriptor, matcher, None, config, progress=progress,
                   log=lambda line: log(f"self-calibration: {line}"), whiten_from=whiten_from,
                   accelerator=accelerator, settings=settings, whitening_folder=work["whitening"],
                   index_folder=kept and kept / "indexes", rescoring_folder=kept and kept / "rescoring",
                   tokens_folder=kept and kept / "tokens")
    views = result.pair_views
    pairs = [SyntheticPair(p.query_id, p.reference_id, pair_kind(collection.records, p.query_id, p.reference_id),
                           float(p.score), float(result.raw_scores[(p.query_id, p.reference_id)]),
                           views[(p.query_id, p.reference_id)])
             for p in result.pairs]
    linked = mark_paired(pairs, collection)
    per_image: dict[str, int] = {}
    for image in ids:
        if image not in result.skipped:
            per_image[collection.records[image]["of"]] = per_image.get(collection.records[image]["of"], 0) + 1
    if result.skipped:
        log(f"self-calibration: {len(result.skipped)} synthetic image(s) could not be read (too small)")
    return pairs, sum(math.comb(count, 2) for count in per_image.values()), linked
