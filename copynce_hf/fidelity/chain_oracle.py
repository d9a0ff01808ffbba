"""The chain oracle: the authors' whole training augmentation against this package, chain by chain.

:func:`run_chain_checks` runs their ``LyakaapAugmentation`` (descriptor and matcher configurations) end to end on
photos of several sizes with seeded draws, recording what every operation drew (:mod:`.authors_chain`), then
replays each copy with this package's edits and the same parameters and compares:

* the pixels of the copy before random erasing (the chains without an albumentations operation, whose draws
  this package does not take; those are compared by distribution in the data rows) and the erased box;
* PixTrace's table against their ``MaskMapper``'s map of the chain and against the same map without its
  conventions, and the overlap priors made from each (:func:`~.data_oracle.table_measures`);
* how often each operation applies in their chains against the paper preset's schedule, and the blur radius and
  smearing width they draw against what the preset draws on images of the same sizes.

Rows give the worst chain and quantiles over the chains. :func:`self_check_rows` proves that the rows can tell: a
preset with text on ``p`` instead of ``1 - p`` of the copies, a blur radius relative to the image, or a table
shifted by one pixel must each fail a row.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import numpy as np
from PIL import Image

from ..pixtrace import CoordinateTable, CopyRecipe, replay
from ..pixtrace.edits import (
    Blur,
    ColorJitter,
    EdgeEnhance,
    Grayscale,
    JpegQuality,
    OverlayText,
    Pad,
    Pixelization,
    RandomErasing,
    Resize,
    ShufflePixels,
    Smear,
)
from ..pixtrace.steps import BlurStep, DrawContext
from .data_oracle import (
    EXACT_P99,
    EXACT_PRIOR_LIMIT,
    SIZE,
    appearance_edits,
    edits_of_case,
    ks_statistic,
    map_rows,
    table_measures,
)
from .oracle import Row

__all__ = ["CHAIN_KINDS", "chain_cases", "chain_rows", "photo_variants", "replay_chain", "run_chain_checks",
           "self_check_rows"]

#: Their two configurations, with this package's preset of each.
CHAIN_KINDS = {"descriptor": CopyRecipe.paper_descriptor, "matcher": CopyRecipe.paper_matcher}
#: Sides the photos are given (shorter side): below the model input, as they are, well above it (their
#: originals are edited at full resolution, so a blur radius or stroke width in pixels acts on each).
VARIANT_SIDES = (160, None, 800)
#: Standard deviations a rate may be from the preset's: four, over the chains of a configuration.
RATE_SIGMAS = 4.0
#: Their map of a chain against the table, in copy pixels: each of the chain's nearest-index resizes (a crop, a
#: paste's box, the final resize: up to (1 + 1/s) / 2 pixels of its output for a resize by s, up to 2 at the
#: upscales of small crops) and truncated warps (a pixel of the warped image) adds its own offset
#: (:data:`~.data_oracle.MAP_TOLERANCE` per operation).
CHAIN_MAP_TOLERANCE = 6
#: Those offsets, about two copy pixels at most per axis, move up to four rows and columns of a 16-pixel patch.
CHAIN_PRIOR_LIMIT = 4 / 16


def photo_variants(photos: list[Path], folder: Path) -> list[Path]:
    """Each photo at :data:`VARIANT_SIDES` (bicubic), written to ``folder`` as PNG."""
    folder.mkdir(parents=True, exist_ok=True)
    variants = []
    for photo in photos:
        image = Image.open(photo).convert("RGB")
        for side in VARIANT_SIDES:
            scale = 1.0 if side is None else side / min(image.size)
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            path = folder / f"{Path(photo).stem}-{size[0]}x{size[1]}.png"
            (image if side is None else image.resize(size, Image.BICUBIC)).save(path)
            variants.append(path)
    return variants


def chain_cases(variants: list[Path], per_kind: int, first_seed: int = 70_000) -> list[dict]:
    """``per_kind`` chains of each configuration, on the variants in turn, each with its own seed; the other
    images of the pastes are drawn from all the variants (their ``background_paths``)."""
    others = [str(path) for path in variants]
    return [{"id": f"chain-{kind}-{k}", "op": f"chain:{kind}", "image": others[k % len(others)], "others": others,
             "seed": first_seed + 1000 * index + k}
            for index, kind in enumerate(CHAIN_KINDS) for k in range(per_kind)]


@dataclasses.dataclass
class ChainReplay:
    """A chain of theirs as this package's edits: ``edits`` (``Edit.to_dict()``, the erasing excluded), the
    ``erasing`` edit (or None), the operations that applied (``applied``, their names in the order they ran, for
    the rates), the other measures the rows need (``drawn``: blur radii and smearing widths with the (H, W) they ran
    at, ``emoji``: the emoji files) and ``albumentation``: the albumentations operation that ran, if any."""

    edits: list = dataclasses.field(default_factory=list)
    erasing: RandomErasing | None = None
    applied: list = dataclasses.field(default_factory=list)
    drawn: dict = dataclasses.field(default_factory=lambda: {"blur": [], "smearing": []})
    emoji: list = dataclasses.field(default_factory=list)
    albumentation: str | None = None


def _values(draws: list) -> list:
    """The values of the noted draws of Python's ``random`` (``[[method, value], ...]``)."""
    return [value for _, value in draws]


