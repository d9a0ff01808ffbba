"""Images that edits need besides their input (backgrounds, overlays), as replayable specs.

An edit that pastes its input onto another image, or another image onto its input, takes
that image as a JSON-serialisable *spec*, so that a recorded list of edits stays replayable:

* ``{"kind": "file", "path": "..."}``: an image file (read with :func:`load_image`);
* ``{"kind": "noise", "seed": 3, "size": [h, w]}``: smooth random colour noise;
* ``{"kind": "gradient", "seed": 3, "size": [h, w]}``: a random two-colour linear gradient;
* ``{"kind": "solid", "color": [r, g, b], "size": [h, w]}``: a flat colour;
* ``{"kind": "frame", "style": "post", "seed": 3, "size": [h, w]}``: a procedural app frame
  (:mod:`.frames`: a feed post, a chat, a story) whose photo box is left empty;
* ``{"kind": "pool", "id": "T000123"}``: an image of a dataset named by its id (the training pairs'
  other-image pool, :class:`~copynce_hf.data.CopyPairMaker`); the image itself is not in the spec, so
  a list of edits holding one is rendered after :func:`bind_pool_images` puts the images in.

Callers that already hold a PIL image can pass it directly; it is then not serialisable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

from ...images import load_image
from ...modeling.errors import EditParameterError

ImageSpec = dict[str, Any]


def resolve_image(spec: ImageSpec | Image.Image) -> Image.Image:
    """Return the RGB PIL image an image spec describes (deterministic for a given spec)."""
    if isinstance(spec, Image.Image):
        return spec if spec.mode == "RGB" else spec.convert("RGB")
    if not isinstance(spec, dict) or "kind" not in spec:
        raise EditParameterError(f"an image spec must be a dict with a 'kind', got {spec!r}")
    kind = spec["kind"]
    if kind == "file":
        return load_image(spec["path"])
    if kind == "pool":
        raise EditParameterError(
            f"the image spec {spec!r} names an image of the training data by id; put the image in first with "
            "copynce_hf.pixtrace.bind_pool_images(edits, {id: image or path})")
    height, width = _spec_size(spec)
    if kind == "solid":
        color = tuple(int(c) for c in spec.get("color", (127, 127, 127)))
        return Image.new("RGB", (width, height), color)
    if kind == "frame":
        from .frames import draw_frame

        return draw_frame(str(spec.get("style", "post")), int(spec.get("seed", 0)), (height, width))
    if kind == "noise":
        return Image.fromarray(noise_grid(spec), "RGB").resize((width, height), Image.BICUBIC)
    if kind == "gradient":
        start, end, angle = gradient_parameters(spec)
        start, end = start.astype(np.float32), end.astype(np.float32)
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        t = xs * np.cos(angle) + ys * np.sin(angle)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        pixels = start + t[..., None] * (end - start)
        return Image.fromarray(np.clip(pixels + 0.5, 0, 255).astype(np.uint8), "RGB")
    raise EditParameterError(f"unknown image spec kind {kind!r}; use file, noise, gradient, solid or frame")


def bind_pool_images(edits: Sequence[dict[str, Any]], images: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``edits`` (a list of ``Edit.to_dict()``) with every ``{"kind": "pool", "id": ...}`` image spec
    replaced by ``images[id]`` (a PIL image or a path), ready for ``replay``.

    Raises :class:`EditParameterError` naming an id that ``images`` lacks.
    """
    bound = []
    for description in edits:
        params = dict(description.get("params", {}))
        for key, value in params.items():
            if isinstance(value, dict) and value.get("kind") == "pool":
                if value.get("id") not in images:
                    raise EditParameterError(f"{description.get('name')}: {key} names pool image {value.get('id')!r}, "
                                             f"which the images given ({len(images)}) do not hold")
                image = images[value["id"]]
                params[key] = image if isinstance(image, Image.Image) else {"kind": "file", "path": str(image)}
        bound.append({**description, "params": params})
    return bound


def is_procedural(spec: Any) -> bool:
    """Whether ``spec`` is a noise or gradient spec that states its size (an image drawn from a seed)."""
    return isinstance(spec, dict) and spec.get("kind") in ("gradient", "noise") and "size" in spec


def image_size(spec: ImageSpec | Image.Image) -> tuple[int, int]:
    """(H, W) of the image a spec describes: generated specs state it, files and PIL images are read."""
    if isinstance(spec, dict) and spec.get("kind") in ("gradient", "noise", "solid", "frame") and "size" in spec:
        return _spec_size(spec)
    image = resolve_image(spec)
    return image.height, image.width


def noise_grid(spec: ImageSpec) -> np.ndarray:
    """The seeded coarse grid (h // 16, w // 16, 3) uint8 (at least 2 x 2) a noise spec's image is a
    bicubic enlargement of."""
    height, width = _spec_size(spec)
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    return rng.integers(0, 256, size=(max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8)


def gradient_parameters(spec: ImageSpec) -> tuple[np.ndarray, np.ndarray, float]:
    """The seeded ``(start colour (3,), end colour (3,), angle in radians)`` of a gradient spec: the
    colour runs linearly from ``start`` to ``end`` along the direction ``(cos angle, sin angle)``."""
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    start, end = rng.integers(0, 256, size=(2, 3))
    return start, end, float(rng.uniform(0, 2 * np.pi))


def _spec_size(spec: ImageSpec) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in spec["size"])
    except (KeyError, TypeError, ValueError) as error:
        raise EditParameterError(f"image spec {spec!r} needs 'size': [height, width]") from error
    if height < 1 or width < 1:
        raise EditParameterError(f"image spec size must be positive, got {spec['size']!r}")
    return height, width
