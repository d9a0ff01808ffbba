"""The template task of :mod:`benchmarks.templates.systems`: a dedup collection and a detection task in which unrelated
photos share a template, built from one pool of ``../shared/data/imagenet-sample`` (:data:`POOLS`).

**Dedup collection** (:class:`DedupPlan`, about 200 images): photos with one or two copies made with the
evaluation recipe (``CopyRecipe.minidisc_queries()``), groups whose original is absent (two copies only), copies
put into a template, originals put into a template, a copy of a copy put into a template, unrelated photos
("strangers") put into the same templates, and plain photos. Every template hosts photos of different originals.
``truth.json`` lists the pool, each image's photo, role, template and edits (the recipe's and the template's, as
PixTrace records them), the groups of copies of one photo, and each template's members.

**Detection task** (:class:`DetectPlan`, mini-DISC's shape): plain reference photos, framed strangers (unrelated
photos put into the task's own templates) as extra references, and queries: copies of references made with the
recipe and then put into the templates, plain copies, and edited distractors. The references are written twice:
with the framed strangers (``references/``) and without them (``references_plain/``), for the same queries.

**Pools** (:func:`pool_photos`; the two are disjoint by construction, no photo is in both splits):

* ``evaluation``: the ``reference`` and ``distractor`` splits (400 photos), which no model trained on and on which
  nothing is tuned: the reported draws. The detection task has 237 plain references there
  (:data:`EVALUATION_DETECT`: the 400 photos hold its 3 template backgrounds, 60 strangers and 100 distractors
  besides them), every query as on the dev pool;
* ``dev``: the ``train`` split (600 photos; the embedded models trained on all but the last 40): the development
  draws, on which the pipeline's defaults were chosen. Every figure before 29 November (ninth session) was
  measured on this pool.

Photos are drawn from the pool with fixed seeds: one permutation; the dedup collection takes its photos from the
front, the detection task from what the collection leaves (then from the collection's own photos, only where the
pool runs short: the two tasks are measured apart).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from copynce_hf.pixtrace import CoordinateTable, CopyRecipe

from ..common import fresh_folder
from .designs import Template, make_templates

__all__ = ["DedupPlan", "DetectPlan", "DEFAULT_DEDUP", "DEFAULT_DETECT", "EVALUATION_DETECT", "DETECT_PLANS", "POOLS",
           "build_dedup_collection", "build_detect_task", "draw_photos", "pool_photos", "GROUP_SHAPES", "true_pairs",
           "template_of"]

#: The photo pools: name -> the splits of ``imagenet-sample`` they hold (see the module).
POOLS: dict[str, tuple[str, ...]] = {"evaluation": ("reference", "distractor"), "dev": ("train",)}

#: The groups of the dedup collection: name -> its images as (role, recipe applied, parent, put into a template).
#: ``parent`` is the index (in the group) of the image whose pixels are edited, ``None`` for the photo itself.
GROUP_SHAPES: dict[str, tuple[tuple[str, bool, int | None, bool], ...]] = {
    "pairs": (("original", False, None, False), ("copy", True, None, False)),
    "triples": (("original", False, None, False), ("copy", True, None, False), ("copy", True, None, False)),
    "absent": (("copy", True, None, False), ("copy", True, None, False)),
    "framed_copies": (("original", False, None, False), ("framed copy", True, None, True)),
    "framed_originals": (("original", False, None, False), ("framed original", False, None, True)),
    "absent_framed": (("copy", True, None, False), ("framed copy of a copy", False, 0, True)),
    "strangers": (("stranger", False, None, True),),
    "singles": (("original", False, None, False),),
}


@dataclasses.dataclass(frozen=True)
class DedupPlan:
    """How many groups of each shape of :data:`GROUP_SHAPES` the collection holds (default: 200 images, 128
    photos, 58 images in 12 templates), and templates of each kind."""

    pairs: int = 22
    triples: int = 10
    absent: int = 8
    framed_copies: int = 12
    framed_originals: int = 6
    absent_framed: int = 4
    strangers: int = 36
    singles: int = 30
    templates_per_kind: int = 3

    @property
    def photos(self) -> int:
        return sum(getattr(self, name) for name in GROUP_SHAPES)

    @property
    def hosted(self) -> int:
        """Images put into a template."""
        return sum(getattr(self, name) * sum(framed for *_, framed in shape) for name, shape in GROUP_SHAPES.items())

    def check(self) -> None:
        templates = 4 * self.templates_per_kind
        if self.templates_per_kind < 1 or self.hosted < 2 * templates:
            raise ValueError(f"{self.hosted} images put into templates cannot give each of the {templates} templates "
                             "two unrelated photos")


@dataclasses.dataclass(frozen=True)
class DetectPlan:
    """The detection task: plain references, framed strangers among the references, queries (framed copies of
    references, plain copies, distractors), templates of each kind (mini-DISC's 300 references and 250 queries)."""

    references: int = 300
    strangers: int = 60
    framed_queries: int = 80
    plain_queries: int = 70
    distractors: int = 100
    templates_per_kind: int = 3

    def check(self) -> None:
        if self.framed_queries + self.plain_queries > self.references:
            raise ValueError(f"{self.framed_queries} + {self.plain_queries} copies need as many references, "
                             f"got {self.references}")


#: The default plans (the benchmark's task).
DEFAULT_DEDUP = DedupPlan()
DEFAULT_DETECT = DetectPlan()
#: The detection task on the evaluation pool: 237 plain references, so that the 400 photos hold them with the 3
#: template backgrounds, 60 strangers and 100 distractors; the queries as in :data:`DEFAULT_DETECT`.
EVALUATION_DETECT = dataclasses.replace(DEFAULT_DETECT, references=237)
#: The detection plan of each pool.
DETECT_PLANS = {"evaluation": EVALUATION_DETECT, "dev": DEFAULT_DETECT}


@dataclasses.dataclass
class _Item:
    """One image to make: its photo, role, whether the recipe edits it, the item it is made from, its template."""

    key: tuple[int, int]
    photo: Path
    role: str
    recipe: bool
    parent: tuple[int, int] | None
    template: Template | None = None


# ---------------------------------------------------------------------------------------------- photos


def pool_photos(pool: str, data: Path) -> list[Path]:
    """The photos of ``pool`` (:data:`POOLS`) in ``<data>/imagenet-sample``, each split's sorted by name. A missing
    data folder is a :class:`FileNotFoundError` that says so."""
    from copynce_hf.evaluation.minidisc import read_splits

    if pool not in POOLS:
        raise ValueError(f"pool {pool!r} is none of {', '.join(POOLS)}")
    splits_csv = Path(data) / "imagenet-sample-splits.csv"
    if not splits_csv.is_file():
        raise FileNotFoundError(f"{splits_csv} not found: the shared benchmark data (imagenet-sample) is only present "
                                "in CI and dev sessions")
    splits = read_splits(splits_csv, Path(data) / "imagenet-sample")
    return [photo for split in POOLS[pool] for photo in splits.get(split, [])]


def draw_photos(pool: list[Path], seed: int, dedup: DedupPlan, detect: DetectPlan) -> dict[str, list[Path]]:
    """The photos of both tasks from one seeded permutation of ``pool``: ``dedup_backgrounds``, ``dedup`` (one
    per group), then ``detect_backgrounds``, ``references``, ``strangers`` and ``distractors`` from the photos the
    collection leaves, followed by the collection's own where the pool runs short."""
    order = [pool[i] for i in np.random.default_rng(seed).permutation(len(pool))]
    used = dedup.templates_per_kind + dedup.photos
    needed = detect.templates_per_kind + detect.references + detect.strangers + detect.distractors
    if used > len(pool) or needed > len(pool):
        raise ValueError(f"the pool has {len(pool)} photos; the dedup collection needs {used}, the detection task "
                         f"{needed}")
    rest = order[used:] + order[:used]
    cuts = np.cumsum([0, detect.templates_per_kind, detect.references, detect.strangers, detect.distractors])
    names = ("detect_backgrounds", "references", "strangers", "distractors")
    photos = {"dedup_backgrounds": order[:dedup.templates_per_kind], "dedup": order[dedup.templates_per_kind:used]}
    photos.update({name: rest[start:stop] for name, start, stop in zip(names, cuts[:-1], cuts[1:])})
    return photos


def _open(photo: Path) -> tuple[Image.Image, CoordinateTable]:
    image = Image.open(photo).convert("RGB")
    return image, CoordinateTable.identity(image.height, image.width)


def _edit(image: Image.Image, table: CoordinateTable, recipe: CopyRecipe | None, template: Template | None,
          rng: np.random.Generator) -> tuple[Image.Image, CoordinateTable, list[dict]]:
    """``image`` (traced to its photo by ``table``) edited by a draw of ``recipe`` and put into ``template``."""
    edits = list(recipe.draw(rng, (image.height, image.width))) if recipe is not None else []
    done = []
    for edit in edits:
        image, table = edit(image, table)
        done.append(edit.to_dict())
    for edit in template.edits(image.height, image.width) if template is not None else []:
        image, table = edit(image, table)
        done.append(edit.to_dict())
    return image, table, done



# ---------------------------------------------------------------------------------------------- dedup collection


def _plan_items(plan: DedupPlan, photos: list[Path], templates: list[Template], rng: np.random.Generator) -> list[_Item]:
    """Every image of the collection, groups in :data:`GROUP_SHAPES` order, one photo per group; the images put
    into templates shuffled and dealt to the templates in turn (so a template hosts photos of different groups)."""
    shapes = [shape for name, shape in GROUP_SHAPES.items() for _ in range(getattr(plan, name))]
    items, hosted = [], []
    for group, (shape, photo) in enumerate(zip(shapes, photos, strict=True)):
        for member, (role, recipe, parent, framed) in enumerate(shape):
            items.append(_Item((group, member), photo, role, recipe, None if parent is None else (group, parent)))
            if framed:
                hosted.append(items[-1])
    for number, position in enumerate(rng.permutation(len(hosted))):
        hosted[int(position)].template = templates[number % len(templates)]
    return items


def build_dedup_collection(folder: Path, source: list[Path], seed: int = 0, plan: DedupPlan = DEFAULT_DEDUP,
                           detect: DetectPlan = DEFAULT_DETECT, pool: str | None = None) -> dict:
    """Write the collection of the photos ``source`` (those of ``pool``, :func:`pool_photos`; the name is recorded)
    into ``folder/collection`` (PNG, ids ``img000``, ... in a shuffled order), its templates into
    ``folder/templates`` and ``folder/truth.json``; returns the truth (``pool``, then :func:`_dedup_truth`'s)."""
    plan.check()
    photos = draw_photos(source, seed, plan, detect)
    templates = make_templates(fresh_folder(folder / "templates"), "", plan.templates_per_kind,
                               photos["dedup_backgrounds"], np.random.default_rng([seed, 10]))
    items = _plan_items(plan, photos["dedup"], templates, np.random.default_rng([seed, 11]))
    order = np.random.default_rng([seed, 12]).permutation(len(items))
    ids = {items[int(position)].key: f"img{number:03d}" for number, position in enumerate(order)}
    collection, recipe, made = fresh_folder(folder / "collection"), CopyRecipe.minidisc_queries(), {}
    records = {}
    for index, item in enumerate(items):
        image, table, earlier = made[item.parent] if item.parent is not None else (*_open(item.photo), [])
        image, table, edits = _edit(image, table, recipe if item.recipe else None, item.template,
                                    np.random.default_rng([seed, 1, index]))
        edits = earlier + edits  # a copy of a copy: its parent's edits, then its own
        made[item.key] = (image, table, edits)
        image.save(collection / f"{ids[item.key]}.png")
        records[ids[item.key]] = {"photo": item.photo.stem, "role": item.role, "template": getattr(item.template, "id", None),
                                  "derived_from": ids[item.parent] if item.parent is not None else None,
                                  "size": [image.height, image.width], "traced_fraction": table.traced_fraction,
                                  "edits": edits}
    truth = {"pool": pool, **_dedup_truth(records, templates, plan, seed)}
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


def _dedup_truth(records: dict[str, dict], templates: list[Template], plan: DedupPlan, seed: int) -> dict:
    """``images`` (id -> photo, role, template, derived_from, size, traced_fraction, edits), ``groups`` (the ids of
    each photo with two images or more, in id order), ``templates`` (id -> description and ``members``)."""
    by_photo: dict[str, list[str]] = {}
    for image_id in sorted(records):
        by_photo.setdefault(records[image_id]["photo"], []).append(image_id)
    members = {template.id: sorted(i for i, record in records.items() if record["template"] == template.id)
               for template in templates}
    return {"seed": seed, "plan": dataclasses.asdict(plan), "recipe": "CopyRecipe.minidisc_queries()",
            "images": dict(sorted(records.items())),
            "groups": sorted(group for group in by_photo.values() if len(group) > 1),
            "templates": {template.id: {**template.to_dict(), "members": members[template.id]} for template in templates}}


def true_pairs(truth: dict) -> set[frozenset[str]]:
    """Every unordered pair of images of one photo (a truth's ``groups``)."""
    return {frozenset((a, b)) for group in truth["groups"] for i, a in enumerate(group) for b in group[i + 1:]}


def template_of(truth: dict) -> dict[str, str | None]:
    """Image id -> the id of the template it was put into (``None``: none)."""
    return {image_id: record["template"] for image_id, record in truth["images"].items()}


# ---------------------------------------------------------------------------------------------- detection task


def build_detect_task(folder: Path, source: list[Path], seed: int = 0, plan: DetectPlan = DEFAULT_DETECT,
                      dedup: DedupPlan = DEFAULT_DEDUP, pool: str | None = None) -> dict:
    """Write the detection task of the photos ``source`` (those of ``pool``, recorded) into ``folder``:
    ``references_plain/`` (the plain references), ``strangers/`` (the framed strangers), ``references/`` (both,
    hard links), ``queries/``, ``ground_truth.csv`` (``query_id,reference_id``, empty for a distractor, as
    mini-DISC writes it), ``templates/`` and ``truth.json``; returns the truth (``pool``, ``references``,
    ``queries``, ``templates``: each image's photo, role, template, edits; a query's ``reference``)."""
    plan.check()
    photos = draw_photos(source, seed, dedup, plan)
    templates = make_templates(fresh_folder(folder / "templates"), "detect-", plan.templates_per_kind,
                               photos["detect_backgrounds"], np.random.default_rng([seed, 20]))
    rng = np.random.default_rng([seed, 21])
    references = _write_references(folder, photos, templates, rng)
    queries = _write_queries(folder, photos, references, templates, plan, seed)
    with (folder / "ground_truth.csv").open("w", encoding="utf-8") as handle:
        handle.write("query_id,reference_id\n")
        handle.writelines(f"{q},{record['reference'] or ''}\n" for q, record in sorted(queries.items()))
    truth = {"pool": pool, "seed": seed, "plan": dataclasses.asdict(plan), "recipe": "CopyRecipe.minidisc_queries()",
             "references": references, "queries": queries,
             "templates": {template.id: template.to_dict() for template in templates}}
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


def _write_references(folder: Path, photos: dict[str, list[Path]], templates: list[Template],
                      rng: np.random.Generator) -> dict[str, dict]:
    """The plain references and the framed strangers (ids ``R000``, ... shuffled over both), strangers dealt to the
    templates in turn; ``references/`` holds both as hard links (copies where links fail)."""
    plain, strangers, both = (fresh_folder(folder / name) for name in ("references_plain", "strangers", "references"))
    sources = [(photo, None) for photo in photos["references"]]
    sources += [(photo, templates[number % len(templates)]) for number, photo in enumerate(photos["strangers"])]
    records = {}
    for number, position in enumerate(rng.permutation(len(sources))):
        photo, template = sources[int(position)]
        reference_id = f"R{number:03d}"
        image, table, edits = _edit(*_open(photo), None, template, rng)
        path = (strangers if template else plain) / f"{reference_id}.png"
        image.save(path)
        try:
            os.link(path, both / path.name)
        except OSError:
            shutil.copyfile(path, both / path.name)
        records[reference_id] = {"photo": photo.stem, "role": "framed stranger" if template else "reference",
                                 "template": template.id if template else None, "edits": edits}
    return dict(sorted(records.items()))


def _write_queries(folder: Path, photos: dict[str, list[Path]], references: dict[str, dict],
                   templates: list[Template], plan: DetectPlan, seed: int) -> dict[str, dict]:
    """Framed copies of references (the recipe, then a template in turn), plain copies, distractors; ids ``Q000``,
    ... shuffled; query ``k`` (before shuffling) draws its edits from ``default_rng([seed, 2, k])``."""
    plain_ids = [i for i, record in references.items() if record["role"] == "reference"]
    chosen = [plain_ids[int(i)] for i in np.random.default_rng([seed, 22]).permutation(len(plain_ids))]
    photo_of = {photo.stem: photo for photo in photos["references"]}
    sources = [(photo_of[references[i]["photo"]], i, templates[n % len(templates)])
               for n, i in enumerate(chosen[:plan.framed_queries])]
    sources += [(photo_of[references[i]["photo"]], i, None)
                for i in chosen[plan.framed_queries:plan.framed_queries + plan.plain_queries]]
    sources += [(photo, None, None) for photo in photos["distractors"]]
    queries_folder, recipe, records = fresh_folder(folder / "queries"), CopyRecipe.minidisc_queries(), {}
    order = np.random.default_rng([seed, 23]).permutation(len(sources))
    for number, position in enumerate(order):
        photo, reference, template = sources[int(position)]
        image, table, edits = _edit(*_open(photo), recipe, template, np.random.default_rng([seed, 2, int(position)]))
        query_id = f"Q{number:03d}"
        image.save(queries_folder / f"{query_id}.png")
        role = "distractor" if reference is None else ("framed copy" if template else "copy")
        records[query_id] = {"photo": photo.stem, "role": role, "reference": reference,
                             "template": template.id if template else None, "edits": edits}
    return records
