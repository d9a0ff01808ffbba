"""Held-out muAP of model folders over several draws of copies: the export rule with enough copies to decide.

A training run scores itself on its held-out images (the last ``num_eval_images`` = 40 of the train split):
30 copies drawn with the run's seed, 10 edited distractors. Near the ceiling, two good models differ there by
about one query, so a decision between them on one draw is mostly chance. This command scores every model
given on the copies of ``--seeds`` draws (the same images, new edits per seed: 30 copies per seed) with the
task, precision and engine of a training run's own evaluation
(:func:`copynce_hf.training.run.held_out_score`), and reports each model's mean over the draws. The first
``--model`` is the current one; ``better`` marks each other model whose mean muAP is above it.

    python -m benchmarks.training.held_out --kind descriptor --dataset .gpu/train_split --seeds 10 \\
        --model embedded=copynce_hf/pretrained/descriptor --model new=outputs/gpu3/descriptor \\
        --output outputs/gpu3/held_out_descriptor.json

The models are evaluated as saved (their own configuration, float32 here); ``--kind`` names the training
config whose evaluation is used (``configs/bench_descriptor.yaml`` or ``configs/bench_matcher.yaml``); a
matcher's held-out task does not read its hard-negative graph, so none is needed.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from ..common import machine_info, now, write_json
from .gpu import DESCRIPTOR_CONFIG, MATCHER_CONFIG

__all__ = ["held_out_scores", "main"]

#: The numbers averaged over the draws (all of them are in the per-seed entries).
AVERAGED = ("micro_ap", "recall_at_p90", "recall_at_rank1")


def _model_argument(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"--model takes NAME=FOLDER, got {text!r}")
    if not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"--model {name}: {folder} is not a folder")
    return name, Path(folder)


def held_out_scores(kind: str, dataset: Path, models: list[tuple[str, Path]], seeds: int, held_out: int = 40,
                    progress=print) -> dict:
    """Every model's held-out numbers for copy seeds ``0 .. seeds - 1`` and their means.

    Returns:
        ``{"models": {name: {"folder", "per_seed": [scores, ...], "mean": {number: value}, "better"}}, ...}``;
        ``better`` is ``None`` for the first (current) model, else whether its mean muAP is above the first's.
    """
    from copynce_hf.training import load_config
    from copynce_hf.training.run import held_out_score

    if kind not in ("descriptor", "matcher"):
        raise ValueError(f"kind must be 'descriptor' or 'matcher', got {kind!r}")
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}")
    config_file = DESCRIPTOR_CONFIG if kind == "descriptor" else MATCHER_CONFIG
    results = {}
    for name, folder in models:
        per_seed = []
        for seed in range(seeds):
            # "model": None drops the config file's model settings: each folder is scored as saved
            overrides = {"dataset": str(dataset), "model_name_or_path": str(folder), "model": None,
                         "init_from_dino": None, "seed": seed, "num_eval_images": held_out,
                         "mixed_precision": "no", "dataloader_num_workers": 0, "report_to": "none"}
            if kind == "matcher":
                overrides.update(knn_graph=None, hard_negative_mining="off")
            scores = held_out_score(load_config(config_file, overrides))
            if scores is None:
                raise SystemExit(f"{dataset} holds too few images to hold out {held_out}")
            per_seed.append(dict(scores))
            progress(f"{name} seed {seed}: muAP {scores['micro_ap']:.4f}")
        mean = {key: statistics.fmean(entry[key] for entry in per_seed) for key in AVERAGED}
        results[name] = {"folder": str(folder), "per_seed": per_seed, "mean": mean}
    current = results[models[0][0]]["mean"]["micro_ap"]
    for index, (name, _) in enumerate(models):
        results[name]["better"] = None if index == 0 else results[name]["mean"]["micro_ap"] > current
    return {"kind": "held_out", "model_kind": kind, "created": now(), "machine": machine_info(),
            "dataset": str(dataset), "held_out_images": held_out, "seeds": list(range(seeds)), "models": results}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.held_out", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["descriptor", "matcher"], required=True)
    parser.add_argument("--dataset", type=Path, required=True,
                        help="the training image folder (its last --held-out images are scored)")
    parser.add_argument("--model", dest="models", type=_model_argument, action="append", required=True,
                        help="NAME=FOLDER; the first is the current model, the others are compared with it")
    parser.add_argument("--seeds", type=int, default=10, help="draws of copies: seeds 0 .. N-1 (default 10)")
    parser.add_argument("--held-out", type=int, default=40, help="held-out images (the configs' 40)")
    parser.add_argument("--output", type=Path, required=True, help="JSON file to write")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    names = [name for name, _ in args.models]
    if len(set(names)) != len(names):
        raise SystemExit(f"--model names must differ, got {names}")
    report = held_out_scores(args.kind, args.dataset, args.models, args.seeds, args.held_out)
    write_json(args.output, report)
    for name, entry in report["models"].items():
        mean = entry["mean"]
        verdict = "current" if entry["better"] is None else ("better" if entry["better"] else "not better")
        print(f"{name:>24}  mean muAP {mean['micro_ap']:.4f}  RP90 {mean['recall_at_p90']:.4f}  "
              f"recall@1 {mean['recall_at_rank1']:.4f}  ({verdict})")
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
