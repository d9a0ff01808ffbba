"""Run the authors' own augmentation classes on images, in their environment (the data oracle's worker).

``python -m copynce_hf.fidelity.authors_augmentation --authors-code DIR --request FILE --output DIR`` is
started by :mod:`copynce_hf.fidelity.data_oracle` with the Python of an environment that has the
authors' pinned albumentations 1.3.1 (and the libraries their augmentation imports; torchvision, timm and
kornia are given stand-ins when absent, :mod:`.standins`). It imports only their
``core/data/augmentation`` modules (``transforms_pt``, ``custom_transforms``, ``overlay``, ``mask_mapper``;
their package ``__init__`` files are not run), nothing of this package but the stand-ins, and for each
case of the request:

* seeds their random generators (``torch``, ``random``, ``numpy``) with the case's seed and runs one of
  their classes, built with their configuration's values (given in the request), on the case's image;
* ends with their final ``Resize`` to the model input (bicubic), as their ``post_process`` does;
* writes the edited image (``<id>.png``), their ``MaskMapper``'s map of it to the input image built from
  the configs their classes return, and the same map without its conventions
  (:func:`~.authors_chain.convention_free`) (``<id>.npy``: (2, 2, H, W), row and column of the source pixel,
  -1 where none), and the parameters they drew (``<id>.json``: the configs, and for the classes that return
  none the draws of their generators, recorded as they are made).

The request is JSON ``{"config": {...their augmentation section...}, "image_size": S, "cases": [{"id",
"op", "image", "other", "seed"}, ...]}``; ``op`` is one of :data:`OPERATIONS`, or ``albumentations:<Name>``
for one of their "additional" operations at albumentations' defaults (only the mean absolute change it makes
is written).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import types
from pathlib import Path

import numpy as np
from PIL import Image

from .authors_chain import convention_free, jsonable, seed_generators

__all__ = ["OPERATIONS", "main"]

#: The classes of theirs a case can run.
OPERATIONS = ("random_resized_crop", "affine", "perspective", "hflip", "vflip", "padding", "resize",
              "onto_other_image", "other_image_onto", "emoji", "color_jitter", "grayscale")


class _RecordedRandom:
    """Python's ``random`` module as their overlay code calls it (one seeded generator), recording what
    ``random()`` and ``choice()`` return (their emoji draws) without changing a draw."""

    def __init__(self, seed: int):
        self._generator = random.Random(seed)
        self.draws: list = []

    def random(self) -> float:
        value = self._generator.random()
        self.draws.append(value)
        return value

    def choice(self, sequence):
        value = self._generator.choice(sequence)
        self.draws.append(value)
        return value

    def __getattr__(self, name: str):
        return getattr(self._generator, name)


def _import_their_augmentation(directory: Path) -> types.SimpleNamespace:
    """Their augmentation modules, with stand-ins for absent torchvision, timm and kornia."""
    from copynce_hf.fidelity.standins import install_standins

    install_standins()
    sys.path.insert(0, str(directory))
    for package in ("core", "core.data", "core.data.augmentation"):  # their __init__ imports everything
        module = types.ModuleType(package)
        module.__path__ = [str(directory / package.replace(".", "/"))]
        sys.modules.setdefault(package, module)
    from core.data.augmentation import mask_mapper

    sys.modules["core.data.augmentation"].Augmentation = mask_mapper.Augmentation
    from core.data.augmentation import custom_transforms, overlay, transforms_pt

    return types.SimpleNamespace(transforms=transforms_pt, custom=custom_transforms, overlay=overlay,
                                 MaskMapper=mask_mapper.MaskMapper)


def _build(code, op: str, config: dict, size: int, other: str | None):
    """Their class for ``op``, with their configuration's values (as their ``lyakaap`` recipe builds it)."""
    bicubic = sys.modules["torchvision.transforms"].InterpolationMode.BICUBIC
    crop, geometric, post = config["crop_ops"], config["geo_ops"], config["post_process"]
    jitter = config["aug_ops"]["color_jitter"]
    if op == "random_resized_crop":
        rrc = crop["random_resized_crop"]
        return code.transforms.RandomResizedCrop((size, size), scale=rrc["scale"], ratio=rrc["ratio"],
                                                 interpolation=bicubic)
    if op == "affine":
        values = geometric["random_affine"]
        return code.custom.RandomAffine(degrees=values["degrees"], shear=values["shear"], interpolation=bicubic,
                                        rotation_affinity=values["rotation_affinity"])
    if op in ("onto_other_image", "other_image_onto"):
        values = crop["overlay_image_onto_the_other" if op == "onto_other_image" else "overlay_the_other_onto_image"]
        kind = code.overlay.OverlayImageOntoTheOther if op == "onto_other_image" else code.overlay.OverlayTheOtherOntoImage
        return kind(background_images_paths=[other], size=(size, size), scale=values["scale"], ratio=values["ratio"],
                    opacity=values["opacity"], p_scale=values["p_scale"], p_ratio=values["p_ratio"],
                    interpolation=bicubic)
    simple = {
        "perspective": lambda: code.transforms.RandomPerspective(interpolation=bicubic, p=1.0),
        "hflip": lambda: code.transforms.RandomHorizontalFlip(p=1.0),
        "vflip": lambda: code.transforms.RandomVerticalFlip(p=1.0),
        "padding": lambda: code.custom.RandomPadding(ratio=post["random_padding"]["ratio"],
                                                     fill=post["random_padding"]["fill"]),
        "resize": lambda: code.transforms.Resize((size, size), bicubic),
        "emoji": lambda: code.overlay.RandomOverlayEmoji(p=1.0),
        "color_jitter": lambda: code.transforms.ColorJitter(brightness=jitter["brightness"], contrast=jitter["contrast"],
                                                            saturation=jitter["saturation"], hue=jitter["hue"]),
        "grayscale": lambda: code.transforms.RandomGrayscale(p=1.0),
    }
    return simple[op]()


