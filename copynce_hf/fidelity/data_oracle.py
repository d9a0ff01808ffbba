"""The authors' augmentation as an oracle for PixTrace's edits and tables (``scripts/check_against_authors.py``).

:func:`run_data_checks` runs, in the authors' environment (a Python with their pinned albumentations 1.3.1,
see the script's help), their own augmentation classes on real photos with seeded draws
(:mod:`.authors_augmentation`), reads back the parameters each one drew, applies this package's edits
with the same parameters (edit by edit, bicubic, as the paper presets render) and compares, each case
ending with their final bicubic resize to the model input:

* the pixels (mean absolute difference in grey levels, over the cases of an edit);
* PixTrace's coordinate table with their ``MaskMapper``'s map of the same copy: the share of pixels that
  either maps to a source pixel more than one pixel away from the other's (or that one traces and the
  other does not), and the share mapped to exactly the same source pixel (reported);
* the overlap priors CopyNCE learns from (patch overlap of the copy with the resized original, query to
  reference, :func:`~copynce_hf.pixtrace.pair_overlaps`): made from their map and from the table;
* each of their 24 "additional" albumentations operations under 1.3.1 against this package's
  :class:`~copynce_hf.pixtrace.edits.Albumentation` under the installed 2.x: the mean absolute change each
  makes to the photo, averaged over seeded draws (their draws and ours differ, their distribution must not).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from ..modeling.errors import CopyNCEError
from ..pixtrace import CoordinateTable
from ..pixtrace.edits import (
    ALBUMENTATIONS_OPS,
    Affine,
    Albumentation,
    ColorJitter,
    Grayscale,
    HorizontalFlip,
    OverlayEmoji,
    OverlayImageBox,
    Pad,
    PasteIntoBox,
    Perspective,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
)
from .authors_augmentation import OPERATIONS
from .oracle import Row

__all__ = ["ALBUMENTATIONS_LIMIT", "DATA_LIMITS", "MAP_TOLERANCE", "PRIOR_LIMIT", "appearance_edits", "edits_of_case",
           "ks_statistic", "map_measures", "map_rows", "resized_reference_prior", "run_data_checks", "run_worker",
           "table_measures"]

SIZE = 224
PATCH = 16

#: Per edit: the largest mean absolute pixel difference (grey levels, 0-255) between their copy and ours with the
#: same parameters, over the photos. Every edit renders as their class does, pixel for pixel (their crop resized
#: from the crop, their pastes' truncated mask levels and double resize of the other image, torchvision's affine
#: coefficients, Pillow's bicubic at every step): 0.
DATA_LIMITS = {op: 0.0 for op in OPERATIONS}
#: The edits that move pixels (their ``MaskMapper`` maps them; the others leave the map as it is).
MAPPED = ("random_resized_crop", "affine", "perspective", "hflip", "vflip", "padding", "resize", "onto_other_image",
          "other_image_onto")
#: Their map follows three conventions of its own: it is resized by nearest index (each output pixel takes the
#: first source pixel of its cell, not the one at its centre, and is rounded to a whole pixel: up to (1 + 1/s) / 2
#: copy pixels for a resize by s), inverse-warped positions are truncated (up to a pixel of the warped image), and
#: their affine and perspective matrices act on pixel indices where the pixels are warped in Pillow's area
#: coordinates (half a pixel). Their positions and ours may so be up to 3 copy pixels apart, and a traced region's
#: border up to 3 pixels; the content rows show which of the two maps their copy's pixels follow (ours: the table
#: minus the map is negative).
MAP_TOLERANCE = 3
#: Those conventions shift a map by about one copy pixel (the median distance in the rows), which moves one row and
#: one column of a 16-pixel patch: the share of the prior's mass placed elsewhere may be up to 2 / 16.
PRIOR_LIMIT = 2 / PATCH
#: Their map with the three conventions removed (:func:`~.authors_chain.convention_free`: resized at output pixel
#: centres, warped to exact positions, their warp matrices moved to Pillow's area coordinates) against PixTrace's
#: table, in copy pixels: the 99th percentile of the distance of the pixels both trace (float rounding, and where a
#: map resampled after a perspective is interpolated along the bend: under 0.1) and the share of them more than a
#: pixel apart (the border pixels of a warped region, whose map is continued from its neighbours inside: a few in a
#: copy, 0.1 % at most). A table shifted by one pixel is a whole pixel away everywhere.
EXACT_P99, EXACT_FAR_SHARE = 0.1, 0.001
#: The overlap priors from the convention-free map and from the table: the share of the prior's mass placed
#: elsewhere. The two maps agree to 1e-4 px, but a position on a patch's border goes to one side or the other by
#: that rounding, which moves a row of pixels (1 / 16 of the patch) on a few patches; a one-pixel shift moves 1 / 16
#: of every patch per axis. The limit is half that.
EXACT_PRIOR_LIMIT = 1 / 32
#: Relative difference of the mean change an albumentations operation makes, their 1.3.1 against ours, over 200
#: seeded draws each. An operation computed otherwise (2.x's FancyPCA, ISONoise, MotionBlur, RandomFog and
#: RandomRain before this package computed them as 1.3.1: 23 % to 260 %; GaussNoise's rounding: 10 %) moves it by
#: far more than the sampling spread of 200 draws (a few per cent for the operations that draw one or two scalars).
ALBUMENTATIONS_LIMIT = 0.15


def edits_of_case(case: dict, record: dict, size: tuple[int, int]) -> list:
    """This package's edits with the parameters their class drew for ``case`` (their final resize excluded)."""
    op, configs = case["op"], record["configs"]
    params = [c["params"] for c in configs]
    kinds = [c["type"] for c in configs]
    crops = [RandomResizedCrop(p["j"], p["i"], p["j"] + p["w"], p["i"] + p["h"], p["size"][1], p["size"][0],
                               "bicubic", form="crop") for k, p in zip(kinds, params) if k == "CROP_RESIZE"]
    if op == "random_resized_crop":
        return crops
    if op == "affine":
        p = params[0]
        return [Affine(angle=p["angle"], translate=tuple(p["translations"]), scale=p["scale"], shear=tuple(p["shear"]),
                       fill=(0, 0, 0), resample="bicubic", form="torchvision")]
    if op == "perspective":
        p = params[0]
        return [Perspective(p["startpoints"], p["endpoints"], fill=(0, 0, 0), resample="bicubic", form="torchvision")]
    if op in ("hflip", "vflip"):
        return [HorizontalFlip() if op == "hflip" else VerticalFlip()]
    if op == "padding":
        p = params[0]
        return [Pad(p["left"] / size[1], p["top"] / size[0], (0, 0, 0), rounding="round")]
    if op == "onto_other_image":
        p = params[kinds.index("PASTE_IMAGE_ONTO")]
        return crops + [PasteIntoBox({"kind": "file", "path": case["other"]}, p["size"][1], p["size"][0], p["j"], p["i"],
                                     p["h"], p["w"], opacity=p["mask"]["params"]["opacity"], resample="bicubic",
                                     level_rounding="truncate")]
    if op == "other_image_onto":
        p = params[kinds.index("PASTE_IMAGE_BENEATH")]
        height, width = (SIZE, SIZE) if crops else size
        return crops + [OverlayImageBox({"kind": "file", "path": case["other"]}, x=p["j"] / width, y=p["i"] / height,
                                        width=p["w"] / width, height=p["h"] / height, opacity=p["opacity"],
                                        resample="bicubic", overlay_size=(SIZE, SIZE), level_rounding="truncate")]
    return appearance_edits(op, record)


