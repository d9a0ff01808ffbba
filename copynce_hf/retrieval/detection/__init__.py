"""Stage 5 of retrieval: the paper's detection pipeline (:func:`~.pipeline.detect`), its settings (:mod:`.config`) and
its first stage, each descriptor's candidates (:mod:`.candidates`)."""
