"""Keep masks of content tokens (:mod:`..search.content_tokens`) over a collection: the images' tokens read and
encoded through a bounded cache, each image compared with its own neighbour images.

Two callers: ``dedup``'s matcher stage (each image's neighbours are the images it shares candidate pairs with)
and the descriptor stage of ``dedup`` and ``detect`` with ``descriptor_content_tokens`` (each image's neighbours
are its nearest images by raw descriptor). ``detect``'s matcher stage needs no pass of its own: a query and its
candidates are encoded anyway, and :class:`~.matcher_cache.MatcherScorer` masks them there.

The images are visited in the order of a breadth-first walk of the neighbour graph, so that an image's
neighbours tend to be in the cache when it is reached: with a collection that fits the cache every image is
encoded once, otherwise some are encoded again (:attr:`TokenCache.encoded` counts the passes).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence

import torch

from ...images import load_image
from ...modeling.errors import ImageLoadError
from ..search.content_tokens import ContentSettings, bursty_keep_batch, unit_patch_tokens

logger = logging.getLogger(__name__)

#: Images whose masks are computed together (their neighbours' tokens are held at once).
_BLOCK = 16


def processed_pixels(images: Mapping, image_id, image_processor, max_pixels: int | None = None
                     ) -> torch.Tensor | None:
    """(3, H, W) pixel values of ``images[image_id]`` (a path or a PIL image); ``None`` (logged) when unreadable."""
    try:
        image = load_image(images[image_id], max_pixels=max_pixels)
    except ImageLoadError as error:
        logger.warning("content tokens: skipping image %s: %s", image_id, error)
        return None
    return image_processor(images=image, return_tensors="pt")["pixel_values"][0]


class TokenCache:
    """Unit-norm patch tokens (L, C) of images by id, encoded when asked for and kept for the last ``capacity``.

    Args:
        encode: ``pixel_values (B, 3, H, W) -> tokens (B, 1 + L, C)`` (CLS first): a matcher's
            ``pre_fusion_tokens``, a descriptor's ``encode``.
        image_processor: the model's image processor.
        images: id -> image (a path or a PIL image).
        capacity: images whose tokens are kept (at least those of one request are).
        batch_size: images per encoder pass.
        max_pixels: the image size limit of :func:`~copynce_hf.images.load_image`.
        device: where the pixels go.
    """

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], image_processor, images: Mapping,
                 capacity: int = 4096, batch_size: int = 64, max_pixels: int | None = None, device=None):
        self.encode, self.image_processor, self.images = encode, image_processor, images
        self.capacity, self.batch_size = max(1, int(capacity)), max(1, int(batch_size))
        self.max_pixels, self.device = max_pixels, device
        self._tokens: OrderedDict[str, torch.Tensor | None] = OrderedDict()
        self.encoded = 0  # encoder passes run (one per image), for cost reports

    @torch.inference_mode()
    def _encode_missing(self, missing: list[str]) -> None:
        pixels = {image_id: processed_pixels(self.images, image_id, self.image_processor, self.max_pixels)
                  for image_id in missing}
        readable = [image_id for image_id in missing if pixels[image_id] is not None]
        for start in range(0, len(readable), self.batch_size):
            part = readable[start:start + self.batch_size]
            batch = torch.stack([pixels[image_id] for image_id in part])
            tokens = unit_patch_tokens(self.encode(batch.to(self.device) if self.device is not None else batch))
            self._tokens.update(zip(part, tokens.cpu()))
            self.encoded += len(part)
        self._tokens.update((image_id, None) for image_id in missing if pixels[image_id] is None)

    def get(self, image_ids: Sequence[str]) -> dict[str, torch.Tensor | None]:
        """id -> (L, C) unit-norm float32 tokens (``None``: unreadable) of every id asked for."""
        needed = list(dict.fromkeys(image_ids))
        missing = [image_id for image_id in needed if image_id not in self._tokens]
        for image_id in needed:
            if image_id in self._tokens:
                self._tokens.move_to_end(image_id)
        if missing:
            self._encode_missing(missing)
        while len(self._tokens) > max(self.capacity, len(needed)):
            self._tokens.popitem(last=False)
        return {image_id: self._tokens[image_id] for image_id in needed}


def walk_order(ids: Sequence[str], neighbours: Mapping[str, Sequence[str]]) -> list[str]:
    """``ids`` in the order of a breadth-first walk of the neighbour graph (each unvisited id, in the order of
    ``ids``, starts a walk), so that images near one another in the graph come near one another in the list."""
    seen: set[str] = set()
    order: list[str] = []
    for start in ids:
        if start in seen:
            continue
        seen.add(start)
        queue = deque([start])
        while queue:
            image_id = queue.popleft()
            order.append(image_id)
            for other in neighbours.get(image_id, ()):
                if other not in seen and other in neighbours:
                    seen.add(other)
                    queue.append(other)
    return order


@dataclasses.dataclass
class CollectionMasks:
    """Keep masks of a collection's images: ``masks`` id -> (L,) bool (images without neighbours or unreadable
    are absent: they keep every token), ``fell_back`` the ids kept whole because every token was bursty,
    ``dropped`` the share of tokens dropped over the masked images, ``encoded`` the encoder passes run."""

    masks: dict[str, torch.Tensor]
    fell_back: list[str]
    dropped: float
    encoded: int

    def summary(self) -> str:
        """One line for the logs."""
        return (f"{len(self.masks)} images masked, {self.dropped:.1%} of their tokens dropped as shared with "
                f"their neighbours, {len(self.fell_back)} kept whole (every token shared), {self.encoded} "
                "encoder passes")


def neighbour_keep_masks(ids: Sequence[str], neighbours: Mapping[str, Sequence[str]], cache: TokenCache,
                         settings: ContentSettings) -> CollectionMasks:
    """The keep mask of every image of ``ids`` against its neighbours (``neighbours[id]``, best first; the first
    ``settings.neighbours`` readable ones count), tokens from ``cache``."""
    masks: dict[str, torch.Tensor] = {}
    fell_back: list[str] = []
    asked = set(ids)
    order = [image_id for image_id in walk_order(ids, neighbours) if image_id in asked]
    for start in range(0, len(order), _BLOCK):
        block = order[start:start + _BLOCK]
        wanted = {image_id: list(neighbours.get(image_id, ()))[: 4 * settings.neighbours] for image_id in block}
        tokens = cache.get([*block, *(other for others in wanted.values() for other in others)])
        rows = [image_id for image_id in block if tokens[image_id] is not None]
        if not rows:
            continue
        pool_ids = list(dict.fromkeys(other for image_id in rows for other in wanted[image_id]
                                      if tokens[other] is not None and other != image_id))
        if not pool_ids:
            continue
        position = {image_id: i for i, image_id in enumerate(pool_ids)}
        index = torch.full((len(rows), settings.neighbours), -1, dtype=torch.long)
        for row, image_id in enumerate(rows):
            chosen = [position[o] for o in wanted[image_id] if o in position and o != image_id][: settings.neighbours]
            index[row, : len(chosen)] = torch.tensor(chosen, dtype=torch.long)
        found = bursty_keep_batch(torch.stack([tokens[i] for i in rows]), torch.stack([tokens[i] for i in pool_ids]),
                                  index, settings.tau, settings.min_images)
        masks.update(zip(rows, found.keep))
        fell_back += [image_id for image_id, fell in zip(rows, found.fell_back.tolist()) if fell]
    dropped = 1.0 - float(torch.stack(list(masks.values())).float().mean()) if masks else 0.0
    return CollectionMasks(masks, fell_back, dropped, cache.encoded)


def sharded_keep_masks(ids: Sequence[str], neighbours: Mapping[str, Sequence[str]], cache: TokenCache,
                       settings: ContentSettings, accelerator=None) -> CollectionMasks:
    """:func:`neighbour_keep_masks` with the images shared among Accelerate's processes (each a contiguous part of
    the walk order) and the masks gathered, so that every process gets them all."""
    processes = accelerator.num_processes if accelerator is not None else 1
    if processes == 1:
        return neighbour_keep_masks(ids, neighbours, cache, settings)
    from accelerate.utils import gather_object

    order = walk_order(ids, neighbours)
    share = -(-len(order) // processes)
    mine = order[accelerator.process_index * share:(accelerator.process_index + 1) * share]
    part = neighbour_keep_masks(mine, neighbours, cache, settings)
    parts = gather_object([(part.masks, part.fell_back, part.encoded)])
    masks = {image_id: mask for gathered, _, _ in parts for image_id, mask in gathered.items()}
    dropped = 1.0 - float(torch.stack(list(masks.values())).float().mean()) if masks else 0.0
    return CollectionMasks(masks, [i for _, fell, _ in parts for i in fell], dropped, sum(p[2] for p in parts))


def masks_digest_lines(masks: Mapping[str, torch.Tensor]) -> list[str]:
    """One line per masked image (``id``, then its mask as 0/1 characters), sorted: what a digest of the masks
    (the identity of scores computed with them) is taken over."""
    return [f"{image_id}\t{''.join('1' if kept else '0' for kept in mask.tolist())}"
            for image_id, mask in sorted(masks.items())]
