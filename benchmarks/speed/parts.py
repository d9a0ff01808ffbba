"""Speed benchmark: each figure measured side by side with its reference, in one run, on this machine.

    python -m benchmarks.speed.parts                                  # every part, faiss at 100k and 1M
    python -m benchmarks.speed.parts --parts pixtrace faiss --faiss-sizes 100000

Parts (``--parts``):

* ``pixtrace``: per training pair, the two tables and both overlap priors (query->reference and
  reference->query) of a 500x375 original, query made by a five-edit geometric chain of catalogue
  edits (random resized crop, rotation with expand, affine, perspective, horizontal flip) then
  resized to 224x224, reference resized to 224x224, 16-pixel patches; pixel work excluded. PixTrace
  (``edit.trace`` + ``pair_overlaps``) against :mod:`benchmarks.speed.dense_tables` (full-resolution
  tables warped at every step, scatter inverse at the reference's resolution, as the paper's
  reference code). CPU time of this process, one thread. Also the two implementations' agreement.
* ``data``: pairs per second of the training data pipeline (:mod:`benchmarks.speed.dataloader`'s
  ``loader_throughput`` and per-stage ``compare_paths``) on the ``train`` split, at 224 and 112:
  for the training recipe and the paper's two, fused rendering against edit by edit on the same
  pairs in alternated rounds (CPU time, one thread, fastest round of each).
* ``extraction``: images per second of a forward pass of ``CopyNCEDescriptorModel`` against a bare
  ``transformers.ViTModel`` of the same size (same batch, alternated repetitions; our overhead),
  for the benchmark ViT and ViT-S/16 at 224; plus end-to-end ``extract_descriptors`` images per
  second (image processing and batching included) for the benchmark ViT.
* ``faiss``: queries per second of k=10 search over N random 512-d unit vectors, exact
  (``flat``) against the approximate indexes of :mod:`copynce_hf.retrieval.search.index` (``hnsw``,
  ``ivfpq``), with build time and recall@10 (overlap with the exact top-10). Queries are noisy
  copies of database vectors (cosine about 0.7 to their source), as copy-detection queries are;
  ``found@1`` is the share whose source is ranked first.

The results go to ``<output-dir>/speed.json`` (updated after every part).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from pathlib import Path

import numpy as np

from ..common import (
    DEFAULT_OUTPUT_DIR,
    command_line,
    limit_threads,
    machine_info,
    now,
    read_json,
    write_json,
)

logger = logging.getLogger("benchmarks.speed.parts")

__all__ = ["pixtrace_chain", "bench_pixtrace", "bench_data", "bench_extraction", "bench_faiss", "main"]

PARTS = ("pixtrace", "data", "extraction", "faiss")
ORIGINAL = (375, 500)
PAIR_SIZE = (224, 224)
PATCH = 16


# ---------------------------------------------------------------------------------------------- PixTrace


def pixtrace_chain(rng: np.random.Generator, size: tuple[int, int] = ORIGINAL):
    """Five catalogue geometric edits drawn from ``rng`` plus the final resize to 224x224."""
    from copynce_hf.pixtrace.edits import (
        Affine,
        HorizontalFlip,
        Perspective,
        RandomResizedCrop,
        Resize,
        Rotate,
    )

    crop = RandomResizedCrop.draw(rng, size, (300, 300), scale=(0.3, 1.0))
    rotate = Rotate(degrees=float(rng.uniform(-30, 30)), expand=True)
    height, width = rotate.stages((300, 300))[-1][1]
    affine = Affine(angle=0.0, scale=float(rng.uniform(0.8, 1.2)), shear=(float(rng.uniform(-10, 10)), 0.0))
    right, bottom = width - 1.0, height - 1.0
    start = ((0.0, 0.0), (right, 0.0), (right, bottom), (0.0, bottom))
    signs = ((1, 1), (-1, 1), (-1, -1), (1, -1))
    end = tuple((x + sx * float(rng.uniform(0, 0.2 * right / 2)), y + sy * float(rng.uniform(0, 0.2 * bottom / 2)))
                for (x, y), (sx, sy) in zip(start, signs))
    return [crop, rotate, affine, Perspective(start, end), HorizontalFlip(), Resize(*PAIR_SIZE)]


def _pixtrace_pair(query_edits, reference_edits):
    from copynce_hf.pixtrace import CoordinateTable, pair_overlaps

    query = CoordinateTable.identity(*ORIGINAL)
    for edit in query_edits:
        query = edit.trace(query)
    reference = CoordinateTable.identity(*ORIGINAL)
    for edit in reference_edits:
        reference = edit.trace(reference)
    return pair_overlaps(query, reference, PATCH)


def _cpu_ms_per_call(function, items) -> float:
    function(*items[0])  # warm caches
    start = time.process_time()
    for item in items:
        function(*item)
    return (time.process_time() - start) / len(items) * 1e3


def bench_pixtrace(pairs: int = 200, seed: int = 0, rounds: int = 10) -> dict:
    """Milliseconds of CPU per pair: PixTrace vs the dense full-resolution reference implementation.

    The pairs are timed in ``rounds`` alternated rounds; the headline figure of each implementation
    is its fastest round (load on a shared machine only ever adds time), the median is kept beside it.
    """
    import torch

    from copynce_hf.pixtrace.edits import Resize

    from . import dense_tables

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    items = [(pixtrace_chain(rng), [Resize(*PAIR_SIZE)]) for _ in range(pairs)]
    dense_items = [(q, r, ORIGINAL, PATCH) for q, r in items[: max(20, pairs // 5)]]
    # Alternate the two implementations in rounds, so that a change of machine load hits both.
    pixtrace_ms, dense_ms = [], []
    chunk = max(1, len(items) // rounds)
    dense_chunk = max(1, len(dense_items) // rounds)
    for round_ in range(rounds):
        pixtrace_ms.append(_cpu_ms_per_call(_pixtrace_pair, items[round_ * chunk: (round_ + 1) * chunk] or items))
        dense_ms.append(_cpu_ms_per_call(dense_tables.pair_priors,
                                         dense_items[round_ * dense_chunk: (round_ + 1) * dense_chunk] or dense_items))
    # Agreement: the priors of both implementations on the same pairs.
    differences, traced = [], {"pixtrace": [], "dense": []}
    for query_edits, reference_edits in items[:20]:
        fast_qr, _ = _pixtrace_pair(query_edits, reference_edits)
        slow_qr, _ = dense_tables.pair_priors(query_edits, reference_edits, ORIGINAL, PATCH)
        differences.append(float(np.abs(fast_qr - slow_qr).sum(1).mean()))
        traced["pixtrace"].append(float(fast_qr.sum(1).mean()))
        traced["dense"].append(float(slow_qr.sum(1).mean()))
    result = {
        "setting": f"original {ORIGINAL[1]}x{ORIGINAL[0]}, query: random resized crop (300x300), rotation "
                   f"(expand), affine, perspective, horizontal flip, resize {PAIR_SIZE[1]}x{PAIR_SIZE[0]}; "
                   f"reference: resize; patch {PATCH}; 2 tables + 2 overlap priors per pair; CPU time, 1 thread",
        "pairs": {"pixtrace": len(items), "dense": len(dense_items)},
        "pixtrace_ms_per_pair": min(pixtrace_ms),
        "dense_ms_per_pair": min(dense_ms),
        "median_ms_per_pair": {"pixtrace": statistics.median(pixtrace_ms), "dense": statistics.median(dense_ms)},
        "rounds_ms": {"pixtrace": pixtrace_ms, "dense": dense_ms},
        "mean_l1_row_difference_qr": statistics.mean(differences),
        "mean_traced_share_qr": {k: statistics.mean(v) for k, v in traced.items()},
    }
    result["speedup"] = result["dense_ms_per_pair"] / result["pixtrace_ms_per_pair"]
    return result


# ---------------------------------------------------------------------------------------------- data


def bench_data(train_folder: Path, sizes=((224, 16), (112, 8)), workers=(0, 1, 2), batch_size: int = 32,
               batches: int = 4, split_pairs: int = 32, rounds: int = 3,
               recipes=("training", "paper_descriptor", "paper_matcher")) -> dict:
    """Pairs per second of the training data pipeline (functions of :mod:`benchmarks.speed.dataloader`):
    per query recipe, the per-stage split with fused rendering and edit by edit (same pairs, alternated
    rounds, fastest round each, one thread), then the DataLoader with 0..N workers."""
    import cv2
    import torch

    from copynce_hf.data import load_image_dataset

    from . import dataloader

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    images = load_image_dataset(train_folder)
    result = {"source": f"{len(images)} train-split images", "batch_size": batch_size, "split_pairs": split_pairs,
              "rounds": rounds, "timing": "CPU time of one process, 1 torch/OpenCV thread, fastest of the "
                                         "alternated rounds", "sizes": {}}
    for size, patch in sizes:
        split = dataloader.compare_paths(images, size, patch, split_pairs, recipes, rounds)
        rates = {str(w): dataloader.loader_throughput(images, size, patch, w, batch_size, batches) for w in workers}
        result["sizes"][f"{size}/{patch}"] = {"split": split, "loader_pairs_per_second": rates}
        for recipe, entry in split.items():
            logger.info("data %dx%d %s: fused %.1f pairs/s (edit %.2f ms), edit by edit %.1f pairs/s (edit %.2f ms)",
                        size, size, recipe, entry["fused"]["pairs_per_second"], entry["fused"]["ms_per_pair"]["edit"],
                        entry["edit_by_edit"]["pairs_per_second"], entry["edit_by_edit"]["ms_per_pair"]["edit"])
        logger.info("data %dx%d loader: %s pairs/s", size, size, {k: round(v, 1) for k, v in rates.items()})
    return result


# ---------------------------------------------------------------------------------------------- extraction


def _alternated_rates(workloads: dict, repeats: int) -> dict[str, float]:
    """Items per second of each workload ``name -> (callable, items)``, under ``torch.inference_mode``,
    alternating the workloads at every repetition (so that a change of machine load hits all of them)
    and taking each one's fastest repetition (load on a shared machine only ever adds time)."""
    import torch

    times = {name: [] for name in workloads}
    with torch.inference_mode():
        for function, _ in workloads.values():  # warm-up
            function()
        for _ in range(repeats):
            for name, (function, _) in workloads.items():
                start = time.perf_counter()
                function()
                times[name].append(time.perf_counter() - start)
    return {name: workloads[name][1] / min(values) for name, values in times.items()}


