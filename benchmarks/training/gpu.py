"""The embedded models on a lent GPU, in one command: the longest descriptor run that fits, then the matcher
continued on hard negatives from the new descriptor, each beside the current embedded model on the training
run's own held-out images, so that what comes back is exported only where it is better.

Here, once (everything the GPU machine needs and lacks goes to ``.gpu/``, which git ignores)::

    python -m benchmarks.training.gpu prepare          # prints the size that travels and the device call
    python -m benchmarks.training.gpu prepare --instances grid2   # the photos cut into instances (the CPU curve's data)

On the lent machine, in one device call with ``carry: [".gpu"]`` and ``timeout_s: 600``::

    bash .gpu/run.sh                                   # packages into /tmp/site, then ``run --output-dir $OUT``
    bash .gpu/run.sh --pairs content-over-frame        # the same on copy-to-copy and shared-template pairs
    bash .gpu/run.sh --pairs content-over-frame --descriptor-init scratch --descriptor-size next
    bash .gpu/run.sh --query-recipe training_everyday  # both models' queries with the everyday families added
    bash .gpu/run.sh --query-recipe training_everyday --knn-group-by kind   # after prepare --instances
                                                       # photos,procedural280: hard negatives within each kind

On the CPU (``tests/test_gpu_training.py`` runs this with tiny numbers)::

    python -m benchmarks.training.gpu run --device cpu --dataset copynce_hf/assets/images --held-out 4 \\
        --batch-size 4 --workers 0 --descriptor-steps 2 --matcher-steps 2 --output-dir /tmp/gpu-run

What ``run`` does, each step in this process, in this order:

1. the current embedded descriptor's held-out score (:func:`copynce_hf.training.run.held_out_score`: the
   task, precision and engine of a training run's own ``eval``, with that run's configuration);
2. a calibration run of ``--calibration-seconds`` that measures the training pairs per second (skipped
   with ``--descriptor-steps``), from which the descriptor gets the steps that fill ``--descriptor-seconds``;
3. the descriptor run: ``configs/bench_descriptor.yaml`` (the embedded descriptor's setting; with ``--pairs
   content-over-frame``, ``configs/content_over_frame_descriptor.yaml``, and the matcher's file likewise) with
   ``--batch-size`` pairs per step (128: 4x the CPU runs' 32; learning rate 1e-3 as there, not scaled),
   a warm-up of 5 % of the steps, a weight average (EMA 0.998) beside the trained weights, ``--workers``
   data-loader workers, bf16 autocast. It starts from the embedded descriptor (``--descriptor-init
   embedded``, the default): that model already holds 83k pairs of CPU training, and a run continued from
   it is compared with exactly what it started from; ``--descriptor-init scratch`` trains the config's
   fresh model (a point of the compute-scaling curve instead), of ``--descriptor-size`` (``next``: ViT-S's
   width and depth at 112 pixels, :data:`DESCRIPTOR_SIZES`) at ``bench_descriptor.yaml``'s learning rate;
4. of its EMA and trained weights, the one with the better held-out muAP (the run's own evaluation);
5. the k-NN graph (k = 8) of the training images under that descriptor
   (:func:`copynce_hf.data.knn_features.knn_graph_of_images`, ``scripts/build_knn.py``'s work); with
   ``--knn-group-by kind`` on an instance folder, a graph per kind (photos' neighbours among photos, procedural
   images' among procedural ones: the matcher that ships was trained so; both models train on the folder);
6. the current embedded matcher's held-out score, then the matcher continued from it:
   ``configs/bench_matcher.yaml`` with hard negatives from that graph, ``--batch-size`` pairs per step,
   learning rate 2.5e-4 (the embedded matcher's last continuation), steps that fill ``--matcher-seconds``
   at the descriptor run's measured rate;
7. under ``--output-dir``: ``report.json`` (settings, steps, pairs, times, every held-out score, and per
   model ``better``: its held-out muAP above the current model's), ``descriptor.tar.gz`` and
   ``matcher.tar.gz`` (the model folders, float32, with their ``training_summary.json``; the descriptor's
   trained weights, when chosen over their average, in ``descriptor/without_ema/`` as in the run's folder) and
   ``knn_graph.safetensors``; the runs' folders go to ``--work-dir`` (``run.sh``: ``/tmp/gpu-work``, so that
   ``$OUT`` holds only what the device call sends back: at most 8 files).

The report's ``better`` compares one draw of 30 held-out copies, where good models differ by about one query:
decide an export afterwards, here, on ten draws (``python -m benchmarks.training.held_out``, BENCHMARKS.md), and for
``--pairs content-over-frame`` on template collections of the held-out photos too (``python -m
benchmarks.training.held_out_templates``).

Every run also stops at its ``max_train_seconds`` (1.2 x its budget), so a slower machine cuts a run
short rather than the device call. The held-out images are the last 40 of the train split
(``num_eval_images`` of the configs), which neither the embedded models nor these runs train on.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from ..common import REPO_ROOT, machine_info, now, write_json
from ..minidisc import SHARED_DATA
from .train import instance_split

logger = logging.getLogger("benchmarks.training.gpu")

__all__ = ["RunPlan", "build_parser", "main", "prepare", "run", "travelling_bytes"]

DESCRIPTOR_CONFIG = REPO_ROOT / "configs" / "bench_descriptor.yaml"
MATCHER_CONFIG = REPO_ROOT / "configs" / "bench_matcher.yaml"
#: ``--pairs``: the training configs of each kind of pairs. ``paper``: the embedded models' own (an edited query
#: against its unedited reference); ``content-over-frame``: the same continued with copy-to-copy positives and
#: shared-template negatives (beyond the paper, docs/FIDELITY.md).
PAIR_CONFIGS = {
    "paper": {"descriptor": DESCRIPTOR_CONFIG, "matcher": MATCHER_CONFIG},
    "content-over-frame": {"descriptor": REPO_ROOT / "configs" / "content_over_frame_descriptor.yaml",
                           "matcher": REPO_ROOT / "configs" / "content_over_frame_matcher.yaml"},
}
#: ``--query-recipe``: the package's own training recipes (the paper presets draw from all of AugLy's fonts, which
#: the bundle does not carry).
QUERY_RECIPES = ("training", "training_everyday")
#: ``--descriptor-size``: the model fields of each descriptor size over ``bench_descriptor.yaml``'s (``embedded``:
#: 6 blocks, 192 wide, 112 pixels, 8-pixel patches). ``next``: ViT-S's width and depth at the same input, trained
#: from scratch (``--descriptor-init scratch``): the embedded size stopped improving with more pairs.
DESCRIPTOR_SIZES = {
    "embedded": {},
    "next": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536},
}
EMBEDDED = REPO_ROOT / "copynce_hf" / "pretrained"
#: The folder ``prepare`` fills and the device call carries (git-ignored).
BUNDLE = REPO_ROOT / ".gpu"
#: What the device machine may receive: the working tree and the carried paths together.
TRAVEL_LIMIT = 64 * 2**20
#: Packages the GPU machine's image lacks or holds in an older version (its list: the device notes),
#: carried as wheels of the versions installed here ...
WHEELS = ("transformers", "datasets", "faiss-cpu", "dill", "multiprocess", "python-magic")
#: The albumentations edits of the paper recipes and their needs: only benchmarks.scale.gpu_throughput's data part
#: uses them (the training runs' recipes do not), so a call without the throughput part leaves them (7.8 MB).
THROUGHPUT_WHEELS = ("albumentations", "albucore", "pydantic", "pydantic-core", "annotated-types",
                     "typing-inspection", "stringzilla", "simsimd")
#: ... or, pure Python without a wheel (iopath) or too large as one (augly, 24 MB), as copies of the
#: installed package (augly without the assets the runs' recipes do not read).
COPIED = ("augly", "iopath")
#: AugLy asset folders no recipe of the training runs reads (of its fonts, only those of the configs' recipes travel).
UNUSED_AUGLY = ("tests", "audio", "video", "text", "assets/audio", "assets/text", "assets/masks")


# ---------------------------------------------------------------------------------------------- prepare


def prepare(bundle: Path = BUNDLE, images: Path = SHARED_DATA / "imagenet-sample",
            splits_csv: Path = SHARED_DATA / "imagenet-sample-splits.csv", max_side: int = 256, quality: int = 80,
            packages: bool = True, max_images: int | None = None, throughput: bool = True,
            instances: str | None = None, instance_seed: int = 0, held_out: int = 40) -> dict:
    """Fill ``bundle`` with the train split (shrunk to ``max_side``, JPEG ``quality``: 64 MiB travel in all;
    its first ``max_images`` by name only, if given: a call that only measures throughput), with ``packages``,
    the wheels, the slim AugLy and libmagic, and ``run.sh``; returns what it wrote. Without ``throughput``,
    ``run.sh`` skips ``benchmarks.scale.gpu_throughput`` and the albumentations wheels stay behind.

    With ``instances`` (a spec of ``benchmarks.training.train --instances``, e.g. ``"grid2"``), the split holds the
    instances made of the shrunk training photos instead, the last ``held_out`` photos whole and last (the runs'
    evaluation is unchanged), as the CPU runs of the instance curve train on them."""
    from PIL import Image

    from copynce_hf.evaluation.minidisc import read_splits
    from copynce_hf.images import load_image

    files = read_splits(Path(splits_csv), Path(images)).get("train", [])
    if not files:
        raise SystemExit(f"no train image listed in {splits_csv}")
    files = sorted(files, key=lambda path: path.name)[:max_images]
    split = bundle / "train_split"
    if split.exists():
        shutil.rmtree(split)
    with tempfile.TemporaryDirectory() as shrunk_folder:
        shrunk = Path(shrunk_folder) if instances else split
        shrunk.mkdir(parents=True, exist_ok=True)
        for path in files:  # the same file names: the same images are held out (the last 40 by name)
            image = load_image(path)
            if max(image.size) > max_side:
                image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
            image.save(shrunk / path.name, format="JPEG", quality=quality)
        if instances:
            photos = [shrunk / path.name for path in files]
            instance_split(split, photos[:len(photos) - held_out], photos[len(photos) - held_out:], instances,
                           instance_seed, link=False)
    if packages:
        _bundle_packages(bundle, WHEELS + (THROUGHPUT_WHEELS if throughput else ()))
    script = bundle / "run.sh"
    script.write_text(RUN_SCRIPT.replace("#!/bin/bash\n", "#!/bin/bash\n" + ("" if throughput else
                                         "export SKIP_THROUGHPUT=1  # prepare --no-throughput\n"), 1),
                      encoding="utf-8")
    return {"images": len(files), "bundle_bytes": _folder_bytes(bundle), "travelling_bytes": travelling_bytes(bundle)}


def _bundle_packages(bundle: Path, names: tuple[str, ...]) -> None:
    wheels = bundle / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in names]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux2014_x86_64", "-d", str(wheels), *pins], check=True)
    import magic  # noqa: F401  (libmagic is loaded: its file is the one to carry)

    kept = {Path(font).stem for font in _training_fonts()}
    if (bundle / "site").exists():
        shutil.rmtree(bundle / "site")
    for name in COPIED:
        source = Path(importlib.import_module(name).__file__).parent
        shutil.copytree(source, bundle / "site" / name, ignore=shutil.ignore_patterns("__pycache__"))
    site = bundle / "site" / "augly"
    for name in UNUSED_AUGLY:
        shutil.rmtree(site / name, ignore_errors=True)
    for font in (site / "assets" / "fonts").iterdir():
        if font.stem not in kept:
            font.unlink()
    library = _libmagic_path()
    (bundle / "lib").mkdir(exist_ok=True)
    shutil.copyfile(library, bundle / "lib" / "libmagic.so.1")


def _training_fonts() -> set[str]:
    """The AugLy fonts (``"<name>.ttf"``) that the runs of every ``--pairs`` may draw: the text steps of their
    configs' recipes and of :data:`QUERY_RECIPES`, the queries' captions, and the templates' frames and meme bands."""
    from augly.utils import MEME_DEFAULT_FONT

    from copynce_hf.pixtrace import CopyRecipe
    from copynce_hf.pixtrace.edits.frames import FRAME_FONTS
    from copynce_hf.pixtrace.steps import CAPTION_FONTS
    from copynce_hf.pixtrace.templates import TEMPLATE_FONTS
    from copynce_hf.training import load_config

    recipes = {name for configs in PAIR_CONFIGS.values() for path in configs.values() for config in [load_config(path)]
               for name in (config.query_recipe, config.reference_recipe, config.reference_copy_recipe)}
    recipes |= set(QUERY_RECIPES)
    fonts = {font for name in recipes if name != "off" for _, step in CopyRecipe.preset(name).steps
             if hasattr(step, "font_choices") for font in step.font_choices()}
    return fonts | {*CAPTION_FONTS, *TEMPLATE_FONTS, *FRAME_FONTS, Path(MEME_DEFAULT_FONT).name}


