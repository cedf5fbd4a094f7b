"""``gradcam diff --report DIR``: a static, self-contained ``DIR/index.html`` showing, for every drifting pair,
the baseline map | the current map | their difference, as the gallery does it: the page's HTML and CSS are
package data (``report_page/``), the images are small PNG files under ``DIR/maps/`` linked by relative paths
(never embedded), and no script is needed.

Maps are drawn over the photo where the input can be read from here (else alone, colour-mapped with jet); the
difference is current minus baseline on a diverging scale (red: evidence gained, blue: evidence lost). Maps come
from the ``.npy`` files where both rows have one, else from the fingerprints (16 x 16, drawn smoothly).
"""

from __future__ import annotations

import html
import os
import re
from importlib import resources
from pathlib import Path
from urllib.parse import quote

import torch

from ..cam.maps import upsample
from ..errors import GradcamError, UsageError, describe
from ..io.atomic import write_atomic
from ..io.display import displayable, href
from ..io.images import load_image, to_pixel_tensor
from ..io.lock import ensure_folder
from ..io.naming import INDEX_NAME
from ..render.colour import blend, colormap_table, heatmap_image
from ..render.encode import encode_image
from .compare import DriftReport, PairResult, pair_maps
from .table import COLUMNS, described, pair_cells, shown_value, sources, verdict

DISPLAY_SIDE = 256
"""The longer side of the pictures on the page, in pixels."""
MAP_COLORMAP = "jet"
DIFFERENCE_COLORMAP = "RdBu_r"
ALPHA = 0.5
CAPTIONS = {"difference": "difference (red: more evidence now, blue: less)"}
MAPS_FOLDER = "maps"
PICTURE = re.compile(r"\d{4}-(baseline|current|difference)\.png")
"""The names of the pictures in ``maps/``."""


def write_report(report: DriftReport, folder: Path) -> Path:
    """Write ``folder/index.html`` and its pictures (atomically, each); return the page's path."""
    ensure_folder(folder, "--report")
    root = os.path.abspath(folder)
    try:
        _clear_pictures(folder / MAPS_FOLDER)
        if report.drifting:
            (folder / MAPS_FOLDER).mkdir(exist_ok=True)
        cards = [_card(number, result, folder, root) for number, result in enumerate(report.drifting, 1)]
        page = _page(report, cards)
        path = folder / INDEX_NAME
        write_atomic(path, page.encode("utf-8"))
    except OSError as error:
        raise UsageError(f"--report {folder}: cannot write there: {describe(error, folder)}") from None
    return path


def _clear_pictures(maps: Path) -> None:
    """Remove an earlier report's pictures, so the folder holds this report's only."""
    if maps.is_dir():
        for picture in maps.iterdir():
            if PICTURE.fullmatch(picture.name):
                picture.unlink()


def _page(report: DriftReport, cards: list[str]) -> str:
    options = report.options
    facts = {
        "baseline": str(report.baseline.path),
        "current": str(report.current.path),
        "pairs": str(len(report.results)),
        "compared": sources(report),
        "--min-similarity": f"{options.min_similarity:g}",
        "--max-peak-shift": f"{options.max_peak_shift:g}",
    }
    changed = ""
    if report.changed:
        items = "".join(
            f"<li>{_e(key)}: {_e(shown_value(before))} → {_e(shown_value(after))}</li>"
            for key, (before, after) in report.changed.items()
        )
        changed = f'<div class="changed">made differently:<ul>{items}</ul></div>'
    missing = ""
    if report.missing:
        items = "".join(
            f"<li>{_e(row.input)} ({_e(row.method or row.status)}): only in the {side} run</li>"
            for side, rows in (("baseline", report.baseline_only), ("current", report.current_only))
            for row in rows
        )
        summary = f"<summary>{len(report.missing)} unpaired row(s)</summary>"
        missing = f'<details id="missing" open>{summary}<ul>{items}</ul></details>'
    rows = []
    for result in report.results:
        cells = "".join(f"<td>{_e(cell)}</td>" for cell in pair_cells(result)[: len(COLUMNS)])
        rows.append(f'<tr class="{"drift" if result.drift else "ok"}">{cells}</tr>')
    return _asset("page.html").format(
        title="gradcam diff",
        style=_asset("style.css"),
        verdict=_e(verdict(report)),
        verdict_class="drift" if report.drift else "ok",
        facts="".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts.items()),
        changed=changed,
        count=len(cards),
        cards="\n".join(cards),
        missing=missing,
        pair_count=len(report.results),
        head="".join(f"<th>{_e(column)}</th>" for column in COLUMNS),
        rows="\n".join(rows),
    )


