"""The edit protocol shared by every traced edit.

An edit is a frozen dataclass of explicit parameters, validated at construction, and
called as ``edited_image, edited_table = edit(image, table)`` on an RGB PIL image and the
:class:`~copynce_hf.pixtrace.CoordinateTable` of that image (same size). Geometric edits
update the table exactly, occluding edits mark covered pixels untraced, photometric edits
return the table unchanged. ``edit.to_dict()`` / :func:`edit_from_dict` give a
JSON-serialisable description from which the same edit is replayed exactly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from PIL import Image

from ...modeling.errors import EditParameterError, TableError
from ..table import CoordinateTable

#: name -> edit class, filled by :func:`register_edit`.
EDIT_REGISTRY: dict[str, type[Edit]] = {}


def register_edit(cls: type[Edit]) -> type[Edit]:
    """Class decorator: make an edit replayable by name from its ``to_dict()``."""
    if cls.name in EDIT_REGISTRY:
        raise RuntimeError(f"edit name {cls.name!r} registered twice")
    EDIT_REGISTRY[cls.name] = cls
    return cls


@dataclasses.dataclass(frozen=True)
class Edit:
    """Base class of traced edits. Subclasses set ``name`` and ``kind`` and implement ``apply``."""

    name: ClassVar[str] = "edit"
    #: "geometric", "occluding" or "photometric".
    kind: ClassVar[str] = "photometric"
    #: How a renderer may treat the edit at a resolution other than the size it was drawn for (its
    #: *true* size; :mod:`copynce_hf.pixtrace.fused` asks): ``"pointwise"`` (each output pixel a
    #: function of its input pixel, or of a neighbourhood whose size follows the local scale, so it may
    #: run inside a geometric resampling pass: :meth:`~.photometric.PhotometricEdit.render_array`),
    #: ``"relative"`` (its geometry is relative to the image size: the same up to resampling at another
    #: resolution, rendered between resampling passes: ``render_array`` or
    #: :meth:`~.occluding.OccludingEdit.layer`), ``"true_size"`` (only at its true size). Geometric
    #: edits declare their fused form with :meth:`~.geometric.GeometricEdit.canvases` instead.
    scaling: ClassVar[str] = "true_size"
    #: Fields left out of :meth:`to_dict` while they hold their default: options added after lists of edits were
    #: first recorded, so that those lists (and the draws of the recipes that never set them) stay the same.
    quiet_defaults: ClassVar[tuple[str, ...]] = ()

    def __call__(self, image: Image.Image, table: CoordinateTable) -> tuple[Image.Image, CoordinateTable]:
        if image.mode != "RGB":
            raise EditParameterError(f"{self.name}: expects an RGB image, got mode {image.mode!r}")
        if (image.height, image.width) != table.size:
            raise TableError(
                f"{self.name}: image is {image.height}x{image.width} but its table is {table.size[0]}x{table.size[1]}"
            )
        edited, new_table = self.apply(image, table)
        if (edited.height, edited.width) != new_table.size:
            raise AssertionError(f"{self.name} produced an image and table of different sizes")
        return edited, new_table

    def apply(self, image: Image.Image, table: CoordinateTable) -> tuple[Image.Image, CoordinateTable]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable ``{"name": ..., "params": {...}}``."""
        params = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)
                  if not (f.name in self.quiet_defaults and getattr(self, f.name) == f.default)}
        return {"name": self.name, "params": params}


def edit_from_dict(description: dict[str, Any]) -> Edit:
    """Rebuild an edit from :meth:`Edit.to_dict` output."""
    try:
        cls = EDIT_REGISTRY[description["name"]]
    except KeyError as error:
        raise EditParameterError(f"unknown edit {description.get('name')!r}; known: {sorted(EDIT_REGISTRY)}") from error
    params = dict(description.get("params", {}))
    field_types = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in params.items():
        if isinstance(value, list) and key in field_types:
            params[key] = _tuplify(value)
    return cls(**params)


def check_finite(edit: str, **values: float) -> None:
    """Raise :class:`EditParameterError` naming the parameter if any value is NaN or infinite."""
    for key, value in values.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EditParameterError(f"{edit}: parameter {key}={value!r} must be a finite number")


def check_range(edit: str, key: str, value: float, low: float, high: float) -> None:
    """Raise :class:`EditParameterError` unless ``low <= value <= high`` (and finite)."""
    check_finite(edit, **{key: value})
    if not low <= value <= high:
        raise EditParameterError(f"{edit}: parameter {key}={value!r} outside [{low}, {high}]")


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _tuplify(value):
    return tuple(_tuplify(v) if isinstance(v, list) else v for v in value)
