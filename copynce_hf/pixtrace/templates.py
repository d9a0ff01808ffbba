"""Templates: what unrelated images share in real collections (an app frame, a meme band, a background photo,
a text-and-emoji overlay), drawn once and put around many images, traced.

Beyond the paper: the paper's pairs never show a model two images that share a template without sharing
content, so a model trained on them learns that a frame means a copy. A :class:`Template` is drawn once per
group of images (:meth:`TemplateRecipe.draw`) and put around each of them with :meth:`Template.apply`; the
template's own pixels map to nowhere in every table, so the CopyNCE prior of two templated images counts only
the content they share (none for two different images, exactly what is left for two copies of one).

Kinds (:data:`TEMPLATE_KINDS`):

* ``frame``: a procedural app frame (:mod:`.edits.frames`: feed post, chat, story), the image fitted into its
  photo box (aspect kept);
* ``meme``: a caption band of one colour above the image (:class:`~.edits.MemeFormat`), its text the group's;
* ``background``: the image fitted into a box of a background photo (another image of the collection, or a
  procedural gradient when none is given);
* ``overlay``: the same text and emoji drawn over every image (:class:`~.edits.OverlayText`,
  :class:`~.edits.OverlayEmoji`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from PIL import Image

from ..modeling.errors import ConfigError
from .edits.base import Edit
from .edits.compositing import PasteIntoBox
from .edits.frames import FRAME_STYLES, frame_layout
from .edits.geometric import MemeFormat
from .edits.occluding import OverlayEmoji, OverlayText, emoji_names
from .edits.sources import image_size, resolve_image
from .table import CoordinateTable

#: The template kinds, see the module docstring.
TEMPLATE_KINDS = ("frame", "meme", "background", "overlay")

#: The longest side of a frame or background canvas (larger images are shrunk into it).
MAX_CANVAS_SIDE = 1024

_CAPTIONS = ("when you see it", "me on monday", "nobody:", "this is fine", "POV: you found it", "true story",
             "wait for it", "every single time", "can't unsee", "the best day", "mood", "my plans vs reality")
#: The fonts of the meme templates' captions (AugLy's bundled fonts).
TEMPLATE_FONTS = ("Impact.ttf", "IBMPlexSans-Bold.ttf", "Montserrat-Black.ttf", "OpenSans-Bold.ttf")

#: ``pick(rng) -> (image id, image)``: a background photo for the ``background`` kind (None: none available).
BackgroundPicker = Callable[[np.random.Generator], "tuple[str, Image.Image] | None"]


@dataclasses.dataclass(frozen=True)
class Template:
    """One template, drawn once and put around any number of images.

    Attributes:
        kind: one of :data:`TEMPLATE_KINDS`.
        params: the kind's parameters (JSON-able; a ``background`` names its photo by an image spec, e.g.
            ``{"kind": "pool", "id": ...}`` for an image of the training data).
        background: the background photo itself when ``params`` names it by id (not serialised).
    """

    kind: str
    params: Mapping[str, Any]
    background: Image.Image | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in TEMPLATE_KINDS:
            raise ConfigError(f"template kind {self.kind!r} is not one of {TEMPLATE_KINDS}")

    def edits(self, size: tuple[int, int]) -> list[Edit]:
        """The traced edits that put an image of ``size`` = (H, W) into this template."""
        params = self.params
        if self.kind == "meme":
            band = max(11, round(params["band"] * size[1]))
            return [MemeFormat(text=params["text"], caption_height=band, text_color=tuple(params["text_color"]),
                               bg_color=tuple(params["bg_color"]))]
        if self.kind == "overlay":
            return [OverlayText(text=params["text"], font=params["font"], font_size=params["font_size"],
                                color=tuple(params["color"]), x=params["x"], y=params["y"]),
                    OverlayEmoji(emoji=params["emoji"], size=params["emoji_size"], x=params["emoji_x"],
                                 y=params["emoji_y"], form="authors")]
        if self.kind == "frame":
            layout = frame_layout(params["style"], params["seed"])
            canvas = _canvas_size(size, layout.box, layout.aspect)
            spec = {"kind": "frame", "style": params["style"], "seed": params["seed"], "size": list(canvas)}
            return [_fitted_paste(size, spec, canvas, layout.box)]
        background = self.background if self.background is not None else params["image"]
        bg_h, bg_w = image_size(background)
        canvas = _canvas_size(size, params["box"], bg_h / bg_w)
        return [_fitted_paste(size, background, canvas, params["box"])]

    def apply(self, image: Image.Image, table: CoordinateTable | None = None) -> tuple[Image.Image, CoordinateTable]:
        """``image`` (RGB) put into the template, and its table (``table`` followed through the template's edits;
        the identity of ``image`` when ``None``). The template's pixels are untraced."""
        image = image if image.mode == "RGB" else image.convert("RGB")
        table = table if table is not None else CoordinateTable.identity(image.height, image.width)
        for edit in self.edits((image.height, image.width)):
            image, table = edit(image, table)
        return image, table

    def edit_dicts(self, size: tuple[int, int]) -> list[dict]:
        """:meth:`edits` as ``Edit.to_dict()`` records (a background named by id stays named by id)."""
        records = []
        for edit in self.edits(size):
            record = edit.to_dict()
            if self.kind == "background" and self.background is not None:
                record["params"]["background"] = dict(self.params["image"])
            records.append(record)
        return records

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], background: Image.Image | None = None) -> Template:
        return cls(data["kind"], dict(data["params"]), background)


