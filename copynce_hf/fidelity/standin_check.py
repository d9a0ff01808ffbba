"""The stand-ins against the real torchvision, timm and kornia, in an environment that can import them.

``python -m copynce_hf.fidelity.standin_check --output FILE [--photo PATH]`` runs in a virtual environment that
has the authors' pinned libraries (their ``conda.yaml``: torch 2.1.0, torchvision 0.16.0, timm 0.9.2, kornia
0.6.12, Pillow 9.3.0, NumPy 1.24.3; torchvision cannot be imported beside this package's CPU torch, which is why
the oracle has stand-ins at all). It calls every function and class of :mod:`.standins` and
:mod:`.functional_standins` and the real one with the same arguments (the same generator seed for the random
ones) and writes, per name, the largest absolute difference of the outputs (grey levels for images; values for
tensors; 0 or 1 for sizes, names and errors) as JSON ``{"rows": [[name, difference, scale], ...]}``;
``scripts/check_against_authors.py --torchvision-python`` turns them into rows (limit 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ["compare_all", "main", "run_standin_checks"]


def _pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float64)


def _image_difference(first, second) -> float:
    if first.size != second.size or first.mode != second.mode:
        return float("inf")
    return float(np.abs(_pixels(first) - _pixels(second)).max()) if first.size[0] * first.size[1] else 0.0


def _functional_rows(photo: Image.Image) -> list:
    """Each ``torchvision.transforms.functional`` stand-in against torchvision's, on PIL images."""
    import torchvision.transforms.functional as real

    from . import functional_standins as ours

    bicubic, bilinear = real.InterpolationMode.BICUBIC, real.InterpolationMode.BILINEAR
    mode = {real.InterpolationMode.BICUBIC: ours.InterpolationMode.BICUBIC,
            real.InterpolationMode.BILINEAR: ours.InterpolationMode.BILINEAR,
            real.InterpolationMode.NEAREST: ours.InterpolationMode.NEAREST}
    square = photo.crop((0, 0, 120, 120))
    cases = {
        "resize (h, w), bicubic": lambda f, m: f.resize(photo, [77, 131], m[bicubic]),
        "resize shorter side, bilinear": lambda f, m: f.resize(photo, 90, m[bilinear]),
        "crop": lambda f, m: f.crop(photo, 11, 17, 60, 83),
        "resized_crop, bicubic": lambda f, m: f.resized_crop(photo, 5, 9, 70, 100, [224, 224], m[bicubic]),
        "hflip": lambda f, m: f.hflip(photo), "vflip": lambda f, m: f.vflip(photo),
        "pad, black": lambda f, m: f.pad(photo, [7, 3, 7, 3], fill=0),
        "affine 117 deg, shear 20, bicubic": lambda f, m: f.affine(photo, 117.0, [0, 0], 1.0, [20.0, 0.0],
                                                                   m[bicubic], fill=0),
        "affine 270 deg, shear -9.3, bicubic": lambda f, m: f.affine(square, 270.0, [0, 0], 1.0, [-9.3, 0.0],
                                                                     m[bicubic], fill=0),
        "affine 0 deg, translate, scale, bilinear": lambda f, m: f.affine(photo, 0.0, [5, -3], 0.9, [0.0, 0.0],
                                                                          m[bilinear], fill=0),
        "perspective, bicubic": lambda f, m: f.perspective(
            photo, [[0, 0], [159, 0], [159, 105], [0, 105]], [[9, 4], [150, 2], [155, 100], [2, 97]], m[bicubic],
            fill=0),
        "adjust_brightness 0.7": lambda f, m: f.adjust_brightness(photo, 0.7),
        "adjust_contrast 1.4": lambda f, m: f.adjust_contrast(photo, 1.4),
        "adjust_saturation 0.3": lambda f, m: f.adjust_saturation(photo, 0.3),
        "adjust_hue -0.13": lambda f, m: f.adjust_hue(photo, -0.13),
        "adjust_hue 0.2": lambda f, m: f.adjust_hue(photo, 0.2),
        "rgb_to_grayscale, 3 channels": lambda f, m: f.rgb_to_grayscale(photo, 3),
        "rgb_to_grayscale, 1 channel": lambda f, m: f.rgb_to_grayscale(photo, 1),
    }
    rows = [[f"functional.{name}", _image_difference(case(real, {k: k for k in mode}), case(ours, mode)), 255.0]
            for name, case in cases.items()]
    sizes = (real.get_image_size(photo) == ours.get_image_size(photo)
             and real.get_dimensions(photo) == ours.get_dimensions(photo)
             and real.get_image_num_channels(photo) == ours.get_image_num_channels(photo))
    rows.append(["functional.get_image_size / get_dimensions / get_image_num_channels", float(not sizes), 1.0])
    names = all(real.InterpolationMode[member.name].value == member.value for member in ours.InterpolationMode)
    rows.append(["functional.InterpolationMode: each stand-in member torchvision's, same value", float(not names), 1.0])
    return rows