def _libmagic_path() -> Path:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            if "libmagic.so" in line:
                return Path(line.split()[-1])
    raise SystemExit("libmagic is not loaded in this process: install libmagic1 here first")


def travelling_bytes(bundle: Path = BUNDLE) -> int:
    """Bytes a device call sends: the tracked and untracked-not-ignored files, plus ``bundle``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                            check=True, capture_output=True).stdout.split(b"\0")
    tree = sum((REPO_ROOT / name.decode()).stat().st_size for name in listed
               if name and (REPO_ROOT / name.decode()).is_file())
    return tree + (_folder_bytes(bundle) if bundle.exists() else 0)


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


#: The command of the device call (``bash .gpu/run.sh``): the carried packages, a check that everything
#: imports (seconds, not minutes, if something is missing), then the run, its log beside its results.
RUN_SCRIPT = """#!/bin/bash
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
    .gpu/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD/.gpu/site:$PWD LD_LIBRARY_PATH=$PWD/.gpu/lib:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/tmp/hf
python3 -c "import torch, numpy, pyarrow, transformers, datasets, faiss, augly.image, copynce_hf.training.run; \\
print('torch', torch.__version__, 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__, \\
'transformers', transformers.__version__, 'datasets', datasets.__version__)" 2>&1 | tee "$OUT/run.log" || exit 4
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/run.log"
if [ -z "$SKIP_THROUGHPUT" ]; then  # benchmarks.scale.gpu_throughput first (about 1.5 minutes), capped so training always runs
    python3 -c "import albumentations" 2>&1 | tee -a "$OUT/run.log" || exit 4
    timeout "${THROUGHPUT_SECONDS:-200}" python3 -m benchmarks.scale.gpu_throughput --device cuda --output-dir "$OUT" \\
        --repeats 5 --image-folder .gpu/train_split 2>&1 | grep -v "it/s\\]$" | tee -a "$OUT/run.log"
