"""Scoring candidate pairs in chunks: spread over Accelerate's processes, kept on disk, resumed after a kill.

Re-scoring the paper's 50,000 queries x 400 candidates (supplementary "More about Candidates List for
Matcher") is 20 million matcher pairs: hours on GPUs. :func:`score_in_chunks` cuts the pairs into
chunks of whole queries (about ``chunk_size`` pairs each, so that a query's encoded views and its
candidates' cached tokens serve the whole query: :mod:`copynce_hf.retrieval.verify.scorer`), and runs them in rounds:

* under ``accelerate launch`` every process scores one chunk per round, the chunks' scores are
  gathered to every process (``gather_object``), and the main process writes them;
* with a ``folder``, each gathered chunk is written as ``chunk-NNNNNN.json`` (a temporary file renamed
  into place, so that a file is always complete); the same call after a kill (even SIGKILL) scores
  only the chunks without a file, and the result equals an uninterrupted run's.

The folder is tied to its inputs: ``identity.json`` holds a digest of each (the pairs, the model's
weights, the settings, the images' file sizes and times, the chunk size). When one differs, the old
chunks are deleted and the work starts fresh, with a warning that names the inputs that changed
(:mod:`.work_folder`, shared with the resumable indexing of :mod:`.chunked_extraction`).
Only the main process reads or writes the folder (the chunks it resumes are broadcast to the others),
so the processes need not share a file system for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from tqdm.auto import tqdm

from ...modeling.errors import ConfigError
from ..presets import DEFAULT_CHUNK_SIZE
from ..work_folder import WorkFolder, digest, image_stamps, lines_digest, model_fingerprint

logger = logging.getLogger(__name__)

_IDENTITY_FILE = "identity.json"


@dataclasses.dataclass
class PairScores:
    """Scores of a list of pairs: ``scores[i]`` is pair ``i``'s score, ``None`` where it could not be scored;
    ``reasons[i]`` says why (plain words, :data:`~copynce_hf.modeling.errors.SKIP_REASONS`), where known."""

    scores: list[float | None]
    reasons: dict[int, str] = dataclasses.field(default_factory=dict)


#: Scores one chunk: ``score_chunk(pairs, scored)`` gets (query id, reference id) pairs of whole queries and
#: calls ``scored(n)`` as it finishes ``n`` more pairs (for the progress bar).
ChunkScorer = Callable[[list[tuple[str, str]], Callable[[int], None]], PairScores]


def plan_chunks(pairs: Sequence[tuple[str, str]], chunk_size: int) -> list[list[int]]:
    """Row numbers of ``pairs`` in chunks of whole queries, in the order queries first appear.

    A chunk takes queries while it holds at most ``chunk_size`` pairs; a query with more pairs than that is
    a chunk of its own.
    """
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be at least 1, got {chunk_size}")
    by_query: dict[str, list[int]] = {}
    for row, (query_id, _reference_id) in enumerate(pairs):
        by_query.setdefault(query_id, []).append(row)
    chunks: list[list[int]] = []
    current: list[int] = []
    for rows in by_query.values():
        if current and len(current) + len(rows) > chunk_size:
            chunks.append(current)
            current = []
        current.extend(rows)
    if current:
        chunks.append(current)
    return chunks


# --------------------------------------------------------------------------- identity of the inputs


def scoring_identity(model, image_processor, settings: dict, query_images: Mapping, reference_images: Mapping,
                     pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """What the scores of ``pairs`` depend on, as digests: the model's weights, the scoring settings with the
    image processor's, and the query and reference images the pairs name (the digests of :mod:`.work_folder`)."""
    processor = image_processor.to_dict() if hasattr(image_processor, "to_dict") else repr(image_processor)
    return {"model": model_fingerprint(model), "settings": digest({**settings, "image_processor": processor}),
            "queries": image_stamps(query_images, [query for query, _ in pairs]),
            "references": image_stamps(reference_images, [reference for _, reference in pairs])}


# --------------------------------------------------------------------------- the work folder


class ChunkFolder:
    """The scored chunks of one job, written and read by the main process (in a :class:`~.work_folder.WorkFolder`:
    ``identity.json`` and ``chunk-NNNNNN.json``, each chunk's record naming the identity it belongs to).

    Args:
        folder: where the chunks live (created when needed).
        identity: input name -> digest (or any JSON-able value) of what the chunks were computed from.
        chunk_sizes: number of pairs of every chunk of the plan (a chunk file of another size is ignored).
    """

    def __init__(self, folder: str | os.PathLike, identity: dict, chunk_sizes: list[int]):
        self.work = WorkFolder(folder, identity, _IDENTITY_FILE, ".json")
        self.folder = self.work.folder
        self.key = digest(identity)
        self.chunk_sizes = chunk_sizes

    def open(self, log: Callable[[str], None]) -> dict[int, PairScores]:
        """The chunks already scored for this identity; for another identity, the old chunks are deleted
        (:meth:`~.work_folder.WorkFolder.open` warns which inputs changed) and the work starts fresh."""
        if not self.work.open():
            return {}
        done = self._read_chunks()
        if done:
            log(f"resuming: {len(done)} of {len(self.chunk_sizes)} chunks "
                f"({sum(len(c.scores) for c in done.values())} pairs) already scored in {self.folder}")
        return done

    def _read_chunks(self) -> dict[int, PairScores]:
        done = {}
        for path in self.work.chunk_files():
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
                index = int(stored["chunk"])
                chunk = PairScores(stored["scores"], {int(k): v for k, v in stored["reasons"].items()})
                usable = (stored["identity"] == self.key and 0 <= index < len(self.chunk_sizes)
                          and len(chunk.scores) == self.chunk_sizes[index])
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                usable = False
            if usable:
                done[index] = chunk
            else:
                logger.warning("ignoring %s: not a chunk of this job; its pairs are scored again", path)
        return done

    def save(self, index: int, chunk: PairScores) -> None:
        record = {"identity": self.key, "chunk": index, "scores": chunk.scores,
                  "reasons": {str(k): v for k, v in chunk.reasons.items()}}
        self.work.write_chunk(index, lambda temporary: temporary.write_text(json.dumps(record) + "\n",
                                                                            encoding="utf-8"))


