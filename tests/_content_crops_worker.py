"""Worker of ``test_content_crops.test_two_processes_crop_and_score_as_one_does``: ``dedup`` of a folder with the
embedded models under ``accelerate launch``, each process saving its raw scores, crop boxes and crop pairs.

Usage: ``accelerate launch ... tests/_content_crops_worker.py IMAGES OUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from copynce_hf.precision import make_accelerator, release_process_group
from copynce_hf.retrieval import Descriptor, DetectConfig, ImageFolderSource, dedup
from copynce_hf.retrieval.deduplication.settings import DedupSettings
from copynce_hf.runtime.loading import load_model


def main(images: str, out: str) -> None:
    descriptor, processor = load_model(None, "descriptor", "--model")
    matcher, _ = load_model(None, "matcher", "--matcher")
    accelerator = make_accelerator()
    result = dedup(ImageFolderSource(images), Descriptor("embedded", descriptor, processor), (matcher, processor),
                   threshold=1.0, config=DetectConfig(candidates=9), settings=DedupSettings(matcher_orders="one"),
                   accelerator=accelerator, progress=False)
    found = {"processes": accelerator.num_processes, "boxes": result.crop_boxes,
             "crop_pairs": [[pair.a, pair.b, pair.view_a, pair.view_b] for pair in result.crop_pairs],
             "raw": [[a, b, score] for (a, b), score in sorted(result.raw_scores.items())]}
    (Path(out) / f"rank{accelerator.process_index}.json").write_text(json.dumps(found), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:3])
    release_process_group()  # the processes end together, as the copynce commands do