fi
[ -n "$SKIP_TRAINING" ] && exit 0  # a call that only measures throughput
python3 -m benchmarks.training.gpu run --dataset .gpu/train_split --output-dir "$OUT" --work-dir /tmp/gpu-work "$@" \\
    2>&1 | tee -a "$OUT/run.log"
"""


# ---------------------------------------------------------------------------------------------- run


@dataclasses.dataclass
class RunPlan:
    """The settings of one ``run`` (the command line's), recorded in ``report.json``."""

    dataset: Path
    output_dir: Path
    device: str = "cuda"
    batch_size: int = 128
    workers: int = 16
    precision: str = "bf16"
    held_out: int = 40
    pairs: str = "paper"
    descriptor_init: str = "embedded"
    descriptor_size: str = "embedded"
    descriptor_seconds: float = 200.0
    matcher_seconds: float = 75.0
    calibration_seconds: float = 20.0
    descriptor_steps: int | None = None
    matcher_steps: int | None = None
    knn_k: int = 8
    knn_group_by: str | None = None
    seed: int = 0
    work_dir: Path | None = None
    query_recipe: str | None = None

    def overrides(self, kind: str, folder: Path) -> dict:
        """The training options of a ``kind`` run writing to ``folder`` (the config file gives the rest)."""
        values = {"dataset": str(self.dataset), "output_dir": str(folder), "seed": self.seed,
                  "per_device_train_batch_size": self.batch_size, "dataloader_num_workers": self.workers,
                  "mixed_precision": self.precision, "num_eval_images": self.held_out, "checkpointing_steps": None,
                  "logging_steps": 10, "report_to": "none", "eval_steps": None}
        if self.query_recipe is not None:  # both models' queries (the config's recipe otherwise)
            values["query_recipe"] = self.query_recipe
        if kind == "matcher":
            values.update(model_name_or_path=str(EMBEDDED / "matcher"), init_from_dino=None, learning_rate=2.5e-4)
        elif self.descriptor_init == "embedded":
            values.update(model_name_or_path=str(EMBEDDED / "descriptor"))
        else:  # a fresh model of the size asked: bench_descriptor.yaml's architecture, losses and learning rate
            bench = _bench_descriptor()
            values.update(model_name_or_path=None, learning_rate=bench.learning_rate,
                          model={**bench.model, **DESCRIPTOR_SIZES[self.descriptor_size]})
        return values

    def config(self, kind: str, overrides: dict):
        """The :class:`TrainingConfig` of a ``kind`` run on this plan's pairs, with ``overrides``."""
        from copynce_hf.training import load_config

        return load_config(PAIR_CONFIGS[self.pairs][kind], overrides)

    def check(self) -> None:
        """A clear error for settings that contradict each other (before anything runs)."""
        if self.descriptor_size != "embedded" and self.descriptor_init == "embedded":
            raise SystemExit(f"--descriptor-size {self.descriptor_size} is a new architecture: it needs "
                             "--descriptor-init scratch (the embedded weights have the embedded size)")


def _bench_descriptor():
    """``bench_descriptor.yaml``: the embedded descriptor's architecture, losses and training from scratch."""
    from copynce_hf.training import load_config

    return load_config(DESCRIPTOR_CONFIG)


def _train(config) -> dict:
    """One training run in this process; its summary (``training_summary.json``)."""
    from copynce_hf.training.run import finish, set_up, train

    started = time.perf_counter()
    run_state = set_up(config)
    train(run_state)
    return finish(run_state, started)


def _pairs_per_second(summary: dict) -> float:
    """The median training pairs per second of a run's logged windows after its first (the workers' start)."""
    rates = [entry["train/pairs_per_second"] for entry in summary["history"] if "train/pairs_per_second" in entry]
    rates = rates[1:] or rates
    if not rates:
        raise SystemExit("the run logged no pairs per second: give --descriptor-steps and --matcher-steps")
    return statistics.median(rates)


def _steps(seconds: float, pairs_per_second: float, batch_size: int) -> int:
    return max(1, int(seconds * pairs_per_second / batch_size))


def _scored(summary: dict) -> dict[str, dict | None]:
    """``{"eval": ..., "eval_without_ema": ...}`` of a summary (the latter ``None`` without a weight average)."""
    return {"eval": summary.get("eval") or None, "eval_without_ema": summary.get("eval_without_ema")}


def _chosen_descriptor(summary: dict) -> tuple[str, Path, dict]:
    """``(which, folder, scores)``: the EMA or the trained weights, whichever has the better held-out muAP."""
    folder = Path(summary["model_folder"])
    trained = summary.get("eval_without_ema")
    if trained and trained["micro_ap"] > (summary.get("eval") or {}).get("micro_ap", float("-inf")):
        return "trained", Path(summary["model_folder_without_ema"]), trained
    return ("ema" if trained else "trained"), folder, summary.get("eval") or {}


def _pack(folder: Path, summary_file: Path, target: Path, trained_of_averaged: bool = False) -> Path:
    """``target`` (.tar.gz): the model folder (no checkpoints, logs or sub-folders) and the run's summary,
    under ``<name>/``. ``trained_of_averaged``: the folder holds the trained weights of a run whose model is
    their moving average; they go to ``<name>/without_ema/`` beside the summary, the run's own layout, so that
    ``scripts/export_embedded.py`` given ``<name>/without_ema`` names them as the trained weights on the card."""
    from copynce_hf.training.ema import WITHOUT_EMA_FOLDER

    name = target.name.removesuffix(".tar.gz")
    weights = f"{name}/{WITHOUT_EMA_FOLDER}" if trained_of_averaged else name
    with tarfile.open(target, "w:gz") as archive:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                archive.add(path, arcname=f"{weights}/{path.name}")
        archive.add(summary_file, arcname=f"{name}/training_summary.json")
    return target


def _better(new: dict, current: dict | None) -> bool | None:
    if not new or not current:
        return None
    return new["micro_ap"] > current["micro_ap"]


def run(plan: RunPlan) -> dict:
    """The whole GPU command (module docstring); returns ``report.json``'s content."""
    plan.check()
    started = time.perf_counter()
    if plan.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "true"  # Accelerate reads it: the CPU although a GPU is there
    out = Path(plan.output_dir)
    work = Path(plan.work_dir) if plan.work_dir else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    report = {"kind": "gpu_training", "created": now(), "machine": machine_info(),
              "plan": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(plan).items()}}

    def save(stage: str) -> None:
        report["stage"], report["seconds"] = stage, round(time.perf_counter() - started, 1)
        write_json(out / "report.json", report)  # after every step: what was measured is never lost
        logger.info("%s done at %.0f s", stage, report["seconds"])

    folder, rate = _train_descriptor(plan, work, out, report.setdefault("descriptor", {}), save)
    graph_path = _build_knn_graph(plan, folder, out, report, save)
    _train_matcher(plan, work, out, report.setdefault("matcher", {}), save, graph_path, rate)
    return report


