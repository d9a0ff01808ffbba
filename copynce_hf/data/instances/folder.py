"""A folder of training instances made from a folder of photos, with a manifest of where each came from.

:func:`make_instances` writes, in this name order: the whole photos (if asked), the grid cells, the
collages, the cutmixes, the procedural images, and last the held-out photos, unchanged. Every written
name starts with its number (``00042-...``), so the folder sorts in that order; the held-out photos keep
their own names where those sort after every number (names starting with a letter do) and are numbered
too otherwise. A training run that holds out its folder's last ``num_eval_images`` images (see
:func:`copynce_hf.training.data.indexed_copies`) then evaluates on exactly those photos, whole, and none
of them is a source of any instance. ``instances.json`` beside the images lists every file with its kind,
its source photo(s) and where it was cut or pasted (a ``.json`` file is not an image: training ignores it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ...images import load_image
from ...modeling.errors import MIN_IMAGE_SIDE, ConfigError, ImageLoadError
from ..loading import IMAGE_EXTENSIONS
from .grid import grid_cells, smallest_cell
from .mixes import collage, cutmix, mix_groups
from .procedural import PROCEDURAL_STYLES, procedural_image

logger = logging.getLogger(__name__)

__all__ = ["MANIFEST", "InstancePlan", "list_photos", "make_instances", "read_manifest"]

#: The manifest's file name, written into the output folder.
MANIFEST = "instances.json"
_SPEC_TOKEN = re.compile(r"(photos)|grid(\d+)(?:gap([0-9.]+))?|(collage|cutmix|procedural)(\d+)")
_SMALL = ("whole", "skip", "error")
#: Seed streams of the two mix kinds, apart from each other and from the procedural images'.
_STREAMS = {"collage": 0xC011A6E, "cutmix": 0xC07313}


@dataclasses.dataclass(frozen=True)
class InstancePlan:
    """Which instances to make from the training photos.

    Attributes:
        photos: keep each photo whole, as an instance of its own.
        grid: cut each photo into ``grid x grid`` cells (0: no cells; see :func:`grid_boxes`).
        gap: the band left out between cells, a fraction of the photo's side.
        collages / cutmixes / procedural: how many collages (2-4 photos), cutmixes (2-3 photos) and
            procedural images to make.
        side: the longer side of a collage or cutmix, the side of a procedural image (pixels).
        min_side: the smallest grid cell side; ``small`` says what becomes of a photo too small for the grid:
            ``"whole"`` (kept whole), ``"skip"`` (left out) or ``"error"``.
        max_uses: the most mixes (collages and cutmixes, each kind apart) a photo may take part in.
        image_format: ``"jpg"`` (quality 95) or ``"png"``, for the images made here.
    """

    photos: bool = False
    grid: int = 0
    gap: float = 0.0
    collages: int = 0
    cutmixes: int = 0
    procedural: int = 0
    side: int = 384
    min_side: int = 64
    small: str = "whole"
    max_uses: int | None = None
    image_format: str = "jpg"

    def __post_init__(self):
        if self.grid == 1 or self.grid < 0:
            raise ConfigError(f"grid must be 0 (no cells) or >= 2 cells per side, got {self.grid}")
        for name in ("collages", "cutmixes", "procedural"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.small not in _SMALL:
            raise ConfigError(f"small must be one of {_SMALL}, got {self.small!r}")
        if self.image_format not in ("jpg", "png"):
            raise ConfigError(f"image_format must be 'jpg' or 'png', got {self.image_format!r}")
        if not 0.0 <= self.gap < 0.5:
            raise ConfigError(f"gap must be a fraction of the photo's side in [0, 0.5), got {self.gap}")
        if self.min_side < MIN_IMAGE_SIDE:
            raise ConfigError(f"min_side must be at least {MIN_IMAGE_SIDE} pixels (one ViT patch), got {self.min_side}")
        if self.side < 32:
            raise ConfigError(f"side must be at least 32 pixels, got {self.side}")
        if not (self.photos or self.grid or self.collages or self.cutmixes or self.procedural):
            raise ConfigError("the plan makes no instance: ask for photos, a grid, collages, cutmixes or procedural")

    @classmethod
    def parse(cls, spec: str, **settings) -> InstancePlan:
        """A plan from a comma-separated spec: ``photos``, ``grid2`` (``grid2gap0.05``: with a gap),
        ``collage500``, ``cutmix500``, ``procedural500``; e.g. ``"photos,procedural560"``."""
        fields = {}
        for token in (part.strip() for part in spec.split(",")):
            match = _SPEC_TOKEN.fullmatch(token)
            if not match:
                raise ConfigError(f"instances spec {spec!r}: cannot read {token!r}; use photos, grid<N>[gap<F>], "
                                  "collage<N>, cutmix<N> or procedural<N>, comma-separated")
            if match.group(1):
                fields["photos"] = True
            elif match.group(2):
                fields.update(grid=int(match.group(2)), gap=float(match.group(3) or 0.0))
            else:
                fields[{"collage": "collages", "cutmix": "cutmixes"}.get(match.group(4), match.group(4))] = \
                    int(match.group(5))
        return cls(**fields, **settings)


def list_photos(folder: str | Path) -> list[Path]:
    """The image files under ``folder`` (sub-folders included), in the order training reads them (sorted paths)."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"photo folder {str(root)!r} does not exist or is not a folder")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ConfigError(f"photo folder {str(root)!r} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def read_manifest(folder: str | Path) -> dict | None:
    """The manifest of an instance folder, ``None`` if it has none: ``settings`` (the plan's fields, ``seed``,
    ``held_out``, ``link``), ``photos`` and ``held_out_photos`` (the paths given) and ``instances`` (the records
    :func:`make_instances` returns)."""
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _prepare_output(output: Path, overwrite: bool) -> None:
    """Create ``output``; an existing one must be empty, or (``overwrite``) loses its images and manifest."""
    output.mkdir(parents=True, exist_ok=True)
    made = [p for p in output.iterdir() if p.name == MANIFEST or p.suffix.lower() in IMAGE_EXTENSIONS]
    if made and not overwrite:
        raise ConfigError(f"output folder {str(output)!r} already holds images ({made[0].name}, ...); "
                          "choose an empty folder or overwrite it")
    for path in made:
        path.unlink()


