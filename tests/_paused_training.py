"""Test helper: a training run whose checkpoint of one step pauses before it is completed.

    python tests/_paused_training.py STEP [training options ...]

runs ``python -m copynce_hf.training [training options ...]``, except that the checkpoint of step
``STEP`` waits a minute after all its files are written and before it is marked complete and renamed,
so that a test can kill the process at that moment (tests/test_train_interrupts.py).
"""

from __future__ import annotations

import sys
import time

from copynce_hf.training import checkpoints
from copynce_hf.training.run import cli


def _pausing(mark_complete, pause_step: int):
    def mark_complete_after_a_pause(folder, step: int) -> None:
        if step == pause_step:
            time.sleep(60)
        mark_complete(folder, step)

    return mark_complete_after_a_pause


if __name__ == "__main__":
    checkpoints.mark_complete = _pausing(checkpoints.mark_complete, int(sys.argv[1]))
    sys.exit(cli(sys.argv[2:]))
