"""The command line of a training run: ``--config <yaml>`` and ``--key value`` overrides.

One ``argparse`` option per field of :class:`~.config.TrainingConfig` (as
``transformers.HfArgumentParser`` builds them from ``TrainingArguments``): ``--help`` lists each with its
type, default and the help text of the field's metadata. Values are read as YAML scalars, as a
configuration file would hold them (``1e-4``, ``true``, ``null``, ``[1, 2]``); an option without a value
is ``true``. Model configuration keys are given one at a time as ``--model.<key> value``. A mistake
raises :class:`ConfigError` naming the option (the run prints it as one line and exits with status 2).
Without ``--config`` the run is ``tiny_cpu.yaml``'s; one that starts from a saved model
(``--model_name_or_path``) takes that model's kind and architecture, the other settings from the tiny
configuration of its kind (:func:`saved_model_defaults`).

    python -m copynce_hf.training --config tiny_cpu.yaml --max_steps 20 --model.hidden_size 32
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path
from typing import Any

from ..modeling.errors import ConfigError
from ..runtime.loading import saved_model_kind
from .config import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    DEFAULT_CONFIGS,
    TrainingConfig,
    load_config,
    parse_value,
    read_config_file,
)

__all__ = ["build_parser", "command_option", "parse_args", "parse_overrides", "resolve_config_path",
           "saved_model_defaults"]

_USAGE_EXAMPLES = """\
examples:
  python -m copynce_hf.training                                  # tiny default run on the bundled images
  python -m copynce_hf.training --config tiny_cpu.yaml --max_steps 20 --model.hidden_size 32
  python -m copynce_hf.training --dataset my_images --model_name_or_path copynce_hf/pretrained/descriptor \
      --output_dir outputs/my_descriptor                         # continue a saved model on your images
  accelerate launch --num_processes 8 -m copynce_hf.training --config configs/descriptor_vits16_224.yaml \\
      --dataset /data/disc21 --knn_graph /data/disc21/knn.safetensors --output_dir outputs/descriptor

Model configuration keys (CopyNCEDescriptorConfig / CopyNCEMatcherConfig: hidden_size, image_size,
descriptor_dim, copynce_weight, ...) are given as --model.<key> value. Values are YAML scalars
(1e-4, true, null, [1, 2]); a flag without a value is true.
"""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose mistakes raise :class:`ConfigError` instead of exiting."""

    def error(self, message: str):
        raise ConfigError(message)


def _metavar(field: dataclasses.Field) -> str:
    """The option's type as ``--help`` shows it: ``INT``, ``FLOAT|null``, ``MAPPING`` ..."""
    kinds = [part.strip() for part in str(field.type).split("|")]
    names = {"dict": "MAPPING", "None": "null"}
    return "|".join(names.get(kind, kind.upper()) for kind in kinds)


