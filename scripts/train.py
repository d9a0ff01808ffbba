#!/usr/bin/env python3
"""Train a CopyNCE descriptor or matcher: ``python -m copynce_hf.training`` from a source checkout.

    python scripts/train.py                                   # tiny default run on the bundled images
    python scripts/train.py --help                            # every option, its type and default
    accelerate launch --num_processes 8 scripts/train.py --config configs/descriptor_vits16_224.yaml ...

The run lives in :mod:`copynce_hf.training.run` (so that a regular install trains with
``python -m copynce_hf.training``); ``main`` is importable from this file for scripts that load it.
"""

import sys

from copynce_hf.threads import apply_thread_policy

if __name__ == "__main__":
    apply_thread_policy()  # before torch loads (copynce_hf.threads)

from copynce_hf.training.run import cli, main  # noqa: E402, F401  (main: for scripts and tests that load this file)

if __name__ == "__main__":
    sys.exit(cli())
