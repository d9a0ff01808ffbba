"""``copynce index`` as one call: an :class:`IndexRequest` in, an index folder (``descriptors.safetensors``,
``index.faiss``, ``index.json``) written and an :class:`IndexBuilt` out.

The references' descriptors are extracted a chunk at a time into a work folder beside the index
(:mod:`copynce_hf.retrieval.descriptors.chunked_extraction`), tied to the one identity of descriptors kept on disk
(:func:`~copynce_hf.retrieval.work_folder.views_identity`, the identity ``detect`` and ``dedup`` tie their cached indexes to)
with the chunk and batch sizes: the same request after a kill resumes from the last complete chunk. The index is
then built from the chunk files one at a time (optionally whitened) and moved into place; the work folder is removed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from ..configuration.fields import positive_int, setting, setting_like
from ..modeling.errors import PredictionsError
from ..outputs import check_output_folder
from ..retrieval.descriptors.views import DESCRIPTOR_LCE_MODES
from ..retrieval.presets import DEFAULT_INDEX_CHUNK_SIZE
from ..retrieval.sources import ImageInput, count_text
from ..runtime.embedding_declaration import OPTION_HELP
from ..runtime.loading import DEFAULT_DESCRIPTOR, check_model_path
from .shared_options import DatasetInput, ModelLoading, SearchKnobs, Whitening

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class IndexRequest:
    """A ``copynce index`` run; each field with an option declares it (:func:`~copynce_hf.configuration.fields.setting`).

    Attributes:
        output: the index folder to write.
        references, dataset: the reference images: a folder, or a dataset (:class:`~copynce_hf.retrieval.sources.ImageInput`).
        input: how images are read (sub-folders, size limit, dataset columns, streaming).
        model, runtime: the descriptor model (``None``: the embedded one) and what runs it.
        kind, nlist, pq_m, ef_search, nprobe, k_factor: the index (:class:`~copynce_hf.retrieval.search.index.IndexConfig`).
        descriptor_lce: the reference views indexed (:class:`~copynce_hf.retrieval.descriptors.views.ViewPreset`).
        whiten_from, whiten_dim: sample images a whitening is learned from, and the directions it keeps.
        chunk_size, batch_size, num_workers: images per chunk written, per forward pass; ``DataLoader`` workers.
        progress: progress bars.
        log: receives the line that says a run resumed.
    """

    output: str = setting(help="index folder to write")
    references: str | None = setting(None, "folder of reference images (or --dataset)", flag="references", nargs="?")
    dataset: str | None = setting_like(DatasetInput, "dataset")
    input: ImageInput = dataclasses.field(default_factory=ImageInput)
    model: str | None = setting(None, f"descriptor model folder or Hub id, {OPTION_HELP} (default: {DEFAULT_DESCRIPTOR})")
    runtime: str = setting_like(ModelLoading, "runtime")
    kind: str = setting(
        "flat", "flat: exact inner product (default); hnsw: approximate graph search for millions of references; "
        "ivfpq: compressed inverted lists with exact re-ranking, for memory-limited collections",
        flag="--index-type", choices=("flat", "hnsw", "ivfpq"), default_text="")
    nlist: int | None = setting(None, "IVF-PQ: number of inverted lists (default 4*sqrt(N))", type=positive_int)
    pq_m: int | None = setting(None, "IVF-PQ: sub-quantisers (default D/2)", type=positive_int)
    ef_search: int | None = setting_like(SearchKnobs, "ef_search")
    nprobe: int | None = setting_like(SearchKnobs, "nprobe")
    k_factor: int | None = setting_like(SearchKnobs, "k_factor")
    descriptor_lce: str = setting(
        "none", "index views: none (whole images), matcher-views (10 views per reference: whole, five one-third "
        "crops, four quarters) or authors (9 views: whole, five crops, three rotations)", choices=DESCRIPTOR_LCE_MODES)
    whiten_from: str | None = setting_like(Whitening, "whiten_from")
    whiten_dim: int | None = setting_like(Whitening, "whiten_dim")
    chunk_size: int = setting(DEFAULT_INDEX_CHUNK_SIZE, f"images per chunk written (default {DEFAULT_INDEX_CHUNK_SIZE}); "
                              "a resumed run keeps its chunk size", type=positive_int, metavar="N", default_text="")
    batch_size: int = setting_like(ModelLoading, "batch_size")
    num_workers: int = setting_like(ModelLoading, "num_workers")
    progress: bool = True
    log: Callable[[str], None] = logger.info

    def index_config(self):
        """The :class:`~copynce_hf.retrieval.search.index.IndexConfig` (search knobs left unset keep their defaults)."""
        from ..retrieval.search.index import IndexConfig, search_knobs

        return IndexConfig(kind=self.kind, nlist=self.nlist, pq_m=self.pq_m, **search_knobs(self))

    def info(self, views: str, whitened: bool) -> dict:
        """What ``index.json`` records: the model (an absolute folder, a Hub id or the embedded one), the views,
        the images, the runtime and the whitening sample."""
        from ..runtime.embedding_declaration import absolute_embedding_path, is_embedding_path

        model = self.model
        if is_embedding_path(model):
            model = absolute_embedding_path(model)
        elif model and Path(model).exists():
            model = str(Path(model).resolve())
        info = {"model": model or str(DEFAULT_DESCRIPTOR), "views": views,
                "source": self.dataset or str(Path(self.references).resolve()), "runtime": self.runtime}
        if whitened:
            info["whitened_from"] = str(Path(self.whiten_from).resolve())
        return info


@dataclasses.dataclass
class IndexBuilt:
    """What :func:`build_index` wrote: images read (skipped ones included), id -> reason of each skipped one,
    descriptors (rows), their dimension, the index kind, the views, the whitening (``None``: none), chunks reused."""

    images: int
    skip_reasons: dict[str, str]
    count: int
    dim: int
    kind: str
    views: object
    whitening: object
    resumed: int


def build_index(request: IndexRequest) -> IndexBuilt | None:
    """Run ``copynce index``: the output, model and images checked before the model loads, then the descriptors in
    resumable chunks, then the index. Returns what was built on the main process, ``None`` on the others."""
    from ..outputs import StagedFolder
    from ..precision import make_accelerator
    from ..retrieval.descriptors.chunked_extraction import extract_in_chunks, work_folder_of
    from ..retrieval.descriptors.views import ViewPreset
    from ..retrieval.search.index import write_index_from_files
    from ..retrieval.work_folder import views_identity
    from ..runtime.loading import load_model

    check_output_folder(request.output, inputs={"reference folder": request.references,
                                                "--whiten-from folder": request.whiten_from})
    check_model_path(request.model)
    source = request.input.folder_or_dataset(request.references, request.dataset, "--dataset")
    sample = request.input.whitening_sample(request.whiten_from, request.whiten_dim)
    config = request.index_config()
    model, processor = load_model(request.model, "descriptor", "--model", runtime=request.runtime)
    accelerator = make_accelerator()
    preset = ViewPreset(request.descriptor_lce)
    extract = {"batch_size": request.batch_size, "num_workers": request.num_workers, "accelerator": accelerator}
    whitening = _whitening(model, processor, sample, preset, request, extract)
    # the chunks hold the model's own descriptors: whitening and the index kind may change between runs
    identity = {**views_identity(model, processor, source, preset.name, "reference"),
                "chunk_size": request.chunk_size, "batch_size": request.batch_size}
    chunks = extract_in_chunks(model, processor, source, work_folder_of(request.output), identity, preset,
                               request.chunk_size, progress=request.progress, **extract)
    built = None
    if accelerator.is_main_process:
        if chunks.resumed:
            request.log(f"resumed after {chunks.resumed} complete chunk(s) in {chunks.folder}")
        if chunks.count == 0:
            chunks.remove()  # nothing to resume
            raise PredictionsError(f"none of the {chunks.images} images of {request.dataset or request.references} "
                                   f"could be read: skipped {count_text(chunks.skip_reasons.values())}")
        with StagedFolder(request.output) as staging:
            _, dim = write_index_from_files(chunks.parts, staging, config,
                                            request.info(preset.name, whitening is not None), whitening)
        chunks.remove()
        built = IndexBuilt(chunks.images, chunks.skip_reasons, chunks.count, dim, config.kind, preset, whitening,
                           chunks.resumed)
    accelerator.wait_for_everyone()
    return built


def _whitening(model, processor, sample, preset, request: IndexRequest, extract: dict):
    """The whitening learned from the sample images' reference views (``None`` without a sample)."""
    if sample is None:
        return None
    from ..retrieval.descriptors.cached import Descriptor, learn_whitening

    return learn_whitening(Descriptor("index", model, processor), sample, preset, request.whiten_dim,
                           progress=request.progress, **extract)
