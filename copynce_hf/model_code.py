"""The modelling code that the shipped model folders carry, kept identical to ``copynce_hf/modeling/``.

A model folder written by ``save_pretrained`` holds, beside its weights, the ``.py`` files of
``copynce_hf/modeling/`` that its model, configuration, image processor and pipeline need (Hub
custom code, loaded with ``trust_remote_code=True`` where copynce_hf is not installed). The folders
shipped with this repository (:func:`shipped_model_folders`) hold real copies of those files, so
that ``cp -r`` of a folder, a wheel or a Hub upload carries working code; after any change to
``copynce_hf/modeling/`` the copies are brought up to date with::

    make sync-model-code                  # or: python -m copynce_hf.model_code
    python -m copynce_hf.model_code --check   # exit 1 and list the stale files, change nothing

``tests/test_model_code.py`` fails while a copy differs from its source.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .modeling.errors import ConfigError

__all__ = [
    "MODEL_CODE_DIR",
    "model_code_files",
    "shipped_model_folders",
    "stale_model_code",
    "sync_model_code",
]

_PACKAGE_DIR = Path(__file__).resolve().parent
MODEL_CODE_DIR = _PACKAGE_DIR / "modeling"
"""The package's modelling code: the source of every copy."""

#: The modules ``save_pretrained`` starts from (model, configuration, image processor, pipeline);
#: each brings the siblings it imports relatively.
_ENTRY_MODULES = ("modeling_copynce.py", "configuration_copynce.py", "image_processing_copynce.py",
                  "pipeline_copynce.py")


def model_code_files() -> list[Path]:
    """The files of ``copynce_hf/modeling/`` a saved model folder carries, sorted by name: the entry
    modules and everything they import relatively (as ``transformers``' ``custom_object_save`` finds it)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    files = set()
    for name in _ENTRY_MODULES:
        files.update(Path(path).resolve() for path in get_relative_import_files(str(MODEL_CODE_DIR / name)))
        files.add((MODEL_CODE_DIR / name).resolve())
    return sorted(files, key=lambda path: path.name)


def shipped_model_folders() -> list[Path]:
    """The model folders shipped with the package (``copynce_hf/pretrained/*``) and, in a source checkout,
    the repository's comparison checkpoint (``benchmarks/checkpoints/baseline-descriptor``)."""
    candidates = sorted((_PACKAGE_DIR / "pretrained").glob("*/config.json"))
    candidates.append(_PACKAGE_DIR.parent / "benchmarks" / "checkpoints" / "baseline-descriptor" / "config.json")
    return [path.parent for path in candidates if path.is_file()]


def stale_model_code(folder: str | os.PathLike) -> list[str]:
    """What differs between ``folder``'s ``.py`` files and the package's code, one line per file
    (empty when the folder carries exact, real copies of :func:`model_code_files` and nothing else)."""
    folder = Path(folder)
    expected = {path.name: path for path in model_code_files()}
    problems = []
    for name, source in expected.items():
        copy = folder / name
        if copy.is_symlink():
            problems.append(f"{copy}: a link, not a file (a copied folder would lose it)")
        elif not copy.is_file():
            problems.append(f"{copy}: missing")
        elif copy.read_bytes() != source.read_bytes():
            problems.append(f"{copy}: differs from {source}")
    for copy in sorted(folder.glob("*.py")):
        if copy.name not in expected:
            problems.append(f"{copy}: not part of the modelling code any more")
    return problems


def _write_copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file in the same folder (mode 0644)."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(source.read_bytes())
        os.chmod(temporary, 0o644)
        if target.is_symlink():
            target.unlink()
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def sync_model_code(folder: str | os.PathLike) -> list[str]:
    """Make ``folder``'s ``.py`` files exact copies of :func:`model_code_files`: links are replaced by
    files, differing and missing files rewritten, files no longer part of the code removed.

    Returns:
        The names of the files written or removed (empty when the folder was up to date).
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} is not a model folder (no config.json)")
    expected = {path.name: path for path in model_code_files()}
    changed = []
    for name, source in expected.items():
        copy = folder / name
        if copy.is_symlink() or not copy.is_file() or copy.read_bytes() != source.read_bytes():
            _write_copy(source, copy)
            changed.append(name)
    for copy in sorted(folder.glob("*.py")):
        if copy.name not in expected:
            copy.unlink()
            changed.append(copy.name)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m copynce_hf.model_code",
        description="Copy copynce_hf/modeling/ into the shipped model folders (the code they carry).")
    parser.add_argument("folders", nargs="*", type=Path,
                        help="model folders (default: the shipped ones: " +
                             ", ".join(str(f.relative_to(_PACKAGE_DIR.parent)) for f in shipped_model_folders()) + ")")
    parser.add_argument("--check", action="store_true", help="only list the stale files; exit 1 if there are any")
    args = parser.parse_args(argv)
    folders = args.folders or shipped_model_folders()
    if args.check:
        problems = [line for folder in folders for line in stale_model_code(folder)]
        print("\n".join(problems) if problems else f"{len(folders)} model folders carry the current code")
        return 1 if problems else 0
    for folder in folders:
        try:
            changed = sync_model_code(folder)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"{folder}: {'updated ' + ', '.join(changed) if changed else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
