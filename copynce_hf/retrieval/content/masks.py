"""Content tokens (:mod:`copynce_hf.retrieval.content.tokens`) over a collection: the images' tokens read and encoded
through a bounded cache, and which tokens of each image match in each of its own neighbour images
(:class:`CollectionMatches`, from which a pair's keep masks follow, the pair's other image left out).

Two callers: ``dedup``'s matcher stage (each image's neighbours are the images it shares candidate pairs with)
and the descriptor stage of ``dedup`` and ``detect`` with ``descriptor_content_tokens`` (each image's neighbours
are its nearest images by raw descriptor). ``detect``'s matcher stage needs no pass of its own: a query and its
candidates are encoded anyway, and :class:`~copynce_hf.retrieval.verify.scorer.MatcherScorer` masks them there.

The images are visited in the order of a breadth-first walk of the neighbour graph, so that an image's
neighbours tend to be in the cache when it is reached: with a collection that fits the cache every image is
encoded once, otherwise some are encoded again (:attr:`TokenCache.encoded` counts the passes). ``dedup`` reads
them from its token store instead (:class:`StoredUnitTokens`, :mod:`copynce_hf.retrieval.content.store`: every image encoded once).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from ...images import load_image
from ...modeling.errors import ImageLoadError
from .tokens import ContentSettings, matched_in, pair_keep, unit_patch_tokens

logger = logging.getLogger(__name__)

#: Images whose matches are computed together (their neighbours' tokens are held at once).
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
        stored: id -> encoder tokens (1 + L, C) already computed (``None``: unreadable), for the ids it holds
            (``in``); those are read from it, not encoded.
    """

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], image_processor, images: Mapping,
                 capacity: int = 4096, batch_size: int = 64, max_pixels: int | None = None, device=None,
                 stored: Mapping | None = None):
        self.encode, self.image_processor, self.images, self.stored = encode, image_processor, images, stored
        self.capacity, self.batch_size = max(1, int(capacity)), max(1, int(batch_size))
        self.max_pixels, self.device = max_pixels, device
        self._tokens: OrderedDict[str, torch.Tensor | None] = OrderedDict()
        self.encoded = 0  # encoder passes run (one per image), for cost reports

    @torch.inference_mode()
    def _encode_missing(self, missing: list[str]) -> None:
        if self.stored is not None:
            found = [image_id for image_id in missing if image_id in self.stored]
            for image_id in found:
                tokens = self.stored[image_id]
                self._tokens[image_id] = None if tokens is None else unit_patch_tokens(tokens[None].float())[0]
            missing = [image_id for image_id in missing if image_id not in self.stored]
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


class StoredUnitTokens:
    """:class:`TokenCache`'s reads from a :class:`~copynce_hf.retrieval.content.store.TokenStore` whose images are already encoded: the
    same unit-norm patch tokens (L, C) by id, no encoder pass (``encoded`` stays 0: the store counts its own)."""

    encoded = 0

    def __init__(self, store):
        self.store = store

    def get(self, image_ids: Sequence[str]) -> dict[str, torch.Tensor | None]:
        """id -> (L, C) unit-norm float32 tokens (``None``: unreadable) of every id asked for."""
        return {image_id: None if tokens is None else unit_patch_tokens(tokens[None])[0]
                for image_id, tokens in self.store.get(image_ids).items()}


class PairMatches:
    """Which tokens of an image match in another (:func:`~copynce_hf.retrieval.content.tokens.matched_in`), by
    ``(image id, other image id)``, the last ``capacity`` kept: a candidate's matches in the other candidates of a
    query do not depend on the query, and ``detect``'s queries share many candidates.

    Attributes:
        computed: image pairs matched (not found kept), for cost reports.
    """

    def __init__(self, tau: float, capacity: int = 200_000):
        self.tau, self.capacity = tau, max(1, int(capacity))
        self._rows: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
        self.computed = 0

    def __len__(self) -> int:
        return len(self._rows)

    def among(self, ids: Sequence[str], tokens: torch.Tensor, top: int) -> torch.Tensor:
        """(R, top, L) bool: row ``r``, column ``k``: the tokens of image ``ids[r]`` matched in image ``ids[k]``, for
        ``ids`` (R) with unit-norm patch tokens (R, L, C) and the first ``top`` of them as the others."""
        found = torch.empty((len(ids), top, tokens.shape[1]), dtype=torch.bool)
        missing: dict[int, list[int]] = {}
        for row, image_id in enumerate(ids):
            for other in range(top):
                kept = self._rows.get((image_id, ids[other]))
                if kept is None:
                    missing.setdefault(other, []).append(row)
                else:
                    self._rows.move_to_end((image_id, ids[other]))
                    found[row, other] = kept
        for other, rows in missing.items():
            matched = matched_in(tokens[rows], tokens[other:other + 1], self.tau)[:, 0].cpu()  # (m, L)
            found[rows, other] = matched
            self._rows.update(((ids[row], ids[other]), row_matched) for row, row_matched in zip(rows, matched))
            self.computed += len(rows)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        return found


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
class CollectionMatches:
    """Which tokens of each image of a collection match in each of its neighbour images.

    Attributes:
        settings: how they were found.
        neighbours: id -> its neighbour ids (best first), those that count.
        matched: id -> (K, L) bool, row ``k``: its tokens matched in ``neighbours[id][k]``. Images without
            neighbours, or unreadable, are absent: they keep every token.
        encoded: the encoder passes run to find them.
    """

    settings: ContentSettings
    neighbours: dict = dataclasses.field(default_factory=dict)
    matched: dict = dataclasses.field(default_factory=dict)
    encoded: int = 0

    def keep(self, image_id, partner=None) -> torch.Tensor | None:
        """(L,) bool: the tokens of ``image_id`` kept when it is scored against ``partner`` (left out of its
        neighbours, :func:`~copynce_hf.retrieval.content.tokens.pair_keep`; ``None``: every neighbour counts); ``None`` when the
        image keeps every token."""
        if image_id not in self.matched:
            return None
        others = self.neighbours[image_id]
        row = others.index(partner) if partner in others else None
        return pair_keep(self.matched[image_id], self.settings.min_images, row)[0]

    def summary(self) -> str:
        """One line for the logs (every neighbour counted)."""
        masks = [pair_keep(matched, self.settings.min_images) for matched in self.matched.values()]
        dropped = 1.0 - float(torch.cat([keep for keep, _ in masks]).float().mean()) if masks else 0.0
        return (f"{len(masks)} images compared with their neighbours, {dropped:.1%} of their tokens shared with "
                f"{self.settings.min_images} or more, {sum(fell for _, fell in masks)} images kept whole (every token "
                f"shared), {self.encoded} encoder passes")

    def digest_lines(self) -> list[str]:
        """One line per image (id, neighbours, matched tokens as 0/1), sorted: what the identity of scores computed
        with these matches is a digest of."""
        def bits(matched: torch.Tensor) -> str:
            return "".join("1" if value else "0" for value in matched.flatten().tolist())

        return [f"{image_id}\t{','.join(map(str, self.neighbours[image_id]))}\t{bits(matched)}"
                for image_id, matched in sorted(self.matched.items(), key=lambda item: str(item[0]))]


