"""``copynce export-onnx``: a descriptor's or matcher's ONNX graphs, for ONNX Runtime (``--runtime onnx``)."""

from __future__ import annotations

import argparse

from ..runtime.loading import DEFAULT_DESCRIPTOR

DESCRIPTION = (
    "Write the model's ONNX graphs (opset 18, dynamic batch axis, the image processor's input size) "
    "with its config, image processor and onnx.json into OUTPUT: descriptor.onnx for a descriptor; "
    "matcher_encoder.onnx and matcher_fusion.onnx for a matcher (its two stages, so that encoder tokens are "
    "cached per image). index, search, match, detect, dedup and calibrate run them with --runtime onnx."
)


def register(commands) -> argparse.ArgumentParser:
    """Add ``export-onnx`` and its options to the ``copynce`` subcommands."""
    p = commands.add_parser(
        "export-onnx", help="export a descriptor or matcher to ONNX graphs for ONNX Runtime (--runtime onnx)",
        description=DESCRIPTION,
    )
    p.add_argument("model", nargs="?", help=f"model folder or Hub id (default: the embedded descriptor, "
                   f"{DEFAULT_DESCRIPTOR}, or matcher with --kind matcher)")
    p.add_argument("output", help="folder to write")
    p.add_argument("--kind", choices=("descriptor", "matcher"), help="insist on this kind of model (also picks the "
                   "embedded one when MODEL is left out)")
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from ..runtime.loading import export_model_onnx
    from ..runtime.onnx_export import ONNX_OPSET

    folder, graphs = export_model_onnx(args.model, args.output, args.kind)
    print(f"wrote {', '.join(graphs.values())} (opset {ONNX_OPSET}, dynamic batch axis) to {folder}; "
          "run them with --runtime onnx and this folder as the model")
    return 0
