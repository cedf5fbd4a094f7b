"""``gradcam diff``: compare two runs' rows pair by pair and decide whether the explanations drifted.

>>> report = diff_runs("tests/drift_baseline.jsonl", "gradcam_out/smoke")
>>> report.drift, report.drifting_inputs()
(False, [])

A pair drifts when its image failed on one side only, when a prompted image's answer changed (two empty answers,
nothing mapped, are no drift), when its class changed (the target, or the image's top class; unless
``allow_class_change``), when one side explains a class and the other found nothing to explain (its row has no
target: no detection, or only the background), when a map is missing on one side, when either correlation of the
two maps falls below ``min_similarity``, or when the peak moved more than ``max_peak_shift`` of the image's
diagonal, or, for a video model's clip, when the correlation of the two maps' shares over the frames (their
fingerprints' ``depth``) falls below ``min_similarity``. Rows without a partner are drift too, unless
``allow_missing``. Maps are compared as the ``.npy`` files where both rows have one, else as their fingerprints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..cam.maps import upsample
from ..errors import UsageError
from ..io.discovery import VIDEO_SUFFIXES
from ..options import DiffOptions
from .manifests import MapRow, Side, read_side
from .measures import peak_shift, pearson, spearman, top_iou
from .pairing import Pair, pair_rows, same_target


@dataclass
class PairResult:
    """One pair's measures: ``compared`` says from what (``maps``, ``fingerprints``, or ``None`` when a side has
    no map or failed); ``reasons`` why it drifts (empty: it does not)."""

    pair: Pair
    compared: str | None = None
    spearman: float | None = None
    pearson: float | None = None
    iou: float | None = None
    peak_shift: float | None = None
    time_pearson: float | None = None
    """A video model's clip: the Pearson correlation of the two maps' shares over the clip's frames (their
    fingerprints' ``depth``), which the maps' means over the frames, compared above, cannot show."""
    reasons: list[str] = field(default_factory=list)

    @property
    def input(self) -> str:
        return self.pair.current.input

    @property
    def drift(self) -> bool:
        return bool(self.reasons)

    @property
    def probability_change(self) -> float | None:
        before, after = self.pair.baseline.probability, self.pair.current.probability
        return None if before is None or after is None else after - before

    def to_dict(self) -> dict[str, Any]:
        baseline, current = self.pair.baseline, self.pair.current
        return {
            "input": self.input,
            "method": current.method or baseline.method,
            "status": [baseline.status, current.status],
            "target": [_class(baseline.target), _class(current.target)],
            "top1": [_class(baseline.top), _class(current.top)],
            **({"answer": [baseline.answer, current.answer]} if baseline.answer or current.answer else {}),
            "probability": [_round(baseline.probability), _round(current.probability)],
            "probability_change": _round(self.probability_change),
            "spearman": _round(self.spearman),
            "pearson": _round(self.pearson),
            "iou_top10": _round(self.iou),
            "peak_shift": _round(self.peak_shift),
            "compared": self.compared,
            **({"pearson_time": _round(self.time_pearson)} if self.time_pearson is not None else {}),
            "drift": self.drift,
            "reasons": self.reasons,
        }


@dataclass
class DriftReport:
    """Everything ``gradcam diff`` found: the pairs' results, the rows without a partner, and how the runs' provenance
    differs (``changed``: field -> [baseline value, current value])."""

    baseline: Side
    current: Side
    options: DiffOptions
    results: list[PairResult]
    baseline_only: list[MapRow]
    current_only: list[MapRow]
    changed: dict[str, list[Any]]

    @property
    def drifting(self) -> list[PairResult]:
        return [result for result in self.results if result.drift]

    @property
    def missing(self) -> list[MapRow]:
        """The rows without a partner, baseline's first."""
        return [*self.baseline_only, *self.current_only]

    @property
    def drift(self) -> bool:
        return bool(self.drifting) or (bool(self.missing) and not self.options.allow_missing)

    @property
    def compared(self) -> dict[str, int]:
        """How many pairs were compared from each source."""
        counts: dict[str, int] = {}
        for result in self.results:
            if result.compared is not None:
                counts[result.compared] = counts.get(result.compared, 0) + 1
        return counts

    def drifting_inputs(self) -> list[str]:
        """The inputs that drift, in order, each once (also those with rows missing, unless allowed)."""
        inputs = [result.input for result in self.drifting]
        if not self.options.allow_missing:
            inputs += [row.input for row in self.missing]
        return list(dict.fromkeys(inputs))

    def to_dict(self) -> dict[str, Any]:
        options = self.options
        return {
            "baseline": str(self.baseline.path),
            "current": str(self.current.path),
            "drift": self.drift,
            "drifting": self.drifting_inputs(),
            "compared": self.compared,
            "thresholds": {
                "min_similarity": options.min_similarity,
                "max_peak_shift": options.max_peak_shift,
                "allow_class_change": options.allow_class_change,
                "allow_missing": options.allow_missing,
            },
            "pairs": [result.to_dict() for result in self.results],
            "missing": {
                "baseline_only": [_missing(row) for row in self.baseline_only],
                "current_only": [_missing(row) for row in self.current_only],
            },
            "ignored_lines": {"baseline": self.baseline.ignored, "current": self.current.ignored},
            "provenance_changed": self.changed,
        }


