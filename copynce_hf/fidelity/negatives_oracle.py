"""The authors' matcher negatives and k-NN graph features as an oracle (``scripts/check_against_authors.py``).

:func:`run_negative_checks` imports from a checkout of GitHub ``eddielyc/CopyNCE`` (nothing of it is copied here)
their training data set (``core/data/datasets/copy_dataset.py``), their evaluation transform
(``core/data/augmentation/build.py``) and their DINO model (``core/models/build.py``), with the stand-ins of
:mod:`.standins` for absent timm, torchvision and kornia, and compares:

* **k-NN features.** Their ``scripts/run/extract_dino_features.py`` builds ``build_dino_model`` from their
  descriptor configuration (ViT-S/16 at 224, LayerNorm epsilon 1e-4, final norm applied), loads DINO's weights
  and reads each image with ``UnpairedCopyDataset`` (``convert("RGB")``, ``build_eval_transforms``: a bicubic
  resize to 224 x 224, ImageNet normalisation); their ``build_knn.py`` L2-normalises the CLS tokens. Here their
  model gets seeded random weights (their initialisation moved by seeded noise), saved as a DINO ``.pth``;
  this package's :func:`~copynce_hf.data.knn_features.load_feature_model` with ``features="authors"`` and
  :func:`~copynce_hf.data.knn_features.extract_knn_features` read that file and the same image files. Row:
  the normalised features, max abs difference <= 1e-5. Self-checks: a bilinear resize, and the package's own
  form of the same file (DINO's LayerNorm epsilon 1e-6), must each fail that row.
* **Matcher negatives.** Their ``CopyDataset`` with ``positive_rate`` 0 and hard negatives always drawn
  (``hard_negative_mining.p`` 1.0, so that every partner is a neighbour) from a ``knns`` file as their
  ``build_knn.py`` writes it (each image first in its own row), on small images of distinct colours; their
  ``basic_transform`` and ``copy_transform`` are replaced by transforms that only record which image they were
  given, so their own ``__getitem__`` picks the images and the sides. This package's ``CopyPairDataset`` with
  ``negative_roles="authors"`` and ``negative_query_resize_prob`` 0.5 on the graph
  :func:`~copynce_hf.data.hard_negatives.build_knn_graph` builds from the same vectors. Rows: the (reference,
  query) image pairs one side draws and the other never does (0), the share of queries only resized (within
  4 sigmas), the share of references edited (equal). Self-check: ``negative_roles="package"`` fails the first.

Their ``fetch_sample`` is wrapped by ``func_timeout``'s ``func_set_timeout``; where that library is absent it is
given a stand-in without a time limit (the images are small local files).
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..data import CopyPairDataset, CopyPairMaker, PairKey, build_knn_graph, load_image_dataset
from ..data.knn_features import extract_knn_features, load_feature_model
from ..modeling.errors import CopyNCEError
from .oracle import Row
from .standins import install_standins

__all__ = ["knn_feature_rows", "negative_role_rows", "run_negative_checks"]

#: Features: max abs difference of the L2-normalised features.
FEATURE_LIMIT = 1e-5
#: Negatives: images, neighbours per image (their ``knn_r`` - 1), draws per image.
NEGATIVE_IMAGES, NEIGHBOURS, DRAWS_PER_IMAGE = 10, 4, 40


def _import_their_code(directory: Path) -> types.SimpleNamespace:
    """Their data set, evaluation transform, DINO model builder and descriptor configuration."""
    directory = Path(directory).resolve()
    if not (directory / "core" / "data" / "datasets" / "copy_dataset.py").is_file():
        raise CopyNCEError(f"{directory} is not a checkout of eddielyc/CopyNCE (core/data/datasets/copy_dataset.py "
                           "not found)")
    install_standins()
    _install_func_timeout()
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    for package in ("core.data", "core.data.augmentation", "core.data.datasets"):  # their __init__ files
        module = types.ModuleType(package)  # import the whole training pipeline: not run
        module.__path__ = [str(directory / package.replace(".", "/"))]
        sys.modules.setdefault(package, module)
    try:
        from core.data.augmentation import mask_mapper

        sys.modules["core.data.augmentation"].Augmentation = mask_mapper.Augmentation
        from core.configs import descriptor_default_config
        from core.data.augmentation.build import build_eval_transforms
        from core.data.datasets.copy_dataset import CopyDataset, UnpairedCopyDataset
        from core.models.build import build_dino_model
    except ImportError as error:
        raise CopyNCEError(f"cannot import the authors' code from {directory}: {error}; install what it needs "
                           "with pip install -e '.[authors]'") from error
    return types.SimpleNamespace(config=descriptor_default_config, eval_transforms=build_eval_transforms,
                                 CopyDataset=CopyDataset, UnpairedCopyDataset=UnpairedCopyDataset,
                                 build_dino_model=build_dino_model)


def _install_func_timeout() -> None:
    """``func_timeout`` (``func_set_timeout``, ``exceptions.FunctionTimedOut``) without a time limit, where absent."""
    import importlib.util

    if "func_timeout" in sys.modules or importlib.util.find_spec("func_timeout") is not None:
        return
    exceptions = types.ModuleType("func_timeout.exceptions")
    exceptions.FunctionTimedOut = type("FunctionTimedOut", (Exception,), {})
    module = types.ModuleType("func_timeout")
    module.func_set_timeout = lambda seconds: (lambda function: function)
    module.exceptions = exceptions
    sys.modules.update({"func_timeout": module, "func_timeout.exceptions": exceptions})


# ---------------------------------------------------------------------------------------------- k-NN features
def _their_dino(code, seed: int) -> torch.nn.Module:
    """Their ``build_dino_model`` of their descriptor configuration, every tensor moved by seeded noise."""
    torch.manual_seed(seed)
    model = code.build_dino_model(code.config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator))
    return model


@torch.no_grad()
def _their_features(code, model: torch.nn.Module, paths: list[Path]) -> torch.Tensor:
    """(N, C) their L2-normalised CLS tokens of ``paths``, read by their ``UnpairedCopyDataset``."""
    dataset = code.UnpairedCopyDataset(paths, code.eval_transforms(code.config.input), code.config)
    pixels = torch.stack([dataset[index]["images"] for index in range(len(paths))])
    return torch.nn.functional.normalize(model(pixels)["cls_token"], dim=1)


def _our_features(checkpoint: Path, folder: Path, ids: list[str], features: str, resample=None) -> torch.Tensor:
    """(N, C) this package's features of the images of ``folder`` in the order of ``ids``."""
    images = load_image_dataset(folder)
    model, processor, kind = load_feature_model(str(checkpoint), 224, features)
    if resample is not None:
        processor.resample = resample
    vectors, valid, _ = extract_knn_features(model, processor, kind, images, batch_size=8, num_workers=0,
                                             device="cpu")
    if not valid.all():
        raise CopyNCEError(f"unreadable images among {folder}")
    row = {image_id: index for index, image_id in enumerate(images["image_id"])}
    return torch.from_numpy(vectors[[row[image_id] for image_id in ids]])


