"""The ``copynce`` command: detect copies in one go, or index, search, re-score, evaluate and visualise step by step.

The whole pipeline (descriptors with local crops ensembling and score normalisation, merged
candidates, matcher verification, evaluation and a match gallery)::

    copynce detect queries/ --references references/ --output found/ [--ground-truth gt.csv]

Score thresholds from known copies of the references (no labels), then decisions::

    copynce calibrate references/ --output calibration.json
    copynce detect queries/ --references references/ --output found/ --calibration calibration.json --precision 0.9

The same steps one at a time::

    copynce index references/ --output refs_index/
    copynce search queries/ --index refs_index/ --k 10 --output candidates.csv
    copynce match candidates.csv --queries queries/ --references references/ --output scored.csv
    copynce evaluate scored.csv --ground-truth ground_truth.csv --output report/
    copynce visualize queries/q1.jpg references/r7.jpg --patch 7,7 --output why/

Output paths are checked before any model is loaded or image read, and results are written to a
temporary file or folder and moved into place at the end, so a failure never leaves a partial or
damaged output. Bad input (a missing or empty folder, a malformed ground-truth or predictions file,
predicted ids that do not match the ground truth, an unusable output path, ...) ends the command with
exit status 2 and a one-line message on stderr, without traceback. Unreadable images (empty, not an
image, truncated, too small, above ``--max-pixels``) are skipped with a warning naming the file and
the reason, and every command ends with a line of counts (read, skipped with reasons, written).
Descriptor extraction and matcher re-scoring (``detect``, ``match``) run distributed when launched with
``accelerate launch -m copynce_hf.cli``; re-scoring is saved in chunks and resumed after a kill.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from . import __version__
from .model_loading import DEFAULT_DESCRIPTOR, DEFAULT_MATCHER, check_model_path, load_model
from .modeling.errors import SKIP_REASONS, ConfigError, CopyNCEError, PredictionsError
from .outputs import StagedFile, StagedFolder, check_output_file, check_output_folder
from .retrieval.apps.calibration import PRECISIONS as CALIBRATED_PRECISIONS
from .retrieval.search.presets import (
    DEFAULT_CANDIDATES,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_INDEX_CHUNK_SIZE,
    DETECT_PRESET_FIELDS,
    DETECT_PRESETS,
)
from .retrieval.search.views import DESCRIPTOR_LCE_MODES, MATCHER_LCE_MODES

logger = logging.getLogger("copynce_hf.cli")


# --------------------------------------------------------------------------- helpers


def count_text(reasons: Iterable[str]) -> str:
    """``["too small", "empty file", "too small"]`` -> ``"3 (1 empty file, 2 too small)"``."""
    counts = Counter(reasons)
    if not counts:
        return "0"
    order = {reason: i for i, reason in enumerate(SKIP_REASONS)}
    parts = [f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda item: order.get(item[0], 99))]
    return f"{sum(counts.values())} ({', '.join(parts)})"


def report_counts(command: str, read: str, skipped: Iterable[str], written: str) -> None:
    """The closing line of a command: ``index: read 12 images, skipped 2 (1 empty file, 1 too small), wrote ...``."""
    print(f"{command}: read {read}, skipped {count_text(skipped)}, {written}")


@contextlib.contextmanager
def metric_warnings_logged(source):
    """Around a metric call: its warnings become one logged line each, its ``ValueError`` a
    :class:`PredictionsError`; both name ``source``."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    except ValueError as error:  # the metric module is standalone and raises built-in types
        raise PredictionsError(f"{source}: {error}") from error
    for message in dict.fromkeys(str(w.message) for w in caught):
        logger.warning("%s: %s", source, message)


def folder_source(folder, args):
    """An :class:`ImageFolderSource` from the command's ``--recursive`` and ``--max-pixels``; warns about
    sub-folders left out without ``--recursive``."""
    from .retrieval import ImageFolderSource

    source = ImageFolderSource(folder, recursive=args.recursive, max_pixels=args.max_pixels)
    if source.ignored_subfolders:
        names = ", ".join(p.name for p in source.ignored_subfolders[:3])
        logger.warning("%s: %d sub-folder(s) not read (%s%s); pass --recursive to include them", folder,
                       len(source.ignored_subfolders), names, ", ..." if len(source.ignored_subfolders) > 3 else "")
    return source


def image_source(args, folder, dataset_option: str):
    """The images of ``folder`` (:func:`folder_source`) or of the dataset named by ``dataset_option`` (with
    ``--split``, ``--image-column``, ``--id-column`` and, where the command has it, ``--streaming``)."""
    from .retrieval import open_dataset_source

    dataset = getattr(args, dataset_option.lstrip("-").replace("-", "_"))
    if (folder is None) == (dataset is None):
        raise ConfigError(f"give either a folder of images or {dataset_option} NAME_OR_PATH"
                          + (", not both" if folder is not None else ""))
    if dataset is None:
        return folder_source(folder, args)
    if args.quiet:
        import datasets

        datasets.disable_progress_bars()
    return open_dataset_source(dataset, args.split, args.image_column, args.id_column,
                               getattr(args, "streaming", False), args.max_pixels)


def _descriptor_model(path, option="--model", runtime="torch"):
    return load_model(path, "descriptor", option, runtime=runtime)


def _parse_patch(text: str) -> tuple[int, int]:
    try:
        row, col = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROW,COL (two integers), got {text!r}") from None
    return row, col