def appearance_edits(op: str, record: dict) -> list:
    if op == "emoji":  # their draws: the p test, the emoji, the size, the corner, the opacity
        _, path, size, x, y, opacity = record["draws"]
        name = "/".join(Path(path).parts[-2:])
        return [OverlayEmoji(emoji=name, size=0.1 + 0.4 * size, x=x, y=y, opacity=0.7 + 0.3 * opacity, form="authors")]
    if op == "color_jitter":  # their order and factors
        order, brightness, contrast, saturation, hue = record["draws"]
        return [ColorJitter(brightness, contrast, saturation, hue, form="torchvision", order=tuple(order))]
    if op == "grayscale":
        return [Grayscale()]
    return []  # resize: only their final resize


def _their_table(mapping: np.ndarray, source_size: tuple[int, int]) -> CoordinateTable:
    """Their map (2, H, W) (row, column; -1 where none) of an image of ``source_size`` as a table (NaN where none)."""
    coords = mapping.transpose(1, 2, 0).astype(np.float64).copy()
    coords[(coords == -1).all(-1)] = np.nan  # their -1 in both channels; a convention-free position may be < 0
    return CoordinateTable(coords, source_size)


def _positions(theirs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions (H, W, 2) float, traced (H, W) bool) of a map (2, H, W) (-1 where none)."""
    coords = theirs.transpose(1, 2, 0).astype(np.float64)
    return coords, ~(coords == -1).all(-1)


def _distances(ours: CoordinateTable, theirs: np.ndarray, source_size: tuple[int, int]) -> tuple[np.ndarray, dict]:
    """(Chebyshev distance in copy pixels of the pixels both trace, {"ours", "theirs": traced masks}): the source
    positions times the copy-to-source scale of each axis."""
    height, width = ours.size
    scale = np.array([height / source_size[0], width / source_size[1]])
    our_traced = ~np.isnan(ours.coords).any(-1)
    their_coords, their_traced = _positions(theirs)
    position = np.where(our_traced[..., None], ours.coords, 0.0)
    both = our_traced & their_traced
    return (np.abs(position - their_coords) * scale).max(-1)[both], {"ours": our_traced, "theirs": their_traced}


def _stray(traced: dict, tolerance: float) -> float:
    """Share of the pixels one side traces and the other does not that lie more than ``tolerance`` pixels from the
    other side's traced region."""
    to_ours = cv2.distanceTransform((~traced["ours"]).astype(np.uint8), cv2.DIST_C, 3)
    to_theirs = cv2.distanceTransform((~traced["theirs"]).astype(np.uint8), cv2.DIST_C, 3)
    stray = (traced["ours"] & ~traced["theirs"] & (to_theirs > tolerance)) | (
        traced["theirs"] & ~traced["ours"] & (to_ours > tolerance))
    return float(stray.sum() / max(int((traced["ours"] ^ traced["theirs"]).sum()), 1))


