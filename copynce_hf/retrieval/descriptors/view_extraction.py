"""Descriptors of LCE views: one row per view of each image (``id#v``), extracted like whole images.

Supplementary "Local Crops Ensembling": the query's and the reference's views (:mod:`.views`) are each
described by the descriptor. Views are rows of an ordinary :class:`DescriptorSet`: view ``v`` of image ``id``
has the row id ``id#v`` (:func:`view_id`), and :func:`owner_of` maps a row back to its image. With the ``none``
preset there is one view per image, whose row id is the image id itself.
"""

from __future__ import annotations

from ...modeling.errors import ConfigError
from .extract import extract_descriptors
from .sets import DescriptorSet
from .views import ViewPreset, render_view

VIEW_SEPARATOR = "#"


def view_id(image_id: str, view: int, preset: ViewPreset) -> str:
    """Row id of view ``view`` of ``image_id``: the id itself for the ``none`` preset, else ``id#view``."""
    return image_id if preset.name == "none" else f"{image_id}{VIEW_SEPARATOR}{view}"


def owner_of(row_id: str, preset_name: str) -> str:
    """The image id of a view row id (inverse of :func:`view_id`)."""
    return row_id if preset_name == "none" else row_id.rsplit(VIEW_SEPARATOR, 1)[0]


class ViewSource:
    """An image source (``ids`` + ``load(i)``) whose items are the LCE views of another source's images.

    Row ``i`` is view ``i % V`` of image ``i // V``; the last decoded image is kept, so a sequential
    pass decodes every image once.
    """

    def __init__(self, source, preset: ViewPreset, role: str):
        if role not in ("query", "reference"):
            raise ConfigError(f"view role must be 'query' or 'reference', got {role!r}")
        self.source, self.preset, self.role = source, preset, role
        self.count = preset.num_query_views if role == "query" else preset.num_reference_views
        self.ids = [view_id(image_id, v, preset) for image_id in source.ids for v in range(self.count)]
        self._last: tuple[int, object] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, index: int):
        image_index, view = divmod(int(index), self.count)
        if self._last is None or self._last[0] != image_index:
            self._last = (image_index, self.source.load(image_index))
        image = self._last[1]
        views = (self.preset.query_views if self.role == "query" else self.preset.reference_views)(image.width, image.height)
        return render_view(image, views[view])


def extract_view_descriptors(model, image_processor, source, preset: ViewPreset, role: str, **kwargs) -> DescriptorSet:
    """Descriptors (N * V, D) of every view of every image of ``source`` (rows ``id#v``, see :func:`view_id`).

    ``kwargs`` go to :func:`copynce_hf.retrieval.extract_descriptors` (batch size, accelerator, progress, ...).
    """
    result = extract_descriptors(model, image_processor, ViewSource(source, preset, role), **kwargs)
    result.skipped = list(dict.fromkeys(owner_of(row, preset.name) for row in result.skipped))
    result.skip_reasons = {owner_of(row, preset.name): reason for row, reason in result.skip_reasons.items()}
    return result
