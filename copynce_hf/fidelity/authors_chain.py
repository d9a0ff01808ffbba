"""The authors' whole training augmentation, run end to end with every draw recorded (the chain oracle's worker).

Runs in the data oracle's environment (:mod:`.authors_augmentation` imports their modules): their
``LyakaapAugmentation`` is built from their descriptor or matcher configuration, exactly as their dataset
builds it, and called on an image with their generators (``torch``, ``random``, ``numpy``) seeded. Nothing of
their chain is replaced; each of its operations is wrapped, in the containers that hold it, by a recorder
that notes what the operation drew and did, so that this package can replay the copy with the same
parameters (:mod:`.chain_oracle`). What is recorded per operation (an *event*, in the order they ran):

* the configs their geometric classes return (their ``MaskMapper`` input), and the other images their pastes
  open;
* for the classes that return none: the parameters they drew (colour jitter's order and factors, the AugLy
  operations' chosen values or the one-of member that ran, the text and stroke their overlays drew through
  ``ImageDraw``, the emoji's draws of Python's ``random``, the Bezier control points of their smearing, the
  random-erasing box, the albumentations operation's name);
* whether it changed the image.

Their ``RandomOverlayText`` calls ``FreeTypeFont.getsize``, which Pillow removed in version 10; where it is
missing it is given Pillow 9.3's definition (their pinned version), on the present font layout.
"""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ["ChainRecorder", "convention_free", "instrument", "jsonable", "pillow_93_getsize", "run_chain_case",
           "seed_generators"]


def jsonable(value):
    """Their configs as JSON: enums by name, arrays as lists."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if hasattr(value, "name") and hasattr(value, "value") and not isinstance(value, (int, float, str)):
        return value.name
    return value


def seed_generators(seed: int) -> None:
    """Seed the three generators their augmentation draws from."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def pillow_93_getsize(self, text, direction=None, features=None, language=None, stroke_width=0):
    """Pillow 9.3's ``FreeTypeFont.getsize``: the layout's width, and its height from the ascender line."""
    size, offset = self.font.getsize(text, "L", direction, features, language)
    return size[0] + stroke_width * 2, size[1] + stroke_width * 2 + offset[1]


class ChainRecorder:
    """The events of one chain; ``current`` is the event of the operation running (None between them)."""

    def __init__(self):
        self.events: list[dict] = []
        self.current: dict | None = None
        self.tensor_input: Image.Image | None = None

    def note(self, key: str, value) -> None:
        """Append ``value`` to the running event's list ``key`` (nothing between operations)."""
        if self.current is not None:
            self.current.setdefault(key, []).append(value)


class _Recorded:
    """A leaf operation of their chain, called as their containers call it, with its event recorded."""

    def __init__(self, operation, name: str, recorder: ChainRecorder):
        self.operation, self.name, self.recorder = operation, name, recorder

    def __call__(self, image, *args, **kwargs):
        outer = self.recorder.current
        size = [image.shape[-1], image.shape[-2]] if isinstance(image, torch.Tensor) else list(image.size)
        event = {"op": self.name, "size": size}  # (W, H) of the image (or tensor) the operation gets
        self.recorder.current = event
        try:
            output = self.operation(image, *args, **kwargs)
        finally:
            self.recorder.current = outer
        edited, configs = output if isinstance(output, tuple) else (output, [])
        event["changed"] = edited is not image
        event["configs"] = list(configs)
        chosen = getattr(self.operation, "chosen_value", None)
        if event["changed"] and chosen is not None:  # AugLy's random-range operations
            event["value"] = float(chosen)
        (outer.setdefault("inner", []) if outer is not None else self.recorder.events).append(event)
        return output


class _LoggedRandom:
    """Python's ``random`` module as their overlay module calls it: the same draws, each also noted."""

    def __init__(self, recorder: ChainRecorder):
        self.recorder = recorder

    def __getattr__(self, name):
        function = getattr(random, name)
        if not callable(function):
            return function

        def logged(*args, **kwargs):
            value = function(*args, **kwargs)
            self.recorder.note("draws", [name, plain(value)])
            return value

        return logged


def plain(value):
    """``value`` as JSON: NumPy and torch numbers as numbers, sequences as lists, enums and other objects (their
    ``Font``, a filter) by name."""
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return getattr(value, "name", type(value).__name__)


