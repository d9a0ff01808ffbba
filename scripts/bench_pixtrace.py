#!/usr/bin/env python3
"""Time PixTrace's table work for one training pair, excluding the pixel work of the edits.

A 500x375 original; the query is made by a five-edit geometric chain (random resized crop,
rotation with expand, affine, perspective, horizontal flip) and the reference by a resize,
both ending at 224x224. Per pair we build the two tables and both overlap priors
(query->reference and reference->query, 16-pixel patches), on one core.

Two implementations run side by side:
  analytic  copynce_hf.pixtrace (projective maps composed; tables materialised once at 224x224)
  warping   the straightforward method: a dense (H, W, 2) table warped at full resolution at
            every edit, scatter-inverted, then the same patch_overlap.

Usage: python scripts/bench_pixtrace.py [--pairs 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from copynce_hf.pixtrace import CoordinateTable, pair_overlaps

ORIGINAL = (375, 500)
OUTPUT = (224, 224)
PATCH = 16


def _about_centre(linear: np.ndarray, size_in, size_out) -> np.ndarray:
    """Backward map rotating/shearing about the image centres: output pixel -> input position."""
    centre_in = np.array([(size_in[1] - 1) / 2, (size_in[0] - 1) / 2])
    centre_out = np.array([(size_out[1] - 1) / 2, (size_out[0] - 1) / 2])
    matrix = np.eye(3)
    matrix[:2, :2] = linear
    matrix[:2, 2] = centre_in - linear @ centre_out
    return matrix


def query_chain(rng: np.random.Generator) -> list[tuple[np.ndarray, tuple[int, int]]]:
    """Five geometric edits as (backward matrix, output size), sizes chained from ORIGINAL."""
    height, width = ORIGINAL
    edits = []
    # 1. random resized crop: area 0.3-1, output 300x300
    area = rng.uniform(0.3, 1.0) * height * width
    crop_h = int(min(height, math.sqrt(area * rng.uniform(0.75, 1.33))))
    crop_w = int(min(width, area / crop_h))
    top, left = rng.integers(0, height - crop_h + 1), rng.integers(0, width - crop_w + 1)
    out = (300, 300)
    sy, sx = crop_h / out[0], crop_w / out[1]
    edits.append((np.array([[sx, 0, left + 0.5 * sx - 0.5], [0, sy, top + 0.5 * sy - 0.5], [0, 0, 1]]), out))
    # 2. rotation with expand
    angle = math.radians(rng.uniform(-30, 30))
    c, s = math.cos(angle), math.sin(angle)
    size_in = out
    out = (int(math.ceil(abs(size_in[0] * c) + abs(size_in[1] * s))), int(math.ceil(abs(size_in[1] * c) + abs(size_in[0] * s))))
    edits.append((_about_centre(np.array([[c, s], [-s, c]]), size_in, out), out))
    # 3. affine: shear and scale about the centre
    shear, scale = math.radians(rng.uniform(-10, 10)), rng.uniform(0.8, 1.2)
    linear = np.linalg.inv(np.array([[scale, scale * math.tan(shear)], [0, scale]]))
    edits.append((_about_centre(linear, out, out), out))
    # 4. perspective
    strength = rng.uniform(-4e-4, 4e-4)
    perspective = np.array([[1, 0, 0], [0, 1, 0], [strength, strength / 2, 1.0]])
    centre = np.array([[1, 0, -(out[1] - 1) / 2], [0, 1, -(out[0] - 1) / 2], [0, 0, 1]])
    edits.append((np.linalg.inv(centre) @ perspective @ centre, out))
    # 5. horizontal flip
    edits.append((np.array([[-1.0, 0, out[1] - 1], [0, 1, 0], [0, 0, 1]]), out))
    return edits


def resize_matrix(size_in, size_out) -> np.ndarray:
    sy, sx = size_in[0] / size_out[0], size_in[1] / size_out[1]
    return np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1.0]])


def build_pair(chain, dense: bool):
    query = CoordinateTable.identity(*ORIGINAL)
    if dense:
        query = CoordinateTable(query.coords, ORIGINAL)  # dense tables warp at every step
    for matrix, size in chain:
        query = query.warp(matrix, size)
    query = query.warp(resize_matrix(query.size, OUTPUT), OUTPUT)
    reference = CoordinateTable.identity(*ORIGINAL)
    if dense:
        reference = CoordinateTable(reference.coords, ORIGINAL)
    reference = reference.warp(resize_matrix(ORIGINAL, OUTPUT), OUTPUT)
    return pair_overlaps(query, reference, PATCH)


def time_per_pair(chains, dense: bool) -> float:
    build_pair(chains[0], dense)  # warm caches
    # CPU time of this single-threaded process: the work of one core, robust to other load.
    start = time.process_time()
    for chain in chains:
        build_pair(chain, dense)
    return (time.process_time() - start) / len(chains) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    rng = np.random.default_rng(args.seed)
    chains = [query_chain(rng) for _ in range(args.pairs)]
    analytic = time_per_pair(chains, dense=False)
    warping = time_per_pair(chains[: max(20, args.pairs // 10)], dense=True)
    print(f"original {ORIGINAL[1]}x{ORIGINAL[0]}, five-edit geometric chain, copies {OUTPUT[1]}x{OUTPUT[0]}, "
          f"patch {PATCH}, one core (CPU time)")
    print(f"analytic (copynce_hf.pixtrace): {analytic:.2f} ms per pair (2 tables + 2 overlap priors)")
    print(f"full-resolution table warping:  {warping:.2f} ms per pair ({warping / analytic:.1f}x slower)")


if __name__ == "__main__":
    main()
