"""Resumable descriptor extraction: the images of a source embedded a chunk at a time, each chunk written
atomically, so that a killed run resumes from its last complete chunk.

The work folder (``copynce index`` uses ``.<index folder name>.chunks/`` beside the index folder,
:func:`work_folder_of`, so that the index folder is only written once the index is complete; so do the index
caches of ``detect`` and ``dedup``, :func:`~copynce_hf.retrieval.search.cached_index.view_index`) holds:

- ``work.json``: what the chunks are computed from (the ``identity`` given by the caller: for ``copynce index``
  the one identity of descriptors kept on disk, :func:`~.work_folder.views_identity`, with the chunk and
  batch sizes). Chunks of another identity are removed before a run
  starts, with a warning naming the inputs that changed (:mod:`.work_folder`, shared with the resumable
  re-scoring of :mod:`.chunked_scoring`), so a chunk is only ever reused for the inputs it was computed from;
- ``chunk-000000.safetensors``, ``chunk-000001.safetensors``, ...: chunk ``i`` holds the descriptors of the
  images ``i * chunk_size`` to ``(i + 1) * chunk_size - 1`` of the source, in order, with the ids and
  reasons of the images that could not be read (a :class:`DescriptorSet` file). Each is written to a
  temporary file and renamed, so a file that exists is complete.

A run reuses the consecutive complete chunks from ``chunk-000000`` on and extracts the rest; the same
chunks in the same order give the same descriptors as an uninterrupted run (batches never cross a chunk
boundary). Memory holds one chunk's images and descriptors; :func:`~.index.write_index_from_files` then
builds the index from the chunk files one at a time. Under ``accelerate launch`` every process embeds
its share of each chunk and the main process writes the chunk.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...modeling.errors import ImageLoadError, PredictionsError
from ..presets import DEFAULT_INDEX_CHUNK_SIZE
from ..work_folder import WorkFolder
from .sets import read_descriptor_header
from .view_extraction import extract_view_descriptors, owner_of
from .views import ViewPreset

logger = logging.getLogger(__name__)


def work_folder_of(output: str | os.PathLike) -> Path:
    """The work folder of the index folder ``output``: the hidden folder ``.<name>.chunks`` beside it."""
    output = Path(output)
    return output.with_name(f".{output.name}.chunks")


class _Slice:
    """Images ``begin`` to ``end - 1`` of a random-access source, as a source of their own."""

    def __init__(self, source, begin: int, end: int):
        self.source, self.begin = source, begin
        self.ids = source.ids[begin:end]

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, index: int):
        return self.source.load(self.begin + int(index))


def source_chunks(source, size: int, start: int = 0) -> Iterator:
    """Chunks of ``size`` images of ``source`` from chunk ``start`` on: a streamed source's own
    (:meth:`~.sources.StreamedImageSource.chunks`), else slices of the random-access source."""
    if hasattr(source, "chunks"):
        yield from source.chunks(size, start)
        return
    for begin in range(start * size, len(source), size):
        yield _Slice(source, begin, min(begin + size, len(source)))


@dataclass
class ChunkedDescriptors:
    """The chunk files of a source, in order, and what they hold.

    Attributes:
        folder: the work folder.
        parts: the chunk files.
        images: images read from the source (with the skipped ones).
        count: descriptors (rows) in all chunks.
        skip_reasons: id -> plain-words reason of every image that could not be read.
        resumed: chunks found complete and reused.
    """

    folder: Path
    parts: list[Path] = field(default_factory=list)
    images: int = 0
    count: int = 0
    skip_reasons: dict[str, str] = field(default_factory=dict)
    resumed: int = 0

    def add(self, part: Path, ids: list[str], skip_reasons: dict[str, str], preset: ViewPreset,
            seen: set[str]) -> None:
        """Account for chunk file ``part`` (row ids ``ids``); a source id seen in an earlier chunk is an error."""
        owners = list(dict.fromkeys(owner_of(row, preset.name) for row in ids))
        for image_id in (*owners, *skip_reasons):
            if image_id in seen:
                raise ImageLoadError(f"the id {image_id!r} appears twice in the source (again in chunk {part.name})")
            seen.add(image_id)
        self.parts.append(part)
        self.images += len(owners) + len(skip_reasons)
        self.count += len(ids)
        self.skip_reasons.update(skip_reasons)

    def remove(self) -> None:
        """Delete the work folder (once the index built from it is in place)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _complete_chunks(work: WorkFolder) -> list[Path]:
    """The reusable chunk files of ``work``: for its identity, the readable chunks from ``chunk-000000`` on,
    up to the first one missing or damaged; for another identity (or none), no chunk (the folder is emptied)."""
    if not work.open():
        return []
    complete = []
    while (path := work.chunk_path(len(complete))).is_file():
        try:
            read_descriptor_header(path)
        except PredictionsError as error:
            logger.warning("%s cannot be read (%s); computing it and the chunks after it again", path, error)
            break
        complete.append(path)
    return complete


def extract_in_chunks(
    model,
    image_processor,
    source,
    folder: str | os.PathLike,
    identity: dict,
    preset: ViewPreset | None = None,
    chunk_size: int = DEFAULT_INDEX_CHUNK_SIZE,
    accelerator=None,
    progress: bool = True,
    description: str = "reference descriptors",
    **extract,
) -> ChunkedDescriptors | None:
    """Embed every image of ``source`` (its ``preset`` reference views) into chunk files in ``folder``, reusing
    the complete chunks a run with the same ``identity`` left there.

    Args:
        model, image_processor: the descriptor model and its processor.
        source: a random-access source (``ids``, ``load(i)``) or a streamed one (``chunks(size, start)``).
        folder: the work folder.
        identity: JSON-able description of the inputs (model, source, settings); chunks of another are removed.
        preset: the views of each image (``None``: the whole image).
        chunk_size: images per chunk.
        accelerator: an ``accelerate.Accelerator`` (``None``: one is created).
        extract: ``batch_size``, ``num_workers`` of :func:`~.extract.extract_descriptors`.

    Returns:
        The chunk files on the main process, ``None`` on the others.
    """
    from accelerate.utils import broadcast_object_list

    from ...precision import make_accelerator

    accelerator = accelerator or make_accelerator()
    preset = preset or ViewPreset("none")
    folder = Path(folder)
    result, seen = ChunkedDescriptors(folder), set()
    work = WorkFolder(folder, identity, "work.json", ".safetensors")
    complete = _complete_chunks(work) if accelerator.is_main_process else []
    for path in complete:
        metadata, _ = read_descriptor_header(path)
        result.add(path, metadata["ids"], metadata["skip_reasons"] or dict.fromkeys(metadata["skipped"], "unreadable"),
                   preset, seen)
    result.resumed = broadcast_object_list([len(complete)])[0]
    total = f"/{-(-len(source) // chunk_size)}" if hasattr(source, "__len__") else ""
    for number, chunk in enumerate(source_chunks(source, chunk_size, result.resumed), result.resumed):
        views = extract_view_descriptors(model, image_processor, chunk, preset, "reference", accelerator=accelerator,
                                         progress=progress, description=f"{description}, chunk {number + 1}{total}",
                                         **extract)
        if accelerator.is_main_process:
            path = work.write_chunk(number, views.save)
            result.add(path, views.ids, views.skip_reasons or dict.fromkeys(views.skipped, "unreadable"), preset, seen)
    accelerator.wait_for_everyone()
    return result if accelerator.is_main_process else None

