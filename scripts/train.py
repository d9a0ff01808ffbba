#!/usr/bin/env python3
"""Train a CopyNCE descriptor or matcher: ``python -m copynce_hf.training`` from a source checkout.

    python scripts/train.py                                   # tiny default run on the bundled images
    accelerate launch --num_processes 8 scripts/train.py --config configs/descriptor_vits16_224.yaml ...

The run itself lives in :mod:`copynce_hf.training.run` (so that a regular install can train with
``python -m copynce_hf.training``); this file re-exports it for scripts and tests that load it.
"""

import sys

from copynce_hf.training.run import *  # noqa: F401,F403  (main, parse_args, build_model, ...)
from copynce_hf.training.run import cli

if __name__ == "__main__":
    sys.exit(cli())
