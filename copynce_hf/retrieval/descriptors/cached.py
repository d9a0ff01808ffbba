"""Descriptors kept in cache folders and reused: the query views of a run, a whitening sample.

A cache folder holds its files and ``identity.json``, what they were computed from (the images' ids, file sizes
and times, the model's weights and the views: :func:`~copynce_hf.retrieval.work_folder.views_identity`); a run
reuses the files when the identity is the same and computes them again otherwise
(:func:`~copynce_hf.retrieval.work_folder.reuse_saved`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from ..work_folder import is_main_process, reuse_saved, rewriting, views_identity
from .sets import DescriptorSet
from .view_extraction import extract_view_descriptors
from .views import ViewPreset
from .whitening import Whitening


@dataclasses.dataclass
class Descriptor:
    """A descriptor model taking part in the search: ``name`` (for logs and index folders), model, processor,
    and where it came from (``source``: how reports name it, recorded with a saved index; caches are tied to the
    model's weights, not to this name)."""

    name: str
    model: object
    processor: object
    source: str = ""


def note_skips(descriptors: DescriptorSet, reasons: dict[str, str]) -> None:
    """Add the images ``descriptors`` left out to ``reasons`` (id -> reason), keeping reasons already known."""
    for image_id in descriptors.skipped:
        reasons.setdefault(image_id, descriptors.skip_reasons.get(image_id, "unreadable"))


def query_view_descriptors(descriptor: Descriptor, source, preset: ViewPreset, folder: str | os.PathLike | None = None,
                           progress: bool = True, description: str = "query views",
                           **extract) -> tuple[DescriptorSet, float, bool]:
    """Descriptors of every view of the query images; kept in ``folder`` and reused from it for the same
    images (ids, file sizes and times), model and views (:func:`~copynce_hf.retrieval.work_folder.views_identity`).

    Returns:
        ``(descriptors, seconds, reused)``: ``seconds`` is the extraction time, measured now or, when the
        descriptors are reused, as measured when they were computed (so that costs stay comparable).
    """
    identity = views_identity(descriptor.model, descriptor.processor, source, preset.name, "query")
    reused = reuse_saved(folder, identity, lambda: DescriptorSet.load(Path(folder) / "descriptors.safetensors"),
                    "query descriptors")
    if reused is not None:
        try:
            seconds = float(json.loads((Path(folder) / "timing.json").read_text(encoding="utf-8"))["seconds"])
        except (OSError, ValueError, KeyError):
            seconds = float("nan")
        return reused, seconds, True
    start = time.perf_counter()
    views = extract_view_descriptors(descriptor.model, descriptor.processor, source, preset, "query",
                                     progress=progress, description=description, **extract)
    seconds = time.perf_counter() - start
    if folder is not None and len(views) and is_main_process():
        with rewriting(folder, identity):
            views.save(Path(folder) / "descriptors.safetensors")
            (Path(folder) / "timing.json").write_text(json.dumps({"seconds": seconds}) + "\n", encoding="utf-8")
    return views, seconds, False


def learn_whitening(descriptor: Descriptor, source, preset: ViewPreset, dim: int | None = None,
                    folder: str | os.PathLike | None = None, progress: bool = True,
                    description: str = "whitening sample", **extract) -> Whitening:
    """The :class:`~.whitening.Whitening` (``dim`` directions) learned from the descriptors of ``source``'s images
    (their reference views, as indexed); the sample's descriptors are written to ``folder`` and reused from it
    for the same images, model and views (whatever ``dim``)."""
    identity = views_identity(descriptor.model, descriptor.processor, source, preset.name, "whitening sample")
    sample = reuse_saved(folder, identity, lambda: DescriptorSet.load(Path(folder) / "descriptors.safetensors"),
                    "the whitening sample's descriptors")
    if sample is None:
        sample = extract_view_descriptors(descriptor.model, descriptor.processor, source, preset, "reference",
                                          progress=progress, description=description, **extract)
        if folder is not None and len(sample):
            with rewriting(folder, identity):
                sample.save(Path(folder) / "descriptors.safetensors")
    return Whitening.fit(sample.descriptors, dim)
