"""copynce_hf: CopyNCE image copy detection (ICCV 2025) for the Hugging Face ecosystem.

``import copynce_hf`` registers the CopyNCE models with ``AutoConfig``, ``AutoModel`` and
``AutoImageProcessor``. It loads ``torch`` and ``transformers`` but not PixTrace, the data
pipeline or the training code (import ``copynce_hf.pixtrace``, ``copynce_hf.data``, ... for those).
"""

from . import pipelines  # noqa: F401,E402  (registers the "image-copy-detection" pipeline task)
from .errors import ConfigError, CopyNCEError, EditParameterError, ImageLoadError, TableError
from .modeling import (
    CopyNCEDescriptorConfig,
    CopyNCEDescriptorModel,
    CopyNCEDescriptorOutput,
    CopyNCEImageProcessor,
    CopyNCEMatcherConfig,
    CopyNCEMatcherModel,
    CopyNCEMatcherOutput,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "ConfigError",
    "CopyNCEDescriptorConfig",
    "CopyNCEDescriptorModel",
    "CopyNCEDescriptorOutput",
    "CopyNCEError",
    "CopyNCEImageProcessor",
    "CopyNCEMatcherConfig",
    "CopyNCEMatcherModel",
    "CopyNCEMatcherOutput",
    "EditParameterError",
    "ImageLoadError",
    "TableError",
    "__version__",
]
