"""The ``--report`` gallery: one self-contained static ``index.html`` for a whole run.

It is built at the end of a run from the run's :class:`~gradcam_cli.batch.Record` rows. Images are never embedded:
each overlay gets a small JPEG thumbnail under ``<output_dir>/_thumbs/`` (written while the run has the overlay in
memory) and the page links to the full-size files by relative paths, so the output folder can be moved or zipped
as a whole. The entries travel as one embedded JSON array; a few lines of plain JavaScript show them a page at a
time (with a filter box), and thumbnails load lazily, so the page stays quick with 10,000 images. Failures are also
listed as static HTML, so they read even with scripts off.
"""

from __future__ import annotations

import html
import json
import os
import posixpath
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import torch

from .render import write_atomic

if TYPE_CHECKING:
    from .batch import Record

INDEX_NAME = "index.html"
THUMB_DIR = "_thumbs"
THUMB_SIDE = 192
THUMB_QUALITY = 80
PAGE_SIZE = 60
MAX_LISTED_FAILURES = 500
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def thumbnail_path(output_dir: Path, output: Path | str) -> Path:
    """Where the thumbnail of an output file (an overlay, or a video's first frame) goes: mirrored under _thumbs."""
    return output_dir / _thumbnail_relative(str(output), os.path.abspath(output_dir))


def _thumbnail_relative(output: str, root: str) -> str:
    relative = _relative(output, root)
    if relative is None or relative.startswith("../"):  # not under the output directory: flat, by name
        relative = os.path.basename(output)
    return f"{THUMB_DIR}/{posixpath.splitext(relative)[0]}.jpg"


def _relative(path: str, root: str) -> str | None:
    """``path`` relative to the absolute directory ``root``, with forward slashes; None if there is no such path.

    Plain string operations: the gallery of 10,000 images calls this for every file it links.
    """
    absolute = os.path.abspath(path)
    if absolute.startswith(root + os.sep):
        relative = absolute[len(root) + 1 :]
    else:
        try:
            relative = os.path.relpath(absolute, root)
        except ValueError:  # another drive (Windows)
            return None
    return relative.replace(os.sep, "/")


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


def _ensure_thumbnail(root: str, overlay: str) -> str | None:
    """The overlay's thumbnail, made from the file when the run did not write one (e.g. an older run's outputs)."""
    thumb = os.path.join(root, _thumbnail_relative(overlay, root))
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


def _href(path: Path | str, root: str) -> str:
    """A relative URL from the gallery in the absolute directory ``root`` to ``path`` (file URI if none exists)."""
    relative = _relative(str(path), root)
    if relative is None:
        return Path(path).absolute().as_uri()
    return quote(relative, safe="/")


def _kind(path: str) -> str:
    name = os.path.basename(path).lower()
    suffix = os.path.splitext(name)[1]
    if suffix == ".npy":
        return "raw map"
    if suffix in (".mp4", ".avi", ".mov", ".mkv", ".webm"):
        return "video"
    if "_panel." in name:
        return "panel"
    if "_heatmap-" in name:
        return "heatmap"
    return "file"


def _prediction(prediction: Any) -> list[Any]:
    return [prediction.name, round(float(prediction.probability), 4), prediction.index]


