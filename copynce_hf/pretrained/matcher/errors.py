"""Exception types of copynce_hf.

Every error the package raises on bad input derives from :class:`CopyNCEError`, so
callers can catch the package's own refusals without catching programming errors.
Messages name the offending file, field or value.
"""


class CopyNCEError(Exception):
    """Base class of the package's input errors.

    The errors about values (configuration, shapes, edit parameters, tables, predictions) also
    derive from :class:`ValueError`, the type ``transformers`` code and its users catch.
    """


#: Reasons an image is skipped, in plain words (``ImageLoadError.reason``), in reporting order.
SKIP_REASONS = ("missing", "empty file", "not an image", "truncated", "too large", "too small", "unreadable")


class ImageLoadError(CopyNCEError):
    """An image file cannot be used: missing, empty, not an image, truncated, too large or too small.

    ``reason`` is the short plain-words category used when skipped files are counted
    (``"missing"``, ``"empty file"``, ``"not an image"``, ``"truncated"``, ``"too large"``,
    ``"too small"``, ``"unreadable"`` for anything else).
    """

    def __init__(self, message: str, reason: str = "unreadable"):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # keep the reason when the error crosses a process boundary
        return type(self), (str(self), self.reason)


#: Smallest accepted image side in pixels: one ViT patch (every image input, the pipeline's included).
MIN_IMAGE_SIDE = 16


def empty_image_error(name: str) -> ImageLoadError:
    """The policy's refusal of a 0-byte image file ``name``."""
    return ImageLoadError(f"image {name} is an empty file (0 bytes)", "empty file")


def small_image_error(name: str, width: int, height: int, min_side: int = MIN_IMAGE_SIDE) -> ImageLoadError:
    """The policy's refusal of an image ``name`` whose shorter side is below ``min_side``."""
    return ImageLoadError(f"image {name} is too small: {width}x{height}, minimum {min_side} pixels per side",
                          "too small")


class EditParameterError(CopyNCEError, ValueError):
    """An edit was constructed with a parameter outside its valid range."""


class TableError(CopyNCEError, ValueError):
    """Coordinate tables of incompatible shapes or sources were combined."""


class ShapeError(CopyNCEError, ValueError):
    """Tensors of the wrong shape were passed (the message gives the shapes found and expected)."""


class ConfigError(CopyNCEError, ValueError):
    """A configuration key is unknown or holds an invalid value."""


class PredictionsError(CopyNCEError, ValueError):
    """A predictions or descriptor file is malformed: missing columns, duplicate pairs, bad values."""


#: The ``transformers`` this modelling code is written for (as setup.py requires it).
TRANSFORMERS_REQUIREMENT = "transformers>=5.24,<6"


def transformers_too_old(error: ImportError) -> ImportError:
    """The error to raise when a ``transformers`` 5 module is missing: it names the installed version and
    the requirement (a model folder's code, loaded with ``trust_remote_code=True``, may meet a 4.x)."""
    import transformers

    return ImportError(f"the CopyNCE modelling code needs {TRANSFORMERS_REQUIREMENT}, but transformers "
                       f"{transformers.__version__} is installed ({error}); upgrade it: "
                       f"pip install '{TRANSFORMERS_REQUIREMENT}'")
