"""Groups of copies from scored image pairs (``copynce dedup``), ``groups.csv``, and the pair precision and recall
of groups.

Two groupings of the pairs scored at or above a threshold:

* ``representative`` (:func:`representative_groups`, dedup's default): a pair joins a group only if it clears the
  threshold *against the group*, not through one weak link. The pairs are taken in decreasing score order; a
  pair of two ungrouped images starts a group whose representative (its first member) is the earlier of the two;
  an ungrouped image whose pair reaches a member of a group joins it only if its own pair with the group's
  representative clears the threshold (scored now when it was not verified); two groups merge only if their
  representatives' pair clears it (the group formed first keeps its representative). Against the representative
  rather than the majority of the members: one pair to score per join instead of one per member, and a
  representative is what a user looks at first in ``groups.csv``. A merged group's members were checked against
  their own representative only.
* ``connected`` (:func:`connected_groups`): the connected components of the graph of those pairs; two unrelated
  images join through any chain of pairs (two photos in one screenshot frame through the frame).

Each member of a group is a :class:`GroupMember`: its score to the first member, the member it joined through,
and the rule that let it in.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable, Mapping

from ...modeling.errors import ConfigError
from ...outputs import StagedFile

#: The groupings :func:`group_members` makes.
GROUPINGS = ("representative", "connected")

#: ``(earlier image, later image)`` in the collection's order -> score.
PairScoreMap = Mapping[tuple[str, str], float]

#: Scores the pairs it is given (``(earlier, later)``), ``None`` for a pair it cannot score.
ScoreMissing = Callable[[list[tuple[str, str]]], list[float | None]]


@dataclasses.dataclass(frozen=True)
class GroupMember:
    """One member of a group of copies.

    Attributes:
        image_id: the image.
        score_to_first: its pair's score with the group's first member (``None`` on the first member's own row,
            or when that pair could not be scored).
        joined_by: the member whose pair with it brought it in (``None`` for the first member).
        joined_score: that pair's score.
        rule: ``first`` (the group's representative), ``representative`` (its pair with the representative
            cleared the threshold), ``merge`` (it came with a group whose representative's pair with this group's
            representative cleared it; ``joined_by`` is, for that representative, this group's representative,
            for the others, the member they had joined through), ``connected`` (a connected component:
            ``joined_by`` is the member through which it is reached first from the first member, breadth
            first, the best pairs first).
    """

    image_id: str
    score_to_first: float | None
    joined_by: str | None = None
    joined_score: float | None = None
    rule: str = "first"


def pair_key(a: str, b: str, order: Mapping[str, int]) -> tuple[str, str]:
    """The pair ``(a, b)`` as ``(earlier, later)`` by ``order`` (image id -> place in the collection)."""
    return (a, b) if order[a] < order[b] else (b, a)


def connected_groups(ids: list[str], edges: list[tuple[str, str]]) -> list[list[str]]:
    """Connected components of two images or more of the graph over ``ids`` with ``edges``.

    Each component lists its ids in the order of ``ids``; components are ordered by their first id.
    """
    position = {image_id: i for i, image_id in enumerate(ids)}
    parent = list(range(len(ids)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in edges:
        ra, rb = root(position[a]), root(position[b])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the earlier image stays the root
    members: dict[int, list[str]] = {}
    for i, image_id in enumerate(ids):
        members.setdefault(root(i), []).append(image_id)
    return [group for _, group in sorted(members.items()) if len(group) > 1]


def group_pairs(groups: Iterable[Iterable[str]]) -> set[frozenset[str]]:
    """Every unordered pair of images that share a group."""
    return {frozenset(pair) for group in groups for pair in itertools.combinations(list(group), 2)}


def pair_precision_recall(found: Iterable[Iterable[str]], truth: Iterable[Iterable[str]]) -> tuple[float, float]:
    """``(precision, recall)`` of the image pairs grouped together by ``found`` against those of ``truth``
    (groups of image ids); precision is 1 when ``found`` groups nothing, recall 1 when ``truth`` does."""
    found_pairs, true_pairs = group_pairs(found), group_pairs(truth)
    hits = len(found_pairs & true_pairs)
    return (hits / len(found_pairs) if found_pairs else 1.0), (hits / len(true_pairs) if true_pairs else 1.0)


@dataclasses.dataclass
class _Group:
    """A group being formed: its representative, its members (representative first) and when it was formed."""

    representative: str
    members: dict[str, GroupMember]
    formed: int


def _greedy_groups(ids: list[str], order: Mapping[str, int], scores: PairScoreMap,
                   threshold: float) -> tuple[list[_Group], list[tuple[str, str]]]:
    """One pass of :func:`representative_groups` over the pairs of ``scores``: the groups, and the pairs it
    needed but ``scores`` lacks (each decided as not clearing the threshold in this pass)."""
    edges = sorted(((score, pair) for pair, score in scores.items() if score is not None and score >= threshold),
                   key=lambda edge: (-edge[0], order[edge[1][0]], order[edge[1][1]]))
    group_of: dict[str, _Group] = {}
    needed: dict[tuple[str, str], None] = {}

    def clears(a: str, b: str) -> float | None:
        """The score of ``(a, b)`` when it clears the threshold, else ``None`` (noting an unscored pair)."""
        key = pair_key(a, b, order)
        if key not in scores:
            needed[key] = None
            return None
        score = scores[key]
        return score if score is not None and score >= threshold else None

    for formed, (score, (a, b)) in enumerate(edges):
        group_a, group_b = group_of.get(a), group_of.get(b)
        if group_a is None and group_b is None:
            group = _Group(a, {a: GroupMember(a, None)}, formed)
            group.members[b] = GroupMember(b, score, a, score, "representative")
            group_of[a] = group_of[b] = group
        elif group_a is not None and group_b is not None:
            if group_a is group_b:
                continue
            kept, merged = sorted((group_a, group_b), key=lambda g: g.formed)
            joined = clears(kept.representative, merged.representative)
            if joined is None:
                continue
            for member in merged.members.values():
                first = member.image_id == merged.representative
                kept.members[member.image_id] = dataclasses.replace(
                    member, score_to_first=joined if first else None, rule="merge",
                    joined_by=kept.representative if first else member.joined_by,
                    joined_score=joined if first else member.joined_score)
                group_of[member.image_id] = kept
        else:
            group, (newcomer, member) = (group_a, (b, a)) if group_a is not None else (group_b, (a, b))
            to_first = score if member == group.representative else clears(newcomer, group.representative)
            if to_first is not None:
                group.members[newcomer] = GroupMember(newcomer, to_first, member, score, "representative")
                group_of[newcomer] = group
    unique = {id(group): group for group in group_of.values()}
    return sorted(unique.values(), key=lambda g: order[g.representative]), list(needed)


def _score_into(scores: dict[tuple[str, str], float | None], pairs: list[tuple[str, str]],
                score_missing: ScoreMissing | None) -> bool:
    """Score ``pairs`` into ``scores`` with ``score_missing``; ``False`` when there is nothing to score with."""
    if not pairs or score_missing is None:
        return False
    scores.update(zip(pairs, score_missing(pairs)))
    return True


def _ordered_members(group_members: Iterable[GroupMember], first: str, order: Mapping[str, int]) -> list[GroupMember]:
    """The members with ``first`` first, the others in the collection's order."""
    return sorted(group_members, key=lambda member: (member.image_id != first, order[member.image_id]))


