"""The human-readable ``gradcam eval`` report: a table of methods, then a detector's detections one per row and its
worst ones per method, per-class pointing, the images whose evidence lies outside the object, and the sanity check's
verdict."""

from __future__ import annotations

import math
from typing import Any

from .report import EvalReport

EXTRA_COLUMNS = {"arcc": "ARCC", "random_logit": "random logit", "smprt": "sMPRT", "emprt": "eMPRT", "dice": "Dice"}
"""The columns of ``--arcc``, ``--random-logit``, ``--mprt`` and scans' ``--masks`` (Dice), by their summary key."""


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None or math.isnan(value) else pattern.format(value)


def format_report(report: EvalReport) -> list[str]:
    """The human-readable report: a table of methods, then per-class pointing, outside-evidence and sanity lines."""
    summaries = {method: report.summary(method) for method in report.methods}
    stepped = report.has_curves or report.has_detections or not report.has_boxes
    measured = f"{report.options.steps} steps" if stepped else "boxes only"
    layer = f", layer {'+'.join(report.layers)}" if report.layers else ""  # none for RISE and occlusion alone
    lines = [f"model {report.model}{layer}, {len(report.ok)} image(s), {measured}", ""]
    lines += _methods_table(report, summaries)
    if report.has_detections:
        lines += _detections(report)
        for method, s in summaries.items():
            lines += _worst(method, s)
    for method, s in summaries.items():
        lines += _per_class(method, s)
    for method, s in summaries.items():
        lines += _outside(method, s)
    for method, s in summaries.items():
        lines += _sanity(method, s)
    return lines


def _methods_table(report: EvalReport, summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The table of methods, one row each, with the notes under it."""
    curves = report.has_curves or not (report.has_boxes or report.has_detections)
    roads = curves and any("road" in s for s in summaries.values())
    frames = curves and any("temporal_deletion_auc" in s for s in summaries.values())  # a video model's clips
    correlated = curves and any("faithfulness_correlation" in s for s in summaries.values())
    header = ["method", *(["deletion AUC", "insertion AUC", "avg drop %", "increase %"] if curves else [])]
    header += ["frames deletion AUC", "frames insertion AUC"] if frames else []
    header += ["faith. corr."] if correlated else []
    further = [name for name in EXTRA_COLUMNS if curves and any(name in s for s in summaries.values())]
    header += [EXTRA_COLUMNS[name] for name in further]
    header += ["sparseness", "complexity"] if curves else []
    header += ["ROAD MoRF", "ROAD LeRF", "ROAD"] if roads else []
    if report.has_detections:
        header += ["box deletion", "box insertion", "box pointing %", "box energy"]
    if report.has_boxes:
        header += ["pointing %", "energy in box"]
    if report.sanity_modules:
        header += ["sanity rho"]
    rows = [
        _method_row(report, method, s, curves, (roads, correlated, further))
        for method, s in summaries.items()
        if s.get("images")
    ]
    lines = _table(header, rows)
    if curves:
        lower = (
            "deletion AUC, avg drop, ROAD MoRF, complexity, sanity rho"
            if roads
            else "deletion AUC, avg drop, complexity, sanity rho"
        )
        lower += "".join(f", {EXTRA_COLUMNS[name]}" for name in ("random_logit", "smprt") if name in further)
        lower = lower.replace("deletion AUC", "deletion AUCs") if frames else lower
        lines.append(f"(lower is better: {lower}; higher is better: the others)")
    if frames:
        lines.append("(deletion and insertion: of the clips' voxels; frames deletion and insertion: of their frames)")
    if report.has_detections:
        lines += [
            "(box: each explained detection's; deletion and insertion AUC of its score, re-found by IoU and class,",
            " 0 once it vanishes: lower deletion, higher insertion is better; pointing and energy in its own box)",
        ]
    if report.sanity_modules:
        lines.append("(sanity rho: the highest mean Spearman correlation over the randomisation cascade)")
    return lines


def _method_row(
    report: EvalReport, method: str, s: dict[str, Any], curves: bool, extras: tuple[bool, bool, list[str]]
) -> list[str]:
    """One method's row of the table; ``extras``: whether ROAD and faithfulness correlation were measured, and the
    :data:`EXTRA_COLUMNS` that were."""
    roads, correlated, further = extras
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
    if correlated:
        row += [_fmt(s.get("faithfulness_correlation"))]
    row += [_fmt(s.get(name)) for name in further]
    if curves:
        row += [_fmt(s.get("gini")), _fmt(s.get("entropy"))]
    if roads:
        row += [_fmt(s.get("road_morf")), _fmt(s.get("road_lerf")), _fmt(s.get("road"))]
    if report.has_detections:
        found = s.get("detections", {})
        row += [_fmt(found.get("deletion_auc")), _fmt(found.get("insertion_auc"))]
        row += [_fmt(found.get("pointing"), "{:.1f}"), _fmt(found.get("energy"))]
    if report.has_boxes:
        overall = s["pointing"]["overall"]
        row += [_fmt(overall["accuracy"], "{:.1f}"), _fmt(overall["energy"])]
    if report.sanity_modules:
        row += [_fmt(max(s["sanity"]["spearman"]))]
    return row


def _detections(report: EvalReport) -> list[str]:
    """Every explained detection, one row per method: its deletion and insertion AUC, pointing and energy."""
    rows = []
    for image in report.ok:
        for method, scores in image.methods.items():
            for d in scores.detections:
                where = f"[{', '.join(f'{v:g}' for v in d.target.box)}]" if d.target.box is not None else ""
                rows.append(
                    [
                        image.image,
                        str(d.rank),
                        d.target.name,
                        f"{d.target.probability:.2f}",
                        where,
                        method,
                        _fmt(d.deletion_auc),
                        _fmt(d.insertion_auc),
                        "hit" if d.hit else "miss",
                        _fmt(d.energy),
                    ]
                )
    header = ["image", "#", "class", "score", "box", "method", "deletion", "insertion", "pointing", "energy"]
    return ["", "per detection:", *("  " + line for line in _table(header, rows))]


def _worst(method: str, s: dict[str, Any]) -> list[str]:
    """A method's worst detections: the lowest insertion minus deletion AUC first."""
    worst = s.get("detections", {}).get("worst")
    if not worst:
        return []
    lines = ["", f"worst detections ({method}; insertion minus deletion AUC, lowest first):"]
    for row in worst:
        explained = row["explained"]
        gap = _fmt(row["insertion_auc"] - row["deletion_auc"], "{:+.3f}")
        lines.append(
            f"  {gap}  {row['image']} #{row['rank']} {explained['name']} {explained['probability']:.0%}  "
            f"(deletion {_fmt(row['deletion_auc'])}, insertion {_fmt(row['insertion_auc'])}, "
            f"pointing {'hit' if row['hit'] else 'miss'}, energy {_fmt(row['energy'])})"
        )
    return lines


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
