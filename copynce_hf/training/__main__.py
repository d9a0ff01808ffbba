"""``python -m copynce_hf.training``: the training run (see :mod:`copynce_hf.training.run`)."""

import sys

from ..threads import apply_thread_policy

apply_thread_policy()  # before torch loads (copynce_hf.threads)

from .run import cli  # noqa: E402

sys.exit(cli())
