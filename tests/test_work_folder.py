"""What a saved result was computed from: the digests of an identity (their values are what the identity files of
existing folders hold, so they must not change), the stored-vs-current comparison, and the work folder both
resumable jobs keep (re-scoring's ``identity.json`` + JSON chunks, indexing's ``work.json`` + safetensors chunks):
chunks are kept for the same identity only, a change is named, a killed run's temporary files are removed."""

from __future__ import annotations

import json
import logging
import os

import pytest

from copynce_hf.outputs import StagedFile
from copynce_hf.retrieval.work_folder import (
    WorkFolder,
    changed_inputs,
    digest,
    file_stamp,
    holds_identity,
    image_stamps,
    lines_digest,
)

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


def test_digests_keep_the_values_stored_in_existing_folders(tmp_path):
    # the values written into identity files before these helpers moved here: a change would discard saved work
    assert digest({"b": [1, 2], "a": "x"}) == "66511172710b641a3dd69a8ea81b50f4"
    assert lines_digest(["q1\tr1", "q2\tr2"]) == "266777826536978c7b8a42d5ed7d0657"
    image = tmp_path / "a.jpg"
    image.write_bytes(b"12345")
    os.utime(image, ns=(0, 1_700_000_000_123_456_789))
    assert file_stamp(image) == [5, 1_700_000_000_123_456_789] and file_stamp(tmp_path / "gone.jpg") is None
    lines = [json.dumps(["a", str(image), 5, 1_700_000_000_123_456_789]), json.dumps(["gone", None]),
             json.dumps(["lost", str(tmp_path / "lost.jpg"), None]), json.dumps(["m", "in memory"])]
    images = {"a": str(image), "lost": tmp_path / "lost.jpg", "m": object()}
    assert image_stamps(images, ["m", "a", "gone", "a", "lost"]) == lines_digest(lines)  # sorted ids, once each
    os.utime(image, ns=(0, 1_700_000_001_000_000_000))  # the file replaced: another stamp
    assert image_stamps(images, ["m", "a", "gone", "lost"]) != lines_digest(lines)


def test_holds_identity_compares_as_json_and_names_what_changed(tmp_path, caplog):
    path = tmp_path / "identity.json"
    with caplog.at_level(logging.WARNING, logger="copynce_hf"):
        assert holds_identity(path, {"a": 1}, "the index in here") is False  # nothing stored
        assert "(changed: unknown, identity.json is missing or unreadable); starting fresh" in caplog.text
        caplog.clear()
        path.write_text(json.dumps({"a": [1, 2], "b": "x"}))
        assert holds_identity(path, {"b": "x", "a": (1, 2)}, "the index in here") is True
        assert holds_identity(path, {"a": [1, 2], "b": "y"}) is False and caplog.text == ""  # nothing saved to name
        assert holds_identity(path, {"a": [1, 3]}, "the index in here", then="computing them again") is False
    assert caplog.text.strip().endswith(
        "the index in here were computed from other inputs (changed: a, b); computing them again")
