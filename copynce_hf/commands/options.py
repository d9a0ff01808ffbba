"""The options several ``copynce`` commands share, declared once: their argument groups (image input, datasets,
model loading, runtime, whitening, search knobs, the matcher, calibration, the pipeline, quiet), the types that parse
them, and the library objects built from them (:func:`image_input`, :func:`pipeline_settings`).

The settings of the detection pipeline are options of the fields that hold them
(:class:`~copynce_hf.retrieval.detection.config.DetectConfig`, its
:class:`~copynce_hf.retrieval.presets.CollectionNormalisation`, ``dedup``'s
:class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`): each field declares its option, help and
default once, and :func:`~copynce_hf.configuration.fields.add_options` adds them here.

Nothing heavy is imported here: building the parser (``copynce --help``) loads no torch, transformers or faiss.
"""

from __future__ import annotations

import argparse

from ..configuration.fields import add_options, given_options
from ..retrieval.deduplication.settings import DedupSettings
from ..retrieval.detection.config import DetectConfig
from ..retrieval.presets import DEDUP_PRESETS, DEFAULT_CHUNK_SIZE, DETECT_PRESETS
from ..runs.shared_options import CalibratedDecision, DatasetInput, ModelLoading, SearchKnobs, Whitening
from ..runtime.embedding_declaration import OPTION_HELP
from ..runtime.loading import DEFAULT_DESCRIPTOR, DEFAULT_MATCHER

#: The :class:`~copynce_hf.retrieval.detection.config.DetectConfig` settings ``detect`` and ``calibrate`` take over
#: their ``--preset`` (the collection normalisation's in a group of their own), and those ``dedup`` takes.
DETECT_SETTINGS = ("alpha", "k_start", "k_end", "descriptor_lce", "matcher_lce", "candidates", "content_tokens",
                   "descriptor_content_tokens", "query_crops", "layout_crops", "layout_candidates", "k",
                   "fusion_precision", "encoder_precision", "descriptor_weight")
DETECT_COLLECTION_SETTINGS = ("collection", "reference_background")
DEDUP_SETTINGS = ("candidates", "descriptor_lce", "matcher_lce", "content_tokens", "descriptor_content_tokens",
                  "fusion_precision")

#: The :class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings` of ``dedup``'s collection normalisation
#: group, and the others.
DEDUP_COLLECTION_SETTINGS = ("collection", "matcher_normalisation", "matcher_alpha", "matcher_k_start",
                             "matcher_k_end", "matcher_anchor")
DEDUP_OTHER_SETTINGS = ("matcher_orders", "content_crops", "layout_crops", "grouping")

COLLECTION_GROUP = ("collection normalisation (discount what many images of the collection share: a screenshot "
                    "frame, a meme band, a background)")

# --------------------------------------------------------------------------- types


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


def add_dataset_input(parser: argparse.ArgumentParser, option: str, images: str, streaming: bool = False,
                      settings: type = DatasetInput) -> None:
    """The option of the field ``option`` of ``settings`` (images from a dataset instead of a folder), ``--split``,
    ``--image-column``, ``--id-column`` and, with ``streaming``, ``--streaming``."""
    group = parser.add_argument_group(f"{images} from a dataset (instead of a folder)")
    add_options(group, settings, (option,))
    group.add_argument("--split", default="train", help="its split (default train)")
    group.add_argument("--image-column", help="its image column (default: the first Image column, or 'image')")
    group.add_argument("--id-column", help="its id column (default: 'image_id', 'id', ... if present, else the "
                       "row number)")
    if streaming:
        group.add_argument("--streaming", action="store_true",
                           help="read it as a stream (a Hub dataset is not downloaded ahead; memory holds one chunk)")


def add_model_loading(parser: argparse.ArgumentParser, settings: type = ModelLoading) -> None:
    """``--batch-size`` and ``--num-workers``, as the fields of ``settings`` declare them."""
    add_options(parser, settings, ("batch_size", "num_workers"))


def add_chunk_size(parser: argparse.ArgumentParser) -> None:
    """``--chunk-size``: pairs per chunk of the matcher's resumable work (``detect``, ``dedup``, ``match``)."""
    add_options(parser, DetectConfig, ("chunk_size",))


