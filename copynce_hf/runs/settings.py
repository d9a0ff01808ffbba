"""The models and settings of a detection run as a user names them (``copynce detect``, ``calibrate``, ``dedup``):
model paths or Hub ids (``None``: the embedded model; ``"none"``: no matcher), the runtime, the preset and the
settings given explicitly, by option name (:func:`~copynce_hf.configuration.fields.given_options`); and what follows
from them: the checks made before any model loads, the loaded
:class:`~copynce_hf.retrieval.descriptors.cached.Descriptor` list and matcher, the names reports and logs give the models, the
:class:`~copynce_hf.retrieval.detection.config.DetectConfig` and the identity a calibration file is tied to (:mod:`copynce_hf.calibration.thresholds`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..calibration.thresholds import model_identity, pipeline_identity
from ..configuration.fields import build
from ..modeling.errors import ConfigError
from ..retrieval.detection.config import DetectConfig
from ..retrieval.presets import DEFAULT_CHUNK_SIZE, PIPELINE_PRESETS
from ..runtime.embedding_declaration import is_embedding_path
from ..runtime.loading import DEFAULT_DESCRIPTOR, DEFAULT_MATCHER, check_model_path, load_model

#: The ``matcher`` value of a run without matcher (descriptor scores decide).
NO_MATCHER = "none"


def model_names(paths: list[str | None]) -> list[str]:
    """Short distinct names for descriptor models (index sub-folders, log lines); ``None`` is the embedded one."""
    names: list[str] = []
    for path in paths:
        base = "embedded-descriptor" if path is None else Path(str(path).rstrip("/")).name or str(path)
        base = "".join(c if c.isalnum() or c in "-_." else "-" for c in base)
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def model_label(path, default, runtime: str) -> str:
    """How reports name a model: its folder or Hub id, else the embedded ``default``, with ``(ONNX Runtime)`` when
    ``runtime`` is ``onnx``."""
    return str(path or default) + (" (ONNX Runtime)" if runtime == "onnx" else "")


def content_tokens_text(config) -> str:
    """How a report names the content-token settings of a :class:`~copynce_hf.retrieval.detection.config.DetectConfig`."""
    stages = [f"matcher (tau {config.content_tau})" if config.content_tokens else None,
              f"descriptor (tau {config.descriptor_content_tau})" if config.descriptor_content_tokens else None]
    stages = [stage for stage in stages if stage]
    if not stages:
        return "off"
    return (f"{' and '.join(stages)}: tokens shared with {config.content_min_images} of "
            f"{config.content_neighbours} neighbour images dropped")


@dataclasses.dataclass
class PipelineModels:
    """The models of a run, as named on the command line.

    Attributes:
        descriptors: descriptor model folders or Hub ids (``None``: the embedded descriptor), or ONNX embedding
            models (``onnx:PATH``: :mod:`~copynce_hf.runtime.embedding_declaration`); several are merged.
        matcher: the matcher's folder or Hub id (``None``: the embedded matcher; :data:`NO_MATCHER`: none).
        runtime: ``torch`` or ``onnx`` (:func:`~copynce_hf.runtime.loading.load_model`).
        descriptor_option: the option that names the descriptors, for messages (``--models``, ``--model``).
    """

    descriptors: list[str | None] = dataclasses.field(default_factory=lambda: [None])
    matcher: str | None = None
    runtime: str = "torch"
    descriptor_option: str = "--models"

    @property
    def has_matcher(self) -> bool:
        return self.matcher != NO_MATCHER

    def check_paths(self) -> None:
        """Refuse a model path that names no model folder, before any model loads."""
        for path in self.descriptors:
            check_model_path(path, self.descriptor_option)
        if self.has_matcher:
            check_model_path(self.matcher, "--matcher")

    def descriptor_identities(self) -> list[str]:
        """How a calibration names the descriptors (:func:`~copynce_hf.calibration.thresholds.model_identity`)."""
        return [model_identity(path, "descriptor") for path in self.descriptors]

    def matcher_identity(self) -> str | None:
        """How a calibration names the matcher: ``embedded:matcher`` for the default, ``None`` without matcher."""
        return model_identity(self.matcher, "matcher") if self.has_matcher else None

    def descriptor_labels(self) -> list[str]:
        return [model_label(path, DEFAULT_DESCRIPTOR, self.runtime) for path in self.descriptors]

    def matcher_label(self) -> str:
        """How progress lines and reports name the matcher: ``none``, else :func:`model_label`'s name."""
        return self.matcher if not self.has_matcher else model_label(self.matcher, DEFAULT_MATCHER, self.runtime)

    def load_descriptors(self) -> list:
        """The :class:`~copynce_hf.retrieval.descriptors.cached.Descriptor` of each descriptor model, named by :func:`model_names`."""
        from ..retrieval.descriptors.cached import Descriptor

        return [Descriptor(name, *load_model(path, "descriptor", self.descriptor_option, runtime=self.runtime),
                           source=label)
                for name, path, label in zip(model_names(self.descriptors), self.descriptors,
                                             self.descriptor_labels())]

    def load_matcher(self) -> tuple | None:
        """``(model, image processor)`` of the matcher run by :attr:`runtime`; ``None`` without matcher."""
        if not self.has_matcher:
            return None
        return load_model(self.matcher, "matcher", "--matcher", runtime=self.runtime)