def _reader(field: dataclasses.Field):
    """A string -> value function for ``field``: a YAML value; a number given to a text option stays text
    (``--push_to_hub 123``, a dataset called ``2024``)."""
    text_option = str(field.type) in ("str", "str | None")

    def read(text: str) -> Any:
        try:
            value = parse_value(field.name, text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text if text_option and isinstance(value, (int, float)) else value

    read.__name__ = field.name
    return read


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m copynce_hf.training``: ``--config`` and one option per configuration field.

    Options not given are absent from the parsed namespace (their values come from the YAML file or
    the field's default); ``--model.<key>`` options are left over for :func:`parse_overrides`.
    """
    parser = _Parser(
        prog="python -m copynce_hf.training", usage="%(prog)s [--config YAML] [--key value ...] [--model.<key> value ...]",
        allow_abbrev=False, argument_default=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_USAGE_EXAMPLES,
        description="Train a CopyNCE descriptor or matcher with Accelerate (options: a YAML file and --key value).")
    parser.add_argument("--config", metavar="YAML", help=(
        f"a YAML configuration: a path, or the name of a shipped one in {CONFIG_DIR.name}/ "
        f"(default: {DEFAULT_CONFIG.name})"))
    for field in dataclasses.fields(TrainingConfig):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        flags = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
        bare_flag = {"nargs": "?", "const": True} if "bool" in str(field.type) else {}
        help_text = f"{field.metadata['help']} (default: {'null' if default is None else default})"
        parser.add_argument(*flags, dest=field.name, type=_reader(field), metavar=_metavar(field),
                            help=help_text.replace("%", "%%"), **bare_flag)
    return parser


def _model_overrides(arguments: list[str]) -> dict[str, Any]:
    """``["--model.hidden_size", "64", "--model.image_size=32"]`` -> ``{"hidden_size": 64, "image_size": 32}``."""
    overrides: dict[str, Any] = {}
    items = list(arguments)
    while items:
        flag = items.pop(0)
        if not flag.startswith("--"):
            raise ConfigError(f"unexpected argument {flag!r}: options are --key value")
        key, _, inline = flag[2:].partition("=")
        if not key.startswith("model.") or key == "model.":
            known = ", ".join(field.name for field in dataclasses.fields(TrainingConfig))
            raise ConfigError(f"unknown configuration key {key!r}; known keys: {known}")
        if inline:
            text = inline
        elif items and not items[0].startswith("--"):
            text = items.pop(0)
        else:
            text = "true"
        overrides[key.split(".", 1)[1]] = parse_value(key, text)
    return overrides


def _parse(arguments: list[str]) -> tuple[str | None, dict[str, Any]]:
    """``(the --config value or None, the overrides)`` of a command line."""
    namespace, rest = build_parser().parse_known_args(list(arguments))
    overrides = vars(namespace)
    config = overrides.pop("config", None)
    model = _model_overrides(rest)
    if model:
        overrides["model"] = {**(overrides.get("model") or {}), **model}
    return config, overrides


def parse_overrides(arguments: list[str]) -> dict[str, Any]:
    """``["--key", "value", "--model.hidden_size", "64"]`` -> ``{"key": value, "model": {"hidden_size": 64}}``."""
    config, overrides = _parse(arguments)
    if config is not None:
        raise ConfigError("--config names the YAML file of a run; it is not a configuration key")
    return overrides


def resolve_config_path(name: str | Path) -> Path:
    """The YAML file ``--config`` names: a path, or the name of a configuration shipped in :data:`CONFIG_DIR`
    (so that a regular install finds ``tiny_cpu.yaml`` too)."""
    path = Path(name)
    shipped = CONFIG_DIR / path
    if not path.is_file() and path.name == str(name) and shipped.is_file():
        return shipped
    return path


def parse_args(argv: list[str]) -> TrainingConfig:
    """The checked configuration of a command line: ``--config`` (default :data:`DEFAULT_CONFIG`, or
    :func:`saved_model_defaults` with ``--model_name_or_path``) and overrides."""
    config, overrides = _parse(argv)
    if config is None and overrides.get("model_name_or_path"):
        return load_config(None, {**saved_model_defaults(overrides), **overrides})
    return load_config(DEFAULT_CONFIG if config is None else resolve_config_path(config), overrides)


#: The learning rate of a run without ``--config`` that continues a saved model: a tenth of the tiny fresh run's.
#: Continuing the shipped descriptor for 100 steps of 8 pairs on 60 photos of the train split lowered its muAP on
#: 100 held-out ones (0.958) to 0.822 at 1e-3, 0.924 at 3e-4 and 0.938 at 1e-4 (one draw, docs/training.md).
CONTINUATION_LEARNING_RATE = 1e-4


def saved_model_defaults(overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings a command line without ``--config`` that starts from a saved model gets from its defaults:
    the tiny configuration of the model's kind (:data:`DEFAULT_CONFIGS`) without that file's ``model`` keys,
    which describe a fresh model (the architecture is the folder's, see :mod:`.model`), with
    :data:`CONTINUATION_LEARNING_RATE`, and ``model_type``, the folder's kind unless the command line gives one."""
    kind = overrides.get("model_type") or saved_model_kind(overrides["model_name_or_path"])
    values = read_config_file(DEFAULT_CONFIGS.get(kind, DEFAULT_CONFIG))
    values.pop("model", None)
    values.update(model_type=kind, learning_rate=CONTINUATION_LEARNING_RATE)
    return values


def command_option(command: str, name: str) -> str | None:
    """The value of ``--name`` in a recorded training command line (``run.json`` of ``python -m
    benchmarks.training``; the last one wins, as argparse does), or None where the command does not set it."""
    words = shlex.split(command)
    value = None
    for index, word in enumerate(words[:-1]):
        if word == f"--{name}":
            value = words[index + 1]
    return value
