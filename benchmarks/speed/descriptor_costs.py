"""CPU time per image of the descriptor stage (decode, resize, model: :func:`copynce_hf.retrieval.extract_descriptors`)
for descriptor models of any kind: the embedded CopyNCE descriptor, a model folder, an ONNX embedding model
(``onnx:PATH``) or SSCD's graphs (``sscd``, ``sscd-distilled``: :data:`copynce_hf.evaluation.systems.SSCD_MODELS`).

    OMP_NUM_THREADS=1 python -m benchmarks.speed.descriptor_costs outputs/minidisc/references \\
        --models embedded sscd sscd-distilled

Each model embeds ``--warm-up`` images first, then the next ``--count`` images of the folder (sorted by name) in
batches of ``--batch-size``; CPU seconds are the process's (every thread), the figure to compare on a shared machine.
"""

from __future__ import annotations

import argparse
import time

from ..common import limit_threads


def descriptor_value(name: str) -> str | None:
    """``embedded`` -> ``None`` (the embedded descriptor); ``sscd``, ``sscd-distilled`` -> SSCD's ``onnx:`` graph;
    anything else as it is (a folder, ``onnx:PATH``)."""
    from copynce_hf.evaluation.systems import SSCD_MODELS, sscd_model

    if name == "embedded":
        return None
    return sscd_model(name) if name in SSCD_MODELS else name


def image_costs(folder: str, name: str, count: int, warm_up: int, batch_size: int) -> dict:
    """``{"model", "images", "cpu_ms_per_image", "wall_ms_per_image"}`` of one descriptor model on ``folder``."""
    from copynce_hf.retrieval import ImageFolderSource, ImageListSource, extract_descriptors
    from copynce_hf.runtime.loading import load_model

    source = ImageFolderSource(folder)
    if len(source) < warm_up + count:
        raise SystemExit(f"{folder} holds {len(source)} images; --warm-up {warm_up} + --count {count} are needed")
    model, processor = load_model(descriptor_value(name), "descriptor", name)
    warm = ImageListSource(source.ids[:warm_up], source.files[:warm_up])
    timed = ImageListSource(source.ids[warm_up:warm_up + count], source.files[warm_up:warm_up + count])
    extract_descriptors(model, processor, warm, batch_size=batch_size, progress=False)
    cpu, wall = time.process_time(), time.perf_counter()
    extract_descriptors(model, processor, timed, batch_size=batch_size, progress=False)
    return {"model": name, "images": count, "cpu_ms_per_image": 1000 * (time.process_time() - cpu) / count,
            "wall_ms_per_image": 1000 * (time.perf_counter() - wall) / count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed.descriptor_costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a folder of images")
    parser.add_argument("--models", nargs="+", default=["embedded", "sscd", "sscd-distilled"],
                        help="embedded, sscd, sscd-distilled, a model folder or onnx:PATH (default: the first three)")
    parser.add_argument("--count", type=int, default=100, help="images timed (default 100)")
    parser.add_argument("--warm-up", type=int, default=10, help="images embedded first, untimed (default 10)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime threads (default 1)")
    args = parser.parse_args(argv)
    limit_threads(args.threads)
    print("| descriptor | images | CPU ms per image | wall ms per image |\n|---|---|---|---|")
    for name in args.models:
        row = image_costs(args.folder, name, args.count, args.warm_up, args.batch_size)
        print(f"| {name} | {row['images']} | {row['cpu_ms_per_image']:.1f} | {row['wall_ms_per_image']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
