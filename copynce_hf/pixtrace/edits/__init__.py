"""The catalogue of traced copy edits: geometric, occluding and photometric.

Every edit is constructed with explicit parameters and called as
``edited_image, edited_table = edit(image, table)``; see :mod:`.base`.
"""

from .base import EDIT_REGISTRY, Edit, edit_from_dict, register_edit
from .compositing import *  # noqa: F401,F403
from .compositing import __all__ as _compositing
from .geometric import *  # noqa: F401,F403
from .geometric import __all__ as _geometric
from .occluding import *  # noqa: F401,F403
from .occluding import __all__ as _occluding
from .photometric import *  # noqa: F401,F403
from .photometric import __all__ as _photometric
from .sources import resolve_image

__all__ = ["Edit", "EDIT_REGISTRY", "edit_from_dict", "register_edit", "resolve_image"]
__all__ += list(_geometric) + list(_occluding) + list(_photometric) + list(_compositing)
