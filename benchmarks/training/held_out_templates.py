"""The template half of the export rule: pair AP of models on small template collections of held-out photos.

A model continued on pairs that teach content over frame is exported only if it is better on deduplication with
templates *and* no worse on the plain held-out task (:mod:`.held_out`). This command builds, for each seed, a
small version of the template benchmark's dedup collection (:mod:`benchmarks.templates.task`: copies, copies of copies,
absent originals, framed copies, strangers sharing a template, plain photos) from the **held-out** photos only
(the last ``--held-out`` = 40 of the ``train`` split by name, which training never sees), and scores every pair
of it with each model given: a descriptor by cosine, a matcher by its copy probability (every pair, so that the
matcher is judged apart from any candidate search). The numbers are the pair AP over every true pair
(:func:`.templates.pair_average_precision`) and the template-sharing false pairs among the 20 best pairs, per seed
and as means.

    python -m benchmarks.training.held_out_templates --kind descriptor --seeds 5 \\
        --model embedded=copynce_hf/pretrained/descriptor --model new=outputs/x/descriptor --model sscd=sscd
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from ..common import limit_threads, write_json
from ..minidisc import SHARED_DATA, train_split_files
from ..templates.systems import all_pairs, pair_average_precision, ranked_pairs, template_false_pairs
from ..templates.task import DedupPlan, DetectPlan, build_dedup_collection, true_pairs

#: A collection of 26 held-out photos (about 40 images, 4 templates); every shape of the benchmark's is there.
HELD_OUT_DEDUP = DedupPlan(pairs=4, triples=2, absent=2, framed_copies=3, framed_originals=2, absent_framed=1,
                           strangers=8, singles=4, templates_per_kind=1)
#: The fewest photos the builder asks of the other task (none of them is used here).
HELD_OUT_DETECT = DetectPlan(references=4, strangers=2, framed_queries=2, plain_queries=2, distractors=2,
                             templates_per_kind=1)
TOP = 20


def model_argument(text: str) -> tuple[str, str]:
    """``NAME=FOLDER`` -> ``(name, folder)``; a descriptor may also be ``NAME=onnx:PATH`` (an ONNX embedding model)
    or ``NAME=sscd`` / ``NAME=sscd-distilled`` (SSCD's graphs, :func:`~benchmarks.templates.systems.model_value`)."""
    from ..templates.systems import model_value

    name, sep, folder = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--model takes NAME=FOLDER, got {text!r}")
    try:
        folder = model_value(folder)
    except ImportError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not folder.startswith("onnx:") and not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"--model takes NAME=FOLDER with an existing folder (or NAME=onnx:PATH, "
                                         f"NAME=sscd, NAME=sscd-distilled for a descriptor), got {text!r}")
    return name, folder


def pair_scores(kind: str, folder: str, source) -> np.ndarray:
    """(N, N) scores of every pair of ``source``'s images by the model in ``folder`` (cosine or copy probability)."""
    import torch

    from copynce_hf.evaluation.systems import DescriptorSystem
    from copynce_hf.runtime.loading import load_model

    model, processor = load_model(str(folder), kind)
    if kind == "descriptor":
        found = DescriptorSystem("descriptor", model, processor).embed(source, "collection")
        return found.descriptors @ found.descriptors.T
    images = [source.load(i) for i in range(len(source))]
    with torch.no_grad():
        encoded = torch.cat([model.pre_fusion_tokens(processor(images[i:i + 32], return_tensors="pt")["pixel_values"])
                             for i in range(0, len(images), 32)])
        rows, cols = np.triu_indices(len(images), k=1)
        scores = np.zeros((len(images), len(images)), dtype=np.float32)
        for start in range(0, len(rows), 256):
            a, b = rows[start:start + 256], cols[start:start + 256]
            scores[a, b] = torch.sigmoid(model.fuse(encoded[a], encoded[b])[0]).numpy()
    return scores


def score_models(kind: str, models: list[tuple[str, str]], seeds: int, held_out: int, work: Path) -> dict:
    """Per model: pair AP and template-sharing false pairs in the top :data:`TOP`, per seed and averaged."""
    from copynce_hf.retrieval import ImageFolderSource

    photos = train_split_files(SHARED_DATA)[-held_out:]
    results = {name: {"per_seed": []} for name, _ in models}
    for seed in range(seeds):
        truth = build_dedup_collection(work / f"seed{seed}", photos, seed, HELD_OUT_DEDUP, HELD_OUT_DETECT,
                                       "dev")
        source = ImageFolderSource(work / f"seed{seed}" / "collection")
        truth_pairs = true_pairs(truth)
        for name, folder in models:
            scored = all_pairs(list(source.ids), pair_scores(kind, folder, source))
            ranked = ranked_pairs(scored, truth_pairs)
            results[name]["per_seed"].append({
                "seed": seed, "pair_ap": pair_average_precision(scored, truth_pairs),
                "template_false_pairs_top": len(template_false_pairs(ranked, truth, TOP))})
    for entry in results.values():
        for key in ("pair_ap", "template_false_pairs_top"):
            entry[key] = statistics.mean(run[key] for run in entry["per_seed"])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.held_out_templates", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("descriptor", "matcher"), required=True)
    parser.add_argument("--model", type=model_argument, action="append", required=True, metavar="NAME=FOLDER",
                        help="a model folder; the first is the current one")
    parser.add_argument("--seeds", type=int, default=5, help="collections drawn (seeds 0..N-1; default 5)")
    parser.add_argument("--held-out", type=int, default=40, help="held-out train photos (the last by name; default 40)")
    parser.add_argument("--work", type=Path, default=Path("outputs/held_out_templates"), help="where collections go")
    parser.add_argument("--output", type=Path, default=None, help="a JSON file for the results")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    limit_threads(args.threads)
    if not (SHARED_DATA / "imagenet-sample").is_dir():
        print(f"skipped: {SHARED_DATA / 'imagenet-sample'} is absent (the benchmark data is only present in CI and "
              "dev sessions)")
        return 0
    results = score_models(args.kind, args.model, args.seeds, args.held_out, args.work)
    print(f"| {args.kind} | pair AP (mean of {args.seeds}) | template-sharing false pairs in the top {TOP} | per seed |")
    print("|---|---|---|---|")
    for name, entry in results.items():
        per_seed = " ".join(f"{run['pair_ap']:.3f}" for run in entry["per_seed"])
        print(f"| {name} | {entry['pair_ap']:.4f} | {entry['template_false_pairs_top']:.1f} | {per_seed} |")
    if args.output is not None:
        write_json(args.output, {"kind": args.kind, "seeds": args.seeds, "held_out": args.held_out,
                                 "models": {name: str(folder) for name, folder in args.model}, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
