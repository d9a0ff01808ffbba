"""A collection's matcher encoder tokens, each image encoded once and kept on disk: what ``dedup``'s content
tokens (:mod:`copynce_hf.retrieval.content.masks`) and its matcher scoring (:class:`~copynce_hf.retrieval.verify.scorer.MatcherScorer`) both read.

The matcher (paper, "Matcher") runs its first blocks on each image alone, so a pair's fusion needs each image's
encoder tokens once. An in-memory cache re-encodes an image whenever it was dropped before its next pair, and in a
collection the candidate pairs have no locality: at 100,000 images a 4,096-image cache ran 13.7 encoder passes per
image. :meth:`TokenStore.build` encodes every image once into a folder instead, and each read takes one image's
tokens from its chunk file by offset, so memory holds one chunk of tokens while encoding, and the tokens in use
while reading, however large the collection.

The folder holds ``identity.json`` (the model's weights, its image processor, the images and their files, the
size limit, the mixed precision, the chunk size: :mod:`.work_folder`) and ``chunk-NNNNNN.safetensors``: chunk ``i``
holds the tokens ``(1 + L, C)`` of images ``i * chunk_size`` to ``(i + 1) * chunk_size - 1`` (one tensor each, in
the dtype the encoder gave them, so that scores from the store equal scores from a fresh encoder pass) and, in its
metadata, their ids and the ids that could not be read. Each chunk is written to a temporary file and renamed, so a
run killed (even by SIGKILL) resumes from the chunks present. Under ``accelerate launch`` the processes take
chunks in turn and write them themselves, so they must share the folder's file system (one machine, or a shared
disk); every process then reads every chunk.

Disk: ``(1 + L) x C`` values per image (the embedded matcher: 197 x 192 float32, 151 kB; 15 GB at 100,000 images).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ...images import load_image
from ..descriptors.extract import ProcessedImages
from ..work_folder import WorkFolder, digest, image_stamps, lines_digest, model_fingerprint

logger = logging.getLogger(__name__)

#: Images per chunk file (about 150 MB of the embedded matcher's float32 tokens).
DEFAULT_TOKEN_CHUNK = 1024

_IDENTITY_FILE = "identity.json"


def token_identity(model, image_processor, ids: Sequence[str], files: Mapping, source=None,
                   accelerator=None) -> dict:
    """What stored tokens depend on, as digests: the model's weights, its image processor, the images (ids in order,
    and the stamps of those that are files in ``files``, :func:`~.work_folder.image_stamps`), the ``source``'s own
    identity and size limit (a dataset counts by its fingerprint) and the mixed precision the encoder runs in."""
    processor = image_processor.to_dict() if hasattr(image_processor, "to_dict") else repr(image_processor)
    return {"model": model_fingerprint(model), "image_processor": digest(processor),
            "ids": lines_digest(json.dumps(image_id) for image_id in ids), "files": image_stamps(files, ids),
            "source": getattr(source, "identity", None), "max_pixels": getattr(source, "max_pixels", None),
            "mixed_precision": getattr(accelerator, "mixed_precision", "no")}


@contextlib.contextmanager
def token_folder(folder: str | os.PathLike | None, accelerator=None) -> Iterator[Path]:
    """``folder``, or (``None``) a temporary folder that every process of ``accelerator`` shares, removed at the
    end."""
    if folder is not None:
        yield Path(folder)
        return
    is_main = accelerator is None or accelerator.is_main_process
    made = [tempfile.mkdtemp(prefix="copynce-tokens-") if is_main else None]
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        made = broadcast_object_list(made)
    try:
        yield Path(made[0])
    finally:
        if accelerator is not None and accelerator.num_processes > 1:
            accelerator.wait_for_everyone()
        if is_main:
            shutil.rmtree(made[0], ignore_errors=True)


def source_token_store(matcher: tuple, images, ids: Sequence[str], folder: Path, *, batch_size: int = 64,
                       num_workers: int = 0, accelerator=None, progress: bool = True,
                       log: Callable[[str], None] = logger.info) -> TokenStore:
    """The matcher's encoder tokens of the images ``ids`` of one image source, each encoded once into ``folder``
    (resumed from it for the same model, images and settings: :func:`token_identity`).

    Args:
        matcher: ``(model, image_processor)``.
        images: id -> image of the source (:class:`~copynce_hf.retrieval.sources.SourceImages`: its files and its own
            identity count).
        ids: the images stored, in order.
        folder, batch_size, num_workers, accelerator, progress, log: as :meth:`TokenStore.build` takes them.
    """
    model, processor = matcher
    if accelerator is not None:
        model = model.to(accelerator.device)
    identity = token_identity(model, processor, ids, getattr(images, "files", None) or {},
                              getattr(images, "source", None), accelerator)
    return TokenStore.build(ids, images, model.pre_fusion_tokens, processor, folder, identity, batch_size=batch_size,
                            num_workers=num_workers, accelerator=accelerator, progress=progress, log=log)


class TokenStore:
    """Read access to stored encoder tokens by image id (:meth:`build` makes one).

    Attributes:
        folder: the chunk files' folder.
        encoded: encoder passes :meth:`build` ran, all processes together (0 when every chunk was resumed).
    """

    def __init__(self, folder: str | os.PathLike, chunk_files: Sequence[Path], encoded: int = 0):
        self.folder, self.encoded = Path(folder), encoded
        self._files = [_ChunkFile(path) for path in chunk_files]
        self._where: dict[str, tuple[int, str] | None] = {}
        for part, chunk in enumerate(self._files):
            metadata = chunk.metadata
            self._where.update((image_id, (part, str(row))) for row, image_id in enumerate(json.loads(metadata["ids"])))
            self._where.update((image_id, None) for image_id in json.loads(metadata["unreadable"]))

    def __contains__(self, image_id) -> bool:
        return image_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def tokens(self, image_id: str) -> torch.Tensor | None:
        """(1 + L, C) encoder tokens of ``image_id`` (CLS first); ``None`` when it could not be read."""
        if image_id not in self._where:
            raise KeyError(f"image {image_id!r} is not in the token store {self.folder}")
        where = self._where[image_id]
        return None if where is None else self._files[where[0]].tensor(where[1])

    def get(self, image_ids: Sequence[str]) -> dict[str, torch.Tensor | None]:
        """id -> :meth:`tokens` of every id asked for."""
        return {image_id: self.tokens(image_id) for image_id in dict.fromkeys(image_ids)}

    # ------------------------------------------------------------------ building

    @classmethod
    def build(cls, ids: Sequence[str], images: Mapping, encode: Callable[[torch.Tensor], torch.Tensor],
              image_processor, folder: str | os.PathLike, identity: dict, *, batch_size: int = 64,
              num_workers: int = 0, chunk_size: int = DEFAULT_TOKEN_CHUNK, accelerator=None, progress: bool = True,
              log: Callable[[str], None] = logger.info) -> TokenStore:
        """Encode every image of ``ids`` (unique) that no chunk in ``folder`` holds yet, and open the store.

        Args:
            ids: the images, in the order they are chunked.
            images: id -> image (a path or a PIL image), with ``max_pixels`` (the size limit) where it has one.
            encode: ``pixel_values (B, 3, H, W) -> tokens (B, 1 + L, C)``: a matcher's ``pre_fusion_tokens``.
            image_processor: the model's image processor.
            folder: where the chunks are kept and resumed from.
            identity: what the tokens depend on (:func:`token_identity`); the chunk size is added here.
            batch_size, num_workers: images per encoder pass; ``DataLoader`` workers reading them.
            chunk_size: images per chunk file.
            accelerator: the processes that share the chunks (each writes its own), and the autocast the encoder
                runs in; ``None``: this process encodes every chunk.
            progress: a bar over the images (main process).
            log: receives a line saying what was resumed and what was encoded (main process).
        """
        if len(set(ids)) != len(ids):
            raise ValueError("the token store's image ids must be unique")
        processes = accelerator.num_processes if accelerator is not None else 1
        rank = accelerator.process_index if accelerator is not None else 0
        work = _opened(WorkFolder(folder, {**identity, "chunk_size": chunk_size}, _IDENTITY_FILE, ".safetensors"),
                       accelerator)
        chunks = [list(ids[start:start + chunk_size]) for start in range(0, len(ids), chunk_size)]
        todo = [index for index in range(len(chunks)) if not _complete(work.chunk_path(index), work.identity)]
        if processes > 1:  # every process's list read before any writes: the same list, shared out without gaps
            accelerator.wait_for_everyone()
        if rank == 0 and len(todo) < len(chunks):
            log(f"token store: resuming {len(chunks) - len(todo)} of {len(chunks)} chunks in {work.folder}")
        encoded = 0
        with tqdm(total=sum(len(chunks[index]) for index in todo), desc="matcher tokens", unit="img",
                  disable=not progress or rank != 0) as bar:
            for index in todo[rank::processes]:
                encoded += _write_chunk(work, index, chunks[index], images, encode, image_processor, batch_size,
                                        num_workers, accelerator, lambda count: bar.update(count * processes))
        if processes > 1:
            from accelerate.utils import gather_object

            encoded = sum(gather_object([encoded]))  # also waits for every process's chunks
        store = cls(work.folder, [work.chunk_path(index) for index in range(len(chunks))], encoded)
        if rank == 0:
            log(f"token store: {len(ids)} images in {work.folder} ({_size_text(work.folder)} on disk), "
                f"{encoded} encoder passes run now")
        return store


#: safetensors' dtype names of the dtypes an encoder gives.
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


class _ChunkFile:
    """A chunk's safetensors file, its tensors read by offset (``os.pread``) rather than memory-mapped, so that a
    15 GB store read at random does not count as this process's resident memory (the kernel's page cache still
    keeps what is read often). The layout is the safetensors format's: an 8-byte little-endian header size, the
    JSON header (each tensor's dtype, shape and byte offsets; ``__metadata__``), then the data."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        size, length = int.from_bytes(os.pread(self._fd, 8, 0), "little"), os.fstat(self._fd).st_size
        if 8 + size > length:
            raise ValueError(f"{path} is not a safetensors file (its header would end past the file)")
        self.header = json.loads(os.pread(self._fd, size, 8))
        self.metadata = self.header.pop("__metadata__", {})
        self._data = 8 + size
        end = max((entry["data_offsets"][1] for entry in self.header.values()), default=0)
        if length != self._data + end:
            raise ValueError(f"{path} is truncated")

    def tensor(self, name: str) -> torch.Tensor:
        entry = self.header[name]
        start, end = entry["data_offsets"]
        data = bytearray(os.pread(self._fd, end - start, self._data + start))
        return torch.frombuffer(data, dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def _opened(work: WorkFolder, accelerator) -> WorkFolder:
    """``work`` made ready for its identity by the main process (:meth:`~.work_folder.WorkFolder.open`: chunks of
    other inputs deleted), the other processes waiting for it."""
    if accelerator is None or accelerator.is_main_process:
        work.open()
    if accelerator is not None and accelerator.num_processes > 1:
        accelerator.wait_for_everyone()
    return work


def _complete(path: Path, identity: dict) -> bool:
    """Whether ``path`` is a readable chunk written for ``identity``."""
    if not path.is_file():
        return False
    try:
        return json.loads(_ChunkFile(path).metadata["identity"]) == identity
    except (OSError, ValueError, KeyError, TypeError):
        logger.warning("ignoring %s: not a chunk of this token store; its images are encoded again", path)
        return False


class _ChunkImages:
    """The images ``ids`` of ``images`` as an image source (``ids``, ``load(i)``) for
    :class:`~copynce_hf.retrieval.descriptors.extract.ProcessedImages`: each read when its turn comes, with the size limit of ``images``."""

    def __init__(self, ids: list[str], images: Mapping):
        self.ids, self.images, self.max_pixels = ids, images, getattr(images, "max_pixels", None)

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, index: int):
        return load_image(self.images[self.ids[index]], max_pixels=self.max_pixels)


def _write_chunk(work: WorkFolder, index: int, ids: list[str], images: Mapping, encode, image_processor,
                 batch_size: int, num_workers: int, accelerator, done: Callable[[int], None]) -> int:
    """Encode the images ``ids`` (``batch_size`` at a time, read by ``num_workers`` workers) and write them as chunk
    ``index``; the encoder passes run."""
    loader = DataLoader(ProcessedImages(_ChunkImages(ids, images), image_processor), batch_size=batch_size,
                        num_workers=num_workers)
    device = accelerator.device if accelerator is not None else None
    tensors: dict[str, torch.Tensor] = {}
    readable: list[str] = []
    for batch in loader:
        valid = batch["valid"] > 0
        pixels = batch["pixel_values"][valid]
        if len(pixels):
            with torch.inference_mode(), (accelerator.autocast() if accelerator is not None
                                          else contextlib.nullcontext()):
                tokens = encode(pixels.to(device) if device is not None else pixels).cpu()
            for row, image_index in zip(tokens, batch["index"][valid].tolist()):
                tensors[str(len(readable))] = row.clone()
                readable.append(ids[image_index])
        done(len(valid))
    encoded = set(readable)
    unreadable = [image_id for image_id in ids if image_id not in encoded]
    metadata = {"identity": json.dumps(work.identity), "ids": json.dumps(readable),
                "unreadable": json.dumps(unreadable)}
    work.write_chunk(index, lambda temporary: save_file(tensors, str(temporary), metadata=metadata))
    return len(readable)


def _size_text(folder: Path) -> str:
    size = sum(path.stat().st_size for path in folder.glob("chunk-*.safetensors"))
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
