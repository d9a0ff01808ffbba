#!/usr/bin/env python3
"""Time PixTrace's table work for one training pair, excluding the pixel work of the edits.

A 500x375 original; the query is made by a five-edit geometric chain of the catalogue's
edits (random resized crop, rotation with expand, affine, perspective, horizontal flip) and
the reference by a resize, both ending at 224x224. Only the edits' ``trace`` (table update)
runs, not their pixel work. Per pair we build the two tables and both overlap priors
(query->reference and reference->query, 16-pixel patches), on one core.

Two implementations run side by side:
  analytic  copynce_hf.pixtrace (projective maps composed; tables materialised once at 224x224)
  warping   the straightforward method: a dense (H, W, 2) table warped at full resolution at
            every edit, scatter-inverted, then the same patch_overlap.

Usage: python scripts/bench_pixtrace.py [--pairs 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from copynce_hf.pixtrace import CoordinateTable, pair_overlaps
from copynce_hf.pixtrace.edits import (
    Affine,
    GeometricEdit,
    HorizontalFlip,
    Perspective,
    RandomResizedCrop,
    Resize,
    Rotate,
)

ORIGINAL = (375, 500)
OUTPUT = (224, 224)
PATCH = 16


def query_chain(rng: np.random.Generator, size=ORIGINAL) -> list[GeometricEdit]:
    """Five geometric edits drawn like the training recipe's, then the resize to the model size."""
    crop = RandomResizedCrop.draw(rng, size, (300, 300), scale=(0.3, 1.0))
    rotate = Rotate(float(rng.uniform(-30, 30)), expand=True)
    affine = Affine(angle=float(rng.uniform(-10, 10)), scale=float(rng.uniform(0.8, 1.2)),
                    shear=(float(rng.uniform(-10, 10)), 0.0))
    edits: list[GeometricEdit] = [crop, rotate, affine]
    after = _size_after(edits, size)
    edits.append(Perspective.augly_like(after, sigma=0.05 * min(after), seed=int(rng.integers(1 << 30))))
    edits.append(HorizontalFlip())
    return edits + [Resize(*OUTPUT)]


def _size_after(edits, size):
    for edit in edits:
        size = edit.output_size(size)
    return size


def build_pair(chain, dense: bool):
    """The two tables (query by the chain, reference by a resize) and both overlap priors."""
    query = CoordinateTable.identity(*ORIGINAL)
    reference = CoordinateTable.identity(*ORIGINAL)
    if dense:  # dense tables are warped at full resolution at every step
        query = CoordinateTable(query.coords, ORIGINAL)
        reference = CoordinateTable(reference.coords, ORIGINAL)
    for edit in chain:
        query = edit.trace(query)
    reference = Resize(*OUTPUT).trace(reference)
    return pair_overlaps(query, reference, PATCH)


def time_per_pair(chains, dense: bool, repeats: int = 5) -> float:
    """Milliseconds of CPU time per pair: the best of ``repeats`` passes over ``chains``.

    CPU time of this single-threaded process is one core's work; the best pass (as timeit
    reports) discounts interference from other processes on a shared machine.
    """
    build_pair(chains[0], dense)  # warm caches
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for chain in chains:
            build_pair(chain, dense)
        best = min(best, time.process_time() - start)
    return best / len(chains) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    rng = np.random.default_rng(args.seed)
    chains = [query_chain(rng) for _ in range(args.pairs)]
    analytic = time_per_pair(chains, dense=False)
    warping = time_per_pair(chains[: max(20, args.pairs // 10)], dense=True, repeats=2)
    print(f"original {ORIGINAL[1]}x{ORIGINAL[0]}, five-edit geometric chain, copies {OUTPUT[1]}x{OUTPUT[0]}, "
          f"patch {PATCH}, one core (CPU time, best of 5 passes)")
    print(f"analytic (copynce_hf.pixtrace): {analytic:.2f} ms per pair (2 tables + 2 overlap priors)")
    print(f"full-resolution table warping:  {warping:.2f} ms per pair ({warping / analytic:.1f}x slower)")


if __name__ == "__main__":
    main()
