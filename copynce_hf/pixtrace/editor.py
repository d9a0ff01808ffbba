"""Random copy edits with traced tables: draw a chain from a recipe, apply it, replay it.

:class:`CopyEditor` draws a chain of explicit edits from a :class:`~copynce_hf.pixtrace.recipes.CopyRecipe`
(one recipe type; presets ``training``, ``off``, ``paper_descriptor``, ``paper_matcher``, and the
evaluation queries) with a seeded generator, applies them while updating the coordinate table, and
returns the edited image, its table to the input image and the list of edits drawn, from which
:func:`replay` rebuilds the same image and table exactly.

Example::

    editor = CopyEditor(seed=0, recipe=CopyRecipe.training(), output_size=(224, 224))
    result = editor(image)              # result.image, result.table, result.edits
    same = replay(image, result.edits)  # identical pixels and table

The editor renders as its recipe says (``CopyRecipe.fused``): the package's recipes with fused
geometry (one bilinear, antialiased resampling per run of geometric edits,
:mod:`copynce_hf.pixtrace.fused`), the paper presets edit by edit with each edit's own resampling
(bicubic, as the authors'). ``CopyEditor(..., fuse=True / False)`` overrides it; the tables are the
same bit for bit either way, the pixels differ by resampling only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ..images import load_image, to_rgb
from ..modeling.errors import ConfigError
from .edits import Edit, edit_from_dict
from .fused import render_fused
from .recipes import CopyRecipe
from .table import CoordinateTable

__all__ = ["CopyEditor", "CopyResult", "renders_fused", "replay"]


# ---------------------------------------------------------------------- the editor


@dataclasses.dataclass
class CopyResult:
    """An edited copy: ``image`` (PIL RGB), ``table`` (CoordinateTable from ``image`` to the input
    image) and ``edits`` (the edits drawn: a JSON-serialisable list of ``Edit.to_dict()``, replayable with
    :func:`replay`)."""

    image: Image.Image
    table: CoordinateTable
    edits: list[dict[str, Any]]


class CopyEditor:
    """Draws and applies a random chain of traced copy edits.

    Args:
        seed: seed of the editor's generator; the same seed and the same sequence of calls
            give the same edits. ``None`` draws fresh entropy.
        recipe: a :class:`~copynce_hf.pixtrace.recipes.CopyRecipe` (a preset such as
            :meth:`~CopyRecipe.training`, the default, or :meth:`~CopyRecipe.paper_descriptor`) or its dict.
        output_size: ``(height, width)``: end every chain with a resize to this size (the
            model input), recorded in the edits; ``None`` keeps the edited size.
        image_pool: paths of images used as backgrounds and overlays ("onto another",
            "another onto it"); without one, procedural noise and gradient images are used.
        fuse: ``True`` renders each run of consecutive geometric edits with one bilinear, antialiased
            resampling through the run's composed map, at the resolution the rest of the chain needs
            (see :mod:`copynce_hf.pixtrace.fused`; each edit's ``resample`` is not used); ``False``
            applies the edits one by one, each with its own ``resample``; ``None`` (the default)
            follows the recipe's ``fused``. The tables are bit-identical either way.

    ``editor(image)`` draws from the editor's own generator; ``editor(image, seed=k)`` draws
    from a generator seeded by ``(k, seed)`` only, so that item ``k`` of a dataset gets the
    same copy whatever was drawn before (``k`` may be an int or a tuple of ints, e.g.
    ``(epoch, index)``).
    """

    def __init__(
        self,
        seed: int | None = None,
        recipe: CopyRecipe | dict | None = None,
        output_size: tuple[int, int] | None = None,
        image_pool: Sequence[str | os.PathLike] | None = None,
        fuse: bool | None = None,
    ):
        if seed is not None:
            _check_seed(seed, "seed")
        if recipe is None:
            recipe = CopyRecipe.training()
        elif isinstance(recipe, dict):
            recipe = CopyRecipe.from_dict(recipe)
        elif not isinstance(recipe, CopyRecipe):
            raise ConfigError(f"recipe must be a CopyRecipe or its dict, got {type(recipe).__name__}")
        if output_size is not None:
            try:
                output_size = tuple(int(v) for v in output_size)
            except (TypeError, ValueError) as error:
                raise ConfigError(f"output_size must be (height, width), got {output_size!r}") from error
            if len(output_size) != 2 or min(output_size) < 1:
                raise ConfigError(f"output_size must be two positive integers, got {output_size!r}")
        pool = tuple(str(path) for path in (image_pool or ()))
        for path in pool:
            if not os.path.isfile(path):
                raise ConfigError(f"image_pool entry {path!r} is not a file")
        self.seed = seed
        self.recipe = recipe
        self.output_size = output_size
        self.image_pool = pool
        self.fuse = recipe.fused if fuse is None else bool(fuse)
        self._rng = np.random.default_rng(seed)

    def __call__(self, image: Image.Image | str | os.PathLike, seed: int | Sequence[int] | None = None) -> CopyResult:
        """Edit ``image`` (PIL image of any mode, or a path) with a freshly drawn chain."""
        image = _as_rgb(image)
        edits = self.draw((image.height, image.width), seed)
        if self.fuse:  # the chain is rendered in one go
            image, table = render_fused(image, edits)
        else:
            table = CoordinateTable.identity(image.height, image.width)
            for edit in edits:
                expected = edit.output_size(table.size) if edit.kind == "geometric" else table.size
                image, table = edit(image, table)
                if table.size != expected:  # the chain was drawn on predicted sizes
                    raise AssertionError(f"{edit.name} produced {table.size}, its output_size says {expected}")
        return CopyResult(image, table, [edit.to_dict() for edit in edits])

    def draw(self, size: tuple[int, int], seed: int | Sequence[int] | None = None) -> list[Edit]:
        """The chain of edits that ``editor(image, seed)`` applies to an image of ``(height, width)``
        ``size``, drawn without any pixel work (the same draws as the call itself).

        Steps look only at the size of the image so far, which each geometric edit predicts.
        """
        if seed is None:
            rng = self._rng
        else:
            key = [seed] if isinstance(seed, (int, np.integer)) else list(seed)
            for value in key:
                _check_seed(value, "per-call seed")
            rng = np.random.default_rng(key + ([self.seed] if self.seed is not None else []))
        return self.recipe.draw(rng, size, self.output_size, self.image_pool)

    def __repr__(self) -> str:
        active = [name for name, step in self.recipe.steps if getattr(step, "p", 1.0) > 0]
        return f"CopyEditor(seed={self.seed}, output_size={self.output_size}, fuse={self.fuse}, steps={active})"


def replay(image: Image.Image | str | os.PathLike, edits: Sequence[dict[str, Any]],
           fuse: bool | None = None) -> CopyResult:
    """Apply a recorded list of edits (``CopyResult.edits``) to ``image``: same image, same table.

    ``fuse`` must be the editor's to reproduce its pixels exactly (``CopyEditor.fuse``): ``True``
    renders with :func:`~copynce_hf.pixtrace.fused.render_fused`, ``False`` applies the edits one
    by one. ``None`` (the default) follows the edits (:func:`renders_fused`): one by one when an edit asks
    for what the fused renderer does not do (the paper presets' bicubic resampling and torchvision or
    authors' forms), fused otherwise (the package's ``training`` recipe). The table is the same either way.
    """
    image = _as_rgb(image)
    if fuse is None:
        fuse = renders_fused(edits)
    if fuse:
        image, table = render_fused(image, [edit_from_dict(description) for description in edits])
        return CopyResult(image, table, [dict(d) for d in edits])
    table = CoordinateTable.identity(image.height, image.width)
    for description in edits:
        image, table = edit_from_dict(description)(image, table)
    return CopyResult(image, table, [dict(d) for d in edits])


#: Edit forms the fused renderer does not reproduce (the authors' renderings).
_EDIT_BY_EDIT_FORMS = ("torchvision", "authors")


def renders_fused(edits: Sequence[dict[str, Any]]) -> bool:
    """Whether :func:`replay` renders ``edits`` fused by default: no edit names a resampling other than bilinear
    (the fused renderer's) or one of the authors' forms (``form`` ``torchvision`` or ``authors``), as the
    chains of the package's own recipes; the paper presets' chains are rendered edit by edit."""
    for description in edits:
        params = description.get("params", {})
        if params.get("resample") not in (None, "bilinear") or params.get("form") in _EDIT_BY_EDIT_FORMS:
            return False
    return True


# ---------------------------------------------------------------------- helpers


def _as_rgb(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return to_rgb(image)
    return load_image(image)


def _check_seed(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
