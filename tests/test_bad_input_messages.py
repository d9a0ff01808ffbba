"""Bad input met by a new user, in the library: each case is one clear error (or a rebuilt cache), never a
traceback from a dependency and never a silent wrong result.

The command-line side of the same cases is in ``test_bad_inputs.py``.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import torch
from conftest import tiny_models

from copynce_hf.modeling.errors import ConfigError, CopyNCEError, ShapeError
from copynce_hf.modeling.losses_copynce import copy_bce_loss, info_nce_loss, token_affinity_logits
from copynce_hf.outputs import StagedFolder
from copynce_hf.retrieval import DescriptorSet


# ------------------------------------------------------------------------------------- error types
@pytest.mark.parametrize("call", [
    lambda: token_affinity_logits(torch.zeros(2, 4), torch.zeros(2, 4, 8)),
    lambda: copy_bce_loss(torch.zeros(3), torch.zeros(4)),
    lambda: info_nce_loss(torch.zeros(2, 8), torch.zeros(3, 8), 1.0),
])
def test_shape_errors_are_value_errors(call):
    with pytest.raises(ValueError) as caught:  # what transformers code and its users catch
        call()
    assert isinstance(caught.value, ShapeError) and isinstance(caught.value, CopyNCEError)
    assert "shape" in str(caught.value) or "(B" in str(caught.value)


def test_option_errors_of_the_losses_are_configuration_errors():
    with pytest.raises(ConfigError, match="temperature must be positive"):
        token_affinity_logits(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8), temperature=0.0)


def test_shape_errors_of_the_models_are_value_errors():
    descriptor, matcher, _ = tiny_models(0)
    with pytest.raises(ValueError, match="pixel_values must be"):
        descriptor(pixel_values=torch.zeros(1, 2, 32, 32))
    with pytest.raises(ValueError, match="reference_pixel_values"):
        matcher(pixel_values=torch.zeros(2, 3, 32, 32), reference_pixel_values=torch.zeros(1, 3, 32, 32))


# ------------------------------------------------------------------------------------- file modes
@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield 0o640
    os.umask(previous)


def test_descriptor_files_get_the_mode_of_the_umask(tmp_path, umask_027):
    path = DescriptorSet(["a", "b"], np.eye(2, 4, dtype=np.float32)).save(tmp_path / "descriptors.safetensors")
    assert stat.S_IMODE(path.stat().st_mode) == umask_027  # safetensors alone gives 0600


def test_staged_folders_give_their_files_the_mode_of_the_umask(tmp_path, umask_027):
    from safetensors.numpy import save_file

    with StagedFolder(tmp_path / "model") as staging:
        save_file({"weight": np.zeros(3, dtype=np.float32)}, str(staging / "model.safetensors"))
        (staging / "config.json").write_text("{}")
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "model" / name).stat().st_mode) == umask_027, name
