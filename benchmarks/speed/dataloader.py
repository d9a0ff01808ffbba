"""Throughput of the training data pipeline: copy pairs per second, and where the time goes.

``python -m benchmarks.speed.dataloader`` or its script ``scripts/bench_dataloader.py`` (the same options)::

    python scripts/bench_dataloader.py                      # 224x224, 0/1/2 workers, ../shared/data train split
    python scripts/bench_dataloader.py --image_size 112 --patch_size 8 --recipes training paper_descriptor
    python scripts/bench_dataloader.py --image_size 64 --workers 0 2 --model_step   # vs the tiny CPU model
    python scripts/bench_dataloader.py --config descriptor_vits16_224.yaml --device cuda --precision bf16 \
        --skip_split --workers 0 4 8 15 --model_step     # does the pipeline feed a GPU training ViT-S/16?

Two measurements:

1. Time split, in one process and one thread, per pair (CPU time of this process): ``decode``
   (reading the original with ``load_image``, JPEGs in draft mode down to the maker's
   ``max_source_side``), ``edit`` (shrinking the original to at most 4x the model size, the query's
   recipe chain and the reference's off recipe (no random edit), both ending with the resize to the model size,
   tables included; ``draw`` beside it: the chains' random draws alone, ``CopyEditor.draw``, the
   part of editing that fused rendering cannot shorten), ``trace`` (both overlap priors,
   ``pair_overlaps``), ``collate`` (the collator's uint8 batch tensors; ``collate_float`` beside
   it: the previous per-pair float32 normalisation on the CPU, for comparison). For each query
   recipe (``--recipes``) the same pairs are timed with fused rendering (``fuse=True``, the
   default) and edit by edit (``fuse=False``), in alternated rounds; each path's figures are its
   fastest round (load from other jobs only ever adds time).
2. End to end: a ``DataLoader`` over :class:`CopyPairDataset` with the :class:`PixTraceCollator`
   and 0, 1, 2 workers, pairs per second after a warm-up batch per worker, timed over whole rounds of
   the workers (at least three; :func:`delivered_per_second`) (training recipe, fused).

With ``--config <training config>`` the image size, patch size, batch (pairs per step: twice the
slots with ``hard_negative_slots``) and the query and reference recipes of the loader are the
config's. With ``--model_step``, also the pairs per second one optimiser step of that config's model
consumes (forward, loss, backward, AdamW; uint8 batches already on ``--device``, normalised there as
in training; ``--precision bf16`` under autocast), to tell whether the pipeline or the model is the
bottleneck (default config: ``configs/tiny_cpu.yaml``). The model is freshly initialised
(``init_from_dino`` is ignored: the speed is the same).
Images: ``--image_folder`` when given, else the ``train`` split of ``../shared/data/imagenet-sample``
when present (median 500x375), else the bundled sample images; with ``--min_long_side N`` only
those whose longer side is at least N pixels (at 224, N = 896 selects the originals that draft
decoding and the shrink to ``max_source_side`` reduce, as most photographs are).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from copynce_hf.data import (
    CopyPairBatchSampler,
    CopyPairDataset,
    CopyPairMaker,
    PixTraceCollator,
    load_image_dataset,
)
from copynce_hf.images import load_image
from copynce_hf.pixtrace import pair_overlaps
from copynce_hf.training.model import build_model
from copynce_hf.training.options import parse_args

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"


def _long_side(path) -> int:
    with Image.open(path) as handle:  # the header only
        return max(handle.size)


def load_originals(limit: int, image_folder: str | None = None, min_long_side: int = 0):
    """Up to ``limit`` originals (an image dataset) whose longer side is at least ``min_long_side``,
    and a line that says where they come from."""
    if image_folder:
        images = load_image_dataset(image_folder)
        if min_long_side:
            keep = [i for i, row in enumerate(images) if _long_side(row["image"]["path"]) >= min_long_side]
            images = images.select(keep)
        return images.select(range(min(limit, len(images)))), image_folder
    splits = SHARED / "imagenet-sample-splits.csv"
    if splits.exists():
        with splits.open(newline="") as handle:
            names = [row["filename"] for row in csv.DictReader(handle) if row["split"] == "train"]
        if min_long_side:
            names = [name for name in names if _long_side(SHARED / "imagenet-sample" / name) >= min_long_side]
        # A folder of links per selection (load_image_dataset reads a folder).
        folder = Path("/tmp/copynce_bench_images") / f"train-{limit}-from-{min_long_side}"
        folder.mkdir(parents=True, exist_ok=True)
        for name in names[:limit]:
            link = folder / name
            if not link.exists():
                link.symlink_to(SHARED / "imagenet-sample" / name)
        where = "../shared/data/imagenet-sample (train split"
        return load_image_dataset(folder), where + (f", longer side >= {min_long_side})" if min_long_side else ")")
    return load_image_dataset(None), "bundled sample images (copynce_hf/assets/images)"


def time_split(images, size: int, patch: int, count: int, seed: int = 0, recipe: str = "training",
               fuse: bool = True) -> dict[str, float]:
    """Milliseconds of CPU per pair of each stage, measured in this process (one core)."""
    maker = CopyPairMaker(size, query_recipe=recipe, fuse=fuse)
    collator = PixTraceCollator(size, patch)
    totals = dict.fromkeys(("decode", "edit", "trace", "draw"), 0.0)
    pairs = []
    for position in range(count):
        row = images[position % len(images)]
        start = time.process_time()
        original = load_image(row["image"]["path"] or row["image"]["bytes"], max_side=maker.max_source_side)
        decoded = time.process_time()
        original = maker.source(original)  # shrunk to 4 x the model size if larger
        query, query_table, _ = maker.copy(original, recipe, seed + 2 * position)
        reference, reference_table, _ = maker.copy(original, "off", seed + 2 * position + 1)
        edited = time.process_time()
        pair_overlaps(query_table, reference_table, patch)
        traced = time.process_time()
        # The random draws of both chains again, alone (no pixel work): the part of "edit" that
        # both paths do alike, which fused rendering cannot shorten.
        maker.editor(recipe).draw(original.size[::-1], seed + 2 * position)
        maker.editor("off").draw(original.size[::-1], seed + 2 * position + 1)
        totals["draw"] += time.process_time() - traced
        totals["decode"] += decoded - start
        totals["edit"] += edited - decoded
        totals["trace"] += traced - edited
        pairs.append((query, reference))
    start = time.process_time()
    collator.stack_images([q for q, _ in pairs]), collator.stack_images([r for _, r in pairs])
    totals["collate"] = time.process_time() - start
    split = {stage: 1000 * value / count for stage, value in totals.items()}
    # The previous collation, for comparison (not part of the total): float32 normalised per pair.
    scale = (1.0 / (255.0 * np.asarray(collator.image_std, dtype=np.float32))).reshape(3, 1, 1)
    offset = (-np.asarray(collator.image_mean, dtype=np.float32) / np.asarray(collator.image_std, dtype=np.float32))
    start = time.process_time()
    for images_ in ([q for q, _ in pairs], [r for _, r in pairs]):
        arrays = [np.asarray(image).transpose(2, 0, 1).astype(np.float32) * scale + offset.reshape(3, 1, 1)
                  for image in images_]
        torch.from_numpy(np.stack(arrays))
    split["collate_float"] = 1000 * (time.process_time() - start) / count
    return split


STAGES = ("decode", "edit", "trace", "collate")


def compare_paths(images, size: int, patch: int, count: int, recipes=("training",), rounds: int = 3,
                  seed: int = 0) -> dict:
    """Per recipe, the per-stage split of fused and edit-by-edit rendering on the same pairs.

    The two paths alternate in ``rounds`` rounds (so that a change of machine load hits both); each
    path's figures are its fastest round by total (``STAGES``), the other rounds' totals kept beside.
    """
    result = {}
    for recipe in recipes:
        for fuse in (True, False):  # warm-up: lazy imports, caches (fonts, emoji), first-call costs
            time_split(images, size, patch, min(count, 4), seed + 10_000, recipe, fuse)
        rounds_ms = {"fused": [], "edit_by_edit": []}
        for _ in range(rounds):
            for path, fuse in (("fused", True), ("edit_by_edit", False)):
                rounds_ms[path].append(time_split(images, size, patch, count, seed, recipe, fuse))
        entry = {}
        for path, splits in rounds_ms.items():
            best = min(splits, key=lambda split: sum(split[s] for s in STAGES))
            total = sum(best[s] for s in STAGES)
            entry[path] = {"ms_per_pair": best, "total_ms": total, "pairs_per_second": 1000.0 / total,
                           "round_totals_ms": [sum(split[s] for s in STAGES) for split in splits]}
        fused, reference = entry["fused"]["ms_per_pair"], entry["edit_by_edit"]["ms_per_pair"]
        entry["edit_ratio"] = fused["edit"] / reference["edit"]
        # The pixel work alone: the edit stage less the chains' draws (the same in both paths).
        rendering = (max(fused["edit"] - fused["draw"], 0.0), max(reference["edit"] - reference["draw"], 1e-9))
        entry["render_ratio"] = rendering[0] / rendering[1]
        result[recipe] = entry
    return result


def loader_throughput(images, size: int, patch: int, workers: int, batch_size: int, batches: int,
                      query_recipe: str = "training", reference_recipe: str = "off") -> float:
    """Pairs per second delivered by a ``DataLoader`` over :class:`CopyPairDataset` with the
    :class:`PixTraceCollator` (fused rendering), in the steady state: :func:`delivered_per_second`."""
    dataset = CopyPairDataset(images, CopyPairMaker(size, query_recipe, reference_recipe), seed=0, positive_rate=1.0)
    sampler = CopyPairBatchSampler(len(images), batch_size, seed=0,
                                   num_batches=max(1, workers) + timed_batches(batches, workers))
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=PixTraceCollator(size, patch),
                                         num_workers=workers, prefetch_factor=4 if workers else None)
    return delivered_per_second(loader, batch_size, workers, batches)


#: Whole rounds of the workers (one batch each) timed at the least by :func:`delivered_per_second`.
MIN_TIMED_ROUNDS = 3


def timed_batches(batches: int, workers: int) -> int:
    """``batches`` rounded up to whole rounds of ``workers`` batches, and to at least :data:`MIN_TIMED_ROUNDS`
    rounds (``workers`` 0: the main process makes every batch, ``batches`` as asked)."""
    if workers <= 0:
        return max(1, batches)
    rounds = max(MIN_TIMED_ROUNDS, -(-batches // workers))
    return rounds * workers


def delivered_per_second(loader, batch_size: int, workers: int, batches: int) -> float:
    """Items per second ``loader`` delivers after a warm-up of one batch per worker, over whole rounds.

    Every worker makes whole batches, so ``W`` workers deliver ``W`` batches per round. Timing fewer
    batches than a round measures only some workers' second batch against a whole round's time: with
    16 workers and 10 timed batches the rate comes out near 10/16 of the steady one. So the timed
    batches are :func:`timed_batches` (whole rounds, at least :data:`MIN_TIMED_ROUNDS`); the loader must
    yield ``max(1, workers) + timed_batches(batches, workers)`` batches.
    """
    iterator = iter(loader)
    for _ in range(max(1, workers)):  # warm-up: start the workers, fill their first batch
        next(iterator)
    count = timed_batches(batches, workers)
    start = time.perf_counter()
    for _ in range(count):
        next(iterator)
    return count * batch_size / (time.perf_counter() - start)


def training_config(name: str | None):
    """The training configuration named like the training script's ``--config`` (default: the tiny CPU run).

    Hard-negative mining is left to the model type's default without a k-NN graph (the paper configs
    ask for one): the benchmark's pairs pick random negatives, which costs the same work per pair.
    """
    return parse_args((["--config", name] if name else []) + ["--hard_negative_mining", "null"])


def model_step_throughput(config, batch_size: int | None = None, steps: int = 10, device: str = "cpu",
                          precision: str = "no") -> float:
    """Pairs per second one optimiser step of ``config``'s model consumes on ``device``.

    Synthetic batches of ``batch_size`` pairs (default: the config's ``pairs_per_batch``): uint8 pixels already on
    the device (the collator's output), normalised there, identity overlap priors, a third of the matcher's
    labels positive; forward with the loss, backward, AdamW step; two warm-up steps, then ``steps`` timed
    (the device synchronised before the clock is read).
    """
    import dataclasses

    config = dataclasses.replace(config, init_from_dino=None, model_name_or_path=None)
    model, _ = build_model(config)
    model.to(device).train()
    size, patch = model.config.image_size, model.config.patch_size
    batch_size = batch_size or config.pairs_per_batch
    length = (size // patch) ** 2
    generator = torch.Generator().manual_seed(0)
    prior = torch.eye(length).expand(batch_size, length, length).contiguous()
    labels = torch.ones(batch_size) if config.model_type == "descriptor" else (torch.arange(batch_size) % 3 == 0).float()
    batch = {
        "pixel_values": torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=generator),
        "reference_pixel_values": torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8,
                                                generator=generator),
        "overlap_qr": prior, "overlap_rq": prior.clone(), "labels": labels,
        "pair_mask": torch.ones(batch_size, dtype=torch.bool),
    }
    batch = {key: value.to(device) for key, value in batch.items()}
    collator = PixTraceCollator(size, patch)
    optimizer = torch.optim.AdamW(model.parameters())
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def synchronize():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    for index in range(steps + 2):
        if index == 2:
            synchronize()
            start = time.perf_counter()
        with autocast:
            loss = model(**collator.normalize(dict(batch))).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize()
    return steps * batch_size / (time.perf_counter() - start)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="a training config (path or shipped name): its image and "
                        "patch size, batch and recipes for the loader, its model for --model_step")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--patch_size", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=6, help="timed batches per worker setting (rounded up to whole rounds of the workers, at least 3)")
    parser.add_argument("--split_pairs", type=int, default=64, help="pairs timed for the per-stage split")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of fused / edit-by-edit timing")
    parser.add_argument("--recipes", nargs="+", default=["training", "paper_descriptor", "paper_matcher"],
                        choices=["training", "paper_descriptor", "paper_matcher"], help="query recipes timed")
    parser.add_argument("--images", type=int, default=200, help="originals used (shared data)")
    parser.add_argument("--image_folder", default=None, help="a folder of originals to use instead")
    parser.add_argument("--min_long_side", type=int, default=0,
                        help="use only originals whose longer side is at least this (e.g. 896 at 224: the "
                             "originals that draft decoding and the source shrink reduce)")
    parser.add_argument("--skip_split", action="store_true", help="skip the per-stage split (loader and model only)")
    parser.add_argument("--model_step", action="store_true", help="also time the config's training step")
    parser.add_argument("--model_steps", type=int, default=10, help="timed optimiser steps of --model_step")
    parser.add_argument("--device", default="cpu", help="device of --model_step (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--precision", default="no", choices=["no", "bf16"], help="autocast of --model_step")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    config = training_config(args.config)
    query_recipe, reference_recipe = "training", "off"
    if args.config:
        args.image_size = config.model.get("image_size", 224)
        args.patch_size = config.model.get("patch_size", 16)
        args.batch_size = config.pairs_per_batch
        query_recipe, reference_recipe = config.query_recipe, config.reference_recipe
        args.recipes = [query_recipe] if query_recipe in ("training", "paper_descriptor", "paper_matcher") else []
    torch.set_num_threads(1)
    images, source = load_originals(args.images, args.image_folder, args.min_long_side)
    print(f"originals: {len(images)} from {source}; pairs at {args.image_size}x{args.image_size}, "
          f"patch {args.patch_size}; torch and OpenCV threads 1; CPU time of this process, fastest of "
          f"{args.rounds} alternated rounds")
    split = {} if args.skip_split else compare_paths(images, args.image_size, args.patch_size, args.split_pairs,
                                                     args.recipes, args.rounds)
    print_split(split, args.split_pairs)
    throughput = {}
    print(f"\nDataLoader, batch {args.batch_size}, {args.batches} timed batches (query recipe {query_recipe}, "
          f"fused):")
    for workers in args.workers:
        throughput[workers] = loader_throughput(images, args.image_size, args.patch_size, workers, args.batch_size,
                                                args.batches, query_recipe, reference_recipe)
        print(f"  num_workers={workers}: {throughput[workers]:7.1f} pairs/s")
    result = {"image_size": args.image_size, "patch_size": args.patch_size, "batch_size": args.batch_size,
              "config": args.config or "tiny_cpu.yaml", "query_recipe": query_recipe, "source": source,
              "split": split, "pairs_per_second": throughput}
    if args.model_step:
        result.update(model_step_report(config, args, throughput))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def print_split(split: dict, pairs: int) -> None:
    """The per-stage table of :func:`compare_paths` for each query recipe: milliseconds per pair, fused against
    edit by edit."""
    for recipe, entry in split.items():
        print(f"\nquery recipe {recipe}, per pair ({pairs} pairs):")
        print(f"  {'stage':14s} {'fused':>9s} {'edit by edit':>13s}")
        for stage in (*STAGES, "draw", "collate_float"):
            print(f"  {stage:14s} {entry['fused']['ms_per_pair'][stage]:7.2f} ms "
                  f"{entry['edit_by_edit']['ms_per_pair'][stage]:10.2f} ms")
        print(f"  {'total':14s} {entry['fused']['total_ms']:7.2f} ms {entry['edit_by_edit']['total_ms']:10.2f} ms"
              f"  -> {entry['fused']['pairs_per_second']:.1f} vs {entry['edit_by_edit']['pairs_per_second']:.1f}"
              f" pairs/s on one core; fused editing {100 * entry['edit_ratio']:.0f} % of edit by edit"
              f" ({100 * entry['render_ratio']:.0f} % without the draws)")


def model_step_report(config, args: argparse.Namespace, throughput: dict[int, float]) -> dict:
    """``--model_step``: the pairs per second one training step of the config's model consumes on ``--device``,
    printed beside the share of it each loader setting of ``throughput`` (workers -> pairs/s) delivers."""
    consumed = model_step_throughput(config, None if args.config else 16, args.model_steps, args.device,
                                     args.precision)
    report = {"model_pairs_per_second": consumed, "device": _device_name(args.device), "precision": args.precision}
    print(f"\n{config.model_type} of {args.config or 'tiny_cpu.yaml'} on {report['device']} ({args.precision}) "
          f"consumes {consumed:.1f} pairs/s (forward + loss + backward + AdamW)")
    for workers, delivered in throughput.items():
        print(f"  num_workers={workers}: the pipeline delivers {100 * delivered / consumed:.0f} % of that")
    return report


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


if __name__ == "__main__":
    main()
