"""Checks declared on the fields of a configuration dataclass, and the one routine that runs them.

A field declares what a valid value is in its metadata (``field(default=..., metadata={"checks":
(number(positive=True),)})``); :class:`CheckedFields` runs every field's checks in declaration order,
then the class's ``cross_field_checks`` (rules that relate two or more fields), and stops at the first
invalid value with a :class:`~copynce_hf.modeling.errors.ConfigError` naming the key, its value and the
requirement it misses::

    invalid configuration value learning_rate=-1: must be > 0

A check is a callable ``value -> str | None``: ``None`` where the value is valid, else the requirement
(``"must be > 0"``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from typing import Any, ClassVar

from ..modeling.errors import ConfigError

__all__ = ["Check", "CheckedFields", "invalid_value", "number", "one_of", "satisfies"]

#: ``value -> None`` (valid) or the requirement the value misses.
Check = Callable[[Any], "str | None"]


def invalid_value(key: str, value: Any, requirement: str) -> ConfigError:
    """The error of an invalid configuration value: ``invalid configuration value key=value: requirement``."""
    return ConfigError(f"invalid configuration value {key}={value!r}: {requirement}")


def number(*, positive: bool = False, optional: bool = False, integer: bool = False,
           low: float | None = None, high: float | None = None) -> Check:
    """A finite number (an ``int`` where ``integer``; never a bool), ``> 0`` where ``positive``, within
    ``[low, high]`` where given; ``None`` only where ``optional``."""

    def check(value: Any) -> str | None:
        if value is None:
            return None if optional else "must be set"
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
            return "must be an integer" if integer else "must be a finite number"
        if positive and value <= 0:
            return "must be > 0"
        if low is not None and value < low:
            return f"must be >= {low}"
        if high is not None and value > high:
            return f"must be <= {high}"
        return None

    return check


def one_of(choices: Collection, *, optional: bool = False, requirement: str | None = None) -> Check:
    """One of ``choices`` (or ``None`` where ``optional``); ``requirement`` replaces the default
    ``must be one of (...)``."""

    def check(value: Any) -> str | None:
        if (optional and value is None) or value in choices:
            return None
        return requirement or f"must be one of {choices}"

    return check


def satisfies(predicate: Callable[[Any], Any], requirement: str) -> Check:
    """Valid where ``predicate(value)`` is true."""

    def check(value: Any) -> str | None:
        return None if predicate(value) else requirement

    return check


class CheckedFields:
    """Base of a dataclass whose fields declare their checks (``metadata["checks"]``, a tuple of
    :data:`Check`); the instance is checked when it is made (``__post_init__``).

    ``cross_field_checks`` lists functions ``(instance) -> None`` that raise a :class:`ConfigError`
    (:func:`invalid_value`) where fields do not fit together; they run after every field passed its own
    checks, in the listed order.
    """

    cross_field_checks: ClassVar[tuple[Callable[[Any], None], ...]] = ()

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid key (fields in declaration order, then the
        cross-field rules)."""
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            for check in spec.metadata.get("checks", ()):
                requirement = check(value)
                if requirement is not None:
                    raise invalid_value(spec.name, value, requirement)
        for rule in self.cross_field_checks:
            rule(self)
