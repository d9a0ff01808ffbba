"""Throughput of ViT-S/16 at 224 on one accelerator: inference passes, exact search, training steps, data.

    python -m benchmarks.scale.gpu_throughput --device cuda --output-dir $OUT            # about 3 minutes on an H100
    python -m benchmarks.scale.gpu_throughput --device cpu --image-size 32 --batch-size 2 --repeats 1 \\
        --search-references 1000 --search-queries 16 --train-steps 1 --train-batch 2 \\
        --workers 0 --loader-batches 1 --output-dir /tmp/gpu-throughput           # the CPU check (seconds)

One call measures, with the models of ``configs/descriptor_vits16_224.yaml`` and
``configs/matcher_vits16_224.yaml`` (random weights: the speed is the same) under ``--precision``
(bf16 autocast by default):

* ``inference`` (:func:`benchmarks.speed.model_costs.pass_costs`): descriptor images/s; the matcher's
  encoder views/s (the part its encoder-token cache runs once per image view) and fusion pairs/s
  (the part it runs per pair); from those, matcher pairs/s with the token cache when each pair
  brings one new reference image and its query is shared by ``--candidates`` pairs
  (``copynce detect --matcher-lce none``), candidates/s with the paper's LCE (35 fusion passes and
  10 reference views per candidate, 26 query views per query), and pairs/s of a whole matcher
  forward (no cache) for comparison;
* ``search``: exact inner-product top-``--k`` search on the device (``torch`` matrix product and
  ``topk`` over ``--search-references`` random unit 512-d rows, float32), queries/s;
* ``training``: optimiser steps/s and pairs/s of each config's model at its own batch (forward, loss,
  backward, AdamW: :func:`benchmarks.speed.dataloader.model_step_throughput`);
* ``data``: pairs/s the training data pipeline delivers with ``--workers`` DataLoader workers for
  each config's recipe and batch (:func:`benchmarks.speed.dataloader.loader_throughput`), beside the pairs/s
  the config's training step consumes.

Writes ``gpu_throughput.json`` and ``gpu_throughput.md`` (the tables) into ``--output-dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from ..common import DEFAULT_OUTPUT_DIR, command_line, machine_info, now, write_json
from ..speed.model_costs import load_cost_models, pass_costs, synchronize, vits16_options

__all__ = ["inference_rates", "search_rate", "training_rates", "markdown_report", "main"]

TRAINING_CONFIGS = ("descriptor_vits16_224.yaml", "matcher_vits16_224.yaml")
#: The matcher's paper LCE: view pairs per candidate, views per reference and per query (``copynce_hf.retrieval.descriptors.views``).
PAPER_VIEW_PAIRS, PAPER_REFERENCE_VIEWS, PAPER_QUERY_VIEWS = 35, 10, 26


def inference_rates(device: str, precision: str, batch_size: int, repeats: int, candidates: int,
                    image_size: int | None = None) -> dict:
    """Items per second of each inference pass of the ViT-S/16 models, and the matcher rates they imply."""
    descriptor, matcher = load_cost_models("vits16-224", image_size)
    costs = pass_costs(descriptor, matcher, batch_size, repeats, device, precision)
    encoder, fusion = costs["encoder_seconds_per_view"], costs["fusion_seconds_per_pair"]
    return {
        "descriptor_images_per_second": 1.0 / costs["descriptor_seconds_per_image"],
        "encoder_views_per_second": 1.0 / encoder,
        "fusion_pairs_per_second": 1.0 / fusion,
        "cached_pairs_per_second": 1.0 / (fusion + encoder + encoder / candidates),
        "paper_lce_candidates_per_second": 1.0 / (PAPER_VIEW_PAIRS * fusion + PAPER_REFERENCE_VIEWS * encoder
                                                  + PAPER_QUERY_VIEWS * encoder / candidates),
        "uncached_pairs_per_second": 1.0 / costs["uncached_seconds_per_pair"],
        "candidates_per_query": candidates,
        "costs": costs,
    }


def search_rate(device: str, references: int, queries: int, k: int, dim: int = 512, chunk: int = 1024,
                repeats: int = 3) -> dict:
    """Queries per second of exact top-``k`` inner-product search over ``references`` unit rows on ``device``."""
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    database = torch.nn.functional.normalize(torch.randn(references, dim, generator=generator), dim=1).to(device)
    batch = torch.nn.functional.normalize(torch.randn(queries, dim, generator=generator), dim=1).to(device)
    k = min(k, references)

    def search():
        for start in range(0, queries, chunk):
            torch.topk(batch[start:start + chunk] @ database.T, k, dim=1)

    search()  # warm-up
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        search()
        synchronize(device)
        times.append(time.perf_counter() - start)
    seconds = min(times)
    return {"references": references, "queries": queries, "k": k, "dim": dim, "dtype": "float32",
            "queries_per_second": queries / seconds,
            "row_pairs_per_second": queries * references / seconds}


def training_rates(device: str, precision: str, steps: int, workers: list[int], loader_batches: int,
                   batch_size: int | None = None, image_size: int | None = None,
                   image_folder: str | None = None) -> dict:
    """Steps/s of each training config's model and the data pipeline's pairs/s for its batch and recipe."""
    from ..speed.dataloader import load_originals, loader_throughput, model_step_throughput, training_config

    images, source = load_originals(200, image_folder)  # the data benchmark's default count
    result = {"images": f"{len(images)} originals from {source}", "configs": {}}
    for name in TRAINING_CONFIGS:
        config = training_config(name)
        if image_size is not None:
            config = dataclasses.replace(config, model=vits16_options(name, image_size))
        pairs = batch_size or config.pairs_per_batch
        consumed = model_step_throughput(config, pairs, steps, device, precision)
        size, patch = config.model["image_size"], config.model["patch_size"]
        delivered = {str(w): loader_throughput(images, size, patch, w, pairs, loader_batches, config.query_recipe,
                                               config.reference_recipe) for w in workers}
        result["configs"][name] = {"model_type": config.model_type, "pairs_per_step": pairs,
                                   "query_recipe": config.query_recipe, "steps_per_second": consumed / pairs,
                                   "pairs_per_second": consumed, "loader_pairs_per_second": delivered}
    return result


def markdown_report(record: dict) -> str:
    """The record's figures as Markdown tables."""
    inference, search, training = record["inference"], record["search"], record["training"]
    lines = [f"Device: {record['device']}; precision {record['precision']}; torch {record['machine']['torch']}.", "",
             "| inference (ViT-S/16 at 224) | per second |", "|---|---|",
             f"| descriptor images | {inference['descriptor_images_per_second']:,.0f} |",
             f"| matcher encoder views (once per image view) | {inference['encoder_views_per_second']:,.0f} |",
             f"| matcher fusion pairs (per pair) | {inference['fusion_pairs_per_second']:,.0f} |",
             f"| matcher pairs with the token cache ({inference['candidates_per_query']} candidates per query, "
             f"each reference new) | {inference['cached_pairs_per_second']:,.0f} |",
             f"| matcher candidates with the paper's LCE (35 view pairs) | "
             f"{inference['paper_lce_candidates_per_second']:,.0f} |",
             f"| whole matcher pairs (no cache) | {inference['uncached_pairs_per_second']:,.0f} |",
             f"| exact search queries (top {search['k']} of {search['references']:,}, float32) | "
             f"{search['queries_per_second']:,.0f} |", "",
             "| training config | pairs per step | steps/s | pairs/s consumed | pipeline pairs/s by workers |",
             "|---|---|---|---|---|"]
    for name, entry in training["configs"].items():
        delivered = ", ".join(f"{w}: {rate:,.0f}" for w, rate in entry["loader_pairs_per_second"].items())
        lines.append(f"| {name} ({entry['query_recipe']}) | {entry['pairs_per_step']} | "
                     f"{entry['steps_per_second']:.2f} | {entry['pairs_per_second']:,.0f} | {delivered} |")
    lines += ["", f"Images for the pipeline: {training['images']}."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale.gpu_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16", choices=["no", "bf16"])
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--image-size", type=int, default=None, help="run the models at this size (tests)")
    parser.add_argument("--batch-size", type=int, default=256, help="inference: images or pairs per pass")
    parser.add_argument("--repeats", type=int, default=10, help="inference and search: timed passes, fastest kept")
    parser.add_argument("--candidates", type=int, default=400, help="inference: candidates sharing a query")
    parser.add_argument("--search-references", type=int, default=1_000_000)
    parser.add_argument("--search-queries", type=int, default=8192)
    parser.add_argument("--k", type=int, default=400, help="search: neighbours per query")
    parser.add_argument("--train-steps", type=int, default=10, help="training: timed optimiser steps per config")
    parser.add_argument("--train-batch", type=int, default=None, help="training: pairs per step (default: config)")
    parser.add_argument("--workers", type=int, nargs="+", default=[16], help="data: DataLoader workers")
    parser.add_argument("--loader-batches", type=int, default=10, help="data: timed batches per setting (rounded up to whole rounds of the workers, at least 3)")
    parser.add_argument("--image-folder", default=None, help="data: a folder of originals (default: those of benchmarks.speed.dataloader)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    device = torch.device(args.device)
    record = {"kind": "gpu_throughput", "machine": machine_info(), "command": command_line(), "created": now(),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "precision": args.precision}
    output = Path(args.output_dir)

    def measured(part: str, value: dict) -> None:  # written after each part: a cut-short call keeps the rest
        record[part] = value
        if device.type == "cuda":
            record["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        record["wall_seconds"] = time.perf_counter() - started
        write_json(output / "gpu_throughput.json", record)

    measured("inference", inference_rates(args.device, args.precision, args.batch_size, args.repeats,
                                          args.candidates, args.image_size))
    measured("search", search_rate(args.device, args.search_references, args.search_queries, args.k,
                                   repeats=args.repeats))
    measured("training", training_rates(args.device, args.precision, args.train_steps, args.workers,
                                        args.loader_batches, args.train_batch, args.image_size, args.image_folder))
    report = markdown_report(record)
    (output / "gpu_throughput.md").write_text(report, encoding="utf-8")
    print(report)
    return record


if __name__ == "__main__":
    main()