class _DrawProxy:
    """``ImageDraw.Draw(image)`` of their overlay module: draws as it does, noting each text and line drawn."""

    def __init__(self, draw, recorder: ChainRecorder):
        self._draw, self._recorder = draw, recorder

    def text(self, xy, text, fill=None, font=None, **kwargs):
        self._recorder.note("text", {"xy": plain(xy), "text": text, "fill": plain(fill), "pixels": font.size})
        return self._draw.text(xy, text, fill=fill, font=font, **kwargs)

    def line(self, xy, fill=None, width=0, **kwargs):
        self._recorder.note("line", {"fill": plain(fill), "width": int(width)})
        return self._draw.line(xy, fill=fill, width=width, **kwargs)

    def __getattr__(self, name):
        return getattr(self._draw, name)


def _module_proxy(module, recorder: ChainRecorder, **replaced) -> types.SimpleNamespace:
    """``module``'s attributes with ``replaced`` ones (each given the recorder)."""
    names = {name: getattr(module, name) for name in dir(module) if not name.startswith("__")}
    names.update({name: function(recorder) for name, function in replaced.items()})
    return types.SimpleNamespace(**names)


def _opening(recorder: ChainRecorder):
    def open_image(file, *args, **kwargs):
        recorder.note("opened", str(getattr(file, "name", file)))
        return Image.open(file, *args, **kwargs)

    return open_image


def _drawing(recorder: ChainRecorder):
    from PIL import ImageDraw

    return lambda image, *args, **kwargs: _DrawProxy(ImageDraw.Draw(image, *args, **kwargs), recorder)


def _recording_method(owner, name: str, key: str, recorder: ChainRecorder, describe=lambda result, *a, **k: result):
    """Replace ``owner.name`` (an instance attribute shadows the class's) by a call that also notes
    ``describe(result, *args, **kwargs)`` under ``key`` of the running event."""
    original = getattr(owner, name)

    def recorded(*args, **kwargs):
        value = original(*args, **kwargs)
        recorder.note(key, plain(describe(value, *args, **kwargs)))
        return value

    setattr(owner, name, recorded)


def _wrap_all(container, names: list[str], recorder: ChainRecorder) -> None:
    """Wrap the operations held in ``container.transforms`` (a list or tuple) by recorders named ``names``."""
    held = container.transforms
    wrapped = [_Recorded(operation, name, recorder) for operation, name in zip(held, names)]
    container.transforms = type(held)(wrapped) if isinstance(held, tuple) else wrapped


class _TensorInput:
    """Their ``ToTensor``, keeping the image it converts (the copy before random erasing)."""

    def __init__(self, to_tensor, recorder: ChainRecorder):
        self.to_tensor, self.recorder = to_tensor, recorder

    def __call__(self, image):
        self.recorder.tensor_input = image
        return self.to_tensor(image)


def _naming(name: str):
    return lambda *args, **kwargs: name


def instrument(augmentation, code, recorder: ChainRecorder) -> None:
    """Wrap every operation of their ``LyakaapAugmentation`` (built from their configuration) by a recorder.

    Their structure (``lyakaap_augmentations.py``): ``Compose([Shuffle([crop, geometric, appearance, additional]),
    post_process])``, crop ``RandomApply(RandomChoice([random resized crop, onto other, other onto]))``, geometric
    ``Compose([hflip, vflip, RandomApply(RandomChoice([perspective, affine]))])``, appearance ``Shuffle`` of ten,
    additional ``AlbumentationsTransform(A.OneOf([...]))``, post-process ``Compose([RandomApply(padding), Resize,
    ToTensor, RandomErasing, Normalize])``."""
    groups, post = augmentation.traditional_transforms.transforms
    crop, geometric, appearance, additional = groups.transforms
    _wrap_all(crop.transforms[0], ["random_resized_crop", "onto_other_image", "other_image_onto"], recorder)
    _wrap_all(geometric.transforms[2].transforms[0], ["perspective", "affine"], recorder)
    _wrap_all(geometric, ["hflip", "vflip", "linear"], recorder)
    operations = appearance.transforms
    _recording_method(operations[0], "get_params", "jitter", recorder)  # torchvision ColorJitter's order, factors
    jpeg, edge = operations[3], operations[8]  # AugLy OneOf of EncodingQuality, of their RandomEdgeEnhance
    _wrap_all(jpeg, [f"jpeg:{member.quality}" for member in jpeg.transforms], recorder)
    _wrap_all(edge, [f"edge:{plain(member.mode)}" for member in edge.transforms], recorder)
    _recording_method(operations[9], "get_bezier_curve", "bezier", recorder,
                      lambda result, points, segments=100: {"points": points, "segments": segments})
    _recording_method(operations[6]._fonts, "random_font", "font", recorder)
    _wrap_all(appearance, ["color_jitter", "pixelization", "shuffle_pixels", "jpeg", "grayscale", "blur", "text",
                           "emoji", "edge_enhance", "smearing"], recorder)
    for member in additional.transform.transforms:  # albumentations 1.3.1 calls self.apply_with_params
        _recording_method(member, "apply_with_params", "albumentation", recorder, _naming(type(member).__name__))
    _wrap_all(groups, ["crop", "geometric", "appearance", "additional"], recorder)
    padding, resize, to_tensor, erasing, normalize = post.transforms
    _recording_method(erasing, "get_params", "erasing", recorder,  # the box, and the range of its values
                      lambda result, *a, **k: [*result[:4], float(result[4].min()), float(result[4].max())])
    post.transforms = [_Recorded(padding, "padding", recorder), _Recorded(resize, "resize", recorder),
                       _TensorInput(to_tensor, recorder), _Recorded(erasing, "random_erasing", recorder), normalize]
    code.overlay.random = _LoggedRandom(recorder)
    code.overlay.Image = _module_proxy(Image, recorder, open=_opening)
    code.overlay.ImageDraw = _module_proxy(__import__("PIL.ImageDraw").ImageDraw, recorder, Draw=_drawing)


