"""The human-readable ``gradcam eval`` report: a table of methods, then per-class pointing, the images whose
evidence lies outside the object, and the sanity check's verdict."""

from __future__ import annotations

import math

from .report import EvalReport


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None or math.isnan(value) else pattern.format(value)


def format_report(report: EvalReport) -> list[str]:
    """The human-readable report: a table of methods, then per-class pointing, outside-evidence and sanity lines."""
    summaries = {method: report.summary(method) for method in report.methods}
    measured = f"{report.options.steps} steps" if report.has_curves or not report.has_boxes else "boxes only"
    layer = f", layer {'+'.join(report.layers)}" if report.layers else ""  # none for RISE and occlusion alone
    lines = [f"model {report.model}{layer}, {len(report.ok)} image(s), {measured}", ""]
    curves = report.has_curves or not report.has_boxes
    header = ["method", *(["deletion AUC", "insertion AUC", "avg drop %", "increase %"] if curves else [])]
    roads = curves and any("road" in s for s in summaries.values())
    header += ["ROAD MoRF", "ROAD LeRF", "ROAD"] if roads else []
    if report.has_boxes:
        header += ["pointing %", "energy in box"]
    if report.sanity_modules:
        header += ["sanity rho"]
    rows = []
    for method, s in summaries.items():
        if not s.get("images"):
            continue
        row = [method]
        if curves:
            row += [
                _fmt(s.get("deletion_auc")),
                _fmt(s.get("insertion_auc")),
                _fmt(s.get("average_drop"), "{:.1f}"),
                _fmt(s.get("increase_in_confidence"), "{:.1f}"),
            ]
        if roads:
            row += [_fmt(s.get("road_morf")), _fmt(s.get("road_lerf")), _fmt(s.get("road"))]
        if report.has_boxes:
            overall = s["pointing"]["overall"]
            row += [_fmt(overall["accuracy"], "{:.1f}"), _fmt(overall["energy"])]
        if report.sanity_modules:
            row += [_fmt(max(s["sanity"]["spearman"]))]
        rows.append(row)
    lines += _table(header, rows)
    if curves:
        lower = "deletion AUC, avg drop, ROAD MoRF, sanity rho" if roads else "deletion AUC, avg drop, sanity rho"
        lines.append(f"(lower is better: {lower}; higher is better: the others)")
    if report.sanity_modules:
        lines.append("(sanity rho: the highest mean Spearman correlation over the randomisation cascade)")
    for method, s in summaries.items():
        per_class = s.get("pointing", {}).get("per_class", {})
        if per_class:
            lines += ["", f"by class ({method}):"]
            class_rows = [
                [label, str(c["count"]), _fmt(c["accuracy"], "{:.1f}"), _fmt(c["energy"])]
                for label, c in per_class.items()
            ]
            lines += ["  " + line for line in _table(["class", "images", "pointing %", "energy in box"], class_rows)]
    for method, s in summaries.items():
        outside = s.get("outside")
        if outside:
            lines += ["", f"evidence mostly outside the object ({method}; energy in box below 0.5, worst first):"]
            for row in outside:
                label = f" [{row['class']}]" if row["class"] else ""
                hit = "hit" if row["hit"] else "miss"
                lines.append(
                    f"  {_fmt(row['energy'], '{:.2f}')}  {row['image']}{label}  "
                    f"(explained {row['explained']} {row['probability']:.0%}, pointing {hit})"
                )
    for method, s in summaries.items():
        sanity = s.get("sanity")
        if sanity:
            stages = ", ".join(f"top {k}: {_fmt(rho, '{:.2f}')}" for k, rho in enumerate(sanity["spearman"], 1))
            verdict = (
                f"FLAGGED: maps barely change when the model is randomised (rho > {sanity['threshold']})"
                if sanity["flagged"]
                else "ok: maps depend on the trained parameters"
            )
            lines += ["", f"sanity ({method}): Spearman rho with re-initialised {', '.join(sanity['modules'])}"]
            lines.append(f"  {stages} -> {verdict}")
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
