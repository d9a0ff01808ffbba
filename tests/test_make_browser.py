"""Only ``make test`` installs Chromium (for the Space's browser test); ``make demo`` and the others never do.

The targets are dry-run (``make -n -B``: every recipe printed, none executed).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import require_program

REPO = Path(__file__).resolve().parents[1]


def dry_run(target: str) -> str:
    make = require_program("make", "apt-get install make")
    result = subprocess.run([make, "-n", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("target", ["install", "demo", "train", "space", "lint"])
def test_other_targets_install_no_browser(target):
    assert "apt-get" not in dry_run(target) and "chromium" not in dry_run(target)


def test_make_test_installs_chromium_and_says_so_first():
    recipe = dry_run("test")
    assert "apt-get install -y -qq chromium" in recipe
    assert recipe.index("installing Debian's chromium (apt-get, about 350 MB)") < recipe.index("apt-get update")