def representative_groups(ids: list[str], scores: PairScoreMap, threshold: float,
                          score_missing: ScoreMissing | None = None) -> list[list[GroupMember]]:
    """Groups in which every member cleared ``threshold`` against the group's representative (module docstring).

    Args:
        ids: the collection's image ids, in order (the order decides ties and which image comes first).
        scores: ``(earlier, later)`` -> score of every scored pair.
        threshold: a pair at or above it is a copy.
        score_missing: scores pairs ``scores`` lacks (a member's pair with a representative); ``None``: such a
            pair counts as not clearing the threshold.

    Returns:
        Groups of two images or more, ordered by their representative's place; each lists its representative
        first, then its other members in the collection's order.

    The pass is repeated with the pairs it needed scored until it needs none, so that the groups are those of a
    pass in which every pair was known.
    """
    order = {image_id: i for i, image_id in enumerate(ids)}
    known: dict[tuple[str, str], float | None] = dict(scores)
    groups, needed = _greedy_groups(ids, order, known, threshold)
    while _score_into(known, needed, score_missing):
        groups, needed = _greedy_groups(ids, order, known, threshold)
    # members that came with a merged group have no score to their new representative yet: scored for the output
    unscored = {member.image_id: pair_key(group.representative, member.image_id, order) for group in groups
                for member in group.members.values() if member.rule == "merge" and member.score_to_first is None}
    _score_into(known, [pair for pair in unscored.values() if pair not in known], score_missing)
    return [_ordered_members([dataclasses.replace(member, score_to_first=known.get(unscored[member.image_id]))
                              if member.image_id in unscored else member for member in group.members.values()],
                             group.representative, order) for group in groups]


