"""PixTrace: coordinate tables, traced copy edits, random copy-edit recipes, patch overlap priors.

* :class:`CoordinateTable`: where every pixel of an edited image came from in the source.
* :mod:`copynce_hf.pixtrace.edits`: the traced edit catalogue (geometric, occluding, photometric).
* :class:`CopyRecipe` (one recipe type, its presets) and :class:`CopyEditor`: random, replayable
  chains of edits like the paper's (:mod:`.steps`: the step vocabulary); :func:`bind_pool_images`
  puts the training images a list of edits names by id back in before :func:`replay`.
* :func:`patch_overlap` / :func:`pair_overlaps`: the patch overlap priors CopyNCE follows.
"""

from .editor import CopyEditor, CopyResult, replay
from .edits.sources import bind_pool_images
from .overlap import pair_overlaps, pair_tables, patch_overlap
from .recipes import CopyRecipe
from .table import CoordinateTable

__all__ = [
    "CoordinateTable",
    "CopyEditor",
    "CopyRecipe",
    "CopyResult",
    "bind_pool_images",
    "pair_overlaps",
    "pair_tables",
    "patch_overlap",
    "replay",
]
