#!/usr/bin/env python3
"""Throughput of the training data pipeline: same as ``python -m benchmarks.speed.dataloader`` (see its docstring).

    python scripts/bench_dataloader.py --image_size 112 --patch_size 8 --recipes training paper_descriptor
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package lives at the repo root

from benchmarks.speed.dataloader import main  # noqa: E402

if __name__ == "__main__":
    main()
