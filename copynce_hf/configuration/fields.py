"""Settings dataclasses whose fields declare their command-line option, and the options built from them.

A field made by :func:`setting` carries its help text in ``metadata["help"]`` (as ``transformers.TrainingArguments``
and :class:`copynce_hf.training.config.TrainingConfig` do) and its option in ``metadata["option"]`` (an
:class:`Option`: flag, parser type, choices, metavar, argparse action). A field made by :func:`nested` holds another
settings dataclass whose fields add their own options (the collection normalisation that ``detect`` and ``dedup``
share). From these:

* :func:`add_options` adds the options of a dataclass's fields to a parser (or an argument group), with the field's
  default or the values of named presets at the end of each help text;
* :func:`given_options` reads their values back from the parsed namespace, by option name;
* :func:`build` makes the dataclass from values named by option (nested settings included).

So an option's name, type, default and help are written once, on the field of the settings it sets::

    @dataclasses.dataclass
    class Settings:
        grouping: str = setting("representative", "how pairs join groups", choices=("representative", "connected"))

    add_options(parser, Settings)                  # --grouping {representative,connected} ... (default representative)
    build(Settings, given_options(Settings, parser.parse_args(argv)))

Nothing heavy is imported here: building a parser from settings loads no torch, transformers or faiss.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

# --------------------------------------------------------------------------- parser types


def positive_int(text: str) -> int:
    """An option's whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An option's whole number of at least 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An option's finite number of at least 0."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0, got {text}")
    return value


def on_off(text: str) -> bool:
    """``on`` / ``off`` as ``True`` / ``False``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


# --------------------------------------------------------------------------- declaring fields


@dataclasses.dataclass(frozen=True)
class Option:
    """The command-line option of one settings field.

    Attributes:
        flag: ``--name`` (``None``: ``--`` and the field name with dashes); a name without dashes is a positional
            argument.
        type: the parser of its text (``None``: a string).
        choices, metavar: as ``argparse.add_argument``'s.
        action: ``store_true`` or ``argparse.BooleanOptionalAction`` for a switch (``None``: a value).
        nargs: as ``argparse.add_argument``'s (an option of a field without default is ``required``).
        default_text: the end of its help in place of ``(default ...)`` (``""``: nothing).
        preset_notes: preset name -> words after that preset's value in the help (:func:`add_options`).
    """

    flag: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence | None = None
    metavar: str | None = None
    action: Any = None
    nargs: str | None = None
    default_text: str | None = None
    preset_notes: Mapping[str, str] = dataclasses.field(default_factory=dict)


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            **option: Any) -> Any:
    """A settings field with its help text and its command-line option (``option``: the fields of :class:`Option`)."""
    metadata = {"help": help, "option": Option(**option)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def setting_like(settings: type, name: str, default: Any = dataclasses.MISSING, help: str | None = None,
                 **option: Any) -> Any:
    """A field declared as the field ``name`` of ``settings`` (its help, option and default), with the ``default``,
    ``help`` and :class:`Option` fields given changed: an option several settings share is written once."""
    spec = next(spec for spec in dataclasses.fields(settings) if spec.name == name)
    metadata = {"help": spec.metadata["help"] if help is None else help,
                "option": dataclasses.replace(spec.metadata["option"], **option)}
    if default is dataclasses.MISSING and spec.default is dataclasses.MISSING:
        return dataclasses.field(default_factory=spec.default_factory, metadata=metadata)
    return dataclasses.field(default=spec.default if default is dataclasses.MISSING else default, metadata=metadata)


def nested(factory: Callable[[], Any]) -> Any:
    """A field holding settings of their own (a dataclass of :func:`setting` fields): their options are its options,
    with the defaults of ``factory()``."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True})


def _flag(spec: dataclasses.Field) -> str:
    return spec.metadata["option"].flag or "--" + spec.name.replace("_", "-")


def _dest(spec: dataclasses.Field) -> str:
    """The name of a field's value in a parsed namespace and in :func:`build`'s values: its option's name with
    underscores (``--collection-k-end`` -> ``collection_k_end``), else the field's name."""
    return _flag(spec).lstrip("-").replace("-", "_") if "option" in spec.metadata else spec.name


def _default(spec: dataclasses.Field) -> Any:
    """A field's default (``None`` for a field without one: a required option)."""
    if spec.default is dataclasses.MISSING:
        return None if spec.default_factory is dataclasses.MISSING else spec.default_factory()
    return spec.default


def _option_fields(settings: type, names: Sequence[str] | None = None) -> Iterator[dataclasses.Field]:
    """The fields of ``settings`` that have options (a :func:`setting` or :func:`nested` field), those of ``names``
    in their order (all in declaration order without ``names``)."""
    fields = {spec.name: spec for spec in dataclasses.fields(settings)
              if "option" in spec.metadata or "nested" in spec.metadata}
    for name in names if names is not None else fields:
        if name not in fields:
            raise KeyError(f"{settings.__name__} has no field {name!r} with a command-line option")
        yield fields[name]