def _text(event: dict, size: tuple[int, int]) -> list:
    """Their ``RandomOverlayText`` as the text, font, size, place, colour and alpha they drew."""
    drawn = event["text"][0]
    if not drawn["text"].strip():
        return []
    height, width = size
    (x, y), fill = drawn["xy"], drawn["fill"]
    return [OverlayText(text=drawn["text"], font=event["font"][0], font_size=(drawn["pixels"] + 0.5) / min(size),
                        color=tuple(fill[:3]), x=x / width, y=y / height, opacity=fill[3] / 255, covered="mapped")]


def _smear(event: dict, size: tuple[int, int]) -> list:
    """Their ``RandomSmearing`` as its control points, segments, width and colour."""
    height, width = size
    bezier, line = event["bezier"][0], event["line"][0]
    points = tuple((x / width, y / height) for x, y in bezier["points"])
    return [Smear(points=points, width=line["width"], color=tuple(line["fill"][:3]), segments=bezier["segments"],
                  covered="mapped")]


def _leaf(event: dict, size: tuple[int, int], replayed: ChainReplay) -> list:
    """This package's edits for one operation of theirs that ran on an image of (H, W) ``size``."""
    op, configs = event["op"], event.get("configs", [])
    kinds = {config["type"] for config in configs}
    if op in ("random_resized_crop", "onto_other_image", "other_image_onto", "affine", "perspective"):
        other = event.get("opened", [None])[0]
        return edits_of_case({"op": op, "other": other}, {"configs": configs}, size)
    if op in ("hflip", "vflip"):
        return edits_of_case({"op": op}, {"configs": configs}, size) if "FLIP" in kinds else []
    if op == "padding":
        return [Pad(0.2, 0.2, (0, 0, 0), rounding="round")] if "PADDING" in kinds else []
    if op == "resize":
        return [Resize(SIZE, SIZE, "bicubic")]
    if op == "color_jitter":
        order, brightness, contrast, saturation, hue = event["jitter"][0]
        return [ColorJitter(brightness, contrast, saturation, hue, form="torchvision", order=tuple(order))]
    if op == "emoji":
        replayed.emoji.append(_values(event["draws"])[1])
        emoji = appearance_edits("emoji", {"draws": _values(event["draws"])})
        return [dataclasses.replace(edit, covered="mapped") for edit in emoji]
    if op == "smearing":
        replayed.drawn["smearing"].append((event["line"][0]["width"], size))
        return _smear(event, size)
    if op == "blur":
        replayed.drawn["blur"].append((event["value"], size))
        return [Blur(radius=event["value"])]
    simple = {"pixelization": lambda: Pixelization(ratio=event["value"]), "grayscale": Grayscale,
              "shuffle_pixels": lambda: ShufflePixels(factor=0.1, seed=10, form="augly"),
              "text": lambda: _text(event, size)}
    if op.startswith("jpeg:"):
        return [JpegQuality(quality=int(op.split(":")[1]))]
    if op.startswith("edge:"):
        return [EdgeEnhance(more=op.endswith("More"))]
    made = simple[op]()
    return made if isinstance(made, list) else [made]


