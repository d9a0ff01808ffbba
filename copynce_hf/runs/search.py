"""``copynce search`` as one call: a :class:`SearchRequest` in, a predictions CSV (the k nearest references of every
query image in an index folder of ``copynce index``) written and a :class:`SearchDone` out.

The query descriptors (optionally their LCE views) are searched with :func:`~copynce_hf.retrieval.search.references.search_references`,
the one search: score normalisation with auxiliary descriptors, or feature stretching. The query descriptors can
also be saved, and both sides exported in the DISC21 descriptor-track HDF5 layout.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..calibration.meaning import ScoreMeaning, card_threshold, search_score
from ..configuration.fields import positive_int, setting, setting_like
from ..modeling.errors import ConfigError, PredictionsError
from ..outputs import OwnFile, StagedFile, check_output_file, first_bytes
from ..retrieval.descriptors.views import DESCRIPTOR_LCE_MODES
from ..retrieval.sources import ImageInput, count_text
from ..runtime.embedding_declaration import OPTION_HELP
from ..runtime.loading import check_model_path
from .shared_options import ModelLoading, SearchKnobs

#: A predictions CSV as :func:`~copynce_hf.retrieval.predictions.write_predictions` writes it (header first; Excel's
#: byte-order mark allowed): ``copynce search`` and ``copynce match`` rewrite such a file and refuse to overwrite any
#: other.
PREDICTIONS_FILE = OwnFile(
    "a predictions CSV (header query_id,reference_id,score)",
    lambda path: first_bytes(path, 64).removeprefix(b"\xef\xbb\xbf").startswith(b"query_id,reference_id,score"))


@dataclasses.dataclass
class SearchRequest:
    """A ``copynce search`` run; each field with an option declares it (:func:`~copynce_hf.configuration.fields.setting`).

    Attributes:
        queries: folder of query images.
        index: index folder written by ``copynce index``.
        output: predictions CSV to write.
        model, runtime: the descriptor model (``None``: the one the index was built with) and what runs it.
        k: neighbours per query.
        descriptor_lce: the query views (:class:`~copynce_hf.retrieval.descriptors.views.ViewPreset`).
        score_norm, alpha, k_start, k_end: score normalisation with auxiliary descriptors (a descriptors file or
            an index folder); ``None``: off.
        stretch, beta, stretch_k: feature stretching with auxiliary descriptors; ``None``: off.
        save_descriptors, hdf5: extra outputs (``None``: not written).
        ef_search, nprobe, k_factor: approximate search knobs (``None``: the index's).
        batch_size, num_workers: images per forward pass; ``DataLoader`` workers.
        input: how images are read (sub-folders, size limit).
        progress: progress bars.
    """

    queries: str = setting(help="folder of query images", flag="queries")
    index: str = setting(help="index folder written by `copynce index`")
    output: str = setting(help="predictions CSV to write")
    model: str | None = setting(None, f"descriptor model, {OPTION_HELP} (default: the one the index was built with)")
    runtime: str = setting_like(ModelLoading, "runtime")
    k: int = setting(10, "neighbours per query", type=positive_int)
    descriptor_lce: str = setting(
        "none", "query views: none, matcher-views (26 views; a pair scores its best view pair) or authors (45 views in "
        "4 groups, each view keeps its top 100/10/10/4 references by group, then the best --k)",
        choices=DESCRIPTOR_LCE_MODES)
    score_norm: str | None = setting(
        None, "score normalisation: subtract alpha * the mean similarity of the query to its auxiliary neighbours of "
        "rank k-start..k-end (a descriptors.safetensors file or an index folder)", metavar="AUX_DESCRIPTORS")
    alpha: float = setting(1.0, "score normalisation weight", type=float)
    k_start: int = setting(0, "first auxiliary rank, from 0", type=int)
    k_end: int = setting(9, "last auxiliary rank, inclusive", type=int)
    stretch: str | None = setting(
        None, "feature stretching: scale each query by beta * its mean top-k auxiliary similarity and score pairs by "
        "negative squared euclidean distance", metavar="AUX_DESCRIPTORS")
    beta: float = setting(2.5, "stretching coefficient", type=float)
    stretch_k: int = setting(5, "auxiliary neighbours averaged", type=positive_int)
    save_descriptors: str | None = setting(None, "also write the query descriptors (safetensors)", metavar="PATH")
    hdf5: str | None = setting(None, "also write query and reference descriptors in the DISC21 descriptor-track HDF5 "
                               "layout (needs h5py)", metavar="PATH")
    ef_search: int | None = setting_like(SearchKnobs, "ef_search")
    nprobe: int | None = setting_like(SearchKnobs, "nprobe")
    k_factor: int | None = setting_like(SearchKnobs, "k_factor")
    batch_size: int = setting_like(ModelLoading, "batch_size")
    num_workers: int = setting_like(ModelLoading, "num_workers")
    input: ImageInput = dataclasses.field(default_factory=ImageInput)
    progress: bool = True


@dataclasses.dataclass
class SearchDone:
    """What :func:`search_queries` wrote: predictions (rows), query images listed, queries searched (those read),
    id -> reason of each image skipped, and what the scores are (:func:`score_meaning`)."""

    count: int
    images: int
    searched: int
    skip_reasons: dict[str, str]
    meaning: ScoreMeaning | None = None


def _open_search(request: SearchRequest):
    """The outputs, options, images, index and model checked before the model loads: ``(source, index, views,
    whether views are searched, model path)``."""
    from ..retrieval.descriptors.views import ViewPreset
    from ..retrieval.search.index import DescriptorIndex, search_knobs
    from ..retrieval.search.view_search import view_preset_of

    if request.score_norm and request.stretch:
        raise ConfigError("use either --score-norm or --stretch, not both")
    check_output_file(request.output, own=PREDICTIONS_FILE)
    for option, path in (("--save-descriptors", request.save_descriptors), ("--hdf5", request.hdf5)):
        if path:
            check_output_file(path, option)
    check_model_path(request.model)
    source = request.input.folder(request.queries)
    index = DescriptorIndex.load(request.index)
    preset = ViewPreset(request.descriptor_lce)
    with_views = preset.name != "none" or view_preset_of(index).name != "none"
    if with_views and (request.stretch or request.hdf5):
        raise ConfigError("--stretch and --hdf5 need one descriptor per image: not with local crops views "
                          "(--descriptor-lce, or an index built with --descriptor-lce)")
    knobs = search_knobs(request)
    if knobs:
        index.set_search_parameters(**knobs)
    model_path = request.model or index.info.get("model")
    if request.model is None and model_path and Path(model_path).is_absolute() and not Path(model_path).exists():
        raise ConfigError(
            f"the index was built with the model {model_path}, which no longer exists; pass --model PATH"
        )
    return source, index, preset, with_views, model_path


def search_queries(request: SearchRequest) -> SearchDone | None:
    """Run ``copynce search``; what was written on the main process, ``None`` on the others."""
    from ..precision import make_accelerator
    from ..retrieval.descriptors.sets import DescriptorSet, export_disc21_hdf5
    from ..retrieval.descriptors.view_extraction import extract_view_descriptors
    from ..retrieval.predictions import write_predictions
    from ..retrieval.search.index import DescriptorIndex
    from ..retrieval.search.references import search_references
    from ..runtime.loading import load_model

    source, index, preset, with_views, model_path = _open_search(request)
    model, processor = load_model(model_path, "descriptor", "--model", runtime=request.runtime)
    auxiliary_file = request.score_norm or request.stretch
    auxiliary = DescriptorSet.load(auxiliary_file) if auxiliary_file else None
    accelerator = make_accelerator()
    queries = extract_view_descriptors(model, processor, source, preset, "query", batch_size=request.batch_size,
                                       num_workers=request.num_workers, accelerator=accelerator,
                                       progress=request.progress, description="query descriptors")
    if not accelerator.is_main_process:
        return None
    if len(queries) == 0:
        raise PredictionsError(f"none of the {len(source)} images of {request.queries} could be read: skipped "
                               f"{count_text(queries.skip_reasons.values())}")
    if queries.dim != index.references.dim:
        raise ConfigError(
            f"the model gives {queries.dim}-d descriptors but the index holds {index.references.dim}-d ones"
        )
    if request.save_descriptors:
        with StagedFile(request.save_descriptors) as temporary:
            queries.save(temporary)
    if request.hdf5:
        compared = [DescriptorSet(s.ids, index.transform(s.descriptors)) for s in (queries, index.references)]
        with StagedFile(request.hdf5) as temporary:
            export_disc21_hdf5(temporary, *compared)  # as the index compares them (whitened when it whitens)
    if with_views and request.score_norm and (Path(request.score_norm) / "index.json").is_file():
        auxiliary = DescriptorIndex.load(request.score_norm)  # an index of auxiliary views
    predictions = search_references(index, queries, request.k, query_views=preset, auxiliary=auxiliary,
                                    stretch=bool(request.stretch), alpha=request.alpha, k_start=request.k_start,
                                    k_end=request.k_end, beta=request.beta, stretch_k=request.stretch_k)
    count = write_predictions(request.output, predictions)
    return SearchDone(count, len(source), len(source) - len(queries.skipped), queries.skip_reasons,
                      score_meaning(request, model_path, with_views))


def score_meaning(request: SearchRequest, model_path, with_views: bool) -> ScoreMeaning:
    """What the scores of a search are (:func:`~copynce_hf.calibration.meaning.search_score`); for raw cosines of
    whole images, with the model card's threshold at precision 0.9."""
    from ..runtime.loading import DEFAULT_DESCRIPTOR

    raw = not (request.score_norm or request.stretch or with_views)
    score = search_score(bool(request.score_norm), bool(request.stretch), with_views, request.alpha, request.k_start,
                         request.k_end)
    return ScoreMeaning(score, str(model_path or DEFAULT_DESCRIPTOR),
                        card=card_threshold(model_path, "descriptor") if raw else None)
