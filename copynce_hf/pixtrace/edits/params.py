"""Parameter checks shared by the edits: each names the edit, the parameter and the bad value."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from PIL import Image

from ...modeling.errors import EditParameterError
from .base import check_finite

__all__ = ["RESAMPLE", "color_param", "float_param", "image_spec_param", "int_param", "resample_param", "set_field"]

#: Resampling filters accepted by the edits (names as in ``PIL.Image.Resampling``, lower case).
RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def int_param(edit: str, key: str, value: Any, low: int | None = None) -> int:
    """``value`` as an int (a whole number, at least ``low``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be an integer")
    if not math.isfinite(value) or int(value) != value:
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be an integer")
    value = int(value)
    if low is not None and value < low:
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be at least {low}")
    return value


def float_param(edit: str, key: str, value: Any) -> float:
    """``value`` as a finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise EditParameterError(f"{edit}: parameter {key}={value!r} must be a finite number")
    check_finite(edit, **{key: float(value)})
    return float(value)


def color_param(edit: str, key: str, value: Any) -> tuple[int, int, int]:
    """``value`` as an RGB triple of ints in [0, 255]."""
    try:
        color = tuple(value)
    except TypeError:
        color = ()
    if len(color) != 3 or not all(
        not isinstance(c, bool) and isinstance(c, (int, np.integer)) and 0 <= c <= 255 for c in color
    ):
        raise EditParameterError(
            f"{edit}: parameter {key}={value!r} must be an RGB triple of integers in [0, 255]"
        )
    return tuple(int(c) for c in color)


def resample_param(edit: str, value: Any, allowed=tuple(RESAMPLE)) -> str:
    """``value`` if it names one of the ``allowed`` resampling filters."""
    if value not in allowed:
        raise EditParameterError(f"{edit}: parameter resample={value!r} must be one of {list(allowed)}")
    return value


def set_field(edit: Any, key: str, value: Any) -> None:
    """Normalise a field of a frozen dataclass in ``__post_init__``."""
    object.__setattr__(edit, key, value)


def image_spec_param(edit: str, key: str, value: Any) -> Any:
    """``value`` if it is a JSON-serialisable image spec (:mod:`.sources`) or a PIL image."""
    if isinstance(value, Image.Image):
        return value
    if not isinstance(value, dict) or "kind" not in value:
        raise EditParameterError(
            f"{edit}: parameter {key}={value!r} must be an image spec dict or a PIL image"
        )
    try:
        json.dumps(value)
    except TypeError as error:
        raise EditParameterError(f"{edit}: parameter {key}={value!r} is not JSON-serialisable") from error
    return value
