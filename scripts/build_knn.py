#!/usr/bin/env python3
"""Build the k-NN graph of the training images for global hard negative mining (GHNM).

Paper, supplementary Algorithm 1: the graph is built from DINO features; each training mini-batch
then pairs random images with one of their k nearest neighbours (descriptor: k = 8; matcher's
negatives: k = 128).

    python scripts/build_knn.py --dataset /data/disc21 --k 128 --output /data/disc21/knn_dino_vits16.safetensors
    python scripts/build_knn.py --dataset my_images/ --model facebook/dino-vitb16 --k 8 --output knn.safetensors
    python scripts/build_knn.py --dataset my_images/ --model outputs/descriptor   # a trained CopyNCE descriptor

``--model`` is a ``transformers`` model folder or Hub id (features: the final CLS token, as DINO's
k-NN evaluation; for a CopyNCE descriptor its descriptors), or an original DINO ``.pth`` checkpoint.
``--features authors`` computes DINO's features as the authors' ``extract_dino_features.py`` (LayerNorm epsilon
1e-4, the image resized to ``--image_size`` bicubic, ImageNet normalisation; the paper configs' graphs):

    python scripts/build_knn.py --dataset /data/disc21 --k 128 --features authors --output knn128.safetensors

``--group_by`` builds a graph per group: each image's neighbours come from its own group only, a dataset column
or, for an instance folder (``python -m copynce_hf.data.instances``), a field of its manifest, e.g. ``kind``
(photos among photos, procedural images among procedural ones):

    python scripts/build_knn.py --dataset instances/ --model outputs/descriptor --group_by kind --output knn.safetensors

Descriptors are L2-normalised and searched exactly with faiss ``IndexFlatIP``. The graph is written as
safetensors (``neighbors`` int64 (N, k), ``similarities`` float32 (N, k)) with the image ids in its
metadata; unreadable images are skipped, counted, and get no neighbours.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from copynce_hf.data.knn_features import KNN_FEATURES, image_groups, knn_graph_of_images
from copynce_hf.data.loading import load_image_dataset
from copynce_hf.modeling.errors import ConfigError

logger = logging.getLogger("copynce_hf.build_knn")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=None,
                        help="DISC21 folder, image folder, saved dataset or Hub id (default: the bundled images)")
    parser.add_argument("--split", default="train", help="dataset split (DISC21: train)")
    parser.add_argument("--image_column", default=None)
    parser.add_argument("--id_column", default=None)
    parser.add_argument("--model", default="facebook/dino-vits16",
                        help="transformers ViT / CopyNCE descriptor (folder or Hub id) or DINO .pth")
    parser.add_argument("--image_size", type=int, default=224,
                        help="input size when the model has no processor, and always with --features authors")
    parser.add_argument("--features", choices=KNN_FEATURES, default="package",
                        help="package: the model as saved, with its own image processor; authors: DINO weights run as "
                        "the authors' extract_dino_features.py (LayerNorm eps 1e-4, bicubic resize, ImageNet "
                        "normalisation)")
    parser.add_argument("--group_by", default=None,
                        help="a graph per group: neighbours only among the images sharing this column's value (or, "
                        "for an instance folder, this field of its manifest: kind)")
    parser.add_argument("--k", type=int, default=8, help="neighbours per image (descriptor 8, matcher 128)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--output", required=True, help="output .safetensors file")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    return parser.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    images = load_image_dataset(args.dataset, args.split, image_column=args.image_column, id_column=args.id_column)
    groups = image_groups(images, args.group_by, args.dataset) if args.group_by else None
    if groups is not None:
        logger.info("a graph per %s: %s", args.group_by,
                    ", ".join(f"{name} {count}" for name, count in sorted(Counter(groups).items())))
    started = time.perf_counter()
    graph, kind, skipped = knn_graph_of_images(images, args.model, args.k, args.image_size, args.batch_size,
                                               args.num_workers, device, features=args.features, groups=groups)
    path = graph.save(args.output, model=args.model, features=kind, form=args.features, k=str(args.k),
                      **({"group_by": args.group_by} if args.group_by else {}))
    logger.info("k-NN graph of %d images (k=%d, %d unreadable skipped) written to %s in %.1f s",
                len(images) - skipped, args.k, skipped, path, time.perf_counter() - started)
    return path


if __name__ == "__main__":
    try:
        main()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