def _transforms_rows(photo: Image.Image) -> list:
    """``Resize``, ``ToTensor``, ``Normalize`` and the seeded ``RandomErasing`` against torchvision's."""
    import torchvision.transforms as real

    from . import standins as ours

    rows = [["transforms.Resize((224, 224), bicubic)", _image_difference(
        real.Resize((224, 224), real.InterpolationMode.BICUBIC, antialias=True)(photo),
        ours.Resize((224, 224), ours.InterpolationMode.BICUBIC)(photo)), 255.0]]
    tensor_real, tensor_ours = real.ToTensor()(photo), ours.ToTensor()(photo)
    rows.append(["transforms.ToTensor", float((tensor_real - tensor_ours).abs().max()), 1.0])
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    normalised = real.Normalize(mean, std)(tensor_real) - ours.Normalize(mean, std)(tensor_real)
    rows.append(["transforms.Normalize", float(normalised.abs().max()), 3.0])
    worst = 0.0
    for seed in range(40):  # their value="random", p 0.5: the same seed gives the same box and values
        torch.manual_seed(seed)
        erased_real = real.RandomErasing(p=0.5, value="random")(tensor_real.clone())
        torch.manual_seed(seed)
        erased_ours = ours.RandomErasing(p=0.5, value="random")(tensor_real.clone())
        worst = max(worst, float((erased_real - erased_ours).abs().max()))
    rows.append(["transforms.RandomErasing(value='random'), 40 seeds", worst, 4.0])
    return rows


def _timm_kornia_rows() -> list:
    """timm's ``to_2tuple``, ``trunc_normal_``, ``DropPath``, ``Mlp``, ``PatchEmbed`` and kornia's
    ``create_meshgrid`` against the stand-ins (same seeds, same weights)."""
    import kornia.utils
    from timm.layers import DropPath, to_2tuple, trunc_normal_
    from timm.models.vision_transformer import Mlp, PatchEmbed

    from . import standins as ours

    rows = [["timm to_2tuple", float(any(to_2tuple(v) != ours.to_2tuple(v) for v in (3, (4, 5), [6, 7]))), 1.0]]
    first, second = torch.empty(64, 32), torch.empty(64, 32)
    torch.manual_seed(0)
    trunc_normal_(first, std=0.02)
    torch.manual_seed(0)
    ours.trunc_normal_(second, std=0.02)
    rows.append(["timm trunc_normal_(std 0.02), seed 0", float((first - second).abs().max()), 0.04])
    x = torch.randn(8, 5, 12)
    paths = (DropPath(0.3).train(), ours.DropPath(0.3).train())
    outputs = []
    for path in paths:
        torch.manual_seed(1)
        outputs.append(path(x))
    rows.append(["timm DropPath(0.3), training, seed 1", float((outputs[0] - outputs[1]).abs().max()), 3.0])
    for name, real, stand_in, data in (
            ("timm Mlp(12, 48)", Mlp(12, 48), ours.Mlp(12, 48), x),
            ("timm PatchEmbed(32, 16, 3, 24)", PatchEmbed(32, 16, 3, 24), ours.PatchEmbed(32, 16, 3, 24),
             torch.randn(2, 3, 32, 32))):
        same_names = sorted(real.state_dict()) == sorted(stand_in.state_dict())
        stand_in.load_state_dict(real.state_dict())
        rows.append([f"{name}: parameter names", float(not same_names), 1.0])
        rows.append([f"{name}: outputs, same weights", float((real(data) - stand_in(data)).abs().max()), 1.0])
    for normalized in (False, True):
        grid = kornia.utils.create_meshgrid(5, 7, normalized_coordinates=normalized)
        rows.append([f"kornia create_meshgrid(5, 7, normalized={normalized})",
                     float((grid - ours.create_meshgrid(5, 7, normalized_coordinates=normalized)).abs().max()), 7.0])
    return rows


