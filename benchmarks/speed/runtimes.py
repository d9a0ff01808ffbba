"""PyTorch against ONNX Runtime on this CPU: descriptor images/s and matcher pairs/s (encoder-token cache).

    nice -n 5 python -m benchmarks.speed.runtimes                      # embedded models and ViT-S/16 224, 1 and 2 threads
    python -m benchmarks.speed.runtimes --models embedded --threads 1

For every model size and thread count, both runtimes run the same work, alternated round by round
(so that a change of load on a shared machine hits both) and each keeps its fastest round, in wall time
and in CPU time of the process (all its threads; on a loaded machine the fairer of the two at one thread):

* descriptor: one forward pass over a batch of the bundled images (``copynce_hf/assets/images``,
  processed once beforehand): images per second of ``model(pixel_values=...)``;
* matcher: :class:`~copynce_hf.retrieval.MatcherScorer` (``--matcher-lce none``, a fresh cache per
  round) scoring 4 of the bundled images against all 12: one encoder pass per image (16) and one
  fusion pass per pair (48), image decoding and processing included; pairs per second.

Models: the embedded descriptor and matcher (``copynce_hf/pretrained``, 112 px, 8-pixel patches) and
randomly initialised ViT-S/16 at 224 (the paper's size; the matcher splits its 12 blocks 8 + 4, as
the paper's enc-8 / fus-4). Their ONNX graphs are exported by :func:`copynce_hf.runtime.onnx_export.export_onnx`
into ``<output-dir>/onnx_models`` (kept and reused). Both runtimes get the same number of intra-op
threads (``torch.set_num_threads`` and the ONNX Runtime session's ``intra_op_num_threads``). The load
average of the machine is recorded before and after each measurement. Results go to
``<output-dir>/onnx_speed.json`` and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from ..common import DEFAULT_OUTPUT_DIR, command_line, machine_info, now, write_json

logger = logging.getLogger("benchmarks.speed.runtimes")

MODELS = ("embedded", "vits16-224")
#: Matcher work: the first QUERIES bundled images against all 12 (16 encoder passes, 48 fusion passes).
QUERIES = 4
VITS16_224 = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                  image_size=224, patch_size=16)


def torch_model_folders(name: str, folder: Path) -> dict[str, Path | None]:
    """``{"descriptor": folder, "matcher": folder}`` of a model size (``None``: the embedded model)."""
    if name == "embedded":
        return {"descriptor": None, "matcher": None}
    import torch

    from copynce_hf.modeling import (
        CopyNCEDescriptorConfig,
        CopyNCEDescriptorModel,
        CopyNCEImageProcessor,
        CopyNCEMatcherConfig,
        CopyNCEMatcherModel,
    )

    folders = {"descriptor": folder / "descriptor", "matcher": folder / "matcher"}
    if all((path / "config.json").is_file() for path in folders.values()):
        return folders
    torch.manual_seed(0)
    processor = CopyNCEImageProcessor(size={"height": 224, "width": 224})
    for kind, model in (("descriptor", CopyNCEDescriptorModel(CopyNCEDescriptorConfig(descriptor_dim=512,
                                                                                      **VITS16_224))),
                        ("matcher", CopyNCEMatcherModel(CopyNCEMatcherConfig(num_fusion_layers=4, **VITS16_224)))):
        model.save_pretrained(folders[kind])
        processor.save_pretrained(folders[kind])
    return folders


def onnx_folder(source: Path | None, kind: str, target: Path) -> Path:
    from copynce_hf.runtime.loading import load_model
    from copynce_hf.runtime.onnx_export import export_onnx, is_onnx_folder

    if not is_onnx_folder(target):
        logger.info("exporting the %s to %s", kind, target)
        export_onnx(*load_model(source, kind), target, source=str(source or "embedded"))
    return target


def fastest_rates(workloads: dict, rounds: int) -> dict[str, dict[str, float]]:
    """Each ``name -> (callable, items)``'s items per second of wall time and per second of this process's CPU
    time (all its threads): one warm-up, then ``rounds`` alternated rounds, the fastest round of each (load on a
    shared machine only ever adds time; CPU time is what the work costs whatever the load)."""
    import torch

    wall = {name: [] for name in workloads}
    cpu = {name: [] for name in workloads}
    with torch.inference_mode():
        for function, _ in workloads.values():
            function()
        for _ in range(rounds):
            for name, (function, _) in workloads.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                function()
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    return {name: {"wall": items / min(wall[name]), "cpu": items / min(cpu[name])}
            for name, (_, items) in workloads.items()}


def bench_size(name: str, output_dir: Path, threads: list[int], rounds: int) -> dict:
    """Both runtimes' descriptor images/s and matcher pairs/s for one model size, at each thread count."""
    import torch
    from PIL import Image

    from copynce_hf.data import ASSET_IMAGES
    from copynce_hf.retrieval import MatcherScorer, load_onnx_model
    from copynce_hf.runtime.loading import load_model

    files = {path.stem: path for path in sorted(ASSET_IMAGES.glob("*.jpg"))}
    pairs = [(query, reference) for query in list(files)[:QUERIES] for reference in files]
    images = [Image.open(path).convert("RGB") for path in files.values()]
    sources = torch_model_folders(name, output_dir / "onnx_models" / f"{name}-torch")
    exported = {kind: onnx_folder(source, kind, output_dir / "onnx_models" / f"{name}-{kind}")
                for kind, source in sources.items()}
    descriptor, processor = load_model(sources["descriptor"], "descriptor")
    matcher, matcher_processor = load_model(sources["matcher"], "matcher")
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    result = {"image_size": descriptor.config.image_size, "patch_size": descriptor.config.patch_size,
              "hidden_size": descriptor.config.hidden_size, "blocks": descriptor.config.num_hidden_layers,
              "matcher_fusion_blocks": matcher.config.num_fusion_layers, "descriptor_batch": len(images),
              "matcher_pairs": len(pairs), "threads": {}}
    for count in threads:
        torch.set_num_threads(count)
        onnx_descriptor, _ = load_onnx_model(exported["descriptor"], "descriptor", threads=count)
        onnx_matcher, _ = load_onnx_model(exported["matcher"], "matcher", threads=count)

        def score(model):
            return MatcherScorer(model, matcher_processor, batch_size=64).score(pairs, files, files, progress=False)

        load_before = os.getloadavg()[0]
        rates = fastest_rates({
            "torch descriptor": (lambda: descriptor(pixel_values=pixel_values), len(images)),
            "onnx descriptor": (lambda model=onnx_descriptor: model(pixel_values=pixel_values), len(images)),
            "torch matcher": (lambda: score(matcher), len(pairs)),
            "onnx matcher": (lambda model=onnx_matcher: score(model), len(pairs)),
        }, rounds)
        result["threads"][str(count)] = {
            "descriptor_images_per_second": {"torch": rates["torch descriptor"], "onnx": rates["onnx descriptor"]},
            "matcher_pairs_per_second": {"torch": rates["torch matcher"], "onnx": rates["onnx matcher"]},
            "unit": "items per second of wall time (wall) and of process CPU time (cpu), fastest round",
            "load_average_1min": [load_before, os.getloadavg()[0]],
        }
        logger.info("%s, %d thread(s): %s", name, count, rates)
    return result


