"""The options several ``copynce`` commands share, declared once: their argument groups (image input, datasets,
model loading, runtime, whitening, search knobs, the matcher, LCE, verification, calibration, the pipeline, chunk
size, quiet), the types that parse them, and the library objects built from them (:func:`image_input`,
:func:`pipeline_settings`).

Nothing heavy is imported here: building the parser (``copynce --help``) loads no torch, transformers or faiss.
"""

from __future__ import annotations

import argparse

from ..calibration.thresholds import PRECISIONS as CALIBRATED_PRECISIONS
from ..retrieval.deduplication.grouping import GROUPINGS
from ..retrieval.descriptors.views import DESCRIPTOR_LCE_MODES, MATCHER_LCE_MODES
from ..retrieval.presets import (
    COLLECTION_FIELDS,
    COLLECTION_K_END,
    COLLECTION_K_START,
    DEFAULT_CANDIDATES,
    DEFAULT_CHUNK_SIZE,
    DETECT_PRESET_FIELDS,
    DETECT_PRESETS,
    MATCHER_ORDERS,
    REFERENCE_BACKGROUNDS,
)
from ..runtime.loading import DEFAULT_DESCRIPTOR, DEFAULT_MATCHER

# --------------------------------------------------------------------------- types


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def on_off(text: str) -> bool:
    """``on`` / ``off`` as ``True`` / ``False``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def pixels(text: str) -> int:
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


# --------------------------------------------------------------------------- option groups


def add_quiet(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="no progress bars")


def add_image_input(parser: argparse.ArgumentParser, folders: bool = True) -> None:
    """``--max-pixels`` for every command that reads images; ``--recursive`` for those reading folders."""
    from ..images import MAX_IMAGE_PIXELS, megapixels

    group = parser.add_argument_group("image input")
    group.add_argument(
        "--max-pixels", type=pixels, default=None, metavar="N",
        help=f"largest accepted image, width x height in pixels (default {MAX_IMAGE_PIXELS}, "
        f"{megapixels(MAX_IMAGE_PIXELS)}; 400M = 400 megapixels); larger images are skipped with a warning",
    )
    if folders:
        group.add_argument(
            "--recursive", action="store_true",
            help="also read the images of sub-folders (ids keep the relative path: cats/tom.jpg -> cats/tom)",
        )


def add_dataset_input(parser: argparse.ArgumentParser, option: str, images: str, streaming: bool = False) -> None:
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


def add_model_loading(parser: argparse.ArgumentParser, batch_size: int = 64, unit: str = "images") -> None:
    parser.add_argument(
        "--batch-size", type=positive_int, default=batch_size, help=f"{unit} per forward pass (default {batch_size})"
    )
    parser.add_argument(
        "--num-workers", type=int, default=0, help="DataLoader worker processes reading images (default 0)"
    )


def add_chunk_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunk-size", type=positive_int, default=DEFAULT_CHUNK_SIZE, metavar="N",
                        help="candidate pairs per chunk of re-scoring work (whole queries), the unit shared by the "
                        "processes of `accelerate launch` and saved as it completes, so that the same command resumes "
                        f"a run cut short (default {DEFAULT_CHUNK_SIZE})")


def add_runtime(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime", choices=("torch", "onnx"), default="torch",
        help="what runs the models: torch (default) or onnx (ONNX Runtime; a model option then names a folder of "
        "copynce export-onnx, or a model folder exported once into ~/.cache/copynce_hf/onnx, $COPYNCE_ONNX_CACHE)",
    )


def add_whitening(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("whitening (SSCD's descriptor post-processing)")
    group.add_argument("--whiten-from", metavar="FOLDER",
                       help="sample images of the collection (not the queries' copies) to learn centering + PCA "
                       "whitening from; references and queries are whitened, then L2-normalised (stored with the index)")
    group.add_argument("--whiten-dim", type=positive_int, metavar="D",
                       help="whitened directions kept (default: all); needs more than D sample images (views)")


def add_search_knobs(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("approximate search knobs")
    group.add_argument("--ef-search", type=positive_int, help="HNSW: beam width at search time (default 128; a search "
                       "for k neighbours uses at least k)")
    group.add_argument("--nprobe", type=positive_int, help="IVF-PQ: inverted lists visited per query (default 32)")
    group.add_argument(
        "--k-factor", type=positive_int, help="IVF-PQ: candidates re-ranked exactly per neighbour (default 8)"
    )


def add_matcher(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matcher", default=None,
                   help=f"matcher model folder or Hub id, or 'none' for descriptors only (default: {DEFAULT_MATCHER})")


def defaults_text(default, presets: str) -> str:
    """The end of a pipeline option's help: the command's own default, else the presets' values (``--preset``)."""
    return f"(default {default})" if default is not None else f"({presets})"


