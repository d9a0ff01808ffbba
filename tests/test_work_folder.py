"""The work folder both resumable jobs keep (re-scoring's ``identity.json`` + JSON chunks, indexing's ``work.json``
+ safetensors chunks): chunks are kept for the same identity only, a change is named, a killed run's temporary
files are removed."""

from __future__ import annotations

import logging

import pytest

from copynce_hf.outputs import StagedFile
from copynce_hf.retrieval.work_folder import WorkFolder, changed_inputs

KINDS = [("identity.json", ".json"), ("work.json", ".safetensors")]  # re-scoring's, indexing's


def killed_write(path):
    """What a run killed while writing ``path`` leaves: the staged temporary file beside it."""
    temporary = StagedFile(path).temporary
    temporary.parent.mkdir(parents=True, exist_ok=True)
    temporary.write_bytes(b"half a chunk")
    return temporary


@pytest.mark.parametrize(("identity_file", "suffix"), KINDS)
def test_same_identity_keeps_the_chunks_another_clears_them_and_names_the_change(tmp_path, caplog, identity_file,
                                                                                 suffix):
    identity = {"model": "m1", "settings": "s", "chunk_size": 3, "views": ("whole", "crops")}
    first = WorkFolder(tmp_path / "work", identity, identity_file, suffix)
    with caplog.at_level(logging.WARNING, logger="copynce_hf"):
        assert first.open() is False  # a fresh folder: nothing to reuse, nothing to warn about
    assert caplog.text == ""
    assert (tmp_path / "work" / identity_file).is_file()
    chunks = [first.write_chunk(index, lambda path, index=index: path.write_text(f"chunk {index}"))
              for index in range(2)]
    assert [path.name for path in chunks] == [f"chunk-00000{i}{suffix}" for i in range(2)]
    assert first.chunk_files() == chunks

    # the same identity (a tuple equals the list read back): the chunks are kept, a killed run's temporaries go
    leftovers = [killed_write(first.chunk_path(2)), killed_write(tmp_path / "work" / identity_file)]
    same = WorkFolder(tmp_path / "work", {**identity, "views": ["whole", "crops"]}, identity_file, suffix)
    assert same.open() is True
    assert same.chunk_files() == chunks and [path.read_text() for path in chunks] == ["chunk 0", "chunk 1"]
    assert not any(path.exists() for path in leftovers)

    # another model and chunk size, a setting dropped, one added: the chunks are deleted, the warning names them
    killed_write(first.chunk_path(2))
    other = {"model": "m2", "chunk_size": 4, "views": ["whole", "crops"], "batch_size": 8}
    with caplog.at_level(logging.WARNING, logger="copynce_hf"):
        assert WorkFolder(tmp_path / "work", other, identity_file, suffix).open() is False
    assert "the 2 chunk(s) in" in caplog.text
    assert "were computed from other inputs (changed: batch_size, chunk_size, model, settings); starting fresh" \
        in caplog.text
    assert sorted(path.name for path in (tmp_path / "work").iterdir()) == [identity_file]
    assert WorkFolder(tmp_path / "work", other, identity_file, suffix).open() is True  # the new identity was written


def test_chunks_without_a_readable_identity_are_cleared(tmp_path, caplog):
    folder = WorkFolder(tmp_path, {"model": "m"}, "work.json", ".safetensors")
    folder.chunk_path(0).write_bytes(b"descriptors")
    (tmp_path / "work.json").write_text("{half")  # no identity to trust: the chunk cannot be reused
    with caplog.at_level(logging.WARNING, logger="copynce_hf"):
        assert folder.open() is False
    assert "(changed: unknown, work.json is missing or unreadable)" in caplog.text
    assert folder.chunk_files() == []


def test_changed_inputs():
    assert changed_inputs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 0}) == ["b", "c"]
    assert changed_inputs(None, {"a": 1}) == ["a"]
    assert changed_inputs({"a": 1}, {"a": 1}) == []