# --------------------------------------------------------------------------- the rounds


class _Progress:
    """The main process's bar over all pairs: its own pairs (times the number of processes, as every process
    works alike) as they are scored, the exact gathered count at the end of each round."""

    def __init__(self, total: int, done: int, processes: int, enabled: bool, description: str):
        self.processes, self.exact = processes, done
        self.bar = tqdm(total=total, initial=done, desc=description, unit="pair", disable=not enabled,
                        dynamic_ncols=True)

    def scored(self, count: int) -> None:
        step = min(count * self.processes, self.bar.total - self.bar.n)
        if step > 0:
            self.bar.update(step)

    def round_done(self, count: int) -> None:
        self.exact += count
        self.bar.n = self.exact
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def score_in_chunks(
    pairs: Sequence[tuple[str, str]],
    score_chunk: ChunkScorer,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    folder: str | os.PathLike | None = None,
    identity: dict | None = None,
    accelerator=None,
    progress: bool = True,
    description: str = "re-scoring",
    log: Callable[[str], None] = logger.info,
) -> PairScores:
    """Score every pair with ``score_chunk``, chunk by chunk (see the module's docstring).

    Args:
        pairs: (query id, reference id) pairs.
        score_chunk: scores the pairs of one chunk (:data:`ChunkScorer`).
        chunk_size: pairs per chunk (whole queries; a larger query is a chunk of its own).
        folder: where completed chunks are kept and resumed from; ``None``: nowhere.
        identity: input name -> digest of what the scores depend on (:func:`scoring_identity`, or the digests of
            :mod:`.work_folder`); the pairs and the chunk size are added here. Needed with ``folder``.
        accelerator: an ``accelerate.Accelerator`` whose processes share the chunks (every process calls this
            function with the same pairs) and whose autocast the scoring runs in; ``None``: this process scores
            every chunk itself.
        progress: a bar (on the main process) with pairs/s and the time left.
        description: the bar's label.
        log: receives the line saying how much work is resumed (main process).

    Returns :class:`PairScores` of all pairs, in the order of ``pairs``, on every process.
    """
    chunks = plan_chunks(pairs, chunk_size)
    processes = accelerator.num_processes if accelerator is not None else 1
    rank = accelerator.process_index if accelerator is not None else 0
    store = None
    if folder is not None:
        if identity is None:
            raise ConfigError("score_in_chunks: a folder needs the identity of the inputs")
        full_identity = {**identity, "pairs": lines_digest(map("\t".join, pairs)), "chunk_size": chunk_size}
        store = ChunkFolder(folder, full_identity, [len(rows) for rows in chunks])
    done = _resumed(store, rank, processes, log)
    todo = [index for index in range(len(chunks)) if index not in done]
    bar = _Progress(len(pairs), sum(len(chunks[i]) for i in done), processes, progress and rank == 0, description)
    autocast = accelerator.autocast if accelerator is not None else contextlib.nullcontext
    try:
        for start in range(0, len(todo), processes):
            mine = todo[start + rank] if start + rank < len(todo) else None
            result = None
            if mine is not None:
                with autocast():
                    result = score_chunk([tuple(pairs[row]) for row in chunks[mine]], bar.scored)
                if len(result.scores) != len(chunks[mine]):
                    raise RuntimeError(f"the scorer returned {len(result.scores)} scores for {len(chunks[mine])} pairs")
            finished = _gathered((mine, result), processes)
            for index, chunk in finished:
                done[index] = chunk
                if store is not None and rank == 0:
                    store.save(index, chunk)
            bar.round_done(sum(len(chunks[index]) for index, _ in finished))
    finally:
        bar.close()
    return _in_pair_order(chunks, done, len(pairs))


def _resumed(store: ChunkFolder | None, rank: int, processes: int, log: Callable[[str], None]
             ) -> dict[int, PairScores]:
    """The chunks already scored in ``store`` (read by the main process, sent to the others); none without it."""
    done: dict[int, PairScores] = store.open(log) if store is not None and rank == 0 else {}
    if processes > 1:
        from accelerate.utils import broadcast_object_list

        done = broadcast_object_list([done])[0]
    return done


def _gathered(mine: tuple[int | None, PairScores | None], processes: int) -> list[tuple[int, PairScores]]:
    """``(chunk index, scores)`` of the chunks every process scored this round (a process without one sends
    ``(None, None)``, left out)."""
    gathered = [mine]
    if processes > 1:
        from accelerate.utils import gather_object

        gathered = gather_object(gathered)
    return [(index, chunk) for index, chunk in gathered if index is not None]


def _in_pair_order(chunks: list[list[int]], done: dict[int, PairScores], count: int) -> PairScores:
    """The scores of every chunk (``chunks[i]``: the rows of the pairs of chunk ``i``) as one :class:`PairScores` in
    the order of the ``count`` pairs."""
    scores: list[float | None] = [None] * count
    reasons: dict[int, str] = {}
    for index, rows in enumerate(chunks):
        chunk = done[index]
        for position, row in enumerate(rows):
            scores[row] = chunk.scores[position]
            if position in chunk.reasons:
                reasons[row] = chunk.reasons[position]
    return PairScores(scores, reasons)
