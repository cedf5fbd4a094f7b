"""The ``--report`` gallery: one self-contained static ``index.html`` for a whole run.

It is built at the end of a run from its :class:`~gradcam_cli.cam.records.Record` rows. Images are not embedded:
each overlay gets a small JPEG thumbnail under ``<output_dir>/_thumbs/`` (written while the run has the overlay in
memory) and the page links to the full-size files by relative paths, so the output folder can be moved or zipped
as a whole. The entries travel as one embedded JSON array; a few lines of plain JavaScript show them a page at a
time (with a filter box), and thumbnails load lazily, so the page stays quick with 10,000 images. Failures are also
listed as static HTML, so they read even with scripts off.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import GradcamError
from ..io.atomic import write_atomic
from ..io.display import displayable, href
from ..io.naming import (
    INDEX_NAME,
    output_kind,
    preview_path,
    preview_relative,
    slices_path,
    slices_relative,
    thumbnail_path,
    thumbnail_relative,
)
from .montage import PLANE_NAMES, plane_order, strip_slices

if TYPE_CHECKING:
    from ..cam.records import Record

THUMB_SIDE = 192
THUMB_QUALITY = 80
PAGE_SIZE = 60
MAX_LISTED_FAILURES = 500
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def encode_thumbnail(pixels: torch.Tensor) -> bytes:
    """A JPEG at most THUMB_SIDE pixels on its longer side, from an (H, W, 3) uint8 tensor."""
    from PIL import Image

    return _encode(Image.fromarray(pixels.cpu().numpy()))


def _encode(image: Any) -> bytes:
    import io

    from PIL import Image

    image = image.convert("RGB")
    image.thumbnail((THUMB_SIDE, THUMB_SIDE), Image.Resampling.BILINEAR, reducing_gap=2.0)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=THUMB_QUALITY)
    return buffer.getvalue()


def save_thumbnail(pixels: torch.Tensor, path: Path) -> None:
    """Write the thumbnail of an (H, W, 3) uint8 overlay atomically."""
    write_atomic(path, encode_thumbnail(pixels))


def save_video_card(overlay: torch.Tensor, video: Path, output_dir: Path, written: list[Path]) -> None:
    """The files a video's card shows of the overlay video ``video``: the thumbnail of its first frame ``overlay``
    (the player's poster) and the browser-playable WebM preview it plays (:func:`~gradcam_cli.io.video.write_preview`),
    each added to ``written`` (removed if the input fails) before it is written."""
    from ..io.video import write_preview

    thumbnail = thumbnail_path(output_dir, video)
    written.append(thumbnail)
    save_thumbnail(overlay, thumbnail)
    preview = preview_path(output_dir, video)
    written.append(preview)
    write_preview(video, preview)


def _ensure_thumbnail(root: str, overlay: str) -> str | None:
    """The overlay's thumbnail, made from the file when the run did not write one (e.g. an older run's outputs)."""
    thumb = os.path.join(root, thumbnail_relative(overlay, root))
    if os.path.isfile(thumb):
        return thumb
    if os.path.splitext(overlay)[1].lower() not in _IMAGE_SUFFIXES or not os.path.isfile(overlay):
        return None
    try:
        from PIL import Image

        with Image.open(overlay) as image:
            image.draft("RGB", (THUMB_SIDE, THUMB_SIDE))
            write_atomic(Path(thumb), _encode(image))
    except (OSError, ValueError):
        return None
    return thumb


def _prediction(prediction: Any) -> list[Any]:
    """[name, probability (null when unknown: rows rebuilt from file names), index]."""
    probability = float(prediction.probability)
    return [prediction.name, round(probability, 4) if math.isfinite(probability) else None, prediction.index]


def gallery_entries(records: Iterable[Record], output_dir: Path) -> list[dict[str, Any]]:
    """One JSON-ready entry per input, sorted by path, merging that input's rows (targets x methods; a video model's
    clips share their overlay video's view, which links every clip's files and names its importance plot as
    ``curve``; a video's view names its WebM preview as ``preview``; a scan's map's view names its planes' strips of
    slices as ``planes``).

    Skipped rows that carry outputs (a resumed run's images, explained by an earlier run) make full entries too,
    with status ``skipped``: the page marks them as from an earlier run."""
    entries: dict[str, dict[str, Any]] = {}
    root = os.path.abspath(output_dir)
    for record in records:
        entry = entries.get(record.input)
        if entry is None:
            entry = entries[record.input] = {
                "name": displayable(record.input),
                "src": href(record.input, root),
                "status": record.status,
                "predictions": [],
                "views": [],
                "files": [],
                "error": None,
            }
        if record.status == "error":
            entry["status"] = "error"
            entry["error"] = displayable(
                (record.error or "failed").removeprefix(f"{record.input}: ")
            )  # shown after the path
            continue
        if record.status not in ("ok", "skipped") or not record.outputs:
            continue
        if not entry["predictions"]:
            entry["predictions"] = [_prediction(p) for p in record.shown_predictions]
        main, *others = record.outputs
        thumb = _ensure_thumbnail(root, main)
        view: dict[str, Any] = {
            "method": record.method,
            "target": _prediction(record.target) if record.target else None,
            "href": href(main, root),
            "kind": output_kind(main),
            "thumb": href(thumb, root) if thumb else None,
            "files": [],
        }
        _moving(view, main, root, record.volume.peak if record.volume is not None else None)
        shown = next((v for v in entry["views"] if v["href"] == view["href"]), None)
        if shown is not None:  # a video model's later clips: one overlay video, its files gathered on one view
            view = shown
        _link(entry, view, others, root)
        if shown is None:
            entry["views"].append(view)
    return sorted(entries.values(), key=lambda entry: (entry["name"].lower(), entry["name"]))


def _link(entry: dict[str, Any], view: dict[str, Any], others: list[str], root: str) -> None:
    """A row's other files: an image's panel once on its entry, the rest on the view (each once); a video model's
    importance plot also as the view's ``curve``."""
    for other in others:
        kind = output_kind(other)
        link = [kind, href(other, root)]
        if kind == "panel":
            if link not in entry["files"]:
                entry["files"].append(link)
        elif link not in view["files"]:
            view["files"].append(link)
        if kind == "importance over time":
            view["curve"] = link[1]


def _moving(view: dict[str, Any], main: str, root: str, peak: tuple[int, ...] | None = None) -> None:
    """A video gets ``preview``, its WebM preview (:func:`save_video_card`) that the card plays, where the run wrote
    one; a scan's map gets ``planes``: for each plane (axial, coronal, sagittal) whose strip of slices the run wrote
    with ``--report`` (:func:`save_scan_card`), its name, the strip, its number of slices, which the plane's slider
    moves through, and ``start``, the slice nearest the map's ``peak`` voxel (the middle one where it is not
    known)."""
    if view["kind"] == "video":
        preview = os.path.join(root, preview_relative(main, root))
        if os.path.isfile(preview):
            view["preview"] = href(preview, root)
        return
    if view["kind"] != "NIfTI map":
        return
    from PIL import Image

    starts = _peak_slices(main, peak)
    shown = []
    for plane in PLANE_NAMES:
        strip = os.path.join(root, slices_relative(main, root, plane))
        try:
            with Image.open(strip) as image:  # the header only
                width, height = image.size
        except (OSError, ValueError):
            continue
        if width > 0 and height >= width:
            count = height // width
            chosen = starts.get(plane)
            start = chosen[1] if chosen is not None and chosen[0] == count else (count - 1) // 2
            shown.append({"plane": plane, "src": href(strip, root), "count": count, "start": start})
    if shown:
        view["planes"] = shown


def _peak_slices(nifti: str, peak: tuple[int, ...] | None) -> dict[str, tuple[int, int]]:
    """For each plane, its strip's number of slices and the one nearest ``peak``, from the map's NIfTI header (its
    grid and affine: no voxel is read); none where it cannot be read."""
    if peak is None or len(peak) != 3:
        return {}
    from ..io.volumes import read_header

    try:
        grid, affine = read_header(Path(nifti))
    except GradcamError:  # no nibabel, a file moved or damaged: the middle slices
        return {}
    shape = grid[1:]
    found = {}
    for plane in PLANE_NAMES:
        axis, depth, backwards = plane_order(shape, affine, plane)
        chosen = strip_slices(depth, backwards)
        nearest = min(range(len(chosen)), key=lambda k: abs(chosen[k] - peak[axis]))
        found[plane] = (len(chosen), nearest)
    return found


def save_scan_card(
    montage: torch.Tensor, strips: dict[str, torch.Tensor], nifti: Path, output_dir: Path, written: list[Path]
) -> None:
    """The files a scan's card shows of its map ``nifti``: the thumbnail of its ``montage`` and each plane's strip of
    slices (:func:`~gradcam_cli.render.montage.strips`), each added to ``written`` (removed if the scan fails) before
    it is written atomically."""
    from .encode import save_image

    thumbnail = thumbnail_path(output_dir, nifti)
    written.append(thumbnail)
    save_thumbnail(montage, thumbnail)
    for plane, pixels in strips.items():
        strip = slices_path(output_dir, nifti, plane)
        written.append(strip)
        save_image(pixels, strip)


def write_gallery(
    records: Iterable[Record],
    output_dir: Path,
    title: str = "gradcam report",
    details: dict[str, str] | None = None,
    page_size: int = PAGE_SIZE,
) -> Path:
    """Write ``<output_dir>/index.html`` atomically from a run's records; return its path."""
    output_dir = Path(output_dir)
    rows = list(records)
    entries = gallery_entries(rows, output_dir)
    counts = {status: sum(e["status"] == status for e in entries) for status in ("ok", "error", "skipped")}
    models = sorted({r.model for r in rows})
    layers = sorted({r.layer for r in rows})
    methods = sorted({r.method for r in rows if r.method})
    facts = {
        "images": str(len(entries)),
        "explained": str(counts["ok"]),
        "failed": str(counts["error"]),
        "skipped": str(counts["skipped"]),
        "model": ", ".join(models),
        "layer": ", ".join(layers),
        "method": ", ".join(methods),
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        **(details or {}),
    }
    failures = [e for e in entries if e["status"] == "error"]
    page = _asset("page.html").format(
        title=html.escape(displayable(title)),
        facts="".join(
            f"<div><dt>{html.escape(k)}</dt><dd>{html.escape(displayable(v))}</dd></div>" for k, v in facts.items() if v
        ),
        failures=_failures_html(failures),
        page_size=int(page_size),
        data=json.dumps(entries, separators=(",", ":")).replace("<", "\\u003c"),
        style=_asset("style.css"),
        script=_asset("script.js"),
    )
    path = output_dir / INDEX_NAME
    write_atomic(path, page.encode("utf-8"))
    return path


def _failures_html(failures: list[dict[str, Any]]) -> str:
    if not failures:
        return ""
    items = "".join(
        f'<li><a href="{html.escape(e["src"])}">{html.escape(e["name"])}</a>: {html.escape(e["error"] or "")}</li>'
        for e in failures[:MAX_LISTED_FAILURES]
    )
    more = len(failures) - MAX_LISTED_FAILURES
    tail = f"<p>… and {more} more (choose “failed” above to page through all).</p>" if more > 0 else ""
    return (
        f'<details id="failures" open><summary>{len(failures)} failed</summary>'
        f'<ul class="failures">{items}</ul>{tail}</details>'
    )


def _asset(name: str) -> str:
    """A file of the page (HTML template, CSS, JavaScript), shipped as package data in ``gallery_page/``."""
    return resources.files(__package__).joinpath("gallery_page").joinpath(name).read_text(encoding="utf-8")
