"""PCA whitening of descriptors, learned from sample images of the target collection.

SSCD's post-processing advice: descriptors of a new collection are centred on the collection's mean and
whitened (their covariance made the identity) before the cosine is taken, so that directions all images
share stop dominating the similarity. With ``x`` a descriptor (D,), ``mu`` the sample mean (D,) and
``C = U diag(lambda) U^T`` the sample covariance, the whitened descriptor is

    w(x) = normalise(diag(lambda_1..d)^(-1/2) U_1..d^T (x - mu))

keeping the ``d <= D`` directions of largest variance (dimension reduction when ``d < D``), then
L2-normalised so that inner products stay cosines. A :class:`Whitening` is stored with the index it was
applied to (``whitening.safetensors``), so that queries searched in that index get the same transform.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from ...modeling.errors import ConfigError, PredictionsError
from ...outputs import give_default_mode

WHITENING_FORMAT = "copynce-whitening"

#: A kept direction whose variance is below this share of the largest is degenerate (the sample does not span it).
_DEGENERATE_VARIANCE = 1e-6


@dataclass
class Whitening:
    """Centering + PCA whitening + L2 normalisation (see the module docstring).

    Attributes:
        mean: (D,) float32, the sample mean ``mu``.
        projection: (D, d) float32, ``U_1..d diag(lambda_1..d)^(-1/2)``: ``w(x) = normalise((x - mu) @ projection)``.
        samples: how many sample descriptors it was learned from.
    """

    mean: np.ndarray
    projection: np.ndarray
    samples: int

    def __post_init__(self) -> None:
        self.mean = np.ascontiguousarray(self.mean, dtype=np.float32).reshape(-1)
        self.projection = np.ascontiguousarray(self.projection, dtype=np.float32)
        if self.projection.ndim != 2 or self.projection.shape[0] != self.mean.shape[0]:
            raise PredictionsError(f"a whitening projection of shape {self.projection.shape} does not fit a mean "
                                   f"of {self.mean.shape[0]} dimensions")

    @property
    def input_dim(self) -> int:
        return int(self.projection.shape[0])

    @property
    def dim(self) -> int:
        """``d``, the dimension of whitened descriptors."""
        return int(self.projection.shape[1])

    @classmethod
    def fit(cls, descriptors: np.ndarray, dim: int | None = None) -> Whitening:
        """Learn the transform from sample descriptors.

        Args:
            descriptors: (N, D) sample descriptors (e.g. of images of the collection, never of its queries'
                ground truth).
            dim: ``d``, directions kept (``None``: all ``D``).

        Raises:
            ConfigError: fewer than ``d + 1`` samples (the covariance of N samples has rank N - 1 at most), a
                ``dim`` outside 1..D, or a sample that does not span ``d`` directions (e.g. repeated images).
        """
        vectors = np.asarray(descriptors, dtype=np.float64)
        if vectors.ndim != 2:
            raise ConfigError(f"whitening needs (N, D) sample descriptors, got shape {vectors.shape}")
        count, input_dim = vectors.shape
        dim = input_dim if dim is None else int(dim)
        if not 1 <= dim <= input_dim:
            raise ConfigError(f"the whitened dimension must be between 1 and the descriptor dimension {input_dim}, "
                              f"got {dim}")
        if count < dim + 1:
            raise ConfigError(f"whitening to {dim} dimensions needs at least {dim + 1} sample images, got {count}; "
                              f"give more sample images or a smaller whitened dimension")
        mean = vectors.mean(axis=0)
        centred = vectors - mean
        covariance = centred.T @ centred / (count - 1)
        variances, directions = np.linalg.eigh(covariance)  # ascending
        order = np.argsort(variances)[::-1][:dim]
        variances, directions = variances[order], directions[:, order]
        if variances[-1] <= _DEGENERATE_VARIANCE * max(variances[0], 1e-30):
            spanned = int((variances > _DEGENERATE_VARIANCE * max(variances[0], 1e-30)).sum())
            raise ConfigError(f"the descriptors of the {count} sample images vary in only {spanned} of the {dim} "
                              f"whitened directions (the model's descriptors span fewer, or the images are "
                              f"near-identical); use a whitened dimension of at most {spanned}")
        return cls(mean, directions / np.sqrt(variances), count)

    def whiten(self, descriptors: np.ndarray, normalise: bool = True) -> np.ndarray:
        """``w(x)`` of every row: (N, D) -> (N, d) float32, L2-normalised unless ``normalise`` is false."""
        vectors = np.asarray(descriptors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.input_dim:
            raise PredictionsError(f"descriptors of shape {vectors.shape} do not fit a whitening learned on "
                                   f"{self.input_dim}-d descriptors")
        whitened = (vectors - self.mean) @ self.projection
        if normalise:
            whitened /= np.maximum(np.linalg.norm(whitened, axis=1, keepdims=True), 1e-12)
        return np.ascontiguousarray(whitened, dtype=np.float32)

    def fingerprint(self) -> str:
        """A short hash of the transform (cache identities change when it does)."""
        digest = hashlib.sha1(self.mean.tobytes())
        digest.update(self.projection.tobytes())
        return digest.hexdigest()[:16]

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``mean`` and ``projection`` to one safetensors file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"mean": self.mean, "projection": self.projection}, str(path),
                  metadata={"format": WHITENING_FORMAT, "samples": str(self.samples)})
        give_default_mode(path)  # safetensors writes 0600
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Whitening:
        """Read a file written by :meth:`save`; a damaged or foreign file is a :class:`PredictionsError` naming it."""
        path = Path(path)
        try:
            with safe_open(str(path), framework="numpy") as handle:
                metadata = handle.metadata() or {}
            tensors = load_file(str(path))
            if metadata.get("format") != WHITENING_FORMAT or {"mean", "projection"} - set(tensors):
                raise ValueError(f"no {WHITENING_FORMAT!r} metadata")
            return cls(tensors["mean"], tensors["projection"], int(metadata.get("samples", 0)))
        except (SafetensorError, OSError, ValueError) as error:
            raise PredictionsError(f"whitening file {os.fspath(path)!r} cannot be read ({error}); "
                                   f"build the index again") from None
