"""copynce_hf: CopyNCE image copy detection (ICCV 2025) for the Hugging Face ecosystem.

``import copynce_hf`` is light: it loads neither ``torch`` nor ``transformers``. The model classes
(``copynce_hf.CopyNCEDescriptorModel``, ...) are imported on first access, and the CopyNCE model
types are registered with ``AutoConfig``, ``AutoModel`` and ``AutoImageProcessor`` as soon as
``transformers``' Auto classes are imported (``from transformers import AutoModel``), the
``image-copy-detection`` pipeline task as soon as ``transformers.pipelines`` is (``from
transformers import pipeline``). PixTrace, the data pipeline, retrieval and training live in
subpackages (``copynce_hf.pixtrace``, ``copynce_hf.data``, ...).
"""

from __future__ import annotations

import importlib

from . import _registration
from .modeling.errors import ConfigError, CopyNCEError, EditParameterError, ImageLoadError, TableError

__version__ = "0.1.0.dev0"

_MODELING = (
    "CopyNCEDescriptorConfig",
    "CopyNCEDescriptorModel",
    "CopyNCEDescriptorOutput",
    "CopyNCEImageProcessor",
    "CopyNCEMatcherConfig",
    "CopyNCEMatcherModel",
    "CopyNCEMatcherOutput",
    "CopyNCEViTConfig",
    "CopyNCEViTModel",
)

__all__ = [
    "ConfigError",
    "CopyNCEError",
    "EditParameterError",
    "ImageLoadError",
    "TableError",
    "__version__",
    *_MODELING,
]


def __getattr__(name: str):
    if name in _MODELING:
        value = getattr(importlib.import_module(".modeling", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


_registration.install()
