"""One evaluation engine for the demo, the benchmarks and ``copynce detect``.

* :mod:`.models`: the embedded default models and the one model loader (:func:`load_model`);
* :mod:`.minidisc`: the mini-DISC task (a DISC21-shaped task over an image folder with splits; its queries are
  the copy recipe preset ``CopyRecipe.minidisc_queries()``);
* :mod:`.demo_task`: the demo task over the bundled sample images;
* :mod:`.systems`: the systems compared on a task (PDQ / pHash, descriptor, matcher, the whole pipeline)
  and their scoring (muAP, RP90, recall@1, ...).
"""

from .models import DEFAULT_DESCRIPTOR, DEFAULT_MATCHER, PRETRAINED_DIR, load_model

__all__ = ["DEFAULT_DESCRIPTOR", "DEFAULT_MATCHER", "PRETRAINED_DIR", "load_model"]
