"""Benchmarks of copynce_hf (BENCHMARKS.md): quality on mini-DISC and speed, each with its reference.

Modules (each a ``python -m benchmarks.<name>`` entry point where it runs something):

* :mod:`.minidisc`: the mini-DISC task (references, edited queries, ground truth) and its evaluation recipe.
* :mod:`.systems`: PDQ, pHash, descriptor models (trained or random) and matcher re-scoring.
* :mod:`.quality`: runs the systems on mini-DISC, one JSON result per system.
* :mod:`.training`: trains the baseline / CopyNCE descriptors and matchers with identical budgets.
* :mod:`.speed`: PixTrace vs dense table warping, data pipeline, extraction vs ``ViTModel``, faiss.
* :mod:`.dense_tables`: the full-resolution table-warping implementation the speed benchmark compares with.
* :mod:`.report`: renders the saved results as BENCHMARKS.md tables and plots.
* :mod:`.templates`: dedup and detection with unrelated photos in the same template (the task in
  :mod:`.template_task`, its templates drawn by :mod:`.template_designs`).
* :mod:`.pipeline_speed`: ``copynce detect`` and ``copynce dedup`` timed end to end, before and after a change;
  :mod:`.pipeline_profile`: where their time goes, by stage.

See benchmarks/README.md for the commands.
"""
