#!/usr/bin/env python3
"""Convert a DINO ViT checkpoint into a CopyNCE descriptor or matcher model folder.

The folder holds the model (safetensors), its configuration, the image processor and the
Hub custom code, ready for ``AutoModel.from_pretrained`` and for training with
``scripts/train.py``. Examples::

    python scripts/convert_dino.py facebook/dino-vits16 out/descriptor --model_type descriptor
    python scripts/convert_dino.py dino_deitsmall16_pretrain.pth out/matcher-336 \
        --model_type matcher --image_size 336 --num_fusion_layers 4
    python scripts/convert_dino.py checkpoint.pth out/desc256 --descriptor_dim 256 --set koleo_weight=5

Missing or unused keys are printed; ``--strict`` turns them into an error.
"""

from __future__ import annotations

import argparse
import json
import sys

from copynce_hf.modeling import CopyNCEDescriptorModel, CopyNCEImageProcessor, CopyNCEMatcherModel
from copynce_hf.modeling.errors import ConfigError, CopyNCEError

MODEL_CLASSES = {"descriptor": CopyNCEDescriptorModel, "matcher": CopyNCEMatcherModel}


def _parse_setting(text: str) -> tuple[str, object]:
    """``key=value`` with a JSON value (numbers, booleans) or else a plain string."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"--set expects key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="transformers ViT folder or Hub id, or an original DINO .pth file")
    parser.add_argument("output_dir", help="folder to write the CopyNCE model into")
    parser.add_argument("--model_type", choices=sorted(MODEL_CLASSES), default="descriptor")
    parser.add_argument("--image_size", type=int, help="input size; position embeddings are interpolated")
    parser.add_argument("--descriptor_dim", type=int, help="descriptor size (512; 256 for the DISC21 track)")
    parser.add_argument("--num_fusion_layers", type=int, help="matcher fusion blocks (4)")
    parser.add_argument("--num_attention_heads", type=int,
                        help="heads, for a .pth (default: hidden_size / 64 as in DINO's ViTs)")
    parser.add_argument("--checkpoint_key", default="teacher", help="entry of a DINO training checkpoint")
    parser.add_argument("--set", dest="settings", type=_parse_setting, action="append", default=[],
                        metavar="KEY=VALUE", help="any other configuration value, e.g. copynce_weight=3")
    parser.add_argument("--strict", action="store_true", help="fail on missing or unused keys")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model_class = MODEL_CLASSES[args.model_type]
    overrides = dict(args.settings)
    for key in ("image_size", "descriptor_dim", "num_fusion_layers", "num_attention_heads"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    if args.model_type == "matcher" and "descriptor_dim" in overrides:
        print("error: --descriptor_dim applies to the descriptor only", file=sys.stderr)
        return 2
    if args.model_type == "descriptor" and "num_fusion_layers" in overrides:
        print("error: --num_fusion_layers applies to the matcher only", file=sys.stderr)
        return 2
    try:
        model = model_class.from_dino(args.source, strict=args.strict, checkpoint_key=args.checkpoint_key,
                                      **overrides)
    except (ConfigError, CopyNCEError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    report = model.dino_load_report
    model.save_pretrained(args.output_dir)
    size = model.config.image_size
    CopyNCEImageProcessor(size={"height": size, "width": size}).save_pretrained(args.output_dir)
    print(f"{args.model_type} written to {args.output_dir}: {len(report.loaded)} tensors from {report.source}")
    if report.interpolated:
        print(f"position embeddings interpolated {report.interpolated[0]}x{report.interpolated[0]} -> "
              f"{report.interpolated[1]}x{report.interpolated[1]} patches")
    print(f"newly initialised: {report.initialised}")
    if report.missing:
        print(f"MISSING from the source (random init): {report.missing}")
    if report.unexpected:
        print(f"unused source keys: {report.unexpected}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