def add_runtime(parser: argparse.ArgumentParser, settings: type = ModelLoading) -> None:
    add_options(parser, settings, ("runtime",))


def add_whitening(parser: argparse.ArgumentParser, settings: type = Whitening) -> None:
    group = parser.add_argument_group("whitening (SSCD's descriptor post-processing)")
    add_options(group, settings, ("whiten_from", "whiten_dim"))


def add_search_knobs(parser: argparse.ArgumentParser, settings: type = SearchKnobs) -> None:
    add_options(parser.add_argument_group("approximate search knobs"), settings, ("ef_search", "nprobe", "k_factor"))


def add_matcher(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matcher", default=None,
                   help=f"matcher model folder or Hub id, or 'none' for descriptors only (default: {DEFAULT_MATCHER})")


def add_calibration(p: argparse.ArgumentParser, settings: type = CalibratedDecision) -> None:
    """``--calibration`` and ``--precision``: copies decided at a threshold of ``copynce calibrate`` (detect, dedup)."""
    add_options(p, settings, ("calibration", "precision"))


def add_pipeline_options(p: argparse.ArgumentParser) -> None:
    """The models and settings of the detection pipeline (``detect``, ``calibrate``): the settings default to their
    ``--preset``'s."""
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help=f"descriptor model folder(s) or Hub id(s), {OPTION_HELP}; several are merged (default: "
                   f"{DEFAULT_DESCRIPTOR})")
    add_matcher(p)
    p.add_argument("--preset", choices=tuple(DETECT_PRESETS), default="fast",
                   help="whole settings: fast (CPU-sized, default), accurate (local crops on a CPU budget) or paper "
                   "(the authors' inference, for GPUs); "
                   "see below")
    p.add_argument("--aux", metavar="FOLDER",
                   help="images without copies of the queries (e.g. training images) for score normalisation")
    add_options(p, DetectConfig, DETECT_SETTINGS, presets=DETECT_PRESETS)
    add_options(p.add_argument_group(COLLECTION_GROUP), DetectConfig, DETECT_COLLECTION_SETTINGS,
                presets=DETECT_PRESETS)


def add_dedup_options(p: argparse.ArgumentParser) -> None:
    """The settings of ``dedup``: those of the detection pipeline (defaulting to the ``dedup`` preset's), and its own
    (:class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`: collection normalisation, the matcher's
    orders, content crops, grouping)."""
    add_options(p, DetectConfig, DEDUP_SETTINGS, presets=DEDUP_PRESETS)
    add_options(p.add_argument_group(COLLECTION_GROUP), DedupSettings, DEDUP_COLLECTION_SETTINGS)
    add_options(p, DedupSettings, DEDUP_OTHER_SETTINGS)


# --------------------------------------------------------------------------- what the options build


def image_input(args):
    """The :class:`~copynce_hf.retrieval.sources.ImageInput` of a command line (its image and dataset
    options; those a command lacks keep their defaults)."""
    from ..retrieval.sources import ImageInput

    return ImageInput(recursive=getattr(args, "recursive", False), max_pixels=args.max_pixels,
                      split=getattr(args, "split", "train"), image_column=getattr(args, "image_column", None),
                      id_column=getattr(args, "id_column", None), streaming=getattr(args, "streaming", False),
                      progress=not args.quiet)


def pipeline_settings(args, models=None, preset: str | None = None,
                      names: tuple[str, ...] = DETECT_SETTINGS + DETECT_COLLECTION_SETTINGS):
    """The :class:`~copynce_hf.runs.settings.PipelineSettings` of a command line: its models (``None``: those of
    ``--models``, ``--matcher`` and ``--runtime``), its preset (``None``: ``--preset``), the settings of ``names``
    given explicitly (:func:`~copynce_hf.configuration.fields.given_options`), ``--aux`` and the sizes."""
    from ..runs.settings import PipelineModels, PipelineSettings

    models = models or PipelineModels(args.models or [None], args.matcher, args.runtime)
    return PipelineSettings(models, preset or args.preset, given_options(DetectConfig, args, names),
                            getattr(args, "aux", None), args.batch_size, args.num_workers,
                            getattr(args, "chunk_size", DEFAULT_CHUNK_SIZE), getattr(args, "whiten_dim", None))