_BUILT: dict[str, object] = {}
#: One recorder for every chain of the worker: the overlay module's generators and drawing are patched once for all.
_RECORDER = ChainRecorder()


def _chain(code, authors_code: Path, kind: str, others: list[str]):
    """Their ``LyakaapAugmentation`` of the ``kind`` configuration, built once per kind as their
    ``build_transforms`` builds it (``background_paths``: ``others``) and instrumented for :data:`_RECORDER`."""
    if kind not in _BUILT:
        from core.data.augmentation import lyakaap_augmentations
        from omegaconf import OmegaConf
        from PIL import ImageFont

        if not hasattr(ImageFont.FreeTypeFont, "getsize"):  # removed in Pillow 10: their pinned 9.3's
            ImageFont.FreeTypeFont.getsize = pillow_93_getsize
        name = {"descriptor": "descriptor", "matcher": "matching"}[kind]
        config = OmegaConf.load(authors_code / "core" / "configs" / f"{name}_default_config.yaml")
        augmentation = lyakaap_augmentations.LyakaapAugmentation(config.input, background_paths=list(others))
        instrument(augmentation, code, _RECORDER)
        _BUILT[kind] = augmentation
    return _BUILT[kind]


def run_chain_case(code, authors_code: Path, case: dict, folder: Path) -> None:
    """One chain: their augmentation of ``case["image"]`` with their generators seeded with ``case["seed"]``;
    writes the copy before random erasing (``<id>.png``), their ``MaskMapper``'s map of the whole chain to the
    image and the same map without its conventions (:func:`convention_free`; ``<id>.npy``: (2, 2, H, W)) and the
    events and configs (``<id>.json``)."""
    augmentation, recorder = _chain(code, authors_code, case["op"].split(":", 1)[1], case["others"]), _RECORDER
    if list(augmentation.background_paths) != list(case["others"]):
        raise ValueError("every chain case of a configuration must name the same other images")
    image = Image.open(case["image"]).convert("RGB")
    recorder.events, recorder.current, recorder.tensor_input = [], None, None
    seed_generators(case["seed"])
    tensor, configs = augmentation(image)
    mapping = code.MaskMapper(image.size)(configs)
    exact = convention_free(code.MaskMapper)(image.size)(configs)
    recorder.tensor_input.save(folder / f"{case['id']}.png")
    np.save(folder / f"{case['id']}.npy", np.stack([mapping, exact]).astype(np.float64))
    record = {"op": case["op"], "events": jsonable(recorder.events), "configs": jsonable(configs),
              "output": [float(tensor.min()), float(tensor.max())]}
    (folder / f"{case['id']}.json").write_text(json.dumps(record))


def _traced(mapping: np.ndarray) -> np.ndarray:
    """bool (h, w): the pixels of a map (2, h, w) with a position (their ``MaskMapper`` writes -1 in both channels
    where none; a position continued beyond the image's first pixel centre may be negative)."""
    return ~(mapping == -1).all(0)


