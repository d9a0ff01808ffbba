#!/usr/bin/env python3
"""Prove this package equal to the authors' own CopyNCE code (GitHub eddielyc/CopyNCE): models, losses and data.

    git clone https://github.com/eddielyc/CopyNCE /tmp/CopyNCE
    pip install -e ".[authors]"
    # the data oracle's environment: the authors' pinned albumentations 1.3.1 beside this environment's
    # torch, numpy, Pillow, OpenCV and AugLy (torchvision, timm and kornia get stand-ins)
    python -m venv --system-site-packages /tmp/CopyNCE/.oracle-venv
    /tmp/CopyNCE/.oracle-venv/bin/pip install --no-deps albumentations==1.3.1 qudida==0.0.4
    /tmp/CopyNCE/.oracle-venv/bin/pip install scikit-image scikit-learn loguru
    python scripts/check_against_authors.py --authors-code /tmp/CopyNCE

Models and losses: their descriptor and matcher are built from their default configurations (ViT-S/16,
224) with seeded random weights, and a matcher of their ``train/matching/finetune.yaml`` (no fusion
head), saved in their checkpoint format, converted with ``copynce convert-original`` and compared with
this package on the bundled images, in float32 (outputs: max abs difference <= 1e-5; losses: relative
difference <= 1e-5).

Data: their augmentation classes (``core/data/augmentation``) run with seeded draws on the bundled photos
in the oracle's environment (``--authors-python``, by default ``.oracle-venv/bin/python`` in the checkout);
this package's edits run with the parameters they drew. Rows named ``data, ...`` compare the pixels, their
``MaskMapper``'s map (and the same map without its conventions) with PixTrace's table, the overlap priors, and
each albumentations operation of their "additional" group under 1.3.1 with this package's
(``copynce_hf.fidelity.data_oracle``; the limits and their reasons are there). ``--no-data`` leaves the data
rows out.

Chains: their whole ``LyakaapAugmentation`` (descriptor and matcher configurations) run end to end with seeded
draws on the photos at three sizes, ``--chains`` copies of each (more until every operation and an RGBA emoji
have appeared), each replayed by this package with the parameters they drew: pixels, erased boxes, maps, priors,
how often each operation applies, blur radii and stroke widths; and a self-check that a wrong text rate, a blur
radius relative to the image and a table shifted by one pixel each fail a row (``copynce_hf.fidelity.
chain_oracle``). ``--chains 0`` leaves them out.

Prints one table; exits 0 only when every row holds.

Their code imports timm 0.9.2, which imports torchvision; torchvision cannot be imported beside this
package's CPU torch, so the few names their model, loss and augmentation files take from timm,
torchvision and kornia are given by stand-ins (``copynce_hf.fidelity.standins``, each tested against the
behaviour those libraries document) installed under those module names when the real library is absent.
See ``copynce_hf.fidelity.oracle`` for the details and docs/FIDELITY.md for the last table.

Matcher negatives and k-NN features: their ``CopyDataset`` draws negative pairs from a ``knns`` file and their
``extract_dino_features`` path (``build_dino_model``, ``UnpairedCopyDataset``, ``build_eval_transforms``) computes
DINO features with seeded random weights; this package's ``CopyPairDataset`` (``negative_roles="authors"``) and
``load_feature_model(..., features="authors")`` are compared with them, with self-checks that the package's own
roles, its own feature form and a bilinear resize each fail a row (``copynce_hf.fidelity.negatives_oracle``).
``--no-negatives`` leaves them out.

Stand-ins: with ``--torchvision-python`` (an environment with their pinned torch 2.1.0, torchvision 0.16.0,
timm 0.9.2, kornia 0.6.12, Pillow 9.3.0, NumPy 1.24.3), every stand-in is compared with the real function or
class on a photo (rows ``stand-in, ...``, ``copynce_hf.fidelity.standin_check``).

``--write-layout FILE`` also writes every tensor name and shape of both checkpoints as JSON (the CI
fixture ``tests/fixtures/authors_checkpoint_layout.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from copynce_hf.data import ASSET_IMAGES
from copynce_hf.fidelity.chain_oracle import run_chain_checks
from copynce_hf.fidelity.data_oracle import run_data_checks
from copynce_hf.fidelity.negatives_oracle import run_negative_checks
from copynce_hf.fidelity.oracle import format_table, run_checks
from copynce_hf.fidelity.standin_check import run_standin_checks
from copynce_hf.modeling.errors import CopyNCEError

#: The bundled colour photographs the data rows edit.
PHOTOS = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "horse.jpg", "rocket.jpg", "clock_motion.jpg")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", required=True, help="a checkout of GitHub eddielyc/CopyNCE")
    parser.add_argument("--images", nargs="+", type=Path, help="image files (default: the bundled images)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--write-layout", type=Path, help="write the checkpoints' tensor names and shapes here")
    parser.add_argument("--authors-python", help="the Python of the data oracle's environment (albumentations 1.3.1; "
                        "default: .oracle-venv/bin/python in the checkout)")
    parser.add_argument("--photos", nargs="+", type=Path, help="photographs for the data rows (default: the bundled "
                        f"{', '.join(PHOTOS)})")
    parser.add_argument("--no-data", action="store_true", help="leave out the data rows")
    parser.add_argument("--no-negatives", action="store_true", help="leave out the matcher-negative and k-NN feature rows")
    parser.add_argument("--torchvision-python", help="the Python of an environment with the real torchvision, timm and "
                        "kornia (their pinned versions): the stand-ins are compared with them (rows 'stand-in, ...')")
    parser.add_argument("--chains", type=int, default=100, help="chains of their whole augmentation per configuration "
                        "(default 100; 0 leaves the chain rows out)")
    args = parser.parse_args(argv)
    images = args.images or sorted(ASSET_IMAGES.glob("*.jpg"))
    try:
        rows, layout = run_checks(args.authors_code, images, seed=args.seed)
        python = args.authors_python or str(Path(args.authors_code) / ".oracle-venv" / "bin" / "python")
        photos = args.photos or [ASSET_IMAGES / name for name in PHOTOS]
        if not args.no_negatives:
            with tempfile.TemporaryDirectory() as folder:
                rows += run_negative_checks(args.authors_code, photos, Path(folder), seed=args.seed)
        if not args.no_data:
            rows += run_data_checks(args.authors_code, python, photos)
        if args.torchvision_python:
            rows += run_standin_checks(args.torchvision_python, photos[0])
        if args.chains > 0:
            with tempfile.TemporaryDirectory() as folder:
                rows += run_chain_checks(Path(args.authors_code).resolve(), python, photos, Path(folder), args.chains)
    except CopyNCEError as error:
        print(f"check_against_authors: error: {error}", file=sys.stderr)
        return 2
    print(format_table(rows))
    if args.write_layout:
        args.write_layout.write_text(json.dumps(layout, indent=1) + "\n")
        print(f"wrote {args.write_layout}")
    failed = [row.check for row in rows if not row.holds]
    print(f"{len(rows) - len(failed)} of {len(rows)} rows hold" + (f"; failed: {failed}" if failed else ""))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