def _parse_rotations(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated degrees such as 90,180,270, got {text!r}") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _whiten_from(args):
    """The image source of ``--whiten-from`` (``None`` without it); ``--whiten-dim`` alone is an error."""
    if args.whiten_from is None and args.whiten_dim is not None:
        raise ConfigError("--whiten-dim needs --whiten-from FOLDER (the sample images the whitening is learned from)")
    return folder_source(args.whiten_from, args) if args.whiten_from is not None else None


def _index_config_overrides(args) -> dict:
    return {
        name: getattr(args, name)
        for name in ("ef_search", "nprobe", "k_factor")
        if getattr(args, name, None) is not None
    }


# --------------------------------------------------------------------------- commands


def cmd_index(args) -> int:
    from .precision import make_accelerator
    from .retrieval import (
        Descriptor,
        IndexConfig,
        ViewPreset,
        extract_in_chunks,
        learn_whitening,
        write_index_from_files,
    )
    from .retrieval.jobs.chunked_extraction import source_identity, work_folder_of
    from .retrieval.jobs.work_folder import digest, model_fingerprint

    check_output_folder(args.output)
    check_model_path(args.model)
    source = image_source(args, args.references, "--dataset")
    sample = _whiten_from(args)
    config = IndexConfig(kind=args.index_type, nlist=args.nlist, pq_m=args.pq_m, **_index_config_overrides(args))
    model, processor = _descriptor_model(args.model, runtime=args.runtime)
    accelerator = make_accelerator()
    preset = ViewPreset(args.descriptor_lce)
    whitening = None
    if sample is not None:
        whitening = learn_whitening(Descriptor("index", model, processor), sample, preset, args.whiten_dim,
                                    progress=not args.quiet, batch_size=args.batch_size,
                                    num_workers=args.num_workers, accelerator=accelerator)
    model_path = str(Path(args.model).resolve()) if args.model and Path(args.model).exists() else args.model
    where = args.dataset or args.references
    info = {"model": model_path or str(DEFAULT_DESCRIPTOR), "views": preset.name,
            "source": args.dataset or str(Path(args.references).resolve()), "runtime": args.runtime}
    if whitening is not None:
        info["whitened_from"] = str(Path(args.whiten_from).resolve())
    # the chunks hold the model's own descriptors: whitening and the index kind may change between runs
    identity = {"model": model_fingerprint(model), "image_processor": digest(processor.to_dict()),
                "source": source_identity(source), "views": preset.name,
                "chunk_size": args.chunk_size, "batch_size": args.batch_size, "max_pixels": args.max_pixels}
    chunks = extract_in_chunks(model, processor, source, work_folder_of(args.output), identity, preset,
                               args.chunk_size, accelerator, progress=not args.quiet,
                               batch_size=args.batch_size, num_workers=args.num_workers)
    if accelerator.is_main_process:
        reasons = chunks.skip_reasons.values()
        if chunks.resumed:
            print(f"resumed after {chunks.resumed} complete chunk(s) in {chunks.folder}")
        if chunks.count == 0:
            chunks.remove()  # nothing to resume
            raise PredictionsError(
                f"none of the {chunks.images} images of {where} could be read: skipped {count_text(reasons)}"
            )
        with StagedFolder(args.output) as staging:
            _, dim = write_index_from_files(chunks.parts, staging, config, info, whitening)
        chunks.remove()
        views = f", {preset.num_reference_views} views each" if preset.name != "none" else ""
        whitened = (f", whitened to {whitening.dim}-d from {whitening.samples} sample views of {args.whiten_from}"
                    if whitening is not None else "")
        print(f"indexed {chunks.images - len(chunks.skip_reasons)} references{views} ({dim}-d{whitened}, "
              f"{config.kind}) into {args.output}")
        report_counts("index", f"{chunks.images} images", reasons, f"wrote {chunks.count} descriptors")
    accelerator.wait_for_everyone()
    return 0


def cmd_search(args) -> int:
    from .precision import make_accelerator
    from .retrieval import (
        DescriptorIndex,
        DescriptorSet,
        ViewPreset,
        export_disc21_hdf5,
        extract_view_descriptors,
        search_references,
        view_preset_of,
        write_predictions,
    )

    if args.score_norm and args.stretch:
        raise ConfigError("use either --score-norm or --stretch, not both")
    check_output_file(args.output)
    for option in ("save_descriptors", "hdf5"):
        if getattr(args, option):
            check_output_file(getattr(args, option), "--" + option.replace("_", "-"))
    check_model_path(args.model)
    source = folder_source(args.queries, args)
    index = DescriptorIndex.load(args.index)
    preset = ViewPreset(args.descriptor_lce)
    with_views = preset.name != "none" or view_preset_of(index).name != "none"
    if with_views and (args.stretch or args.hdf5):
        raise ConfigError("--stretch and --hdf5 need one descriptor per image: not with local crops views "
                          "(--descriptor-lce, or an index built with --descriptor-lce)")
    overrides = _index_config_overrides(args)
    if overrides:
        index.set_search_parameters(**overrides)
    model_path = args.model or index.info.get("model")
    if args.model is None and model_path and Path(model_path).is_absolute() and not Path(model_path).exists():
        raise ConfigError(
            f"the index was built with the model {model_path}, which no longer exists; pass --model PATH"
        )
    model, processor = _descriptor_model(model_path, runtime=args.runtime)
    auxiliary = DescriptorSet.load(args.score_norm or args.stretch) if (args.score_norm or args.stretch) else None
    accelerator = make_accelerator()
    queries = extract_view_descriptors(
        model, processor, source, preset, "query", batch_size=args.batch_size, num_workers=args.num_workers,
        accelerator=accelerator, progress=not args.quiet, description="query descriptors",
    )
    if not accelerator.is_main_process:
        return 0
    reasons = queries.skip_reasons.values()
    if len(queries) == 0:
        raise PredictionsError(
            f"none of the {len(source)} images of {args.queries} could be read: skipped {count_text(reasons)}"
        )
    if queries.dim != index.references.dim:
        raise ConfigError(
            f"the model gives {queries.dim}-d descriptors but the index holds {index.references.dim}-d ones"
        )
    if args.save_descriptors:
        with StagedFile(args.save_descriptors) as temporary:
            queries.save(temporary)
    if args.hdf5:
        compared = [DescriptorSet(s.ids, index.transform(s.descriptors)) for s in (queries, index.references)]
        with StagedFile(args.hdf5) as temporary:
            export_disc21_hdf5(temporary, *compared)  # as the index compares them (whitened when it whitens)
    if with_views and args.score_norm and (Path(args.score_norm) / "index.json").is_file():
        auxiliary = DescriptorIndex.load(args.score_norm)  # an index of auxiliary views
    predictions = search_references(index, queries, args.k, query_views=preset, auxiliary=auxiliary,
                                    stretch=bool(args.stretch), alpha=args.alpha, k_start=args.k_start,
                                    k_end=args.k_end, beta=args.beta, stretch_k=args.stretch_k)
    count = write_predictions(args.output, predictions)
    print(f"wrote {count} predictions for {len(source) - len(queries.skipped)} queries to {args.output}")
    report_counts("search", f"{len(source)} query images", reasons, f"wrote {count} predictions")
    return 0


def cmd_match(args) -> int:
    import shutil

    from .modeling.configuration_copynce import model_kind
    from .precision import make_accelerator
    from .retrieval import (
        LocalCrops,
        read_predictions,
        rescore_predictions,
        top_per_query,
        write_predictions,
    )

    check_output_file(args.output)
    check_model_path(args.matcher, "--matcher")
    candidates = read_predictions(args.predictions)
    if not candidates:
        raise PredictionsError(f"predictions file {args.predictions} holds no pair")
    read = len(candidates)
    if args.top is not None:
        candidates = top_per_query(candidates, args.top)
    queries = folder_source(args.queries, args).lookup()
    references = folder_source(args.references, args).lookup()
    missing = sorted({f"{args.queries}/{p.query_id}.*" for p in candidates if p.query_id not in queries}
                     | {f"{args.references}/{p.reference_id}.*" for p in candidates if p.reference_id not in references})
    if missing:
        logger.warning("%d image file(s) named by %s do not exist: %s%s", len(missing), args.predictions,
                       ", ".join(missing[:5]), ", ..." if len(missing) > 5 else "")
    model, processor = load_model(args.matcher, None, "--matcher", default=DEFAULT_MATCHER, runtime=args.runtime)
    if model_kind(model) == "descriptor":
        logger.warning("--matcher %s is a descriptor model: pairs are scored by descriptor cosine", args.matcher)
    crops = (
        LocalCrops(args.query_grid, args.reference_grid, args.crop_scale, args.rotations) if args.local_crops else None
    )
    accelerator = make_accelerator()
    work = Path(args.output).with_name(f".{Path(args.output).name}.rescoring")  # scored chunks, until the end
    try:
        result = rescore_predictions(
            candidates, model, processor, queries, references, batch_size=args.batch_size,
            num_workers=args.num_workers, local_crops=crops, progress=not args.quiet, matcher_lce=args.matcher_lce,
            max_pixels=args.max_pixels, accelerator=accelerator, work_folder=work, chunk_size=args.chunk_size,
            log=lambda line: _say("match", line, args.quiet),
        )
    except PredictionsError as error:
        if missing:
            raise PredictionsError(f"{error}; missing files: {', '.join(missing[:5])}") from error
        raise
    if not accelerator.is_main_process:
        return 0
    count = write_predictions(args.output, result.predictions)
    shutil.rmtree(work, ignore_errors=True)
    print(f"re-scored {count} pairs into {args.output}")
    reasons = [reason.split(":")[0] for *_, reason in result.skipped]
    top = f" (re-scoring the top {args.top} per query: {len(candidates)})" if args.top is not None else ""
    report_counts("match", f"{read} candidate pairs{top}", reasons, f"wrote {count} pairs")
    return 0


METRIC_NAMES = ("micro_ap", "recall_at_p90", "threshold_at_p90", "recall_at_rank1", "recall_at_rank10", "mean_ap")


def cmd_evaluate(args) -> int:
    from .metrics.copy_detection.formulas import (
        copy_detection_metrics,
        precision_recall_curve,
        read_ground_truth_csv,
    )
    from .metrics.plots import save_pr_curves
    from .retrieval import read_predictions

    check_output_folder(args.output)
    try:
        ground_truth = read_ground_truth_csv(args.ground_truth)
    except (OSError, ValueError) as error:  # the metric module is standalone and raises built-in types
        raise PredictionsError(str(error)) from error
    systems = {}  # name -> (predictions file, its predictions)
    for path in args.predictions:
        name = Path(path).stem if Path(path).stem not in systems else str(path)
        systems[name] = (path, read_predictions(path))
    results, curves = {}, {}
    for name, (path, predictions) in systems.items():
        columns = ([p.query_id for p in predictions], [p.reference_id for p in predictions],
                   [p.score for p in predictions])
        with metric_warnings_logged(path):  # a warning names the file whose predictions raised it
            results[name] = copy_detection_metrics(*columns, ground_truth)
            curves[name] = precision_recall_curve(*columns, ground_truth)
    output = Path(args.output)
    with StagedFolder(output) as staging:
        (staging / "metrics.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        save_pr_curves(curves, staging / "pr_curve.png", title=f"Precision-recall vs {Path(args.ground_truth).name}")
    rows = (*METRIC_NAMES, "num_predictions", "num_ground_truth_pairs")
    first = max(len(metric) for metric in rows) + 2
    width = max(10, *(len(name) for name in results))
    print("metric".ljust(first) + "".join(name.rjust(width + 2) for name in results))
    for metric in rows:
        cells = []
        for values in results.values():
            value = values[metric]
            cells.append(("-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)).rjust(width + 2))
        print(metric.ljust(first) + "".join(cells))
    print(f"wrote {output / 'metrics.json'} and {output / 'pr_curve.png'}")
    report_counts("evaluate", f"{sum(len(p) for _, p in systems.values())} predictions in {len(systems)} file(s)", [],
                  "wrote 2 files")
    return 0


def _say(command: str, line: str, quiet: bool) -> None:
    """A progress line of ``command`` on stderr, unless ``--quiet``."""
    if not quiet:
        print(f"copynce {command}: {line}", file=sys.stderr)


def _model_names(paths: list[str | None]) -> list[str]:
    """Short distinct names for descriptor models (index sub-folders, log lines)."""
    names = []
    for path in paths:
        base = "embedded-descriptor" if path is None else Path(str(path).rstrip("/")).name or str(path)
        base = "".join(c if c.isalnum() or c in "-_." else "-" for c in base)
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def _check_pipeline_paths(args) -> None:
    for path in args.models or []:
        check_model_path(path, "--models")
    if args.matcher != "none":
        check_model_path(args.matcher, "--matcher")


def _detect_config(args):
    """``(DetectConfig, the preset fields given explicitly)`` of a ``detect``/``calibrate`` command line."""
    from .retrieval import DetectConfig

    explicit = {name: getattr(args, name) for name in DETECT_PRESET_FIELDS if getattr(args, name) is not None}
    config = DetectConfig.from_preset(args.preset, batch_size=args.batch_size, num_workers=args.num_workers,
                                      chunk_size=getattr(args, "chunk_size", DEFAULT_CHUNK_SIZE),
                                      whiten_dim=getattr(args, "whiten_dim", None), **explicit)
    return config, explicit


def _pipeline_identity(args, config) -> dict:
    from .retrieval.apps.calibration import model_identity, pipeline_identity

    return pipeline_identity([model_identity(path, "descriptor") for path in args.models or [None]],
                             None if args.matcher == "none" else model_identity(args.matcher, "matcher"),
                             args.preset, config, score_normalisation=bool(args.aux))


def _model_label(path, default, runtime: str) -> str:
    """How reports (and the index caches' identity) name a model: its folder or Hub id, else the embedded
    ``default``, with ``(ONNX Runtime)`` when ``--runtime onnx`` runs it."""
    return str(path or default) + (" (ONNX Runtime)" if runtime == "onnx" else "")


def _descriptors(paths: list, option: str, runtime: str) -> list:
    """The :class:`~copynce_hf.retrieval.Descriptor` of each descriptor model path (``None``: the embedded one)."""
    from .retrieval import Descriptor

    return [Descriptor(name, *_descriptor_model(path, option, runtime),
                       source=_model_label(path, DEFAULT_DESCRIPTOR, runtime))  # part of the index caches' identity
            for name, path in zip(_model_names(paths), paths)]


def _matcher_model(args):
    """``(model, image processor)`` of ``--matcher`` run by ``--runtime``; ``None`` for ``--matcher none``."""
    return None if args.matcher == "none" else load_model(args.matcher, "matcher", "--matcher", runtime=args.runtime)


def _matcher_label(args) -> str:
    """How progress lines and reports name ``--matcher``: ``none``, else :func:`_model_label`'s name."""
    return "none" if args.matcher == "none" else _model_label(args.matcher, DEFAULT_MATCHER, args.runtime)


def _pipeline_models(args):
    """``(descriptors, matcher or None)`` of a ``detect``/``calibrate`` command line."""
    return _descriptors(args.models or [None], "--models", args.runtime), _matcher_model(args)


def _calibration_point(args, config):
    """The calibrated operating point ``detect --calibration`` decides with (``None`` without the option);
    checked before any model loads."""
    from .retrieval.apps.calibration import Calibration

    if args.calibration is None:
        if args.precision is not None:
            raise ConfigError("--precision needs --calibration FILE (written by `copynce calibrate`)")
        return None
    calibration = Calibration.load(args.calibration)
    calibration.check_pipeline(_pipeline_identity(args, config))
    stage = calibration.stage_for(None if args.matcher == "none" else args.matcher)
    return stage, calibration.point(0.9 if args.precision is None else args.precision, stage)


def cmd_detect(args) -> int:
    import time

    from .metrics.copy_detection.formulas import read_ground_truth_csv
    from .precision import make_accelerator
    from .retrieval import detect, write_predictions
    from .retrieval.apps.calibration import decision_report
    from .retrieval.reports.gallery import write_gallery

    start = time.perf_counter()
    # every input and the output folder are checked before any model runs
    check_output_folder(args.output)
    _check_pipeline_paths(args)
    queries = image_source(args, args.queries, "--query-dataset")
    references = folder_source(args.references, args)
    auxiliary = folder_source(args.aux, args) if args.aux else None
    ground_truth = None
    if args.ground_truth:
        try:
            ground_truth = read_ground_truth_csv(args.ground_truth)
        except (OSError, ValueError) as error:  # the metric module is standalone and raises built-in types
            raise PredictionsError(str(error)) from error
    config, explicit = _detect_config(args)
    whiten_from = _whiten_from(args)
    if whiten_from is not None and args.calibration is not None and args.matcher == "none":
        raise ConfigError("a calibration holds descriptor thresholds without whitening; with --whiten-from and "
                          "--matcher none give no --calibration")
    calibration = _calibration_point(args, config)
    descriptors, matcher = _pipeline_models(args)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    accelerator = make_accelerator()

    def say(line: str) -> None:
        _say("detect", line, args.quiet or not accelerator.is_main_process)

    say(f"{len(queries)} queries, {len(references)} references, descriptors: {', '.join(d.name for d in descriptors)}, "
        f"matcher: {_matcher_label(args)}")
    say(f"preset {args.preset}" + (f" with {', '.join(sorted(explicit))} given" if explicit else "")
        + f": descriptor LCE {config.descriptor_lce}, {config.candidates} candidates, matcher LCE "
        f"{config.matcher_lce}, top {config.k}, score normalisation "
        + (f"over auxiliary ranks {config.k_start}-{config.k_end}" if auxiliary is not None
           else "off (no --aux folder given)"))
    result = detect(queries, references, descriptors, matcher, auxiliary, config, index_folder=output / "indexes",
                    progress=not args.quiet, log=say, rescoring_folder=output / "rescoring", accelerator=accelerator,
                    whiten_from=whiten_from)
    if not accelerator.is_main_process:
        return 0
    decided = None if calibration is None else calibration[1].threshold
    count = write_predictions(output / "predictions.csv", result.predictions, decision_threshold=decided)
    copies = [p for p in result.predictions if decided is not None and p.score >= decided]
    if calibration is not None:
        write_predictions(output / "copies.csv", copies)
    metrics = None
    if ground_truth is not None:
        with metric_warnings_logged(args.ground_truth):
            metrics = result.metrics(ground_truth)
        if calibration is not None:
            metrics["decision"] = decision_report(result.predictions, ground_truth, *calibration,
                                                  metrics["num_ground_truth_pairs"])
        with StagedFile(output / "metrics.json") as temporary:
            temporary.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    heatmap_model = matcher or (descriptors[0].model, descriptors[0].processor)
    settings = {
        "queries": args.query_dataset or str(Path(args.queries).resolve()), "references": str(Path(args.references).resolve()),
        "descriptors": ", ".join(d.source for d in descriptors),
        "matcher": _matcher_label(args),
        "preset": args.preset + (f" ({', '.join(sorted(explicit))} given)" if explicit else ""),
        "descriptor LCE": config.descriptor_lce, "matcher LCE": config.matcher_lce,
        "score normalisation": (f"alpha {config.alpha}, auxiliary ranks {config.k_start}-{config.k_end} of {args.aux}"
                                if args.aux else "off"),
        "candidates per query": config.candidates, "predictions per query": config.k,
        "whitening": (f"learned from {args.whiten_from}" + (f", {args.whiten_dim} dimensions" if args.whiten_dim else "")
                      if args.whiten_from else "off"),
    }
    if calibration is not None:
        stage, point = calibration
        settings["decision threshold"] = (f"{point.threshold:.4f} ({stage} score at precision {point.precision:g} "
                                          f"in {args.calibration}, expected recall {point.recall:.3f}): "
                                          f"{len(copies)} copies")
    lookup_q, lookup_r = queries.lookup(), references.lookup()
    threshold = decided if decided is not None else 0.5 if matcher is not None else float(
        sorted(p.score for p in result.predictions)[len(result.predictions) // 2])
    report = write_gallery(output / "report.html", result.predictions, lookup_q, lookup_r, *heatmap_model,
                           threshold=threshold, count=args.gallery, settings=settings, stages=result.seconds,
                           metrics=metrics, ground_truth=ground_truth)
    print(f"wrote {count} predictions for {len({p.query_id for p in result.predictions})} queries to {output / 'predictions.csv'}, the match gallery to {report}"
          + (f" and {output / 'metrics.json'}" if metrics else "") + f" ({time.perf_counter() - start:.0f} s)")
    if calibration is not None:
        print(f"{len(copies)} pairs at or above the threshold {decided:.4f} (precision {calibration[1].precision:g} "
              f"by {args.calibration}) written to {output / 'copies.csv'}")
    if metrics:
        recall = metrics["candidate_recall"]
        print(f"muAP {metrics['micro_ap']:.4f}  RP90 {metrics['recall_at_p90']:.4f}  recall@1 "
              f"{metrics['recall_at_rank1']:.4f}  candidate recall "
              + ("-" if recall is None else f"{recall:.4f}"))
    unscored = len(result.skipped) - len(result.skipped_queries)
    report_counts("detect", f"{len(queries)} query and {len(references)} reference images",
                  [*result.skipped_queries.values(), *result.skipped_references.values()],
                  f"wrote {count} predictions" + (f" ({unscored} candidate pairs unscored)" if unscored else ""))
    return 0


def cmd_calibrate(args) -> int:
    from .evaluation.self_calibration import calibrate, format_calibration

    check_output_file(args.output)
    _check_pipeline_paths(args)
    references = folder_source(args.references, args)
    distractors = folder_source(args.distractors, args) if args.distractors else None
    auxiliary = folder_source(args.aux, args) if args.aux else None
    config, _ = _detect_config(args)
    pipeline = _pipeline_identity(args, config)
    descriptors, matcher = _pipeline_models(args)

    def say(line: str) -> None:
        _say("calibrate", line, args.quiet)

    calibration = calibrate(references, descriptors, matcher, pipeline, config, auxiliary, distractors,
                            sample=args.sample, num_distractors=args.num_distractors, seed=args.seed,
                            progress=not args.quiet, log=say)
    calibration.provenance["runtime"] = args.runtime
    calibration.save(args.output)
    print(format_calibration(calibration))
    counts = calibration.provenance["counts"]
    print(f"wrote {args.output} ({counts['copies']} copies, {counts['distractors']} distractors, seed {args.seed}); "
          f"use it with: copynce detect ... --calibration {args.output} --precision 0.9")
    report_counts("calibrate", f"{len(references)} reference images",
                  ["unreadable"] * (counts["unreadable_originals"] + counts["skipped_queries"]),
                  "wrote 1 file")
    return 0


def cmd_export_onnx(args) -> int:
    from .onnx_export import ONNX_OPSET, export_onnx, read_manifest

    check_output_folder(args.output)
    check_model_path(args.model, "MODEL")
    model, processor = load_model(args.model, args.kind, "MODEL")
    local = Path(str(model.name_or_path))
    source = str(local.resolve()) if local.exists() else str(model.name_or_path)
    folder = export_onnx(model, processor, args.output, source)
    graphs = read_manifest(folder)["graphs"]
    print(f"wrote {', '.join(graphs.values())} (opset {ONNX_OPSET}, dynamic batch axis) to {folder}; "
          "run them with --runtime onnx and this folder as the model")
    return 0


def _dedup_threshold(args, config) -> tuple[float, str]:
    """``(threshold, where it comes from)`` of ``copynce dedup``: ``--threshold``, a calibration file's at
    ``--precision``, or 0.5 with a matcher."""
    from .retrieval.apps.calibration import Calibration, model_identity
    from .retrieval.apps.dedup import calibrated_threshold

    if args.calibration is not None:
        if args.threshold is not None:
            raise ConfigError("give --threshold or --calibration, not both")
        matcher = None if args.matcher == "none" else model_identity(args.matcher, "matcher")
        precision = 0.9 if args.precision is None else args.precision
        return calibrated_threshold(Calibration.load(args.calibration), precision,
                                    model_identity(args.model, "descriptor"), matcher, config,
                                    whitened=args.whiten_from is not None)
    if args.precision is not None:
        raise ConfigError("--precision needs --calibration FILE (written by `copynce calibrate`)")
    if args.threshold is not None:
        return args.threshold, f"{args.threshold:.4g} (given)"
    if args.matcher == "none":
        raise ConfigError("--matcher none decides by descriptor cosine, which has no default threshold: "
                          "pass --threshold T or --calibration FILE")
    return 0.5, "0.5 (the matcher's default)"


def cmd_dedup(args) -> int:
    import time

    from .precision import make_accelerator
    from .retrieval import DetectConfig, dedup, write_groups, write_predictions
    from .retrieval.reports.gallery import write_group_gallery

    start = time.perf_counter()
    check_output_folder(args.output)
    check_model_path(args.model)
    if args.matcher != "none":
        check_model_path(args.matcher, "--matcher")
    source = folder_source(args.images, args)
    whiten_from = _whiten_from(args)
    config = DetectConfig(candidates=args.candidates, descriptor_lce=args.descriptor_lce, matcher_lce=args.matcher_lce,
                          batch_size=args.batch_size, num_workers=args.num_workers, whiten_dim=args.whiten_dim,
                          chunk_size=args.chunk_size)
    threshold, origin = _dedup_threshold(args, config)
    [descriptor] = _descriptors([args.model], "--model", args.runtime)
    matcher = _matcher_model(args)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)

    accelerator = make_accelerator()

    def say(line: str) -> None:
        _say("dedup", line, args.quiet or not accelerator.is_main_process)

    say(f"{len(source)} images, descriptor: {descriptor.name}, matcher: {_matcher_label(args)}, threshold {origin}")
    result = dedup(source, descriptor, matcher, threshold, config, index_folder=output / "indexes",
                   progress=not args.quiet, log=say, whiten_from=whiten_from, rescoring_folder=output / "rescoring",
                   accelerator=accelerator)
    if not accelerator.is_main_process:
        return 0
    rows = write_groups(output / "groups.csv", result.groups)
    write_predictions(output / "pairs.csv", result.pairs)
    settings = {"images": str(Path(args.images).resolve()), "descriptor": descriptor.source,
                "matcher": _matcher_label(args), "threshold": origin, "candidates per image": args.candidates,
                "descriptor LCE": args.descriptor_lce, "matcher LCE": args.matcher_lce,
                "whitening": f"learned from {args.whiten_from}" if args.whiten_from else "off",
                "groups": len(result.groups), "images in groups": rows}
    heatmap_model = matcher or (descriptor.model, descriptor.processor)
    report = write_group_gallery(output / "report.html", result.groups, source.lookup(), *heatmap_model,
                                 count=args.gallery, settings=settings, stages=result.seconds)
    print(f"wrote {len(result.groups)} groups of copies ({rows} images) to {output / 'groups.csv'}, "
          f"{len(result.pairs)} verified pairs to {output / 'pairs.csv'} and the group gallery to {report} "
          f"({time.perf_counter() - start:.0f} s)")
    report_counts("dedup", f"{len(source)} images", result.skipped.values(), f"wrote {rows} group rows")
    return 0


def cmd_visualize(args) -> int:
    from .images import load_image
    from .retrieval import affinity_maps, save_affinity_figures

    check_output_folder(args.output)
    check_model_path(args.model)
    query, reference = (load_image(path, max_pixels=args.max_pixels) for path in (args.query, args.reference))
    model, processor = load_model(args.model, None, "--model", default=DEFAULT_DESCRIPTOR)
    maps = affinity_maps(model, processor, query, reference, args.patch, temperature=args.temperature)
    with StagedFolder(args.output) as staging:
        written = save_affinity_figures(
            maps, staging, title=f"{Path(args.query).name} vs {Path(args.reference).name}"
        )
    paths = {key: Path(args.output) / path.name for key, path in written.items()}
    print(f"wrote {paths['token_affinity']} and {paths['affinity_entropy']}")
    report_counts("visualize", "2 images", [], f"wrote {len(paths)} files")
    return 0


# --------------------------------------------------------------------------- parser


def _pixels(text: str) -> int:
    """``--max-pixels``: a number of pixels, ``300000000``, ``300_000_000`` or ``300M``."""
    cleaned = text.strip().replace("_", "")
    scale = 1_000_000 if cleaned[-1:] in ("M", "m") else 1
    try:
        value = int(float(cleaned[:-1]) * scale) if scale > 1 else int(cleaned)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of pixels such as 400000000 or 400M, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 pixel, got {text!r}")
    return value


def _add_image_input(parser: argparse.ArgumentParser, folders: bool = True) -> None:
    """``--max-pixels`` for every command that reads images; ``--recursive`` for those reading folders."""
    from .images import MAX_IMAGE_PIXELS, megapixels

    group = parser.add_argument_group("image input")
    group.add_argument(
        "--max-pixels", type=_pixels, default=None, metavar="N",
        help=f"largest accepted image, width x height in pixels (default {MAX_IMAGE_PIXELS}, "
        f"{megapixels(MAX_IMAGE_PIXELS)}; 400M = 400 megapixels); larger images are skipped with a warning",
    )
    if folders:
        group.add_argument(
            "--recursive", action="store_true",
            help="also read the images of sub-folders (ids keep the relative path: cats/tom.jpg -> cats/tom)",
        )


def _add_dataset_input(parser: argparse.ArgumentParser, option: str, images: str, streaming: bool = False) -> None:
    """``OPTION NAME_OR_PATH`` (images from a dataset instead of a folder), ``--split``, ``--image-column``,
    ``--id-column`` and, with ``streaming``, ``--streaming``."""
    group = parser.add_argument_group(f"{images} from a dataset (instead of a folder)")
    group.add_argument(option, metavar="NAME_OR_PATH",
                       help="a Hub dataset id, a Parquet file, a save_to_disk folder or a folder of images")
    group.add_argument("--split", default="train", help="its split (default train)")
    group.add_argument("--image-column", help="its image column (default: the first Image column, or 'image')")
    group.add_argument("--id-column", help="its id column (default: 'image_id', 'id', ... if present, else the "
                       "row number)")
    if streaming:
        group.add_argument("--streaming", action="store_true",
                           help="read it as a stream (a Hub dataset is not downloaded ahead; memory holds one chunk)")


def _add_quiet(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="no progress bars")


def _add_model_loading(parser: argparse.ArgumentParser, batch_size: int = 64, unit: str = "images") -> None:
    parser.add_argument(
        "--batch-size", type=_positive_int, default=batch_size, help=f"{unit} per forward pass (default {batch_size})"
    )
    parser.add_argument(
        "--num-workers", type=int, default=0, help="DataLoader worker processes reading images (default 0)"
    )


def _add_chunk_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunk-size", type=_positive_int, default=DEFAULT_CHUNK_SIZE, metavar="N",
                        help="candidate pairs per chunk of re-scoring work (whole queries), the unit shared by the "
                        "processes of `accelerate launch` and saved as it completes, so that the same command resumes "
                        f"a run cut short (default {DEFAULT_CHUNK_SIZE})")


def _add_runtime(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime", choices=("torch", "onnx"), default="torch",
        help="what runs the models: torch (default) or onnx (ONNX Runtime; a model option then names a folder of "
        "copynce export-onnx, or a model folder exported once into ~/.cache/copynce_hf/onnx, $COPYNCE_ONNX_CACHE)",
    )


def _add_whitening(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("whitening (SSCD's descriptor post-processing)")
    group.add_argument("--whiten-from", metavar="FOLDER",
                       help="sample images of the collection (not the queries' copies) to learn centering + PCA "
                       "whitening from; references and queries are whitened, then L2-normalised (stored with the index)")
    group.add_argument("--whiten-dim", type=_positive_int, metavar="D",
                       help="whitened directions kept (default: all); needs more than D sample images (views)")


def _add_search_knobs(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("approximate search knobs")
    group.add_argument("--ef-search", type=_positive_int, help="HNSW: beam width at search time (default 128; a search for k "
                       "neighbours uses at least k)")
    group.add_argument("--nprobe", type=_positive_int, help="IVF-PQ: inverted lists visited per query (default 32)")
    group.add_argument(
        "--k-factor", type=_positive_int, help="IVF-PQ: candidates re-ranked exactly per neighbour (default 8)"
    )


def _add_matcher(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matcher", default=None,
                   help=f"matcher model folder or Hub id, or 'none' for descriptors only (default: {DEFAULT_MATCHER})")


def _defaults_text(default, presets: str) -> str:
    """The end of a pipeline option's help: the command's own default, else the presets' values (``--preset``)."""
    return f"(default {default})" if default is not None else f"({presets})"


def _add_matcher_lce(p, default: str | None = None) -> None:
    """``--matcher-lce`` (detect, calibrate: ``default`` ``None``, the preset's; dedup, match: their own)."""
    p.add_argument("--matcher-lce", choices=MATCHER_LCE_MODES, default=default,
                   help="the matcher's local crops ensembling: view pairs scored per candidate, none (1), paper "
                   "(35) or all (260), the best one counting " + _defaults_text(default, "fast: none, paper: paper"))


def _add_verification(p: argparse.ArgumentParser, candidates: int | None = None, descriptor_lce: str | None = None,
                      matcher_lce: str | None = None) -> None:
    """``--descriptor-lce``, ``--matcher-lce`` and ``--candidates``: which pairs the matcher verifies, and with which
    views. Without defaults the ``--preset`` chosen fills them (detect, calibrate); dedup gives its own."""
    p.add_argument("--descriptor-lce", choices=DESCRIPTOR_LCE_MODES, default=descriptor_lce,
                   help="descriptor views: none (whole images), matcher-views (26 query x 10 reference views, a pair "
                   "scores its best view pair) or authors (45 query views in 4 groups x 9 reference views, each query "
                   "view keeps its top 100/10/10/4 references by group: up to 390 per query), then the best "
                   "--candidates " + _defaults_text(descriptor_lce, "fast: none, paper: authors"))
    _add_matcher_lce(p, matcher_lce)
    p.add_argument("--candidates", type=_positive_int, default=candidates,
                   help="candidates of each query image verified by the matcher: its nearest references, merged over "
                   "the descriptors (dedup: the nearest other images of each image) "
                   + _defaults_text(candidates, f"fast: {DEFAULT_CANDIDATES}, about 1.3 s per query on one CPU core "
                                    "with --matcher-lce none; paper: 400, as the authors on GPUs"))


def _add_calibration(p: argparse.ArgumentParser) -> None:
    """``--calibration`` and ``--precision``: copies decided at a threshold of ``copynce calibrate`` (detect, dedup)."""
    p.add_argument("--calibration", metavar="FILE",
                   help="calibration.json written by `copynce calibrate` with this run's models and settings: pairs "
                   "scored at or above its threshold at --precision are copies (detect: the column copy of "
                   "predictions.csv and OUTPUT/copies.csv; dedup: the pairs joined into groups)")
    p.add_argument("--precision", type=float, metavar="P",
                   help="the calibrated precision to decide at (default 0.9; the file holds "
                   f"{', '.join(f'{precision:g}' for precision in CALIBRATED_PRECISIONS)})")


def _add_pipeline_options(p: argparse.ArgumentParser) -> None:
    """The models and settings of the detection pipeline (``detect``, ``calibrate``)."""
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help=f"descriptor model folder(s) or Hub id(s); several are merged (default: {DEFAULT_DESCRIPTOR})")
    _add_matcher(p)
    p.add_argument("--preset", choices=tuple(DETECT_PRESETS), default="fast",
                   help="whole settings: fast (CPU-sized, default), accurate (local crops on a CPU budget) or paper "
                   "(the authors' inference, for GPUs); "
                   "see below")
    p.add_argument("--aux", metavar="FOLDER",
                   help="images without copies of the queries (e.g. training images) for score normalisation")
    p.add_argument("--alpha", type=float, help="score normalisation weight (presets: 1)")
    p.add_argument("--k-start", type=_non_negative_int,
                   help="first auxiliary rank of score normalisation, from 0 (fast: 0, paper: 1)")
    p.add_argument("--k-end", type=_non_negative_int,
                   help="last auxiliary rank of score normalisation, inclusive (fast: 9, paper: 4)")
    _add_verification(p)
    p.add_argument("--k", type=_positive_int, help="predictions kept per query (presets: 10)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="copynce",
        description="CopyNCE image copy detection: index reference images, search edited copies of query "
        "images, re-score candidates with the matcher, evaluate (muAP, RP90) and visualise patch affinity.",
        epilog="Example: copynce detect queries/ --references refs/ --output found/; step by step: "
        "copynce index refs/ --output idx/ && copynce search queries/ --index idx/ "
        "--output candidates.csv && copynce match candidates.csv --queries queries/ --references refs/ "
        "--output scored.csv",
    )
    _add_quiet(parser, False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parser = commands.add_parser

    def add_command(*args, **kwargs):
        """A subcommand that also accepts the global options after its name (``copynce index -q ...``)."""
        sub = add_parser(*args, **kwargs)
        _add_quiet(sub, argparse.SUPPRESS)
        return sub

    commands.add_parser = add_command

    p = commands.add_parser(
        "detect", help="the whole pipeline: find which reference each query copies, evaluate, draw a match gallery",
        description="Search the references of every query image with one or more descriptors (optionally with "
        "local crops ensembling and score normalisation), merge their candidates, verify them with the matcher "
        "(optionally with local crops ensembling) and write OUTPUT/predictions.csv (query_id,reference_id,score), "
        "OUTPUT/report.html (a gallery of the top and borderline matches with heatmaps) and, with --ground-truth, "
        "OUTPUT/metrics.json. Reference indexes are kept in OUTPUT/indexes and reused by the next run, the matcher's "
        "scores in OUTPUT/rescoring (chunks of --chunk-size pairs: a run cut short resumes).",
        epilog="Presets (explicit options override them): fast (the default; whole-image descriptors, 50 "
        "candidates, 1 matcher pass per candidate, auxiliary ranks 0-9) suits a CPU: about 1.3 s per query with "
        "the embedded 112-px models on one core. accurate (--descriptor-lce matcher-views --candidates 2 "
        "--matcher-lce paper, auxiliary ranks 0-9): about 3.3 s per query on one core. paper (the authors' inference: --descriptor-lce authors, "
        "--candidates 400, --matcher-lce paper, --k 10, --k-start 1 --k-end 4) suits a GPU: on one CPU core it "
        "costs about 45 descriptor passes + 26 encoder passes + 35 fusion passes per merged candidate per query, "
        "i.e. roughly 6 minutes per query with 400 candidates (the descriptor LCE finds fewer among few "
        "references: about 124 per query on mini-DISC's 300), and 9 descriptor passes per reference (README 'Find copies "
        "of my images'). Cost per "
        "pass on one CPU core (one thread) with the embedded 112-px models: about 30 ms per descriptor view, 20 ms "
        "per matcher encoder view and 25 ms per matcher fusion pair. --matcher-lce none: 1 fusion per candidate; paper: 26 query views encoded once, then 35 "
        "fusions per candidate; all: 260 per candidate.",
    )
    p.add_argument("queries", nargs="?", help="folder of query images (or --query-dataset)")
    p.add_argument("--references", required=True, help="folder of reference images")
    p.add_argument("--output", required=True, help="folder for predictions.csv, report.html, metrics.json, indexes/")
    _add_pipeline_options(p)
    _add_dataset_input(p, "--query-dataset", "query images")
    p.add_argument("--ground-truth", help="CSV query_id,reference_id: also write metrics.json (muAP, RP90, "
                   "recall@1, candidate recall)")
    p.add_argument("--gallery", type=_positive_int, default=8, help="cards per gallery in report.html (default 8)")
    _add_chunk_size(p)
    _add_calibration(p)
    _add_whitening(p)
    _add_model_loading(p)
    _add_runtime(p)
    _add_image_input(p)
    p.set_defaults(handler=cmd_detect)

    p = commands.add_parser(
        "calibrate", help="score thresholds at 90/95/99 %% precision from known copies of your own references",
        description="Edit a sample of REFERENCES with the mini-DISC query recipe (edits the training recipes never "
        "draw) and edit distractor images (--distractors, or references held out of the index), run the detect "
        "pipeline on these copies and write OUTPUT (JSON): per stage (descriptor, matcher), the score threshold "
        "at precision 0.9, 0.95 and 0.99 with the recall expected at each, and what reproduces it (models, "
        "preset, recipe, seed, sample ids, counts). Needs no labels. Use the same models and preset in "
        "`copynce detect --calibration OUTPUT`.",
        epilog="The precision promised holds for queries that hold copies and non-copies in about the ratio "
        "--sample : --num-distractors, with edits like the recipe's: fewer copies among real queries mean a lower "
        "precision at the same threshold.",
    )
    p.add_argument("references", help="folder of reference images")
    p.add_argument("--output", required=True, help="calibration JSON file to write")
    p.add_argument("--sample", type=_positive_int, default=100, help="references copied (default 100)")
    p.add_argument("--distractors", metavar="FOLDER", help="images that are not references and not copies of them; "
                   "default: references held out of the index")
    p.add_argument("--num-distractors", type=_positive_int,
                   help="distractor copies (default: --sample; held-out references: at most half the folder)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample, the distractors and the edits (default 0)")
    _add_pipeline_options(p)
    _add_model_loading(p)
    _add_runtime(p)
    _add_image_input(p)
    p.set_defaults(handler=cmd_calibrate)

    p = commands.add_parser(
        "dedup", help="find every group of copies inside one folder",
        description="Search every image of IMAGES among the others (itself left out) with the descriptor, verify "
        "each candidate pair once with the matcher, and join the pairs scored at or above the threshold into "
        "groups (connected components). Writes OUTPUT/groups.csv (group_id,image_id,score_to_first: the score "
        "of each member with the group's first image), OUTPUT/pairs.csv (every verified pair and its score), "
        "OUTPUT/report.html (a gallery of the largest groups), OUTPUT/indexes and OUTPUT/rescoring (reused by the "
        "next run: a run cut short resumes).",
        epilog="Scores are copy probabilities with the matcher (default threshold 0.5), cosines with --matcher "
        "none (then --threshold or --calibration is required). Cost on one CPU core with the embedded models: about 30 ms per "
        "image for the descriptor, then per verified pair about 25 ms (plus 20 ms per image encoded once).",
    )
    p.add_argument("images", help="folder of images")
    p.add_argument("--output", required=True, help="folder for groups.csv, pairs.csv, report.html, indexes/")
    p.add_argument("--model", help=f"descriptor model folder or Hub id (default: {DEFAULT_DESCRIPTOR})")
    _add_matcher(p)
    p.add_argument("--threshold", type=float,
                   help="pairs scored at or above it are copies (default: from --calibration, else 0.5 with a "
                   "matcher; required without one)")
    _add_calibration(p)
    _add_verification(p, candidates=10, descriptor_lce="none", matcher_lce="none")
    p.add_argument("--gallery", type=_positive_int, default=8, help="groups shown in report.html (default 8)")
    _add_chunk_size(p)
    _add_whitening(p)
    _add_model_loading(p)
    _add_runtime(p)
    _add_image_input(p)
    p.set_defaults(handler=cmd_dedup)

    p = commands.add_parser(
        "index", help="embed a folder of reference images and build a faiss index",
        description="Embed every image of REFERENCES (file name without extension = id) or of --dataset with "
        "the descriptor and write OUTPUT/descriptors.safetensors, OUTPUT/index.faiss and OUTPUT/index.json. "
        "Descriptors are written in chunks to .OUTPUT.chunks/ beside OUTPUT (removed at the end): the same "
        "command after an interruption resumes from the last complete chunk.",
    )
    p.add_argument("references", nargs="?", help="folder of reference images (or --dataset)")
    _add_dataset_input(p, "--dataset", "reference images", streaming=True)
    p.add_argument("--chunk-size", type=_positive_int, default=DEFAULT_INDEX_CHUNK_SIZE, metavar="N",
                   help=f"images per chunk written (default {DEFAULT_INDEX_CHUNK_SIZE}); a resumed run keeps its "
                   "chunk size")
    p.add_argument("--model", help=f"descriptor model folder or Hub id (default: {DEFAULT_DESCRIPTOR})")
    p.add_argument("--output", required=True, help="index folder to write")
    p.add_argument(
        "--index-type", choices=("flat", "hnsw", "ivfpq"), default="flat",
        help="flat: exact inner product (default); hnsw: approximate graph search for millions of references; "
        "ivfpq: compressed inverted lists with exact re-ranking, for memory-limited collections",
    )
    p.add_argument("--nlist", type=_positive_int, help="IVF-PQ: number of inverted lists (default 4*sqrt(N))")
    p.add_argument("--pq-m", type=_positive_int, help="IVF-PQ: sub-quantisers (default D/2)")
    p.add_argument("--descriptor-lce", choices=DESCRIPTOR_LCE_MODES, default="none",
                   help="index views: none (whole images), matcher-views (10 views per reference: whole, five "
                   "one-third crops, four quarters) or authors (9 views: whole, five crops, three rotations) "
                   "(default none)")
    _add_whitening(p)
    _add_search_knobs(p)
    _add_model_loading(p)
    _add_runtime(p)
    _add_image_input(p)
    p.set_defaults(handler=cmd_index)

    p = commands.add_parser(
        "search", help="find the k nearest references of every query image",
        description="Embed the images of QUERIES, search the index and write the k-NN pairs as a DISC21 "
        "predictions CSV (query_id,reference_id,score; score = cosine similarity, or as post-processed).",
    )
    p.add_argument("queries", help="folder of query images")
    p.add_argument("--index", required=True, help="index folder written by `copynce index`")
    p.add_argument("--model", help="descriptor model (default: the one the index was built with)")
    p.add_argument("--k", type=_positive_int, default=10, help="neighbours per query (default 10)")
    p.add_argument("--output", required=True, help="predictions CSV to write")
    p.add_argument("--descriptor-lce", choices=DESCRIPTOR_LCE_MODES, default="none",
                   help="query views: none, matcher-views (26 views; a pair scores its best view pair) or authors "
                   "(45 views in 4 groups, each view keeps its top 100/10/10/4 references by group, then the "
                   "best --k) (default none)")
    post = p.add_argument_group(
        "post-processing (paper supplementary)",
        "Both need descriptors of an auxiliary image set without copies of the queries, e.g. training "
        "images: `copynce index AUX --output AUX_INDEX`, then pass AUX_INDEX.",
    )
    post.add_argument(
        "--score-norm", metavar="AUX_DESCRIPTORS",
        help="score normalisation: subtract alpha * the mean similarity of the query to its auxiliary "
        "neighbours of rank k-start..k-end (a descriptors.safetensors file or an index folder)",
    )
    post.add_argument("--alpha", type=float, default=1.0, help="score normalisation weight (default 1)")
    post.add_argument("--k-start", type=int, default=0, help="first auxiliary rank, from 0 (default 0)")
    post.add_argument("--k-end", type=int, default=9, help="last auxiliary rank, inclusive (default 9)")
    post.add_argument(
        "--stretch", metavar="AUX_DESCRIPTORS",
        help="feature stretching: scale each query by beta * its mean top-k auxiliary similarity and score "
        "pairs by negative squared euclidean distance",
    )
    post.add_argument("--beta", type=float, default=2.5, help="stretching coefficient (default 2.5)")
    post.add_argument("--stretch-k", type=_positive_int, default=5, help="auxiliary neighbours averaged (default 5)")
    out = p.add_argument_group("extra outputs")
    out.add_argument("--save-descriptors", metavar="PATH", help="also write the query descriptors (safetensors)")
    out.add_argument(
        "--hdf5", metavar="PATH",
        help="also write query and reference descriptors in the DISC21 descriptor-track HDF5 layout (needs h5py)",
    )
    _add_search_knobs(p)
    _add_model_loading(p)
    _add_runtime(p)
    _add_image_input(p)
    p.set_defaults(handler=cmd_search)

    p = commands.add_parser(
        "match", help="re-score candidate pairs with the matcher",
        description="Score every pair of a predictions CSV with the matcher (copy probability = sigmoid of "
        "its logit) and write them as a new predictions CSV. Images are found by id (file name without "
        "extension) in the query and reference folders.",
    )
    p.add_argument("predictions", help="candidate pairs (query_id,reference_id,score CSV)")
    p.add_argument("--queries", required=True, help="folder of query images")
    p.add_argument("--references", required=True, help="folder of reference images")
    p.add_argument("--matcher", help=f"matcher model folder or Hub id (default: {DEFAULT_MATCHER})")
    p.add_argument("--output", required=True, help="predictions CSV to write")
    p.add_argument("--top", type=_positive_int, help="only re-score each query's TOP best candidates")
    lce = p.add_argument_group("local crops ensembling (supplementary 'Local Crops Ensembling')")
    _add_matcher_lce(lce, "none")
    lce.add_argument(
        "--local-crops", action="store_true",
        help="compare query views (whole, grid crops, rotations) with reference views (whole, grid crops) "
        "and keep the maximum score",
    )
    lce.add_argument("--query-grid", type=_positive_int, default=2, help="query crops per side (default 2)")
    lce.add_argument("--reference-grid", type=_positive_int, default=1, help="reference crops per side (default 1)")
    lce.add_argument(
        "--crop-scale", type=float, default=1.5, help="a crop spans crop-scale/grid of each side (default 1.5)"
    )
    lce.add_argument(
        "--rotations", type=_parse_rotations, default=(90, 180, 270),
        help="rotations of the whole query, degrees (default 90,180,270; 'none' for no rotation)",
    )
    _add_chunk_size(p)
    _add_model_loading(p, batch_size=32, unit="image pairs (view pairs with --local-crops)")
    _add_runtime(p)
    _add_image_input(p)
    p.set_defaults(handler=cmd_match)

    p = commands.add_parser(
        "evaluate", help="score predictions against a ground truth (muAP, RP90, recall@1/10, mAP)",
        description="Compute the DISC21 metrics of one or more predictions CSVs, print them as a table and "
        "write OUTPUT/metrics.json ({file stem: metrics}) and OUTPUT/pr_curve.png.",
    )
    p.add_argument("predictions", nargs="+", help="predictions CSV file(s) (query_id,reference_id,score)")
    p.add_argument("--ground-truth", required=True, help="ground-truth CSV with the header query_id,reference_id")
    p.add_argument("--output", required=True, help="folder for metrics.json and pr_curve.png")
    p.set_defaults(handler=cmd_evaluate)

    p = commands.add_parser(
        "visualize", help="token affinity and affinity entropy maps of a query-reference pair",
        description="Draw the token affinity heatmap of one query patch over the reference and the affinity "
        "entropy map of all query patches (paper, 'Visualization and Interpretability') as PNG overlays "
        "in OUTPUT (token_affinity.png, affinity_entropy.png, maps.npz).",
    )
    p.add_argument("query", help="query image file")
    p.add_argument("reference", help="reference image file")
    p.add_argument("--model", help=f"descriptor or matcher model (default: {DEFAULT_DESCRIPTOR})")
    p.add_argument(
        "--patch", type=_parse_patch, required=True, help="probe query patch as ROW,COL in the patch grid, from 0"
    )
    p.add_argument("--temperature", type=float, help="softmax temperature tau (default: the model's, 1/16)")
    p.add_argument("--output", required=True, help="folder for the PNG files")
    _add_image_input(p, folders=False)
    p.set_defaults(handler=cmd_visualize)

    p = commands.add_parser(
        "export-onnx", help="export a descriptor or matcher to ONNX graphs for ONNX Runtime (--runtime onnx)",
        description="Write the model's ONNX graphs (opset 18, dynamic batch axis, the image processor's input size) "
        "with its config, image processor and onnx.json into OUTPUT: descriptor.onnx for a descriptor; "
        "matcher_encoder.onnx and matcher_fusion.onnx for a matcher (its two stages, so that encoder tokens are "
        "cached per image). index, search, match, detect, dedup and calibrate run them with --runtime onnx.",
    )
    p.add_argument("model", nargs="?", help=f"model folder or Hub id (default: the embedded descriptor, "
                   f"{DEFAULT_DESCRIPTOR}, or matcher with --kind matcher)")
    p.add_argument("output", help="folder to write")
    p.add_argument("--kind", choices=("descriptor", "matcher"), help="insist on this kind of model (also picks the "
                   "embedded one when MODEL is left out)")
    p.set_defaults(handler=cmd_export_onnx)

    p = commands.add_parser(
        "convert-original", help="convert the authors' released checkpoint into a model folder",
        description="Map every tensor of a checkpoint of the authors' code (GitHub eddielyc/CopyNCE) to this "
        "package's descriptor or matcher and write a folder that AutoModel / AutoImageProcessor load (weights, "
        "config, image processor, Hub custom code, model card, licence). A missing or unexpected tensor is an "
        "error naming it.",
    )
    add_convert_original_arguments(p)
    p.set_defaults(handler=cmd_convert_original)
    return parser


def add_convert_original_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``copynce convert-original`` (also those of scripts/convert_copynce_original.py)."""
    parser.add_argument("--checkpoint", required=True,
                        help="the authors' checkpoint (descriptor_vits_224.pth.tar or matcher_vits_224.pth.tar)")
    parser.add_argument("--model-type", required=True, choices=("descriptor", "matcher"), help="what it holds")
    parser.add_argument("--output", required=True, help="model folder to write")
    parser.add_argument("--push-to-hub", metavar="REPO", help="also upload the folder to this Hub repository")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a checkpoint that holds Python objects besides tensors (only a trusted file)")
    return parser


def cmd_convert_original(args) -> int:
    from .authors_checkpoints import convert_authors_checkpoint

    check_output_folder(args.output)
    folder = convert_authors_checkpoint(args.checkpoint, args.model_type, args.output,
                                        push_to_hub=args.push_to_hub, allow_pickle=args.allow_pickle)
    print(f"wrote {folder}" + (f" and uploaded it to {args.push_to_hub}" if args.push_to_hub else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``copynce`` command; returns the exit status (0 on success, 2 on bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="copynce: %(levelname)s: %(message)s")
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        return args.handler(args)
    except (CopyNCEError, ImportError) as error:
        message = " ".join(str(error).split())
        print(f"copynce {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"copynce {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
