"""The saved model folders' outputs on three bundled images against ``fixtures/saved_model_outputs.json``.

The file holds two checks of different strength:

* **The regression anchor**, ``baseline-descriptor`` (``benchmarks/checkpoints/``): a folder saved before
  the authors' architecture became the default. Its entry was recorded before that change, by the code of
  that time, and is never re-recorded (``fixtures/record_saved_outputs.py`` keeps it): the current code must
  still give those outputs, so folders saved before the change keep working. This is the check of the code.
* **A weight checksum** of the embedded descriptor and matcher (``copynce_hf/pretrained/``): their entries are
  re-recorded, by the code under test, whenever the shipped weights are replaced, so they prove nothing about
  the code that recorded them. They catch a shipped model file that changed without its entry (replaced,
  truncated to other values, exported at another precision), or a change of the code's outputs on them
  between two recordings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fixtures.record_saved_outputs import ANCHOR, FOLDERS, IMAGES, WEIGHT_CHECKSUMS, saved_model_outputs

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "saved_model_outputs.json").read_text())


@pytest.fixture(scope="module")
def current_outputs():
    return saved_model_outputs()


def _assert_recorded(folder: str, current: dict, what: str) -> None:
    for name, recorded in RECORDED["outputs"][folder].items():
        np.testing.assert_allclose(np.array(current[folder][name]), np.array(recorded), atol=1e-5, rtol=0,
                                   err_msg=f"{folder}: {name} differs from the {what}")


def test_fixture_covers_every_saved_folder():
    assert RECORDED["images"] == list(IMAGES)
    assert set(RECORDED["outputs"]) == set(FOLDERS) == {ANCHOR, *WEIGHT_CHECKSUMS}


def test_folder_saved_before_the_architecture_change_gives_its_recorded_outputs(current_outputs):
    """The regression anchor: outputs recorded before the change, never re-recorded."""
    _assert_recorded(ANCHOR, current_outputs, "outputs recorded before the architecture change (regression anchor)")


@pytest.mark.parametrize("folder", WEIGHT_CHECKSUMS)
def test_embedded_model_weight_checksum(folder, current_outputs):
    """A checksum of the shipped weights (recorded by the code under test when they were last replaced)."""
    _assert_recorded(folder, current_outputs, "weight checksum recorded with the shipped weights")
