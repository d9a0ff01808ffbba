"""``python -m copynce_hf.training``: the training run (see :mod:`copynce_hf.training.run`)."""

import sys

from .run import cli

sys.exit(cli())
