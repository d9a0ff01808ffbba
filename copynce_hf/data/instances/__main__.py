"""``python -m copynce_hf.data.instances``: a folder of training instances made from a folder of photos.

    python -m copynce_hf.data.instances --dataset my_photos --grid 2 --held_out 4 --output my_instances
    python -m copynce_hf.data.instances --dataset my_photos --photos --procedural 500 --collages 200 \\
        --held_out 4 --seed 0 --output my_instances

The photos are the image files under ``--dataset`` in sorted order; the last ``--held_out`` of them are
kept out of every instance and written whole, last in name order (give the training run's
``num_eval_images``, so that it evaluates on photos none of its instances came from). ``instances.json`` in
the output folder maps every file to its kind and source photo(s). Train on the output folder like on any
image folder: ``python -m copynce_hf.training --dataset my_instances ...``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ...modeling.errors import ConfigError
from .folder import InstancePlan, list_photos, make_instances

logger = logging.getLogger("copynce_hf.data.instances")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m copynce_hf.data.instances", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, type=Path, help="folder of photos (sub-folders included)")
    parser.add_argument("--output", required=True, type=Path, help="instance folder to write (empty or new)")
    kinds = parser.add_argument_group("instances (at least one)")
    kinds.add_argument("--photos", action="store_true", help="keep every photo whole too, as an instance")
    kinds.add_argument("--grid", type=int, default=0, help="cut every photo into an N x N grid of cells")
    kinds.add_argument("--collages", type=int, default=0, help="collages of 2-4 photos")
    kinds.add_argument("--cutmixes", type=int, default=0, help="photos with parts of 1-2 others pasted on")
    kinds.add_argument("--procedural", type=int, default=0, help="formula-driven images (fractals, shapes, noise)")
    settings = parser.add_argument_group("settings")
    settings.add_argument("--gap", type=float, default=0.0,
                          help="band left out between grid cells, a fraction of the photo's side (e.g. 0.05)")
    settings.add_argument("--min_side", type=int, default=64, help="smallest grid cell side in pixels")
    settings.add_argument("--small", choices=("whole", "skip", "error"), default="whole",
                          help="a photo too small for the grid: kept whole, left out, or an error")
    settings.add_argument("--side", type=int, default=384,
                          help="longer side of collages and cutmixes, side of procedural images")
    settings.add_argument("--max_uses", type=int, default=None, help="most collages (or cutmixes) a photo is in")
    settings.add_argument("--format", choices=("jpg", "png"), default="jpg", help="format of the images made")
    settings.add_argument("--held_out", type=int, default=0,
                          help="the folder's last N photos: no instance of them; written whole, last")
    settings.add_argument("--seed", type=int, default=0)
    settings.add_argument("--link", action="store_true", help="whole photos as symbolic links, not copies")
    settings.add_argument("--overwrite", action="store_true", help="replace the images of a used output folder")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    plan = InstancePlan(photos=args.photos, grid=args.grid, gap=args.gap, collages=args.collages,
                        cutmixes=args.cutmixes, procedural=args.procedural, side=args.side, min_side=args.min_side,
                        small=args.small, max_uses=args.max_uses, image_format=args.format)
    dataset, output = args.dataset.resolve(), args.output.resolve()
    if output == dataset or dataset in output.parents:
        raise ConfigError(f"--output {str(args.output)!r} is inside --dataset {str(args.dataset)!r}: the instances "
                          "would be read as photos next time; write them elsewhere")
    photos = list_photos(args.dataset)
    if not 0 <= args.held_out < len(photos):
        raise ConfigError(f"--held_out {args.held_out}: {args.dataset} holds {len(photos)} photos; hold out 0 to "
                          f"{len(photos) - 1}")
    training, held_out = photos[:len(photos) - args.held_out], photos[len(photos) - args.held_out:]
    logger.info("%d photos in %s (%d held out), seed %d, %s", len(photos), args.dataset, len(held_out), args.seed,
                plan)
    return make_instances(training, output, plan, seed=args.seed, held_out=held_out, link=args.link,
                          overwrite=args.overwrite, progress=True)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
