"""``gradcam eval --plot``: each method's mean deletion and insertion curves, drawn from an
:class:`~gradcam_cli.evaluation.report.EvalReport`."""

from __future__ import annotations

import io
from pathlib import Path

from .report import EvalReport


def write_plot(report: EvalReport, path: Path) -> None:
    """Plot each method's mean deletion and insertion curves (Agg canvas, no pyplot) and write the file atomically.

    The format follows ``path``'s suffix (``.png``, ``.pdf``, ``.svg``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..io.atomic import write_atomic

    figure = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2, sharey=True)
    for method in report.methods:
        s = report.summary(method)
        if not s.get("images"):
            continue
        for ax, kind in zip(axes, ("deletion", "insertion"), strict=True):
            curve = s[f"{kind}_curve"]
            fractions = [k / (len(curve) - 1) for k in range(len(curve))]
            ax.plot(fractions, curve, label=f"{method} (AUC {s[f'{kind}_auc']:.3f})")
    for ax, kind in zip(axes, ("deletion", "insertion"), strict=True):
        ax.set_title(f"{kind.capitalize()} ({'lower' if kind == 'deletion' else 'higher'} AUC is better)")
        ax.set_xlabel(f"fraction of pixels {'removed' if kind == 'deletion' else 'inserted'}")
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("probability of the explained class")
    figure.suptitle(f"{report.model}: mean over {len(report.ok)} image(s)")
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lower().lstrip("."))
    write_atomic(path, buffer.getvalue())
