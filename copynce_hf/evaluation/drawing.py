"""Seeded draws and checks of the evaluation query recipe (:class:`.recipes.QueryRecipe`).

Its families draw their edits with these helpers from a ``numpy.random.Generator``, so that a task
is the same on every machine (the mini-DISC fingerprint pins it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError

Range = tuple[float, float]


def uniform(rng: np.random.Generator, bounds: Range) -> float:
    """A float drawn uniformly in ``[low, high)``."""
    return float(rng.uniform(bounds[0], bounds[1]))


def signed(rng: np.random.Generator, bounds: Range) -> float:
    """:func:`uniform` in ``bounds`` with a random sign."""
    return (1.0 if rng.random() < 0.5 else -1.0) * uniform(rng, bounds)


def color(rng: np.random.Generator) -> tuple[int, int, int]:
    """A random RGB colour."""
    return tuple(int(c) for c in rng.integers(0, 256, size=3))


def choose(rng: np.random.Generator, weights: Sequence[tuple[str, float]], count) -> list[str]:
    """``count`` distinct family names, drawn without replacement proportionally to their positive weights."""
    names = [name for name, weight in weights if weight > 0]
    probabilities = np.array([weight for _, weight in weights if weight > 0], dtype=np.float64)
    count = min(int(count), len(names))
    if count == 0:
        return []
    chosen = rng.choice(len(names), size=count, replace=False, p=probabilities / probabilities.sum())
    return [names[i] for i in chosen]


def check_families(recipe: str, field: str, weights: Sequence[tuple[str, float]], known: Sequence[str],
                   count_field: str, counts: tuple[int, int]) -> None:
    """One validation for every recipe: known family names, weights >= 0, and
    ``0 <= low <= high <= number of families with a positive weight`` for the drawn count."""
    for name, weight in weights:
        if name not in known:
            raise ConfigError(f"{recipe}.{field}: unknown family {name!r}; known: {tuple(known)}")
        if not weight >= 0:
            raise ConfigError(f"{recipe}.{field}: weight of {name!r} must be >= 0, got {weight}")
    low, high = counts
    available = sum(1 for _, weight in weights if weight > 0)
    if not 0 <= low <= high <= available:
        raise ConfigError(f"{recipe}.{count_field}={(low, high)} must satisfy 0 <= low <= high <= {available} "
                          f"(the families with a positive weight)")
