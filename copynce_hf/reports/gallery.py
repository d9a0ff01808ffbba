"""The HTML match gallery of ``copynce detect`` (the top and the borderline matches with the model's heatmaps)
and of ``copynce dedup`` (groups of copies, :func:`write_group_gallery`).

``report.html`` lists the run's settings, per-stage times, the metrics when a ground truth is given,
then two galleries of each query's best reference: the highest-scored matches and the borderline
ones (scores nearest the decision threshold). Every card shows the query, the reference, the score
and the token affinity heatmap of the query patch with the lowest affinity entropy (the most
confidently matched patch) over the reference, plus the query's entropy map (paper, "Visualization
and Interpretability"). Images are PNG files under ``gallery/`` beside the page; the page is
rendered by a Jinja2 template with autoescaping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path

from jinja2 import Environment
from PIL import Image, ImageDraw

from ..images import load_image
from ..retrieval.predictions import Prediction
from .affinity import affinity_maps
from .affinity_panels import save_affinity_panels

THUMBNAIL_SIDE = 160
#: Characters of each id kept in a pair's gallery folder name (file names stop at 255 bytes).
_ID_CHARACTERS = 40

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
.cards { display: flex; flex-wrap: wrap; gap: 1em; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 0.6em; width: 360px; }
.card.correct { border-color: #2a2; } .card.wrong { border-color: #c33; }
.card img.thumb { width: 160px; height: 160px; object-fit: contain; background: #eee; }
.card img.map { width: 100%; }
</style></head><body>
<h1>{{ title }}</h1>
<h2>Settings</h2>
<table>{% for key, value in settings %}<tr><th>{{ key }}</th><td>{{ value }}</td></tr>{% endfor %}</table>
<h2>Time per stage</h2>
<table><tr><th>stage</th><th>seconds</th></tr>
{% for stage, seconds in stages %}<tr><td>{{ stage }}</td><td>{{ "%.1f"|format(seconds) }}</td></tr>{% endfor %}</table>
{% if metrics %}<h2>Metrics against the ground truth</h2>
<table>{% for key, value in metrics %}<tr><th>{{ key }}</th><td>{{ value }}</td></tr>{% endfor %}</table>{% endif %}
{% for section in sections %}
<h2>{{ section.title }}</h2><p>{{ section.text }}</p>
<div class="cards">{% for card in section.cards %}
<div class="card {{ card.verdict }}">
<div><b>{{ card.query_id }}</b> &rarr; <b>{{ card.reference_id }}</b>, score {{ "%.4f"|format(card.score) }}
{% if card.verdict == "correct" %}(a true copy){% elif card.verdict == "wrong" %}(not a true pair){% endif %}</div>
<img class="thumb" src="{{ card.query|urlencode }}" alt="query {{ card.query_id }}">
<img class="thumb" src="{{ card.reference|urlencode }}" alt="reference {{ card.reference_id }}">
{% if card.affinity %}<img class="map" src="{{ card.affinity|urlencode }}" alt="token affinity heatmap">
<img class="map" src="{{ card.entropy|urlencode }}" alt="affinity entropy map">{% endif %}
</div>{% endfor %}</div>
{% endfor %}
</body></html>
"""


@dataclasses.dataclass
class MatchCard:
    """One gallery card (image paths relative to the report)."""

    query_id: str
    reference_id: str
    score: float
    verdict: str  # "correct", "wrong" or "" (no ground truth)
    query: str
    reference: str
    affinity: str = ""
    entropy: str = ""


def best_matches(predictions: list[Prediction]) -> list[Prediction]:
    """Each query's best-scored prediction, highest score first."""
    best: dict[str, Prediction] = {}
    for prediction in predictions:
        if prediction.query_id not in best or prediction.score > best[prediction.query_id].score:
            best[prediction.query_id] = prediction
    return sorted(best.values(), key=lambda p: (-p.score, p.query_id))


def pick_gallery(predictions: list[Prediction], threshold: float, count: int) -> tuple[list[Prediction], list[Prediction]]:
    """``(top, borderline)``: the ``count`` best matches, and the ``count`` others whose score is nearest ``threshold``."""
    ranked = best_matches(predictions)
    top = ranked[:count]
    rest = ranked[count:]
    borderline = sorted(rest, key=lambda p: (abs(p.score - threshold), p.query_id))[:count]
    return top, sorted(borderline, key=lambda p: -p.score)


#: The outline of a content crop on a thumbnail (the part of the image a pair was scored on: ``dedup``, ``detect``).
CROP_OUTLINE = (255, 0, 200)


