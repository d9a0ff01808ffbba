"""Copy-pair datasets: from original images, a traced query copy and a traced reference copy.

Paper, supplementary table "All detailed settings in our training pipeline": the query is a heavily
edited copy (colour jitter, greyscale, blur, text, emoji, flips, affine, perspective, random resized
crop, overlays, random erasing, ...), the reference a lightly edited one, both at the model's input
size. The matcher sees positive pairs at rate 0.3 and negatives whose reference comes from another
image (with probability 0.5 one of the query image's 128 nearest neighbours; with ``negative_roles="authors"``,
as the authors' code, the reference is the image drawn and the query its neighbour); the descriptor sees only
positive pairs (its negatives are the other pairs of the batch, made hard by GHNM). When finetuning
(table "... finetune pipeline") both images are only resized.

Everything a pair is made of is drawn from a generator seeded with ``(seed, batch, slot)`` (map-style)
or ``(seed, epoch, process, worker, position)`` (streaming), so the same run replays the same pairs,
in data-loader workers or not, and a resumed run continues with the data the interrupted one would
have seen.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Callable, Iterator

import datasets
import numpy as np
import torch
from PIL import Image

from ..modeling.errors import ConfigError
from ..pixtrace import CoordinateTable
from ..pixtrace.templates import Template
from .collator import CopyPair
from .hard_negatives import KNNGraph, PairKey
from .loading import ImageDecoder
from .templated import TemplateGroups, TemplatePairs

logger = logging.getLogger(__name__)

__all__ = ["NEGATIVE_ROLES", "OTHER_IMAGES", "RECIPES", "CopyPairMaker", "CopyPairDataset", "FinetuneMixDataset",
           "GroundTruthPairDataset", "StreamingCopyPairDataset"]

#: Names of the copy recipes a pair side can use: ``training`` (this package's heavy augmentation,
#: ``CopyRecipe.training()``), ``training_everyday`` (it widened with the edit families users meet,
#: ``CopyRecipe.training_everyday()``), ``light_copy`` (a few mild edits, ``CopyRecipe.light_copy()``: the second copy
#: of a copy-to-copy pair), ``paper_descriptor`` / ``paper_matcher`` (the authors' recipes,
#: ``CopyRecipe.paper_descriptor()`` / ``paper_matcher()``), ``off`` (no random edit, ``CopyRecipe.off()``:
#: the reference resized to the model input),
#: ``resize`` (no edit; finetuning), see :class:`CopyPairMaker`.
RECIPES = ("training", "training_everyday", "light_copy", "paper_descriptor", "paper_matcher", "off", "resize")

#: Where the crop group's "another image" comes from (``TrainingConfig.other_images``): ``training_images``
#: (another image of the training data, as the authors' ``background_paths``; recorded in the copy's edits
#: as ``{"kind": "pool", "id": ...}``) or ``procedural`` (noise or gradient images drawn from the seed).
OTHER_IMAGES = ("training_images", "procedural")

#: Which image of a negative pair is which side (``TrainingConfig.negative_roles``): ``package`` (the image a
#: pair is drawn for is the query, copy-edited; its neighbour or a random other image the reference) or
#: ``authors`` (their ``copy_dataset.py``: the image drawn is the reference, only resized; its neighbour or a
#: random other image the query). Positive pairs and the shared-template groups' negatives are the same either way.
NEGATIVE_ROLES = ("package", "authors")

#: The edits whose other image comes from the pool (the crop group's pastes) and the field holding it.
_POOL_FIELDS = {"paste_into_box": "background", "overlay_image_box": "overlay"}

#: ``pick(rng) -> (image id, image)``: another image of the training data (None: none available).
OtherImagePicker = Callable[[np.random.Generator], "tuple[str, Image.Image] | None"]

_SEED_SPACE = 2**31 - 1


class CopyPairMaker:
    """Make the two traced copies of a pair at the model's input size.

    Args:
        image_size: side ``S`` of the square model input.
        query_recipe: recipe of the query (``training`` by default).
        reference_recipe: recipe of the reference (``off`` by default; ``resize`` when finetuning).
        max_source_side: originals whose longer side exceeds this are first shrunk to it; 0 keeps them
            as they are. The default is ``4 * S`` when the query recipe renders fused (the package's
            ``training``: the copies are only ``S`` pixels wide and its parameters are relative to the
            image size, so a larger original only costs time: editing a 500x375 original for a 64x64
            model takes three times longer than editing it at 256 pixels), and 0 otherwise (the paper
            presets, ``off`` and ``resize``: the authors edit and resize the original at full
            resolution). The tables then refer to the shrunk original, which both copies of a pair share.
        fuse: ``None`` (the default) renders each copy as its recipe says (``CopyRecipe.fused``: the
            package's ``training`` with fused geometry, bilinear and antialiased; the paper presets,
            ``off`` and ``resize`` edit by edit with bicubic resampling, as the authors); ``True`` /
            ``False`` forces fused / edit-by-edit rendering. The tables are the same either way.
        negative_query_resize_prob: for a negative pair (``label`` 0), the probability that the query is
            only resized (the ``off`` recipe) instead of edited with ``query_recipe``: the authors' code
            (``copy_dataset.py``) resizes their negative's query with probability 0.5; 0.0 (the default)
            always edits it. The choice is drawn from the pair's ``query_seed``, so the pair replays.
        reference_copy_recipe, copy_to_copy_share: with probability ``copy_to_copy_share`` (drawn from the
            pair's ``reference_seed``) a pair's reference is made with ``reference_copy_recipe`` (``light_copy``)
            instead of ``reference_recipe``: two edited copies of one original, whose CopyNCE prior comes from
            both tables (beyond the paper, whose references are never edited; 0.0, the default, is the paper's
            recipe). Negative pairs draw it too, so that an edited reference says nothing of the label.

    ``maker(query_original, reference_original, label, query_seed, reference_seed)`` returns a
    :class:`CopyPair` whose tables map each copy to its own original (for a positive pair both
    originals are the same image, so the tables share a source and give the overlap priors).
    """

    def __init__(self, image_size: int, query_recipe: str = "training", reference_recipe: str = "off",
                 max_source_side: int | None = None, fuse: bool | None = None,
                 negative_query_resize_prob: float = 0.0, reference_copy_recipe: str = "light_copy",
                 copy_to_copy_share: float = 0.0):
        for key, value in (("query_recipe", query_recipe), ("reference_recipe", reference_recipe),
                           ("reference_copy_recipe", reference_copy_recipe)):
            if value not in RECIPES:
                raise ConfigError(f"{key}={value!r} is not a recipe; use one of {RECIPES}")
        for key, value in (("negative_query_resize_prob", negative_query_resize_prob),
                           ("copy_to_copy_share", copy_to_copy_share)):
            if isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"{key}={value!r} must be in [0, 1]")
        self.reference_copy_recipe = reference_copy_recipe
        self.copy_to_copy_share = float(copy_to_copy_share)
        self.negative_query_resize_prob = float(negative_query_resize_prob)
        self.image_size = int(image_size)
        self.query_recipe = query_recipe
        self.reference_recipe = reference_recipe
        self.fuse = None if fuse is None else bool(fuse)
        if max_source_side is None:
            max_source_side = 4 * self.image_size if self.fused(query_recipe) else 0
        self.max_source_side = int(max_source_side)
        if self.max_source_side and self.max_source_side < self.image_size:
            raise ConfigError(f"max_source_side={max_source_side} must be 0 or >= image_size={image_size}")
        self._editors: dict[str, object] = {}

    def fused(self, recipe: str) -> bool:
        """Whether the copies of ``recipe`` are rendered fused (``fuse``, else the recipe's own setting)."""
        if self.fuse is not None:
            return self.fuse
        if recipe == "resize":
            return False
        from ..pixtrace import CopyRecipe

        return CopyRecipe.preset(recipe).fused

    def source(self, image: Image.Image) -> Image.Image:
        """The original the copies are made from: ``image``, shrunk to ``max_source_side`` if larger
        (by the fused renderer's resampler when the query recipe renders fused; else by Pillow's
        bilinear resize)."""
        limit = self.max_source_side
        if not limit or max(image.size) <= limit:
            return image
        scale = limit / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        if self.fused(self.query_recipe) and image.mode == "RGB":  # the fused renderer's resampler: faster
            from ..pixtrace.fused import resize_image

            return resize_image(image, size[::-1])
        return image.resize(size, Image.BILINEAR, reducing_gap=2.0)

    def editor(self, recipe: str):
        """The :class:`~copynce_hf.pixtrace.CopyEditor` behind :meth:`copy` for ``recipe`` (one of
        ``RECIPES`` but ``resize``, which edits nothing); ``editor.draw`` gives a copy's chain."""
        if recipe not in RECIPES or recipe == "resize":
            raise ConfigError(f"recipe={recipe!r} has no editor; use one of {[r for r in RECIPES if r != 'resize']}")
        editor = self._editors.get(recipe)
        if editor is None:
            from ..pixtrace import CopyEditor, CopyRecipe

            spec = CopyRecipe.preset(recipe)
            editor = CopyEditor(seed=0, recipe=spec, output_size=(self.image_size, self.image_size),
                                fuse=self.fused(recipe))
            self._editors[recipe] = editor
        return editor

    def copy(self, image: Image.Image, recipe: str, seed: int, other_images: OtherImagePicker | None = None,
             template: Template | None = None) -> tuple[Image.Image, CoordinateTable, list]:
        """One traced copy of ``image`` at ``S x S`` made by the preset ``recipe``: ``(copy, table to image, edits)``.

        ``edits`` is the list of ``Edit.to_dict()`` drawn: ``pixtrace.replay(image, edits, fuse=maker.fused(recipe))`` rebuilds the
        same copy and table from the same ``image`` (for a pair, the original after :meth:`source`).
        With ``other_images``, the crop group's pastes (``paste_into_box``, ``overlay_image_box``) take
        another image of the training data instead of a procedural one, drawn with a generator seeded
        by ``seed``; ``edits`` names it ``{"kind": "pool", "id": ...}`` and replays after
        ``pixtrace.bind_pool_images(edits, {id: image})``. With ``template``, the copy (at ``S x S``) is put
        into it and resized back to ``S x S`` (bicubic), see :meth:`templated_copy`.
        """
        from ..pixtrace.edits.geometric import Resize

        if template is not None:
            return self.templated_copy(image, recipe, seed, template, other_images)
        size = self.image_size
        if recipe == "resize":
            table = CoordinateTable.identity(image.height, image.width)
            edited, edits = image, []
            if self.fused(recipe) and image.size != (size, size):  # as the editor renders (and replay replays) it
                from ..pixtrace.fused import render_fused

                edited, table = render_fused(image, [Resize(size, size)])
                edits.append(Resize(size, size).to_dict())
        elif other_images is None:
            result = self.editor(recipe)(image, seed=int(seed))
            edited, table, edits = result.image, result.table, list(result.edits)
        else:
            from ..pixtrace import replay

            drawn = [edit.to_dict() for edit in self.editor(recipe).draw((image.height, image.width), seed=int(seed))]
            edits, bound = _with_pool_images(drawn, other_images, np.random.default_rng([int(seed), 0x0A11]))
            result = replay(image, bound, fuse=self.fused(recipe))  # the editor's own rendering of the chain
            edited, table = result.image, result.table
        if edited.size != (size, size):  # the model input size: both the pixels and the table (bicubic:
            resize = Resize(size, size, resample="bicubic")  # as the image processor and the authors' resize)
            edited, table = resize(edited, table)
            edits.append(resize.to_dict())
        return edited, table, edits

    def templated_copy(self, image: Image.Image, recipe: str, seed: int, template: Template,
                       other_images: OtherImagePicker | None = None) -> tuple[Image.Image, CoordinateTable, list]:
        """:meth:`copy` put into ``template``: the copy's chain (ending at ``S x S``), the template's edits for an
        ``S x S`` image, then a bicubic resize to ``S x S``, rendered as one chain (fused where the recipe is), so
        that ``pixtrace.replay`` of ``edits`` (after ``bind_pool_images`` of the pool images it names, the
        template's background photo among them) rebuilds the same copy and table. Template pixels are untraced."""
        from ..pixtrace import bind_pool_images, replay
        from ..pixtrace.edits.geometric import Resize

        size = self.image_size
        logged, bound = self._chain(image, recipe, seed, other_images)
        final = Resize(size, size, resample="bicubic").to_dict()
        if _chain_size(bound, (image.height, image.width)) != (size, size):
            logged, bound = logged + [final], bound + [final]
        framed = template.edit_dicts((size, size))
        images = {} if template.background is None else {str(template.params["image"]["id"]): template.background}
        logged = logged + framed + [final]
        bound = bound + bind_pool_images(framed, images) + [final]
        result = replay(image, bound, fuse=self.fused(recipe))
        return result.image, result.table, logged

    def _chain(self, image: Image.Image, recipe: str, seed: int,
               other_images: OtherImagePicker | None) -> tuple[list[dict], list[dict]]:
        """``(edits naming pool images by id, the same edits holding them)`` that :meth:`copy` draws for ``image``."""
        if recipe == "resize":
            return [], []
        drawn = [edit.to_dict() for edit in self.editor(recipe).draw((image.height, image.width), seed=int(seed))]
        if other_images is None:
            return drawn, drawn
        return _with_pool_images(drawn, other_images, np.random.default_rng([int(seed), 0x0A11]))

    def reference_recipe_for(self, reference_seed: int) -> str:
        """The recipe of a pair's reference: ``reference_copy_recipe`` with probability ``copy_to_copy_share``
        (drawn from ``reference_seed``), else ``reference_recipe``."""
        if not self.copy_to_copy_share:
            return self.reference_recipe
        draw = np.random.default_rng([int(reference_seed), 0xC2C]).random()
        return self.reference_copy_recipe if draw < self.copy_to_copy_share else self.reference_recipe

    def query_recipe_for(self, label: int, query_seed: int) -> str:
        """The recipe of a pair's query: ``query_recipe``, or ``off`` for a negative pair drawn to be only
        resized (probability ``negative_query_resize_prob``, from ``query_seed``)."""
        if label or not self.negative_query_resize_prob:
            return self.query_recipe
        draw = np.random.default_rng([int(query_seed), 0x0FF]).random()
        return "off" if draw < self.negative_query_resize_prob else self.query_recipe

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
        other_images: OtherImagePicker | None = None,
        query_template: Template | None = None,
        reference_template: Template | None = None,
    ) -> CopyPair:
        """The pair; ``edits`` holds each side's chain, the ``recipes`` they were drawn with and, where a side is
        put into a template, ``templates`` (``{"query": Template.to_dict() or None, "reference": ...}``)."""
        same = reference_original is query_original
        query_original = self.source(query_original)
        reference_original = query_original if same else self.source(reference_original)
        recipes = {"query": self.query_recipe_for(label, query_seed), "reference": self.reference_recipe_for(reference_seed)}
        query, query_table, query_edits = self.copy(query_original, recipes["query"], query_seed, other_images,
                                                  query_template)
        reference, reference_table, reference_edits = self.copy(reference_original, recipes["reference"], reference_seed,
                                                              other_images, reference_template)
        edits = {"query": query_edits, "reference": reference_edits, "recipes": recipes}
        if query_template is not None or reference_template is not None:
            edits["templates"] = {side: None if template is None else template.to_dict()
                                  for side, template in (("query", query_template), ("reference", reference_template))}
        return CopyPair(
            query=query,
            reference=reference,
            query_table=query_table,
            reference_table=reference_table,
            label=int(label),
            query_id=query_id,
            reference_id=reference_id,
            skipped_images=skipped_images,
            edits=edits,
        )


def _chain_size(edits: list[dict], size: tuple[int, int]) -> tuple[int, int]:
    """(H, W) of the image a chain of ``Edit.to_dict()`` records makes from an image of ``size``."""
    from ..pixtrace.edits.base import edit_from_dict

    for description in edits:
        edit = edit_from_dict(description)
        if edit.kind == "geometric":
            size = edit.output_size(size)
    return size


def _with_pool_images(edits: list[dict], other_images: OtherImagePicker,
                      rng: np.random.Generator) -> tuple[list[dict], list[dict]]:
    """``(edits naming the pool images by id, the same edits holding the images)`` of a drawn chain whose
    crop-group pastes take other images of the training data (procedural ones stay where none is available)."""
    logged, bound = [], []
    for description in edits:
        field = _POOL_FIELDS.get(description["name"])
        picked = other_images(rng) if field is not None else None
        if picked is None:
            logged.append(description)
            bound.append(description)
            continue
        image_id, image = picked
        params = description["params"]
        logged.append({**description, "params": {**params, field: {"kind": "pool", "id": str(image_id)}}})
        bound.append({**description, "params": {**params, field: image}})
    return logged, bound


def _check_other_images(other_images: str) -> None:
    if other_images not in OTHER_IMAGES:
        raise ConfigError(f"other_images={other_images!r} must be one of {OTHER_IMAGES}")


def _check_negative_roles(negative_roles: str) -> None:
    if negative_roles not in NEGATIVE_ROLES:
        raise ConfigError(f"negative_roles={negative_roles!r} must be one of {NEGATIVE_ROLES}")


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
        hard_negative_k, hard_negative_prob: a negative pair's partner is one of the drawn image's
            ``hard_negative_k`` nearest neighbours with probability ``hard_negative_prob``
            (matcher: 128 and 0.5), else a random other image.
        negative_roles: which side of a negative pair each image is (:data:`NEGATIVE_ROLES`): ``package`` (the
            default) makes the drawn image (row ``key.index``) the query and its partner the reference;
            ``authors`` (their ``copy_dataset.py``) makes the drawn image the reference and its partner the query.
        decoder: the :class:`ImageDecoder` (counts unreadable images).
        max_retries: unreadable images replaced by random others before giving up on a pair.
        other_images: ``training_images`` (default): the crop group's pastes take a random other image of
            ``images`` (drawn from the pair's seed, named by id in the recipe); ``procedural``: noise or
            gradient images (see :data:`OTHER_IMAGES`).
        templates: how the slots of shared-template groups make their pairs (:class:`~.templated.TemplatePairs`;
            the groups come with the keys, from the batch sampler's ``template_groups``); ``None``: no slot is
            templated. A templated slot puts its query into its group's template (a ``background`` template's
            photo is another image of ``images``, not one of the group's), its positive reference too with
            probability ``templates.reference_prob``; its negative pair takes another image of the group, in
            the same template, as the reference (the template-sharing negative).
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
        other_images: str = "training_images",
        templates: TemplatePairs | None = None,
        negative_roles: str = "package",
    ):
        _check_rates(positive_rate, hard_negative_prob, hard_negative_k)
        _check_other_images(other_images)
        _check_negative_roles(negative_roles)
        self.negative_roles = negative_roles
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
        self.other_images = other_images
        self.templates = templates

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

    def _other_image_picker(self, index: int) -> OtherImagePicker | None:
        """An image of the dataset, uniformly over all rows, row ``index`` (the copy's own image) included, as
        the authors' ``get_the_other_image`` draws it (their ``batch_indices`` exclusion is never passed);
        None with ``procedural``."""
        if self.other_images != "training_images":
            return None

        def pick(rng: np.random.Generator) -> tuple[str, Image.Image]:
            row, image, _ = self._decode(int(rng.integers(len(self.images))), rng)
            return self.images[row]["image_id"], image

        return pick

    def __getitem__(self, key: PairKey | int) -> CopyPair:
        if not isinstance(key, PairKey):
            key = PairKey(0, int(key), int(key))
        rng = np.random.default_rng([self.seed, 0xC0B1, key.batch, key.slot])
        label = int(rng.random() < self.positive_rate)
        query_seed, reference_seed = (int(s) for s in rng.integers(_SEED_SPACE, size=2))
        index, query_original, skipped = self._decode(key.index, rng)
        query_id = self.images[index]["image_id"]
        if self.templates is not None and key.template_group >= 0:
            return self._templated_pair(key, label, (index, query_original, query_id), (query_seed, reference_seed),
                                        skipped)
        if label:
            reference_original, reference_id = query_original, query_id
        else:
            partner, reference_original, more = self._decode(self._negative_partner(index, rng), rng, avoid=index)
            skipped += more
            reference_id = self.images[partner]["image_id"]
            if self.negative_roles == "authors":  # their copy_dataset.py: the drawn image is the reference
                query_original, reference_original = reference_original, query_original
                query_id, reference_id = reference_id, query_id
        return self.maker(query_original, reference_original, label, query_seed, reference_seed,
                          query_id=query_id, reference_id=reference_id, skipped_images=skipped,
                          other_images=self._other_image_picker(index))


    def _templated_pair(self, key: PairKey, label: int, query: tuple[int, Image.Image, str], seeds: tuple[int, int],
                        skipped: int) -> CopyPair:
        """The pair of a slot of a shared-template group (see ``templates`` in the class docstring)."""
        index, query_original, query_id = query
        template = self.templates.template((self.seed, key.batch, key.template_group),
                                           self._background_picker(set(key.group_images)))
        choices = self.templates.slot_generator((self.seed, key.batch, key.slot))
        if label:
            reference_original, reference_id = query_original, query_id
            reference_template = template if choices.random() < self.templates.reference_prob else None
        else:
            members = [member for member in key.group_images if member != index]
            partner = members[int(choices.integers(len(members)))] if members else self._negative_partner(index, choices)
            partner, reference_original, more = self._decode(partner, choices, avoid=index)
            skipped += more
            reference_id, reference_template = self.images[partner]["image_id"], template
        return self.maker(query_original, reference_original, label, *seeds, query_id=query_id, reference_id=reference_id,
                          skipped_images=skipped, other_images=self._other_image_picker(index), query_template=template,
                          reference_template=reference_template)

    def _background_picker(self, avoid: set[int]) -> OtherImagePicker:
        """A ``background`` template's photo: an image of the dataset drawn uniformly, not one of ``avoid`` (the
        group's images, whose pixels would otherwise be in every member's frame). Whatever ``other_images`` says:
        a background is a photo."""

        def pick(rng: np.random.Generator) -> tuple[str, Image.Image]:
            row = int(rng.integers(len(self.images)))
            while row in avoid and len(avoid) < len(self.images):
                row = int(rng.integers(len(self.images)))
            row, image, _ = self._decode(row, rng)
            return self.images[row]["image_id"], image

        return pick


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


class FinetuneMixDataset(torch.utils.data.Dataset):
    """The authors' matcher finetuning data (``train/matching/finetune.yaml``): ground-truth pairs and, with
    them, copy pairs of a fresh sample of training images every epoch.

    Rows ``0 .. G-1`` are the rows of ``ground_truth`` (G pairs); rows ``G .. G+T-1``, with ``T =
    int(N * sampling_rate)`` for ``N`` training images (their ``__len__``), each make one pair of
    ``training`` from an image drawn uniformly in its block of ``int(1 / sampling_rate)`` images: row
    ``G + j`` takes image ``int(j / sampling_rate) + u``, ``u`` uniform in ``0 .. int(1 / sampling_rate) - 1``
    (capped at ``N - 1``), as their ``CopyDataset.__getitem__`` (``sampling_rate`` 0.0833: about one training
    image in 12 per epoch). The draw comes from the pair's key, so each epoch samples other images and a
    pair replays. The two kinds of pairs share the batches: the training pairs carry PixTrace tables, the
    ground-truth pairs none.

    Args:
        ground_truth: the :class:`GroundTruthPairDataset` (the authors': positives only).
        training: a :class:`CopyPairDataset` over the training images (the authors': ``paper_matcher``
            copies, positive rate 0.3, k-NN hard negatives with probability 0.5).
        sampling_rate: in (0, 1], the fraction of training images used per epoch.
        seed: data seed.
    """

    def __init__(self, ground_truth: GroundTruthPairDataset, training: CopyPairDataset, sampling_rate: float,
                 seed: int = 0):
        if isinstance(sampling_rate, bool) or not 0.0 < sampling_rate <= 1.0:
            raise ConfigError(f"mix sampling_rate={sampling_rate!r} must be in (0, 1]")
        self.num_training = int(len(training) * sampling_rate)
        if self.num_training == 0:
            raise ConfigError(f"mix sampling_rate={sampling_rate} of {len(training)} training images selects none: "
                              f"give more images or a larger rate")
        self.ground_truth, self.training = ground_truth, training
        self.sampling_rate, self.seed = float(sampling_rate), seed
        self.block = max(1, int(1.0 / self.sampling_rate))

    def __len__(self) -> int:
        return len(self.ground_truth) + self.num_training

    @property
    def skipped(self) -> int:
        return self.ground_truth.skipped + self.training.skipped

    def is_training_row(self, index: int) -> bool:
        """Whether row ``index`` makes a training copy pair (else a ground-truth pair)."""
        return index >= len(self.ground_truth)

    def training_image(self, key: PairKey) -> int:
        """The training image row that a training row's pair of ``key`` is made from."""
        rng = np.random.default_rng([self.seed, 0x6D78, key.batch, key.slot])
        first = int((key.index - len(self.ground_truth)) / self.sampling_rate)
        return min(first + int(rng.integers(self.block)), len(self.training) - 1)

    def __getitem__(self, key: PairKey | int) -> CopyPair:
        if not isinstance(key, PairKey):
            key = PairKey(0, int(key), int(key))
        if not self.is_training_row(key.index):
            return self.ground_truth[key]
        return self.training[PairKey(key.batch, key.slot, self.training_image(key))]


class StreamingCopyPairDataset(torch.utils.data.IterableDataset):
    """Copy pairs over a streamed image dataset (``datasets.IterableDataset``, e.g. a Hub id).

    Each process reads its part of the stream (``datasets.distributed.split_dataset_by_node``), each
    data-loader worker its shards in order; rows are drawn at random from a buffer of
    ``shuffle_buffer_size`` rows, with a random state that changes with the epoch (``set_epoch``).
    Negative references come from a pool of the last ``negative_pool`` readable images of the
    worker's stream (GHNM needs random access: use :class:`CopyPairDataset` for it; with
    ``negative_roles="authors"`` the pool image is the query and the current image the reference); with
    ``other_images="training_images"`` (the default) the crop group's pastes take their other image
    from the same bounded pool (the current image excluded), named by id in the recipe.

    Iterating returns a :class:`StreamingPairIterator`, whose ``state_dict()`` is exactly where the
    worker is (``datasets``' own position in its shards, the buffered rows, the negative pool, the
    random state): a ``torchdata`` ``StatefulDataLoader`` saves it per worker and a resumed run
    continues with the very pairs an uninterrupted one would get, without reading consumed rows again.

    With ``template_groups`` and ``templates`` (beyond the paper, :mod:`.templated`), the worker's pairs are
    seen in windows of ``batch_size`` consecutive positions (the batches the loader makes of them): the
    groups of :meth:`TemplateGroups.groups` are runs of consecutive positions whose images (different ids) are
    read together when the run starts; each member's query goes into the group's template (a ``background``
    template's photo is an image of the negative pool, not one of the group's), its positive reference too
    with probability ``templates.reference_prob``, and its negative pair takes another member, in the same
    template, as the reference. The group's rows and template are part of the resumable state.
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
        other_images: str = "training_images",
        template_groups: TemplateGroups | None = None,
        templates: TemplatePairs | None = None,
        negative_roles: str = "package",
    ):
        _check_rates(positive_rate, 0.0, 1)
        _check_other_images(other_images)
        _check_negative_roles(negative_roles)
        self.negative_roles = negative_roles
        self.other_images = other_images
        self.template_groups = template_groups if template_groups is not None else TemplateGroups()
        self.templates = templates
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

    @property
    def skipped(self) -> int:
        return self.decoder.skipped

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _stream(self) -> datasets.IterableDataset:
        # Rows are shuffled by this class's buffer, whose content is part of the resumable state:
        # ``datasets``' own shuffle buffer is lost by its state_dict (and, in datasets 5.2, a shuffled
        # stream's state does not load back into a worker holding several shards).
        stream = copy.deepcopy(self.images)  # its own iteration state: loading one must not touch the shared stream
        stream.set_epoch(self.epoch)
        if self.num_processes > 1:
            stream = datasets.distributed.split_dataset_by_node(stream, self.process_index, self.num_processes)
        return stream

    def __iter__(self) -> StreamingPairIterator:
        return StreamingPairIterator(self)


class StreamingPairIterator:
    """One data-loader worker's pass over a :class:`StreamingCopyPairDataset` epoch (torchdata ``Stateful``).

    ``state_dict()`` after any pair holds ``datasets``' iteration state of the worker's shards
    (``IterableDataset.state_dict()``), the rows read but not yet drawn from the shuffle buffer, the
    negative pool, the buffer's random state and the pair position; ``load_state_dict`` before the first
    ``next`` continues from there, reading only rows that were never read.
    """

    def __init__(self, dataset: StreamingCopyPairDataset):
        self.dataset = dataset
        self._loaded: dict = {}
        self._pairs: Iterator[CopyPair] | None = None
        self.rows_read = 0  # rows taken from the stream by this iterator (not counting a loaded state's)

    def __iter__(self) -> StreamingPairIterator:
        return self

    def __next__(self) -> CopyPair:
        if self._pairs is None:
            self._pairs = self._generate()
        return next(self._pairs)

    def load_state_dict(self, state: dict) -> None:
        if self._pairs is not None:
            raise RuntimeError("load_state_dict must come before the first pair is drawn")
        if state and state.get("epoch") != self.dataset.epoch:
            raise ValueError(f"the stream state is of epoch {state.get('epoch')}, the dataset is at epoch "
                             f"{self.dataset.epoch}")
        self._loaded = dict(state)

    def state_dict(self) -> dict:
        if self._pairs is None:
            return dict(self._loaded)
        state = {"epoch": self.dataset.epoch, "stream": self._stream.state_dict(), "buffer": list(self._buffer),
                 "read_all": self._read_all, "pool": list(self._pool), "rng": self._rng.bit_generator.state,
                 "position": self._position}
        if self._group_done < len(self._group):  # inside a shared-template group: its rows and template
            state.update(group=list(self._group), group_done=self._group_done, template=self._template.to_dict(),
                         template_background=self._template_background)
        return state

    def _next_row(self, rows: Iterator[dict]) -> dict | None:
        """A row drawn at random from the buffer, refilled from the stream first (None: epoch over)."""
        while not self._read_all and len(self._buffer) < max(1, self.dataset.shuffle_buffer_size):
            row = next(rows, None)
            if row is None:
                self._read_all = True
            else:
                self.rows_read += 1
                self._buffer.append(row)
        if not self._buffer:
            return None
        i = int(self._rng.integers(len(self._buffer))) if len(self._buffer) > 1 else 0
        self._buffer[i], self._buffer[-1] = self._buffer[-1], self._buffer[i]
        return self._buffer.pop()

    def _generate(self) -> Iterator[CopyPair]:
        data, state = self.dataset, self._loaded
        info = torch.utils.data.get_worker_info()
        self._worker = info.id if info is not None else 0
        self._stream = data._stream()
        if state.get("stream"):
            self._stream.load_state_dict(state["stream"])
        self._buffer: list[dict] = list(state.get("buffer", ()))
        self._read_all = bool(state.get("read_all", False))
        self._pool: deque = deque(state.get("pool", ()), maxlen=data.negative_pool)
        self._rng = np.random.default_rng([data.seed, 0x5B0F, data.epoch, data.process_index, self._worker])
        if "rng" in state:
            self._rng.bit_generator.state = state["rng"]
        self._position = int(state.get("position", 0))
        self._load_group(state)
        rows: Iterator[dict] = iter(()) if self._read_all else iter(self._stream)
        self._reported = data.decoder.skipped  # skips are reported once, in the pair that follows them
        while True:
            if self._group_done >= len(self._group):
                self._start_group(rows)
            if self._group:  # a member of a shared-template group (readable, read when the group started)
                row = self._group[self._group_done]
                yield self._pair(row, data.decoder(row["image"], row["image_id"]), in_group=True)
                continue
            row = self._next_row(rows)
            if row is None:
                return
            image = data.decoder(row["image"], row["image_id"])
            if image is not None:
                yield self._pair(row, image, in_group=False)

    def _key(self) -> tuple[int, ...]:
        """The pair at the current position: ``(seed, epoch, process, worker, position)``."""
        data = self.dataset
        return data.seed, data.epoch, data.process_index, self._worker, self._position

    def _pair(self, row: dict, image: Image.Image, in_group: bool) -> CopyPair:
        """The pair of the current position made from ``row`` (``image`` decoded); a group member's in its template."""
        data = self.dataset
        key = self._key()
        rng = np.random.default_rng([data.seed, 0x57AE, *key[1:]])
        self._position += 1
        label = int(rng.random() < data.positive_rate or not self._pool)
        query_seed, reference_seed = (int(s) for s in rng.integers(_SEED_SPACE, size=2))
        partner = None if label else self._pool[int(rng.integers(len(self._pool)))]
        query_template = reference_template = None
        if in_group:
            self._group_done += 1
            choices = data.templates.slot_generator(key)
            query_template = self._template
            if label:
                reference_template = self._template if choices.random() < data.templates.reference_prob else None
            else:
                members = [member for member in self._group if member["image_id"] != row["image_id"]]
                partner = members[int(choices.integers(len(members)))] if members else partner
                reference_template = self._template
        others = self._other_image_picker(list(self._pool))
        self._pool.append(row)
        skipped, self._reported = data.decoder.skipped - self._reported, data.decoder.skipped
        if partner is None:
            reference_original, reference_id = image, row["image_id"]
        else:
            reference_original = data.decoder(partner["image"], partner["image_id"])
            reference_id = partner["image_id"]
        query_id = row["image_id"]
        if partner is not None and not in_group and data.negative_roles == "authors":  # the drawn image: the reference
            image, reference_original, query_id, reference_id = reference_original, image, reference_id, query_id
        return data.maker(image, reference_original, label, query_seed, reference_seed, query_id=query_id,
                          reference_id=reference_id, skipped_images=skipped, other_images=others,
                          query_template=query_template, reference_template=reference_template)

    def _start_group(self, rows: Iterator[dict]) -> None:
        """At the first position of a shared-template group (in its ``batch_size`` window): read its members'
        rows (readable images of different ids; fewer where the epoch ends or an id repeats, which goes back to
        the buffer) and draw its template; elsewhere no group."""
        data = self.dataset
        self._group, self._group_done, self._template, self._template_background = [], 0, None, None
        slot = self._position % data.batch_size
        run = next((run for run in data.template_groups.groups(data.batch_size) if run.start == slot), None)
        if data.templates is None or run is None:
            return
        while len(self._group) < len(run) and (row := self._next_row(rows)) is not None:
            if any(member["image_id"] == row["image_id"] for member in self._group):
                self._buffer.append(row)
                break
            if data.decoder(row["image"], row["image_id"]) is not None:
                self._group.append(row)
        if self._group:
            members = {member["image_id"] for member in self._group}
            candidates = [row for row in self._pool if row["image_id"] not in members]
            self._template = data.templates.template(self._key(), self._background_picker(candidates))
            if self._template.background is not None:
                photo = self._template.params["image"]["id"]
                self._template_background = next(row for row in candidates if row["image_id"] == photo)

    def _background_picker(self, rows: list[dict]) -> OtherImagePicker | None:
        """A ``background`` template's photo: one of ``rows`` (the negative pool less the group's images),
        uniformly; None (a procedural gradient) when there is none or it is unreadable."""
        if not rows:
            return None
        return self._picker(rows)

    def _load_group(self, state: dict) -> None:
        """The shared-template group a loaded state stopped inside (its rows, progress and template)."""
        self._group: list[dict] = list(state.get("group", ()))
        self._group_done = int(state.get("group_done", 0))
        self._template, self._template_background = None, state.get("template_background")
        if state.get("template") is not None:
            row = self._template_background
            photo = None if row is None else self.dataset.decoder(row["image"], row["image_id"])
            self._template = Template.from_dict(state["template"], photo)

    def _other_image_picker(self, rows: list[dict]) -> OtherImagePicker | None:
        """One of ``rows`` (the recent images before the current one), uniformly; None with ``procedural``
        or an empty pool (the pastes then stay procedural; an unreadable row too)."""
        if self.dataset.other_images != "training_images" or not rows:
            return None
        return self._picker(rows)

    def _picker(self, rows: list[dict]) -> OtherImagePicker:
        """One of ``rows``, uniformly, decoded (None where it is unreadable)."""
        decoder = self.dataset.decoder

        def pick(rng: np.random.Generator) -> tuple[str, Image.Image] | None:
            row = rows[int(rng.integers(len(rows)))]
            image = decoder(row["image"], row["image_id"])
            return None if image is None else (row["image_id"], image)

        return pick