def _load(path: Path, max_side: int | None = None):
    try:
        image = load_image(path, max_side=max_side)
    except ImageLoadError as error:
        raise ConfigError(f"cannot make instances of {path}: {error}") from error
    if max_side is not None:
        image.thumbnail((max_side, max_side))
    return image


def _grid_items(photos: Sequence[Path], plan: InstancePlan):
    """``(name tail, record, image or path)`` of each grid cell of ``photos``; a photo too small for the grid
    is kept whole (its path), left out or refused, as ``plan.small`` says."""
    small = 0
    for path in photos:
        image = _load(path)
        if smallest_cell(image.size, plan.grid, plan.gap) < plan.min_side and plan.small != "error":
            small += 1
            if plan.small == "whole" and not plan.photos:  # (with plan.photos it is whole already)
                yield path.stem, {"kind": "photo", "sources": [str(path)], "note": "too small for the grid"}, path
            continue
        for (row, column, box), cell in grid_cells(image, plan.grid, plan.gap, plan.min_side, name=str(path)):
            yield (f"{path.stem}-grid{plan.grid}r{row}c{column}",
                   {"kind": "grid", "sources": [str(path)], "cell": [row, column], "boxes": [list(box)]}, cell)
    if small:
        logger.warning("%d photo(s) too small for a %dx%d grid with cells of >= %d pixels: %s", small, plan.grid,
                       plan.grid, plan.min_side, "kept whole" if plan.small == "whole" else "left out")


def _mix_items(kind: str, count: int, photos: Sequence[Path], plan: InstancePlan, seed: int):
    """``(name tail, record, image)`` of each of ``count`` mixes of ``kind`` (collage / cutmix) of ``photos``."""
    sizes, make = ((2, 3, 4), collage) if kind == "collage" else ((2, 3), cutmix)
    groups = mix_groups(count, len(photos), sizes, np.random.default_rng([seed, _STREAMS[kind]]), plan.max_uses,
                        kind)
    for index, group in enumerate(groups):
        rng = np.random.default_rng([seed, _STREAMS[kind], index])
        image, parts = make([_load(photos[i], plan.side) for i in group], plan.side, rng)
        record = {"kind": kind, "sources": [str(photos[group[position]]) for position, _ in parts],
                  "boxes": [list(box) for _, box in parts]}
        yield f"{kind}{len(group)}", record, image


def _procedural_items(count: int, plan: InstancePlan, seed: int):
    """``(name tail, record, image)`` of procedural images ``0 .. count - 1`` of ``seed``."""
    for index in range(count):
        style = PROCEDURAL_STYLES[index % len(PROCEDURAL_STYLES)]
        yield (f"procedural-{style}", {"kind": "procedural", "sources": [], "style": style, "index": index},
               procedural_image(index, seed, (plan.side, plan.side), style))


def _count(plan: InstancePlan, photos: int) -> int:
    """Instances the plan makes of ``photos`` photos (photos too small for the grid counted as cut)."""
    return photos * plan.photos + photos * plan.grid ** 2 + plan.collages + plan.cutmixes + plan.procedural


def _write(item, output: Path, number: str, plan: InstancePlan, link: bool) -> dict:
    """Write one instance (an image, or a photo copied or linked as it is) as ``<number>-<tail>``."""
    tail, record, content = item
    if isinstance(content, Path):
        target = output / f"{number}-{tail}{content.suffix}"
        _place(content, target, link)
    else:
        target = output / f"{number}-{tail}.{plan.image_format}"
        content.save(target, **({"quality": 95} if plan.image_format == "jpg" else {}))
    return {"file": target.name, **record}


