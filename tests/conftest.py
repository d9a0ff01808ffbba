"""Shared fixtures: test data location and small synthetic images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
IMAGENET_SAMPLE = SHARED_DATA / "imagenet-sample"
SPLITS_CSV = SHARED_DATA / "imagenet-sample-splits.csv"


def shared_split(split: str) -> list[Path]:
    """Files of one split of ../shared/data/imagenet-sample (sorted), or skip the test."""
    if not SPLITS_CSV.exists():
        pytest.skip(f"{SPLITS_CSV} not found: shared test data is only present in CI and dev sessions")
    with SPLITS_CSV.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return sorted(IMAGENET_SAMPLE / row["filename"] for row in rows if row["split"] == split)


@pytest.fixture
def train_images() -> list[Path]:
    return shared_split("train")


def ramp_image(height: int = 256, width: int = 256) -> Image.Image:
    """Red = x, green = y (both 0..255 over the image), blue constant 128."""
    xs = np.linspace(0, 255, width)
    ys = np.linspace(0, 255, height)
    red = np.broadcast_to(xs[None, :], (height, width))
    green = np.broadcast_to(ys[:, None], (height, width))
    blue = np.full((height, width), 128.0)
    return Image.fromarray(np.rint(np.stack([red, green, blue], -1)).astype(np.uint8), "RGB")


@pytest.fixture
def ramp() -> Image.Image:
    return ramp_image()


#: ViT hyper-parameters of the tiny random models the retrieval, CLI and pipeline tests save.
TINY_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=16)


def save_tiny_models(root: Path, seed: int) -> dict[str, str]:
    """Save a tiny random descriptor and matcher (with their image processor) under ``root``.

    Returns ``{"descriptor": folder, "matcher": folder}``: save_pretrained folders, as users
    get them from the Hub.
    """
    import torch

    from copynce_hf import (
        CopyNCEDescriptorConfig,
        CopyNCEDescriptorModel,
        CopyNCEImageProcessor,
        CopyNCEMatcherConfig,
        CopyNCEMatcherModel,
    )

    torch.manual_seed(seed)
    processor = CopyNCEImageProcessor(size={"height": 32, "width": 32})
    folders = {}
    for name, model in (
        ("descriptor", CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=16, **TINY_VIT))),
        ("matcher", CopyNCEMatcherModel(CopyNCEMatcherConfig(num_fusion_layers=1, **TINY_VIT))),
    ):
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
        folders[name] = str(root / name)
    return folders


def shrunk_asset_images(folder: Path, side: int) -> Path:
    """The bundled sample images (``copynce_hf/assets/images``) shrunk to ``side`` pixels, saved in ``folder``."""
    from copynce_hf.data import ASSET_IMAGES

    for path in sorted(ASSET_IMAGES.glob("*.jpg")):
        image = Image.open(path).convert("RGB")
        image.thumbnail((side, side))
        image.save(folder / path.name, quality=90)
    return folder
