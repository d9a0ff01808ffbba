"""faiss indexes over reference descriptors, and k-NN search as scored predictions.

Descriptors are L2-normalised, so inner product equals cosine similarity and ranks like
the euclidean distance. Three index kinds:

* ``flat`` (default): exact inner-product search (``IndexFlatIP``), right up to a few
  hundred thousand references.
* ``hnsw``: graph search (``HNSW{M},Flat``, built with efConstruction 200), the approximate
  option for millions of references that fit in memory; the knob is ``ef_search`` (larger: slower,
  more exact), and a search for ``k`` neighbours walks a beam of at least ``k``. Descriptors that
  cluster tightly (near-duplicate photographs) need the careful build: at efConstruction 40 the
  graph loses the copies' sources among their close rivals (BENCHMARKS.md, Scale).
* ``ivfpq``: inverted lists with 4-bit product-quantised codes (``IVF{nlist},PQ{m}x4fs``),
  optionally re-ranked exactly (``refine``) for memory-limited collections; the knobs are
  ``nprobe`` and ``k_factor`` (how many PQ candidates are re-ranked per requested neighbour).

An index folder holds ``index.faiss`` (the faiss index), ``descriptors.safetensors`` (ids
and descriptors, see :mod:`copynce_hf.retrieval.descriptors.sets`) and ``index.json`` (kind, parameters, model), plus
``whitening.safetensors`` when the index whitens (:mod:`.whitening`): then faiss holds the whitened
references and :meth:`DescriptorIndex.search` whitens the queries it is given the same way.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...modeling.errors import ConfigError, PredictionsError
from ..descriptors.sets import DescriptorSet, concatenate_descriptor_files, read_descriptor_header
from ..descriptors.whitening import Whitening
from ..predictions import Prediction

if TYPE_CHECKING:
    import faiss


def _faiss():
    """faiss, imported on first use (``import copynce_hf`` and training need no faiss)."""
    import faiss

    return faiss

INDEX_KINDS = ("flat", "hnsw", "ivfpq")

#: Fewest references an IVF-PQ index trains on (k-means of the 16 centroids of each 4-bit sub-quantiser).
MIN_IVFPQ_TRAINING = 256

#: Queries per faiss call in :meth:`DescriptorIndex.search` (bounds the memory of a search over many queries).
SEARCH_BATCH_SIZE = 4096


@dataclass
class IndexConfig:
    """How to build and search a faiss index.

    Attributes:
        kind: ``flat`` (exact), ``hnsw`` or ``ivfpq`` (approximate).
        hnsw_m: neighbours per node of the HNSW graph.
        ef_construction: HNSW build-time beam width (faiss's default, 40, builds a graph that misses copies
            inside clusters of close references: 0.80 of found@1 at 100k where 200 gives 0.97).
        ef_search: HNSW search-time beam width (``efSearch``); a search for ``k`` neighbours widens it to ``k``
            (:meth:`hnsw_beam`).
        nlist: IVF lists; ``None`` picks ``4 * sqrt(N)`` clipped so that every list gets
            at least 39 training vectors.
        pq_m: PQ sub-quantisers (4 bits each); ``None`` picks ``D / 2``.
        nprobe: IVF lists visited per query.
        refine: re-rank the IVF-PQ candidates with exact inner products (keeps the raw vectors).
        k_factor: candidates re-ranked per requested neighbour when ``refine``.
        max_train_vectors: the IVF-PQ quantisers are trained on at most this many references
            (a fixed random sample; faiss asks for 30 to 256 per inverted list), which keeps the
            k-means of a million-image index to minutes. All references are added.
    """

    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int | None = None
    pq_m: int | None = None
    nprobe: int = 32
    refine: bool = True
    k_factor: int = 8
    max_train_vectors: int = 200_000

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise ConfigError(f"unknown index kind {self.kind!r}; choose one of {', '.join(INDEX_KINDS)}")
        for name in ("hnsw_m", "ef_construction", "ef_search", "nprobe", "k_factor", "max_train_vectors"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"index parameter {name} must be at least 1, got {getattr(self, name)}")

    def factory_string(self, count: int, dim: int) -> str:
        """The faiss ``index_factory`` description for ``count`` vectors of ``dim`` dimensions."""
        if self.kind == "flat":
            return "Flat"
        if self.kind == "hnsw":
            return f"HNSW{self.hnsw_m},Flat"
        nlist = self.nlist or int(np.clip(round(4 * math.sqrt(count)), 1, max(1, count // 39)))
        if nlist > count:
            raise ConfigError(f"nlist={nlist} inverted lists need at least as many references, got {count}")
        pq_m = self.pq_m or max(1, dim // 2)
        if dim % pq_m:
            raise ConfigError(f"pq_m={pq_m} must divide the descriptor dimension {dim}")
        return f"IVF{nlist},PQ{pq_m}x4fs" + (",RFlat" if self.refine else "")

    def hnsw_beam(self, k: int) -> int:
        """The beam width an ``hnsw`` search for ``k`` neighbours walks the graph with: ``ef_search``, widened to
        ``k`` (a beam narrower than the neighbours asked for returns the leftovers of a narrow walk)."""
        return max(int(self.ef_search), int(k))

    def search_parameters(self) -> str:
        """The faiss ``ParameterSpace`` string applying the search-time knobs."""
        if self.kind == "hnsw":
            return f"efSearch={self.ef_search}"
        if self.kind == "ivfpq":
            return f"nprobe={self.nprobe}" + (f",k_factor_rf={self.k_factor}" if self.refine else "")
        return ""


#: The fields of :class:`IndexConfig` that a search may change on a built index (:meth:`DescriptorIndex.set_search_parameters`).
SEARCH_KNOBS = ("ef_search", "nprobe", "k_factor")


def search_knobs(settings) -> dict[str, int]:
    """The :data:`SEARCH_KNOBS` ``settings`` (an object with those attributes, e.g. a request) sets, ``None``
    values left out (they keep the index's own)."""
    return {name: getattr(settings, name) for name in SEARCH_KNOBS if getattr(settings, name) is not None}


def _training_rows(count: int, limit: int, seed: int = 0) -> np.ndarray:
    """The rows (sorted) the IVF-PQ quantisers train on: all ``count`` rows, or ``limit`` of them drawn without
    replacement with a fixed seed."""
    if count <= limit:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, size=limit, replace=False))


