"""The demo: copy detection on the bundled sample images, run with ``python -m copynce_hf.demo`` (``make demo``).

* the task (references, edited copies, distractors) made from ``copynce_hf/assets/images`` is
  :mod:`copynce_hf.evaluation.demo_task` (one evaluation engine for the demo and the benchmarks);
* :mod:`.systems`: PDQ / pHash, the CopyNCE descriptor, the matcher re-scoring its candidates;
* :mod:`.figures`, :mod:`.report`: the PixTrace overlap figure and the HTML report;
* :mod:`.run`: the command (:func:`run_demo`, :func:`main`).

It uses the embedded models ``copynce_hf/pretrained/descriptor`` and ``.../matcher`` unless told
otherwise, needs no network and no data, and never trains anything.
"""

from .run import DEFAULT_OUTPUT, DemoOutcome, format_table, main, run_demo

__all__ = [
    "DEFAULT_OUTPUT",
    "DemoOutcome",
    "format_table",
    "main",
    "run_demo",
]