def _card(number: int, result: PairResult, folder: Path, root: str) -> str:
    """One drifting pair: its name, reasons, pictures (where both sides have a map) and measures."""
    current = result.pair.current
    title = described(current)
    link = href(current.input, root) if os.path.isfile(current.input) else None
    heading = f'<a href="{_e(link)}">{_e(title)}</a>' if link else _e(title)
    figures = ""
    maps = pair_maps(result.pair)
    if maps is not None:
        first, second, size, source = maps
        pictures = _pictures(first, second, size, current.input)
        figures = '<div class="maps">'
        for which, pixels in zip(("baseline", "current", "difference"), pictures, strict=True):
            name = f"{MAPS_FOLDER}/{number:04d}-{which}.png"
            write_atomic(folder / name, encode_image(pixels, ".png"))
            caption = CAPTIONS.get(which, which)
            figures += (
                f'<figure><img src="{_e(quote(name))}" alt="{which} map"><figcaption>{caption}</figcaption></figure>'
            )
        figures += "</div>"
        figures += f'<p class="measures">from {_e(source)}: {_e(_measures(result))}</p>'
    reasons = _e("; ".join(result.reasons))
    return f'<article class="pair"><h2>{heading}</h2><p class="reasons">{reasons}</p>{figures}</article>'


def _pictures(
    first: torch.Tensor, second: torch.Tensor, size: tuple[int, int], input_path: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Baseline and current maps (over the photo where it can be read) and their difference, as (h, w, 3) uint8."""
    height, width = size
    scale = DISPLAY_SIDE / max(height, width)
    shape = (max(1, round(height * scale)), max(1, round(width * scale)))
    shown = [upsample(values.float().unsqueeze(0), shape)[0].clamp(0.0, 1.0) for values in (first, second)]
    table = colormap_table(MAP_COLORMAP)
    photo = _photo(input_path, shape)
    drawn = [heatmap_image(values, table) if photo is None else blend(photo, values, table, ALPHA) for values in shown]
    difference = ((shown[1] - shown[0]) + 1.0) / 2.0
    return drawn[0], drawn[1], heatmap_image(difference, colormap_table(DIFFERENCE_COLORMAP))


def _photo(path: str, shape: tuple[int, int]) -> torch.Tensor | None:
    """The input at ``shape`` as (h, w, 3) uint8, or ``None`` where it cannot be read from here."""
    if not os.path.isfile(path):
        return None
    try:
        image = load_image(path)
    except GradcamError:
        return None
    return to_pixel_tensor(image.resize((shape[1], shape[0])))


def _measures(result: PairResult) -> str:
    parts = [
        ("spearman", result.spearman, 3),
        ("pearson", result.pearson, 3),
        ("top-10% IoU", result.iou, 2),
        ("peak shift", result.peak_shift, 3),
    ]
    return ", ".join(f"{name} {value:.{digits}f}" for name, value, digits in parts if value is not None)


def _e(text: str) -> str:
    return html.escape(displayable(text), quote=True)


def _asset(name: str) -> str:
    """A file of the page (HTML template, CSS), shipped as package data in ``report_page/``."""
    return resources.files(__package__).joinpath("report_page").joinpath(name).read_text(encoding="utf-8")