def _empty_index(config: IndexConfig, count: int, dim: int) -> faiss.Index:
    """An untrained, empty faiss index of ``config``'s kind for ``count`` vectors of ``dim`` dimensions."""
    index = _faiss().index_factory(dim, config.factory_string(count, dim), _faiss().METRIC_INNER_PRODUCT)
    if config.kind == "hnsw":
        _faiss().downcast_index(index).hnsw.efConstruction = config.ef_construction
    if not index.is_trained and count < MIN_IVFPQ_TRAINING:
        raise ConfigError(
            f"an ivfpq index needs at least {MIN_IVFPQ_TRAINING} references to train its quantisers, "
            f"got {count}; use the exact 'flat' index"
        )
    return index


def _write_whitening(folder: Path, whitening: Whitening | None) -> None:
    """``whitening.safetensors`` in an index folder when the index whitens; none (an old one removed) otherwise."""
    (folder / "whitening.safetensors").unlink(missing_ok=True)
    if whitening is not None:
        whitening.save(folder / "whitening.safetensors")


def _write_index_json(folder: Path, config: IndexConfig, count: int, dim: int, info: dict,
                      whitening: Whitening | None = None) -> None:
    meta = {"config": asdict(config), "count": count, "dim": dim, **info,
            **({"whitened_dim": whitening.dim} if whitening is not None else {})}
    (folder / "index.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def write_index_from_files(parts: list[str | os.PathLike], folder: str | os.PathLike,
                           config: IndexConfig | None = None, info: dict | None = None,
                           whitening: Whitening | None = None) -> tuple[int, int]:
    """Build an index over the rows of several descriptor files (:meth:`DescriptorSet.save`, in order), whitened
    first when ``whitening`` is given, and write the folder :meth:`DescriptorIndex.load` reads, holding the faiss
    index and one file's descriptors in memory at a time (an IVF-PQ index also its training sample, at most
    ``max_train_vectors`` rows, the rows :meth:`DescriptorIndex.build` would draw). Returns the number and the
    dimension of the indexed descriptors (as the model gives them)."""
    config = config or IndexConfig()
    shapes = [read_descriptor_header(part)[1] for part in parts]
    count = sum(rows for rows, _ in shapes)
    if count == 0:
        raise PredictionsError("cannot build an index over an empty descriptor set")

    def vectors(part, rows=slice(None)) -> np.ndarray:
        loaded = DescriptorSet.load(part).descriptors[rows]
        return np.ascontiguousarray(whitening.whiten(loaded) if whitening is not None else loaded)

    index = _empty_index(config, count, whitening.dim if whitening is not None else shapes[0][1])
    if not index.is_trained:
        wanted, sample, offset = _training_rows(count, config.max_train_vectors), [], 0
        for part, (rows, _) in zip(parts, shapes):
            mine = wanted[(wanted >= offset) & (wanted < offset + rows)] - offset
            if len(mine):
                sample.append(vectors(part, mine))
            offset += rows
        index.train(np.ascontiguousarray(np.concatenate(sample)))
    for part in parts:
        index.add(vectors(part))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _faiss().write_index(index, str(folder / "index.faiss"))
    concatenate_descriptor_files(parts, folder / "descriptors.safetensors")
    _write_whitening(folder, whitening)
    _write_index_json(folder, config, count, shapes[0][1], dict(info or {}), whitening)
    return count, shapes[0][1]


