"""PixTrace: coordinate tables, traced copy edits, random copy-edit recipes, patch overlap priors."""

from .overlap import pair_overlaps, pair_tables, patch_overlap
from .table import CoordinateTable

__all__ = ["CoordinateTable", "patch_overlap", "pair_tables", "pair_overlaps"]

from .editor import CopyEditor, CopyRecipe, CopyResult, replay  # noqa: E402

__all__ += ["CopyEditor", "CopyRecipe", "CopyResult", "replay"]
