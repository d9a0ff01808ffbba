"""``copynce convert-original``: the authors' released checkpoint as a model folder (also
``scripts/convert_copynce_original.py``, which declares the same options with :func:`add_arguments`)."""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Map every tensor of a checkpoint of the authors' code (GitHub eddielyc/CopyNCE) to this "
    "package's descriptor or matcher and write a folder that AutoModel / AutoImageProcessor load (weights, "
    "config, image processor, Hub custom code, model card, licence). A missing or unexpected tensor is an "
    "error naming it."
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``copynce convert-original`` (also those of scripts/convert_copynce_original.py)."""
    parser.add_argument("--checkpoint", required=True,
                        help="the authors' checkpoint (descriptor_vits_224.pth.tar or matcher_vits_224.pth.tar)")
    parser.add_argument("--model-type", required=True, choices=("descriptor", "matcher"), help="what it holds")
    parser.add_argument("--output", required=True, help="model folder to write")
    parser.add_argument("--push-to-hub", metavar="REPO", help="also upload the folder to this Hub repository")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a checkpoint that holds Python objects besides tensors (only a trusted file)")
    return parser


def register(commands) -> argparse.ArgumentParser:
    """Add ``convert-original`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser("convert-original", help="convert the authors' released checkpoint into a model folder",
                            description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..authors_checkpoints import convert_authors_checkpoint

    folder = convert_authors_checkpoint(args.checkpoint, args.model_type, args.output,
                                        push_to_hub=args.push_to_hub, allow_pickle=args.allow_pickle)
    print(f"wrote {folder}" + (f" and uploaded it to {args.push_to_hub}" if args.push_to_hub else ""))
    return 0