@dataclass
class DescriptorIndex:
    """A faiss index over reference descriptors, with the reference ids.

    Attributes:
        index: the faiss index (inner-product metric); row ``i`` is ``references.ids[i]``.
        references: the indexed descriptors and their ids, as the model gave them (not whitened).
        config: how the index was built and is searched.
        info: free-form provenance written to ``index.json`` (e.g. the model path).
        whitening: the transform applied to references and queries before faiss sees them; ``None``: none.
    """

    index: faiss.Index
    references: DescriptorSet
    config: IndexConfig = field(default_factory=IndexConfig)
    info: dict = field(default_factory=dict)
    whitening: Whitening | None = None

    @classmethod
    def build(cls, references: DescriptorSet, config: IndexConfig | None = None, info: dict | None = None,
              whitening: Whitening | None = None):
        """Build an index over ``references.descriptors`` (N, D) float32, whitened first when ``whitening`` is given."""
        config = config or IndexConfig()
        if len(references) == 0:
            raise PredictionsError("cannot build an index over an empty descriptor set")
        vectors = whitening.whiten(references.descriptors) if whitening is not None else references.descriptors
        index = _empty_index(config, len(references), int(vectors.shape[1]))
        if not index.is_trained:
            index.train(np.ascontiguousarray(vectors[_training_rows(len(vectors), config.max_train_vectors)]))
        index.add(vectors)
        built = cls(index, references, config, dict(info or {}), whitening)
        built.set_search_parameters()
        return built

    def set_search_parameters(self, **overrides) -> None:
        """Apply ``nprobe`` / ``ef_search`` / ``k_factor`` (optionally changed) to the faiss index."""
        if overrides:
            self.config = IndexConfig(**{**asdict(self.config), **overrides})
        parameters = self.config.search_parameters()
        if parameters:
            _faiss().ParameterSpace().set_index_parameters(self.index, parameters)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def transform(self, descriptors: np.ndarray) -> np.ndarray:
        """Descriptors (N, D) as this index compares them: whitened (N, d) when it whitens, else unchanged."""
        return self.whitening.whiten(descriptors) if self.whitening is not None else descriptors

    def search(self, queries: np.ndarray, k: int = 10,
               batch_size: int = SEARCH_BATCH_SIZE) -> tuple[np.ndarray, np.ndarray]:
        """k-NN by inner product (of the whitened descriptors when the index whitens).

        The queries go to faiss ``batch_size`` at a time: faiss holds the working candidates of all the
        queries of one call (an ``ivfpq`` index with re-ranking ``k * k_factor`` per query: 1.9 GB for
        50,000 queries at k = 400), so one call over every query would grow with their number.

        Args:
            queries: (Nq, D) float32, as the model gives them (whitened here when the index whitens).
            k: neighbours per query (capped at the index size).
            batch_size: queries per faiss call (the results do not depend on it).

        Returns:
            ``scores`` (Nq, k') float32 and ``indices`` (Nq, k') int64 into ``references``,
            best first, with ``k' = min(k, N)``; an approximate index may return ``-1``
            (no neighbour) in some slots.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.references.dim:
            raise PredictionsError(
                f"query descriptors of shape {queries.shape} do not match the index dimension {self.references.dim}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        k = min(int(k), len(self))
        scores = np.empty((len(queries), k), dtype=np.float32)
        indices = np.empty((len(queries), k), dtype=np.int64)
        parameters = self._per_call_parameters(k)
        for start in range(0, len(queries), batch_size):
            batch = np.ascontiguousarray(self.transform(queries[start:start + batch_size]))
            scores[start:start + len(batch)], indices[start:start + len(batch)] = self.index.search(
                batch, k, params=parameters)
        return scores, indices

    def _per_call_parameters(self, k: int):
        """faiss search parameters of one :meth:`search` for ``k`` neighbours: an ``hnsw`` index walks its graph
        with a beam of :meth:`IndexConfig.hnsw_beam` (``max(ef_search, k)``); other kinds use the parameters set
        on the index (``None``).

        faiss sizes its HNSW candidate heap to ``max(efSearch, k)`` but stops the walk by ``efSearch`` alone, so
        without this a search for 400 neighbours at efSearch 128 explores no more of the graph than a search for
        one, and its 400 are the leftovers of a 128-wide walk."""
        if self.config.kind != "hnsw":
            return None
        parameters = _faiss().SearchParametersHNSW()
        parameters.efSearch = self.config.hnsw_beam(k)
        return parameters

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``index.faiss``, ``descriptors.safetensors``, ``index.json`` (and ``whitening.safetensors``) into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _faiss().write_index(self.index, str(folder / "index.faiss"))
        self.references.save(folder / "descriptors.safetensors")
        _write_whitening(folder, self.whitening)
        _write_index_json(folder, self.config, len(self), self.references.dim, self.info, self.whitening)
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike) -> DescriptorIndex:
        """Read an index folder written by :meth:`save`.

        Raises :class:`PredictionsError` naming the folder when a file is missing or damaged."""
        folder = Path(folder)
        missing = [name for name in ("index.faiss", "descriptors.safetensors", "index.json") if not (folder / name).is_file()]
        if missing:
            raise PredictionsError(
                f"index folder {os.fspath(folder)!r} lacks {', '.join(missing)}; build it with `copynce index`"
            )
        damaged = f"index folder {os.fspath(folder)!r} is damaged; build it again with `copynce index`"
        try:
            meta = json.loads((folder / "index.json").read_text(encoding="utf-8"))
            config = IndexConfig(**meta.pop("config"))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise PredictionsError(f"{damaged} (index.json: {error})") from None
        meta.pop("count", None)
        meta.pop("dim", None)
        whitened_dim = meta.pop("whitened_dim", None)
        whitening = None
        if whitened_dim is not None:
            if not (folder / "whitening.safetensors").is_file():
                raise PredictionsError(f"{damaged} (index.json names a whitening, whitening.safetensors is missing)")
            whitening = Whitening.load(folder / "whitening.safetensors")
        references = DescriptorSet.load(folder / "descriptors.safetensors")
        try:
            index = _faiss().read_index(str(folder / "index.faiss"))
        except RuntimeError as error:  # faiss reports a damaged file as a RuntimeError with its C++ trace
            reason = re.sub(r"^Error in .*? at \S+:\d+: ", "", " ".join(str(error).split())) or "unreadable"
            raise PredictionsError(f"{damaged} (index.faiss: {reason})") from None
        loaded = cls(index, references, config, meta, whitening)
        if whitening is not None and (whitening.input_dim, whitening.dim) != (references.dim, index.d):
            raise PredictionsError(f"{damaged} (whitening.safetensors maps {whitening.input_dim}-d to "
                                   f"{whitening.dim}-d descriptors; the index holds {references.dim}-d descriptors "
                                   f"and {index.d}-d vectors)")
        if len(loaded) != len(references):
            raise PredictionsError(
                f"index folder {os.fspath(folder)!r}: the index holds {len(loaded)} vectors, "
                f"the descriptor file {len(references)}"
            )
        loaded.set_search_parameters()
        return loaded


def knn_predictions(
    query_ids: list[str], scores: np.ndarray, indices: np.ndarray, reference_ids: list[str]
) -> list[Prediction]:
    """Turn k-NN results into predictions.

    Args:
        query_ids: Nq ids, row order of ``scores``.
        scores: (Nq, k) similarity (higher is more similar).
        indices: (Nq, k) rows into ``reference_ids``; negative entries (no neighbour) are skipped.
        reference_ids: ids of the indexed references.

    Returns:
        One :class:`Prediction` per valid (query, neighbour) slot.
    """
    predictions = []
    for query_id, row_scores, row_indices in zip(query_ids, scores, indices):
        for score, index in zip(row_scores, row_indices):
            if index >= 0:
                predictions.append(Prediction(query_id, reference_ids[index], float(score)))
    return predictions
