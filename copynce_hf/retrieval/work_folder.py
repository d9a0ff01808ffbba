"""The work folder of a resumable job: its completed chunks, tied to the inputs they were computed from.

Two jobs keep one: matcher re-scoring (:mod:`.chunked_scoring`: ``identity.json`` and ``chunk-NNNNNN.json``)
and descriptor extraction (:mod:`.chunked_extraction`, ``copynce index``: ``work.json`` and
``chunk-NNNNNN.safetensors``). A :class:`WorkFolder` owns what they share:

- the identity file: input name -> digest (or any JSON-able value) of what the chunks depend on;
- :meth:`WorkFolder.open`: before a run, the temporary files a killed run left (``.<name>.partial-<pid>...``,
  :class:`~copynce_hf.outputs.StagedFile`) are removed; chunks of another identity are deleted, with a warning
  that names the inputs that changed, and the new identity is written;
- chunk ``i``'s file name and its atomic writing (a file that exists is complete).

Each job keeps its own chunk format and decides which of the chunks present it can reuse.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..outputs import StagedFile

logger = logging.getLogger(__name__)


def changed_inputs(stored, identity: dict) -> list[str]:
    """The input names whose values differ between the ``stored`` identity (read from a folder; anything that is
    not a dict counts as empty) and ``identity``, sorted."""
    stored = stored if isinstance(stored, dict) else {}
    return sorted(key for key in {*stored, *identity} if stored.get(key) != identity.get(key))


class WorkFolder:
    """The chunk files of one job in ``folder``, tied to ``identity`` (only the main process uses it).

    Args:
        folder: where the chunks live (created by :meth:`open`).
        identity: input name -> JSON-able value (a digest, a setting) of what the chunks are computed from;
            compared as JSON, so a tuple equals the list read back.
        identity_file: the file holding it (``identity.json``, ``work.json``).
        chunk_suffix: the chunk files' extension (``.json``, ``.safetensors``).
    """

    def __init__(self, folder: str | os.PathLike, identity: dict, identity_file: str, chunk_suffix: str):
        self.folder = Path(folder)
        self.identity = json.loads(json.dumps(identity, default=str))
        self.identity_path = self.folder / identity_file
        self.chunk_suffix = chunk_suffix

    def chunk_path(self, index: int) -> Path:
        """The file of chunk ``index`` (from 0): ``chunk-000000<suffix>``, ..."""
        return self.folder / f"chunk-{index:06d}{self.chunk_suffix}"

    def chunk_files(self) -> list[Path]:
        """The chunk files present, in index order."""
        return sorted(self.folder.glob(f"chunk-*{self.chunk_suffix}"))

    def open(self) -> bool:
        """Make the folder ready for this identity; ``True`` when the chunks in it were computed from it.

        The temporary files of a killed run are removed in any case. When the stored identity differs (or is
        missing), the chunks are deleted with a warning naming the changed inputs, and the identity is written;
        the identity file is removed first, so that a run killed meanwhile leaves a folder no identity reuses.
        """
        for temporary in self.folder.glob(".*.partial-*"):
            temporary.unlink(missing_ok=True)
        stored = None
        with contextlib.suppress(OSError, ValueError):
            stored = json.loads(self.identity_path.read_text(encoding="utf-8"))
        if stored == self.identity:
            return True
        stale = self.chunk_files()
        if stale:
            changed = ", ".join(changed_inputs(stored, self.identity)) if isinstance(stored, dict) else (
                f"unknown, {self.identity_path.name} is missing or unreadable")
            logger.warning("the %d chunk(s) in %s were computed from other inputs (changed: %s); starting fresh",
                           len(stale), self.folder, changed)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.identity_path.unlink(missing_ok=True)
        for path in stale:
            path.unlink(missing_ok=True)
        with StagedFile(self.identity_path) as temporary:
            temporary.write_text(json.dumps(self.identity, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return False

    def write_chunk(self, index: int, write: Callable[[Path], object]) -> Path:
        """Chunk ``index`` written by ``write(temporary_path)`` and renamed into place; its path."""
        path = self.chunk_path(index)
        with StagedFile(path) as temporary:
            write(temporary)
        return path
