"""Folders saved before the authors' architecture became the default give the same outputs.

``fixtures/saved_model_outputs.json`` was recorded by ``fixtures/record_saved_outputs.py`` before
that change; each folder's config records the variant it was trained with.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fixtures.record_saved_outputs import FOLDERS, IMAGES, saved_model_outputs

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "saved_model_outputs.json").read_text())


@pytest.fixture(scope="module")
def current_outputs():
    return saved_model_outputs()


def test_fixture_covers_every_saved_folder():
    assert RECORDED["images"] == list(IMAGES)
    assert set(RECORDED["outputs"]) == set(FOLDERS)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_saved_folder_outputs_unchanged(folder, current_outputs):
    for name, recorded in RECORDED["outputs"][folder].items():
        np.testing.assert_allclose(np.array(current_outputs[folder][name]), np.array(recorded), atol=1e-5, rtol=0,
                                   err_msg=f"{folder}: {name} differs from the recorded output")