def bench_extraction(batch_size: int = 32, repeats: int = 5, sizes: dict | None = None) -> dict:
    """Our descriptor's forward vs a bare ``ViTModel`` of the same size, and end-to-end extraction.

    For every size: ``CopyNCEDescriptorModel(pixel_values)`` against ``ViTModel(pixel_values)``
    (same random batch, no pooler, same attention kernel family) and ``extract_descriptors`` over
    ``batch_size`` decoded 500x375 images (``CopyNCEImageProcessor``, DataLoader batching, forward,
    gathering), alternated repetition by repetition. Overhead = ViT rate / our rate - 1.
    """
    import torch
    from PIL import Image
    from transformers import ViTConfig, ViTModel

    from copynce_hf.modeling import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor
    from copynce_hf.retrieval import ImageListSource, extract_descriptors

    sizes = sizes or {
        "bench ViT (192 wide, 6 blocks, 112/8)": dict(hidden_size=192, num_hidden_layers=6, num_attention_heads=3,
                                                      intermediate_size=768, image_size=112, patch_size=8),
        "ViT-S/16 at 224": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                intermediate_size=1536, image_size=224, patch_size=16),
    }
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, size=(375, 500, 3), dtype=np.uint8))
    source = ImageListSource([f"img{i}" for i in range(batch_size)], [lambda: image] * batch_size)
    result = {"batch_size": batch_size, "torch_threads": torch.get_num_threads(), "repeats": repeats, "models": {},
              "end_to_end_setting": f"extract_descriptors over {batch_size} decoded 500x375 images (image "
                                    f"processor, DataLoader with 0 workers, forward, gathering)"}
    for label, vit in sizes.items():
        torch.manual_seed(0)
        ours = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**vit, descriptor_dim=512)).eval()
        bare = ViTModel(ViTConfig(**vit, layer_norm_eps=1e-6, qkv_bias=True), add_pooling_layer=False).eval()
        processor = CopyNCEImageProcessor(size={"height": vit["image_size"], "width": vit["image_size"]})
        pixel_values = torch.randn(batch_size, 3, vit["image_size"], vit["image_size"])
        rates = _alternated_rates({
            "copynce": (lambda m=ours, x=pixel_values: m(pixel_values=x), batch_size),
            "vit": (lambda m=bare, x=pixel_values: m(pixel_values=x), batch_size),
            "extraction": (lambda m=ours, p=processor: extract_descriptors(m, p, source, batch_size=batch_size,
                                                                           progress=False), batch_size),
        }, repeats)
        entry = {"config": vit, "copynce_images_per_second": rates["copynce"], "vit_images_per_second": rates["vit"],
                 "overhead_percent": 100.0 * (rates["vit"] / rates["copynce"] - 1.0),
                 "end_to_end_images_per_second": rates["extraction"],
                 "vit_attn_implementation": getattr(bare.config, "_attn_implementation", None)}
        result["models"][label] = entry
        logger.info("extraction %s: ours %.1f img/s, ViTModel %.1f img/s (overhead %.1f %%), end to end %.1f img/s",
                    label, rates["copynce"], rates["vit"], entry["overhead_percent"], rates["extraction"])
    return result