def perspective_cases(count: int = 500) -> list:
    """``[[startpoints, endpoints, torchvision's coefficients], ...]`` of ``count`` seeded corner sets drawn as
    their ``RandomPerspective`` draws them (distortion 0.5, whole pixels) on images of 32 to 1200 pixels."""
    from torchvision.transforms import RandomPerspective
    from torchvision.transforms.functional import _get_perspective_coeffs

    generator, cases = np.random.default_rng(3), []
    for _ in range(count):
        width, height = (int(side) for side in generator.integers(32, 1201, size=2))
        torch.manual_seed(int(generator.integers(2**31)))
        start, end = RandomPerspective.get_params(width, height, 0.5)
        cases.append([start, end, _get_perspective_coeffs(start, end)])
    return cases


def compare_all(photo: Image.Image) -> list:
    """Every stand-in against the real library: ``[[name, largest difference, scale], ...]``."""
    return _functional_rows(photo) + _transforms_rows(photo) + _timm_kornia_rows()


def run_standin_checks(python: str, photo: Path) -> list:
    """Rows ``stand-in, ...`` (limit 0): :func:`compare_all` run by ``python``, an environment with the real
    torchvision, timm and kornia (their pinned versions)."""
    import os
    import subprocess
    import tempfile

    from ..modeling.errors import CopyNCEError
    from .oracle import Row

    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "standins.json"
        environment = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        result = subprocess.run([python, "-m", "copynce_hf.fidelity.standin_check", "--output", str(output),
                                 "--photo", str(photo)], capture_output=True, text=True, env=environment)
        if result.returncode != 0:
            raise CopyNCEError(f"the stand-in check failed in {python}:\n{result.stderr[-3000:]}")
        report = json.loads(output.read_text())
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items())
    rows = [Row(f"stand-in vs {name} ({versions})", "max abs", float(difference), 0.0, float(scale))
            for name, difference, scale in report["rows"]]
    from ..pixtrace.edits.geometric import torchvision_perspective_coefficients

    differing = sum(list(torchvision_perspective_coefficients(start, end)) != list(theirs)
                    for start, end, theirs in report["perspective"])
    rows.append(Row(f"PixTrace Perspective(form='torchvision') coefficients (this torch) vs torchvision's "
                    f"({len(report['perspective'])} corner sets drawn as RandomPerspective)", "sets that differ",
                    float(differing), 0.0, float(len(report["perspective"]))))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--photo", required=True, help="a colour photograph (cut to 160 x 106)")
    args = parser.parse_args(argv)
    photo = Image.open(args.photo).convert("RGB").resize((160, 106), 3)  # bicubic (Pillow 9.3 and later)
    import timm
    import torchvision

    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
                "Pillow": Image.__version__, "numpy": np.__version__}
    with open(args.output, "w") as handle:
        json.dump({"rows": compare_all(photo), "versions": versions, "perspective": perspective_cases()}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