def add_matcher_lce(p, default: str | None = None) -> None:
    """``--matcher-lce`` (detect, calibrate: ``default`` ``None``, the preset's; dedup, match: their own)."""
    p.add_argument("--matcher-lce", choices=MATCHER_LCE_MODES, default=default,
                   help="the matcher's local crops ensembling: view pairs scored per candidate, none (1), paper "
                   "(35) or all (260), the best one counting " + defaults_text(default, "fast: none, paper: paper"))


def add_verification(p: argparse.ArgumentParser, candidates: int | None = None, descriptor_lce: str | None = None,
                     matcher_lce: str | None = None) -> None:
    """``--descriptor-lce``, ``--matcher-lce`` and ``--candidates``: which pairs the matcher verifies, and with which
    views. Without defaults the ``--preset`` chosen fills them (detect, calibrate); dedup gives its own."""
    p.add_argument("--descriptor-lce", choices=DESCRIPTOR_LCE_MODES, default=descriptor_lce,
                   help="descriptor views: none (whole images), matcher-views (26 query x 10 reference views, a pair "
                   "scores its best view pair) or authors (45 query views in 4 groups x 9 reference views, each query "
                   "view keeps its top 100/10/10/4 references by group: up to 390 per query), then the best "
                   "--candidates " + defaults_text(descriptor_lce, "fast: none, paper: authors"))
    add_matcher_lce(p, matcher_lce)
    p.add_argument("--candidates", type=positive_int, default=candidates,
                   help="candidates of each query image verified by the matcher: its nearest references, merged over "
                   "the descriptors (dedup: the nearest other images of each image) "
                   + defaults_text(candidates, f"fast: {DEFAULT_CANDIDATES}; paper: 400, as the authors on GPUs"))


