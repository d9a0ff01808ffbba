#!/usr/bin/env python3
"""Speed benchmark: same as ``python -m benchmarks.speed.parts`` (see benchmarks/README.md).

    python scripts/benchmark_speed.py --parts pixtrace faiss --faiss-sizes 100000
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package lives at the repo root

from benchmarks.speed.parts import main  # noqa: E402

if __name__ == "__main__":
    main()
