"""Global hard negative mining (GHNM, paper supplementary Algorithm 1) and the batch sampler.

A k-NN graph over the training images (built once from DINO descriptors by ``scripts/build_knn.py``)
gives every image its ``k`` most similar other images. The descriptor's sampler builds each
mini-batch of ``N`` pairs from ``N/2`` random images ``x`` and, for each, a random one of its ``k``
nearest neighbours ``x_hn``; both get their own positive pair, so every pair in the batch has at least
one k-NN-level negative (paper: ``k = 8``, ``p = 1.0``). The matcher uses the graph per pair instead:
a negative pair's reference is, with probability ``p = 0.5``, one of the query's ``k = 128``
neighbours (see :class:`copynce_hf.data.pairs.CopyPairDataset`).

The sampler is a stream of *global* batches: batch ``b`` is a pure function of ``(seed, b)``, so a
resumed run that starts at batch ``b`` sees exactly the data the uninterrupted run saw. In a run with
several processes, process ``r`` takes slice ``r`` of every global batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..modeling.errors import ConfigError
from ..outputs import give_default_mode
from .templated import TemplateGroups

__all__ = ["KNNGraph", "PairKey", "CopyPairBatchSampler", "build_knn_graph"]


@dataclass(frozen=True)
class PairKey:
    """Identifies one pair of the training stream; the pair dataset draws everything from it.

    ``batch`` is the global batch index, ``slot`` the position in the global batch and ``index`` the
    image (row of the image dataset) the query is made from. A slot of a shared-template group
    (:mod:`.templated`) also carries ``template_group`` (the group's first global slot; -1: a plain slot) and
    ``group_images`` (the image rows of the group's members, in slot order, ``index`` among them).
    """

    batch: int
    slot: int
    index: int
    template_group: int = -1
    group_images: tuple[int, ...] = ()


@dataclass
class KNNGraph:
    """k-nearest-neighbour graph of a set of images.

    Attributes:
        ids: image ids, row ``i`` of the arrays describes ``ids[i]``.
        neighbors: int64 (N, k): row indices of the k most similar other images, most similar
            first; ``-1`` where there is none (an image that could not be read).
        similarities: float32 (N, k): inner products of the L2-normalised descriptors.
    """

    ids: list[str]
    neighbors: np.ndarray
    similarities: np.ndarray

    @property
    def k(self) -> int:
        return int(self.neighbors.shape[1])

    def save(self, path: str | os.PathLike, **metadata: str) -> Path:
        """Write ``neighbors``/``similarities`` to a safetensors file with the ids in its metadata."""
        from safetensors.numpy import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"ids": json.dumps(list(self.ids)), "format": "copynce-knn-graph", **{k: str(v) for k, v in metadata.items()}}
        save_file(
            {"neighbors": np.ascontiguousarray(self.neighbors, dtype=np.int64),
             "similarities": np.ascontiguousarray(self.similarities, dtype=np.float32)},
            str(path),
            metadata=meta,
        )
        give_default_mode(path)  # safetensors writes 0600
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> KNNGraph:
        """Read a graph written by :meth:`save` (``scripts/build_knn.py``)."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"knn_graph {str(path)!r} does not exist; build it with scripts/build_knn.py")
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata() or {}
            if "ids" not in meta:
                raise ConfigError(f"knn_graph {str(path)!r} has no 'ids' metadata: not written by build_knn.py")
            return cls(json.loads(meta["ids"]), handle.get_tensor("neighbors"), handle.get_tensor("similarities"))

    def aligned_to(self, ids: Sequence[str]) -> KNNGraph:
        """The graph re-indexed to the order of ``ids`` (the training dataset's rows).

        Images of ``ids`` absent from the graph get no neighbours (-1); neighbours absent from
        ``ids`` are dropped (-1).
        """
        position = {image_id: row for row, image_id in enumerate(ids)}
        known = set(self.ids)
        if not any(image_id in known for image_id in ids):
            raise ConfigError("the knn_graph shares no image id with the training dataset")
        own_to_new = np.array([position.get(image_id, -1) for image_id in self.ids] + [-1], dtype=np.int64)
        remapped = own_to_new[np.where(self.neighbors < 0, len(self.ids), self.neighbors)]
        neighbors = np.full((len(ids), self.k), -1, dtype=np.int64)
        similarities = np.zeros((len(ids), self.k), dtype=np.float32)
        for own_row, image_id in enumerate(self.ids):
            new_row = position.get(image_id)
            if new_row is not None:
                neighbors[new_row] = remapped[own_row]
                similarities[new_row] = self.similarities[own_row]
        return KNNGraph(list(ids), neighbors, similarities)


def build_knn_graph(descriptors: np.ndarray, ids: Sequence[str], k: int, valid: np.ndarray | None = None,
                    groups: Sequence[str] | None = None) -> KNNGraph:
    """Exact k-NN graph by inner product (faiss ``IndexFlatIP``) of L2-normalised descriptors.

    Args:
        descriptors: float32 (N, D), one row per image (normalised here).
        ids: N image ids.
        k: neighbours per image (the image itself excluded).
        valid: optional bool (N,): rows to index; invalid rows get no neighbours and are nobody's.
        groups: optional N labels: each image's neighbours come from the images of its own group only
            (a graph per kind of image, e.g. photos among photos and procedural images among procedural ones,
            so that one kind's hard negatives are not spent on another); an image alone in its group gets none.
    """
    vectors = np.ascontiguousarray(descriptors, dtype=np.float32)
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise ValueError(f"descriptors must be (N, D) with N = len(ids) = {len(ids)}, got {vectors.shape}")
    if k < 1:
        raise ConfigError(f"k={k} must be >= 1")
    valid = np.ones(len(vectors), dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    readable = int(valid.sum())
    if readable < 2:
        raise ConfigError(f"need at least two readable images to build a k-NN graph, got {readable}")
    if groups is not None and len(groups) != len(ids):
        raise ValueError(f"groups must give one label per image ({len(ids)}), got {len(groups)}")
    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    neighbors = np.full((len(vectors), k), -1, dtype=np.int64)
    similarities = np.zeros((len(vectors), k), dtype=np.float32)
    labels = np.zeros(len(ids), dtype=np.int64) if groups is None else np.unique(list(groups), return_inverse=True)[1]
    for label in np.unique(labels):
        rows = np.flatnonzero(valid & (labels == label))
        if len(rows) > 1:
            _search_rows(vectors, rows, k, neighbors, similarities)
    return KNNGraph(list(ids), neighbors, similarities)


def _search_rows(vectors: np.ndarray, rows: np.ndarray, k: int, neighbors: np.ndarray,
                 similarities: np.ndarray) -> None:
    """Fill ``neighbors`` / ``similarities`` (N, k) for ``rows`` with their nearest others among ``rows``."""
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors[rows])
    scores, found = index.search(vectors[rows], min(k + 1, len(rows)))
    found = np.where(found >= 0, rows[np.maximum(found, 0)], -1)
    for position, row in enumerate(rows):
        keep = found[position] != row  # drop the image itself (and exact duplicates stay as neighbours)
        hits, values = found[position][keep][:k], scores[position][keep][:k]
        neighbors[row, : len(hits)] = hits
        similarities[row, : len(hits)] = values


class CopyPairBatchSampler:
    """Batches of :class:`PairKey` for a map-style :class:`CopyPairDataset`, optionally with GHNM.

    Anchors are read from an endless stream made of successive random permutations of the images
    (permutation ``e`` seeded with ``(seed, e)``: one permutation is one epoch). Without GHNM, a
    global batch of ``B * P`` pairs (``B`` per process, ``P`` processes) takes the next ``B * P``
    anchors. With GHNM (Algorithm 1) it takes ``B * P / 2`` anchors ``x`` and adds, after each, one
    of its ``k`` nearest neighbours ``x_hn`` (with probability ``hard_negative_prob``, else another
    random image), avoiding images already in the batch.

    With ``paired_slots`` (the authors' batch structure) every one of the ``B`` slots of a process
    yields two pairs, an anchor's and its hard negative's: a global batch takes ``B * P``
    anchors and has ``2 * B * P`` pairs, each process ``2 * B`` (its anchors with their
    negatives). Without a graph the partner is a random image, so the batch keeps its size.

    Args:
        num_images: rows of the image dataset.
        batch_size: pairs per process and per batch (``per_device_train_batch_size``).
        seed: data seed.
        num_processes, process_index: this process's slice of each global batch.
        knn: the k-NN graph aligned to the dataset (:meth:`KNNGraph.aligned_to`), or ``None``.
        hard_negative_k: neighbours to choose from (8 for the descriptor).
        hard_negative_prob: probability that an anchor's partner is a k-NN neighbour (1.0).
        start_batch: first global batch to yield (resume).
        num_batches: global batches to yield in total (``None``: endless).
        paired_slots: each slot yields the anchor's pair and its hard negative's pair (see above).
        template_groups: which slots of each process's batch share a template (:class:`~.templated.TemplateGroups`;
            ``None`` or a share of 0: none, the paper's batches); their keys name their group and its images.
    """

    def __init__(
        self,
        num_images: int,
        batch_size: int,
        seed: int = 0,
        num_processes: int = 1,
        process_index: int = 0,
        knn: KNNGraph | None = None,
        hard_negative_k: int = 8,
        hard_negative_prob: float = 1.0,
        start_batch: int = 0,
        num_batches: int | None = None,
        paired_slots: bool = False,
        template_groups: TemplateGroups | None = None,
    ):
        if num_images < 2:
            raise ConfigError(f"the training set needs at least 2 readable images, got {num_images}")
        if batch_size < 1:
            raise ConfigError(f"per_device_train_batch_size={batch_size} must be >= 1")
        if knn is not None and batch_size % 2 and not paired_slots:
            raise ConfigError(f"per_device_train_batch_size={batch_size} must be even with GHNM (pairs of x, x_hn)")
        if knn is not None and len(knn.ids) != num_images:
            raise ConfigError("the knn graph must be aligned to the training dataset (KNNGraph.aligned_to)")
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index {process_index} outside [0, {num_processes})")
        self.num_images = num_images
        self.batch_size = batch_size
        self.seed = seed
        self.num_processes = num_processes
        self.process_index = process_index
        self.knn = knn
        self.hard_negative_k = hard_negative_k
        self.hard_negative_prob = hard_negative_prob
        self.start_batch = start_batch
        self.num_batches = num_batches
        self.paired_slots = bool(paired_slots)
        self.template_groups = template_groups if template_groups is not None else TemplateGroups()
        #: Pairs each process gets per batch.
        self.pairs_per_process = batch_size * (2 if self.paired_slots else 1)
        self.global_batch_size = self.pairs_per_process * num_processes
        mining = knn is not None or self.paired_slots
        self.anchors_per_batch = self.global_batch_size // 2 if mining else self.global_batch_size

    @property
    def batches_per_epoch(self) -> float:
        """Global batches per pass of the anchors over every image once."""
        return self.num_images / self.anchors_per_batch

    def set_start(self, batch: int) -> None:
        """Resume: the next iteration starts at global batch ``batch``."""
        self.start_batch = int(batch)

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless CopyPairBatchSampler has no length")
        return max(0, self.num_batches - self.start_batch)

    def _anchors(self, batch: int) -> np.ndarray:
        first = batch * self.anchors_per_batch
        epochs = range(first // self.num_images, (first + self.anchors_per_batch - 1) // self.num_images + 1)
        stream = np.concatenate(
            [np.random.default_rng([self.seed, 0x5EED, e]).permutation(self.num_images) for e in epochs]
        )
        offset = first - epochs[0] * self.num_images
        return stream[offset: offset + self.anchors_per_batch]

    def global_batch(self, batch: int) -> list[int]:
        """Image indices of global batch ``batch`` (all processes), in slot order."""
        anchors = self._anchors(batch)
        if self.knn is None and not self.paired_slots:
            return [int(a) for a in anchors]
        rng = np.random.default_rng([self.seed, 0x6A11, batch])
        chosen: list[int] = []
        taken = set(int(a) for a in anchors)
        for anchor in anchors:
            anchor = int(anchor)
            partner = -1
            if self.knn is not None and rng.random() < self.hard_negative_prob:
                candidates = [int(n) for n in self.knn.neighbors[anchor, : self.hard_negative_k]
                              if n >= 0 and int(n) not in taken]
                if candidates:
                    partner = candidates[int(rng.integers(len(candidates)))]
            if partner < 0:  # no usable neighbour: a random image not yet in the batch (if any is left)
                free = self.num_images - len(taken)
                partner = int(rng.integers(self.num_images))
                while free > 0 and partner in taken:
                    partner = int(rng.integers(self.num_images))
            taken.add(partner)
            chosen.extend((anchor, partner))
        return chosen

    def __iter__(self) -> Iterator[list[PairKey]]:
        batch = self.start_batch
        size = self.pairs_per_process
        lo = self.process_index * size
        while self.num_batches is None or batch < self.num_batches:
            yield self.keys(batch, self.global_batch(batch)[lo: lo + size], lo)
            batch += 1

    def keys(self, batch: int, images: Sequence[int], first_slot: int) -> list[PairKey]:
        """The keys of one process's slots (global slots from ``first_slot``) holding the image rows ``images``,
        the slots of its shared-template groups naming their group (:meth:`TemplateGroups.assign`)."""
        images = [int(image) for image in images]
        groups = self.template_groups.assign(images)
        return [PairKey(batch, first_slot + slot, image,
                        first_slot + group if group >= 0 else -1, members)
                for slot, (image, (group, members)) in enumerate(zip(images, groups))]
