"""Settings dataclasses whose fields declare their options (:mod:`copynce_hf.configuration.fields`): the options
built from them, the help ends, and the settings read back, nested settings included."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from copynce_hf.configuration.fields import (
    add_options,
    build,
    given_options,
    nested,
    on_off,
    option_dests,
    positive_int,
    setting,
)


@dataclasses.dataclass(frozen=True)
class _Inner:
    on: bool = setting(False, "switch it", flag="--inner-switch", type=on_off, metavar="{on,off}")
    width: int = setting(3, "its width", flag="--inner-width", type=positive_int)


@dataclasses.dataclass
class _Outer:
    count: int = setting(2, "how many", type=positive_int)
    mode: str = setting("a", "which mode", choices=("a", "b"), preset_notes={"slow": "the careful one"})
    inner: _Inner = nested(lambda: _Inner(on=True))
    label: str | None = setting(None, "a label", default_text="(default: none)")
    hidden: int = 7  # no option


def _parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_options(parser, _Outer, **kwargs)
    return parser


def test_options_carry_the_fields_names_types_defaults_and_help():
    parser = _parser()
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    assert option_dests(_Outer) == ["count", "mode", "inner_switch", "inner_width", "label"] == [
        dest for dest in actions if dest != "help"]
    assert actions["count"].option_strings == ["--count"] and actions["count"].type is positive_int
    assert actions["mode"].choices == ("a", "b") and actions["mode"].help == "which mode (default a)"
    # a nested field's options default to its own default's values (here on, unlike _Inner's own default)
    assert actions["inner_switch"].default is True and actions["inner_switch"].help == "switch it (default on)"
    assert actions["label"].help == "a label (default: none)"
    args = parser.parse_args(["--count", "5", "--inner-width", "9"])
    assert build(_Outer, vars(args)) == _Outer(count=5, inner=_Inner(on=True, width=9))
    with pytest.raises(SystemExit):
        parser.parse_args(["--inner-switch", "yes"])
    with pytest.raises(KeyError, match="'hidden'"):
        add_options(argparse.ArgumentParser(), _Outer, ("hidden",))


def test_with_presets_an_option_not_given_leaves_the_presets_value():
    presets = {"fast": {"count": 2, "mode": "a"}, "slow": {"count": 2, "mode": "b"}}
    parser = _parser(presets=presets)
    actions = {action.dest: action for action in parser._actions}
    assert actions["count"].help == "how many (presets: 2)"
    assert actions["mode"].help == "which mode (fast: a; slow: b, the careful one)"
    assert actions["inner_width"].help == "its width (default 3)"  # no preset sets it: its own default
    assert {action.default for dest, action in actions.items() if dest != "help"} == {None}
    given = given_options(_Outer, parser.parse_args(["--mode", "b", "--inner-switch", "off"]))
    assert given == {"mode": "b", "inner_switch": False}
    # over a base: the given values replace its own, a nested one only in the fields given
    base = _Outer(count=4, inner=_Inner(on=True, width=6))
    assert build(_Outer, given, base) == _Outer(count=4, mode="b", inner=_Inner(on=False, width=6))
    assert build(_Outer, {"hidden": 1}, label="x") == _Outer(hidden=1, label="x")
    one = _parser(presets={"dedup": {"count": 9, "mode": "a"}})
    assert {a.dest: a for a in one._actions}["count"].help == "how many (default 9)"
