"""More training instances from few photos: grid cells, collages and cutmixes, procedural images.

A copy detector trained on a few hundred photos sees a few hundred identities; more copies of the same
photos stop helping long before more photos would. This package makes new identities from the same
folder, written as image files that any training run reads like photos:

* :mod:`.grid`: each photo cut into an ``n x n`` grid of cells that share no pixel;
* :mod:`.mixes`: collages of 2 to 4 photos and cutmixes (a photo with parts of 1 or 2 others pasted on);
* :mod:`.procedural`: formula-driven images (fractals, shapes, coloured noise) drawn from a seed;
* :mod:`.folder`: :func:`make_instances` writes a folder of them with a manifest, held-out photos last.

Command line: ``python -m copynce_hf.data.instances --dataset my_photos --grid 2 --procedural 100
--held_out 4 --output my_instances`` (``--help`` lists the options).
"""

from .folder import MANIFEST, InstancePlan, list_photos, make_instances, read_manifest
from .grid import grid_boxes, grid_cells, smallest_cell
from .mixes import collage, crop_to_fill, cutmix, mix_groups
from .procedural import PROCEDURAL_STYLES, procedural_image

__all__ = [
    "MANIFEST",
    "PROCEDURAL_STYLES",
    "InstancePlan",
    "collage",
    "crop_to_fill",
    "cutmix",
    "grid_boxes",
    "grid_cells",
    "list_photos",
    "make_instances",
    "mix_groups",
    "procedural_image",
    "read_manifest",
    "smallest_cell",
]