def _extrapolated(mapping: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, traced) of the map (2, h, w) with one more row and column on each side, where each pixel without a
    position next to a traced region is given the position continued linearly from the two nearest traced pixels
    (rows first, then columns): a position up to half a pixel beyond a traced pixel's centre is still in its area."""
    out = np.pad(mapping.astype(np.float64), ((0, 0), (1, 1), (1, 1)), constant_values=-1.0)
    traced = np.pad(_traced(mapping), 1, constant_values=False)
    for axis in (1, 2):
        for step in (1, -1):
            near, far = np.roll(out, step, axis), np.roll(out, 2 * step, axis)
            fill = ~traced & np.roll(traced, step, axis - 1) & np.roll(traced, 2 * step, axis - 1)
            edge = [slice(None)] * 2  # rolled-in pixels from the other side are not neighbours
            edge[axis - 1] = slice(0, 2) if step == 1 else slice(-2, None)
            fill[tuple(edge)] = False
            out[:, fill] = (2 * near - far)[:, fill]
            traced = traced | fill
    return out, traced


def _sample_map(mapping: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(2, ...) positions of the map (2, h, w) (-1 where none) at float ``rows``, ``cols`` (index coordinates):
    linear interpolation between the neighbours that have a position (continued linearly half a pixel beyond a
    traced region), none where the nearest pixel has none or lies outside."""
    height, width = mapping.shape[1:]
    near_r, near_c = np.floor(rows + 0.5).astype(int), np.floor(cols + 0.5).astype(int)
    inside = (near_r >= 0) & (near_r < height) & (near_c >= 0) & (near_c < width)
    valid = _traced(mapping)
    padded, padded_valid = _extrapolated(mapping)
    top, left = np.floor(rows).astype(int) + 1, np.floor(cols).astype(int) + 1  # in the padded map
    total, weights = np.zeros((2,) + rows.shape), np.zeros(rows.shape)
    for dr, dc in ((0, 0), (0, 1), (1, 0), (1, 1)):
        r, c = top + dr, left + dc
        weight = (1 - np.abs(rows + 1 - r)) * (1 - np.abs(cols + 1 - c))
        ok = (r >= 0) & (r < height + 2) & (c >= 0) & (c < width + 2)
        ok[ok] &= padded_valid[r[ok], c[ok]]
        weight = np.where(ok, weight, 0.0)
        total += weight * padded[:, np.clip(r, 0, height + 1), np.clip(c, 0, width + 1)]
        weights += weight
    out = -np.ones((2,) + rows.shape)
    keep = inside & (weights > 0)
    keep[keep] &= valid[near_r[keep], near_c[keep]]
    out[:, keep] = total[:, keep] / weights[keep]
    return out


def _half_pixel(matrix: np.ndarray) -> np.ndarray:
    """A warp given in Pillow's area coordinates, as a map of pixel indices: ``T(-1/2) M T(1/2)``."""
    shift = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return np.linalg.inv(shift) @ matrix @ shift


def convention_free(mask_mapper: type) -> type:
    """Their ``MaskMapper`` with its three conventions removed, for the check that PixTrace's tables are their
    maps but for those conventions: resizes sample the map at each output pixel's centre (no nearest index, no
    rounding), warps sample it at the exact inverse position (no truncation, linear between neighbours), and
    their affine and perspective matrices, which the pixels apply in Pillow's area coordinates, are moved by
    half a pixel to pixel indices (their flips' matrices are already in indices)."""

    class ConventionFree(mask_mapper):
        def resize(self, params, aug_to_src=None):
            mapping = self.aug_to_src if aug_to_src is None else aug_to_src
            height, width = mapping.shape[1:]
            rows = (np.arange(params["h"]) + 0.5) * height / params["h"] - 0.5
            cols = (np.arange(params["w"]) + 0.5) * width / params["w"] - 0.5
            self.aug_to_src = _sample_map(mapping, *np.meshgrid(rows, cols, indexing="ij"))
            return self.aug_to_src

        def _warp(self, matrix, aug_to_src=None):
            mapping = self.aug_to_src if aug_to_src is None else aug_to_src
            height, width = mapping.shape[1:]
            rows, cols = np.meshgrid(np.arange(height, dtype=float), np.arange(width, dtype=float), indexing="ij")
            source = np.linalg.inv(matrix) @ np.stack([cols.ravel(), rows.ravel(), np.ones(cols.size)])
            source = source[:2] / source[2]
            self.aug_to_src = _sample_map(mapping, source[1].reshape(height, width), source[0].reshape(height, width))
            return self.aug_to_src

        def flip(self, params, aug_to_src=None):
            return self._warp(np.asarray(params["matrix"], dtype=float), aug_to_src)

        def affine(self, params, aug_to_src=None):
            return self._warp(_half_pixel(np.asarray(params["matrix"], dtype=float)), aug_to_src)

        def perspective(self, params, aug_to_src=None):
            return self._warp(_half_pixel(np.asarray(params["matrix"], dtype=float)), aug_to_src)

    return ConventionFree