def map_measures(ours: CoordinateTable, maps: np.ndarray, source_size: tuple[int, int],
                 tolerance: float = MAP_TOLERANCE) -> dict[str, float]:
    """How their map and their convention-free map (``maps``: (2, 2, H, W)) of a copy agree with our table of it:

    * ``apart``: share of the pixels both trace more than ``tolerance`` copy pixels apart in their map;
      ``stray``: share of the pixels one side traces more than ``tolerance`` pixels from the other's region;
      ``median``, ``largest``: the distance's median and largest (reported);
    * ``exact_p99``, ``exact_max``, ``exact_far``: 99th percentile and largest distance to the convention-free map,
      share of the pixels more than a pixel from it;
      ``exact_stray``: share of the pixels one side traces more than a pixel from the other's region.
    """
    distance, traced = _distances(ours, maps[0], source_size)
    exact, exact_traced = _distances(ours, maps[1], source_size)
    if not distance.size:
        distance = np.zeros(1)
    if not exact.size:
        exact = np.zeros(1)
    return {"apart": float((distance > tolerance).mean()), "stray": _stray(traced, tolerance),
            "median": float(np.median(distance)), "largest": float(distance.max()),
            "exact_p99": float(np.quantile(exact, 0.99)), "exact_max": float(exact.max()),
            "exact_far": float((exact > 1.0).mean()),
            "exact_stray": _stray(exact_traced, 1.0)}


def _content_error(copy: np.ndarray, original: np.ndarray, table: CoordinateTable) -> float:
    """Mean abs difference (grey) between the copy's traced pixels and the original's pixel at their source."""
    traced = ~np.isnan(table.coords).any(-1)
    if not traced.any():
        return 0.0
    rows = np.clip(np.floor(table.coords[traced][:, 0] + 0.5).astype(int), 0, original.shape[0] - 1)
    cols = np.clip(np.floor(table.coords[traced][:, 1] + 0.5).astype(int), 0, original.shape[1] - 1)
    return float(np.abs(copy[traced] - original[rows, cols]).mean())


