"""Worker of ``test_token_store.test_two_processes_share_the_chunks_and_read_them_all``: builds the token store of
the images in a folder under ``accelerate launch`` (2 images a chunk) and saves, per process, every token it reads
back and the encoder passes the store counted.

Usage: ``accelerate launch ... tests/_token_store_worker.py IMAGES STORE OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from conftest import tiny_models

from copynce_hf.precision import make_accelerator, release_process_group
from copynce_hf.retrieval.content.store import TokenStore, token_identity


def main(images_folder: str, store_folder: str, out: str) -> None:
    images = {path.stem: path for path in sorted(Path(images_folder).glob("*.png"))}
    _, matcher, processor = tiny_models(3)
    accelerator = make_accelerator()
    ids = list(images)
    store = TokenStore.build(ids, images, matcher.pre_fusion_tokens, processor, store_folder,
                             token_identity(matcher, processor, ids, images), batch_size=2, chunk_size=2,
                             accelerator=accelerator, progress=False)
    torch.save({"encoded": store.encoded, "processes": accelerator.num_processes, "tokens": store.get(ids)},
               Path(out) / f"rank{accelerator.process_index}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
    release_process_group()  # the processes end together, as the copynce commands do
