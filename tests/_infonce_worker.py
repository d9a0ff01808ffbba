"""Worker of ``test_losses.test_info_nce_gathers_negatives_across_processes``.

It lives in its own module so that the spawned processes import only torch and
``copynce_hf/modeling/losses_copynce.py`` (plus ``errors.py``), not the package ``__init__``
files, which import ``transformers`` and would make the two-process test several times slower.
The two files are loaded as the package ``_copynce_losses_only`` whose path is the real
``copynce_hf/modeling`` folder.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "copynce_hf" / "modeling"


def load_losses():
    """The real ``copynce_hf/modeling/losses_copynce.py`` module, imported without the packages' ``__init__``."""
    if "_copynce_losses_only" not in sys.modules:
        package = types.ModuleType("_copynce_losses_only")
        package.__path__ = [str(PACKAGE_DIR)]
        sys.modules["_copynce_losses_only"] = package
    return importlib.import_module("_copynce_losses_only.losses_copynce")


#: The gathered losses the worker computes: InfoNCE of both forms, then the paired KoLeo, gathered with
#: gradients; then the authors' forms, gathered as constants (``gather_gradients=False``).
FORMS = ("cross_view", "all_embeddings", "paired_koleo")
CONSTANT_GATHER_FORMS = ("all_embeddings_constant_gather", "paired_koleo_constant_gather")


def distributed_worker(rank: int, world: int, port: int, q: torch.Tensor, r: torch.Tensor, folder: str) -> None:
    """One process of a gloo group: each loss of :data:`FORMS` on its slice of the batch; losses and
    gradients to ``folder``."""
    losses = load_losses()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        batch = q.shape[0] // world
        results = {}
        for form in FORMS + CONSTANT_GATHER_FORMS:
            local_q = q[rank * batch:(rank + 1) * batch].clone().requires_grad_()
            local_r = r[rank * batch:(rank + 1) * batch].clone().requires_grad_()
            gradients = form in FORMS
            if form.startswith("paired_koleo"):
                loss = losses.paired_koleo_loss(local_q, local_r, gather_gradients=gradients)
            else:
                loss = losses.info_nce_loss(local_q, local_r, 3.2, max_scale=None if not gradients else 100.0,
                                            negatives=form.split("_constant")[0], gather_gradients=gradients)
            loss.backward()
            results[form] = (loss.detach(), local_q.grad, local_r.grad)
        torch.save(results, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()
