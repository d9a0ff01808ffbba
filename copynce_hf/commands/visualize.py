"""``copynce visualize``: the token affinity and affinity entropy maps of a query-reference pair (paper,
"Visualization and Interpretability")."""

from __future__ import annotations

import argparse

from ..runtime.loading import DEFAULT_DESCRIPTOR
from . import options

DESCRIPTION = (
    "Draw the token affinity heatmap of one query patch over the reference and the affinity "
    "entropy map of all query patches (paper, 'Visualization and Interpretability') as PNG overlays "
    "in OUTPUT (token_affinity.png, affinity_entropy.png, maps.npz)."
)


def patch(text: str) -> tuple[int, int]:
    """``--patch``: ``ROW,COL``."""
    try:
        row, col = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROW,COL (two integers), got {text!r}") from None
    return row, col


def register(commands) -> argparse.ArgumentParser:
    """Add ``visualize`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("visualize", help="token affinity and affinity entropy maps of a query-reference pair",
                            description=DESCRIPTION)
    p.add_argument("query", help="query image file")
    p.add_argument("reference", help="reference image file")
    p.add_argument("--model", help=f"descriptor or matcher model (default: {DEFAULT_DESCRIPTOR})")
    p.add_argument(
        "--patch", type=patch, required=True, help="probe query patch as ROW,COL in the patch grid, from 0"
    )
    p.add_argument("--temperature", type=float, help="softmax temperature tau (default: the model's, 1/16)")
    p.add_argument("--output", required=True, help="folder for the PNG files")
    options.add_image_input(p, folders=False)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..reports.affinity import visualize_pair
    from .console import report_counts

    paths = visualize_pair(args.query, args.reference, args.output, args.patch, model=args.model,
                           temperature=args.temperature, max_pixels=args.max_pixels)
    print(f"wrote {paths['token_affinity']}, {paths['affinity_entropy']} and {paths['maps']} (the raw maps)")
    report_counts("visualize", "2 images", [], f"wrote {len(paths)} files")
    return 0
