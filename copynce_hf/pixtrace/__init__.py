"""PixTrace: coordinate tables, traced copy edits, random copy-edit recipes, patch overlap priors.

* :class:`CoordinateTable`: where every pixel of an edited image came from in the source.
* :mod:`copynce_hf.pixtrace.edits`: the traced edit catalogue (geometric, occluding, photometric).
* :class:`CopyEditor` / :class:`CopyRecipe`: random, replayable chains of edits like the paper's.
* :func:`patch_overlap` / :func:`pair_overlaps`: the patch overlap priors CopyNCE follows.
"""

from .editor import CopyEditor, CopyRecipe, CopyResult, replay
from .overlap import pair_overlaps, pair_tables, patch_overlap
from .table import CoordinateTable

__all__ = [
    "CoordinateTable",
    "CopyEditor",
    "CopyRecipe",
    "CopyResult",
    "pair_overlaps",
    "pair_tables",
    "patch_overlap",
    "replay",
]
