"""Hugging Face Hub artifacts of CopyNCE models: model cards, the upload folder and the upload.

* :func:`build_model_card` renders ``model_cards/descriptor.md`` or ``model_cards/matcher.md``
  with ``huggingface_hub.ModelCard.from_template``: YAML metadata (license, library,
  pipeline tag, tags, datasets, base model and a ``model-index`` with the copy-detection
  metrics when results are given) and the sections of the card.
* :func:`validate_model_card` checks a card's metadata offline with ``huggingface_hub``'s
  own parsers (``ModelCard.validate`` needs the network).
* :func:`save_for_hub` writes everything a Hub repository needs into one folder: weights
  (safetensors), config, custom code (``auto_map``, written by the model's
  ``save_pretrained``), image processor and ``README.md``.
* :func:`push_to_hub` uploads that folder to a repository in one commit.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData

from .modeling.errors import TRANSFORMERS_REQUIREMENT, ConfigError, CopyNCEError

__all__ = [
    "CITATION",
    "DEFAULT_LICENSE",
    "METRICS",
    "METRIC_ID",
    "PIPELINE_TAGS",
    "TEMPLATE_DIR",
    "build_model_card",
    "push_to_hub",
    "save_for_hub",
    "validate_model_card",
    "weights_license",
]

_PACKAGE_DIR = Path(__file__).resolve().parent
# A source checkout keeps the templates in the repository's model_cards/; an installed
# package carries the same files as copynce_hf/model_cards/ (see setup.py).
TEMPLATE_DIR = next(
    (folder for folder in (_PACKAGE_DIR.parent / "model_cards", _PACKAGE_DIR / "model_cards") if folder.is_dir()),
    _PACKAGE_DIR.parent / "model_cards",
)
"""Folder of the Jinja card templates (``descriptor.md``, ``matcher.md``)."""

CITATION = """@inproceedings{lu2025tracing,
  title     = {Tracing Copied Pixels and Regularizing Patch Affinity in Copy Detection},
  author    = {Lu, Yichen and Nie, Siwei and Lu, Minlong and Yang, Xudong and Zhang, Xiaobo and Zhang, Peng},
  booktitle = {Proceedings of the IEEE/CVF International Conference on Computer Vision (ICCV)},
  year      = {2025}
}"""
"""BibTeX of the CopyNCE paper (ICCV 2025)."""

# Result keys of the ``copy_detection`` evaluate metric -> display name. In the ``model-index`` every
# value has the metric's id as its type (METRIC_ID), the display name as its name and the result key
# as its config, so a card's numbers match the metric's output by name.
METRICS: dict[str, str] = {
    "micro_ap": "µAP",
    "recall_at_p90": "RP90 (recall at 90% precision)",
    "recall_at_rank1": "Recall@1",
    "recall_at_rank10": "Recall@10",
    "mean_ap": "mAP",
    "threshold_at_p90": "Score threshold at 90% precision",
}
METRIC_ID = "copy_detection"
"""Id of the evaluate metric the results come from (``evaluate.load`` of ``copynce_hf/metrics/copy_detection``)."""
_RESULT_DATASET_KEYS = ("dataset_name", "dataset_type", "dataset_split", "dataset_config", "source_name",
                        "source_url")

# The descriptor maps one image to a vector: the Hub task "image-feature-extraction", which the stock
# transformers pipeline of that name runs. The matcher maps an image pair to one copy logit; no Hub task
# or stock pipeline takes pairs, so its tag is the Hub's "other", and what loads it is this package's
# "image-copy-detection" pipeline, which save_for_hub records in the config's custom_pipelines (with its
# code), so pipeline(model=repo, trust_remote_code=True) builds it.
PIPELINE_TAGS = {"descriptor": "image-feature-extraction", "matcher": "other"}
_MODEL_TYPES = {"copynce-descriptor": "descriptor", "copynce-matcher": "matcher"}
_TASK_NAME = "Image copy detection"


def _model_kind(config) -> str:
    model_type = getattr(config, "model_type", None)
    if model_type not in _MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not a CopyNCE model; expected one of {sorted(_MODEL_TYPES)}"
        )
    return _MODEL_TYPES[model_type]


def _as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_format_value(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _architecture_rows(config, kind: str) -> list[tuple[str, str]]:
    rows = [
        ("Backbone", f"ViT, {config.num_hidden_layers} blocks, hidden size {config.hidden_size}, "
                     f"{config.num_attention_heads} heads, MLP {config.intermediate_size}"),
        ("Input", f"{config.image_size}x{config.image_size} RGB, {config.patch_size}x{config.patch_size} "
                  f"patches ({(config.image_size // config.patch_size) ** 2} tokens + CLS)"),
    ]
    rows.append(("LayerNorm epsilon", _format_value(config.layer_norm_eps)))
    if kind == "descriptor":
        final_norm = "after the final LayerNorm" if getattr(config, "final_layer_norm", True) else (
            "the last block's output (no final LayerNorm)")
        rows.append(("Head", f"linear (no bias) -> batch norm -> L2 normalisation on the CLS token ({final_norm}), "
                             f"{config.descriptor_dim}-d descriptor"))
        sides = getattr(config, "inference_sizes", None)
        if sides:
            rows.append(("Multi-size descriptors", f"at inference the L2-normalised sum of the descriptors at "
                         f"{', '.join(f'{side}x{side}' for side in sides)} (the image processor gives the largest, "
                         f"the model resizes it to the others)"))
    else:
        encoder = config.num_hidden_layers - config.num_fusion_layers
        kept = getattr(config, "keep_image_cls_tokens", False)
        sequence = ("[CLS; query CLS; query patches; reference CLS; reference patches]" if kept
                    else "[CLS; query patches; reference patches] (with segment embeddings)")
        rows.append(("Encoder / fusion", f"enc-{encoder}-fus-{config.num_fusion_layers}: the first {encoder} "
                                         "blocks encode each image (shared weights), the last "
                                         f"{config.num_fusion_layers} fuse {sequence}"))
        extra_norm = " (after one more LayerNorm)" if getattr(config, "classifier_layer_norm", False) else ""
        rows.append(("Head", f"linear on the fused CLS token{extra_norm}: one copy logit per pair"))
    return rows


def _objective_rows(config, kind: str) -> list[tuple[str, str]]:
    def get(name, default=None):
        return getattr(config, name, default)

    rows = []
    if kind == "descriptor":
        rows.append(("Baseline loss", f"InfoNCE x {_format_value(get('infonce_weight', 1.0))} "
                                      f"+ KoLeo x {_format_value(get('koleo_weight', 5.0))}"))
        rows.append(("InfoNCE log-scale init", _format_value(get("logit_scale_init", 3.2))))
        rows.append(("CopyNCE layer", _format_value(get("copynce_layer", -1))))
    else:
        rows.append(("Baseline loss", f"BCE x {_format_value(get('bce_weight', 1.0))}"))
    rows.append(("CopyNCE weight w_NCE", _format_value(get("copynce_weight"))))
    rows.append(("CopyNCE temperature tau", _format_value(get("copynce_temperature"))))
    rows.append(("CopyNCE gamma", _format_value(get("copynce_gamma"))))
    rows.append(("CopyNCE target weighting", _format_value(get("copynce_weighting", "paper"))))
    return rows


def _normalise_results(results) -> list[dict[str, Any]]:
    """One dict per evaluation set: dataset fields plus metric keys of :data:`METRICS`."""
    if results is None:
        return []
    entries = [results] if isinstance(results, Mapping) else list(results)
    normalised = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise CopyNCEError(f"results[{index}] must be a mapping, got {type(entry).__name__}")
        unknown = sorted(set(entry) - set(METRICS) - set(_RESULT_DATASET_KEYS))
        if unknown:
            raise CopyNCEError(
                f"results[{index}] has unknown keys {unknown}; metric keys are {sorted(METRICS)} and dataset "
                f"keys {list(_RESULT_DATASET_KEYS)}"
            )
        if "dataset_name" not in entry:
            raise CopyNCEError(f"results[{index}] needs a 'dataset_name' (the evaluation set)")
        metrics = {}
        for key in METRICS:
            value = entry.get(key)
            if value is None:
                continue
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise CopyNCEError(f"results[{index}][{key!r}] = {value!r} is not a number") from None
            if not math.isfinite(value):
                raise CopyNCEError(f"results[{index}][{key!r}] = {value!r} is not finite")
            metrics[key] = value
        if not metrics:
            raise CopyNCEError(f"results[{index}] holds no metric value; expected some of {sorted(METRICS)}")
        dataset = {key: entry[key] for key in _RESULT_DATASET_KEYS if entry.get(key) is not None}
        dataset.setdefault("dataset_type", str(dataset["dataset_name"]))
        normalised.append({"dataset": dataset, "metrics": metrics})
    return normalised


def _eval_results(results: list[dict[str, Any]], pipeline_tag: str) -> list[EvalResult]:
    eval_results = []
    for entry in results:
        dataset = entry["dataset"]
        for key, value in entry["metrics"].items():
            eval_results.append(EvalResult(
                task_type=pipeline_tag,
                task_name=_TASK_NAME,
                dataset_type=str(dataset["dataset_type"]),
                dataset_name=str(dataset["dataset_name"]),
                dataset_split=dataset.get("dataset_split"),
                dataset_config=dataset.get("dataset_config"),
                metric_type=METRIC_ID,
                metric_name=METRICS[key],
                metric_config=key,
                metric_value=value,
                source_name=dataset.get("source_name"),
                source_url=dataset.get("source_url"),
            ))
    return eval_results


DEFAULT_LICENSE = "apache-2.0"
"""Licence of a card whose weights come from no carded folder (trained from scratch or from DINO, both Apache-2.0)."""


def weights_license(source: str | Path | None) -> dict[str, str] | None:
    """The licence of the weights in the local model folder ``source``, from its card's metadata:
    ``{"license": ..., "license_name": ..., "license_link": ...}`` (the fields present), or None where
    ``source`` is not a local folder with a card that names a licence (a Hub id is not looked up)."""
    card_path = Path(source) / "README.md" if source else None
    if card_path is None or not card_path.is_file():
        return None
    data = ModelCard.load(card_path).data
    if not data.license:
        return None
    return {field: getattr(data, field) for field in ("license", "license_name", "license_link")
            if getattr(data, field, None)}


def _weights_source(config) -> str | None:
    """The folder ``from_pretrained`` loaded the weights from (``config._name_or_path``), if any."""
    return getattr(config, "_name_or_path", None) or None


def build_model_card(
    config_or_model,
    *,
    model_id: str,
    results: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    training_settings: Mapping[str, Any] | None = None,
    datasets: str | Sequence[str] | None = None,
    base_model: str | Sequence[str] | None = None,
    license: str | None = None,
    license_name: str | None = None,
    license_link: str | None = None,
    template_path: str | Path | None = None,
) -> ModelCard:
    """Model card of a CopyNCE descriptor or matcher.

    Args:
        config_or_model: a ``CopyNCEDescriptorConfig`` / ``CopyNCEMatcherConfig`` or a model
            holding one; ``model_type`` chooses the template and the pipeline tag
            (:data:`PIPELINE_TAGS`).
        model_id: Hub repository id (``"org/copynce-vits-descriptor"``) or local name used in
            the card's title and code snippets.
        results: evaluation results, one mapping per evaluation set (or one mapping): a
            ``dataset_name`` (plus optional ``dataset_type`` -- a Hub dataset id if there is
            one, ``dataset_split``, ``dataset_config``, ``source_name``, ``source_url``) and
            values of the ``copy_detection`` metric keys of :data:`METRICS`, e.g. ``{"dataset_name":
            "DISC21 dev", "micro_ap": 0.705, "recall_at_p90": 0.636}``. They become the card's
            ``model-index`` (one ``EvalResult`` per metric) and results table.
        training_settings: free-form ``{setting: value}`` rows of the training-settings table
            (optimizer, steps, batch size, ...); the objective's weights are read from the config.
        datasets: Hub ids of the training datasets (card metadata ``datasets``).
        base_model: Hub id(s) of the checkpoint the model was initialised from (e.g.
            ``"facebook/dino-vits16"``); None for a model trained from scratch.
        license: SPDX-style Hub license id, or "other" with ``license_name`` (a short id) and
            ``license_link`` (the licence text: a file of the repository or a URL). Without one, the
            licence of the weights is kept: that of the card of the local folder the model was loaded
            from (``config._name_or_path``, e.g. a run continued from the research-only embedded models),
            else :data:`DEFAULT_LICENSE`.
        template_path: a Jinja template to use instead of ``model_cards/<kind>.md``.

    Returns:
        ``huggingface_hub.ModelCard``; ``str(card)`` is the README.md text.
    """
    config = getattr(config_or_model, "config", config_or_model)
    kind = _model_kind(config)
    if not isinstance(model_id, str) or not model_id.strip():
        raise CopyNCEError(f"model_id must be a non-empty string, got {model_id!r}")
    normalised = _normalise_results(results)
    dataset_ids, base_models = _as_list(datasets), _as_list(base_model)
    settings = dict(training_settings or {})
    licence = _card_license(config, license, license_name, license_link)
    card_data = _card_data(kind, model_id, normalised, dataset_ids, base_models, licence)
    values = _template_values(config, kind, settings, normalised, dataset_ids, base_models)
    template = _card_template(template_path, kind)
    return ModelCard.from_template(card_data, template_path=str(template), model_id=model_id, **values)


def _template_values(config, kind: str, settings: dict[str, Any], normalised: list[dict[str, Any]],
                     dataset_ids: list[str], base_models: list[str]) -> dict[str, Any]:
    """What the card's Jinja template reads besides the model id: the pipeline tag, the rows of its architecture,
    objective, training-settings and results tables, base models, datasets, descriptor size, the ``transformers``
    requirement and the citation."""
    return dict(
        pipeline_tag=PIPELINE_TAGS[kind],
        architecture_rows=_architecture_rows(config, kind),
        objective_rows=_objective_rows(config, kind),
        training_rows=[(str(key), _format_value(value)) for key, value in settings.items()],
        result_rows=_result_rows(normalised),
        base_models=base_models,
        dataset_ids=dataset_ids,
        descriptor_dim=getattr(config, "descriptor_dim", None),
        transformers_requirement=TRANSFORMERS_REQUIREMENT,
        citation=CITATION,
    )


def _card_data(kind: str, model_id: str, normalised: list[dict[str, Any]], dataset_ids: list[str],
               base_models: list[str], licence: dict[str, str | None]) -> ModelCardData:
    """The card's metadata (its YAML header): licence, library, pipeline tag, tags, training datasets, base
    model(s), and the ``model-index`` of the normalised ``results`` (one ``EvalResult`` per metric)."""
    pipeline_tag = PIPELINE_TAGS[kind]
    return ModelCardData(
        **licence,
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["copy-detection", "copynce", "image-copy-detection", "pixtrace", "vision", "vit", kind],
        datasets=dataset_ids or None,
        base_model=(base_models[0] if len(base_models) == 1 else base_models) or None,
        metrics=[METRIC_ID] if normalised else None,
        model_name=model_id.rstrip("/").split("/")[-1],
        eval_results=_eval_results(normalised, pipeline_tag) or None,
    )


def _card_license(config, license: str | None, license_name: str | None, license_link: str | None
                  ) -> dict[str, str | None]:
    """``{"license", "license_name", "license_link"}`` of the card: the ones given, else those of the weights
    (the card of the folder the model was loaded from, else :data:`DEFAULT_LICENSE`)."""
    if license is None and license_name is None and license_link is None:
        inherited = weights_license(_weights_source(config)) or {"license": DEFAULT_LICENSE}
        license, license_name, license_link = (inherited.get(key) for key in ("license", "license_name",
                                                                              "license_link"))
    elif license is None:
        raise CopyNCEError("license_name / license_link need license= (e.g. license='other')")
    if license == "other" and not (license_name and license_link):
        raise CopyNCEError("license='other' needs license_name and license_link (where the licence text is)")
    return {"license": license, "license_name": license_name, "license_link": license_link}


def _result_rows(normalised: list[dict]) -> list[tuple[str, str, str, str]]:
    """``(dataset, split, metric name, value)`` rows of the card's results table."""
    return [
        (
            str(entry["dataset"]["dataset_name"]),
            str(entry["dataset"].get("dataset_split", "")),
            METRICS[key],
            f"{value:.4f}",
        )
        for entry in normalised
        for key, value in entry["metrics"].items()
    ]


