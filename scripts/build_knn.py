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
Descriptors are L2-normalised and searched exactly with faiss ``IndexFlatIP``. The graph is written as
safetensors (``neighbors`` int64 (N, k), ``similarities`` float32 (N, k)) with the image ids in its
metadata; unreadable images are skipped, counted, and get no neighbours.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from copynce_hf.data import ImageDecoder, build_knn_graph, load_image_dataset
from copynce_hf.errors import ConfigError

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
    parser.add_argument("--image_size", type=int, default=224, help="input size when the model has no processor")
    parser.add_argument("--k", type=int, default=8, help="neighbours per image (descriptor 8, matcher 128)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--output", required=True, help="output .safetensors file")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    return parser.parse_args(argv)


def load_feature_model(name: str, image_size: int):
    """``(model, processor, kind)``; ``kind`` is ``descriptors`` (CopyNCE descriptor) or ``cls``."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModel

    import copynce_hf  # noqa: F401  (registers the CopyNCE Auto classes)
    from copynce_hf.modeling import CopyNCEDescriptorModel, CopyNCEImageProcessor

    default_processor = CopyNCEImageProcessor(size={"height": image_size, "width": image_size})
    if name.endswith((".pth", ".pt")):
        if not Path(name).is_file():
            raise ConfigError(f"--model {name!r}: no such DINO checkpoint file")
        model = CopyNCEDescriptorModel.from_dino(name, image_size=image_size)
        return model, default_processor, "cls"
    try:
        config = AutoConfig.from_pretrained(name)
        model = AutoModel.from_pretrained(name, dtype=torch.float32)  # float32 features, as the evaluation's
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"cannot load --model {name!r}: {error.__class__.__name__}: {str(error).splitlines()[0]}. "
            "Without network access, pass a local model folder (e.g. a ViT saved with save_pretrained) "
            "or a DINO .pth checkpoint."
        ) from error
    try:
        processor = AutoImageProcessor.from_pretrained(name)
    except (OSError, ValueError):
        processor = default_processor
    kind = "descriptors" if getattr(config, "model_type", "") == "copynce-descriptor" else "cls"
    return model, processor, kind


class _Images(torch.utils.data.Dataset):
    """Decoded, pre-processed images; unreadable ones yield ``None`` (counted by the decoder)."""

    def __init__(self, rows, processor):
        self.rows, self.processor, self.decoder = rows, processor, ImageDecoder()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        row = self.rows[index]
        image = self.decoder(row["image"], row["image_id"])
        if image is None:
            return index, None
        return index, self.processor(image, return_tensors="pt")["pixel_values"][0]


def _collate(items):
    good = [(i, x) for i, x in items if x is not None]
    indices = torch.tensor([i for i, _ in good], dtype=torch.long)
    pixels = torch.stack([x for _, x in good]) if good else None
    return indices, pixels, len(items) - len(good)


@torch.inference_mode()
def extract(model, processor, kind: str, rows, batch_size: int, num_workers: int, device: str):
    """float32 (N, D) features and bool (N,) readable mask, in the order of ``rows``."""
    model.to(device).eval()
    loader = torch.utils.data.DataLoader(_Images(rows, processor), batch_size=batch_size, num_workers=num_workers,
                                         collate_fn=_collate)
    features, valid, skipped = None, np.zeros(len(rows), dtype=bool), 0
    for indices, pixels, bad in tqdm(loader, desc="descriptors", unit="batch"):
        skipped += bad
        if pixels is None:
            continue
        outputs = model(pixel_values=pixels.to(device))
        vectors = outputs.descriptors if kind == "descriptors" else outputs.last_hidden_state[:, 0]
        vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).cpu().numpy()
        if features is None:
            features = np.zeros((len(rows), vectors.shape[1]), dtype=np.float32)
        features[indices.numpy()] = vectors
        valid[indices.numpy()] = True
    if features is None:
        raise ConfigError("no image of the dataset could be read")
    return features, valid, skipped


def main(argv=None) -> Path:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if args.k < 1:
        raise ConfigError(f"--k {args.k} must be >= 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    images = load_image_dataset(args.dataset, args.split, image_column=args.image_column, id_column=args.id_column)
    model, processor, kind = load_feature_model(args.model, args.image_size)
    started = time.perf_counter()
    features, valid, skipped = extract(model, processor, kind, images, args.batch_size, args.num_workers, device)
    graph = build_knn_graph(features, images["image_id"], args.k, valid=valid)
    path = graph.save(args.output, model=args.model, features=kind, k=str(args.k))
    logger.info("k-NN graph of %d images (k=%d, %d unreadable skipped) written to %s in %.1f s",
                int(valid.sum()), args.k, skipped, path, time.perf_counter() - started)
    return path


if __name__ == "__main__":
    try:
        main()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