#: Their containers (the events holding the operations that ran). An operation counts as applied when it changed
#: the image (smearing draws in place: when it drew).
_CONTAINERS = ("crop", "geometric", "appearance", "additional", "linear", "jpeg", "edge_enhance")


def _walk(events: list[dict], replayed: ChainReplay) -> None:
    for event in events:
        size = (event["size"][1], event["size"][0])
        applied = "bezier" in event if event["op"] == "smearing" else event["changed"]
        if event["op"] == "additional":  # albumentations' OneOf: the member that ran noted its name
            replayed.albumentation = event.get("albumentation", [None])[0]
            if replayed.albumentation:
                replayed.applied.append("additional")
            continue
        if event["op"] == "random_erasing":
            box = event.get("erasing", [None])[0]
            if box is not None and (box[2], box[3]) != (SIZE, SIZE):  # torchvision erases nothing when no box fits
                top, left, height, width = box[:4]
                replayed.erasing = RandomErasing(x=left / SIZE, y=top / SIZE, width=width / SIZE, height=height / SIZE,
                                                 noise_seed=0, values="unclipped", covered="mapped")
                replayed.applied.append("random_erasing")
            continue
        if event["op"] in _CONTAINERS:
            if applied and event["op"] not in ("appearance", "geometric"):
                replayed.applied.append(event["op"])
            _walk(event.get("inner", []), replayed)
            continue
        if applied:
            if ":" not in event["op"]:  # a member of AugLy's OneOf counts as its container
                replayed.applied.append(event["op"])
            replayed.edits += [edit.to_dict() for edit in _leaf(event, size, replayed)]


def replay_chain(record: dict) -> ChainReplay:
    """Their recorded chain (``<id>.json`` of the worker) as this package's edits (:class:`ChainReplay`)."""
    replayed = ChainReplay()
    _walk(record["events"], replayed)
    return replayed


def _chain_result(case: dict, folder: Path) -> tuple:
    """(:class:`ChainReplay`, our table, the original, their copy before erasing (float (S, S, 3)), their maps,
    our copy before erasing, their record) of one chain."""
    record = json.loads((folder / "theirs" / f"{case['id']}.json").read_text())
    replayed = replay_chain(record)
    original = Image.open(case["image"]).convert("RGB")
    result = replay(original, replayed.edits, fuse=False)
    theirs = np.asarray(Image.open(folder / "theirs" / f"{case['id']}.png").convert("RGB"), dtype=np.float64)
    table = result.table
    if replayed.erasing is not None:
        table = replayed.erasing(result.image, table)[1]
    maps = np.load(folder / "theirs" / f"{case['id']}.npy")
    return replayed, table, original, theirs, maps, result.image, record


def compare_chain(case: dict, folder: Path) -> tuple[dict, ChainReplay]:
    """One chain of theirs replayed by this package: (measures, :class:`ChainReplay`). The measures: the table's
    (:func:`~.data_oracle.table_measures`), the pixels before erasing (``pixels``: mean abs, ``pixels_max``; None
    with an albumentations operation), the erased box (``box``: 1 when it differs), the range of their model input
    (``output``)."""
    replayed, table, original, theirs, maps, ours, record = _chain_result(case, folder)
    measures = table_measures(table, maps, original, theirs, CHAIN_MAP_TOLERANCE)
    difference = np.abs(np.asarray(ours, dtype=np.float64) - theirs)
    unreplayed = replayed.albumentation is not None
    measures.update(pixels=None if unreplayed else float(difference.mean()),
                    pixels_max=None if unreplayed else float(difference.max()), box=0.0, output=record["output"],
                    erased=replayed.erasing is not None)
    if replayed.erasing is not None:
        box = next(event["erasing"][0] for event in record["events"] if event["op"] == "random_erasing")
        top, left, height, width = box[:4]
        measures["box"] = float(replayed.erasing.box(SIZE, SIZE) != (left, top, left + width, top + height))
    return measures, replayed


