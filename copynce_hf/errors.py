"""Exception types of copynce_hf (see :mod:`copynce_hf.modeling.errors`).

They are defined inside the modelling package, which a saved model folder carries as Hub
custom code; this module is the package-level name for the same classes.
"""

from .modeling.errors import (  # noqa: F401
    SKIP_REASONS,
    ConfigError,
    CopyNCEError,
    EditParameterError,
    ImageLoadError,
    PredictionsError,
    TableError,
)

__all__ = ["SKIP_REASONS", "ConfigError", "CopyNCEError", "EditParameterError", "ImageLoadError",
           "PredictionsError", "TableError"]
