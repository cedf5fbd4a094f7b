"""The ``gradcam eval --rank --report DIR`` page: the ranking table, the mean deletion/insertion curves, one box plot
per metric (each method's per-image values), and a few example images with every method's map side by side.

Everything is written atomically into DIR: ``index.html``, ``curves.png``, ``boxes.png`` and ``example-N.png``;
the page links the images and holds no pixels itself.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from ..cam.results import ImageExplanation
from ..io.atomic import write_atomic
from ..io.display import displayable
from .meta import MetaRow
from .plot import write_plot
from .rank import RANKED, RankRow, format_interval, group_cell, marks, seed_cell, values, warnings
from .report import EvalReport

STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}td.m,th.m{text-align:left}"
    ".bad{color:#b00;font-weight:bold}img{max-width:100%;border:1px solid #ddd}"
)


def write_rank_report(
    folder: Path,
    report: EvalReport,
    rows: Sequence[RankRow],
    examples: Sequence[tuple[str, ImageExplanation]],
    meta: Sequence[MetaRow] = (),
) -> Path:
    """Write the page and its figures into ``folder`` (created); returns the page's path. ``meta``: the metrics'
    meta-evaluation (``--meta``), a table after the ranking's."""
    from ..render.panels import render_panel

    folder.mkdir(parents=True, exist_ok=True)
    figures = []
    if report.has_curves:
        write_plot(report, folder / "curves.png")
        figures.append(("curves.png", "Mean deletion and insertion curves"))
    write_atomic(folder / "boxes.png", _box_plots(report, rows))
    figures.append(("boxes.png", "Per-image values of every metric, one box per method"))
    shown = []
    for number, (name, explained) in enumerate(examples, 1):
        if explained.pixels is None or not explained.explanations:
            continue
        write_atomic(folder / f"example-{number}.png", render_panel(explained.pixels, explained.explanations))
        target = explained.explanations[0].target
        shown.append((f"example-{number}.png", f"{name}: {target.name} ({target.probability:.3f})"))
    page = _page(report, rows, figures, shown, meta)
    write_atomic(folder / "index.html", page.encode("utf-8"))
    return folder / "index.html"


def _page(
    report: EvalReport,
    rows: Sequence[RankRow],
    figures: Sequence[tuple[str, str]],
    examples: Sequence[tuple[str, str]],
    meta: Sequence[MetaRow] = (),
) -> str:
    def e(text: str) -> str:
        return html.escape(displayable(text))

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>gradcam eval --rank: {e(report.model)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Which map to trust: {e(report.model)}</h1>",
        f"<p id='summary' data-methods='{len(report.methods)}' data-images='{len(report.ok)}'>"
        f"{len(report.methods)} method(s) on {len(report.ok)} image(s); 95 % bootstrap confidence intervals over "
        "images; <em>vs best</em> and <em>vs randomcam</em>: the mean per-image difference with its paired BCa 95 % "
        "interval; methods in one <em>group</em> cannot be told apart (in parentheses: too few images to be "
        "reliable); <em>seed SD</em>: how much a per-image value moves with the seeds of the evaluation's own "
        "randomness (not in the intervals). <span class='bad'>sanity failed</span>: the "
        "maps change no more when the model is randomised than the check allows; "
        "<span class='bad'>not above randomcam</span>: the paired interval against randomcam does not exclude 0 on "
        "deletion/insertion AUC (a clip's frames' too) or pointing.</p>",
        *(f"<p class='warning bad'>warning: {e(line)}</p>" for line in warnings(rows)),
    ]
    for metric in dict.fromkeys(row.metric for row in rows):
        block = [row for row in rows if row.metric == metric]
        parts.append(f"<h2>{e(block[0].label)} <small>({block[0].better} is better)</small></h2>")
        parts.append(f"<table class='ranking' data-metric='{e(metric)}'><tr><th>#</th><th>group</th>")
        parts.append("<th class='m'>method</th><th>mean</th><th>95 % CI</th><th>vs best</th><th>vs randomcam</th>")
        parts.append("<th>seed SD</th>")
        parts.append("<th class='m'>marks</th></tr>")
        for row in block:
            parts.append(
                f"<tr data-group='{row.group}'><td>{row.rank}</td><td>{group_cell(row)}</td>"
                f"<td class='m'>{e(row.method)}</td>"
                f"<td>{_fmt(row.mean)}</td><td>{format_interval(row.ci_low, row.ci_high)}</td>"
                f"<td>{_paired(row.vs_best, row.vs_best_low, row.vs_best_high)}</td>"
                f"<td>{_paired(row.vs_random, row.vs_random_low, row.vs_random_high)}</td>"
                f"<td>{seed_cell(row)}</td>"
                f"<td class='m bad'>{e(', '.join(marks(row)))}</td></tr>"
            )
        parts.append("</table>")
    parts += _meta_table(meta, e)
    for file, caption in figures:
        parts.append(f"<h2>{e(caption)}</h2><img src='{e(file)}' alt='{e(caption)}'>")
    if examples:
        parts.append("<h2>Examples: every method's map side by side</h2>")
    for file, name in examples:
        parts.append(f"<figure class='example'><img src='{e(file)}' alt='{e(name)}'><figcaption>{e(name)}")
        parts.append("</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _meta_table(meta: Sequence[MetaRow], e: Callable[[str], str]) -> list[str]:
    """The meta-evaluation's table (:func:`~gradcam_cli.evaluation.meta.format_meta`'s), where measured."""
    if not meta:
        return []
    parts = ["<h2>Meta-evaluation: which metrics to trust</h2><table class='meta'><tr><th class='m'>metric</th>"]
    parts.append("<th>IAC_NR</th><th>IEC_NR</th><th>IAC_AR</th><th>IEC_AR</th><th>MC</th><th class='m'>verdict</th>")
    for row in meta:
        said = {True: "trusted", False: "not trusted", None: "not measured"}[row.trusted]
        marked = "m" if row.trusted is not False else "m bad"
        cells = "".join(f"<td>{_fmt(v)}</td>" for v in (row.iac_nr, row.iec_nr, row.iac_ar, row.iec_ar, row.mc))
        parts.append(
            f"<tr data-metric='{e(row.metric)}' data-trusted='{said}'><td class='m'>{e(row.label)}</td>{cells}"
            f"<td class='{marked}'>{e(said + ': ' + '; '.join(row.reasons))}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _box_plots(report: EvalReport, rows: Sequence[RankRow]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys(row.metric for row in rows))
    columns = min(3, max(1, len(metrics)))
    lines = max(1, math.ceil(len(metrics) / columns))
    figure = Figure(figsize=(5 * columns, 0.6 * len(report.methods) * lines + 1.5 * lines), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(lines, columns, squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        data = values(report, metric)
        ax.set_visible(True)
        ax.boxplot([data[m] for m in report.methods], orientation="horizontal", tick_labels=list(report.methods))
        label, better, _ = RANKED[metric]
        ax.set_title(f"{label} ({better} is better)", fontsize=10)
        ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _paired(difference: float, low: float, high: float) -> str:
    return "-" if math.isnan(difference) else f"{difference:+.3f} {format_interval(low, high)}"