def _place(source: Path, target: Path, link: bool) -> None:
    """``target`` as a symbolic link to ``source`` (``link``) or a byte copy of it."""
    if link:
        target.symlink_to(source.resolve())
    else:
        shutil.copyfile(source, target)


def make_instances(photos: Sequence[str | Path], output: str | Path, plan: InstancePlan, seed: int = 0,
                   held_out: Sequence[str | Path] = (), link: bool = False, overwrite: bool = False,
                   progress: bool = False) -> list[dict]:
    """Write the instances ``plan`` makes of ``photos`` into ``output``, then the ``held_out`` photos, last.

    Args:
        photos: the training photos, the only sources of instances.
        output: the instance folder (made; an existing one must hold no image unless ``overwrite``).
        plan: which instances (:class:`InstancePlan`).
        seed: every random draw (mixes, procedural images) follows from it: the same call writes the same files.
        held_out: photos kept out of every instance and written whole, after all the others in name order.
        link: whole photos (``plan.photos`` and ``held_out``) as symbolic links instead of copies.
        progress: show a progress bar.

    Returns:
        The manifest's records, one per file in name order: ``file``, ``kind`` (``photo``, ``grid``,
        ``collage``, ``cutmix``, ``procedural``, ``held_out``), ``sources`` and, by kind, ``boxes``
        (cut from a photo: its pixels; pasted: the instance's), ``cell``, ``style``, ``index``.
    """
    photos, held_out, output = [Path(p) for p in photos], [Path(p) for p in held_out], Path(output)
    _check_sources(photos, held_out, plan)
    _prepare_output(output, overwrite)
    items = [((path.stem, {"kind": "photo", "sources": [str(path)]}, path) for path in photos)
             if plan.photos else (),
             _grid_items(photos, plan) if plan.grid else (),
             _mix_items("collage", plan.collages, photos, plan, seed),
             _mix_items("cutmix", plan.cutmixes, photos, plan, seed),
             _procedural_items(plan.procedural, plan, seed)]
    width = max(5, len(str(_count(plan, len(photos)) + len(held_out))))
    records = []
    bar = tqdm(total=_count(plan, len(photos)), desc="instances", unit="img", disable=not progress)
    for group in items:
        for item in group:
            records.append(_write(item, output, f"{len(records):0{width}d}", plan, link))
            bar.update(1)
    bar.total = len(records)  # photos too small for the grid made fewer
    bar.close()
    records += _write_held_out(held_out, output, records, width, link)
    settings = {**dataclasses.asdict(plan), "seed": seed, "held_out": len(held_out), "link": link}
    lines = ",\n".join(f"  {json.dumps(record)}" for record in records)  # one line per file
    head = {"settings": settings, "photos": [str(p) for p in photos], "held_out_photos": [str(p) for p in held_out]}
    (output / MANIFEST).write_text(f'{json.dumps(head)[:-1]},\n "instances": [\n{lines}\n]}}\n', encoding="utf-8")
    logger.info("%d instances of %d photos (%s) and %d held-out photos written to %s", len(records) - len(held_out),
                len(photos), ", ".join(f"{kind} {n}" for kind, n in _kinds(records).items()), len(held_out), output)
    return records


def _check_sources(photos: list[Path], held_out: list[Path], plan: InstancePlan) -> None:
    if not photos and (plan.photos or plan.grid or plan.collages or plan.cutmixes):
        raise ConfigError("no training photo to make instances of (only procedural images need none)")
    missing = [p for p in [*photos, *held_out] if not p.is_file()]
    if missing:
        raise ConfigError(f"photo {str(missing[0])!r} does not exist ({len(missing)} missing)")
    shared = {p.resolve() for p in photos} & {p.resolve() for p in held_out}
    if shared:
        raise ConfigError(f"photo {str(sorted(shared)[0])!r} is both a training photo and a held-out one")


def _write_held_out(held_out: list[Path], output: Path, records: list[dict], width: int, link: bool) -> list[dict]:
    """The held-out photos, whole: under their own names where those sort after every instance (and differ),
    numbered on from the instances otherwise."""
    names = [path.name for path in held_out]
    keep = len(set(names)) == len(names) and all(name > record["file"] for name in names for record in records[-1:])
    if held_out and not keep:
        logger.info("the held-out photos' names would not sort after the instances': they are numbered too")
    written = []
    for offset, path in enumerate(held_out):
        name = path.name if keep else f"{len(records) + offset:0{width}d}-{path.name}"
        _place(path, output / name, link)
        written.append({"file": name, "kind": "held_out", "sources": [str(path)]})
    return written


def _kinds(records: list[dict]) -> dict[str, int]:
    found: dict[str, int] = {}
    for record in records:
        if record["kind"] != "held_out":
            found[record["kind"]] = found.get(record["kind"], 0) + 1
    return found
