"""The calibration collection ``copynce dedup`` calibrates its default threshold on: a sample of the collection's
own images, PixTrace copies of them, copies put into templates, and copies of copies.

From a seeded sample of the collection's readable images (:func:`draw_sample`), :func:`synthetic_set` makes, for
each sampled image ``x``:

* ``copy1`` and ``copy2``: two copies drawn with the evaluation recipe
  (:meth:`CopyRecipe.minidisc_queries <copynce_hf.pixtrace.CopyRecipe.minidisc_queries>`, whose edits the
  training recipes never draw);
* ``template``: ``x`` put into a template (:class:`~copynce_hf.pixtrace.templates.TemplateRecipe`: an app frame,
  a meme band, a background photo, a text-and-emoji overlay), one template drawn per group of
  :data:`TEMPLATE_GROUP` sampled images (a background photo is an image of the collection outside the sample).

Any two of these images have a known kind (:func:`pair_kind`; :data:`COPY_KINDS` are copies, :data:`NON_COPY_KINDS`
are not): two images made from the same sampled image are copies (``copy``: a copy and its original, ``copy of
copy``, ``template copy``: a templated image and another image of its original); two made from different sampled
images are not (``shared template``: two templated images of one group, sharing the template's pixels and
nothing else; ``other image`` otherwise). :attr:`SyntheticSet.pairs` lists the copy pairs each sampled image makes
and the template-sharing pairs of each group.

Images stay in memory (the originals are read again from the collection when needed): nothing is written into the
collection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from PIL import Image

from ..modeling.errors import ConfigError, ImageLoadError
from ..pixtrace import CopyRecipe
from ..pixtrace.templates import TemplateRecipe

#: Pair kinds that are copies.
COPY_KINDS = ("copy", "template copy", "copy of copy")
#: Pair kinds that are not.
NON_COPY_KINDS = ("shared template", "other image")
#: Sampled images put into one drawn template (a remainder of one joins the last group).
TEMPLATE_GROUP = 3
#: The copy recipe of the synthetic copies (a :meth:`CopyRecipe.preset` name the training recipes never draw).
COPY_RECIPE = "minidisc_queries"
#: Sampled images (and background photos) are shrunk to at most this side before they are edited, so that a
#: sample of large photos stays small in memory (the models see far fewer pixels; the evaluation recipe's copies
#: are at most 512 pixels).
MAX_SIDE = 1024


@dataclasses.dataclass
class SyntheticPair:
    """One pair of synthetic images: the ``query`` and ``reference`` synthetic ids (the earlier one first), its
    ``kind`` (:data:`COPY_KINDS` or :data:`NON_COPY_KINDS`), and once a dedup run verified it, its decision
    ``score`` and its ``raw`` score (``None`` until then)."""

    query: str
    reference: str
    kind: str
    score: float | None = None
    raw: float | None = None

    @property
    def is_copy(self) -> bool:
        return self.kind in COPY_KINDS


@dataclasses.dataclass
class SyntheticSet:
    """The synthetic images and pairs of one self-calibration.

    Attributes:
        sample: the sampled collection ids; sampled image ``i`` is ``sample[i]``, its synthetic ids are
            ``{i:04d}:original``, ``{i:04d}:copy1``, ``{i:04d}:copy2``, ``{i:04d}:template``.
        images: synthetic id -> a PIL image, or a callable reading the original from the collection.
        records: synthetic id -> how it was made (``of``: the collection id; ``edits``: the ``Edit.to_dict()``
            records; ``template``: the template's ``group`` number and its ``Template.to_dict()``).
        pairs: the :class:`SyntheticPair` rows.
    """

    sample: list[str]
    images: dict[str, Image.Image | Callable[[], Image.Image]]
    records: dict[str, dict]
    pairs: list[SyntheticPair]

    def originals(self) -> list[str]:
        """The synthetic ids of the sampled originals, in sample order."""
        return [original_id(i) for i in range(len(self.sample))]


def original_id(position: int) -> str:
    """The synthetic id of sampled image ``position`` itself."""
    return f"{position:04d}:original"


def pair_kind(records: dict[str, dict], a: str, b: str) -> str:
    """The kind of the pair of synthetic images ``a`` and ``b`` (see the module), from their ``records``."""
    first, second = records[a], records[b]
    if first["of"] != second["of"]:
        shared = "template" in first and "template" in second and (
            first["template"]["group"] == second["template"]["group"])
        return "shared template" if shared else "other image"
    roles = {image.rsplit(":", 1)[-1] for image in (a, b)}
    if "template" in roles:
        return "template copy"
    return "copy of copy" if roles == {"copy1", "copy2"} else "copy"


def _shrunk(image: Image.Image) -> Image.Image:
    """``image`` in RGB, shrunk to at most :data:`MAX_SIDE` pixels (aspect kept)."""
    image = image.convert("RGB")
    if max(image.size) > MAX_SIDE:
        image.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.BILINEAR)
    return image


def draw_sample(source, size: int, seed: int) -> list[tuple[int, Image.Image]]:
    """``size`` readable images of ``source`` (fewer when it has fewer), drawn in a seeded order:
    ``[(position in the source, image shrunk to MAX_SIDE), ...]`` in the drawn order; unreadable images are passed
    over."""
    if size < 1:
        raise ConfigError(f"the self-calibration sample must hold at least 1 image, got {size}")
    drawn = []
    for position in np.random.default_rng([seed, 0]).permutation(len(source)):
        if len(drawn) == size:
            break
        try:
            drawn.append((int(position), _shrunk(source.load(int(position)))))
        except ImageLoadError:
            continue
    return drawn


def _background_picker(source, sampled: set[int]) -> Callable:
    """A :data:`~copynce_hf.pixtrace.templates.BackgroundPicker` over the collection's images outside the sample
    (``None``, a procedural gradient, when there is none or the one drawn cannot be read)."""
    others = [i for i in range(len(source)) if i not in sampled]

    def pick(rng: np.random.Generator):
        if not others:
            return None
        position = others[int(rng.integers(len(others)))]
        try:
            return source.ids[position], _shrunk(source.load(position))
        except ImageLoadError:
            return None

    return pick


def template_groups(count: int, rng: np.random.Generator) -> list[list[int]]:
    """Sample positions ``0..count-1`` in groups of :data:`TEMPLATE_GROUP` (seeded order; a last group of one joins
    the one before)."""
    order = [int(i) for i in rng.permutation(count)]
    groups = [order[start:start + TEMPLATE_GROUP] for start in range(0, count, TEMPLATE_GROUP)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return groups


def synthetic_set(source, size: int, seed: int) -> SyntheticSet:
    """Draw the sample (:func:`draw_sample`) and make its copies, templated images and pairs (see the module's
    docstring); every draw comes from ``seed``."""
    drawn = draw_sample(source, size, seed)
    if not drawn:
        raise ConfigError("no image of the collection could be read for the self-calibration")
    recipe = CopyRecipe.preset(COPY_RECIPE)
    made = SyntheticSet([source.ids[position] for position, _ in drawn], {}, {}, [])
    for i, (position, image) in enumerate(drawn):
        made.images[original_id(i)] = (lambda where=position: source.load(where))
        made.records[original_id(i)] = {"of": source.ids[position]}
        for copy in (1, 2):
            edited, _, edits = recipe.apply(image, np.random.default_rng([seed, copy, i]))
            made.images[f"{i:04d}:copy{copy}"] = edited
            made.records[f"{i:04d}:copy{copy}"] = {"of": source.ids[position], "edits": edits}
        made.pairs += [SyntheticPair(f"{i:04d}:copy1", original_id(i), "copy"),
                       SyntheticPair(f"{i:04d}:copy1", f"{i:04d}:copy2", "copy of copy")]
    _put_into_templates(made, drawn, source, seed)
    return made


def _put_into_templates(made: SyntheticSet, drawn: list[tuple[int, Image.Image]], source, seed: int) -> None:
    """Add each sampled image put into its group's template, its ``template copy`` pair, and the ``shared
    template`` pairs of each group."""
    rng = np.random.default_rng([seed, 3])
    picker = _background_picker(source, {position for position, _ in drawn})
    for number, group in enumerate(template_groups(len(drawn), rng)):
        template = TemplateRecipe().draw(rng, backgrounds=picker)
        for i in group:
            image = drawn[i][1]
            templated, _ = template.apply(image)
            made.images[f"{i:04d}:template"] = templated
            made.records[f"{i:04d}:template"] = {"of": made.sample[i], "template": {"group": number, **template.to_dict()},
                                                 "edits": template.edit_dicts((image.height, image.width))}
            made.pairs.append(SyntheticPair(f"{i:04d}:template", original_id(i), "template copy"))
        made.pairs += [SyntheticPair(f"{a:04d}:template", f"{b:04d}:template", "shared template")
                       for n, a in enumerate(group) for b in group[n + 1:]]
