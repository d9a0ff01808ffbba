#!/usr/bin/env python3
"""Mini-DISC quality benchmark: same as ``python -m benchmarks.quality.systems`` (see benchmarks/README.md).

    python scripts/benchmark_quality.py --systems pdq phash
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package lives at the repo root

from benchmarks.quality.systems import main  # noqa: E402

if __name__ == "__main__":
    main()
