"""One evaluation engine for the demo, the benchmarks and ``copynce detect``.

* :mod:`.minidisc`: the mini-DISC task (a DISC21-shaped task over an image folder with splits; its queries are
  the copy recipe preset ``CopyRecipe.minidisc_queries()``);
* :mod:`.demo_task`: the demo task over the bundled sample images;
* :mod:`.systems`: the systems compared on a task (PDQ / pHash, descriptor, matcher, the whole pipeline)
  and their scoring (muAP, RP90, recall@1, ...).

The models they run come from :func:`copynce_hf.runtime.loading.load_model`.
"""
