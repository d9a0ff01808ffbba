"""Re-scoring in chunks: shared by two ``accelerate launch`` processes, kept on disk, resumed after ``kill -9``.

The runner (:func:`score_in_chunks`) is checked with a plain scoring function that counts its calls; the
commands (``copynce detect`` / ``match``) with tiny random models on a handful of small images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_killed_when, launch_two_cpu_processes, save_tiny_models
from PIL import Image

from copynce_hf.cli import main
from copynce_hf.modeling.errors import ConfigError
from copynce_hf.outputs import StagedFile
from copynce_hf.retrieval import PairScores, plan_chunks, read_predictions, score_in_chunks

REPO = Path(__file__).resolve().parents[1]


def _pairs(queries: int, per_query: int) -> list[tuple[str, str]]:
    """``per_query`` candidates of every query, the queries interleaved as a merged candidate list may be."""
    return [(f"Q{q}", f"R{(q * 7 + r) % 11}") for r in range(per_query) for q in range(queries)]


class Scorer:
    """A pair's score is a function of its ids; every chunk scored is recorded; ``fail_at`` stops a run there."""

    def __init__(self, fail_at: int | None = None):
        self.chunks: list[list[tuple[str, str]]] = []
        self.fail_at = fail_at

    @staticmethod
    def score(pair) -> float:
        return int(hashlib.sha1("/".join(pair).encode()).hexdigest()[:8], 16) / 2**32

    def __call__(self, pairs, scored) -> PairScores:
        if len(self.chunks) == self.fail_at:
            raise KeyboardInterrupt
        self.chunks.append(pairs)
        scored(len(pairs))
        unreadable = {i for i, (_, reference) in enumerate(pairs) if reference == "R3"}
        return PairScores([None if i in unreadable else self.score(p) for i, p in enumerate(pairs)],
                          {i: "truncated" for i in unreadable})


def test_chunks_hold_whole_queries_in_first_seen_order():
    pairs = _pairs(5, 3)
    chunks = plan_chunks(pairs, 7)
    assert [len(c) for c in chunks] == [6, 6, 3]  # two queries of 3 pairs fit in 7
    assert sorted(row for chunk in chunks for row in chunk) == list(range(15))
    assert [{pairs[row][0] for row in chunk} for chunk in chunks] == [{"Q0", "Q1"}, {"Q2", "Q3"}, {"Q4"}]
    assert [len(c) for c in plan_chunks(pairs, 2)] == [3] * 5  # a query larger than a chunk is one chunk
    with pytest.raises(ConfigError, match="chunk_size must be at least 1"):
        plan_chunks(pairs, 0)


def test_resume_scores_only_the_missing_chunks_and_changed_inputs_start_fresh(tmp_path, caplog):
    pairs, folder, identity = _pairs(6, 4), tmp_path / "work", {"model": "a", "settings": "x"}
    expected = [None if r == "R3" else Scorer.score((q, r)) for q, r in pairs]

    plain = score_in_chunks(pairs, Scorer(), chunk_size=8, progress=False)
    assert plain.scores == expected and plain.reasons == {i: "truncated" for i, s in enumerate(expected) if s is None}

    with pytest.raises(KeyboardInterrupt):  # stopped after 2 of the 3 chunks
        score_in_chunks(pairs, Scorer(fail_at=2), 8, folder, identity, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["chunk-000000.json", "chunk-000001.json", "identity.json"]
    leftover = StagedFile(folder / "chunk-000002.json").temporary  # as a SIGKILL while writing it leaves...
    leftover = leftover.with_name(leftover.name.replace(f"-{os.getpid()}.", f"-{os.getpid() + 1}."))  # ...another run
    leftover.write_text("{half")
    lines = []
    resumed = Scorer()
    result = score_in_chunks(pairs, resumed, 8, folder, identity, progress=False, log=lines.append)
    assert resumed.chunks == [[pairs[row] for row in plan_chunks(pairs, 8)[2]]]
    assert result == plain
    assert lines == [f"resuming: 2 of 3 chunks (16 pairs) already scored in {folder}"]
    assert not leftover.exists()

    again = Scorer()  # everything done: nothing is scored
    assert score_in_chunks(pairs, again, 8, folder, identity, progress=False) == plain and again.chunks == []

    # another model, other pairs, another chunk size: the old chunks are not used, and the warning says why
    identity, fewer = {"model": "b", "settings": "x"}, pairs[:-1]
    for step_pairs, size, changed in ((pairs, 8, "model"), (fewer, 8, "pairs"), (fewer, 5, "chunk_size")):
        fresh = Scorer()
        with caplog.at_level(logging.WARNING, logger="copynce_hf"):
            caplog.clear()
            score_in_chunks(step_pairs, fresh, size, folder, identity, progress=False)
        assert f"were computed from other inputs (changed: {changed}); starting fresh" in caplog.text
        assert sum(len(c) for c in fresh.chunks) == len(step_pairs)
    pairs = fewer

    # a chunk file that is not this job's (another identity, a damaged file) is scored again, with a warning
    chunk = folder / "chunk-000001.json"
    record = json.loads(chunk.read_text())
    chunk.write_text(json.dumps({**record, "identity": "someone else"}))
    (folder / "chunk-000002.json").write_text("{not json")
    rescored = Scorer()
    with caplog.at_level(logging.WARNING, logger="copynce_hf"):
        caplog.clear()
        score_in_chunks(pairs, rescored, 5, folder, identity, progress=False)
    assert len(rescored.chunks) == 2 and caplog.text.count("not a chunk of this job") == 2
    assert json.loads(chunk.read_text()) == record


# --------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Tiny models, 6 references, 6 queries (flipped copies), a candidates file of every pair."""
    root = tmp_path_factory.mktemp("chunked")
    models = save_tiny_models(root / "models", seed=0)
    rng = np.random.default_rng(0)
    for folder in ("refs", "queries"):
        (root / folder).mkdir()
    for i in range(6):
        image = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
        image.save(root / "refs" / f"R{i}.png")
        image.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(root / "queries" / f"Q{i}.png")
    rows = [f"Q{q},R{r},0.5" for q in range(3) for r in range(6)]
    (root / "candidates.csv").write_text("query_id,reference_id,score\n" + "\n".join(rows) + "\n")
    return root, models


def _same(found, expected) -> None:
    """The same pairs in the same order, scores equal to float32 rounding."""
    assert [p[:2] for p in found] == [p[:2] for p in expected]
    np.testing.assert_allclose([p.score for p in found], [p.score for p in expected], rtol=0, atol=1e-6)


def _environment() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
            "ACCELERATE_USE_CPU": "true"}


