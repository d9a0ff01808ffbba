"""What a saved model folder (or Hub id) holds, read from its ``config.json`` before the model is built: its
kind, so that a run from it trains a model of that kind (``model_name_or_path`` without ``model_type``)."""

from __future__ import annotations

from pathlib import Path

from transformers import PretrainedConfig

from ..modeling.errors import ConfigError

__all__ = ["saved_config_dict", "saved_model_kind"]


def saved_config_dict(name_or_path: str) -> dict:
    """The ``config.json`` of a saved model folder or Hub id, as a dict."""
    text = str(name_or_path)
    if not Path(text).is_dir() and (Path(text).is_absolute() or text.startswith(".") or text.count("/") != 1):
        raise ConfigError(f"invalid configuration value model_name_or_path={text!r}: no such model folder")
    if Path(text).is_dir() and not (Path(text) / "config.json").is_file():
        raise ConfigError(f"invalid configuration value model_name_or_path={text!r}: the folder holds no "
                          "config.json (a model folder written by save_pretrained is expected)")
    try:
        values, _ = PretrainedConfig.get_config_dict(text)
    except (OSError, ValueError) as error:  # no such folder, no config.json, offline, not a repository id
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = "" if Path(text).exists() else "no such model folder, and as a Hub id "
        raise ConfigError(f"invalid configuration value model_name_or_path={text!r}: {where}cannot read its "
                          f"configuration ({reason})") from None
    return values


def saved_model_kind(name_or_path: str) -> str:
    """``"descriptor"`` or ``"matcher"``: the kind of the saved CopyNCE model ``name_or_path`` names."""
    model_type = str(saved_config_dict(name_or_path).get("model_type", ""))
    for kind in ("matcher", "descriptor"):
        if kind in model_type:
            return kind
    raise ConfigError(f"invalid configuration value model_name_or_path={name_or_path!r}: its model_type "
                      f"{model_type!r} is neither a CopyNCE descriptor nor a CopyNCE matcher")
