"""How ``gradcam`` shows its results on the console: the predictions and outputs of each record, and the layer
table of ``--list-layers``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cam.layers import LayerInfo
    from ..cam.records import Record
    from ..cam.tasks import TaskAdapter
    from .reporting import Reporter


def layer_row(info: LayerInfo) -> dict[str, object]:
    """A layer's ``--list-layers --json`` row (``attention``: the attention methods read this module)."""
    return {
        "name": info.name,
        "type": info.kind,
        "output_shape": info.output_shape,
        "calls": info.calls,
        "candidate": info.is_candidate,
        "attention": info.attention,
    }


def layer_line(info: LayerInfo, chosen: str) -> str:
    """A layer's line of the ``--list-layers`` table: ``*`` the default (``chosen``: several joined with ``+``),
    ``+`` a candidate; ``attention`` ends the line of a module the attention methods read."""
    mark = "*" if info.name in chosen.split("+") else "+" if info.is_candidate else " "
    shape = "x".join(map(str, info.output_shape)) if info.output_shape else "-" if info.calls == 0 else "(non-tensor)"
    calls = f"x{info.calls}" if info.calls > 1 else ""
    line = f"{mark} {info.name:<40} {info.kind:<28} {shape:<20} {calls}"
    return f"{line:<97} attention" if info.attention else line


def report_record(
    reporter: Reporter, record: Record, single: bool, first_row: bool, adapter: TaskAdapter, nothing: str | None
) -> None:
    """A record's lines: a single image's predictions first, then a line per output (errors on stderr); the task's
    ``adapter`` says how a prediction is shown, ``nothing`` what a row without a target means."""
    if record.status == "error":
        reporter.error(record.error or f"{record.input}: failed")
        return
    if record.status == "skipped":
        reporter.detail(f"skipped {record.input} (outputs exist)")
        return
    if single and first_row:
        layer = f", layer {record.layer}" if record.layer else ""  # none for RISE and occlusion alone
        reporter.result(f"{record.input}  (model {record.model}{layer})")
        for rank, p in enumerate(record.predictions, 1):
            reporter.result(f"  {rank}. {p.name:<30} {p.probability:7.2%}  {adapter.where(p)}")
    target = record.target
    if target is None and nothing is not None:
        outputs = f" -> {record.outputs[0]}" if record.outputs else ""
        line = f"{record.method}: {nothing}{outputs}"
    else:
        label = f"{target.name} ({adapter.how_much(target)})" if target else "each frame's own top class"
        line = f"{record.method} for {label} -> {record.outputs[0]}"
    if record.clip is not None:  # a video model's row: which clip, when (docs/video.md)
        start, end = record.clip.seconds
        line = f"clip {record.clip.index + 1} ({start:.2f}-{end:.2f} s): {line}"
    reporter.result(f"  {line}" if single else f"{record.input}: {line}")