def _thumbnail(image, path: Path, box: tuple[float, float, float, float] | None = None) -> None:
    """A thumbnail of ``image`` at ``path``, with ``box`` (fractions of its width and height) outlined."""
    image = load_image(image).copy()
    image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE), Image.Resampling.BICUBIC)
    if box is not None:
        width, height = image.size
        left, top, right, bottom = box
        ImageDraw.Draw(image).rectangle((left * width, top * height, right * width - 1, bottom * height - 1),
                                        outline=CROP_OUTLINE, width=max(2, round(min(width, height) / 80)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def pair_folder_name(query_id: str, reference_id: str) -> str:
    """The gallery folder of a pair: ``<query>__<reference>-<hash>``, each id cut to its first 40 file-name-safe
    characters (others become ``_``), the hash (of both full ids) keeping names of different pairs apart."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:_ID_CHARACTERS]

    digest = hashlib.sha1(f"{query_id}\0{reference_id}".encode()).hexdigest()[:12]
    return f"{safe(query_id)}__{safe(reference_id)}-{digest}"


def match_card(prediction: Prediction, queries, references, model, processor, folder: Path, root: Path,
               truth: dict[str, list[str]] | None = None, boxes: dict | None = None) -> MatchCard:
    """The card of one pair: thumbnails (and heatmaps when ``model`` is given) written under ``folder``, paths
    relative to ``root`` (the report's folder); ``boxes``: image id -> a box outlined on its thumbnail."""
    pair = folder / pair_folder_name(prediction.query_id, prediction.reference_id)
    query_image, reference_image = queries[prediction.query_id], references[prediction.reference_id]
    boxes = boxes or {}
    _thumbnail(query_image, pair / "query.png", boxes.get(prediction.query_id))
    _thumbnail(reference_image, pair / "reference.png", boxes.get(prediction.reference_id))
    verdict = ""
    if truth is not None:
        verdict = "correct" if prediction.reference_id in truth.get(prediction.query_id, []) else "wrong"
    card = MatchCard(prediction.query_id, prediction.reference_id, prediction.score, verdict,
                     (pair / "query.png").relative_to(root).as_posix(),
                     (pair / "reference.png").relative_to(root).as_posix())
    if model is not None:
        # probe=None: the most confidently matched query patch, of lowest affinity entropy
        maps = affinity_maps(model, processor, query_image, reference_image)
        written = save_affinity_panels(maps, pair)
        card.affinity = written["token_affinity"].relative_to(root).as_posix()
        card.entropy = written["affinity_entropy"].relative_to(root).as_posix()
    return card


def write_gallery(
    path: str | os.PathLike,
    predictions: list[Prediction],
    queries,
    references,
    model=None,
    processor=None,
    threshold: float = 0.5,
    count: int = 8,
    settings: dict | None = None,
    stages: dict[str, float] | None = None,
    metrics: dict | None = None,
    ground_truth: dict[str, list[str]] | None = None,
    title: str = "CopyNCE copy detection",
    crops: dict | None = None,
) -> Path:
    """Write ``report.html`` (and ``gallery/`` beside it) for ``predictions``.

    Args:
        queries, references: id -> image (path or PIL image).
        model, processor: the model whose heatmaps are drawn (the matcher, else a descriptor); ``None``: no heatmaps.
        threshold: the score the borderline matches are nearest to.
        count: cards per gallery.
        crops: ``(query, reference)`` pair -> ``{image id: box}`` of the crops its score came from (outlined).
    """
    path = Path(path)
    root = path.parent
    folder = root / "gallery"
    top, borderline = pick_gallery(predictions, threshold, count)
    crops = crops or {}

    def card(p: Prediction) -> MatchCard:
        return match_card(p, queries, references, model, processor, folder, root, ground_truth,
                          crops.get((p.query_id, p.reference_id)))

    sections = [
        {"title": "Top matches", "text": f"The {len(top)} queries whose best reference scored highest.",
         "cards": [card(p) for p in top]},
        {"title": "Borderline matches",
         "text": f"The {len(borderline)} other queries whose best score is nearest {threshold:.4g}.",
         "cards": [card(p) for p in borderline]},
    ]
    return render_report(path, sections, settings, stages, metrics, title)


def render_report(path: str | os.PathLike, sections: list[dict], settings: dict | None = None,
                  stages: dict[str, float] | None = None, metrics: dict | None = None,
                  title: str = "CopyNCE copy detection") -> Path:
    """Write the page: settings, time per stage, metrics, then ``sections`` (dicts of ``title``, ``text`` and
    ``cards``, a list of :class:`MatchCard`)."""
    path = Path(path)
    html = Environment(autoescape=True).from_string(_TEMPLATE).render(
        title=title, settings=list((settings or {}).items()), stages=list((stages or {}).items()),
        metrics=[(k, f"{v:.4f}" if isinstance(v, float) else v) for k, v in (metrics or {}).items()],
        sections=sections,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path


def write_group_gallery(path: str | os.PathLike, groups: list[list[tuple[str, float | None]]], images, model=None,
                        processor=None, count: int = 8, members: int = 8, settings: dict | None = None,
                        stages: dict[str, float] | None = None, metrics: dict | None = None,
                        title: str = "CopyNCE deduplication", crops: dict | None = None) -> Path:
    """Write ``report.html`` (and ``gallery/`` beside it) for groups of copies found in one collection.

    Args:
        groups: each group's members ``(image id, score to the first member)``, the first member first (its
            score ``None``); the ``count`` largest groups get a section, each with the cards of its first
            ``members`` other members paired with the first.
        images: id -> image (path or PIL image).
        model, processor: the model whose heatmaps are drawn; ``None``: no heatmaps.
        crops: ``(a, b)`` pair -> ``{image id: box}`` of the content crops its score came from
            (``dedup``'s ``crop_pairs``), outlined on the pair's thumbnails.
    """
    path = Path(path)
    crops = crops or {}
    shown = sorted(range(len(groups)), key=lambda g: (-len(groups[g]), g))[:count]
    sections = []
    for number in sorted(shown):
        (first, _), *others = groups[number]
        cards = [match_card(Prediction(first, member, score), images, images, model, processor,
                            path.parent / "gallery", path.parent,
                            boxes=crops.get((first, member)) or crops.get((member, first)))
                 for member, score in others[:members]]
        more = f" (the first {members} shown)" if len(others) > members else ""
        sections.append({"title": f"Group {number}: {len(groups[number])} images",
                         "text": f"{first} and each other member{more}, with the score of the pair.", "cards": cards})
    return render_report(path, sections, settings, stages, metrics, title)