def gallery_entries(records: Iterable[Record], output_dir: Path) -> list[dict[str, Any]]:
    """One JSON-ready entry per input, sorted by path, merging that input's rows (targets x methods)."""
    entries: dict[str, dict[str, Any]] = {}
    root = os.path.abspath(output_dir)
    for record in records:
        entry = entries.get(record.input)
        if entry is None:
            entry = entries[record.input] = {
                "name": record.input,
                "src": _href(record.input, root),
                "status": record.status,
                "predictions": [],
                "views": [],
                "files": [],
                "error": None,
            }
        if record.status == "error":
            entry["status"] = "error"
            entry["error"] = record.error or "failed"
            continue
        if record.status != "ok" or not record.outputs:
            continue
        if not entry["predictions"]:
            entry["predictions"] = [_prediction(p) for p in record.predictions]
        main, *others = record.outputs
        thumb = _ensure_thumbnail(root, main)
        view = {
            "method": record.method,
            "target": _prediction(record.target) if record.target else None,
            "href": _href(main, root),
            "kind": _kind(main),
            "thumb": _href(thumb, root) if thumb else None,
            "files": [],
        }
        for other in others:
            kind = _kind(other)
            link = [kind, _href(other, root)]
            if kind == "panel":
                if link not in entry["files"]:
                    entry["files"].append(link)
            else:
                view["files"].append(link)
        entry["views"].append(view)
    return sorted(entries.values(), key=lambda entry: (entry["name"].lower(), entry["name"]))


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
    page = _PAGE.format(
        title=html.escape(title),
        facts="".join(f"<div><dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd></div>" for k, v in facts.items() if v),
        failures=_failures_html(failures),
        page_size=int(page_size),
        data=json.dumps(entries, separators=(",", ":")).replace("<", "\\u003c"),
        style=_STYLE,
        script=_SCRIPT,
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


_STYLE = """
:root { font-family: system-ui, sans-serif; color: #1d1d1f; background: #f5f5f7; }
body { margin: 0 auto; padding: 1rem 1.5rem 3rem; max-width: 1600px; }
h1 { font-size: 1.4rem; margin: 0 0 .5rem; }
dl.facts { display: flex; flex-wrap: wrap; gap: .25rem 1.25rem; margin: 0 0 .75rem; font-size: .9rem; }
dl.facts div { display: flex; gap: .35rem; } dt { color: #6e6e73; } dd { margin: 0; font-weight: 600; }
.bar { position: sticky; top: 0; z-index: 1; display: flex; flex-wrap: wrap; gap: .5rem; align-items: center;
  padding: .5rem 0; background: #f5f5f7; border-bottom: 1px solid #d2d2d7; margin-bottom: .75rem; }
.bar input[type=search] { flex: 1 1 16rem; padding: .35rem .5rem; font: inherit; }
.bar select, .bar button { font: inherit; padding: .3rem .6rem; }
#count { color: #424245; font-size: .9rem; }
#cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(230px, 1fr)); gap: .75rem; }
.card { background: #fff; border: 1px solid #d2d2d7; border-radius: 8px; padding: .6rem; font-size: .82rem;
  overflow-wrap: anywhere; }
.card.error { border-color: #d70015; background: #fff5f5; } .card.skipped { opacity: .7; }
.card h2 { font-size: .85rem; margin: 0 0 .4rem; font-weight: 600; } .card h2 a { color: inherit; }
.views { display: flex; flex-wrap: wrap; gap: .4rem; }
figure { margin: 0; width: 192px; }
figure .thumb { display: block; width: 192px; height: 144px; object-fit: contain; background: #e8e8ed;
  border-radius: 4px; }
figure .thumb.none { display: flex; align-items: center; justify-content: center; color: #6e6e73; }
figcaption { margin-top: .2rem; } figcaption .p { color: #6e6e73; }
.links a, .files a { margin-right: .5rem; } .files { margin-top: .3rem; color: #6e6e73; }
ol.preds { margin: .4rem 0 0; padding-left: 1.3rem; color: #424245; }
.err { color: #d70015; margin: .3rem 0 0; }
ul.failures { font-size: .85rem; } #failures { margin-bottom: 1rem; } #failures summary { color: #d70015;
  font-weight: 600; cursor: pointer; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  const parseStarted = performance.now();
  const entries = JSON.parse(document.getElementById("gallery-data").textContent);
  const parseMs = (performance.now() - parseStarted).toFixed(1);
  const cards = document.getElementById("cards");
  const count = document.getElementById("count");
  const search = document.getElementById("filter");
  const status = document.getElementById("status");
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  const pageSize = Number(cards.dataset.pageSize) || 60;
  let page = 0;
  let shown = entries;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function pct(p) { return (100 * p).toFixed(1) + "%"; }

  function card(entry) {
    const node = el("article", {class: "card " + entry.status, "data-status": entry.status});
    const head = el("h2");
    head.append(el("a", {href: entry.src}, entry.name));
    node.append(head);
    const views = el("div", {class: "views"});
    for (const view of entry.views) {
      const figure = el("figure");
      const link = el("a", {href: view.href});
      if (view.thumb) {
        link.append(el("img", {class: "thumb", src: view.thumb, loading: "lazy", decoding: "async",
          alt: (view.method || "") + " " + (view.target ? view.target[0] : "")}));
      } else {
        link.append(el("span", {class: "thumb none"}, view.kind === "video" ? "▶ video" : "open"));
      }
      figure.append(link);
      const caption = el("figcaption");
      caption.append(document.createTextNode((view.method || "") + " · "));
      if (view.target) {
        caption.append(document.createTextNode(view.target[0] + " "));
        caption.append(el("span", {class: "p"}, pct(view.target[1]) + " (#" + view.target[2] + ")"));
      } else {
        caption.append(el("span", {class: "p"}, "top class per frame"));
      }
      if (view.files.length) {
        const links = el("div", {class: "links"});
        for (const [label, href] of view.files) links.append(el("a", {href: href}, label));
        caption.append(links);
      }
      figure.append(caption);
      views.append(figure);
    }
    if (entry.views.length) node.append(views);
    if (entry.files.length) {
      const files = el("div", {class: "files"}, "all views: ");
      for (const [label, href] of entry.files) files.append(el("a", {href: href}, label));
      node.append(files);
    }
    if (entry.predictions.length) {
      const list = el("ol", {class: "preds", title: "top predictions"});
      for (const [name, p, index] of entry.predictions) {
        list.append(el("li", {}, name + " " + pct(p) + " (#" + index + ")"));
      }
      node.append(list);
    }
    if (entry.error) node.append(el("p", {class: "err"}, entry.error));
    if (entry.status === "skipped") node.append(el("p", {}, "skipped: outputs from an earlier run"));
    return node;
  }

  function applyFilter() {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const wanted = status.value;
    shown = entries.filter(function (entry) {
      if (wanted !== "all" && entry.status !== wanted) return false;
      if (!words.length) return true;
      const parts = [entry.name, ...entry.predictions.map(p => p[0])];
      for (const v of entry.views) parts.push(v.method || "", v.target ? v.target[0] : "");
      const text = parts.join(" ").toLowerCase();
      return words.every(w => text.includes(w));
    });
    page = 0;
    render();
  }

  function render() {
    const started = performance.now();
    const pages = Math.max(1, Math.ceil(shown.length / pageSize));
    page = Math.min(Math.max(page, 0), pages - 1);
    const start = page * pageSize;
    const slice = shown.slice(start, start + pageSize);
    const fragment = document.createDocumentFragment();
    for (const entry of slice) fragment.append(card(entry));
    cards.replaceChildren(fragment);
    cards.dataset.shown = String(slice.length);
    cards.dataset.total = String(shown.length);
    cards.dataset.renderMs = (performance.now() - started).toFixed(1);
    const range = (start + 1) + "\u2013" + (start + slice.length);
    count.textContent = shown.length
      ? "showing " + range + " of " + shown.length + " images (page " + (page + 1) + " of " + pages + ")"
      : "no images match";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
    if (history.replaceState) history.replaceState(null, "", "#page=" + (page + 1));
  }

  prev.addEventListener("click", function () { page -= 1; render(); window.scrollTo(0, 0); });
  next.addEventListener("click", function () { page += 1; render(); window.scrollTo(0, 0); });
  search.addEventListener("input", applyFilter);
  status.addEventListener("change", applyFilter);
  const match = /page=(\d+)/.exec(location.hash);
  if (match) page = Number(match[1]) - 1;
  render();
  cards.dataset.parseMs = parseMs;
})();
"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
<dl class="facts">{facts}</dl>
{failures}
<div class="bar">
  <input id="filter" type="search" placeholder="filter by file or class name" aria-label="filter">
  <select id="status" aria-label="status">
    <option value="all">all</option><option value="ok">explained</option>
    <option value="error">failed</option><option value="skipped">skipped</option>
  </select>
  <button id="prev" type="button">← previous</button>
  <button id="next" type="button">next →</button>
  <span id="count"></span>
</div>
<noscript><p>The image grid needs JavaScript; the files themselves are beside this page.</p></noscript>
<main id="cards" data-page-size="{page_size}"></main>
<script id="gallery-data" type="application/json">{data}</script>
<script>{script}</script>
</body>
</html>
"""
