"""Stand-ins for the names the authors' model and loss code imports from timm, torchvision and kornia.

Their files import ``timm`` 0.9.2, which imports ``torchvision``; a torchvision wheel built for
another torch fails at import beside this package's CPU torch (``operator torchvision::nms does
not exist``). The oracle therefore installs these modules under the real names (only when the
real library is absent) before importing their code. Each one follows the documented behaviour of
the original (parameter names and layout included, since checkpoints are keyed by them) and is
tested against it in ``tests/test_authors_checkpoints.py``:

* ``timm.models.layers`` / ``timm.layers``: :func:`to_2tuple`, :func:`trunc_normal_`, :class:`DropPath`;
* ``timm.models.vision_transformer``: :class:`Mlp` (``fc1``, ``act``, ``fc2``), :class:`PatchEmbed`
  (``proj`` convolution, fixed input size); ``timm.models``: :func:`register_model`;
* ``torchvision.transforms``: :class:`Compose`, :class:`Resize`, :class:`ToTensor`, :class:`Normalize`,
  :class:`InterpolationMode` (for PIL images, as their evaluation datasets use them), :class:`RandomErasing`
  (on tensors, as their training recipe's last steps);
  ``torchvision.transforms.functional``: the PIL functions their augmentation calls
  (:mod:`.functional_standins`);
* ``kornia.utils``: :func:`create_meshgrid`.
"""

from __future__ import annotations

import collections.abc
import importlib.util
import math
import sys
import types

import numpy as np
import torch
from PIL import Image
from torch import nn

from .functional_standins import FUNCTIONS, PIL_FILTERS, InterpolationMode

__all__ = ["install_standins"]


# ---------------------------------------------------------------------------------------------- timm
def to_2tuple(value):
    """``(value, value)``, or ``tuple(value)`` for an iterable that is not a string (timm's ``to_2tuple``)."""
    if isinstance(value, collections.abc.Iterable) and not isinstance(value, str):
        return tuple(value)
    return (value, value)


def trunc_normal_(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0):
    """In place: normal(mean, std) truncated to [a, b] (absolute bounds, as timm's ``trunc_normal_``)."""
    return nn.init.trunc_normal_(tensor, mean=mean, std=std, a=a, b=b)