def diff_runs(baseline: str | Path, current: str | Path, options: DiffOptions | None = None) -> DriftReport:
    """Compare two runs (manifests or output folders); a :class:`UsageError` for a malformed manifest, a side
    without any map to compare, or two runs with no image and method in common."""
    options = options or DiffOptions()
    before, after = read_side(Path(baseline), "baseline"), read_side(Path(current), "current")
    for side in (before, after):
        explained = [row for row in side.rows if row.status != "error"]
        if explained and all(row.grid is None and row.raw is None for row in explained):
            raise UsageError(f"{side.shown}: no row has a fingerprint or a .npy map: {why_no_maps(explained)}")
    pairing = pair_rows(before.rows, after.rows)
    if not pairing.pairs:
        raise UsageError(
            f"{before.shown} and {after.shown} have no image and method in common; are they runs over the same images?"
        )
    results = [compare_pair(pair, options) for pair in pairing.pairs]
    changed = provenance_changes(before.rows, after.rows)
    return DriftReport(before, after, options, results, pairing.baseline_only, pairing.current_only, changed)


def why_no_maps(rows: list[MapRow]) -> str:
    """Why rows carry no map to compare, and what to do, as most of them say: video rows never have one, rows that
    ``--skip-existing`` rebuilt from file names have no provenance either, rows without a target (nothing detected,
    or only the background) had none before such rows got one, and rows without provenance are older still."""

    def cause(row: MapRow) -> str:
        if Path(row.input).suffix.lower() in VIDEO_SUFFIXES:
            return "its rows are of videos, which have none (gradcam diff compares images)"
        if row.provenance is None and row.status == "skipped":
            return (
                "its rows were rebuilt from file names by --skip-existing, without the earlier manifest; "
                "run it again without --skip-existing to compare it"
            )
        if row.provenance is not None and row.target is None:
            return (
                "its rows have no target (nothing detected, or only the background) and were written by a "
                "gradcam-cli that gave such rows no fingerprint; run it again to compare it"
            )
        return "it was written by a gradcam-cli older than fingerprints; run it again to compare it"

    counts = Counter(cause(row) for row in rows)
    return counts.most_common(1)[0][0]


def pair_maps(pair: Pair) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], str] | None:
    """(baseline map, current map, the image's (H, W), ``maps`` or ``fingerprints``): the ``.npy`` maps where both
    rows have one (the current one resized to the baseline's size if they differ), else the fingerprints."""
    baseline, current = pair.baseline, pair.current
    if baseline.raw is not None and current.raw is not None:
        first, second = load_map(baseline.raw), load_map(current.raw)
        if first is not None and second is not None:
            if second.shape != first.shape:
                second = upsample(second.unsqueeze(0), first.shape)[0].double()
            return first, second, (int(first.shape[0]), int(first.shape[1])), "maps"
    if baseline.grid is not None and current.grid is not None and baseline.size is not None:
        return baseline.grid, current.grid, baseline.size, "fingerprints"
    return None


def load_map(path: Path) -> torch.Tensor | None:
    """A ``.npy`` map as an (H, W) float64 tensor, or ``None`` where the file is not one."""
    import numpy as np

    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        return None
    return torch.from_numpy(array.astype(np.float64))