class _MatchRows:
    """The matches (K, L) of the images of one walk, kept as rows of one bool array (N, ``neighbours``, L) allocated
    at the first: many small tensors allocated between the walk's large transient ones fragment the heap (at 100,000
    images, 6 GB resident for 200 MB of matches). A match of another length is kept as a tensor of its own."""

    def __init__(self, count: int, neighbours: int):
        self.count, self.neighbours = count, neighbours
        self.rows: torch.Tensor | None = None
        self.used = 0

    def keep(self, matched: torch.Tensor) -> torch.Tensor:
        """``matched`` (K, L) bool, as kept: a view of the next row of the array, or a copy."""
        if self.rows is None:
            self.rows = torch.zeros((self.count, self.neighbours, matched.shape[1]), dtype=torch.bool)
        if len(matched) > self.neighbours or matched.shape[1] != self.rows.shape[2] or self.used == self.count:
            return matched.clone()
        row = self.rows[self.used, :len(matched)]
        row.copy_(matched)
        self.used += 1
        return row


def neighbour_matches(ids: Sequence, neighbours: Mapping[object, Sequence], cache: TokenCache | StoredUnitTokens,
                      settings: ContentSettings, progress: bool = False) -> CollectionMatches:
    """The matches of every image of ``ids`` in its neighbours (``neighbours[id]``, best first; the first
    ``settings.neighbours`` readable ones count), tokens from ``cache``; ``progress``: a bar over the images, with
    the encoder passes run so far (more than one per image when the cache is smaller than the walk's reach)."""
    found = CollectionMatches(settings)
    asked = set(ids)  # an image without neighbours has nothing to be masked against: it is not read
    order = [image_id for image_id in walk_order(ids, neighbours) if image_id in asked and neighbours.get(image_id)]
    bar = tqdm(total=len(order), desc="content tokens", unit="img", disable=not progress)
    rows = _MatchRows(len(order), settings.neighbours)
    for start in range(0, len(order), _BLOCK):
        block = order[start:start + _BLOCK]
        wanted = {image_id: [other for other in list(neighbours.get(image_id, ()))[: 4 * settings.neighbours]
                             if other != image_id] for image_id in block}
        tokens = cache.get([*block, *(other for others in wanted.values() for other in others)])
        for image_id in block:
            chosen = [other for other in wanted[image_id] if tokens[other] is not None][: settings.neighbours]
            if tokens[image_id] is None or not chosen:
                continue
            found.neighbours[image_id] = chosen
            found.matched[image_id] = rows.keep(matched_in(tokens[image_id][None],
                                                           torch.stack([tokens[o] for o in chosen]), settings.tau)[0].cpu())
        bar.update(len(block))
        bar.set_postfix(encoder_passes=cache.encoded, refresh=False)
    bar.close()
    found.encoded = cache.encoded
    return found


def sharded_matches(ids: Sequence, neighbours: Mapping[object, Sequence], cache: TokenCache | StoredUnitTokens,
                    settings: ContentSettings, accelerator=None, progress: bool = False) -> CollectionMatches:
    """:func:`neighbour_matches` with the images shared among Accelerate's processes (each a contiguous part of
    the walk order) and the matches gathered, so that every process gets them all (``progress``: the main
    process's bar)."""
    processes = accelerator.num_processes if accelerator is not None else 1
    if processes == 1:
        return neighbour_matches(ids, neighbours, cache, settings, progress)
    from accelerate.utils import gather_object

    order = walk_order(ids, neighbours)
    share = -(-len(order) // processes)
    mine = order[accelerator.process_index * share:(accelerator.process_index + 1) * share]
    part = neighbour_matches(mine, neighbours, cache, settings, progress and accelerator.is_main_process)
    part.matched = {image_id: matched.clone() for image_id, matched in part.matched.items()}  # not the whole array each
    found = CollectionMatches(settings)
    for gathered in gather_object([part]):
        found.neighbours.update(gathered.neighbours)
        found.matched.update(gathered.matched)
        found.encoded += gathered.encoded
    return found
