"""``copynce visualize``: the token affinity and affinity entropy maps of a query-reference pair (paper,
"Visualization and Interpretability")."""

from __future__ import annotations

import argparse

from ..runtime.loading import DEFAULT_MATCHER
from . import options

DESCRIPTION = (
    "Draw the token affinity heatmap of one query patch over the reference and the affinity "
    "entropy map of all query patches (paper, 'Visualization and Interpretability') as PNG overlays "
    "in OUTPUT (token_affinity.png, affinity_entropy.png, maps.npz), and print the pair's score: a matcher's copy "
    "probability (the default model), or a descriptor's cosine."
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
    p.add_argument("--model", help=f"matcher or descriptor model (default: the embedded matcher, {DEFAULT_MATCHER})")
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

    paths, maps = visualize_pair(args.query, args.reference, args.output, args.patch, model=args.model,
                                 temperature=args.temperature, max_pixels=args.max_pixels)
    print(score_line(maps, args.model))
    print(f"wrote {paths['token_affinity']}, {paths['affinity_entropy']} and {paths['maps']} (the raw maps)")
    report_counts("visualize", "2 images", [], f"wrote {len(paths)} files")
    return 0


def score_line(maps, model: str | None) -> str:
    """The pair's score and the model that gave it, e.g. ``copy probability 0.9995 of the pair (the embedded matcher,
    on the whole images)``, with what it does not mean (a probability is uncalibrated; a descriptor's cosine is not a
    probability) and the model card's threshold at precision 0.9 (:func:`~copynce_hf.calibration.meaning.
    card_threshold`) where the card states one."""
    from ..calibration.meaning import card_threshold

    if maps.score_name == "copy probability":
        source = "the embedded matcher" if model is None else f"the matcher {model}"
        return (f"copy probability {maps.score:.4f} of the pair ({source}, on the whole images): uncalibrated, not "
                "the chance that the pair is a copy; look-alike images can score as high as copies"
                + _card_text(card_threshold(model, "matcher")))
    if maps.score_name == "descriptor cosine":
        return (f"descriptor cosine {maps.score:.4f} of the pair (the descriptor {model}; a cosine, not a probability: "
                "a matcher, the default --model, gives the copy probability)" + _card_text(card_threshold(model,
                                                                                                    "descriptor")))
    return f"no score for the pair: the model {model or 'given'} gives neither a copy logit nor descriptors"


def _card_text(card) -> str:
    """``; its model card puts precision 0.9 on <task> at <threshold>`` (empty without a card threshold)."""
    return "" if card is None else f"; its model card puts precision 0.9 on {card.task} at {card.threshold:.4f}"