def add_collection_normalisation(p: argparse.ArgumentParser, dedup: bool = False) -> None:
    """Collection normalisation (``detect``, ``calibrate``: the references' side; ``dedup``: both sides of a pair,
    and the matcher's scores), and for ``dedup`` the grouping. ``detect``'s options default to ``None`` (the
    :class:`~copynce_hf.retrieval.DetectConfig` defaults, given ones override), ``dedup``'s to their values."""
    group = p.add_argument_group("collection normalisation (discount what many images of the collection share: a "
                                 "screenshot frame, a meme band, a background)")
    default = (lambda value: value) if dedup else (lambda value: None)
    scores = "each pair's descriptor score loses the mean of its two images' backgrounds" if dedup else (
        "every query->reference descriptor score loses its reference's background")
    state = "on (default)" if dedup else ("on (default off: it keeps references sharing a template out of the "
                                          "query's best candidates, where content tokens would recognise the template)")
    group.add_argument("--collection-normalisation", type=on_off, metavar="{on,off}", default=default(True),
                       help=f"{state}: {scores} (an image's background: its mean cosine to its neighbours of "
                       "ranks --collection-k-start..--collection-k-end among the other images) before candidates "
                       "are chosen")
    group.add_argument("--collection-alpha", type=float, default=default(1.0), metavar="A",
                       help="weight of the background (default 1)")
    group.add_argument("--collection-k-start", type=non_negative_int, default=default(COLLECTION_K_START),
                       metavar="N", help=f"first neighbour rank averaged, from 0 (default {COLLECTION_K_START}: "
                       "the best two, a small true group of copies, are left out)")
    group.add_argument("--collection-k-end", type=non_negative_int, default=default(COLLECTION_K_END), metavar="N",
                       help=f"last neighbour rank averaged, inclusive (default {COLLECTION_K_END})")
    if not dedup:
        group.add_argument("--reference-background", choices=REFERENCE_BACKGROUNDS,
                           help="where a reference's neighbours are taken: collection (the other references, "
                           "default) or auxiliary (the --aux images)")
        return
    group.add_argument("--matcher-normalisation", type=on_off, metavar="{on,off}",
                       help="the matcher's decision discounts each image's background, the mean logit of its "
                       "verified pairs of ranks --matcher-k-start..--matcher-k-end, where it is above "
                       "--matcher-anchor (default: as --collection-normalisation)")
    group.add_argument("--matcher-alpha", type=float, default=1.0, metavar="A", help="its weight (default 1)")
    group.add_argument("--matcher-k-start", type=non_negative_int, default=COLLECTION_K_START, metavar="N",
                       help=f"first verified pair rank averaged, from 0 (default {COLLECTION_K_START})")
    group.add_argument("--matcher-k-end", type=non_negative_int, default=COLLECTION_K_END, metavar="N",
                       help=f"last verified pair rank averaged, inclusive (default {COLLECTION_K_END})")
    group.add_argument("--matcher-anchor", type=float, default=0.0, metavar="LOGIT",
                       help="only the part of a background above this logit is discounted (default 0: "
                       "probability 0.5, so that images whose other pairs are non-copies keep their scores)")
    p.add_argument("--matcher-orders", choices=MATCHER_ORDERS, default="auto",
                   help="both: the matcher scores each pair twice, each image the query once, and the mean of the "
                   "two logits decides (neither of two edited copies is the original); one: once, the earlier "
                   "image as the query (half the matcher's fusion passes); auto (default): both for a matcher "
                   "with segment embeddings (its score depends on the order, as the embedded matcher's), one for "
                   "the authors' form (the same score in both orders)")
    p.add_argument("--content-crops", action=argparse.BooleanOptionalAction, default=True,
                   help="with content tokens: each image whose own content (the tokens it does not share with its "
                   "neighbours) covers less than 60%% of it gets a second view, that region cut from its pixels; "
                   "the crops propose candidate pairs, and a pair whose best descriptor match involves a crop is "
                   "verified on those views (default on; --no-content-crops: whole images only)")
    p.add_argument("--grouping", choices=GROUPINGS, default="representative",
                   help="representative (default): a pair joins a group only if it clears the threshold against "
                   "the group's first member, two groups merge only if their first members' pair does; connected: "
                   "connected components (two images join through any chain of pairs)")


def add_content_tokens(p: argparse.ArgumentParser, default_text: str) -> None:
    """``--content-tokens`` / ``--no-content-tokens`` and ``--descriptor-content-tokens`` (detect, calibrate, dedup;
    beyond the paper)."""
    p.add_argument("--content-tokens", action=argparse.BooleanOptionalAction, default=None,
                   help="the matcher ignores the patch tokens an image shares (cosine above 0.8) with 2 of its 10 "
                   "neighbour images (templates, frames, meme bands), so that two different photos in one frame are "
                   "not copies; whole images only (--matcher-lce none), PyTorch runtime only " + default_text)
    p.add_argument("--descriptor-content-tokens", action="store_true", default=None,
                   help="search again with descriptors of each image's content tokens (final-layer tokens shared at "
                   "a cosine above 0.6 with 2 of its 10 nearest images dropped): two more descriptor passes per "
                   "image; whole images only (--descriptor-lce none; default off)")


