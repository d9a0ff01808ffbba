#!/usr/bin/env python3
"""Convert the authors' released CopyNCE checkpoint into a ``transformers`` model folder.

    python scripts/convert_copynce_original.py --checkpoint descriptor_vits_224.pth.tar \\
        --model-type descriptor --output copynce-vits-descriptor [--push-to-hub org/copynce-vits-descriptor]

The same as ``copynce convert-original``; the work is done by
:func:`copynce_hf.authors_checkpoints.convert_authors_checkpoint`.
"""

from __future__ import annotations

import argparse
import sys

from copynce_hf.commands.convert_original import add_arguments, run
from copynce_hf.modeling.errors import CopyNCEError


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    try:
        return run(parser.parse_args(argv))
    except CopyNCEError as error:
        print(f"convert_copynce_original: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
