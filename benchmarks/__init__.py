"""Benchmarks of copynce_hf (BENCHMARKS.md), one subpackage per question, each module a
``python -m benchmarks.<package>.<module>`` entry point where it runs something (benchmarks/README.md has the
commands):

* :mod:`.quality`: how well are copies found? Every system on mini-DISC, calibrated thresholds, dedup on planted
  copies.
* :mod:`.templates`: do unrelated photos in the same template pass for copies? The template task and its systems.
* :mod:`.speed`: how fast is each part, beside its reference? PixTrace, the data pipeline, extraction, faiss,
  model passes, ONNX Runtime, commands beside busy cores.
* :mod:`.scale`: what does DISC21's size cost? faiss at a million, the DISC21 estimate, dedup of large
  collections, throughput on a GPU.
* :mod:`.training`: what does training buy, and which model ships? Equal-budget runs, the compute-scaling curve,
  the GPU run of the embedded models, the held-out export rule.

Beside them: :mod:`.minidisc` (the mini-DISC task on the shared data, which every question reads),
:mod:`.common` (result files, the machine, the command line) and :mod:`.report` (BENCHMARKS.md's tables and
figures from the saved results).
"""
