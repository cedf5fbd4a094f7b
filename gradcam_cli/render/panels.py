"""Panels: one matplotlib figure per image showing the photo, the heatmap with its colour scale, and the overlay.

One explanation gives ``image | heatmap + colorbar | overlay``, titled with the class name and probability. Several
(``--top-k`` and/or several methods) give one grid: rows are target classes, columns are methods, each cell the
overlay, with the photo at the top left and one shared colorbar. Matplotlib is imported only when a panel is drawn,
on the Agg backend, through the object-oriented API (no pyplot state).
"""

from __future__ import annotations

import io
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..io.atomic import write_atomic
from ..io.display import displayable
from .colour import blend, colormap_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..cam.results import Explanation

CELL_INCHES = 3.2
DPI = 100
MAX_CELL_PIXELS = 2 * int(CELL_INCHES * DPI)
"""Images are shrunk to this longer side before plotting: a 24 MP photo draws as fast as a thumbnail."""

_DRAWING = threading.Lock()  # matplotlib is not thread-safe; panels are drawn on writer threads

_GLYPH_MISSING = r"Glyph \d+ .* missing from font"
# A name in a script the font lacks (CJK class names) draws as boxes; matplotlib's warning for each glyph would
# reach stderr past --quiet. The filter is also set once for the process (see cam/engine.py's _HOOK_FIRING).
warnings.filterwarnings("ignore", message=_GLYPH_MISSING)


def _plain(text: str) -> str:
    """Names are text, not mathtext ('$5 bill' must not start a formula), with control characters and the bytes
    of a file name that is not UTF-8 escaped (:func:`~gradcam_cli.io.display.displayable`)."""
    return displayable(text).replace("$", r"\$")


def _shrink_pixels(pixels: torch.Tensor) -> torch.Tensor:
    height, width = pixels.shape[:2]
    scale = MAX_CELL_PIXELS / max(height, width)
    if scale >= 1.0:
        return pixels.cpu()
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    image = pixels.cpu().permute(2, 0, 1).unsqueeze(0).float()
    return F.interpolate(image, size=size, mode="area")[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)