def connected_members(ids: list[str], scores: PairScoreMap, threshold: float,
                      score_missing: ScoreMissing | None = None) -> list[list[GroupMember]]:
    """The connected components of the pairs at or above ``threshold`` (:func:`connected_groups`), as members:
    each with its score to the first member (its earliest image; scored with ``score_missing`` when that pair
    was not) and the member it is reached through (rule ``connected``)."""
    order = {image_id: i for i, image_id in enumerate(ids)}
    edges = [pair for pair, score in scores.items() if score is not None and score >= threshold]
    neighbours: dict[str, list[tuple[float, str]]] = {}
    for a, b in edges:
        neighbours.setdefault(a, []).append((scores[(a, b)], b))
        neighbours.setdefault(b, []).append((scores[(a, b)], a))
    known: dict[tuple[str, str], float | None] = dict(scores)
    components = connected_groups(ids, edges)
    _score_into(known, [(c[0], m) for c in components for m in c[1:] if (c[0], m) not in known], score_missing)
    groups = []
    for component in components:
        reached, queue = {component[0]: GroupMember(component[0], None)}, [component[0]]
        for image in queue:  # breadth first from the first member
            for score, other in sorted(neighbours[image], key=lambda item: (-item[0], order[item[1]])):
                if other not in reached:
                    reached[other] = GroupMember(other, known.get((component[0], other)), image, score, "connected")
                    queue.append(other)
        groups.append(_ordered_members(reached.values(), component[0], order))
    return groups


def group_members(ids: list[str], scores: PairScoreMap, threshold: float, grouping: str = "representative",
                  score_missing: ScoreMissing | None = None) -> list[list[GroupMember]]:
    """The groups of ``grouping`` (:data:`GROUPINGS`): :func:`representative_groups` or :func:`connected_members`."""
    if grouping not in GROUPINGS:
        raise ConfigError(f"grouping must be one of {', '.join(GROUPINGS)}, got {grouping!r}")
    make = representative_groups if grouping == "representative" else connected_members
    return make(ids, scores, threshold, score_missing)


#: The header of ``groups.csv``.
GROUP_COLUMNS = ("group_id", "image_id", "score_to_first", "joined_by", "joined_score", "rule")


def write_groups(path: str | os.PathLike, groups: list[list[GroupMember]]) -> int:
    """Write ``groups.csv``: one row per member (``group_id`` from 0, ``image_id``, ``score_to_first``: the pair's
    score with the group's first member, empty on the first member's own row; ``joined_by``, ``joined_score`` and
    ``rule``: how it joined, :class:`GroupMember`); returns the rows written."""
    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.6f}"

    rows = 0
    with StagedFile(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(GROUP_COLUMNS)
        for group_id, group in enumerate(groups):
            for member in group:
                writer.writerow([group_id, member.image_id, number(member.score_to_first), member.joined_by or "",
                                 number(member.joined_score), member.rule])
                rows += 1
    return rows
