"""Shared-template groups of a training batch: which slots share one template, and the template each group draws.

Beyond the paper: its pairs never show a model two different images in the same frame, so a model trained on
them learns that a frame means a copy. Here the first ``round(share * B)`` slots of every batch of ``B`` pairs
form groups of ``group_size`` consecutive slots (a last group of one slot is left plain); every slot of a group
puts its query into the group's one template (:class:`~copynce_hf.pixtrace.templates.Template`, drawn from
``(seed, batch, group)``) and, with probability ``reference_prob``, its reference too. The descriptor's
InfoNCE then sees a templated query against the templated references of the other images of its group as
negatives; the matcher's negative pair of a templated slot takes another image of the group, in the same
template, as its reference. The template's pixels are untraced, so every CopyNCE prior stays exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from PIL import Image

from ..modeling.errors import ConfigError
from ..pixtrace.templates import Template, TemplateRecipe

__all__ = ["TEMPLATE_SEED_TAG", "TemplateGroups", "TemplatePairs"]

#: The tag of the generators a group's template and a templated slot's choices are drawn from.
TEMPLATE_SEED_TAG = 0x7E3A

#: ``pick(rng) -> (image id, image)``: a background photo for a ``background`` template (None: none).
BackgroundPicker = Callable[[np.random.Generator], "tuple[str, Image.Image] | None"]


@dataclasses.dataclass(frozen=True)
class TemplateGroups:
    """Which slots of a batch share a template (the batch side; see the module docstring).

    Attributes:
        share: fraction of a batch's slots that are templated (0.0: none, the paper's batches).
        group_size: slots per group (at least 2: a group of one has no template-sharing negative).
    """

    share: float = 0.0
    group_size: int = 3

    def __post_init__(self):
        if isinstance(self.share, bool) or not 0.0 <= self.share <= 1.0:
            raise ConfigError(f"template_share={self.share!r} must be in [0, 1]")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ConfigError(f"template_group_size={self.group_size!r} must be an integer >= 2")

    def groups(self, slots: int) -> list[range]:
        """The groups of a batch of ``slots`` slots, as ranges of slot positions: the first
        ``round(share * slots)`` slots in runs of ``group_size`` (a last run of one slot is left out)."""
        templated = min(slots, round(self.share * slots))
        runs = [range(first, min(first + self.group_size, templated)) for first in range(0, templated, self.group_size)]
        return [run for run in runs if len(run) >= 2]

    def assign(self, images: Sequence) -> list[tuple[int, tuple]]:
        """Per slot of a batch whose slots hold the images ``images`` (rows or ids): ``(group, members)``, the
        group's first slot and the distinct images of its members in slot order, or ``(-1, ())`` for a plain slot.
        A slot repeating an image already in its group is left plain (the members are different images); a
        group left with fewer than two members is dropped."""
        assigned: list[tuple[int, tuple]] = [(-1, ())] * len(images)
        for run in self.groups(len(images)):
            slots, members = [], []
            for slot in run:
                if images[slot] not in members:
                    slots.append(slot)
                    members.append(images[slot])
            if len(members) >= 2:
                for slot in slots:
                    assigned[slot] = (run.start, tuple(members))
        return assigned


@dataclasses.dataclass(frozen=True)
class TemplatePairs:
    """How a templated slot's pair is made (the dataset side; see the module docstring).

    Attributes:
        recipe: the :class:`TemplateRecipe` a group's template is drawn with.
        reference_prob: probability that a templated slot's positive reference is put into the template too
            (a negative reference, another image of the group, always is).
    """

    recipe: TemplateRecipe = dataclasses.field(default_factory=TemplateRecipe)
    reference_prob: float = 0.5

    def __post_init__(self):
        if isinstance(self.reference_prob, bool) or not 0.0 <= self.reference_prob <= 1.0:
            raise ConfigError(f"template_reference_prob={self.reference_prob!r} must be in [0, 1]")

    @classmethod
    def from_weights(cls, weights: Mapping[str, float] | None, reference_prob: float = 0.5) -> TemplatePairs:
        """With the kind ``weights`` of :class:`TemplateRecipe` (``None``: its defaults)."""
        recipe = TemplateRecipe() if weights is None else TemplateRecipe(dict(weights))
        return cls(recipe, reference_prob)

    def template(self, key: Sequence[int], backgrounds: BackgroundPicker | None) -> Template:
        """The template of the group that ``key`` names (map-style ``(seed, batch, group's first slot)``, streamed
        ``(seed, epoch, process, worker, group's first position)``): the same for every member."""
        return self.recipe.draw(np.random.default_rng([TEMPLATE_SEED_TAG, *map(int, key)]), backgrounds=backgrounds)

    def slot_generator(self, key: Sequence[int]) -> np.random.Generator:
        """The generator of a templated slot's own choices (whether its reference is templated, which member a
        negative takes), named by the slot's ``key`` and apart from the pair's, so that the paper's draws stay
        as they are."""
        return np.random.default_rng([TEMPLATE_SEED_TAG + 1, *map(int, key)])