def resized_reference_prior(table: CoordinateTable) -> np.ndarray:
    """float (L, L): the query -> reference overlap prior of a copy whose reference is its original resized to
    ``SIZE`` (the paper configs' references): query patch i, reference patch j holds the share of patch i's pixels
    whose source position's nearest reference pixel lies in patch j. Computed from the positions alone, so that our
    table and their maps (dense arrays) go through the same arithmetic (:func:`~copynce_hf.pixtrace.pair_overlaps`
    takes an exact inverse for analytic tables and a scatter inverse for dense ones, which place a position that
    lies on a pixel border on different sides)."""
    grid = SIZE // PATCH
    coords = table.coords.astype(np.float64)
    scale = np.array([SIZE / table.source_size[0], SIZE / table.source_size[1]])
    with np.errstate(invalid="ignore"):
        nearest = np.floor((coords + 0.5) * scale)  # floor(((v + 0.5) * s - 0.5) + 0.5)
        inside = (~np.isnan(coords).any(-1)) & (nearest >= 0).all(-1) & (nearest < SIZE).all(-1)
    rows, cols = np.nonzero(inside)
    reference = (nearest[inside] // PATCH).astype(int)
    query = (rows // PATCH) * grid + cols // PATCH
    counts = np.bincount(query * grid * grid + reference[:, 0] * grid + reference[:, 1], minlength=grid ** 4)
    return counts.reshape(grid * grid, grid * grid) / float(PATCH * PATCH)


def _prior_difference(ours: CoordinateTable, theirs: CoordinateTable) -> float:
    """The share of the overlap prior's mass (:func:`resized_reference_prior`) placed elsewhere by their map than by
    our table: half the summed absolute difference over the larger mass (each query patch weighs as many pixels as
    it traces, so that a patch with a few traced pixels at a border weighs little)."""
    mine, their = resized_reference_prior(ours), resized_reference_prior(theirs)
    mass = max(float(mine.sum()), float(their.sum()))
    return 0.5 * float(np.abs(mine - their).sum()) / mass if mass > 0 else 0.0


def _cases(images: list[Path], per_op: int, draws: int, small_photo: Path) -> list[dict]:
    cases = []
    for index, op in enumerate(OPERATIONS):
        for k in range(per_op):
            cases.append({"id": f"{op}-{k}", "op": op, "image": str(images[k % len(images)]),
                          "other": str(images[(k + 1) % len(images)]), "seed": 1000 * index + k})
    for index, op in enumerate(ALBUMENTATIONS_OPS):
        for k in range(draws):
            cases.append({"id": f"albumentations-{op}-{k}", "op": f"albumentations:{op}",
                          "image": str(small_photo), "seed": 50_000 + 1000 * index + k})
    return cases


def _their_config(authors_code: Path) -> dict:
    from omegaconf import OmegaConf

    config = OmegaConf.load(authors_code / "core" / "configs" / "descriptor_default_config.yaml")
    return OmegaConf.to_container(config.input.augmentation, resolve=True)


def run_worker(authors_python: str, authors_code: Path, request: dict, folder: Path) -> None:
    (folder / "request.json").write_text(json.dumps(request))
    package_root = Path(__file__).resolve().parents[2]
    environment = dict(os.environ, PYTHONPATH=str(package_root))
    command = [authors_python, "-m", "copynce_hf.fidelity.authors_augmentation", "--authors-code", str(authors_code),
               "--request", str(folder / "request.json"), "--output", str(folder / "theirs")]
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise CopyNCEError(f"the authors' augmentation failed in {authors_python}:\n{result.stderr[-3000:]}")


def table_measures(table: CoordinateTable, maps: np.ndarray, original: Image.Image, their_copy: np.ndarray,
                   tolerance: float = MAP_TOLERANCE) -> dict[str, float]:
    """Our table of a copy against their map and convention-free map of it (``maps``: (2, 2, S, S)):
    :func:`map_measures`, the overlap priors made from each (``prior``, ``exact_prior``) and the content measure
    (``content``: their copy's pixels against the original at our positions minus at their map's).

    The priors are those of a reference resized from the original (:func:`resized_reference_prior`)."""
    source_size = (original.height, original.width)
    source = np.asarray(original, dtype=np.float64)
    their_table, exact_table = (_their_table(mapping, source_size) for mapping in maps)
    measures = map_measures(table, maps, source_size, tolerance)
    measures["prior"] = _prior_difference(table, their_table)
    measures["exact_prior"] = _prior_difference(table, exact_table)
    measures["content"] = _content_error(their_copy, source, table) - _content_error(their_copy, source, their_table)
    return measures


def _edit_case(case: dict, folder: Path) -> dict[str, float]:
    """One case: our edits with their parameters, compared with their copy and map."""
    record = json.loads((folder / "theirs" / f"{case['id']}.json").read_text())
    original = Image.open(case["image"]).convert("RGB")
    source_size = (original.height, original.width)
    image, table = original, CoordinateTable.identity(*source_size)
    for edit in edits_of_case(case, record, source_size) + [Resize(SIZE, SIZE, "bicubic")]:
        image, table = edit(image, table)
    theirs = np.asarray(Image.open(folder / "theirs" / f"{case['id']}.png").convert("RGB"), dtype=np.float64)
    measures = {"pixels": float(np.abs(np.asarray(image, dtype=np.float64) - theirs).mean())}
    if case["op"] in MAPPED:
        measures.update(table_measures(table, np.load(folder / "theirs" / f"{case['id']}.npy"), original, theirs))
    return measures


def map_rows(label: str, worst: dict[str, float], median: float, tolerance: float = MAP_TOLERANCE,
             prior_limit: float = PRIOR_LIMIT, content: str = "worst case") -> list[Row]:
    """The rows of ``label`` (``"data, affine"``, ``"chain, descriptor"``) from the worst measures of its cases
    (:func:`table_measures` with ``tolerance``; ``content``: which case ``worst["content"]`` is); ``median``: the
    median distance to their map (reported)."""
    return [
        Row(f"{label}: MaskMapper map vs PixTrace table, both traced, > {tolerance:g} px apart (median distance "
            f"{median:.2f} px, largest {worst['largest']:.2f})", "share", worst["apart"], 0.0, 1.0),
        Row(f"{label}: MaskMapper map vs PixTrace table, traced by one only, > {tolerance:g} px from the other's "
            "region", "share", worst["stray"], 0.0, 1.0),
        Row(f"{label}: their copy vs source at PixTrace table minus at MaskMapper map ({content})", "mean abs (grey)",
            worst["content"], 0.0, 255.0),
        Row(f"{label}: overlap prior from MaskMapper map vs PixTrace table", "mass moved", worst["prior"], prior_limit,
            1.0),
        Row(f"{label}: convention-free map vs PixTrace table, both traced, 99th percentile distance", "copy px",
            worst["exact_p99"], EXACT_P99, 1.0),
        Row(f"{label}: convention-free map vs PixTrace table, both traced, > 1 px apart (largest distance "
            f"{worst['exact_max']:.2f} px)", "share", worst["exact_far"], EXACT_FAR_SHARE, 1.0),
        Row(f"{label}: convention-free map vs PixTrace table, traced by one only, > 1 px from the other's region",
            "share", worst["exact_stray"], 0.0, 1.0),
        Row(f"{label}: overlap prior from convention-free map vs PixTrace table", "mass moved", worst["exact_prior"],
            EXACT_PRIOR_LIMIT, 1.0),
    ]


def _edit_rows(cases: list[dict], folder: Path) -> list[Row]:
    """Per edit: pixels, tables and priors of their copies against ours (limits: :data:`DATA_LIMITS`)."""
    results: dict[str, list[dict]] = {}
    for case in cases:
        if not case["op"].startswith(("albumentations:", "chain:")):
            results.setdefault(case["op"], []).append(_edit_case(case, folder))
    rows = []
    for op, values in results.items():
        worst = {key: max(value[key] for value in values) for key in values[0]}
        rows.append(Row(f"data, {op}: pixels, their class vs our edit, same parameters ({len(values)} photos)",
                        "mean abs (grey)", worst["pixels"], DATA_LIMITS[op], 255.0))
        if op in MAPPED:
            rows += map_rows(f"data, {op}", worst, float(np.median([value["median"] for value in values])))
    return rows


def _albumentations_rows(cases: list[dict], folder: Path) -> list[Row]:
    """Per operation: mean |change| under their 1.3.1 against ours under 2.x, over the same number of draws."""
    changes: dict[str, tuple[list, list]] = {}
    for case in cases:
        if not case["op"].startswith("albumentations:"):
            continue
        op = case["op"].split(":", 1)[1]
        original = Image.open(case["image"]).convert("RGB")
        source = np.asarray(original, dtype=np.float64)
        theirs = json.loads((folder / "theirs" / f"{case['id']}.json").read_text())["change"]
        ours = Albumentation(op=op, seed=case["seed"]).transform(original)
        pair = changes.setdefault(op, ([], []))
        pair[0].append(theirs)
        pair[1].append(np.abs(np.asarray(ours, dtype=np.float64) - source).mean())
    rows = []
    for op, (theirs, ours) in changes.items():
        their_mean, our_mean = float(np.mean(theirs)), float(np.mean(ours))
        relative = abs(our_mean - their_mean) / max(their_mean, 1e-9)
        rows.append(Row(f"data, additional {op}: mean change, albumentations 1.3.1 vs ours ({len(theirs)} draws; "
                        f"{their_mean:.2f} vs {our_mean:.2f} grey)", "relative", relative, ALBUMENTATIONS_LIMIT,
                        their_mean))
        quantiles = [np.quantile(values, [0.1, 0.5, 0.9]) for values in (theirs, ours)]
        critical = 1.95 * np.sqrt(2 / len(theirs))
        rows.append(Row(f"data, additional {op}: distribution of the change, 1.3.1 vs ours (10/50/90 %: "
                        f"{'/'.join(f'{v:.2f}' for v in quantiles[0])} vs {'/'.join(f'{v:.2f}' for v in quantiles[1])})",
                        "KS", ks_statistic(np.asarray(theirs), np.asarray(ours)), float(critical), their_mean))
    return rows


def ks_statistic(first: np.ndarray, second: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical distributions (its
    critical value at the 0.1 % level is 1.95 sqrt((n + m) / nm))."""
    points = np.union1d(first, second)
    cdf = [np.searchsorted(np.sort(sample), points, side="right") / len(sample) for sample in (first, second)]
    return float(np.abs(cdf[0] - cdf[1]).max())


def run_data_checks(authors_code: str | Path, authors_python: str, images: list[Path], per_op: int = 6,
                    draws: int = 200, work_folder: str | Path | None = None) -> list[Row]:
    """Compare this package's edits and tables with the authors' augmentation (module docstring).

    Args:
        authors_code: a checkout of GitHub eddielyc/CopyNCE.
        authors_python: the Python of the authors' environment (albumentations 1.3.1).
        images: photographs (at least 2); each edit runs on ``per_op`` of them in turn.
        per_op: cases per edit; draws: seeded draws per albumentations operation.
        work_folder: where their outputs go (a temporary folder by default).
    """
    if len(images) < 2:
        raise CopyNCEError("the data checks need at least 2 images")
    authors_code = Path(authors_code).resolve()
    if not Path(authors_python).is_file():
        raise CopyNCEError(f"{authors_python} is not a Python of the authors' environment; build one as "
                           "scripts/check_against_authors.py --help says")
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(work_folder) if work_folder else Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        small_photo = folder / "photo-128.png"  # the albumentations draws: many, on a small photo
        Image.open(images[0]).convert("RGB").resize((128, 128), Image.BICUBIC).save(small_photo)
        cases = _cases(list(images), per_op, draws, small_photo)
        request = {"config": _their_config(authors_code), "image_size": SIZE, "cases": cases}
        run_worker(authors_python, authors_code, request, folder)
        return _edit_rows(cases, folder) + _albumentations_rows(cases, folder)
