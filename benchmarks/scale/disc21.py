"""DISC21 scale: faiss indexes over a million synthetic descriptors, model costs per image and per pair,
and the wall time of the whole DISC21 pipeline worked out from them.

    python -m benchmarks.scale.disc21 --parts faiss --sizes 100000 1000000     # one thread each, see below
    python -m benchmarks.scale.disc21 --parts models                           # extraction and matcher costs
    python -m benchmarks.scale.disc21 --parts estimate                         # DISC21 wall time from the two

(Not to be confused with :mod:`benchmarks.training.scaling`, the compute-scaling curve of training.)

Parts (``--parts``):

* ``faiss``: for each size N, the package's own ``flat``, ``hnsw`` and ``ivfpq`` indexes
  (:class:`copynce_hf.retrieval.DescriptorIndex` with the default :class:`IndexConfig`) over N
  synthetic 512-d descriptors: build seconds, peak resident memory (each index is built and
  searched in a fresh child process, so that one kind's peak does not hide another's), seconds to
  search ``--queries`` queries for the ``--k`` nearest references (400: the merged candidates of
  ``copynce detect --preset paper``), and quality on the copy queries: found@1 (the query's
  source ranked first), source recall@k (the source among the k), and the agreement of each
  approximate index with exact search (top-1 equal, overlap of the top 10). ``--hnsw-ef-construction``
  and ``--hnsw-ef-search`` change the ``hnsw`` index's settings (``--hnsw-ef-construction 40``: the
  default before the 1M measurements showed it loses the copies).
* ``models``: milliseconds per image of descriptor extraction and, for the matcher with its
  encoder-token cache, per encoded image (or view) and per fused pair, for the embedded models and
  ViT-S/16 at 224 (random weights; ``configs/*_vits16_224.yaml``).
* ``estimate``: the DISC21 pipeline (1M references, 50k queries, 400 candidates; ``--preset paper``
  with its LCE view counts, 35 matcher view pairs per candidate, and without LCE: :func:`disc21_scenarios`)
  in model passes and exact-search rows, and its wall time on this CPU core and on 1, 8 and 64 GPUs
  from the GPU throughput given with ``--gpu-json`` (written by :mod:`benchmarks.scale.gpu_throughput`),
  scaled linearly with the GPU count.

Synthetic descriptors (:func:`synthetic_descriptors`), seeded: N / ``per_cluster`` (1000) centres
drawn uniformly on the unit sphere; every reference is ``unit(centre + spread * g / sqrt(D))``
around a centre drawn uniformly (``g`` standard normal): with ``spread`` 0.5 two references of one
cluster have a cosine of about 0.8, so every query has about a thousand close rivals (like
near-duplicate photographs of one scene) rather than a million near-orthogonal vectors. A share
``copy_fraction`` of the queries (DISC21's dev set: 10k of 50k) are copies:
``unit(source + copy_noise * g / sqrt(D))`` of a uniformly drawn source reference: ``copy_noise``
1.5 puts a copy at a cosine of about 0.56 to its source while its best rival in the source's
cluster is at about 0.50 (measured at 100k), a margin that exact search always resolves (found@1
1.0) and an approximate index may not. The other queries are fresh draws of the reference model
(no source); all queries are searched and timed.

Results go to ``<output-dir>/scale.json`` (updated after every part and every index).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..common import DEFAULT_OUTPUT_DIR, command_line, machine_info, now, read_json, write_json

logger = logging.getLogger("benchmarks.scale.disc21")

__all__ = ["synthetic_descriptors", "index_quality", "bench_faiss_scale", "bench_model_costs",
           "paper_preset_counts", "disc21_workload", "disc21_estimate", "disc21_scenarios", "gpu_rates",
           "markdown_tables", "main"]

PARTS = ("faiss", "models", "estimate")
INDEX_KINDS = ("flat", "hnsw", "ivfpq")
#: DISC21 (Douze et al. 2021, Table 1): 1M references, 50k dev queries of which 10k are copies.
DISC21_REFERENCES = 1_000_000
DISC21_QUERIES = 50_000
DISC21_COPY_FRACTION = 0.2


# ---------------------------------------------------------------------------------------------- data


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def _cluster_points(rng: np.random.Generator, centres: np.ndarray, count: int, spread: float,
                    chunk: int = 100_000) -> np.ndarray:
    """``count`` points unit(centre + spread * g / sqrt(D)) around uniformly drawn ``centres`` (C, D)."""
    dim = centres.shape[1]
    points = np.empty((count, dim), dtype=np.float32)
    for start in range(0, count, chunk):
        stop = min(count, start + chunk)
        owners = rng.integers(0, len(centres), stop - start)
        block = rng.standard_normal((stop - start, dim), dtype=np.float32)
        block *= spread / math.sqrt(dim)
        block += centres[owners]
        points[start:stop] = _unit_rows(block)
    return points


def synthetic_descriptors(num_references: int, num_queries: int, dim: int = 512, seed: int = 0,
                          per_cluster: int = 1000, spread: float = 0.5, copy_noise: float = 1.5,
                          copy_fraction: float = DISC21_COPY_FRACTION):
    """Clustered unit descriptors and queries of which a share are noisy copies of references.

    Returns:
        ``references`` (N, D) float32, ``queries`` (Nq, D) float32 (unit rows) and ``sources``
        (Nq,) int64: the row of the reference each query copies, ``-1`` for a query that copies
        nothing. The copies come first.
    """
    if not 0.0 <= copy_fraction <= 1.0:
        raise ValueError(f"copy_fraction must lie in [0, 1], got {copy_fraction}")
    rng = np.random.default_rng(seed)
    clusters = max(1, num_references // per_cluster)
    centres = _unit_rows(rng.standard_normal((clusters, dim), dtype=np.float32))
    references = _cluster_points(rng, centres, num_references, spread)
    copies = int(round(copy_fraction * num_queries))
    sources = np.full(num_queries, -1, dtype=np.int64)
    sources[:copies] = rng.integers(0, num_references, copies)
    noise = rng.standard_normal((copies, dim), dtype=np.float32) * np.float32(copy_noise / math.sqrt(dim))
    queries = np.empty((num_queries, dim), dtype=np.float32)
    queries[:copies] = _unit_rows(references[sources[:copies]] + noise)
    queries[copies:] = _cluster_points(rng, centres, num_queries - copies, spread)
    return references, queries, sources


def index_quality(found: np.ndarray, sources: np.ndarray, exact: np.ndarray | None = None) -> dict:
    """Quality of k-NN results ``found`` (Nq, k) rows into the references, on the copy queries.

    Args:
        found: the index's neighbours, best first (``-1``: none).
        sources: (Nq,) the source row of each query, ``-1`` for a query that copies nothing.
        exact: the exact search's neighbours (Nq, >= 10) of the same queries, for the agreement figures.

    Returns:
        ``found_at_1`` and ``source_recall_at_k`` over the copy queries; with ``exact``, over all
        queries, ``top1_agreement`` (same first neighbour) and ``overlap_at_10`` (share of the exact
        top 10 among the index's top 10).
    """
    copies = sources >= 0
    if not copies.any():
        raise ValueError("no copy query: found@1 needs queries with a source")
    result = {"copy_queries": int(copies.sum()), "k": int(found.shape[1]),
              "found_at_1": float(np.mean(found[copies, 0] == sources[copies])),
              "source_recall_at_k": float(np.mean((found[copies] == sources[copies, None]).any(axis=1)))}
    if exact is not None:
        top = min(10, found.shape[1], exact.shape[1])
        result["top1_agreement"] = float(np.mean(found[:, 0] == exact[:, 0]))
        result["overlap_at_10"] = float(np.mean([len(np.intersect1d(a[:top], b[:top])) / top
                                                 for a, b in zip(found, exact)]))
    return result


# ---------------------------------------------------------------------------------------------- faiss


def _resident_mib() -> float:
    """Resident memory of this process now (MiB)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_resident_mib() -> float:
    """Peak resident memory of this process (MiB) since :func:`_reset_peak` (Linux ``VmHWM``; else the
    lifetime peak of ``getrusage``)."""
    try:
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    """Restart the peak at the current resident memory (Linux ``clear_refs`` 5), so that loading the
    data file (which briefly holds more than the arrays) does not hide the index's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def _measure_index(kind: str, data: Path, k: int, found_path: Path, stride: int = 1,
                   settings: dict | None = None) -> dict:
    """Build the package's ``kind`` index over ``data``'s references and search every ``stride``-th of its
    queries (in this process); ``settings`` change :class:`IndexConfig` fields (default: the package's)."""
    import faiss

    from copynce_hf.retrieval import DescriptorIndex, DescriptorSet, IndexConfig

    faiss.omp_set_num_threads(1)
    arrays = np.load(data)
    references, queries = arrays["references"], np.ascontiguousarray(arrays["queries"][::stride])
    descriptors = DescriptorSet([str(i) for i in range(len(references))], references)
    loaded = _resident_mib()
    _reset_peak()
    config = IndexConfig(kind=kind, **(settings or {}))
    start, start_cpu = time.perf_counter(), time.process_time()
    index = DescriptorIndex.build(descriptors, config)
    build_seconds, build_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    built_peak, built = _peak_resident_mib(), _resident_mib()
    index.search(queries[:10], k)  # warm-up
    start, start_cpu = time.perf_counter(), time.process_time()
    _, found = index.search(queries, k)
    search_seconds, search_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    np.save(found_path, found)
    search_parameters = config.search_parameters()
    if kind == "hnsw":  # the build's beam, and the beam this k actually searched with
        search_parameters = f"efConstruction={config.ef_construction}, efSearch={config.hnsw_beam(k)}"
    return {"kind": kind, "factory": config.factory_string(len(references), references.shape[1]),
            "search_parameters": search_parameters, "settings": dict(settings or {}), "build_seconds": build_seconds,
            "build_cpu_seconds": build_cpu, "search_seconds": search_seconds, "search_cpu_seconds": search_cpu,
            "k": k, "queries_per_cpu_second": len(queries) / search_cpu,
            "resident_mib_data_loaded": loaded, "resident_mib_after_build": built,
            "peak_resident_mib_after_build": built_peak,
            "peak_resident_mib": _peak_resident_mib(), "index_mib_above_data": built_peak - loaded,
            "faiss_threads": faiss.omp_get_max_threads()}


def _run_child(kind: str, data: Path, k: int, found_path: Path, stride: int = 1,
               settings: dict | None = None) -> dict:
    """:func:`_measure_index` in a fresh interpreter, one thread (its peak memory is its own)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.scale.disc21", "--child", kind, "--child-data", str(data),
               "--k", str(k), "--child-found", str(found_path), "--child-stride", str(stride),
               "--child-settings", json.dumps(settings or {})]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"index child {kind} on {data} failed (exit {completed.returncode}):\n"
                           f"{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def bench_faiss_scale(size: int, work_dir: Path, num_queries: int = DISC21_QUERIES, k: int = 400,
                      kinds=INDEX_KINDS, seed: int = 0, exact_queries: int | None = None, on_result=None,
                      hnsw_settings: dict | None = None, **generator) -> dict:
    """Build time, peak memory, search time and quality of each index kind over ``size`` references.

    The descriptors are generated once and kept in ``work_dir/data-<size>.npz`` for the children;
    the exact (``flat``) result is the reference for the agreement figures, so ``flat`` runs first.
    With ``exact_queries``, exact search runs on every ``ceil(num_queries / exact_queries)``-th query
    only (its time is linear in the number of queries: ``search_cpu_seconds`` is then scaled to all
    of them, and ``searched_queries`` says how many ran), and the agreement figures use those queries.
    ``on_result(entry)`` is called after every index (to save partial results). ``hnsw_settings`` change
    the ``hnsw`` index's :class:`IndexConfig` fields (e.g. ``{"ef_construction": 40}``, the old default).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    data = work_dir / f"data-{size}-seed{seed}.npz"
    start = time.perf_counter()
    references, queries, sources = synthetic_descriptors(size, num_queries, seed=seed, **generator)
    generated = time.perf_counter() - start
    np.savez(data, references=references, queries=queries)
    del references, queries
    entry = {"references": size, "queries": num_queries, "k": k, "seed": seed,
             "generator": {"per_cluster": 1000, "spread": 0.5, "copy_noise": 1.5,
                           "copy_fraction": DISC21_COPY_FRACTION, **generator},
             "generate_seconds": generated, "indexes": {}}
    stride = max(1, math.ceil(num_queries / exact_queries)) if exact_queries else 1
    exact_rows = np.arange(0, num_queries, stride)
    exact = None
    for kind in ("flat", *[kind for kind in kinds if kind != "flat"]):
        found_path = work_dir / f"found-{size}-{kind}.npy"
        logger.info("N=%d %s: building and searching in a child process", size, kind)
        measured = _run_child(kind, data, k, found_path, stride if kind == "flat" else 1,
                              hnsw_settings if kind == "hnsw" else None)
        found = np.load(found_path)
        if kind == "flat":
            exact = found
            measured["searched_queries"] = len(exact_rows)
            if stride > 1:  # exact search costs the same per query: scale the subset's time to all queries
                measured["search_cpu_seconds_measured"] = measured["search_cpu_seconds"]
                measured["search_cpu_seconds"] *= num_queries / len(exact_rows)
                measured["queries_per_cpu_second"] = num_queries / measured["search_cpu_seconds"]
            measured.update(index_quality(found, sources[exact_rows]))
        else:
            measured["searched_queries"] = num_queries
            agreement = index_quality(found[exact_rows], sources[exact_rows], exact)
            measured.update(index_quality(found, sources), top1_agreement=agreement["top1_agreement"],
                            overlap_at_10=agreement["overlap_at_10"])
        entry["indexes"][kind] = measured
        logger.info("N=%d %s: build %.1f s CPU, search %.1f s CPU (%.0f q/s), peak %.0f MiB, found@1 %.3f", size,
                    kind, measured["build_cpu_seconds"], measured["search_cpu_seconds"],
                    measured["queries_per_cpu_second"],
                    measured["peak_resident_mib"], measured["found_at_1"])
        if on_result is not None:
            on_result(entry)
    data.unlink()
    return entry


# ---------------------------------------------------------------------------------------------- models


def bench_model_costs(models=("embedded", "vits16-224"), batch_size: int = 16, repeats: int = 3) -> dict:
    """CPU seconds per descriptor image, matcher encoder view, fusion pair and uncached pair, one torch thread.

    Random pixels at each model's size (image decoding, view cutting and processing excluded: on a GPU
    machine the DataLoader workers do them beside the model).
    """
    import torch

    from ..speed.model_costs import COST_MODELS, load_cost_models, pass_costs

    torch.set_num_threads(1)
    result = {"timing": f"CPU time of this process, 1 torch thread, batch {batch_size}, fastest of {repeats} "
                        f"passes, float32, random pixels", "models": {}}
    for name in models:
        descriptor, matcher = load_cost_models(name)
        costs = pass_costs(descriptor, matcher, batch_size, repeats)
        costs["what"] = COST_MODELS[name]
        result["models"][name] = costs
        logger.info("%s: descriptor %.1f ms/image, encoder %.1f ms/view, fusion %.1f ms/pair, uncached %.1f ms/pair",
                    name, *(1e3 * costs[key] for key in ("descriptor_seconds_per_image", "encoder_seconds_per_view",
                                                         "fusion_seconds_per_pair", "uncached_seconds_per_pair")))
    return result


# ---------------------------------------------------------------------------------------------- estimate

#: A published GPU throughput of ViT-S/16 at 224 (forward only): DeiT-S in Touvron et al., "Training
#: data-efficient image transformers & distillation through attention" (ICML 2021), Table 1: images per
#: second on one 16 GB V100 with the largest batch that fits. Used when no GPU measurement is given.
PUBLISHED_VITS16_IMAGES_PER_SECOND = 940.4
PUBLISHED_SOURCE = ("DeiT-S (ViT-S/16, 224) forward throughput 940.4 images/s on one 16 GB V100, Touvron et al., "
                    "ICML 2021, Table 1")


def paper_preset_counts() -> dict:
    """Views and candidates of ``copynce detect --preset paper``, read from the package's presets and views."""
    from copynce_hf.retrieval.descriptors.views import ViewPreset, matcher_view_pairs, matcher_view_preset
    from copynce_hf.retrieval.presets import DETECT_PRESETS

    preset = DETECT_PRESETS["paper"]
    descriptor_views, matcher_views = ViewPreset(preset["descriptor_lce"]), matcher_view_preset(preset["matcher_lce"])
    return {"candidates": preset["candidates"], "descriptor_query_views": descriptor_views.num_query_views,
            "descriptor_reference_views": descriptor_views.num_reference_views,
            "matcher_query_views": matcher_views.num_query_views,
            "matcher_reference_views": matcher_views.num_reference_views,
            "view_pairs": len(matcher_view_pairs(preset["matcher_lce"], matcher_views.num_query_views,
                                                 matcher_views.num_reference_views))}


def disc21_workload(references: int = DISC21_REFERENCES, queries: int = DISC21_QUERIES,
                    auxiliary: int = DISC21_REFERENCES, candidates: int = 400, descriptor_query_views: int = 45,
                    descriptor_reference_views: int = 9, matcher_query_views: int = 26,
                    matcher_reference_views: int = 10, view_pairs: int = 35) -> dict:
    """Model passes and search rows of ``copynce detect --preset paper`` over DISC21, one descriptor.

    Defaults: 1M references, 50k queries, score normalisation against 1M auxiliary images (the size of
    DISC21's training set, which the authors normalise with), and the counts of
    :func:`paper_preset_counts`: the ``authors`` descriptor views (45 per query, 9 per reference or
    auxiliary image), 400 candidates, the matcher's ``paper`` LCE (26 query views, 10 reference
    views, 35 view pairs per candidate).

    The matcher encodes each query's views once; reference views go through an LRU cache of 4096
    views (:class:`~copynce_hf.retrieval.verify.scorer.MatcherScorer`), the 400 x 10 views of about one
    query, so with candidates spread over a million references almost every candidate's views are
    encoded again: ``encoder_passes`` counts that; ``encoder_passes_each_view_once`` is the floor
    if every reference view were encoded once (1M x 10 views of ViT-S tokens are about 1.5 TB in
    bfloat16, so no cache holds them).
    """
    pairs = queries * candidates
    return {
        "references": references, "queries": queries, "auxiliary": auxiliary, "candidates": candidates,
        "descriptor_passes": (references + auxiliary) * descriptor_reference_views + queries * descriptor_query_views,
        "encoder_passes": queries * matcher_query_views + pairs * matcher_reference_views,
        "encoder_passes_each_view_once": queries * matcher_query_views + references * matcher_reference_views,
        "fusion_passes": pairs * view_pairs,
        "matcher_pairs": pairs,
        "search_query_rows": queries * descriptor_query_views,
        "search_index_rows": (references + auxiliary) * descriptor_reference_views,
        "views": {"descriptor_query": descriptor_query_views, "descriptor_reference": descriptor_reference_views,
                  "matcher_query": matcher_query_views, "matcher_reference": matcher_reference_views,
                  "matcher_view_pairs": view_pairs},
    }


def disc21_estimate(workload: dict, cpu_costs: dict, gpu: dict | None = None, gpu_counts=(1, 8, 64),
                    flat_seconds_per_row_pair: float | None = None) -> dict:
    """Wall time of ``workload`` on one CPU core and on 1, 8, 64 GPUs (linear scaling assumed).

    Args:
        workload: :func:`disc21_workload`.
        cpu_costs: :func:`bench_model_costs` figures of the ViT-S/16 224 models (seconds per pass).
        gpu: ``{"descriptor_images_per_second", "encoder_views_per_second", "fusion_pairs_per_second",
            "source"}`` measured on a GPU (:func:`gpu_rates` of a :mod:`benchmarks.scale.gpu_throughput` record),
            optionally with ``"search_row_pairs_per_second"`` (exact search on the GPU: its hours then join the
            GPU totals, as a stage ``exact search``); ``None``: the published ViT-S/16 figure (:data:`PUBLISHED_VITS16_IMAGES_PER_SECOND`) for
            the descriptor, and for the encoder and fusion passes that figure scaled by their cost relative to
            a descriptor pass measured on this CPU.
        flat_seconds_per_row_pair: CPU seconds of exact search per (query row, index row) pair, from
            the ``faiss`` part (``flat`` search seconds / (queries x references)): a stage ``exact search``
            of the CPU hours (query views x reference and auxiliary views, linear in both).
    """
    descriptor = cpu_costs["descriptor_seconds_per_image"]
    cpu_seconds = {"descriptor": workload["descriptor_passes"] * descriptor,
                   "matcher encoder": workload["encoder_passes"] * cpu_costs["encoder_seconds_per_view"],
                   "matcher fusion": workload["fusion_passes"] * cpu_costs["fusion_seconds_per_pair"]}
    search_rows = workload["search_query_rows"] * workload["search_index_rows"]
    if flat_seconds_per_row_pair is not None:
        cpu_seconds["exact search"] = search_rows * flat_seconds_per_row_pair
    if gpu is None:
        rate = PUBLISHED_VITS16_IMAGES_PER_SECOND
        gpu = {"descriptor_images_per_second": rate,
               "encoder_views_per_second": rate * descriptor / cpu_costs["encoder_seconds_per_view"],
               "fusion_pairs_per_second": rate * descriptor / cpu_costs["fusion_seconds_per_pair"],
               "source": PUBLISHED_SOURCE + "; matcher encoder and fusion passes: that rate times the cost ratio "
                                            "of a descriptor pass to theirs measured on this CPU (ViT-S/16 224)"}
    gpu_seconds = {"descriptor": workload["descriptor_passes"] / gpu["descriptor_images_per_second"],
                   "matcher encoder": workload["encoder_passes"] / gpu["encoder_views_per_second"],
                   "matcher fusion": workload["fusion_passes"] / gpu["fusion_pairs_per_second"]}
    if gpu.get("search_row_pairs_per_second"):
        gpu_seconds["exact search"] = search_rows / gpu["search_row_pairs_per_second"]
    result = {"workload": workload, "gpu": gpu, "scaling": "linear in the number of GPUs (assumed, not measured)",
              "cpu_core_hours": {k: v / 3600 for k, v in cpu_seconds.items()},
              "one_gpu_hours": {k: v / 3600 for k, v in gpu_seconds.items()}}
    result["cpu_core_hours"]["total"] = sum(cpu_seconds.values()) / 3600
    total = sum(gpu_seconds.values())
    result["gpu_hours_total"] = {str(n): total / n / 3600 for n in gpu_counts}
    once = workload["encoder_passes_each_view_once"] / gpu["encoder_views_per_second"]
    result["gpu_hours_total_each_view_once"] = {
        str(n): (total - gpu_seconds["matcher encoder"] + once) / n / 3600 for n in gpu_counts}
    return result


def disc21_scenarios() -> dict:
    """The two DISC21 runs the estimate prices: ``copynce detect --preset paper`` as it is (``paper LCE``), and
    the same with ``--descriptor-lce none --matcher-lce none`` (``no LCE``: one view per image, one matcher
    pass per candidate with the encoder-token cache); both with 400 candidates and 1M auxiliary images."""
    counts = paper_preset_counts()
    whole_images = {"descriptor_query_views": 1, "descriptor_reference_views": 1, "matcher_query_views": 1,
                    "matcher_reference_views": 1, "view_pairs": 1}
    return {"paper LCE": disc21_workload(**counts),
            "no LCE": disc21_workload(candidates=counts["candidates"], **whole_images)}


def gpu_rates(record: dict, source: str) -> dict:
    """The rates :func:`disc21_estimate` takes, from a :mod:`benchmarks.scale.gpu_throughput` record
    (``gpu_throughput.json``) read from ``source``."""
    missing = [part for part in ("device", "inference", "search") if part not in record]
    if missing:
        raise ValueError(f"{source} is not a complete gpu_throughput.json: it lacks {', '.join(missing)}")
    inference = record["inference"]
    return {key: inference[key] for key in ("descriptor_images_per_second", "encoder_views_per_second",
                                            "fusion_pairs_per_second")} | {
        "search_row_pairs_per_second": record["search"]["row_pairs_per_second"],
        "source": f"measured on one {record['device']} ({record['precision']}, torch {record['machine']['torch']}, "
                  f"{record['created'][:10]}; {source})"}


# ---------------------------------------------------------------------------------------------- driver


def _flat_seconds_per_row_pair(faiss_part: dict) -> float | None:
    """CPU seconds of exact search per (query, reference) pair at the largest size measured."""
    sizes = [entry for entry in faiss_part.get("sizes", {}).values() if "flat" in entry.get("indexes", {})]
    if not sizes:
        return None
    entry = max(sizes, key=lambda e: e["references"])
    return entry["indexes"]["flat"]["search_cpu_seconds"] / (entry["queries"] * entry["references"])


def _duration(hours: float) -> str:
    """``hours`` as a readable duration: hours from one hour up, else minutes, else seconds."""
    if hours >= 100:
        return f"{hours:,.0f} h"
    if hours >= 10:
        return f"{hours:.1f} h"
    if hours >= 1:
        return f"{hours:.2f} h"
    return f"{60 * hours:.1f} min" if hours >= 1 / 60 else f"{3600 * hours:.0f} s"


def _estimate_lines(e: dict) -> list[str]:
    """One :func:`disc21_estimate` as Markdown: stage hours on one core and one GPU, then wall hours by GPU count."""
    w, gpu = e["workload"], e["gpu"]
    lines = ["| stage | passes | one CPU core | one GPU |", "|---|---|---|---|"]
    counts = {"descriptor": f"{w['descriptor_passes']:,}", "matcher encoder": f"{w['encoder_passes']:,}",
              "matcher fusion": f"{w['fusion_passes']:,}",
              "exact search": f"{w['search_query_rows']:,} x {w['search_index_rows']:,} rows"}
    cpu, one_gpu = e["cpu_core_hours"], e["one_gpu_hours"]
    for stage, count in counts.items():
        if stage in cpu or stage in one_gpu:
            lines.append(f"| {stage} | {count} | {_duration(cpu[stage]) if stage in cpu else '-'} | "
                         f"{_duration(one_gpu[stage]) if stage in one_gpu else '-'} |")
    lines.append(f"| total | | {_duration(cpu['total'])} | {_duration(e['gpu_hours_total']['1'])} |")
    lines += ["", "| GPUs | wall time (package as is) | wall time (each reference view encoded once) |",
              "|---|---|---|"]
    for count, hours in e["gpu_hours_total"].items():
        lines.append(f"| {count} | {_duration(hours)} | {_duration(e['gpu_hours_total_each_view_once'][count])} |")
    rates = (f"descriptor {gpu['descriptor_images_per_second']:,.0f} images/s, matcher encoder "
             f"{gpu['encoder_views_per_second']:,.0f} views/s, fusion {gpu['fusion_pairs_per_second']:,.0f} pairs/s")
    if gpu.get("search_row_pairs_per_second"):
        rates += f", exact search {gpu['search_row_pairs_per_second']:,.3g} (query, reference) row pairs/s"
    lines += ["", f"GPU rates: {rates} ({gpu['source']}); {e['scaling']}."]
    return lines


def markdown_tables(record: dict) -> str:
    """The ``faiss``, ``models`` and ``estimate`` parts of a ``scale.json`` record as Markdown tables."""
    lines, parts = [], record.get("parts", {})
    if "faiss" in parts:
        lines += ["| references | index | build (CPU s) | peak RSS after build / search (GiB) | search of all queries "
                  "(CPU s) | queries/s | found@1 | source in top k | top-1 = exact | overlap@10 |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for size, entry in sorted(parts["faiss"]["sizes"].items(), key=lambda item: int(item[0])):
            for kind, m in entry["indexes"].items():
                agreement = (f"{m['top1_agreement']:.3f} | {m['overlap_at_10']:.3f}" if "top1_agreement" in m
                             else "1 | 1")
                scaled = "" if m["searched_queries"] == entry["queries"] else f" ({m['searched_queries']:,} run)"
                lines.append(f"| {int(size):,} | {kind} (`{m['factory']}` {m['search_parameters']}) | "
                             f"{m['build_cpu_seconds']:.1f} | {m['peak_resident_mib_after_build'] / 1024:.2f} / "
                             f"{m['peak_resident_mib'] / 1024:.2f} | "
                             f"{m['search_cpu_seconds']:.0f}{scaled} | {m['queries_per_cpu_second']:.0f} | "
                             f"{m['found_at_1']:.3f} | {m['source_recall_at_k']:.3f} | {agreement} |")
        lines.append("")
    if "models" in parts:
        lines += ["| models | descriptor ms/image | matcher encoder ms/view | matcher fusion ms/pair "
                  "| whole matcher ms/pair (uncached) |", "|---|---|---|---|---|"]
        for name, m in parts["models"]["models"].items():
            lines.append(f"| {name} | {1e3 * m['descriptor_seconds_per_image']:.1f} | "
                         f"{1e3 * m['encoder_seconds_per_view']:.1f} | {1e3 * m['fusion_seconds_per_pair']:.1f} | "
                         f"{1e3 * m['uncached_seconds_per_pair']:.1f} |")
        lines.append("")
    if "estimate" in parts:
        for name, estimate in parts["estimate"]["scenarios"].items():
            lines += [f"**{name}**", "", *_estimate_lines(estimate), ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale.disc21", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, DISC21_REFERENCES],
                        help="faiss: reference counts")
    parser.add_argument("--kinds", nargs="+", default=list(INDEX_KINDS), choices=INDEX_KINDS,
                        help="faiss: index kinds (flat, the exact reference, always runs)")
    parser.add_argument("--queries", type=int, default=DISC21_QUERIES, help="faiss: queries searched")
    parser.add_argument("--k", type=int, default=400,
                        help="faiss: neighbours per query (copynce detect --preset paper: 400 candidates)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", default=["embedded", "vits16-224"], help="models: which to time")
    parser.add_argument("--batch-size", type=int, default=16, help="models: images or pairs per pass")
    parser.add_argument("--repeats", type=int, default=3, help="models: timed passes, the fastest kept")
    parser.add_argument("--faiss-from", type=Path, default=None,
                        help="estimate: a scale.json whose faiss part gives the exact-search rate (default: this "
                             "record's)")
    parser.add_argument("--gpu-json", type=Path, default=None,
                        help="estimate: gpu_throughput.json of benchmarks.scale.gpu_throughput (default: the published "
                             "ViT-S/16 figure)")
    parser.add_argument("--table", action="store_true", help="print the Markdown tables of the record and exit")
    parser.add_argument("--child", choices=INDEX_KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--child-data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-found", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-stride", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", type=json.loads, default={}, help=argparse.SUPPRESS)
    parser.add_argument("--hnsw-ef-construction", type=int, default=None,
                        help="faiss: the hnsw index's efConstruction (default: the package's)")
    parser.add_argument("--hnsw-ef-search", type=int, default=None,
                        help="faiss: the hnsw index's efSearch (default: the package's; a search for k neighbours "
                             "walks a beam of at least k)")
    parser.add_argument("--exact-queries", type=int, default=None,
                        help="faiss: exact search on this many of the queries (evenly spaced), its time scaled "
                             "to all (default: all)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.child:  # one index, measured in this fresh process; the result is the last line of stdout
        result = _measure_index(args.child, args.child_data, args.k, args.child_found, args.child_stride,
                                args.child_settings)
        print(json.dumps(result))
        return result
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    path = Path(args.output_dir) / "scale.json"
    record = read_json(path) if path.is_file() else {}
    if args.table:
        print(markdown_tables(record))
        return record
    record.update({"kind": "scale", "machine": machine_info(), "command": command_line(), "created": now()})
    record.setdefault("parts", {})

    def save() -> None:
        write_json(path, record)  # after every index and part: nothing measured is lost

    for part in args.parts:
        part_start = time.perf_counter()
        if part == "faiss":
            figures = record["parts"].setdefault("faiss", {"sizes": {}})
            figures["threads"] = 1
            for size in args.sizes:
                def keep(entry, size=size, figures=figures):
                    figures["sizes"][str(size)] = entry
                    save()

                hnsw_settings = {name: value for name, value in (("ef_construction", args.hnsw_ef_construction),
                                                                 ("ef_search", args.hnsw_ef_search))
                                 if value is not None}
                bench_faiss_scale(size, Path(args.output_dir) / "scale-work", args.queries, args.k,
                                  tuple(args.kinds), args.seed, args.exact_queries, on_result=keep,
                                  hnsw_settings=hnsw_settings)
        elif part == "models":
            figures = bench_model_costs(tuple(args.models), args.batch_size, args.repeats)
        else:
            if "vits16-224" not in record["parts"].get("models", {}).get("models", {}):
                raise SystemExit("the estimate needs the ViT-S/16 224 costs: run --parts models first")
            faiss_part = (read_json(args.faiss_from) if args.faiss_from else record)["parts"].get("faiss", {})
            gpu = gpu_rates(read_json(args.gpu_json), str(args.gpu_json)) if args.gpu_json else None
            cpu_costs = record["parts"]["models"]["models"]["vits16-224"]
            flat_rate = _flat_seconds_per_row_pair(faiss_part)
            figures = {"scenarios": {name: disc21_estimate(workload, cpu_costs, gpu, flat_seconds_per_row_pair=flat_rate)
                                     for name, workload in disc21_scenarios().items()}}
        figures["wall_seconds"] = time.perf_counter() - part_start
        figures["command"] = command_line()
        figures["created"] = now()
        record["parts"][part] = figures
        save()
    print(markdown_tables({"parts": {part: record["parts"][part] for part in args.parts}}))
    print(f"scale parts {args.parts} done -> {path}")
    return record


if __name__ == "__main__":
    main()