def _card_template(template_path: str | Path | None, kind: str) -> Path:
    """The Jinja template of the card: ``template_path``, else ``model_cards/<kind>.md``."""
    path = Path(template_path) if template_path is not None else TEMPLATE_DIR / f"{kind}.md"
    if not path.is_file():
        raise CopyNCEError(f"model card template {path} not found (the templates live in the repository's "
                           "model_cards/ folder; pass template_path= when copynce_hf is installed without it)")
    return path


def validate_model_card(card: ModelCard | str) -> ModelCardData:
    """Check a card's YAML metadata offline with ``huggingface_hub``'s parsers.

    Parses the YAML header, builds ``ModelCardData`` from it (which parses ``model-index``
    into ``EvalResult`` objects and rejects malformed entries) and checks the fields every
    CopyNCE card must carry. ``ModelCard.validate`` (the Hub's own check) needs the network;
    the Hub runs it again on upload.

    Returns:
        The parsed ``ModelCardData``.

    Raises:
        CopyNCEError: missing header, unparsable YAML, malformed model-index or missing fields.
    """
    text = str(card)
    if not text.startswith("---\n"):
        raise CopyNCEError("model card has no YAML metadata header (it must start with '---')")
    try:
        header = text.split("---\n", 2)[1]
        metadata = yaml.safe_load(header)
    except (IndexError, yaml.YAMLError) as error:
        raise CopyNCEError(f"model card metadata is not valid YAML: {error}") from error
    if not isinstance(metadata, dict):
        raise CopyNCEError("model card metadata is not a YAML mapping")
    try:
        data = ModelCardData(**metadata)
    except (ValueError, KeyError, TypeError) as error:
        raise CopyNCEError(f"model card metadata is invalid: {error}") from error
    for field in ("license", "library_name", "pipeline_tag", "tags"):
        if not getattr(data, field, None):
            raise CopyNCEError(f"model card metadata lacks {field!r}")
    if "copy-detection" not in data.tags:
        raise CopyNCEError("model card metadata lacks the 'copy-detection' tag")
    if data.license == "other" and not (getattr(data, "license_name", None) and getattr(data, "license_link", None)):
        raise CopyNCEError("model card metadata has license 'other' without license_name and license_link")
    return data