def markdown_table(record: dict) -> str:
    """Per model size and thread count: each runtime's rate per wall second / per CPU second."""
    lines = ["| models | threads | descriptor images/s, torch | ONNX Runtime | matcher pairs/s (cache), torch "
             "| ONNX Runtime | load average (1 min) |", "|---|---|---|---|---|---|---|"]
    for name, entry in record["models"].items():
        for count, figures in entry["threads"].items():
            cells = [f"{figures[key][runtime]['wall']:.1f} / {figures[key][runtime]['cpu']:.1f}"
                     for key in ("descriptor_images_per_second", "matcher_pairs_per_second") for runtime in ("torch", "onnx")]
            load = figures["load_average_1min"]
            lines.append(f"| {name} ({entry['image_size']} px) | {count} | {' | '.join(cells)} "
                         f"| {load[0]:.1f} -> {load[1]:.1f} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="model sizes")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="intra-op thread counts")
    parser.add_argument("--rounds", type=int, default=3, help="alternated timed rounds (fastest kept)")
    parser.add_argument("--output-dir", default=str(DEFAULT_OUTPUT_DIR), help="where onnx_speed.json is written")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    output_dir = Path(args.output_dir)
    record = {"kind": "onnx_speed", "machine": machine_info(), "command": command_line(), "created": now(),
              "models": {}}
    for name in args.models:
        record["models"][name] = bench_size(name, output_dir, args.threads, args.rounds)
        path = write_json(output_dir / "onnx_speed.json", record)  # after every size: nothing measured is lost
    print(markdown_table(record))
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