class DropPath(nn.Module):
    """Stochastic depth per sample: in training, a sample's residual branch is zeroed with probability
    ``drop_prob`` and the kept ones are scaled by ``1 / (1 - drop_prob)``; identity in eval mode."""

    def __init__(self, drop_prob: float = 0.0, scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob, self.scale_by_keep = drop_prob, scale_by_keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * (mask / keep if self.scale_by_keep and keep > 0 else mask)


class Mlp(nn.Module):
    """timm's ViT MLP: ``fc1`` -> activation -> dropout -> ``fc2`` -> dropout (no norm by default)."""

    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, norm_layer=None,
                 bias=True, drop=0.0, use_conv=False):
        super().__init__()
        if use_conv:
            raise NotImplementedError("the stand-in Mlp has no 1x1-convolution form")
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        bias, drop = to_2tuple(bias), to_2tuple(drop)
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias[0])
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop[0])
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias[1])
        self.drop2 = nn.Dropout(drop[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class PatchEmbed(nn.Module):
    """timm's patch embedding: a ``patch_size`` convolution ``proj``, (B, C, H, W) -> (B, N, D); the
    input must have the configured ``img_size`` (``strict_img_size``, timm's default)."""

    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, norm_layer=None, flatten=True,
                 bias=True, strict_img_size=True):
        super().__init__()
        self.img_size, self.patch_size = to_2tuple(img_size), to_2tuple(patch_size)
        self.grid_size = tuple(size // patch for size, patch in zip(self.img_size, self.patch_size))
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.flatten, self.strict_img_size = flatten, strict_img_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.strict_img_size and tuple(x.shape[-2:]) != self.img_size:
            raise AssertionError(f"Input image size ({x.shape[-2]}*{x.shape[-1]}) doesn't match model "
                                 f"({self.img_size[0]}*{self.img_size[1]}).")
        x = self.proj(x)
        if self.flatten:
            x = x.flatten(2).transpose(1, 2)
        return self.norm(x)


def register_model(function):
    """timm's model registry decorator; the stand-in registers nothing and returns the function."""
    return function


# ---------------------------------------------------------------------------------------- torchvision
class Compose:
    """Apply the transforms in order."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class Resize:
    """Resize a PIL image with PIL's own filter (torchvision's path for PIL inputs): ``size`` (h, w)
    exactly, or an int that the shorter side is matched to (the other side ``int(size * long / short)``)."""

    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
        if max_size is not None:
            raise NotImplementedError("the stand-in Resize has no max_size")
        self.size, self.interpolation = size, interpolation

    def __call__(self, image: Image.Image) -> Image.Image:
        if not isinstance(image, Image.Image):
            raise TypeError("the stand-in Resize takes PIL images (as the authors' evaluation datasets give it)")
        if isinstance(self.size, int) or len(self.size) == 1:
            side = self.size if isinstance(self.size, int) else self.size[0]
            width, height = image.size
            short, long = min(width, height), max(width, height)
            other = int(side * long / short)
            height, width = (side, other) if height <= width else (other, side)
        else:
            height, width = self.size
        return image.resize((width, height), resample=PIL_FILTERS[self.interpolation])


class ToTensor:
    """PIL image -> float tensor (C, H, W) in [0, 1]: the uint8 values divided by 255."""

    def __call__(self, image: Image.Image) -> torch.Tensor:
        array = np.array(image, dtype=np.uint8, copy=True)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array).permute(2, 0, 1).contiguous().float().div(255)


class Normalize:
    """``(tensor - mean) / std`` per channel."""

    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = list(mean), list(std)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return tensor.sub(mean).div(std)


class RandomErasing:
    """torchvision's ``RandomErasing`` on a (C, H, W) tensor: with probability ``p`` (one ``torch.rand``), ten tries
    of a box of area ``scale`` and aspect h / w log-uniform in ``ratio`` (``torch.empty(1).uniform_`` each, the sides
    ``int(round(...))``) that fits strictly inside, its values ``value`` (``"random"``: ``normal_()`` values of
    shape (C, h, w), drawn before the corner), the corner by two ``torch.randint``; the image as it is when no box
    fits. Erases a copy unless ``inplace``."""

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace=False):
        self.p, self.scale, self.ratio, self.value, self.inplace = p, scale, ratio, value, inplace

    @staticmethod
    def get_params(image: torch.Tensor, scale, ratio, value=None):
        """``(top, left, h, w, values)`` of the box, or ``(0, 0, H, W, image)`` when none fits."""
        channels, height, width = image.shape[-3], image.shape[-2], image.shape[-1]
        area = height * width
        log_ratio = torch.log(torch.tensor(ratio))
        for _ in range(10):
            erase_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            h = int(round(math.sqrt(erase_area * aspect_ratio)))
            w = int(round(math.sqrt(erase_area / aspect_ratio)))
            if not (h < height and w < width):
                continue
            values = (torch.empty([channels, h, w], dtype=torch.float32).normal_() if value is None
                      else torch.tensor(value)[:, None, None])
            top = torch.randint(0, height - h + 1, size=(1,)).item()
            left = torch.randint(0, width - w + 1, size=(1,)).item()
            return top, left, h, w, values
        return 0, 0, height, width, image

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if torch.rand(1) >= self.p:
            return image
        value = None if isinstance(self.value, str) else (
            [float(self.value)] * image.shape[-3] if isinstance(self.value, (int, float)) else list(self.value))
        top, left, h, w, values = self.get_params(image, scale=self.scale, ratio=self.ratio, value=value)
        erased = image if self.inplace else image.clone()
        erased[..., top:top + h, left:left + w] = values
        return erased


# --------------------------------------------------------------------------------------------- kornia
def create_meshgrid(height: int, width: int, normalized_coordinates: bool = True, device=None,
                    dtype=torch.float32) -> torch.Tensor:
    """(1, H, W, 2) grid of ``(x, y)`` pixel positions, or mapped to [-1, 1] when ``normalized_coordinates``."""
    xs = torch.linspace(0, width - 1, width, device=device, dtype=dtype)
    ys = torch.linspace(0, height - 1, height, device=device, dtype=dtype)
    if normalized_coordinates:
        xs = (xs / (width - 1) - 0.5) * 2 if width > 1 else torch.zeros_like(xs)
        ys = (ys / (height - 1) - 0.5) * 2 if height > 1 else torch.zeros_like(ys)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([grid_x, grid_y], dim=-1).unsqueeze(0)


# ------------------------------------------------------------------------------------------- install
def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    module.__stand_in__ = True
    return module


def install_standins() -> list[str]:
    """Register the stand-in modules in ``sys.modules`` for each library that is not installed.

    Returns:
        The libraries given stand-ins (an installed timm, torchvision or kornia is used as it is).
    """
    installed = []
    layers = dict(to_2tuple=to_2tuple, trunc_normal_=trunc_normal_, DropPath=DropPath)
    libraries = {
        "timm": {
            "timm": dict(), "timm.layers": layers, "timm.models.layers": layers,
            "timm.models": dict(register_model=register_model),
            "timm.models.vision_transformer": dict(Mlp=Mlp, PatchEmbed=PatchEmbed),
        },
        "torchvision": {
            "torchvision": dict(),
            "torchvision.transforms": dict(Compose=Compose, Resize=Resize, ToTensor=ToTensor, Normalize=Normalize,
                                           InterpolationMode=InterpolationMode, RandomErasing=RandomErasing),
            "torchvision.transforms.functional": FUNCTIONS,
        },
        "kornia": {"kornia": dict(), "kornia.utils": dict(create_meshgrid=create_meshgrid)},
    }
    for library, modules in libraries.items():
        if library in sys.modules or importlib.util.find_spec(library) is not None:
            continue
        for name, attributes in modules.items():
            sys.modules[name] = _module(name, **attributes)
        for name in modules:  # submodules as attributes of their parents (``import timm.models`` then works)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, sys.modules[name])
        installed.append(library)
    return installed
