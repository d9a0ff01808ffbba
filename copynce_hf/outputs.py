"""Output paths: checked before any work, written atomically.

Every command of the package that writes results follows the same two rules, so that a
wrong path costs nothing and a failure (bad input, Ctrl-C, a killed process) at any point
leaves the previous output as it was:

1. :func:`check_output_file` / :func:`check_output_folder` run before models are loaded or
   images read. They refuse an existing folder where a file is expected and the reverse, a
   parent that is a file, and a place that cannot be written (tried with a real temporary
   file, so that read-only file systems are caught whoever runs the command). An existing file
   is replaced only when it is of the kind the command writes (:class:`OwnFile`: a calibration, a
   predictions CSV); any other file at an output path is refused, not overwritten.
2. :class:`StagedFile` / :class:`StagedFolder` write into a hidden temporary file or folder
   beside the target and move the result into place with :func:`os.replace` (atomic on one
   file system) only when everything was written. Existing outputs are replaced only then;
   files of an output folder that the command does not write are left alone.

Files moved into place get the mode a plain ``open()`` gives (``0o666`` less the umask, 0644
usually): some writers (safetensors) create theirs readable by the owner only (0600), which
would make a shared model or index folder unreadable to others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .modeling.errors import CopyNCEError


class OutputPathError(CopyNCEError):
    """An output path cannot be used: wrong kind (file / folder), parent not a folder, not writable."""


def _nearest_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _probe_writable(folder: Path, target: Path, option: str) -> None:
    """Create and remove a temporary file in ``folder``: the only test that holds for every user."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".copynce-write-test-"):
            pass
    except OSError as error:
        raise OutputPathError(
            f"{option} {os.fspath(target)!r}: the folder {os.fspath(folder)!r} is not writable "
            f"({error.strerror or error})"
        ) from error


def _check_parent(path: Path, option: str) -> None:
    existing = _nearest_existing(path.parent if path.parent != Path("") else Path("."))
    if not existing.is_dir():
        raise OutputPathError(
            f"{option} {os.fspath(path)!r}: {os.fspath(existing)!r} is a file, so no folder can be created under it"
        )
    _probe_writable(existing, path, option)


@dataclasses.dataclass(frozen=True)
class OwnFile:
    """A kind of file a command writes, so that an existing one may be rewritten and any other file is refused.

    Attributes:
        description: what it is, for the refusal ("a calibration file written by `copynce calibrate`").
        recognise: ``path -> bool``: whether the existing file at ``path`` is one (reads its first bytes; never
            raises for an unreadable file, it is simply not one).
    """

    description: str
    recognise: Callable[[Path], bool]


def first_bytes(path: Path, size: int = 65536) -> bytes:
    """Up to ``size`` bytes from the start of ``path`` (empty when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


def check_output_file(path: str | os.PathLike, option: str = "--output", own: OwnFile | None = None) -> Path:
    """Check that ``path`` can receive a file (an existing file there is replaced at the end).

    Raises :class:`OutputPathError` when ``path`` is an existing folder, a parent is a file, the
    nearest existing parent folder cannot be written, or (with ``own``) ``path`` is an existing file
    that ``own`` does not recognise: a file the command did not write is never overwritten (an empty one
    holds nothing to lose and may be).
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{option} {os.fspath(path)!r} is an existing folder; a file path is expected here")
    if str(path).endswith(os.sep):
        raise OutputPathError(f"{option} {os.fspath(path)!r} ends with a folder separator; a file path is expected")
    if own is not None and path.is_file() and path.stat().st_size and not own.recognise(path):
        raise OutputPathError(f"{option} {os.fspath(path)!r} is an existing file that is not {own.description}; "
                              "it is not overwritten: choose another path or remove it")
    _check_parent(path, option)
    return path


def check_output_folder(path: str | os.PathLike, option: str = "--output",
                        inputs: Mapping[str, str | os.PathLike | None] | None = None) -> Path:
    """Check that ``path`` can be (or already is) an output folder.

    Raises :class:`OutputPathError` when ``path`` is an existing file, a parent is a file, the
    folder (or the nearest existing parent) cannot be written, or it is (inside) one of the image
    folders ``inputs`` (what the folder is, e.g. ``"query folder"`` -> its path; ``None``: not given):
    a later run would list the outputs among that folder's images (with ``--recursive``, read its
    gallery's images as inputs), so it is refused before any work.
    """
    path = Path(path)
    for name, folder in (inputs or {}).items():
        if folder is not None and path.resolve().is_relative_to(Path(folder).resolve()):
            where = "is" if path.resolve() == Path(folder).resolve() else "is inside"
            raise OutputPathError(
                f"{option} {os.fspath(path)!r} {where} the {name} {os.fspath(folder)!r}: a later run would take "
                f"it for a sub-folder of images (and read its images with --recursive); choose an output folder "
                f"outside {os.fspath(folder)!r}")
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{option} {os.fspath(path)!r} is an existing file; a folder is expected here")
    if path.is_dir():
        _probe_writable(path, path, option)
    else:
        _check_parent(path, option)
    return path


def _umask() -> int:
    """The process umask, read without changing it where ``/proc`` tells it (no window where it is 0)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_default_mode(path: str | os.PathLike) -> None:
    """Set the mode of ``path`` (a file, or every file under a folder) to the one ``open()`` gives a new
    file: ``0o666`` less the umask."""
    path = Path(path)
    mode = 0o666 & ~_umask()
    for file in [path] if path.is_file() else (item for item in path.rglob("*") if item.is_file()):
        os.chmod(file, mode)


def _staging_name(path: Path) -> str:
    return f".{path.name}.partial-{os.getpid()}"


class StagedFile:
    """``with StagedFile(path) as temporary: write(temporary)``: ``path`` is replaced on success only.

    The temporary file is ``.<name>.partial-<pid><suffix>`` beside ``path`` (same suffix, so that
    writers choosing the format by extension still work); it is removed on failure.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.temporary = self.path.with_name(_staging_name(self.path) + self.path.suffix)

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return self.temporary

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            give_default_mode(self.temporary)
            os.replace(self.temporary, self.path)
        else:
            self.temporary.unlink(missing_ok=True)


class StagedFolder:
    """``with StagedFolder(path) as staging: write files into staging``: moved into ``path`` on success.

    ``staging`` is an empty hidden folder beside ``path``. On success each file written there
    replaces the file of the same name in ``path`` (created if needed); other files of ``path``
    are kept. On failure the staging folder is deleted and ``path`` is untouched.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.staging = self.path.with_name(_staging_name(self.path))

    def __enter__(self) -> Path:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        return self.staging

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if exc_type is None:
                self.path.mkdir(parents=True, exist_ok=True)
                give_default_mode(self.staging)
                for item in sorted(self.staging.rglob("*")):
                    if item.is_file():
                        target = self.path / item.relative_to(self.staging)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(item, target)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)


@contextlib.contextmanager
def run_folder(folder: str | os.PathLike, results: tuple[str, ...]):
    """Make the output folder of a run (yielded as a :class:`~pathlib.Path`). Where an input is refused during the
    run (a :class:`CopyNCEError`) before any of ``results`` (file names) is written and this run made the folder,
    the folder is removed: a refused run leaves no empty folder or half-built caches. A folder that existed
    before (a rerun, resumed from its caches) is kept as it is."""
    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except CopyNCEError:
        if made and not any((folder / name).exists() for name in results):
            shutil.rmtree(folder, ignore_errors=True)
        raise