def add_calibration(p: argparse.ArgumentParser) -> None:
    """``--calibration`` and ``--precision``: copies decided at a threshold of ``copynce calibrate`` (detect, dedup)."""
    p.add_argument("--calibration", metavar="FILE",
                   help="calibration.json written by `copynce calibrate` with this run's models and settings: pairs "
                   "scored at or above its threshold at --precision are copies (detect: the column copy of "
                   "predictions.csv and OUTPUT/copies.csv; dedup: the pairs joined into groups)")
    p.add_argument("--precision", type=float, metavar="P",
                   help="the calibrated precision to decide at: a --calibration file's (it holds "
                   f"{', '.join(f'{precision:g}' for precision in CALIBRATED_PRECISIONS)}), or, for dedup without "
                   "--calibration or --threshold, the target of its self-calibration (default 0.9)")


def add_pipeline_options(p: argparse.ArgumentParser) -> None:
    """The models and settings of the detection pipeline (``detect``, ``calibrate``)."""
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help=f"descriptor model folder(s) or Hub id(s); several are merged (default: {DEFAULT_DESCRIPTOR})")
    add_matcher(p)
    p.add_argument("--preset", choices=tuple(DETECT_PRESETS), default="fast",
                   help="whole settings: fast (CPU-sized, default), accurate (local crops on a CPU budget) or paper "
                   "(the authors' inference, for GPUs); "
                   "see below")
    p.add_argument("--aux", metavar="FOLDER",
                   help="images without copies of the queries (e.g. training images) for score normalisation")
    p.add_argument("--alpha", type=float, help="score normalisation weight (presets: 1)")
    p.add_argument("--k-start", type=non_negative_int,
                   help="first auxiliary rank of score normalisation, from 0 (fast: 0, paper: 1)")
    p.add_argument("--k-end", type=non_negative_int,
                   help="last auxiliary rank of score normalisation, inclusive (fast: 9, paper: 4)")
    add_verification(p)
    add_content_tokens(p, "(fast: on; accurate, paper, --matcher-lce paper or all, --runtime onnx: off)")
    p.add_argument("--query-crops", action=argparse.BooleanOptionalAction, default=None,
                   help="with content tokens and a matcher: each query whose own content (the tokens it does not "
                   "share with its nearest references and queries) covers less than 60%% of it is also searched and "
                   "verified as that part, cut from its pixels (a copy pasted into a screenshot or a meme); whole "
                   "images only (fast: on where content tokens are; accurate, paper: off)")
    p.add_argument("--k", type=positive_int, help="predictions kept per query (presets: 10)")
    add_collection_normalisation(p)


# --------------------------------------------------------------------------- what the options build


def image_input(args):
    """The :class:`~copynce_hf.retrieval.sources.ImageInput` of a command line (its image and dataset
    options; those a command lacks keep their defaults)."""
    from ..retrieval.sources import ImageInput

    return ImageInput(recursive=getattr(args, "recursive", False), max_pixels=args.max_pixels,
                      split=getattr(args, "split", "train"), image_column=getattr(args, "image_column", None),
                      id_column=getattr(args, "id_column", None), streaming=getattr(args, "streaming", False),
                      progress=not args.quiet)


def pipeline_settings(args):
    """The :class:`~copynce_hf.runs.settings.PipelineSettings` of a ``detect`` or ``calibrate``
    command line: its models, preset, the preset fields given explicitly, ``--aux`` and the sizes."""
    from ..runs.settings import PipelineModels, PipelineSettings

    models = PipelineModels(args.models or [None], args.matcher, args.runtime)
    overrides = {name: getattr(args, name) for name in (*DETECT_PRESET_FIELDS, *COLLECTION_FIELDS)
                 if getattr(args, name) is not None}
    if getattr(args, "descriptor_content_tokens", None):
        overrides["descriptor_content_tokens"] = True
    return PipelineSettings(models, args.preset, overrides, args.aux, args.batch_size, args.num_workers,
                            getattr(args, "chunk_size", DEFAULT_CHUNK_SIZE), getattr(args, "whiten_dim", None))