def _shrink_map(saliency: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    heat = saliency.detach().float().cpu()
    if tuple(heat.shape) == tuple(size):
        return heat
    return F.interpolate(heat[None, None], size=tuple(size), mode="area")[0, 0].clamp(0.0, 1.0)


def render_panel(
    pixels: torch.Tensor,
    explanations: Sequence[Explanation],
    colormap: str = "jet",
    alpha: float = 0.5,
    title: str | None = None,
    image_format: str = "png",
    quality: int = 90,
) -> bytes:
    """Draw the panel for one image's explanations and return the encoded file (png, jpg or webp)."""
    fmt = {"jpg": "jpeg"}.get(image_format, image_format)
    pil_kwargs = {"quality": quality} if fmt in ("jpeg", "webp") else None
    buffer = io.BytesIO()
    with _DRAWING, warnings.catch_warnings():  # quiet also where the process's filters show every warning
        warnings.filterwarnings("ignore", message=_GLYPH_MISSING)
        figure = panel_figure(pixels, explanations, colormap, alpha, title)
        figure.savefig(buffer, format=fmt, dpi=DPI, facecolor="white", pil_kwargs=pil_kwargs)
    return buffer.getvalue()


def panel_figure(
    pixels: torch.Tensor,
    explanations: Sequence[Explanation],
    colormap: str = "jet",
    alpha: float = 0.5,
    title: str | None = None,
) -> Figure:
    """The panel as a matplotlib Figure on an Agg canvas (not thread-safe: :func:`render_panel` serialises it).

    One explanation: ``image | <method> heatmap + colorbar | overlay`` under a title naming the class and its
    probability. Several: the image (top left), then one column per method and one row per target class, each
    cell an overlay, the rows labelled with class name and probability, and one shared colorbar.
    """
    if not explanations:
        raise ValueError("a panel needs at least one explanation")
    import matplotlib.cm
    import matplotlib.colors
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table = colormap_table(colormap)
    methods = list(dict.fromkeys(e.method for e in explanations))
    targets = list(dict.fromkeys(e.target.index for e in explanations))
    cells = {(e.target.index, e.method): e for e in explanations}
    small_pixels = _shrink_pixels(pixels)
    size_hw = tuple(small_pixels.shape[:2])
    shrunk = {key: _shrink_map(e.saliency, size_hw) for key, e in cells.items()}
    photo = small_pixels.numpy()
    height, width = size_hw
    aspect = min(max(height / width, 0.3), 3.0)
    single = len(cells) == 1
    rows = 1 if single else len(targets)
    columns = 3 if single else 1 + len(methods)
    header = 0.55 if title or single else 0.35
    size = (CELL_INCHES * columns + 0.9, CELL_INCHES * aspect * rows + header + 0.35 * rows)
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(rows, columns)
    axes = np.empty((rows, columns), dtype=object)
    axes[:, 0] = figure.add_subplot(grid[:, 0], anchor="N")  # the photo's column spans every row, top-aligned
    for row in range(rows):
        for column in range(1, columns):
            axes[row, column] = figure.add_subplot(grid[row, column])
    for ax in axes.flat:
        ax.set_axis_off()
    _show(axes[0, 0], photo, "image")
    if single:
        explanation, heat = next(iter(cells.values())), next(iter(shrunk.values()))
        shown = axes[0, 1].imshow(heat.numpy(), cmap=colormap, vmin=0.0, vmax=1.0, interpolation="nearest")
        axes[0, 1].set_title(f"{_plain(explanation.method)} heatmap", fontsize=10)
        figure.colorbar(shown, ax=axes[0, 1], fraction=0.046, pad=0.02, label="importance")
        _show(axes[0, 2], blend(small_pixels, heat, table, alpha).numpy(), "overlay")
        target = explanation.target
        headline = f"{_plain(target.name)}: {target.probability:.1%} (class {target.index})"
        figure.suptitle(f"{_plain(title)}\n{headline}" if title else headline, fontsize=12)
        return figure
    for row, target_index in enumerate(targets):
        for column, method in enumerate(methods, start=1):
            cell = cells.get((target_index, method))
            if cell is None:
                continue
            overlay = blend(small_pixels, shrunk[(target_index, method)], table, alpha).numpy()
            _grid_cell(axes[row, column], overlay, cell, method if row == 0 else None, column == 1)
    scale = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(0.0, 1.0), colormap)
    figure.colorbar(scale, ax=axes[:, 1:].ravel().tolist(), fraction=0.03, pad=0.02, label="importance")
    if title:
        figure.suptitle(_plain(title), fontsize=12)
    return figure


def _grid_cell(ax: Any, overlay: np.ndarray, cell: Explanation, method: str | None, labelled: bool) -> None:
    """One overlay of the grid, titled with its ``method`` (the top row) and ``labelled`` with its class (the first
    column)."""
    ax.imshow(overlay)
    ax.set_axis_on()
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    if method is not None:
        ax.set_title(_plain(method), fontsize=11)
    if labelled:
        target = cell.target
        ax.set_ylabel(f"{_plain(target.name)}\n{target.probability:.1%} (class {target.index})")


def _show(ax: Any, image: np.ndarray, caption: str) -> None:
    ax.imshow(image)
    ax.set_title(caption, fontsize=10)


def save_panel(
    path: Path,
    pixels: torch.Tensor,
    explanations: Sequence[Explanation],
    colormap: str = "jet",
    alpha: float = 0.5,
    title: str | None = None,
    quality: int = 90,
) -> None:
    """Draw the panel and write it atomically to ``path`` (format from the suffix)."""
    image_format = path.suffix.lower().lstrip(".").replace("jpeg", "jpg") or "png"
    write_atomic(path, render_panel(pixels, explanations, colormap, alpha, title, image_format, quality))
