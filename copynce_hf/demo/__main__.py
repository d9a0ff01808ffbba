"""``python -m copynce_hf.demo``: see :mod:`copynce_hf.demo.run`."""

import sys

from ..threads import apply_thread_policy

if __name__ == "__main__":
    apply_thread_policy()  # before torch loads (copynce_hf.threads)

    from .run import main

    sys.exit(main())
