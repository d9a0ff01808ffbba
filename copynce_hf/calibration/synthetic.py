"""The calibration collection ``copynce dedup`` calibrates its default threshold on: the collection's own images, each
with one planted copy, as a collection of copies holds them.

From a seeded sample of the collection's readable images (:func:`draw_sample`), :func:`synthetic_set` gives each
sampled image ``x`` one of three roles (:data:`ROLES`, in a seeded order, in the proportions of :data:`ROLE_CYCLE`):

* ``copy``: ``x`` and ``copy1``, a copy drawn with the calibration's own recipe
  (:meth:`CopyRecipe.calibration_copies <copynce_hf.pixtrace.CopyRecipe.calibration_copies>`: everyday edits with
  ranges of their own, drawn by no benchmark and no training recipe, so that a benchmark measures the calibrated
  threshold on copies it was not calibrated on);
* ``template``: ``x`` and ``template``, ``x`` put into a template (:class:`~copynce_hf.pixtrace.templates.
  TemplateRecipe`: an app frame, a meme band, a background photo, a text-and-emoji overlay), one template drawn per
  group of :data:`TEMPLATE_GROUP` templated images (a background photo is an image of the collection outside the
  sample): unrelated images sharing a frame;
* ``copies``: ``copy1`` and ``copy2``, two copies of ``x`` drawn with that recipe, ``x`` itself left out
  (copies of copies, their original absent).

Each sampled image's content thus appears twice, as a copy pair of a collection holds it: the collection
normalisation of both stages (an image's background from its neighbours of ranks 2-9) and content tokens (tokens
shared with 2 of 10 neighbours are frame) see a planted copy as they see a copy of the collection. (Three images of
one content, the original and two copies, would make each image's content "shared with 2 neighbours": its copies
would be scored as frame, far lower than a pair of the collection is.)

Any two of these images have a known kind (:func:`pair_kind`; :data:`COPY_KINDS` are copies, :data:`NON_COPY_KINDS`
are not): two images made from the same sampled image are copies (``copy``: a copy and its original, ``copy of
copy``, ``template copy``: a templated image and its original); two made from different sampled images are not
(``shared template``: two templated images of one group, sharing the template's pixels and nothing else; ``other
image`` otherwise), unless the collection itself pairs them (:mod:`copynce_hf.calibration.collection`).
:attr:`SyntheticSet.pairs` lists the copy pairs each sampled image makes and the template-sharing pairs of each group.

Images stay in memory (the originals are read again from the collection when needed): nothing is written into the
collection.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
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
#: The kind of a pair of images made from two sampled images that the collection itself pairs (:func:`mark_paired`):
#: neither a copy nor a non-copy.
PAIRED = "paired in the collection"
#: The roles of a sampled image (see the module).
ROLES = ("copy", "template", "copies")
#: The roles given in turn along the sample's seeded order: half the sampled images copied once, a quarter put
#: into a template, a quarter copied twice without their original.
ROLE_CYCLE = ("copy", "template", "copy", "copies")
#: Templated images put into one drawn template (a remainder of one joins the last group).
TEMPLATE_GROUP = 3
#: The copy recipe of the synthetic copies (a :meth:`CopyRecipe.preset` name that no benchmark and no training recipe
#: draws).
COPY_RECIPE = "calibration_copies"
#: Sampled images (and background photos) are shrunk to at most this side before they are edited, so that a
#: sample of large photos stays small in memory (the models see far fewer pixels; the calibration recipe's copies
#: are at most 600 pixels).
MAX_SIDE = 1024


@dataclasses.dataclass
class SyntheticPair:
    """One pair of synthetic images: the ``query`` and ``reference`` synthetic ids (the earlier one first), its
    ``kind`` (:data:`COPY_KINDS` or :data:`NON_COPY_KINDS`), and once a dedup run verified it, its decision
    ``score``, its ``raw`` score (``None`` until then) and the ``views`` it was scored on (``pairs.csv``'s:
    ``whole/whole``, ``crop/whole``, ``whole/layout``, ...)."""

    query: str
    reference: str
    kind: str
    score: float | None = None
    raw: float | None = None
    views: str = "whole/whole"

    @property
    def is_copy(self) -> bool:
        return self.kind in COPY_KINDS


@dataclasses.dataclass
class SyntheticSet:
    """The synthetic images and pairs of one self-calibration.

    Attributes:
        sample: the sampled collection ids; sampled image ``i`` is ``sample[i]``, its synthetic ids are those of
            its role: ``{i:04d}:original`` and ``{i:04d}:copy1`` (``copy``), ``{i:04d}:original`` and
            ``{i:04d}:template`` (``template``), ``{i:04d}:copy1`` and ``{i:04d}:copy2`` (``copies``).
        images: synthetic id -> a PIL image, or a callable reading the original from the collection.
        records: synthetic id -> how it was made (``of``: the collection id; ``role``: the sampled image's role;
            ``edits``: the ``Edit.to_dict()`` records; ``template``: the template's ``group`` number and its
            ``Template.to_dict()``).
        pairs: the :class:`SyntheticPair` rows.
    """

    sample: list[str]
    images: dict[str, Image.Image | Callable[[], Image.Image]]
    records: dict[str, dict]
    pairs: list[SyntheticPair]

    def representatives(self) -> dict[str, str]:
        """Collection id -> the synthetic image standing for that sampled image among the others: itself, or its
        first copy where it is left out (role ``copies``)."""
        found: dict[str, str] = {}
        for image, record in self.records.items():
            if image.endswith(":original") or (image.endswith(":copy1") and record["role"] == "copies"):
                found[record["of"]] = image
        return found


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
    made_as = {image.rsplit(":", 1)[-1] for image in (a, b)}
    if "template" in made_as:
        return "template copy"
    return "copy of copy" if made_as == {"copy1", "copy2"} else "copy"


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


def roles(count: int, seed: int) -> list[str]:
    """The role of each of ``count`` sampled images (:data:`ROLE_CYCLE` along a seeded order)."""
    order = np.random.default_rng([seed, 2]).permutation(count)
    found = [""] * count
    for rank, position in enumerate(order):
        found[int(position)] = ROLE_CYCLE[rank % len(ROLE_CYCLE)]
    return found


def synthetic_set(source, size: int, seed: int) -> SyntheticSet:
    """Draw the sample (:func:`draw_sample`), give each sampled image its role (:func:`roles`) and make its images
    and pairs (see the module's docstring); every draw comes from ``seed``."""
    drawn = draw_sample(source, size, seed)
    if not drawn:
        raise ConfigError("no image of the collection could be read for the self-calibration")
    recipe = CopyRecipe.preset(COPY_RECIPE)
    made = SyntheticSet([source.ids[position] for position, _ in drawn], {}, {}, [])
    given = roles(len(drawn), seed)
    for i, (position, image) in enumerate(drawn):
        role, of = given[i], source.ids[position]
        if role != "copies":
            made.images[original_id(i)] = (lambda where=position: source.load(where))
            made.records[original_id(i)] = {"of": of, "role": role}
        for copy in (1, 2)[:{"copy": 1, "template": 0, "copies": 2}[role]]:
            edited, _, edits = recipe.apply(image, np.random.default_rng([seed, copy, i]))
            made.images[f"{i:04d}:copy{copy}"] = edited
            made.records[f"{i:04d}:copy{copy}"] = {"of": of, "role": role, "edits": edits}
        if role == "copy":
            made.pairs.append(SyntheticPair(f"{i:04d}:copy1", original_id(i), "copy"))
        elif role == "copies":
            made.pairs.append(SyntheticPair(f"{i:04d}:copy1", f"{i:04d}:copy2", "copy of copy"))
    _put_into_templates(made, [(i, drawn[i]) for i in range(len(drawn)) if given[i] == "template"], source, seed)
    return made


def _put_into_templates(made: SyntheticSet, templated: list[tuple[int, tuple[int, Image.Image]]], source,
                        seed: int) -> None:
    """Add each templated sampled image (``(i, (position in the source, image))``) put into its group's template,
    its ``template copy`` pair, and the ``shared template`` pairs of each group."""
    rng = np.random.default_rng([seed, 3])
    picker = _background_picker(source, set(_sampled_positions(made, source)))
    for number, group in enumerate(template_groups(len(templated), rng)):
        template = TemplateRecipe().draw(rng, backgrounds=picker)
        members = [templated[k][0] for k in group]
        for k in group:
            i, (_, image) = templated[k]
            picture, _ = template.apply(image)
            made.images[f"{i:04d}:template"] = picture
            made.records[f"{i:04d}:template"] = {"of": made.sample[i], "role": "template",
                                                 "template": {"group": number, **template.to_dict()},
                                                 "edits": template.edit_dicts((image.height, image.width))}
            made.pairs.append(SyntheticPair(f"{i:04d}:template", original_id(i), "template copy"))
        made.pairs += [SyntheticPair(f"{a:04d}:template", f"{b:04d}:template", "shared template")
                       for n, a in enumerate(members) for b in members[n + 1:]]


def _sampled_positions(made: SyntheticSet, source) -> list[int]:
    """The positions in ``source`` of the sampled images."""
    where = {image_id: position for position, image_id in enumerate(source.ids)}
    return [where[image_id] for image_id in made.sample]


def mark_paired(pairs: list[SyntheticPair], collection: SyntheticSet) -> int:
    """Give every verified pair of images made from two sampled images ``a`` and ``b`` the kind :data:`PAIRED` where
    ``a`` and ``b`` themselves score as copies of each other: a verified pair of an image of ``a`` and one of ``b``,
    one of them a sampled image itself or both standing for theirs (:meth:`SyntheticSet.representatives`), scores at
    least as high as ``a``'s or ``b``'s own planted pair and as half the planted pairs scored on the same views as it
    (their median decision score; all planted pairs where none was scored on those views: a crop lifts the scores of
    the planted copies it decides, which are no measure of two whole images).
    A folder may hold copies (a small folder's copy pairs are all sampled together): the self-calibration cannot tell
    whether two of its images are copies, and counting them as non-copies would set the threshold above every copy
    pair of the collection. Two edited images alone do not link their originals (they may share a planted frame); a
    planted pair never verified says nothing, and two images neither of whose planted pairs was verified stay
    non-copies; the median keeps an image whose planted copy the model missed from linking it to any look-alike.
    Returns how many pairs of sampled images were linked so."""
    records = collection.records
    planted: dict[str, float] = {}
    planted_on: dict[str, dict[str, float]] = {}  # views -> sampled image -> its best planted pair on those views
    for pair in pairs:
        if pair.is_copy:
            of = records[pair.query]["of"]
            planted[of] = max(planted.get(of, -math.inf), pair.score)
            on_views = planted_on.setdefault(pair.views, {})
            on_views[of] = max(on_views.get(of, -math.inf), pair.score)
    if not planted:
        return 0
    half_of_all = statistics.median(planted.values())
    standing = set(collection.representatives().values())
    linked = set()
    for pair in pairs:
        a, b = records[pair.query]["of"], records[pair.reference]["of"]
        plain = pair.query.endswith(":original") or pair.reference.endswith(":original") or {
            pair.query, pair.reference} <= standing
        known = [planted[of] for of in (a, b) if of in planted]
        same_views = planted_on.get(pair.views)
        half = statistics.median(same_views.values()) if same_views else half_of_all
        if a != b and plain and known and pair.score >= max(min(known), half):
            linked.add(frozenset((a, b)))
    for pair in pairs:
        if frozenset((records[pair.query]["of"], records[pair.reference]["of"])) in linked:
            pair.kind = PAIRED
    return len(linked)