# ---------------------------------------------------------------------------------------------- faiss


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


#: Search-time settings timed on each built index: the package defaults and a higher-recall point.
SEARCH_SETTINGS = {
    "flat": {"default": {}},
    "hnsw": {"default": {}, "efSearch 512": {"ef_search": 512}},
    "ivfpq": {"default": {}, "nprobe 256, k_factor 32": {"nprobe": 256, "k_factor": 32}},
}


def bench_faiss(sizes=(100_000, 1_000_000), dim: int = 512, num_queries: int = 1000, k: int = 10,
                kinds=("hnsw", "ivfpq"), seed: int = 0, noise: float = 1.0, hnsw_max_size: int = 200_000) -> dict:
    """Queries per second of exact vs approximate k-NN, with recall@10 against the exact result.

    ``noise`` is the norm of the Gaussian perturbation (relative to the unit source vector) that
    turns a database vector into its query: 1.0 gives a cosine of about 0.7 to the source.
    HNSW is built only up to ``hnsw_max_size`` vectors (its build on two cores takes about a minute
    per 100k and grows faster than linearly); larger sizes record why it is missing.
    """
    import faiss

    from copynce_hf.retrieval import DescriptorIndex, DescriptorSet, IndexConfig

    rng = np.random.default_rng(seed)
    result = {"dim": dim, "num_queries": num_queries, "k": k, "faiss_threads": faiss.omp_get_max_threads(),
              "query_model": f"unit(database vector + N(0, ({noise}^2/{dim}) I))", "sizes": {}}
    for size in sizes:
        database = _unit(rng.standard_normal((size, dim), dtype=np.float32))
        sources = rng.integers(0, size, num_queries)
        queries = _unit(database[sources] + noise / math.sqrt(dim) * rng.standard_normal((num_queries, dim),
                                                                                           dtype=np.float32))
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        references = DescriptorSet([str(i) for i in range(size)], database)
        entry, exact_top = {}, None
        for kind in ("flat", *kinds):
            if kind == "hnsw" and size > hnsw_max_size:
                entry[kind] = {"skipped": f"HNSW not built above {hnsw_max_size:,} vectors (build time)"}
                continue
            start = time.perf_counter()
            index = DescriptorIndex.build(references, IndexConfig(kind=kind))
            build = time.perf_counter() - start
            for label, overrides in SEARCH_SETTINGS[kind].items():
                if overrides:
                    index.set_search_parameters(**overrides)
                index.search(queries[:10], k)  # warm-up
                start = time.perf_counter()
                _, found = index.search(queries, k)
                seconds = time.perf_counter() - start
                if exact_top is None:
                    exact_top = found
                recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, exact_top)]))
                name = kind if label == "default" else f"{kind} ({label})"
                entry[name] = {"build_seconds": build, "queries_per_second": num_queries / seconds,
                               "recall_at_10": recall, "found_at_1": float(np.mean(found[:, 0] == sources)),
                               "factory": index.config.factory_string(size, dim),
                               "search_parameters": index.config.search_parameters()}
                logger.info("faiss N=%d %s: build %.1f s, %.0f queries/s, recall@10 %.3f", size, name, build,
                            entry[name]["queries_per_second"], recall)
            del index
        result["sizes"][str(size)] = entry
        del database, references
    return result


