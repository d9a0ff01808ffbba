"""``python -m copynce_hf.demo``: see :mod:`copynce_hf.demo.run`."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