def save_for_hub(
    model,
    folder: str | Path,
    image_processor=None,
    card: ModelCard | str | None = None,
    *,
    model_id: str | None = None,
) -> Path:
    """Write everything a Hub model repository holds into ``folder``.

    ``model.save_pretrained`` writes ``config.json`` and ``model.safetensors`` (plus, for
    classes registered for the Auto API, ``auto_map`` and the modelling code). With an image
    processor, the folder is written by the ``image-copy-detection`` pipeline's
    ``save_pretrained`` instead, which also writes ``preprocessor_config.json``, the pipeline
    code and the config's ``custom_pipelines`` entry (so ``pipeline(model=folder,
    trust_remote_code=True)`` works without copynce_hf). The card goes in ``README.md``; without
    one, a default card is built with :func:`build_model_card` (``model_id`` defaults to the
    folder name).

    Returns:
        The folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if card is None:
        card = build_model_card(model, model_id=model_id or folder.resolve().name)
    card_data = validate_model_card(card)
    if image_processor is not None:
        from .modeling.pipeline_copynce import ImageCopyDetectionPipeline
        from .pipelines import register_pipeline

        register_pipeline()
        ImageCopyDetectionPipeline(model=model, image_processor=image_processor).save_pretrained(folder)
    else:
        model.save_pretrained(folder)
    if not (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").is_file():
        raise CopyNCEError(f"save_pretrained wrote no safetensors weights into {folder}")
    (folder / "README.md").write_text(str(card), encoding="utf-8")
    _carry_license_file(card_data, folder, _weights_source(model.config))
    return folder


def _carry_license_file(card_data: ModelCardData, folder: Path, source: str | None) -> None:
    """Copy the licence text a card links to as a file of the repository (``license_link: LICENSE``)
    from the folder the weights came from, unless ``folder`` holds it already."""
    link = getattr(card_data, "license_link", None)
    if not link or "://" in link or (folder / link).is_file():
        return
    origin = Path(source) / link if source else None
    if origin is None or not origin.is_file():
        raise CopyNCEError(f"the model card's license_link {link!r} names a file of the model folder, but neither "
                           f"{folder} nor the folder the weights came from ({source or 'none'}) holds it; write "
                           "the licence text there, or link a URL")
    (folder / link).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(origin, folder / link)


def push_to_hub(
    model,
    repo_id: str,
    image_processor=None,
    card: ModelCard | str | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload CopyNCE model",
):
    """Upload a model, its image processor and its card to ``repo_id`` in one commit.

    The folder is prepared with :func:`save_for_hub` in a temporary directory; the repository
    is created if needed (``HfApi.create_repo(exist_ok=True)``) and the folder uploaded with
    ``HfApi.upload_folder``. Without a card, the default card of :func:`build_model_card`
    is used with ``model_id=repo_id``.

    Returns:
        The ``CommitInfo`` of the upload.
    """
    api = HfApi(token=token)
    if card is None:
        card = build_model_card(model, model_id=repo_id)
    with tempfile.TemporaryDirectory(prefix="copynce-hub-") as tmp:
        save_for_hub(model, tmp, image_processor=image_processor, card=card)
        api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=tmp,
                                 commit_message=commit_message)