def _run_case(code, case: dict, config: dict, size: int, folder: Path) -> None:
    """One case: their class on the image, their final resize, the outputs written."""
    image = Image.open(case["image"]).convert("RGB")
    transform = _build(code, case["op"], config, size, case.get("other"))
    record = {"op": case["op"]}
    seed_generators(case["seed"])
    if case["op"] == "color_jitter":  # draws its order and factors without returning them: draw them first
        record["draws"] = jsonable(transform.get_params(transform.brightness, transform.contrast,
                                                         transform.saturation, transform.hue))
        seed_generators(case["seed"])
    if case["op"] == "emoji":
        recorder = _RecordedRandom(case["seed"])
        code.overlay.random = recorder
    output = transform(image)
    edited, configs = output if isinstance(output, tuple) else (output, [])
    if case["op"] == "emoji":
        code.overlay.random = random
        record["draws"] = [str(draw) if isinstance(draw, str) else draw for draw in recorder.draws]
    resized, resize_configs = _build(code, "resize", config, size, None)(edited.convert("RGB"))
    configs = list(configs) + list(resize_configs)
    mapping = code.MaskMapper(image.size)(configs)
    exact = convention_free(code.MaskMapper)(image.size)(configs)
    record["configs"] = jsonable(configs)
    resized.save(folder / f"{case['id']}.png")
    np.save(folder / f"{case['id']}.npy", np.stack([mapping, exact]).astype(np.float64))
    (folder / f"{case['id']}.json").write_text(json.dumps(record))


def _run_albumentation(case: dict, folder: Path) -> None:
    """One of their "additional" operations at the installed albumentations' defaults (their 1.3.1)."""
    import albumentations

    image = np.asarray(Image.open(case["image"]).convert("RGB"))
    seed_generators(case["seed"])
    transform = getattr(albumentations, case["op"].split(":", 1)[1])(p=1.0)
    edited = transform(image=image)["image"]
    change = float(np.abs(edited.astype(np.float64) - image).mean())
    (folder / f"{case['id']}.json").write_text(json.dumps({"op": case["op"], "version": albumentations.__version__,
                                                           "change": change}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", required=True, type=Path)
    parser.add_argument("--request", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)
    request = json.loads(args.request.read_text())
    code = _import_their_augmentation(args.authors_code.resolve())
    args.output.mkdir(parents=True, exist_ok=True)
    for case in request["cases"]:
        if case["op"].startswith("chain:"):
            from .authors_chain import run_chain_case

            run_chain_case(code, args.authors_code.resolve(), case, args.output)
        elif case["op"].startswith("albumentations:"):
            _run_albumentation(case, args.output)
        else:
            _run_case(code, case, request["config"], int(request["image_size"]), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
