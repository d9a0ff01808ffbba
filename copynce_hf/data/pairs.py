"""Copy-pair datasets: from original images, a traced query copy and a traced reference copy.

Paper, supplementary table "All detailed settings in our training pipeline": the query is a heavily
edited copy (colour jitter, greyscale, blur, text, emoji, flips, affine, perspective, random resized
crop, overlays, random erasing, ...), the reference a lightly edited one, both at the model's input
size. The matcher sees positive pairs at rate 0.3 and negatives whose reference comes from another
image (with probability 0.5 one of the query image's 128 nearest neighbours); the descriptor sees only
positive pairs (its negatives are the other pairs of the batch, made hard by GHNM). When finetuning
(table "... finetune pipeline") both images are only resized.

Everything a pair is made of is drawn from a generator seeded with ``(seed, batch, slot)`` (map-style)
or ``(seed, epoch, process, worker, position)`` (streaming), so the same run replays the same pairs,
in data-loader workers or not, and a resumed run continues with the data the interrupted one would
have seen.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator

import datasets
import numpy as np
import torch
from PIL import Image

from ..errors import ConfigError
from ..pixtrace import CoordinateTable
from .collator import CopyPair
from .hard_negatives import KNNGraph, PairKey
from .loading import ImageDecoder

logger = logging.getLogger(__name__)

__all__ = ["RECIPES", "CopyPairMaker", "CopyPairDataset", "GroundTruthPairDataset", "StreamingCopyPairDataset"]

#: Names of the copy recipes a pair side can use: ``training`` (this package's heavy augmentation,
#: ``CopyRecipe.training()``), ``paper_descriptor`` / ``paper_matcher`` (the authors' recipes,
#: ``CopyRecipe.paper_descriptor()`` / ``paper_matcher()``), ``light`` (the reference's light edits),
#: ``resize`` (no edit; finetuning), see :class:`CopyPairMaker`.
RECIPES = ("training", "paper_descriptor", "paper_matcher", "light", "resize")

_SEED_SPACE = 2**31 - 1


class CopyPairMaker:
    """Make the two traced copies of a pair at the model's input size.

    Args:
        image_size: side ``S`` of the square model input.
        query_recipe: recipe of the query (``training`` by default).
        reference_recipe: recipe of the reference (``light`` by default; ``resize`` when finetuning).
        max_source_side: originals whose longer side exceeds this are first shrunk to it (default
            ``4 * S``; 0 keeps them as they are). The copies are only ``S`` pixels wide and the recipes'
            parameters are relative to the image size, so a larger original only costs time (editing a
            500x375 original for a 64x64 model takes three times longer than editing it at 256 pixels).
            The tables then refer to the shrunk original, which both copies of a pair share.
        fuse: render the copies with fused geometry (one resampling per run of geometric edits,
            ``CopyEditor(fuse=True)``, the default) or edit by edit (``False``, the reference);
            the tables are the same either way.

    ``maker(query_original, reference_original, label, query_seed, reference_seed)`` returns a
    :class:`CopyPair` whose tables map each copy to its own original (for a positive pair both
    originals are the same image, so the tables share a source and give the overlap priors).
    """

    def __init__(self, image_size: int, query_recipe: str = "training", reference_recipe: str = "light",
                 max_source_side: int | None = None, fuse: bool = True):
        for key, value in (("query_recipe", query_recipe), ("reference_recipe", reference_recipe)):
            if value not in RECIPES:
                raise ConfigError(f"{key}={value!r} is not a recipe; use one of {RECIPES}")
        self.image_size = int(image_size)
        self.query_recipe = query_recipe
        self.reference_recipe = reference_recipe
        self.max_source_side = 4 * self.image_size if max_source_side is None else int(max_source_side)
        if self.max_source_side and self.max_source_side < self.image_size:
            raise ConfigError(f"max_source_side={max_source_side} must be 0 or >= image_size={image_size}")
        self.fuse = bool(fuse)
        self._editors: dict[str, object] = {}

    def source(self, image: Image.Image) -> Image.Image:
        """The original the copies are made from: ``image``, shrunk to ``max_source_side`` if larger."""
        limit = self.max_source_side
        if not limit or max(image.size) <= limit:
            return image
        scale = limit / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        return image.resize(size, Image.BILINEAR, reducing_gap=2.0)

    def _editor(self, recipe: str):
        editor = self._editors.get(recipe)
        if editor is None:
            from ..pixtrace.editor import CopyEditor, CopyRecipe

            spec = {"training": CopyRecipe.training, "paper_descriptor": CopyRecipe.paper_descriptor,
                    "paper_matcher": CopyRecipe.paper_matcher}.get(recipe, CopyRecipe.light)()
            editor = CopyEditor(seed=0, recipe=spec, output_size=(self.image_size, self.image_size), fuse=self.fuse)
            self._editors[recipe] = editor
        return editor

    def copy(self, image: Image.Image, recipe: str, seed: int) -> tuple[Image.Image, CoordinateTable, list]:
        """One traced copy of ``image`` at ``S x S``: ``(copy, table to image, replayable recipe)``.

        The recipe is a list of ``Edit.to_dict()``: ``pixtrace.replay(image, recipe)`` rebuilds the
        same copy and table from the same ``image`` (for a pair, the original after :meth:`source`).
        """
        from ..pixtrace.edits.geometric import Resize

        size = self.image_size
        if recipe == "resize":
            table = CoordinateTable.identity(image.height, image.width)
            edited, recipe_log = image, []
            if self.fuse and image.size != (size, size):  # as the editor renders (and replay replays) it
                from ..pixtrace.fused import render_fused

                edited, table = render_fused(image, [Resize(size, size)])
                recipe_log.append(Resize(size, size).to_dict())
        else:
            result = self._editor(recipe)(image, seed=int(seed))
            edited, table, recipe_log = result.image, result.table, list(result.recipe)
        if edited.size != (size, size):  # the model input size: both the pixels and the table
            resize = Resize(size, size)
            edited, table = resize(edited, table)
            recipe_log.append(resize.to_dict())
        return edited, table, recipe_log

    def __call__(
        self,
        query_original: Image.Image,
        reference_original: Image.Image,
        label: int,
        query_seed: int,
        reference_seed: int,
        query_id: str = "",
        reference_id: str = "",
        skipped_images: int = 0,
    ) -> CopyPair:
        same = reference_original is query_original
        query_original = self.source(query_original)
        reference_original = query_original if same else self.source(reference_original)
        query, query_table, query_log = self.copy(query_original, self.query_recipe, query_seed)
        reference, reference_table, reference_log = self.copy(reference_original, self.reference_recipe, reference_seed)
        return CopyPair(
            query=query,
            reference=reference,
            query_table=query_table,
            reference_table=reference_table,
            label=int(label),
            query_id=query_id,
            reference_id=reference_id,
            skipped_images=skipped_images,
            recipes={"query": query_log, "reference": reference_log},
        )


def _check_rates(positive_rate: float, hard_negative_prob: float, hard_negative_k: int) -> None:
    if not 0.0 <= positive_rate <= 1.0:
        raise ConfigError(f"positive_rate={positive_rate} must be in [0, 1]")
    if not 0.0 <= hard_negative_prob <= 1.0:
        raise ConfigError(f"hard_negative_prob={hard_negative_prob} must be in [0, 1]")
    if hard_negative_k < 1:
        raise ConfigError(f"hard_negative_k={hard_negative_k} must be >= 1")


class CopyPairDataset(torch.utils.data.Dataset):
    """Map-style copy pairs over an image dataset with random access (``datasets.Dataset``).

    Indexed by :class:`PairKey` (from :class:`~copynce_hf.data.hard_negatives.CopyPairBatchSampler`)
    or by a plain image index (then ``PairKey(0, index, index)``).

    Args:
        images: a dataset with columns ``image_id`` and undecoded ``image`` (see ``load_image_dataset``).
        maker: the :class:`CopyPairMaker`.
        seed: data seed.
        positive_rate: probability that a pair is a copy pair (1.0 for the descriptor, 0.3 for the matcher).
        knn: k-NN graph aligned to ``images`` for hard negative references, or ``None`` (random ones).
        hard_negative_k, hard_negative_prob: a negative's reference is one of the query image's
            ``hard_negative_k`` nearest neighbours with probability ``hard_negative_prob``
            (matcher: 128 and 0.5), else a random other image.
        decoder: the :class:`ImageDecoder` (counts unreadable images).
        max_retries: unreadable images replaced by random others before giving up on a pair.
    """

    def __init__(
        self,
        images: datasets.Dataset,
        maker: CopyPairMaker,
        seed: int = 0,
        positive_rate: float = 1.0,
        knn: KNNGraph | None = None,
        hard_negative_k: int = 128,
        hard_negative_prob: float = 0.5,
        decoder: ImageDecoder | None = None,
        max_retries: int = 16,
    ):
        _check_rates(positive_rate, hard_negative_prob, hard_negative_k)
        if len(images) < 2:
            raise ConfigError(f"the training set needs at least 2 images, got {len(images)}")
        self.images = images
        self.maker = maker
        self.seed = seed
        self.positive_rate = positive_rate
        self.knn = knn
        self.hard_negative_k = hard_negative_k
        self.hard_negative_prob = hard_negative_prob
        self.decoder = decoder or ImageDecoder(max_side=maker.max_source_side or None)
        self.max_retries = max_retries

    def __len__(self) -> int:
        return len(self.images)

    @property
    def skipped(self) -> int:
        """Unreadable images skipped by this process (workers report theirs in the batches)."""
        return self.decoder.skipped

    def _decode(self, index: int, rng: np.random.Generator, avoid: int = -1) -> tuple[int, Image.Image, int]:
        """Decode row ``index``; an unreadable row is replaced by a random other row (counted)."""
        skipped = 0
        for _ in range(self.max_retries + 1):
            row = self.images[int(index)]
            image = self.decoder(row["image"], row["image_id"])
            if image is not None:
                return int(index), image, skipped
            skipped += 1
            index = int(rng.integers(len(self.images)))
            while index == avoid:
                index = int(rng.integers(len(self.images)))
        raise ConfigError(f"{self.max_retries + 1} unreadable images in a row: check the dataset")

    def _negative_partner(self, index: int, rng: np.random.Generator) -> int:
        if self.knn is not None and rng.random() < self.hard_negative_prob:
            neighbours = self.knn.neighbors[index, : self.hard_negative_k]
            neighbours = neighbours[(neighbours >= 0) & (neighbours != index)]
            if len(neighbours):
                return int(neighbours[rng.integers(len(neighbours))])
        partner = int(rng.integers(len(self.images) - 1))
        return partner + (partner >= index)  # uniform over the other images

    def __getitem__(self, key: PairKey | int) -> CopyPair:
        if not isinstance(key, PairKey):
            key = PairKey(0, int(key), int(key))
        rng = np.random.default_rng([self.seed, 0xC0B1, key.batch, key.slot])
        label = int(rng.random() < self.positive_rate)
        query_seed, reference_seed = (int(s) for s in rng.integers(_SEED_SPACE, size=2))
        index, query_original, skipped = self._decode(key.index, rng)
        query_id = self.images[index]["image_id"]
        if label:
            reference_original, reference_id = query_original, query_id
        else:
            partner, reference_original, more = self._decode(self._negative_partner(index, rng), rng, avoid=index)
            skipped += more
            reference_id = self.images[partner]["image_id"]
        return self.maker(query_original, reference_original, label, query_seed, reference_seed,
                          query_id=query_id, reference_id=reference_id, skipped_images=skipped)


class GroundTruthPairDataset(torch.utils.data.Dataset):
    """Pairs of real copies from a ground truth (finetuning on DISC21 dev part I).

    Paper, supplementary table "All detailed settings in our finetune pipeline": the pairs are the dev
    queries and the references they copy, only resized; CopyNCE is off because human-made edits have
    no pixel tables (the pairs carry no tables, so their priors are zero and ``pair_mask`` is False).
    Row ``i`` is the ``i``-th (query, reference) pair of the ground truth whose two images exist;
    with ``positive_rate < 1`` a negative pair keeps the query and takes a random reference it does
    not copy.

    Args:
        queries, references: datasets with ``image_id`` and undecoded ``image`` (DISC21 ``query`` and
            ``reference`` splits).
        ground_truth: ``{query_id: [reference_id, ...]}`` (see ``load_disc21_ground_truth``).
        maker: a :class:`CopyPairMaker` (normally with ``resize`` recipes on both sides).
    """

    def __init__(
        self,
        queries: datasets.Dataset,
        references: datasets.Dataset,
        ground_truth: dict[str, list[str]],
        maker: CopyPairMaker,
        seed: int = 0,
        positive_rate: float = 1.0,
        decoder: ImageDecoder | None = None,
    ):
        _check_rates(positive_rate, 0.0, 1)
        query_rows = {image_id: row for row, image_id in enumerate(queries["image_id"])}
        reference_rows = {image_id: row for row, image_id in enumerate(references["image_id"])}
        self.pairs = [
            (query_rows[query_id], reference_rows[reference_id])
            for query_id, reference_ids in sorted(ground_truth.items())
            for reference_id in reference_ids
            if query_id in query_rows and reference_id in reference_rows
        ]
        if not self.pairs:
            raise ConfigError("no ground-truth pair has both its query and its reference in the dataset")
        self.copies = {}
        for query_row, reference_row in self.pairs:
            self.copies.setdefault(query_row, set()).add(reference_row)
        self.queries, self.references = queries, references
        self.maker, self.seed, self.positive_rate = maker, seed, positive_rate
        self.decoder = decoder or ImageDecoder(max_side=maker.max_source_side or None)

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def skipped(self) -> int:
        return self.decoder.skipped

    def __getitem__(self, key: PairKey | int) -> CopyPair:
        if not isinstance(key, PairKey):
            key = PairKey(0, int(key), int(key))
        rng = np.random.default_rng([self.seed, 0x6700, key.batch, key.slot])
        label = int(rng.random() < self.positive_rate)
        query_seed, reference_seed = (int(s) for s in rng.integers(_SEED_SPACE, size=2))
        skipped = 0
        for _ in range(16):  # an unreadable image: another pair, drawn deterministically
            query_row, reference_row = self.pairs[key.index]
            if not label:
                reference_row = int(rng.integers(len(self.references)))
                while reference_row in self.copies[query_row] and len(self.copies[query_row]) < len(self.references):
                    reference_row = int(rng.integers(len(self.references)))
            query_item, reference_item = self.queries[query_row], self.references[reference_row]
            query = self.decoder(query_item["image"], query_item["image_id"])
            reference = self.decoder(reference_item["image"], reference_item["image_id"]) if query is not None else None
            if query is not None and reference is not None:
                break
            skipped += 1
            key = PairKey(key.batch, key.slot, int(rng.integers(len(self.pairs))))
        else:
            raise ConfigError("16 unreadable ground-truth pairs in a row: check the dataset")
        pair = self.maker(query, reference, label, query_seed, reference_seed, query_id=query_item["image_id"],
                          reference_id=reference_item["image_id"], skipped_images=skipped)
        pair.query_table = pair.reference_table = None  # different originals: no pixel correspondence
        return pair


class StreamingCopyPairDataset(torch.utils.data.IterableDataset):
    """Copy pairs over a streamed image dataset (``datasets.IterableDataset``, e.g. a Hub id).

    Each process reads its part of the stream (``datasets.distributed.split_dataset_by_node``), each
    data-loader worker its shards; the stream is shuffled with a buffer (``datasets`` ``shuffle`` and
    ``set_epoch``). Negative references come from a pool of the last ``negative_pool`` readable
    images of the worker's stream (GHNM needs random access: use :class:`CopyPairDataset` for it).

    ``skip_batches(n)`` makes the next iteration continue after the first ``n`` batches this process
    consumed in the epoch, without editing the skipped pairs (it only reads them), so a resumed run
    gets the same pairs as the interrupted one. It assumes the DataLoader's default in-order
    round-robin over workers with ``batch_size`` pairs per worker batch.
    """

    def __init__(
        self,
        images: datasets.IterableDataset,
        maker: CopyPairMaker,
        batch_size: int,
        seed: int = 0,
        positive_rate: float = 1.0,
        process_index: int = 0,
        num_processes: int = 1,
        shuffle_buffer_size: int = 1000,
        negative_pool: int = 256,
        decoder: ImageDecoder | None = None,
    ):
        _check_rates(positive_rate, 0.0, 1)
        self.images = images
        self.maker = maker
        self.batch_size = batch_size
        self.seed = seed
        self.positive_rate = positive_rate
        self.process_index = process_index
        self.num_processes = num_processes
        self.shuffle_buffer_size = shuffle_buffer_size
        self.negative_pool = negative_pool
        self.decoder = decoder or ImageDecoder(max_side=maker.max_source_side or None)
        self.epoch = 0
        self.skip = 0

    @property
    def skipped(self) -> int:
        return self.decoder.skipped

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_batches(self, batches: int) -> None:
        self.skip = int(batches)

    def _stream(self) -> datasets.IterableDataset:
        stream = self.images
        if self.shuffle_buffer_size > 1:
            stream = stream.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer_size)
        stream.set_epoch(self.epoch)
        if self.num_processes > 1:
            stream = datasets.distributed.split_dataset_by_node(stream, self.process_index, self.num_processes)
        return stream

    def __iter__(self) -> Iterator[CopyPair]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Batches b of this process come from worker b % workers: this worker's share of the skip.
        own_batches = max(0, (self.skip - worker + workers - 1) // workers)
        to_skip = own_batches * self.batch_size
        pool: deque = deque(maxlen=self.negative_pool)
        position = 0
        reported = self.decoder.skipped  # skips are reported once, in the pair that follows them
        for row in self._stream():
            image = self.decoder(row["image"], row["image_id"])
            if image is None:
                continue
            rng = np.random.default_rng([self.seed, 0x57AE, self.epoch, self.process_index, worker, position])
            position += 1
            label = int(rng.random() < self.positive_rate or not pool)
            query_seed, reference_seed = (int(s) for s in rng.integers(_SEED_SPACE, size=2))
            partner = None if label else pool[int(rng.integers(len(pool)))]
            pool.append(row)
            if position <= to_skip:  # already consumed (and counted) before the resume
                reported = self.decoder.skipped
                continue
            skipped, reported = self.decoder.skipped - reported, self.decoder.skipped
            if partner is None:
                reference_original, reference_id = image, row["image_id"]
            else:
                reference_original = self.decoder(partner["image"], partner["image_id"])
                reference_id = partner["image_id"]
            yield self.maker(image, reference_original, label, query_seed, reference_seed,
                             query_id=row["image_id"], reference_id=reference_id, skipped_images=skipped)
