"""The demo's HTML report: results table, PR curves, and per query its matches and heatmaps.

The report is one ``report.html`` file with its images as PNG files in folders beside it
(``images/``, ``queries/<query_id>/``), so the whole output folder can be zipped or served as is.
It is rendered with a Jinja2 template with HTML autoescaping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from jinja2 import Environment

__all__ = ["MatchView", "QueryView", "SystemRow", "render_report", "write_report"]


@dataclasses.dataclass
class SystemRow:
    """One line of the results table."""

    name: str
    micro_ap: float
    recall_at_p90: float
    recall_at_rank1: float
    seconds: float


@dataclasses.dataclass
class MatchView:
    """One retrieved reference of a query: its thumbnail (path relative to the report), score, correctness."""

    reference_id: str
    thumbnail: str
    score: float
    correct: bool


@dataclasses.dataclass
class QueryView:
    """Everything the report shows about one query.

    Attributes:
        query_id: the query's id.
        description: what the query is ("copy of astronaut", "distractor: edited brick, not a reference").
        is_copy: whether the query has a true reference.
        thumbnail: path of the query's thumbnail, relative to the report.
        edits: names of the edits that made it, in order.
        traced_fraction: share of the query's pixels that come from its original.
        matches: system name -> its top matches, best first.
        pair: which pair the heatmaps show (the true pair, or the top-1 candidate of a distractor).
        figures: caption -> image path relative to the report (overlap prior, token affinity, entropy).
    """

    query_id: str
    description: str
    is_copy: bool
    thumbnail: str
    edits: list[str]
    traced_fraction: float
    matches: dict[str, list[MatchView]]
    pair: str
    figures: dict[str, str]


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.query { border-top: 2px solid #888; margin-top: 1.5em; padding-top: 0.5em; }
.matches { display: flex; flex-wrap: wrap; gap: 0.4em; }
.match { text-align: center; font-size: 0.85em; border: 3px solid #bbb; padding: 2px; }
.match.correct { border-color: #2a2; }
.match.wrong { border-color: #c33; }
.match img { height: 72px; display: block; margin: auto; }
.figures img { max-width: 100%; height: 330px; margin-right: 0.5em; }
.note { color: #a60; }
.copy { color: #2a2; font-weight: bold; }
.distractor { color: #c33; font-weight: bold; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p>{{ intro }}</p>
{% for note in notes %}<p class="note">{{ note }}</p>{% endfor %}

<h2>Results</h2>
<table>
<tr><th>system</th><th>µAP</th><th>RP90</th><th>recall@1</th><th>seconds</th></tr>
{% for row in rows %}<tr><td>{{ row.name }}</td><td class="num">{{ "%.3f" | format(row.micro_ap) }}</td>
<td class="num">{{ "%.3f" | format(row.recall_at_p90) }}</td><td class="num">{{ "%.3f" | format(row.recall_at_rank1) }}</td>
<td class="num">{{ "%.1f" | format(row.seconds) }}</td></tr>
{% endfor %}</table>
<p>µAP: micro average precision over all (query, reference, score) predictions pooled together; RP90: recall at
90% precision; recall@1: share of the copy queries whose top match is their original (DISC21 protocol).
Green frames are correct matches, red frames wrong ones.</p>
{% if pr_curve %}<img src="{{ pr_curve }}" alt="precision-recall curves" style="max-width: 640px">{% endif %}

<h2>Task</h2>
<p>{{ task_text }}</p>

<h2>Queries</h2>
{% for query in queries %}
<div class="query" id="{{ query.query_id }}">
<h3>{{ query.query_id }}: <span class="{{ 'copy' if query.is_copy else 'distractor' }}">{{ query.description }}</span></h3>
<table><tr>
<td><img src="{{ query.thumbnail }}" alt="query {{ query.query_id }}" style="max-height: 160px"></td>
<td>edits: {{ query.edits | join(" → ") }}<br>
traced pixels: {{ "%.0f" | format(100 * query.traced_fraction) }}% of the query comes from its original</td>
</tr></table>
<table>
{% for system, matches in query.matches.items() %}<tr><th>{{ system }}</th><td><div class="matches">
{% for match in matches %}<div class="match {{ 'correct' if match.correct else 'wrong' }}">
<img src="{{ match.thumbnail }}" alt="{{ match.reference_id }}">{{ match.reference_id }}<br>{{ "%.3f" | format(match.score) }}
{{ "&#10003;" | safe if match.correct else "&#10007;" | safe }}</div>
{% endfor %}</div></td></tr>
{% endfor %}</table>
{% if query.figures %}<p>Heatmaps of {{ query.pair }}:</p>
<div class="figures">{% for caption, src in query.figures.items() %}<img src="{{ src }}" alt="{{ caption }}" title="{{ caption }}">{% endfor %}</div>{% endif %}
</div>
{% endfor %}
</body>
</html>
"""


def render_report(
    *,
    title: str,
    intro: str,
    rows: Sequence[SystemRow],
    queries: Sequence[QueryView],
    task_text: str,
    pr_curve: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The report's HTML text (every value is escaped)."""
    template = Environment(autoescape=True).from_string(_TEMPLATE)
    return template.render(title=title, intro=intro, rows=list(rows), queries=list(queries), task_text=task_text,
                           pr_curve=pr_curve, notes=list(notes))


def write_report(path: str | Path, **content) -> Path:
    """Render :func:`render_report` into ``path`` (UTF-8); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(**content), encoding="utf-8")
    return path