def _quantiles(values: list[float]) -> str:
    """``median / 90 % / max`` of ``values`` for a row's label."""
    if not values:
        return "none"
    low, high, top = np.quantile(values, [0.5, 0.9, 1.0])
    return f"median {low:.3g}, 90 % {high:.3g}, max {top:.3g}"


def _preset_rates(recipe: CopyRecipe, draws: int) -> dict[str, float]:
    """Share of copies in which each step of ``recipe`` is scheduled (its choices' members under their own
    names, the choice under its name when one of them is), over ``draws`` schedules."""
    counts: collections.Counter = collections.Counter()
    members = {member: name for name, step in recipe.steps if hasattr(step, "members") for member in step.members}
    names = {id(step): name for name, step in recipe.steps}
    for k in range(draws):
        before, after = recipe.schedule(np.random.default_rng([11, k]))
        scheduled = {names[id(step)] for step, _ in before + after}
        counts.update(scheduled | {members[name] for name in scheduled if name in members})
    return {name: counts[name] / draws for name, _ in recipe.steps}


#: Their operation names (as :func:`replay_chain` notes them) and the preset's step of each.
PRESET_STEPS = {"crop": "crop", "random_resized_crop": "random_resized_crop", "onto_other_image": "onto_other_image",
                "other_image_onto": "other_image_onto", "hflip": "horizontal_flip", "vflip": "vertical_flip",
                "linear": "linear", "perspective": "perspective", "affine": "affine", "color_jitter": "color_jitter",
                "pixelization": "pixelization", "shuffle_pixels": "shuffle_pixels", "jpeg": "jpeg",
                "grayscale": "grayscale", "blur": "blur", "text": "overlay_text", "emoji": "overlay_emoji",
                "edge_enhance": "edge_enhance", "smearing": "smearing", "additional": "additional",
                "padding": "padding", "random_erasing": "random_erasing"}


def rate_rows(kind: str, applied: list[list[str]], recipe: CopyRecipe, draws: int = 10_000) -> list[Row]:
    """Per operation: the share of their ``kind`` chains it applied to against the share of the preset's copies
    whose schedule holds its step (over ``draws`` schedules: a standard error under 0.005), within
    :data:`RATE_SIGMAS` binomial standard deviations of the preset's over as many copies as their chains."""
    ours, chains, rows = _preset_rates(recipe, draws), len(applied), []
    for op, step in PRESET_STEPS.items():
        theirs = sum(op in names for names in applied) / chains
        sigma = np.sqrt(max(ours[step] * (1 - ours[step]), 1.0 / chains) / chains)
        rows.append(Row(f"chain, {kind}: {op} applied to {theirs:.0%} of their {chains} chains, the preset's "
                        f"{step} to {ours[step]:.0%} of its copies", "sigmas", abs(theirs - ours[step]) / sigma,
                        RATE_SIGMAS, ours[step]))
    return rows


def _support(step, size: tuple[int, int]) -> tuple[float, float]:
    """The range of the blur radius or stroke width ``step`` draws on an image of (H, W) ``size``."""
    low, high = step.radius if isinstance(step, BlurStep) else step.width
    if step.units == "pixels":
        return float(low), float(high)
    if isinstance(step, BlurStep):
        return low * min(size), high * min(size)
    return max(1, round(low * min(size))), max(1, round(high * min(size)))


def support_row(label: str, drawn: list[tuple[float, tuple[int, int]]], step) -> Row:
    """How many of their values (each with the (H, W) it was drawn at) lie outside the range the preset's ``step``
    draws from at that size."""
    outside = sum(not _support(step, size)[0] <= value <= _support(step, size)[1] for value, size in drawn)
    return Row(f"{label}: theirs ({len(drawn)}) outside the preset's range at the size each ran at", "count",
               float(outside), 0.0, float(len(drawn)))


