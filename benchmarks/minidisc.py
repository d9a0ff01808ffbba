"""mini-DISC for the benchmarks: the task of :mod:`copynce_hf.evaluation.minidisc` on ``../shared/data``.

    python -m benchmarks.minidisc --export outputs/minidisc   # queries/, references/, auxiliary/, ground_truth.csv


The task, its recipe and its query drawing live in the package (one evaluation engine for the demo,
the benchmarks and ``copynce detect``); this module only points it at the project's data folder,
``../shared/data`` beside the repository (absent outside dev sessions and CI).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from copynce_hf.evaluation.minidisc import MiniDisc
from copynce_hf.evaluation.minidisc import MiniDiscConfig as _MiniDiscConfig
from copynce_hf.evaluation.minidisc import build_minidisc as _build_minidisc

__all__ = ["MiniDiscConfig", "build_minidisc", "SHARED_DATA", "train_split_files"]

#: ``../shared/data`` next to the repository (absent outside dev sessions and CI).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclasses.dataclass(frozen=True)
class MiniDiscConfig(_MiniDiscConfig):
    """:class:`copynce_hf.evaluation.minidisc.MiniDiscConfig` with the project's data folder as default."""

    image_folder: Path | None = SHARED_DATA / "imagenet-sample"
    splits_csv: Path | None = SHARED_DATA / "imagenet-sample-splits.csv"


def build_minidisc(config: _MiniDiscConfig | None = None) -> MiniDisc:
    """Build the task (default: the whole mini-DISC on ``../shared/data``, fingerprint ``3ecfc93f771d``)."""
    return _build_minidisc(config or MiniDiscConfig())


def train_split_files(data: Path = SHARED_DATA) -> list[Path]:
    """The ``train`` split of ``<data>/imagenet-sample`` (600 files, sorted by name); the reference and distractor
    splits are never handed out here. A missing data folder is a :class:`FileNotFoundError` that says so."""
    from copynce_hf.evaluation.minidisc import read_splits

    splits_csv = Path(data) / "imagenet-sample-splits.csv"
    if not splits_csv.is_file():
        raise FileNotFoundError(f"{splits_csv} not found: the shared benchmark data (imagenet-sample) is only present "
                                "in CI and dev sessions")
    return read_splits(splits_csv, Path(data) / "imagenet-sample")["train"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.minidisc",
                                     description="Lay mini-DISC out as folders for `copynce detect`.")
    parser.add_argument("--export", type=Path, required=True, help="folder to write")
    args = parser.parse_args(argv)
    task = build_minidisc()
    layout = task.export(args.export)
    print(f"{task} (task {task.fingerprint}) written to {args.export}:")
    print(f"copynce detect {layout['queries']} --references {layout['references']} --aux {layout['auxiliary']} "
          f"--ground-truth {layout['ground_truth']} --output {args.export / 'detect'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