def _detect_options(root, models, output) -> list[str]:
    return ["detect", str(root / "queries"), "--references", str(root / "refs"), "--output", str(output),
            "--models", models["descriptor"], "--matcher", models["matcher"], "--candidates", "4", "--k", "3",
            "--matcher-lce", "paper", "--chunk-size", "5", "--gallery", "1",
            "--encoder-precision", "float32"]  # as the launcher's processes (--mixed_precision no), in one process too


@pytest.mark.slow
def test_two_processes_detect_the_same_as_one_and_a_rerun_resumes(workspace, tmp_path, capsys):
    root, models = workspace
    one = tmp_path / "one"
    assert main(["--quiet", *_detect_options(root, models, one)]) == 0
    expected = read_predictions(one / "predictions.csv")
    chunks = sorted((one / "rescoring").glob("chunk-*.json"))
    assert len(chunks) == 6  # 6 queries x 4 candidates, chunks of 5 pairs: one query each

    two = tmp_path / "two"
    result = launch_two_cpu_processes(["-m", "copynce_hf.cli", *_detect_options(root, models, two)], _environment())
    assert result.returncode == 0, result.stderr[-3000:]
    _same(read_predictions(two / "predictions.csv"), expected)
    # the pairs were shared, each fused once in all (24 candidates x 35 view pairs); one process wrote
    matcher = [line for line in result.stderr.splitlines() if "pairs re-scored" in line]
    assert len(matcher) == 1 and matcher[0].startswith("copynce detect: matcher: 24 pairs re-scored on 2 processes")
    assert matcher[0].endswith(", 840 fusion passes)"), result.stderr[-3000:]
    assert result.stdout.count("wrote 18 predictions for 6 queries") == 1
    assert sorted(p.name for p in (two / "rescoring").iterdir()) == [p.name for p in chunks] + ["identity.json"]

    # one chunk lost (a kill before it was written): the rerun scores that query only and writes the same
    chunks[3].unlink()
    (one / "predictions.csv").unlink()
    capsys.readouterr()
    assert main(_detect_options(root, models, one)) == 0
    assert "copynce detect: matcher: resuming: 5 of 6 chunks (20 pairs) already scored in" in capsys.readouterr().err
    assert read_predictions(one / "predictions.csv") == expected


def _match_options(root, models, output) -> list[str]:
    return ["match", str(root / "candidates.csv"), "--queries", str(root / "queries"), "--references",
            str(root / "refs"), "--matcher", models["matcher"], "--output", str(output), "--matcher-lce", "all",
            "--chunk-size", "6"]


@pytest.mark.slow
def test_match_killed_with_sigkill_resumes_from_its_last_chunk(workspace, tmp_path, capsys):
    root, models = workspace
    output = tmp_path / "scored.csv"
    work = tmp_path / ".scored.csv.rescoring"
    log = tmp_path / "killed.log"
    cli_killed_when(_match_options(root, models, output), lambda: any(work.glob("chunk-*.json")), log, _environment())
    assert not output.exists()
    written = len(list(work.glob("chunk-*.json")))
    assert 1 <= written < 3

    assert main(_match_options(root, models, output)) == 0
    assert f"copynce match: resuming: {written} of 3 chunks ({6 * written} pairs) already scored in {work}" in (
        capsys.readouterr().err)
    assert not work.exists()  # the work is removed once the predictions are written
    uninterrupted = tmp_path / "uninterrupted.csv"
    assert main(["--quiet", *_match_options(root, models, uninterrupted)]) == 0
    _same(read_predictions(output), read_predictions(uninterrupted))