def distribution_row(label: str, drawn: list[tuple[float, tuple[int, int]]], step, attribute: str) -> Row:
    """Their values of ``attribute`` (blur radii, stroke widths), each with the (H, W) it was drawn at, against the
    preset's ``step`` drawing 20 values at each of those sizes: the two-sample Kolmogorov-Smirnov statistic,
    against its critical value at the 0.1 % level (1.95 sqrt((n + m) / nm))."""
    theirs = np.array([value for value, _ in drawn], dtype=np.float64)
    rng = np.random.default_rng(5)
    ours = np.array([getattr(edit, attribute) for _, size in drawn for _ in range(20)
                     for edit in step.draw(DrawContext(rng, size))], dtype=np.float64)
    if not len(theirs) or not len(ours):
        return Row(f"{label}: none drawn", "KS", 1.0, 0.0, 0.0)
    critical = 1.95 * np.sqrt((len(theirs) + len(ours)) / (len(theirs) * len(ours)))
    return Row(f"{label}: theirs ({len(theirs)}: {_quantiles(list(theirs))}) vs the preset's at the same sizes",
               "KS", ks_statistic(theirs, ours), float(critical), float(theirs.max()))


def _pixel_row(kind: str, results: list[dict]) -> list[Row]:
    """Their copies before erasing against ours, the chains without an albumentations operation; the erased box."""
    replayed = [r for r in results if r["pixels"] is not None]
    means, largest = [r["pixels"] for r in replayed], [r["pixels_max"] for r in replayed]
    erased = [r for r in results if r["erased"]]
    beyond = sum(r["output"][0] < -2.2 or r["output"][1] > 2.7 for r in erased)  # 8-bit inputs: [-2.12, 2.64]
    return [
        Row(f"chain, {kind}: pixels before erasing, their chain vs our replay ({len(replayed)} of {len(results)} "
            f"chains: not those with an albumentations operation; mean abs {_quantiles(means)})", "max abs (grey)",
            float(max(largest, default=0.0)), 0.0, 255.0),
        Row(f"chain, {kind}: erased box, theirs vs our RandomErasing ({len(erased)} chains; their model input beyond "
            f"the 8-bit range in {beyond})", "boxes that differ", float(sum(r["box"] for r in erased)), 0.0, 1.0),
    ]


def chain_rows(kind: str, results: list[dict], replays: list[ChainReplay]) -> list[Row]:
    """Every row of the ``kind`` chains: pixels, erased boxes, maps and priors (the worst chain, with quantiles),
    rates of every operation."""
    rows = _pixel_row(kind, results)
    measured = ("apart", "stray", "largest", "prior", "exact_p99", "exact_max", "exact_far", "exact_stray", "exact_prior")
    worst = {key: max(r[key] for r in results) for key in measured}
    worst["content"] = float(np.median([r["content"] for r in results]))  # photometric edits make single chains noisy
    label = (f"chain, {kind} ({len(results)} chains; their map's largest distance {_quantiles([r['largest'] for r in results])}"
             f"; prior {_quantiles([r['prior'] for r in results])})")
    rows += map_rows(label, worst, float(np.median([r["median"] for r in results])), CHAIN_MAP_TOLERANCE,
                     CHAIN_PRIOR_LIMIT, content="median chain: their photometric edits change single chains")
    return rows + rate_rows(kind, [replay.applied for replay in replays], CHAIN_KINDS[kind]())


def coverage_row(replays: list[ChainReplay]) -> Row:
    """Every operation of theirs applied in some chain, and an emoji with an alpha band (the RGBA paste path; most
    of AugLy's emoji are palette images, pasted through a flat mask)."""
    counts = collections.Counter(op for replay in replays for op in set(replay.applied))
    rgba = sum(Image.open(path).mode == "RGBA" for replay in replays for path in replay.emoji)
    missing = [op for op in PRESET_STEPS if not counts[op]] + ([] if rgba else ["RGBA emoji"])
    listed = ", ".join(f"{op} {counts[op]}" for op in PRESET_STEPS)
    return Row(f"chain: every operation applied in some chain ({listed}; RGBA emoji {rgba}); missing: "
               f"{missing or 'none'}", "missing", float(len(missing)), 0.0, float(len(PRESET_STEPS) + 1))


def _shifted(table: CoordinateTable) -> CoordinateTable:
    """``table`` moved one copy pixel to the right (each pixel claims its left neighbour's source position)."""
    coords = np.full_like(table.coords, np.nan)
    coords[:, 1:] = table.coords[:, :-1]
    return CoordinateTable(coords, table.source_size)