@dataclasses.dataclass
class PipelineSettings:
    """The whole pipeline of ``copynce detect``, ``calibrate`` and ``dedup``: models, preset and settings.

    Attributes:
        models: :class:`PipelineModels`.
        preset: a name of :data:`~copynce_hf.retrieval.presets.PIPELINE_PRESETS` (``dedup``: ``copynce dedup``'s).
        overrides: the :class:`~copynce_hf.retrieval.detection.config.DetectConfig` settings given explicitly, by
            option name (``{"candidates": 7, "collection_k_end": 5}``: :func:`~copynce_hf.configuration.fields.build`).
        aux: a folder of images without copies of the queries, for score normalisation (``None``: off).
        batch_size, num_workers, chunk_size, whiten_dim: as in :class:`~copynce_hf.retrieval.detection.config.DetectConfig`.
    """

    models: PipelineModels = dataclasses.field(default_factory=PipelineModels)
    preset: str = "fast"
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    aux: str | None = None
    batch_size: int = 64
    num_workers: int = 0
    chunk_size: int = DEFAULT_CHUNK_SIZE
    whiten_dim: int | None = None

    def config(self):
        """The :class:`~copynce_hf.retrieval.detection.config.DetectConfig` of the preset with the overrides. Content tokens not asked for
        explicitly are off where they cannot apply: with the matcher's local crops or ONNX Runtime; query crops asked
        for where content tokens are off, or with descriptor views, are a :class:`ConfigError`."""
        overrides = dict(self.overrides)
        matcher_lce = overrides.get("matcher_lce", PIPELINE_PRESETS.get(self.preset, {}).get("matcher_lce", "none"))
        if "content_tokens" not in overrides and (matcher_lce != "none" or self.models.runtime == "onnx"):
            overrides["content_tokens"] = False
        preset = DetectConfig.from_preset(self.preset, batch_size=self.batch_size, num_workers=self.num_workers,
                                          chunk_size=self.chunk_size, whiten_dim=self.whiten_dim)
        config = build(DetectConfig, overrides, preset)
        embedding = [path for path in self.models.descriptors if is_embedding_path(path)]
        if config.descriptor_content_tokens and embedding:
            raise ConfigError(f"descriptor content tokens re-run a CopyNCE descriptor's blocks; {embedding[0]} is an "
                              "ONNX embedding model without tokens: leave out --descriptor-content-tokens")
        if overrides.get("query_crops") and not config.crops_queries:
            raise ConfigError("query crops are cut from the content tokens of whole images: --query-crops needs "
                              f"content tokens and --descriptor-lce none (this run: content tokens "
                              f"{'on' if config.content_tokens else 'off'}, descriptor LCE {config.descriptor_lce})")
        if overrides.get("layout_crops") and not config.crops_layouts:
            raise ConfigError("layout crops are query crops read from each query's own layout: --layout-crops needs "
                              "query crops (this run has none: --no-query-crops, content tokens off or descriptor LCE)")
        return config

    def identity(self) -> dict[str, Any]:
        """What a calibration of this pipeline is tied to (:func:`~copynce_hf.calibration.thresholds.pipeline_identity`)."""
        return pipeline_identity(self.models.descriptor_identities(), self.models.matcher_identity(), self.preset,
                                 self.config(), score_normalisation=bool(self.aux))

    def preset_text(self) -> str:
        """The preset and the fields given over it: ``fast (candidates, k given)``."""
        return self.preset + (f" ({', '.join(sorted(self.overrides))} given)" if self.overrides else "")
