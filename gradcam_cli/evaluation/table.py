"""The human-readable ``gradcam eval`` report: a table of methods, then per-class pointing, the images whose
evidence lies outside the object, and the sanity check's verdict."""

from __future__ import annotations

import math
from typing import Any

from .report import EvalReport


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None or math.isnan(value) else pattern.format(value)


def format_report(report: EvalReport) -> list[str]:
    """The human-readable report: a table of methods, then per-class pointing, outside-evidence and sanity lines."""
    summaries = {method: report.summary(method) for method in report.methods}
    measured = f"{report.options.steps} steps" if report.has_curves or not report.has_boxes else "boxes only"
    layer = f", layer {'+'.join(report.layers)}" if report.layers else ""  # none for RISE and occlusion alone
    lines = [f"model {report.model}{layer}, {len(report.ok)} image(s), {measured}", ""]
    lines += _methods_table(report, summaries)
    for method, s in summaries.items():
        lines += _per_class(method, s)
    for method, s in summaries.items():
        lines += _outside(method, s)
    for method, s in summaries.items():
        lines += _sanity(method, s)
    return lines


def _methods_table(report: EvalReport, summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The table of methods, one row each, with the notes under it."""
    curves = report.has_curves or not report.has_boxes
    roads = curves and any("road" in s for s in summaries.values())
    frames = curves and any("temporal_deletion_auc" in s for s in summaries.values())  # a video model's clips
    header = ["method", *(["deletion AUC", "insertion AUC", "avg drop %", "increase %"] if curves else [])]
    header += ["frames deletion AUC", "frames insertion AUC"] if frames else []
    header += ["ROAD MoRF", "ROAD LeRF", "ROAD"] if roads else []
    if report.has_boxes:
        header += ["pointing %", "energy in box"]
    if report.sanity_modules:
        header += ["sanity rho"]
    rows = [_method_row(report, method, s, curves, roads) for method, s in summaries.items() if s.get("images")]
    lines = _table(header, rows)
    if curves:
        lower = "deletion AUC, avg drop, ROAD MoRF, sanity rho" if roads else "deletion AUC, avg drop, sanity rho"
        lower = lower.replace("deletion AUC", "deletion AUCs") if frames else lower
        lines.append(f"(lower is better: {lower}; higher is better: the others)")
    if frames:
        lines.append("(deletion and insertion: of the clips' voxels; frames deletion and insertion: of their frames)")
    if report.sanity_modules:
        lines.append("(sanity rho: the highest mean Spearman correlation over the randomisation cascade)")
    return lines


def _method_row(report: EvalReport, method: str, s: dict[str, Any], curves: bool, roads: bool) -> list[str]:
    """One method's row of the table."""
    row = [method]
    if curves:
        row += [
            _fmt(s.get("deletion_auc")),
            _fmt(s.get("insertion_auc")),
            _fmt(s.get("average_drop"), "{:.1f}"),
            _fmt(s.get("increase_in_confidence"), "{:.1f}"),
        ]
    if "temporal_deletion_auc" in s:
        row += [_fmt(s.get("temporal_deletion_auc")), _fmt(s.get("temporal_insertion_auc"))]
    if roads:
        row += [_fmt(s.get("road_morf")), _fmt(s.get("road_lerf")), _fmt(s.get("road"))]
    if report.has_boxes:
        overall = s["pointing"]["overall"]
        row += [_fmt(overall["accuracy"], "{:.1f}"), _fmt(overall["energy"])]
    if report.sanity_modules:
        row += [_fmt(max(s["sanity"]["spearman"]))]
    return row


def _per_class(method: str, s: dict[str, Any]) -> list[str]:
    """A method's pointing by class, where boxes give classes."""
    per_class = s.get("pointing", {}).get("per_class", {})
    if not per_class:
        return []
    class_rows = [
        [label, str(c["count"]), _fmt(c["accuracy"], "{:.1f}"), _fmt(c["energy"])] for label, c in per_class.items()
    ]
    table = _table(["class", "images", "pointing %", "energy in box"], class_rows)
    return ["", f"by class ({method}):", *("  " + line for line in table)]


def _outside(method: str, s: dict[str, Any]) -> list[str]:
    """The images whose evidence lies mostly outside the object, worst first."""
    outside = s.get("outside")
    if not outside:
        return []
    lines = ["", f"evidence mostly outside the object ({method}; energy in box below 0.5, worst first):"]
    for row in outside:
        label = f" [{row['class']}]" if row["class"] else ""
        hit = "hit" if row["hit"] else "miss"
        lines.append(
            f"  {_fmt(row['energy'], '{:.2f}')}  {row['image']}{label}  "
            f"(explained {row['explained']} {row['probability']:.0%}, pointing {hit})"
        )
    return lines


def _sanity(method: str, s: dict[str, Any]) -> list[str]:
    """The sanity check's verdict for a method."""
    sanity = s.get("sanity")
    if not sanity:
        return []
    stages = ", ".join(f"top {k}: {_fmt(rho, '{:.2f}')}" for k, rho in enumerate(sanity["spearman"], 1))
    verdict = (
        f"FLAGGED: maps barely change when the model is randomised (rho > {sanity['threshold']})"
        if sanity["flagged"]
        else "ok: maps depend on the trained parameters"
    )
    return [
        "",
        f"sanity ({method}): Spearman rho with re-initialised {', '.join(sanity['modules'])}",
        f"  {stages} -> {verdict}",
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
