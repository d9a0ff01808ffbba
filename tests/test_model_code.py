"""The modelling code carried by model folders: real files, identical to ``copynce_hf/modeling/``.

The shipped folders are checked against the package (``python -m copynce_hf.model_code`` re-syncs
them), and every writer of model folders (``save_pretrained``, ``save_for_hub``) is checked to
write real files, not links.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import TINY_VIT

from copynce_hf.model_code import (
    MODEL_CODE_DIR,
    main,
    model_code_files,
    shipped_model_folders,
    stale_model_code,
    sync_model_code,
)
from copynce_hf.modeling.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_the_code_files_are_what_save_pretrained_copies():
    names = {path.name for path in model_code_files()}
    assert {"modeling_copynce.py", "configuration_copynce.py", "image_processing_copynce.py",
            "pipeline_copynce.py", "errors.py"} <= names
    assert all(path.parent == MODEL_CODE_DIR and path.is_file() for path in model_code_files())
    assert "__init__.py" not in names  # the package's lazy index is not part of a folder


def test_shipped_folders_carry_real_copies_of_the_current_code():
    folders = shipped_model_folders()
    assert {folder.relative_to(REPO).as_posix() for folder in folders} == {
        "copynce_hf/pretrained/descriptor", "copynce_hf/pretrained/matcher",
        "benchmarks/checkpoints/baseline-descriptor"}
    for folder in folders:
        assert stale_model_code(folder) == [], (
            f"{folder} carries stale modelling code: run `make sync-model-code` (python -m copynce_hf.model_code)")
        assert not any(path.is_symlink() for path in folder.iterdir())


@pytest.fixture
def copied_folder(tmp_path) -> Path:
    folder = tmp_path / "descriptor"
    shutil.copytree(REPO / "copynce_hf" / "pretrained" / "descriptor", folder)
    return folder


def test_sync_replaces_links_rewrites_differing_copies_and_removes_stale_files(copied_folder):
    (copied_folder / "errors.py").unlink()
    (copied_folder / "errors.py").symlink_to(MODEL_CODE_DIR / "errors.py")
    (copied_folder / "modeling_copynce.py").write_text("# an older version\n")
    (copied_folder / "losses_copynce.py").unlink()
    (copied_folder / "old_module.py").write_text("# no longer part of the code\n")
    problems = stale_model_code(copied_folder)
    assert len(problems) == 4 and any("a link" in line for line in problems), problems
    assert any("errors.py" in line for line in problems) and any("old_module.py" in line for line in problems)
    assert main(["--check", str(copied_folder)]) == 1

    changed = sync_model_code(copied_folder)
    assert sorted(changed) == ["errors.py", "losses_copynce.py", "modeling_copynce.py", "old_module.py"]
    assert stale_model_code(copied_folder) == []
    assert not (copied_folder / "errors.py").is_symlink()
    assert ((copied_folder / "modeling_copynce.py").stat().st_mode & 0o777) == 0o644
    assert sync_model_code(copied_folder) == []
    assert main(["--check", str(copied_folder)]) == 0


def test_sync_refuses_a_folder_that_is_not_a_model_folder(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no config.json"):
        sync_model_code(tmp_path)
    assert main([str(tmp_path)]) == 2
    assert "is not a model folder" in capsys.readouterr().err


def test_save_for_hub_and_save_pretrained_write_real_files(tmp_path):
    from copynce_hf import CopyNCEDescriptorConfig, CopyNCEDescriptorModel, CopyNCEImageProcessor
    from copynce_hf.hub import save_for_hub

    model = CopyNCEDescriptorModel(CopyNCEDescriptorConfig(**TINY_VIT, descriptor_dim=16))
    save_for_hub(model, tmp_path / "hub", image_processor=CopyNCEImageProcessor(size={"height": 32, "width": 32}))
    assert stale_model_code(tmp_path / "hub") == []
    assert not any(path.is_symlink() for path in (tmp_path / "hub").iterdir())


def test_shipped_cards_name_the_transformers_their_code_needs():
    from copynce_hf.modeling.errors import TRANSFORMERS_REQUIREMENT

    for folder in shipped_model_folders():
        assert f"it needs `{TRANSFORMERS_REQUIREMENT}`" in (folder / "README.md").read_text(encoding="utf-8"), folder
    assert f'"{TRANSFORMERS_REQUIREMENT}"' in (REPO / "setup.py").read_text()  # the package's own requirement
