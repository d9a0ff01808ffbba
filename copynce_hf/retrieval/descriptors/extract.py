"""Descriptor extraction: images -> image processor -> descriptor model -> :class:`DescriptorSet`.

Batched through a torch ``DataLoader`` (image decoding and processing in ``num_workers``
worker processes), run under ``torch.inference_mode``. The loader is prepared by
Accelerate, so under ``accelerate launch`` every process embeds its own shard of the
images and the results are gathered with ``gather_for_metrics`` (which drops the
padding Accelerate adds to even out the last batch); every process returns the full set
and callers write it on the main process only. Unreadable images are logged, counted in
``DescriptorSet.skipped`` and left out; they never stop the extraction.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, default_collate
from tqdm.auto import tqdm

from ...modeling.errors import SKIP_REASONS, ImageLoadError
from .sets import DescriptorSet

logger = logging.getLogger(__name__)


class ProcessedImages(Dataset):
    """Wraps an image source (:mod:`.sources`): item ``i`` is the processed image ``i``.

    Items are dicts with ``index`` (int), ``pixel_values`` (3, H, W) float32 and ``valid``
    (an int, so that it gathers across processes): 1 for a read image; for an image that cannot
    be read, ``-1 - SKIP_REASONS.index(reason)`` and a black placeholder of the same shape, so that
    batches keep one shape across processes.
    """

    def __init__(self, source, image_processor):
        self.source = source
        self.image_processor = image_processor
        self.placeholder = torch.zeros_like(self._process(Image.new("RGB", (64, 64))))

    def _process(self, image: Image.Image) -> torch.Tensor:
        return self.image_processor(images=image, return_tensors="pt")["pixel_values"][0]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        try:
            pixel_values = self._process(self.source.load(index))
            valid = 1
        except ImageLoadError as error:
            logger.warning("skipping image %r: %s", self.source.ids[index], error)
            reason = error.reason if error.reason in SKIP_REASONS else "unreadable"
            pixel_values, valid = self.placeholder, -1 - SKIP_REASONS.index(reason)
        return {"index": index, "pixel_values": pixel_values, "valid": valid}


def collate_images(items: list[dict]) -> dict:
    """A batch of :class:`ProcessedImages` items: ``index`` and ``valid`` (B,) and ``pixel_values`` (B, ...) stacked;
    images processed to several sizes (an ONNX embedding model's ``short-side`` resize) as a list of B tensors."""
    batch = default_collate([{key: value for key, value in item.items() if key != "pixel_values"} for item in items])
    pixels = [item["pixel_values"] for item in items]
    batch["pixel_values"] = torch.stack(pixels) if len({p.shape for p in pixels}) == 1 else pixels
    return batch


def extract_descriptors(
    model,
    image_processor,
    source,
    batch_size: int = 64,
    num_workers: int = 0,
    accelerator=None,
    progress: bool = True,
    description: str = "descriptors",
) -> DescriptorSet:
    """Embed every image of ``source`` with a descriptor model.

    Args:
        model: a model whose output has ``descriptors`` (B, D), e.g. ``CopyNCEDescriptorModel``.
        image_processor: callable as ``image_processor(images=..., return_tensors="pt")``.
        source: an :class:`ImageFolderSource`, :class:`DatasetImageSource` or any object with
            ``ids`` and ``load(i)``.
        batch_size: images per forward pass (per process).
        num_workers: ``DataLoader`` worker processes for decoding and processing.
        accelerator: an ``accelerate.Accelerator``; ``None`` creates one (single process
            unless launched with ``accelerate launch``).
        progress: show a tqdm bar (main process only).

    Returns:
        A :class:`DescriptorSet` with float32 descriptors (N, D) in source order, without the
        unreadable images, whose ids are listed in ``skipped``.
    """
    from ...precision import make_accelerator

    accelerator = accelerator or make_accelerator()
    dataset = ProcessedImages(source, image_processor)
    loader = accelerator.prepare_data_loader(
        DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False,
                   collate_fn=collate_images)
    )
    model = model.to(accelerator.device).eval()
    indices, descriptors, valid = [], [], []
    bar = tqdm(
        total=len(dataset), desc=description, unit="img", disable=not (progress and accelerator.is_main_process)
    )
    with torch.inference_mode():
        for batch in loader:
            with accelerator.autocast():
                output = model(pixel_values=batch["pixel_values"])
            gathered = accelerator.gather_for_metrics(
                (batch["index"], output.descriptors.float().contiguous(), batch["valid"])
            )
            indices.append(gathered[0].cpu())
            descriptors.append(gathered[1].cpu())
            valid.append(gathered[2].cpu())
            bar.update(len(gathered[0]))
    bar.close()
    prepared = getattr(accelerator, "_dataloaders", [])
    if loader in prepared:  # the Accelerator keeps every loader it prepared, and with it the loader's images:
        prepared.remove(loader)  # a run extracting chunk after chunk would hold them all
    return _in_source_order(source, torch.cat(indices).numpy(), torch.cat(descriptors).numpy().astype(np.float32),
                            torch.cat(valid).numpy())


def _in_source_order(source, indices: np.ndarray, descriptors: np.ndarray, codes: np.ndarray) -> DescriptorSet:
    """The gathered rows (``indices`` (N,) into the source, ``descriptors`` (N, D), ``codes`` (N,): 1 for a read image,
    else ``-1 - SKIP_REASONS.index(reason)``) as a :class:`DescriptorSet` in source order, the unread images listed
    with their reasons (and logged)."""
    order = np.argsort(indices, kind="stable")
    indices, descriptors, codes = indices[order], descriptors[order], codes[order]
    valid = codes > 0
    skipped = [source.ids[i] for i in indices[~valid]]
    reasons = {source.ids[i]: SKIP_REASONS[-1 - int(code)] for i, code in zip(indices[~valid], codes[~valid])}
    if skipped:
        logger.warning("skipped %d of %d images: %s", len(skipped), len(source.ids), ", ".join(f"{i} ({reasons[i]})" for i in skipped[:10]))
    return DescriptorSet([source.ids[i] for i in indices[valid]], descriptors[valid], skipped=skipped,
                         skip_reasons=reasons)