# ---------------------------------------------------------------------------------------------- driver


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed.parts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--pairs", type=int, default=200, help="pixtrace: pairs timed (dense: a fifth, >= 20)")
    parser.add_argument("--faiss-sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--faiss-kinds", nargs="+", default=["hnsw", "ivfpq"], choices=["hnsw", "ivfpq"])
    parser.add_argument("--faiss-queries", type=int, default=1000)
    parser.add_argument("--faiss-hnsw-max-size", type=int, default=200_000,
                        help="largest database an HNSW index is built for")
    parser.add_argument("--batch-size", type=int, default=32, help="extraction and data batch size")
    parser.add_argument("--repeats", type=int, default=5, help="extraction: timed forward passes per model")
    parser.add_argument("--data-batches", type=int, default=4)
    parser.add_argument("--data-pairs", type=int, default=32, help="data: pairs per timed round of the stage split")
    parser.add_argument("--data-rounds", type=int, default=3, help="data: alternated fused / edit-by-edit rounds")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch/faiss threads for the extraction and faiss parts (default: library default)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    path = Path(args.output_dir) / "speed.json"
    record = read_json(path) if path.is_file() else {}
    record.update({"kind": "speed", "machine": machine_info(), "command": command_line(), "created": now()})
    record.setdefault("parts", {})
    started = time.perf_counter()
    for part in args.parts:
        part_start = time.perf_counter()
        if part == "pixtrace":
            figures = bench_pixtrace(args.pairs)
            print(f"PixTrace: {figures['pixtrace_ms_per_pair']:.2f} ms/pair vs dense full-resolution warping "
                  f"{figures['dense_ms_per_pair']:.2f} ms/pair ({figures['speedup']:.1f}x)")
        elif part == "data":
            from ..minidisc import SHARED_DATA
            from ..training.train import prepare_train_split

            folder = prepare_train_split(Path(args.output_dir), SHARED_DATA / "imagenet-sample",
                                         SHARED_DATA / "imagenet-sample-splits.csv")
            figures = bench_data(folder, batch_size=args.batch_size, batches=args.data_batches,
                                 split_pairs=args.data_pairs, rounds=args.data_rounds)
        else:
            limit_threads(args.threads)
            if part == "extraction":
                figures = bench_extraction(args.batch_size, args.repeats)
            else:
                figures = bench_faiss(tuple(args.faiss_sizes), num_queries=args.faiss_queries,
                                      kinds=tuple(args.faiss_kinds), hnsw_max_size=args.faiss_hnsw_max_size)
        figures["wall_seconds"] = time.perf_counter() - part_start
        figures["command"] = command_line()
        figures["created"] = now()
        record["parts"][part] = figures
        write_json(path, record)  # after every part: nothing measured is lost
    print(f"speed parts {args.parts} done in {time.perf_counter() - started:.0f} s -> {path}")
    return record


if __name__ == "__main__":
    main()
