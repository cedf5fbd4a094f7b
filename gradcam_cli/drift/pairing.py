"""Pairing the rows of two runs: by input, then method, then target.

Inputs pair by their path as written (``./a.jpg`` is ``a.jpg``); those left over pair by the longest matching end
of their paths (the same file name at least), so runs made from different folders, with absolute or relative
paths, still pair. Within an input and method, rows pair by target first (a class by its index, another
``--target`` by its name), then in the order they come (the image's first explained class with the other run's
first, and so on), so that an image whose top class or target changed still pairs, as a class or target change.
An image that failed on either side pairs as a whole.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from .manifests import MapRow


@dataclass
class Pair:
    """A baseline row and the current row it is compared with."""

    baseline: MapRow
    current: MapRow


@dataclass
class Pairing:
    """The pairs, in the baseline's order, and the rows of each side that have no partner."""

    pairs: list[Pair]
    baseline_only: list[MapRow]
    current_only: list[MapRow]


def pair_rows(baseline: Sequence[MapRow], current: Sequence[MapRow]) -> Pairing:
    """Pair the rows of two runs (each input's rows in the order its run wrote them)."""
    ours, theirs = _by_input(baseline), _by_input(current)
    partner = _pair_inputs(list(ours), list(theirs))
    result = Pairing([], [], [])
    for key, rows in ours.items():
        other = partner.get(key)
        if other is None:
            result.baseline_only += rows
            continue
        pairs, baseline_only, current_only = _pair_image(rows, theirs[other])
        result.pairs += pairs
        result.baseline_only += baseline_only
        result.current_only += current_only
    matched = set(partner.values())
    result.current_only += [row for key, rows in theirs.items() if key not in matched for row in rows]
    return result


def _by_input(rows: Sequence[MapRow]) -> dict[str, list[MapRow]]:
    grouped: dict[str, list[MapRow]] = {}
    for row in rows:
        grouped.setdefault(os.path.normpath(row.input), []).append(row)
    return grouped


def _pair_inputs(ours: list[str], theirs: list[str]) -> dict[str, str]:
    """baseline input -> current input: the same path, else the longest matching end of the path."""
    present = set(theirs)
    partner = {key: key for key in ours if key in present}
    left = [key for key in theirs if key not in partner]  # an exact partner is the same key
    by_name: dict[str, list[str]] = {}
    for key in left:
        by_name.setdefault(PurePath(key).name, []).append(key)
    candidates = [
        (_common_tail(key, other), place, key, other)
        for place, key in enumerate(ours)
        if key not in partner
        for other in by_name.get(PurePath(key).name, [])
    ]
    taken: set[str] = set()
    for _, _, key, other in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if key not in partner and other not in taken:
            partner[key] = other
            taken.add(other)
    return partner


def _common_tail(first: str, second: str) -> int:
    a, b = PurePath(first).parts[::-1], PurePath(second).parts[::-1]
    count = 0
    while count < min(len(a), len(b)) and a[count] == b[count]:
        count += 1
    return count


def _pair_image(ours: list[MapRow], theirs: list[MapRow]) -> tuple[list[Pair], list[MapRow], list[MapRow]]:
    """The pairs of one image, and its rows on either side without a partner."""
    if any(row.status == "error" for row in [*ours, *theirs]):
        return [Pair(ours[0], theirs[0])], [], []
    pairs: list[Pair] = []
    baseline_only: list[MapRow] = []
    current_only = [row for row in theirs if row.method not in {mine.method for mine in ours}]
    for method in dict.fromkeys(row.method for row in ours):
        mine = [row for row in ours if row.method == method]
        other = [row for row in theirs if row.method == method]
        for row in list(mine):  # the same class first
            match = next((o for o in other if _same(o, row)), None)
            if match is not None:
                pairs.append(Pair(row, match))
                mine.remove(row)
                other.remove(match)
        pairs += [Pair(row, match) for row, match in zip(mine, other, strict=False)]  # then in order
        baseline_only += mine[len(other) :]
        current_only += other[len(mine) :]
    place = {id(row): number for number, row in enumerate(ours)}
    return sorted(pairs, key=lambda pair: place[id(pair.baseline)]), baseline_only, current_only


def _same(first: MapRow, second: MapRow) -> bool:
    """Whether two rows explain the same target: a class by its index, another ``--target`` by its name."""
    return first.target is not None and second.target is not None and same_target(first, second)


def same_target(first: MapRow, second: MapRow) -> bool:
    """Whether two rows' targets, both given, are the same: a class by its index, another ``--target`` (``named``)
    by its name."""
    assert first.target is not None and second.target is not None
    if first.named or second.named:
        return first.named == second.named and first.target[1] == second.target[1]
    return first.target[0] == second.target[0]