def knn_feature_rows(code, photos: list[Path], folder: Path, seed: int = 0) -> list[Row]:
    """The k-NN feature row and its self-checks (see the module docstring)."""
    from PIL.Image import Resampling

    images = folder / "knn-images"
    images.mkdir(parents=True, exist_ok=True)
    paths = [Path(shutil.copy(photo, images / photo.name)) for photo in photos]
    model = _their_dino(code, seed)
    checkpoint = folder / "dino-authors-random.pth"
    torch.save(model.state_dict(), checkpoint)  # their ViT's tensor names are DINO's
    theirs = _their_features(code, model, paths).double()
    ids = [path.stem for path in paths]
    measured = {}
    for name, features, resample in (("authors", "authors", None), ("bilinear", "authors", Resampling.BILINEAR),
                                     ("package", "package", None)):
        ours = _our_features(checkpoint, images, ids, features, resample).double()
        measured[name] = float((ours - theirs).abs().max())
    scale = float(theirs.abs().max())
    rows = [Row("k-NN features: their extract_dino_features (ViT, LayerNorm eps 1e-4, bicubic 224) vs "
                "--features authors", "max abs", measured["authors"], FEATURE_LIMIT, scale)]
    rows.append(Row(f"self-check: a bilinear resize fails the k-NN feature row ({measured['bilinear']:.2e})",
                    "caught (0: yes)", float(measured["bilinear"] <= FEATURE_LIMIT), 0.0, 1.0))
    rows.append(Row(f"self-check: the package's form of the .pth (LayerNorm eps 1e-6) fails the k-NN feature row "
                    f"({measured['package']:.2e})", "caught (0: yes)", float(measured["package"] <= FEATURE_LIMIT),
                    0.0, 1.0))
    return rows


# ---------------------------------------------------------------------------------------------- matcher negatives
def _colour(index: int) -> tuple[int, int, int]:
    return (20 * index + 10, 255 - 20 * index, (70 * index) % 256)


class _Recorder:
    """A transform of theirs replaced: ``(tensor (2, 2, 2) holding the image's index and whether it was edited, [])``."""

    def __init__(self, edited: bool):
        self.edited = float(edited)

    def __call__(self, image: Image.Image, *args, **kwargs):
        index = [_colour(i) for i in range(NEGATIVE_IMAGES)].index(image.getpixel((0, 0)))
        return torch.tensor([float(index), self.edited]).view(2, 1, 1).expand(2, 2, 2).clone(), []