def compare_pair(pair: Pair, options: DiffOptions) -> PairResult:
    """Measure one pair and give the reasons it drifts."""
    result = PairResult(pair)
    baseline, current = pair.baseline, pair.current
    if baseline.status == "error" or current.status == "error":
        if baseline.status != current.status:
            failed = current if current.status == "error" else baseline
            result.reasons.append(f"failed in the {'current' if failed is current else 'baseline'} run")
        return result
    if baseline.answer != current.answer:  # a prompted image's answer changed: its maps explain another
        result.reasons.append(f"answer {baseline.answer!r} -> {current.answer!r}")
    elif baseline.answer == "" and baseline.target is None and current.target is None:
        return result
    if not options.allow_class_change:
        result.reasons += _class_changes(baseline, current)
    nothing = _nothing_explained(baseline, current)
    if nothing:
        result.reasons.append(nothing)
    maps = pair_maps(pair)
    if maps is None:
        result.reasons.append("no map to compare on one side")
        return result
    first, second, size, result.compared = maps
    result.spearman, result.pearson = spearman(first, second), pearson(first, second)
    result.iou, result.peak_shift = top_iou(first, second), peak_shift(first, second, size)
    for name, value in (("spearman", result.spearman), ("pearson", result.pearson)):
        if value < options.min_similarity:
            result.reasons.append(f"{name} {value:.3f} < {options.min_similarity:g}")
    if result.peak_shift > options.max_peak_shift:
        result.reasons.append(f"peak moved {result.peak_shift:.3f} of the diagonal > {options.max_peak_shift:g}")
    result.reasons += _time_drift(result, options)
    return result


def _time_drift(result: PairResult, options: DiffOptions) -> list[str]:
    """A clip's pair: :attr:`PairResult.time_pearson` measured, and the reason it drifts in time, if it does."""
    baseline, current = result.pair.baseline, result.pair.current
    if baseline.depth is None or current.depth is None:
        return []
    result.time_pearson = pearson(baseline.depth, current.depth)
    if result.time_pearson >= options.min_similarity:
        return []
    along = "along the first voxel axis" if baseline.scan else "over the frames"
    return [f"{along}: pearson {result.time_pearson:.3f} < {options.min_similarity:g}"]


def _class_changes(baseline: MapRow, current: MapRow) -> list[str]:
    """The target's change (a class's, or another ``--target``'s: ``target similar:a.jpg -> similar:b.jpg``), and
    the image's top class's where that is another change."""
    reasons = []
    target = None
    if not (baseline.named or current.named):
        target = _change(baseline.target, current.target)
        if target:
            reasons.append(f"class {target}")
    elif baseline.target is not None and current.target is not None and not same_target(baseline, current):
        reasons.append(f"target {baseline.target[1]} -> {current.target[1]}")
    top = _change(baseline.top, current.top)
    if top and top != target:
        reasons.append(f"top class {top}")
    return reasons


def _nothing_explained(baseline: MapRow, current: MapRow) -> str | None:
    """Where one side explains a class and the other's row says there was nothing to explain (no target, and the
    fingerprint of its empty map): ``no detection in the current run (1 red in the baseline)``. Drift whatever the
    options, as a detection (or a segmenter's class) came or went."""
    sides = ((current, baseline, "current", "baseline"), (baseline, current, "baseline", "current"))
    for empty, other, side, other_side in sides:
        if empty.target is None and empty.grid is not None and other.target is not None:
            from ..cam.tasks import nothing_of

            nothing = nothing_of((empty.provenance or {}).get("task"))
            return f"{nothing} in the {side} run ({shown_class(other.target)} in the {other_side})"
    return None


def _change(before: tuple[int, str] | None, after: tuple[int, str] | None) -> str | None:
    if before is None or after is None or before[0] == after[0]:
        return None
    return f"{shown_class(before)} -> {shown_class(after)}"


def provenance_changes(baseline: list[MapRow], current: list[MapRow]) -> dict[str, list[Any]]:
    """The provenance fields whose value differs between the runs (the first row that has one, on each side)."""
    first = next((row.provenance for row in baseline if row.provenance), None)
    second = next((row.provenance for row in current if row.provenance), None)
    if first is None or second is None:
        return {}
    keys = dict.fromkeys([*first, *second])
    return {key: [first.get(key), second.get(key)] for key in keys if first.get(key) != second.get(key)}


def shown_class(cls: tuple[int, str]) -> str:
    """``285 Egyptian cat`` (the index alone where the class has no other name)."""
    return f"{cls[0]} {cls[1]}" if cls[1] and cls[1] != str(cls[0]) else str(cls[0])


def _class(cls: tuple[int, str] | None) -> dict[str, Any] | None:
    return None if cls is None else {"index": cls[0], "name": cls[1]}


def _missing(row: MapRow) -> dict[str, Any]:
    return {"input": row.input, "method": row.method, "target": _class(row.target), "line": row.line}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
