"""The index of an image source's views, kept in a cache folder and reused, built in resumable chunks."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...modeling.errors import PredictionsError
from ..descriptors.cached import Descriptor
from ..descriptors.chunked_extraction import extract_in_chunks, work_folder_of
from ..descriptors.sets import DescriptorSet
from ..descriptors.view_extraction import extract_view_descriptors
from ..descriptors.views import ViewPreset
from ..descriptors.whitening import Whitening
from ..presets import DEFAULT_INDEX_CHUNK_SIZE
from ..work_folder import reuse_saved, rewriting, views_identity
from .index import DescriptorIndex, IndexConfig

logger = logging.getLogger(__name__)


def view_index(descriptor: Descriptor, source, preset: ViewPreset, folder: str | os.PathLike | None = None,
               config: IndexConfig | None = None, progress: bool = True, description: str = "reference views",
               whitening: Whitening | None = None, chunk_size: int = DEFAULT_INDEX_CHUNK_SIZE,
               log: Callable[[str], None] = logger.info, **extract) -> DescriptorIndex:
    """An exact index over the views of ``source``'s images (whitened with ``whitening`` when given); written to
    ``folder`` and reused from it when it was built from the same images, model, views and whitening
    (``identity.json`` beside the index files: :func:`~copynce_hf.retrieval.work_folder.views_identity`, the identity
    ``copynce index`` keeps with its chunks, and the whitening's fingerprint).

    With a ``folder`` the views are embedded ``chunk_size`` images at a time into the work folder
    ``.<folder name>.chunks`` beside it (:mod:`copynce_hf.retrieval.descriptors.chunked_extraction`, as ``copynce index`` does): a run killed
    meanwhile resumes from its last complete chunk (``log`` says so), and under ``accelerate launch`` the processes
    share each chunk and the main process writes. The work folder is removed once the index is in place."""
    identity = views_identity(descriptor.model, descriptor.processor, source, preset.name, "reference")
    if whitening is not None:
        identity["whitening"] = whitening.fingerprint()
    reused = reuse_saved(folder, identity, lambda: DescriptorIndex.load(folder), "the index")
    if reused is not None:
        return reused
    info = {"model": descriptor.source or descriptor.name, "views": preset.name}
    config = config or IndexConfig(kind="flat")
    if folder is not None:
        return _chunked_view_index(descriptor, source, preset, Path(folder), identity, (config, info, whitening),
                                   chunk_size, progress, description, log, extract)
    views = extract_view_descriptors(descriptor.model, descriptor.processor, source, preset, "reference",
                                     progress=progress, description=description, **extract)
    if len(views) == 0:
        raise PredictionsError(f"none of the {len(source)} images could be read ({description})")
    return DescriptorIndex.build(views, config, info=info, whitening=whitening)


def _chunked_view_index(descriptor: Descriptor, source, preset: ViewPreset, folder: Path, identity: dict,
                        index: tuple, chunk_size: int, progress: bool, description: str, log: Callable[[str], None],
                        extract: dict) -> DescriptorIndex:
    """:func:`view_index` into ``folder``: the views embedded in resumable chunks, the index built and saved by the
    main process from them, then read back by the others. ``index`` is ``(IndexConfig, info, whitening)``."""
    from accelerate.utils import broadcast_object_list

    work = {**identity, "chunk_size": chunk_size, "batch_size": extract.get("batch_size", 64)}
    chunks = extract_in_chunks(descriptor.model, descriptor.processor, source, work_folder_of(folder), work, preset,
                               chunk_size, progress=progress, description=description, **extract)
    failure = None
    if chunks is not None:  # the main process
        if chunks.resumed:
            log(f"{description}: resumed after {chunks.resumed} complete chunk(s) in {chunks.folder}")
        views = _joined([DescriptorSet.load(part) for part in chunks.parts])
        if len(views) == 0:
            failure = f"none of the {len(source)} images could be read ({description})"
        else:
            config, info, whitening = index
            with rewriting(folder, identity):
                DescriptorIndex.build(views, config, info=info, whitening=whitening).save(folder)
        chunks.remove()
    failure = broadcast_object_list([failure])[0]  # the others wait here until the index is written
    if failure is not None:
        raise PredictionsError(failure)
    return DescriptorIndex.load(folder)


def _joined(parts: list[DescriptorSet]) -> DescriptorSet:
    """The rows of several descriptor sets (each (N_i, D)), in order, as one (sum N_i, D), with their skipped ids."""
    kept = [part.descriptors for part in parts if len(part)]
    return DescriptorSet([image_id for part in parts for image_id in part.ids],
                         np.concatenate(kept) if kept else np.zeros((0, 0), np.float32),
                         skipped=[image_id for part in parts for image_id in part.skipped],
                         skip_reasons={key: value for part in parts for key, value in part.skip_reasons.items()})