def _their_negatives(code, paths: list[Path], knns_path: Path, seed: int) -> list[tuple[int, int, bool, bool]]:
    """``(reference image, query image, query only resized, reference edited)`` of their negative pairs."""
    settings = types.SimpleNamespace(
        positive_rate=0.0, sampling_rate=1.0, return_mapping=False, return_mask=False, positive_ref_aug_p=0.0,
        negative_ref_aug_p=0.0, force_hard_negative_mining=False,
        hard_negative_mining=types.SimpleNamespace(enable=True, p=1.0, knn_l=1, knn_r=NEIGHBOURS + 1,
                                                   knns_path=str(knns_path)))
    dataset = code.CopyDataset(paths, _Recorder(False), _Recorder(True), settings)
    states = random.getstate(), np.random.get_state()
    random.seed(seed)  # their draws: Python's and NumPy's global generators
    np.random.seed(seed)
    drawn = []
    try:
        for index in list(range(len(paths))) * DRAWS_PER_IMAGE:
            sample = dataset[index]
            if int(sample["cls_gt"]) != 0:
                raise CopyNCEError("their data set made a positive pair at positive_rate 0")
            reference, query = sample["references"][:, 0, 0], sample["queries"][:, 0, 0]
            drawn.append((int(reference[0]), int(query[0]), bool(query[1] == 0), bool(reference[1] == 1)))
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
    return drawn


def _our_negatives(folder: Path, vectors: np.ndarray, roles: str, seed: int) -> list[tuple[int, int, bool, bool]]:
    """The same four values of this package's negative pairs (``CopyPairDataset``, ``negative_roles=roles``)."""
    images = load_image_dataset(folder)
    index = {image_id: int(image_id.split("-")[1]) for image_id in images["image_id"]}
    ordered = vectors[[index[image_id] for image_id in images["image_id"]]]
    graph = build_knn_graph(ordered, images["image_id"], k=NEIGHBOURS)
    maker = CopyPairMaker(16, "paper_matcher", "off", negative_query_resize_prob=0.5)
    dataset = CopyPairDataset(images, maker, seed=seed, positive_rate=0.0, knn=graph, hard_negative_k=NEIGHBOURS,
                              hard_negative_prob=1.0, other_images="procedural", negative_roles=roles)
    drawn = []
    for slot in range(len(images) * DRAWS_PER_IMAGE):
        pair = dataset[PairKey(0, slot, slot % len(images))]
        recipes = pair.edits["recipes"]
        drawn.append((index[pair.reference_id], index[pair.query_id], recipes["query"] == "off",
                      recipes["reference"] != "off"))
    return drawn


def _share_sigmas(first: list[bool], second: list[bool]) -> float:
    """|difference of two shares| in standard deviations of that difference (0 when both are 0 or 1 alike)."""
    p1, p2 = np.mean(first), np.mean(second)
    pooled = (np.sum(first) + np.sum(second)) / (len(first) + len(second))
    sigma = math.sqrt(pooled * (1 - pooled) * (1 / len(first) + 1 / len(second)))
    return 0.0 if p1 == p2 else (math.inf if sigma == 0 else abs(p1 - p2) / sigma)


def negative_role_rows(code, folder: Path, seed: int = 0) -> list[Row]:
    """The matcher-negative rows and their self-check (see the module docstring)."""
    images = folder / "negative-images"
    images.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(NEGATIVE_IMAGES):
        paths.append(images / f"image-{index:02d}.png")
        Image.new("RGB", (24, 24), _colour(index)).save(paths[-1])
    vectors = np.random.default_rng(seed).normal(size=(NEGATIVE_IMAGES, 8)).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    knns = np.argsort(-(unit @ unit.T), axis=1, kind="stable")  # their build_knn: by cosine, the image itself first
    knns_path = folder / "knns.pth"
    torch.save(torch.from_numpy(knns).int(), knns_path)
    theirs = _their_negatives(code, paths, knns_path, seed)
    pairs = {(reference, query) for reference, query, _, _ in theirs}
    rows = []
    for roles in ("authors", "package"):
        ours = _our_negatives(images, vectors, roles, seed)
        apart = len(pairs ^ {(reference, query) for reference, query, _, _ in ours})
        if roles == "package":
            rows.append(Row(f"self-check: negative_roles package fails the pairs row ({apart} pairs apart)",
                            "caught (0: yes)", float(apart == 0), 0.0, 1.0))
            continue
        rows += [
            Row(f"matcher negatives: (reference, query) image pairs drawn by one side only ({len(theirs)} draws each)",
                "pairs", float(apart), 0.0, float(len(pairs))),
            Row("matcher negatives: share of queries only resized", "sigmas",
                _share_sigmas([row[2] for row in theirs], [row[2] for row in ours]), 4.0,
                float(np.mean([row[2] for row in theirs]))),
            Row("matcher negatives: share of references edited", "abs",
                abs(float(np.mean([row[3] for row in theirs])) - float(np.mean([row[3] for row in ours]))), 0.0,
                float(np.mean([row[3] for row in theirs]))),
        ]
    return rows


def run_negative_checks(authors_code: str | Path, photos: list[Path], folder: Path, seed: int = 0) -> list[Row]:
    """The k-NN feature rows and the matcher-negative rows (see the module docstring), working in ``folder``."""
    code = _import_their_code(Path(authors_code))
    folder = Path(folder)
    with torch.random.fork_rng():
        return knn_feature_rows(code, photos, folder, seed) + negative_role_rows(code, folder, seed)