def self_check_rows(cases: list[dict], folder: Path, replays: dict[str, list[ChainReplay]]) -> list[Row]:
    """Deliberate errors the chain rows must catch, each a row that holds when a row fails: the preset's text on
    ``p`` of the copies instead of ``1 - p``, a blur radius relative to the image (the package's former preset:
    2-10 pixels at 224), and our tables shifted by one pixel (on the first 12 chains)."""
    rows = []
    for kind, recipe in CHAIN_KINDS.items():
        wrong = recipe().replace(overlay_text=dataclasses.replace(recipe().overlay_text, p_means="apply"))
        text = next(row for row in rate_rows(kind, [r.applied for r in replays[kind]], wrong) if ": text " in row.check)
        rows.append(Row(f"self-check, {kind}: text on p of the copies fails the text rate row ({text.measured:.1f} "
                        "sigmas)", "caught (0: yes)", float(text.holds), 0.0, 1.0))
    drawn = [value for kind in replays for replay in replays[kind] for value in replay.drawn["blur"]]
    relative = BlurStep(p=0.2, radius=(2 / 224, 10 / 224), units="fraction")
    blur, support = distribution_row("blur", drawn, relative, "radius"), support_row("blur", drawn, relative)
    rows.append(Row(f"self-check: a blur radius relative to the image fails the blur rows (KS {blur.measured:.2f}, "
                    f"critical {blur.limit:.2f}; {support.measured:.0f} of {len(drawn)} outside its range)",
                    "caught (0: yes)", float(blur.holds and support.holds), 0.0, 1.0))
    caught = []
    for case in cases[:12]:
        _, table, original, theirs, maps, _, _ = _chain_result(case, folder)
        measures = table_measures(_shifted(table), maps, original, theirs, CHAIN_MAP_TOLERANCE)
        caught.append(measures["exact_p99"] > EXACT_P99 or measures["exact_prior"] > EXACT_PRIOR_LIMIT)
    rows.append(Row(f"self-check: our tables shifted by one pixel fail the convention-free rows ({sum(caught)} of "
                    f"{len(caught)} chains)", "chains not caught", float(len(caught) - sum(caught)), 0.0, 1.0))
    return rows


def run_chain_checks(authors_code: Path, authors_python: str, photos: list[Path], folder: Path,
                     per_kind: int = 100, extra: int = 200) -> list[Row]:
    """Run their chains (``per_kind`` of each configuration, then batches of 20 more, up to ``extra``, until every
    operation and an RGBA emoji have appeared) and compare them with this package (module docstring)."""
    from .data_oracle import run_worker

    variants = photo_variants(photos, folder / "photos")
    cases, results, replays = [], {kind: [] for kind in CHAIN_KINDS}, {kind: [] for kind in CHAIN_KINDS}
    done, target = 0, per_kind
    while True:
        new = [case for case in chain_cases(variants, target) if int(case["id"].rsplit("-", 1)[1]) >= done]
        run_worker(authors_python, authors_code, {"config": {}, "image_size": SIZE, "cases": new}, folder)
        for case in new:
            measures, replayed = compare_chain(case, folder)
            results[case["op"].split(":", 1)[1]].append(measures)
            replays[case["op"].split(":", 1)[1]].append(replayed)
        cases, done = cases + new, target
        if not coverage_row(sum(replays.values(), [])).measured or target - per_kind >= extra:
            break
        target += 20
    everything, paper = sum(replays.values(), []), CopyRecipe.paper_descriptor()
    rows = [row for kind in CHAIN_KINDS for row in chain_rows(kind, results[kind], replays[kind])]
    blurs, strokes = ([v for r in everything for v in r.drawn[key]] for key in ("blur", "smearing"))
    rows += [coverage_row(everything),
             distribution_row("chain: blur radius (px)", blurs, paper.blur, "radius"),
             support_row("chain: blur radius (px)", blurs, paper.blur),
             distribution_row("chain: smearing width (px)", strokes, paper.smearing, "width"),
             support_row("chain: smearing width (px)", strokes, paper.smearing)]
    return rows + self_check_rows(cases, folder, replays)