def _canvas_size(size: tuple[int, int], box: tuple[float, float, float, float], aspect: float) -> tuple[int, int]:
    """(H, W) of a canvas of ``aspect`` (H / W) whose relative ``box`` (top, left, height, width) holds an image of
    ``size`` at its own scale in its limiting side, no side over :data:`MAX_CANVAS_SIDE`."""
    height, width = size
    canvas_w = max(width / box[3], height / (box[2] * aspect))
    canvas_w = min(canvas_w, MAX_CANVAS_SIDE, MAX_CANVAS_SIDE / aspect)
    return max(2, math.ceil(canvas_w * aspect)), max(2, math.ceil(canvas_w))


def _fitted_paste(size: tuple[int, int], background, canvas: tuple[int, int],
                  box: tuple[float, float, float, float]) -> PasteIntoBox:
    """The image of ``size`` fitted (aspect kept, centred) into the relative ``box`` of a ``canvas`` (H, W)."""
    height, width = size
    top, left = round(box[0] * canvas[0]), round(box[1] * canvas[1])
    room_h = min(canvas[0] - top, max(1, round(box[2] * canvas[0])))
    room_w = min(canvas[1] - left, max(1, round(box[3] * canvas[1])))
    scale = min(room_h / height, room_w / width)
    box_h, box_w = max(1, min(room_h, round(height * scale))), max(1, min(room_w, round(width * scale)))
    return PasteIntoBox(background=background, canvas_height=canvas[0], canvas_width=canvas[1],
                        left=left + (room_w - box_w) // 2, top=top + (room_h - box_h) // 2,
                        box_height=box_h, box_width=box_w)


@dataclasses.dataclass(frozen=True)
class TemplateRecipe:
    """How templates are drawn: the ``weights`` of each kind (a kind of weight 0 is never drawn).

    Every draw is a function of the generator only, so a group's template replays from its seed.
    """

    weights: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"frame": 0.35, "meme": 0.25, "background": 0.25, "overlay": 0.15})

    def __post_init__(self):
        unknown = sorted(set(self.weights) - set(TEMPLATE_KINDS))
        if unknown:
            raise ConfigError(f"template weights name unknown kinds {unknown}; use {TEMPLATE_KINDS}")
        if any(float(w) < 0 for w in self.weights.values()) or sum(map(float, self.weights.values())) <= 0:
            raise ConfigError(f"template weights must be >= 0 with a positive sum, got {dict(self.weights)}")

    def draw(self, rng: np.random.Generator, backgrounds: BackgroundPicker | None = None) -> Template:
        """One template: its kind by :attr:`weights`, then its parameters; a ``background`` takes its photo from
        ``backgrounds`` (a procedural gradient when ``None`` or when it has none)."""
        kinds = [kind for kind in TEMPLATE_KINDS if float(self.weights.get(kind, 0)) > 0]
        weights = np.array([float(self.weights[kind]) for kind in kinds])
        kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
        if kind == "frame":
            return Template(kind, {"style": str(rng.choice(FRAME_STYLES)), "seed": int(rng.integers(2**31 - 1))})
        if kind == "meme":
            light = bool(rng.random() < 0.7)
            return Template(kind, {"text": str(rng.choice(_CAPTIONS)), "band": float(rng.uniform(0.15, 0.35)),
                                   "text_color": [0, 0, 0] if light else [255, 255, 255],
                                   "bg_color": [255, 255, 255] if light else [int(v) for v in rng.integers(0, 80, 3)]})
        if kind == "overlay":
            return Template(kind, _overlay_params(rng))
        return _background_template(rng, backgrounds)


def _overlay_params(rng: np.random.Generator) -> dict[str, Any]:
    names = emoji_names()
    return {"text": str(rng.choice(_CAPTIONS)), "font": str(rng.choice(TEMPLATE_FONTS)),
            "font_size": float(rng.uniform(0.08, 0.16)), "color": [int(v) for v in rng.integers(0, 256, 3)],
            "x": float(rng.uniform(0.02, 0.3)), "y": float(rng.choice([rng.uniform(0.02, 0.15), rng.uniform(0.75, 0.85)])),
            "emoji": names[int(rng.integers(len(names)))], "emoji_size": float(rng.uniform(0.2, 0.35)),
            "emoji_x": float(rng.choice([0.0, 1.0])), "emoji_y": float(rng.uniform(0.0, 1.0))}


def _background_template(rng: np.random.Generator, backgrounds: BackgroundPicker | None) -> Template:
    box_h, box_w = float(rng.uniform(0.4, 0.7)), float(rng.uniform(0.4, 0.7))
    box = [float(rng.uniform(0.05, 0.95 - box_h)), float(rng.uniform(0.05, 0.95 - box_w)), box_h, box_w]
    picked = backgrounds(rng) if backgrounds is not None else None
    if picked is None:
        spec = {"kind": "gradient", "seed": int(rng.integers(2**31 - 1)), "size": [480, 640]}
        return Template("background", {"image": spec, "box": box})
    image_id, image = picked
    return Template("background", {"image": {"kind": "pool", "id": str(image_id)}, "box": box},
                    resolve_image(image))
