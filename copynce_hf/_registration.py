"""Deferred registration with ``transformers``: Auto classes and the ``image-copy-detection`` pipeline task.

``import copynce_hf`` must not load ``torch`` or ``transformers`` (the command line starts in
well under a second), yet after it ``AutoModel.from_pretrained`` must know the CopyNCE model
types and ``pipeline("image-copy-detection", ...)`` the task. So the registrations run when
``transformers``' Auto classes (or ``transformers.pipelines``) are first imported, or at once if
they already were. An import hook (:class:`_RegisterAfterImport`) watches the modules involved
and retries after each of them finishes loading; a registration waits while any module it
needs is still half-imported (an import nested in another import).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

_AUTO = ("transformers.models.auto", "transformers.models.auto.configuration_auto",
         "transformers.models.auto.modeling_auto", "transformers.models.auto.image_processing_auto",
         "transformers.models.auto.video_processing_auto")
_PIPELINES = "transformers.pipelines"
#: Modules the registrations import: none may be half-imported when they run.
_NEEDED = _AUTO + (
    "transformers", _PIPELINES, "transformers.activations", "transformers.configuration_utils",
    "transformers.image_processing_backends", "transformers.image_processing_utils",
    "transformers.image_utils", "transformers.initialization", "transformers.modeling_layers",
    "transformers.modeling_outputs", "transformers.modeling_utils", "copynce_hf.modeling",
    "copynce_hf.modeling.configuration_copynce", "copynce_hf.modeling.convert_dino", "copynce_hf.modeling.errors",
    "copynce_hf.modeling.image_processing_copynce", "copynce_hf.modeling.losses_copynce",
    "copynce_hf.modeling.modeling_copynce", "copynce_hf.modeling.pipeline_copynce", "copynce_hf.pipelines",
)
_done = {"auto": False, "pipeline": False}


def _loaded(name: str, finished: str | None = None) -> bool:
    """Whether module ``name`` is fully imported (``finished``: the module whose loading just ended,
    which the import system still marks as initialising)."""
    module = sys.modules.get(name)
    return module is not None and (name == finished
                                   or not getattr(getattr(module, "__spec__", None), "_initializing", False))


def register_when_ready(finished: str | None = None) -> None:
    """Run the registrations whose ``transformers`` side is loaded, unless an import is half done."""
    if any(name in sys.modules and not _loaded(name, finished) for name in _NEEDED):
        return
    try:
        if not _done["auto"] and any(_loaded(name, finished) for name in _AUTO):
            _done["auto"] = True
            from .modeling import register_auto_classes

            register_auto_classes()
        if not _done["pipeline"] and _loaded(_PIPELINES, finished):
            _done["pipeline"] = True
            from . import pipelines  # noqa: F401  (registers the task on import)
    except Exception as error:  # never break the user's import of transformers
        warnings.warn(f"copynce_hf could not register its classes with transformers: {error!r}", stacklevel=2)
    if all(_done.values()) and _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Calls :func:`register_when_ready` after each watched module finishes loading."""

    def __init__(self):
        self._finding: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _NEEDED or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            register_when_ready(name)

        spec.loader.exec_module = exec_module
        return spec


_HOOK = _RegisterAfterImport()


def install() -> None:
    """Register now what can be, and watch the imports for the rest."""
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
    register_when_ready()