def option_dests(settings: type, names: Sequence[str] | None = None) -> list[str]:
    """The namespace names of the options of ``settings`` (:func:`_dest`), nested settings' included."""
    found = []
    for spec in _option_fields(settings, names):
        found += option_dests(type(_default(spec))) if "nested" in spec.metadata else [_dest(spec)]
    return found


# --------------------------------------------------------------------------- options from fields


def _value_text(value: Any) -> str:
    """A default as help texts write it: ``on``/``off``, ``1`` for ``1.0``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _presets_text(dest: str, presets: Mapping[str, Mapping[str, Any]], notes: Mapping[str, str]) -> str:
    """``(default V)`` for one preset, ``(presets: V)`` where they agree, else ``(fast: V, paper: W)``."""
    values = {name: _value_text(preset[dest]) + (f", {notes[name]}" if name in notes else "")
              for name, preset in presets.items()}
    if len(values) == 1:
        return f"(default {next(iter(values.values()))})"
    if len(set(values.values())) == 1 and not notes:
        return f"(presets: {next(iter(values.values()))})"
    return "(" + ("; " if notes else ", ").join(f"{name}: {value}" for name, value in values.items()) + ")"


def _help(spec: dataclasses.Field, default: Any, presets: Mapping[str, Mapping[str, Any]] | None) -> str:
    option, dest = spec.metadata["option"], _dest(spec)
    if option.default_text is not None:
        tail = option.default_text
    elif presets and all(dest in preset for preset in presets.values()):
        tail = _presets_text(dest, presets, option.preset_notes)
    else:
        tail = "" if default is None else f"(default {_value_text(default)})"
    return (spec.metadata["help"] + (" " + tail if tail else "")).replace("%", "%%")


def add_options(parser, settings: type, names: Sequence[str] | None = None, *,
                presets: Mapping[str, Mapping[str, Any]] | None = None, base: Any = None) -> None:
    """Add the options of the fields of ``settings`` (those of ``names``, in their order; nested settings add theirs).

    Args:
        parser: an ``argparse`` parser or argument group.
        settings: a dataclass of :func:`setting` and :func:`nested` fields.
        names: the fields whose options are added (``None``: all).
        presets: preset name -> its values by option name: the options default to ``None`` (an option not given
            leaves the preset's value; :func:`given_options`), their help ends with the presets' values.
        base: an instance whose values are the defaults (``None``: the fields' defaults).
    """
    for spec in _option_fields(settings, names):
        default = getattr(base, spec.name) if base is not None else _default(spec)
        if "nested" in spec.metadata:
            add_options(parser, type(default), presets=presets, base=default)
            continue
        option = spec.metadata["option"]
        kwargs = {"action": option.action} if option.action is not None else {
            name: value for name, value in (("type", option.type), ("choices", option.choices),
                                            ("metavar", option.metavar), ("nargs", option.nargs)) if value is not None}
        if _flag(spec).startswith("-"):
            required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            kwargs.update(dest=_dest(spec), **({"required": True} if required else {}))
        parser.add_argument(_flag(spec), default=None if presets else default, help=_help(spec, default, presets),
                            **kwargs)


# --------------------------------------------------------------------------- settings from options


def given_options(settings: type, namespace, names: Sequence[str] | None = None) -> dict[str, Any]:
    """Option name -> value of the options of ``settings`` (those of ``names``) given in a parsed ``namespace``: those
    left ``None`` (not given, where :func:`add_options` had presets) are left out, but for a field without default (a
    positional argument left out is ``None``)."""
    values = vars(namespace)
    needed = {_dest(spec) for spec in _option_fields(settings, names) if "option" in spec.metadata
              and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING}
    return {dest: values.get(dest) for dest in option_dests(settings, names)
            if values.get(dest) is not None or dest in needed}


def build(settings: type, values: Mapping[str, Any], base: Any = None, /, **fields: Any) -> Any:
    """``settings`` made from ``values`` (option name -> value; a field without option by its name) and ``fields``
    (field name -> value); the fields given neither keep ``base``'s values, else their defaults. A nested settings
    field is made from the values of its own options over its default. The first three are positional only: a field
    may be named ``settings`` (``DedupRequest.settings``)."""
    kwargs = {}
    for spec in dataclasses.fields(settings):
        if spec.name in fields:
            kwargs[spec.name] = fields[spec.name]
        elif "nested" in spec.metadata:
            inner = getattr(base, spec.name) if base is not None else _default(spec)
            if any(dest in values for dest in option_dests(type(inner))):
                kwargs[spec.name] = build(type(inner), values, inner)
        elif _dest(spec) in values:
            kwargs[spec.name] = values[_dest(spec)]
    return dataclasses.replace(base, **kwargs) if base is not None else settings(**kwargs)