def _train_descriptor(plan: RunPlan, work: Path, out: Path, descriptor: dict, save) -> tuple[Path, float]:
    """The descriptor's part: the current embedded model scored on the held-out images, the steps calibrated to
    ``descriptor_seconds`` (unless given), the run, the better of its weights packed into ``descriptor.tar.gz``;
    ``descriptor`` (the report's entry) is filled as it goes. Returns the chosen folder and the pairs per second."""
    from copynce_hf.training.run import held_out_score

    descriptor_overrides = plan.overrides("descriptor", work / "descriptor")
    current = {key: value for key, value in descriptor_overrides.items() if key != "model"}  # the folder's size
    descriptor["current"] = held_out_score(plan.config("descriptor", {**current,
                                                                   "model_name_or_path": str(EMBEDDED / "descriptor")}))
    save("current descriptor scored")
    steps = plan.descriptor_steps
    if steps is None:
        calibration = _train(plan.config("descriptor", {**plan.overrides("descriptor", work / "calibration"),
                                                    "max_steps": 100_000, "num_eval_images": 0,
                                                    "max_train_seconds": plan.calibration_seconds}))
        descriptor["calibration_pairs_per_second"] = _pairs_per_second(calibration)
        steps = _steps(plan.descriptor_seconds, descriptor["calibration_pairs_per_second"], plan.batch_size)
        shutil.rmtree(work / "calibration", ignore_errors=True)
        save("calibrated")
    summary = _train(plan.config("descriptor", {**descriptor_overrides, "max_steps": steps,
                                            "warmup_steps": max(1, steps // 20), "ema_decay": 0.998,
                                            "max_train_seconds": 1.2 * plan.descriptor_seconds}))
    which, folder, chosen = _chosen_descriptor(summary)
    descriptor.update(planned_steps=steps, steps=summary["steps"], pairs=summary["pairs_per_process"],
                      wall_seconds=summary["wall_seconds"], new=_scored(summary), chosen=which,
                      chosen_score=chosen, better=_better(chosen, descriptor["current"]))
    rate = descriptor["pairs_per_second"] = _pairs_per_second(summary)
    _pack(folder, work / "descriptor" / "training_summary.json", out / "descriptor.tar.gz",
          trained_of_averaged=which == "trained" and descriptor["new"]["eval_without_ema"] is not None)
    save("descriptor trained")
    return folder, rate


def _build_knn_graph(plan: RunPlan, folder: Path, out: Path, report: dict, save) -> Path:
    """The hard-negative k-NN graph of the training images from the new descriptor ``folder``, saved as
    ``knn_graph.safetensors``; returns its path."""
    from copynce_hf.data import load_image_dataset
    from copynce_hf.data.knn_features import image_groups, knn_graph_of_images

    images = load_image_dataset(str(plan.dataset), "train")
    groups = image_groups(images, plan.knn_group_by, plan.dataset) if plan.knn_group_by else None
    graph, kind, skipped = knn_graph_of_images(images, str(folder), plan.knn_k, batch_size=256,
                                               num_workers=plan.workers, device=plan.device, groups=groups)
    graph_path = graph.save(out / "knn_graph.safetensors", model=str(folder), features=kind, k=str(plan.knn_k),
                            **({"group_by": plan.knn_group_by} if groups else {}))
    report["knn_graph"] = {"images": len(images), "skipped": skipped, "k": plan.knn_k,
                           "group_by": plan.knn_group_by, "from": report["descriptor"]["chosen"]}
    save("k-NN graph built")
    return graph_path


def _train_matcher(plan: RunPlan, work: Path, out: Path, matcher: dict, save, graph_path: Path, rate: float) -> None:
    """The matcher's part: the current embedded matcher scored on the held-out images, then continued on the hard
    negatives of ``graph_path`` for ``matcher_steps`` (or ``matcher_seconds`` at the descriptor's ``rate`` pairs
    per second), packed into ``matcher.tar.gz``; ``matcher`` (the report's entry) is filled as it goes."""
    from copynce_hf.training.run import held_out_score

    matcher_overrides = {**plan.overrides("matcher", work / "matcher"), "knn_graph": str(graph_path)}
    matcher["current"] = held_out_score(plan.config("matcher", matcher_overrides))
    save("current matcher scored")
    steps = plan.matcher_steps or _steps(plan.matcher_seconds, rate, plan.batch_size)
    summary = _train(plan.config("matcher", {**matcher_overrides, "max_steps": steps, "warmup_steps": max(1, steps // 20),
                                         "max_train_seconds": 1.2 * plan.matcher_seconds}))
    matcher.update(planned_steps=steps, steps=summary["steps"], pairs=summary["pairs_per_process"],
                   wall_seconds=summary["wall_seconds"], new=_scored(summary),
                   better=_better(summary.get("eval"), matcher["current"]))
    _pack(Path(summary["model_folder"]), work / "matcher" / "training_summary.json", out / "matcher.tar.gz")
    save("done")


# ---------------------------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    ready = commands.add_parser("prepare", help="fill .gpu/ here: the train split, packages, run.sh")
    ready.add_argument("--bundle", type=Path, default=BUNDLE, help="the folder the device call carries")
    ready.add_argument("--images", type=Path, default=SHARED_DATA / "imagenet-sample")
    ready.add_argument("--splits-csv", type=Path, default=SHARED_DATA / "imagenet-sample-splits.csv")
    ready.add_argument("--instances", default=None,
                       help="train on instances made of the photos (benchmarks.training.train --instances: grid2, "
                            "photos,procedural560, ...); the 40 held-out photos stay whole and last")
    ready.add_argument("--instance-seed", type=int, default=0)
    ready.add_argument("--max-side", type=int, default=256,
                       help="longer side of the travelling images (2.3x the 112-pixel model input)")
    ready.add_argument("--quality", type=int, default=80, help="their JPEG quality")
    ready.add_argument("--max-images", type=int, default=None,
                       help="only the first N train images by name (a throughput-only call: SKIP_TRAINING=1)")
    ready.add_argument("--no-throughput", dest="throughput", action="store_false",
                       help="a call that only trains: run.sh skips benchmarks.scale.gpu_throughput, no albumentations wheels")
    ready.add_argument("--no-packages", dest="packages", action="store_false",
                       help="the images and run.sh only (no wheels, AugLy or libmagic)")
    go = commands.add_parser("run", help="train and score on this machine, results under --output-dir")
    defaults = RunPlan(Path("."), Path("."))
    go.add_argument("--dataset", type=Path, required=True, help="the train split (an image folder)")
    go.add_argument("--output-dir", type=Path, required=True)
    go.add_argument("--device", choices=["cuda", "cpu"], default=defaults.device)
    go.add_argument("--batch-size", type=int, default=defaults.batch_size, help="pairs per optimiser step")
    go.add_argument("--workers", type=int, default=defaults.workers, help="data-loader workers")
    go.add_argument("--precision", choices=["bf16", "fp16", "no"], default=defaults.precision)
    go.add_argument("--held-out", type=int, default=defaults.held_out, help="held-out images (the configs' 40)")
    go.add_argument("--pairs", choices=sorted(PAIR_CONFIGS), default=defaults.pairs,
                    help="the training pairs: the paper's, or content over frame (configs/content_over_frame_*.yaml)")
    go.add_argument("--descriptor-init", choices=["embedded", "scratch"], default=defaults.descriptor_init)
    go.add_argument("--descriptor-size", choices=sorted(DESCRIPTOR_SIZES), default=defaults.descriptor_size,
                    help="next: ViT-S width and depth at 112 pixels (with --descriptor-init scratch)")
    go.add_argument("--descriptor-seconds", type=float, default=defaults.descriptor_seconds)
    go.add_argument("--matcher-seconds", type=float, default=defaults.matcher_seconds)
    go.add_argument("--calibration-seconds", type=float, default=defaults.calibration_seconds)
    go.add_argument("--descriptor-steps", type=int, default=None, help="steps without a calibration run")
    go.add_argument("--matcher-steps", type=int, default=None,
                    help="steps (default: --matcher-seconds at the descriptor run's pairs per second)")
    go.add_argument("--knn-k", type=int, default=defaults.knn_k)
    go.add_argument("--knn-group-by", default=None,
                    help="a k-NN graph per group: a dataset column, or an instance folder's manifest field (kind)")
    go.add_argument("--seed", type=int, default=defaults.seed)
    go.add_argument("--query-recipe", choices=QUERY_RECIPES, default=None,
                    help="both models' query recipe (default: the --pairs configs'; e.g. training_everyday)")
    go.add_argument("--work-dir", type=Path, default=None,
                    help="the runs' folders (default: <output-dir>/work; run.sh: /tmp/gpu-work, outside $OUT)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if args.command == "prepare":
        made = prepare(args.bundle, args.images, args.splits_csv, args.max_side, args.quality, args.packages,
                       args.max_images, args.throughput, args.instances, args.instance_seed)
        fits = made["travelling_bytes"] <= TRAVEL_LIMIT
        print(f"{made['images']} photos; .gpu holds {made['bundle_bytes'] / 2**20:.1f} MiB; a device call sends "
              f"{made['travelling_bytes'] / 2**20:.1f} MiB of at most 64" + ("" if fits else ": TOO MUCH"))
        print('device call: run(command="bash .gpu/run.sh", carry=[".gpu"], timeout_s=600)')
        return made
    options = {key: value for key, value in vars(args).items() if key != "command"}
    report = run(RunPlan(**options))
    print(f"descriptor: held-out muAP {report['descriptor']['chosen_score'].get('micro_ap')} "
          f"(current {(report['descriptor']['current'] or {}).get('micro_ap')}); matcher: "
          f"{(report['matcher']['new']['eval'] or {}).get('micro_ap')} (current "
          f"{(report['matcher']['current'] or {}).get('micro_ap')}) -> {Path(args.output_dir) / 'report.json'}")
    return report


if __name__ == "__main__":
    main()
