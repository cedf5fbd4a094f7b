"""The text report of ``gradcam diff``: a header, one line per pair, the reasons of each drifting pair, the rows
without a partner, and the verdict line."""

from __future__ import annotations

import json

from .compare import DriftReport, PairResult, shown_class
from .manifests import MapRow, Side

INPUT_WIDTH = 40
"""Longer inputs are shown by their end."""
COLUMNS = ("input", "method", "class", "p change", "spearman", "pearson", "top10 IoU", "peak shift")


def format_table(report: DriftReport) -> list[str]:
    """The lines for people (the verdict comes separately: :func:`verdict`)."""
    before, after = report.baseline, report.current
    lines = [
        f"baseline: {before.path} ({counted(before)})",
        f"current:  {after.path} ({counted(after)})",
        f"compared: {len(report.results)} pairs, {sources(report)}",
    ]
    if report.changed:
        made = "; ".join(f"{key} {shown_value(a)} -> {shown_value(b)}" for key, (a, b) in report.changed.items())
        lines.append(f"made differently: {made}")
    cells = [[*COLUMNS, ""], *(pair_cells(result) for result in report.results)]
    widths = [max(len(row[column]) for row in cells) for column in range(len(COLUMNS))]
    lines.append("")
    for row in cells:
        left = [cell.ljust(width) for cell, width in zip(row[:3], widths[:3], strict=True)]
        right = [cell.rjust(width) for cell, width in zip(row[3:-1], widths[3:], strict=True)]
        lines.append("  ".join([*left, *right, row[-1]]).rstrip())
    for result in report.drifting:
        lines.append(f"drift: {described(result.pair.current)}: {'; '.join(result.reasons)}")
    for side, missing in (("current", report.baseline_only), ("baseline", report.current_only)):
        lines += [f"missing in the {side} run: {described(row)}" for row in missing]
    return lines


def counted(side: Side) -> str:
    """``20 rows``, and the lines left out as no rows: ``20 rows; line 21 is not a row (torn by a killed run?), left
    out``."""
    if not side.ignored:
        return f"{len(side.rows)} rows"
    shown = ", ".join(map(str, side.ignored[:5])) + (", ..." if len(side.ignored) > 5 else "")
    noun = "line" if len(side.ignored) == 1 else "lines"
    verb = "is not a row" if len(side.ignored) == 1 else "are not rows"
    return f"{len(side.rows)} rows; {noun} {shown} {verb} (torn by a killed run?), left out"


def sources(report: DriftReport) -> str:
    """What the maps were compared from: ``20 from fingerprints``, ``4 from maps, 16 from fingerprints``."""
    return ", ".join(f"{count} from {source}" for source, count in report.compared.items()) or "no maps"


def verdict(report: DriftReport) -> str:
    """One line: no drift, or drift naming the images."""
    options = report.options
    images = len({result.input for result in report.results})
    if not report.drift:
        note = f", {len(report.missing)} unpaired row(s) allowed" if report.missing else ""
        return (
            f"no drift: {images} image(s) within --min-similarity {options.min_similarity:g} and "
            f"--max-peak-shift {options.max_peak_shift:g}{note}"
        )
    drifting = report.drifting_inputs()
    return f"drift in {len(drifting)} image(s): {', '.join(drifting)}"


def pair_cells(result: PairResult) -> list[str]:
    """A pair's cells under ``COLUMNS``, then ``DRIFT`` or nothing."""
    baseline, current = result.pair.baseline, result.pair.current
    target = current.target or baseline.target
    if "error" in (baseline.status, current.status):
        shown = shown_class(target) if target else f"{baseline.status} / {current.status}"
    elif baseline.target is None or current.target is None:  # a side with nothing to explain (or a rebuilt row)
        before, after = (str(row.target[0]) if row.target else "none" for row in (baseline, current))
        shown = "none" if before == after else f"{before} -> {after}"
    elif baseline.target[0] != current.target[0]:
        shown = f"{baseline.target[0]} -> {current.target[0]}"
    else:
        shown = shown_class(current.target)
    change = result.probability_change
    return [
        _short(result.input),
        current.method or baseline.method or "-",
        shown,
        "-" if change is None else f"{change:+.3f}",
        _number(result.spearman, 3),
        _number(result.pearson, 3),
        _number(result.iou, 2),
        _number(result.peak_shift, 3),
        "DRIFT" if result.drift else "",
    ]


def described(row: MapRow) -> str:
    """``input (method, class 285 Egyptian cat)``, or ``input (error)`` for a failed image."""
    what = ", ".join(part for part in (row.method, f"class {shown_class(row.target)}" if row.target else None) if part)
    return f"{row.input} ({what or row.status})"


def _short(text: str) -> str:
    return text if len(text) <= INPUT_WIDTH else "…" + text[-(INPUT_WIDTH - 1) :]


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def shown_value(value: object) -> str:
    """A provenance value as the reports show it: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)
