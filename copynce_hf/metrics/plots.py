"""Precision-recall curve plots of copy-detection systems (one PNG, all systems together).

Used by ``copynce evaluate`` and the benchmark. Drawing goes through matplotlib's Agg canvas
directly (no pyplot, no global backend switch), so it works on headless machines and inside
other programs that use matplotlib.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .copy_detection.formulas import micro_average_precision

__all__ = ["save_figure", "save_pr_curves"]

logger = logging.getLogger(__name__)
#: Words in the names of fonts that cover Chinese, Japanese and Korean ids, used after matplotlib's default font
#: where one is installed (matplotlib draws each character with the first font of the list that has it).
_WIDE_FONT_WORDS = ("CJK", "Han Sans", "WenQuanYi", "Droid Sans Fallback", "Unifont")


def _fallback_fonts() -> list[str]:
    """Installed fonts covering CJK characters (possibly none), by family name."""
    from matplotlib import font_manager

    return sorted({font.name for font in font_manager.fontManager.ttflist
                   if any(word in font.name for word in _WIDE_FONT_WORDS)})


def save_figure(figure: Figure, path, **kwargs) -> None:
    """``figure.savefig(path, **kwargs)`` drawing ids in any script: characters the default font lacks come from
    an installed CJK font where there is one; otherwise they are drawn as boxes and one log line says so (rather
    than matplotlib's warning per character, with its source line)."""
    from matplotlib import rc_context

    families = ["DejaVu Sans", *_fallback_fonts()]
    with warnings.catch_warnings(record=True) as caught, rc_context({"font.family": families}):
        warnings.simplefilter("always")
        figure.savefig(path, **kwargs)
    missing = [str(warning.message) for warning in caught if "missing from font" in str(warning.message)]
    for warning in caught:
        if "missing from font" not in str(warning.message):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if missing:
        logger.warning("%s: %d characters of its labels are drawn as boxes (no installed font has them; a font "
                       "such as Noto Sans CJK would draw them)", path if isinstance(path, (str, os.PathLike))
                       else "a figure", len(missing))


def _envelope(precision: np.ndarray, recall: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep only the points that shape the curve: each rank where recall rises and the rank before it.

    Between two positives the recall is constant and the precision falls monotonically, so
    the curve there is a vertical segment whose ends are exactly the kept points; the drawing
    is unchanged while DISC21-sized inputs (500k ranks) shrink to about twice the number of
    true positives.
    """
    rises = np.diff(recall, prepend=0.0) > 0
    keep = rises.copy()
    keep[:-1] |= rises[1:]
    keep[-1] = True
    return precision[keep], recall[keep]


def save_pr_curves(
    curves: Mapping[str, Sequence[np.ndarray]],
    path: str | os.PathLike,
    title: str = "Precision-recall",
    *,
    dpi: int = 120,
) -> Path:
    """Draw the precision-recall curves of several systems into one PNG file.

    Args:
        curves: system name -> ``(precision, recall)`` (or ``(precision, recall, thresholds)``,
            as returned by :func:`copynce_hf.metrics.copy_detection.formulas.precision_recall_curve`), each array of
            shape (P,) in rank order. A system with no prediction (P = 0) is listed in the
            legend without a line.
        path: output PNG path; missing parent folders are created.
        title: figure title.
        dpi: resolution of the 8 x 6 inch figure.

    Returns:
        The path written. The legend gives each system's muAP; a dashed line marks the 0.9
        precision of the RP90 operating point.

    Raises:
        ValueError: ``curves`` is empty, or a system's precision and recall differ in shape.
    """
    if not curves:
        raise ValueError("save_pr_curves needs at least one curve")
    figure = Figure(figsize=(8, 6), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for name, curve in curves.items():
        if len(curve) < 2:
            raise ValueError(f"curve {name!r} must be (precision, recall[, thresholds])")
        precision = np.asarray(curve[0], dtype=np.float64).reshape(-1)
        recall = np.asarray(curve[1], dtype=np.float64).reshape(-1)
        if precision.shape != recall.shape:
            raise ValueError(
                f"curve {name!r}: precision has {precision.size} points but recall has {recall.size}"
            )
        if precision.size == 0:
            axes.plot([], [], label=f"{name} (no prediction)")
            continue
        label = f"{name} (µAP {micro_average_precision(precision, recall):.3f})"
        shown_precision, shown_recall = _envelope(precision, recall)
        axes.plot(shown_recall, shown_precision, linewidth=1.5, label=label)
    axes.axhline(0.9, color="grey", linestyle="--", linewidth=0.8, label="precision 0.9 (RP90)")
    axes.set_xlim(0.0, 1.0)
    axes.set_ylim(0.0, 1.05)
    axes.set_xlabel("Recall")
    axes.set_ylabel("Precision")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower left", fontsize="small")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path, format="png")
    return path
