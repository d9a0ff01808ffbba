"""Exception types of copynce_hf.

Every error the package raises on bad input derives from :class:`CopyNCEError`, so
callers can catch the package's own refusals without catching programming errors.
Messages name the offending file, field or value.
"""


class CopyNCEError(Exception):
    """Base class of the package's input errors."""


class ImageLoadError(CopyNCEError):
    """An image file cannot be used: missing, truncated, corrupt, too large or too small."""


class EditParameterError(CopyNCEError, ValueError):
    """An edit was constructed with a parameter outside its valid range."""


class TableError(CopyNCEError, ValueError):
    """Coordinate tables of incompatible shapes or sources were combined."""


class ConfigError(CopyNCEError, ValueError):
    """A configuration key is unknown or holds an invalid value."""


class PredictionsError(CopyNCEError, ValueError):
    """A predictions or descriptor file is malformed: missing columns, duplicate pairs, bad values."""
