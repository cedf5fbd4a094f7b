"""``create_app``: the explorer as a Starlette ASGI app, which ``gradcam serve`` runs on uvicorn and a notebook or
another service can mount.

Routes (every answer JSON or a file; every failure ``{"error": "<one line>"}`` with a 4xx or 500 status):

- ``GET /``: the page; ``GET /static/<name>``: its script and style (a fixed list).
- ``GET /api/info``: the model (name, task, layers with shapes and the default marked, methods) or none, the run.
- ``GET /api/images?offset=&limit=&q=``: the served inputs, then the uploads kept, paged and searched; ``POST
  /api/upload``: an image (the body), checked and decoded.
- ``GET /api/images/<id>.png``: an image as decoded (what the maps line up with); ``?thumb=1``: a thumbnail.
- ``GET /api/map?image=&layer=&method=&target=&rank=``: a map computed (or replayed, or kept; ``target``: a class,
  or a ``--target`` spec whose ``similar:`` names a served image: :mod:`gradcam_cli.serve.targets`); ``GET
  /api/maps/<id>.png`` its 16-bit values packed in a PNG, ``.../overlay.png``, ``.../heatmap.png``, ``.../map.npy``
  its downloads, ``.../faithfulness`` its deletion/insertion (and ROAD) figures.
- ``POST /api/ask``, ``GET /api/answers/<id>/map``: a vision-language model's answer and a word's map
  (:mod:`gradcam_cli.serve.answers`).
- ``GET /api/run/rows``: a page of the run's rows (filters, sort); ``GET /api/run/rows/<n>/outputs/<k>``: a row's
  file; ``GET /files/<path>``: a file inside the run folder.
- ``GET /api/run/rows/<n>/frames``: a clip row's overlay video's frame count and rate; ``.../frames/<f>.jpg``: its
  frame ``f`` (:mod:`gradcam_cli.serve.frames`).
- ``GET /api/run/rows/<n>/scan``: a scan's row's planes, peak and classes; ``.../scan/<plane>/<k>.png``: slice ``k``
  of a plane, the map over the scan (:mod:`gradcam_cli.serve.scans`).

Safety: files are served only from inside the run folder (after resolving symbolic links) and the given inputs;
every request but the page itself must come from the page's own origin (another site's ``Sec-Fetch-Site`` or
``Origin`` is refused with 403: :class:`SameOrigin`); the passes of one request are bounded in time
(``ServeOptions.request_seconds``: 503).
"""

from __future__ import annotations

import functools
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..io.discovery import InputImage
from ..options import ServeOptions
from ..pipeline.resume import read_run_record
from ..render.colour import colormap_table
from ..targets import TargetSpec
from .answers import answer_routes
from .files import contained, row_output
from .frames import frame_jpeg, video_facts, video_output
from .http import (
    HttpError,
    blocking,
    bytes_response,
    error_response,
    float_param,
    guarded,
    int_param,
    json_response,
    read_body,
    required_param,
    text_param,
)
from .images import ImageStore, decode
from .model import ModelService
from .origin import SameOrigin
from .runindex import RowFilter, RunIndex
from .runs import run_base
from .scans import ScanViews, scan_routes
from .server import is_loopback
from .targets import page_target

PAGE_COLORMAPS = ("jet", "turbo", "viridis", "inferno", "magma", "gray")
"""The colormaps the page offers (any matplotlib name works in a download's ``colormap``)."""
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}


@dataclass
class Explorer:
    """What the app serves: the model (or none; a vision-language model asked questions too), the images, the run
    (or none) and its folder."""

    options: ServeOptions
    images: ImageStore
    service: ModelService | None = None
    run: RunIndex | None = None
    run_dir: Path | None = None
    record: dict[str, Any] = field(default_factory=dict)
    base: Path = field(default_factory=Path.cwd)
    """The folder the run's relative paths start from (:func:`~gradcam_cli.serve.runs.run_base`)."""


def create_app(
    service: ModelService | None = None,
    inputs: Sequence[InputImage] = (),
    run_dir: Path | None = None,
    manifest: Path | None = None,
    options: ServeOptions | None = None,
    drift: Path | None = None,
    work_dir: Path | None = None,
) -> Starlette:
    """The explorer's ASGI app: ``service`` explains (none: a run view only; a vision-language model's is asked
    questions: :mod:`gradcam_cli.serve.answers`), ``inputs`` are the served images, ``run_dir``/``manifest`` a finished
    run (its index is built now), ``drift`` a ``gradcam diff --json`` result. Uploads and a fallback index live in
    ``work_dir`` (default: a new temporary folder)."""
    options = options or ServeOptions()
    work = work_dir or Path(tempfile.mkdtemp(prefix="gradcam-serve-"))
    run = RunIndex(manifest, work, drift) if manifest is not None else None
    record = read_run_record(run_dir) if run_dir is not None else {}
    base = run_base(run_dir or manifest.parent, manifest, record) if manifest is not None else Path.cwd()

    def row_input(number: int) -> tuple[str, Path] | None:
        found = run.row(number) if run is not None else None
        return (str(found["input"]), base / found["path"]) if found else None

    uploads = work / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    images = ImageStore(inputs, uploads, options, row_input)
    if service is not None:
        images.forgotten.append(service.passes.drop)
    explorer = Explorer(options, images, service, run, run_dir.resolve() if run_dir else None, record, base)
    look = _look(explorer)
    views = ScanViews(run, explorer.run_dir, base, *look) if run is not None and explorer.run_dir is not None else None
    routes = [
        Route("/", _page(explorer)),
        Route("/static/{name}", _static),
        Route("/api/info", guarded(_info(explorer))),
        Route("/api/images", guarded(_images(explorer))),
        Route("/api/upload", guarded(_upload(explorer)), methods=["POST"]),
        Route("/api/images/{id}.png", guarded(_image_png(explorer))),
        Route("/api/map", guarded(_map(explorer))),
        Route("/api/maps/{id}.png", guarded(_map_file(explorer, "png"))),
        Route("/api/maps/{id}/overlay.png", guarded(_map_file(explorer, "overlay"))),
        Route("/api/maps/{id}/heatmap.png", guarded(_map_file(explorer, "heatmap"))),
        Route("/api/maps/{id}/map.npy", guarded(_map_file(explorer, "npy"))),
        Route("/api/maps/{id}/faithfulness", guarded(_faithfulness(explorer))),
        *answer_routes(images, service.answers if service is not None else None),
        Route("/api/run/rows", guarded(_rows(explorer))),
        Route("/api/run/rows/{row:int}/outputs/{k:int}", guarded(_row_file(explorer))),
        Route("/api/run/rows/{row:int}/frames", guarded(_frames(explorer))),
        Route("/api/run/rows/{row:int}/frames/{frame:int}.jpg", guarded(_frame(explorer))),
        *scan_routes(views),
        Route("/files/{path:path}", guarded(_file(explorer))),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(SameOrigin, local=is_loopback(options.host))])
    app.state.explorer = explorer
    app.state.stopping = threading.Event()  # set by :func:`~gradcam_cli.serve.server.serve` when told to stop
    return app


def _page(explorer: Explorer) -> Any:
    async def page(request: Request) -> Response:
        html = resources.files("gradcam_cli.serve").joinpath("page/index.html").read_bytes()
        return Response(html, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-store"})

    return page


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return error_response(404, "no such file")
    data = resources.files("gradcam_cli.serve").joinpath(f"page/{name}").read_bytes()
    return Response(data, media_type=STATIC[name], headers={"Cache-Control": "no-store"})


def _needs_model(explorer: Explorer) -> ModelService:
    if explorer.service is None:
        raise HttpError(409, "no model is loaded; start gradcam serve with --model to explain images")
    return explorer.service


def _info(explorer: Explorer) -> Any:
    async def info(request: Request) -> Response:
        run = None
        if explorer.run is not None:
            facets = await blocking(explorer.run.facets)
            run = {**facets, "manifest": str(explorer.run.manifest), "record": explorer.record}
        model = explorer.service.info() if explorer.service is not None else None
        colormap, alpha = _look(explorer)
        return json_response(
            {
                "model": model,
                "run": run,
                "inputs": len(explorer.images.inputs),
                "colormaps": {name: _table(name) for name in dict.fromkeys((*PAGE_COLORMAPS, colormap))},
                "colormap": colormap,
                "alpha": alpha,
            }
        )

    return info


def _look(explorer: Explorer) -> tuple[str, float]:
    """The colormap and opacity the page starts with: the run's (its record's), else the options'."""
    colormap = str(explorer.record.get("colormap") or explorer.options.colormap)
    alpha = explorer.record.get("alpha")
    return colormap, float(alpha) if isinstance(alpha, (int, float)) else explorer.options.alpha


def _images(explorer: Explorer) -> Any:
    async def images(request: Request) -> Response:
        offset = int_param(request, "offset", 0, 0, 10**9)
        limit = int_param(request, "limit", 50, 1, 200)
        total, page = explorer.images.listing(offset, limit, text_param(request, "q"))
        return json_response({"total": total, "images": page})

    return images


def _upload(explorer: Explorer) -> Any:
    async def upload(request: Request) -> Response:
        limit = explorer.options.max_upload_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HttpError(413, f"the upload is {int(declared):,} bytes; at most {limit:,} are taken")
        data = await read_body(request, limit, f"the upload is over {limit:,} bytes")
        source = await blocking(lambda: explorer.images.upload(data, text_param(request, "name")))
        _, decoded = await blocking(lambda: explorer.images.decoded(source.id))
        height, width = decoded.size
        return json_response({"id": source.id, "name": source.name, "width": width, "height": height})

    return upload


def _image_png(explorer: Explorer) -> Any:
    async def image_png(request: Request) -> Response:
        if text_param(request, "thumb"):  # the strip's thumbnails: decoded apart, not kept among the images in use
            source = explorer.images.source(request.path_params["id"])
            data = await blocking(lambda: decode(source.path).thumbnail_png())
            return bytes_response(data, "image/png", cache=False)
        _, decoded = await blocking(lambda: explorer.images.decoded(request.path_params["id"]))
        return bytes_response(await blocking(decoded.display_png), "image/png", cache=False)

    return image_png


def _map(explorer: Explorer) -> Any:
    async def compute(request: Request) -> Response:
        service = _needs_model(explorer)
        service.check_images()
        image_id = required_param(request, "image")
        layer, method = text_param(request, "layer"), text_param(request, "method")
        target, rank = text_param(request, "target"), int_param(request, "rank", 0, 0, 1000)

        chosen = page_target(target, explorer.images, service.targets)
        shown = target.strip() if isinstance(chosen, TargetSpec) and target else None  # as typed: no server path
        source, decoded = await blocking(lambda: explorer.images.decoded(image_id))
        seconds = explorer.options.request_seconds
        answer = await service.run(
            lambda: service.explain(source, decoded, layer, method, chosen, rank, shown, seconds)
        )
        return json_response(answer.to_dict())

    return compute


def _map_file(explorer: Explorer, kind: str) -> Any:
    async def map_file(request: Request) -> Response:
        stored = _needs_model(explorer).maps.get(request.path_params["id"])
        if stored is None:
            raise HttpError(404, "this map is no longer kept; ask for it again")
        if kind == "png":
            return bytes_response(await blocking(stored.packed_png), "image/png")
        if kind == "npy":
            return bytes_response(await blocking(stored.npy), "application/octet-stream", f"{stored.name}.npy")
        colormap = text_param(request, "colormap", explorer.options.colormap) or "jet"
        colormap_table(colormap)  # an unknown name: a UsageError, 400, with close matches
        if kind == "heatmap":
            data = await blocking(lambda: stored.heatmap_png(colormap))
            return bytes_response(data, "image/png", f"{stored.name}_heatmap.png")
        alpha = float_param(request, "alpha", 0.0, 1.0)
        opacity = explorer.options.alpha if alpha is None else alpha
        data = await blocking(lambda: stored.overlay_png(colormap, opacity))
        return bytes_response(data, "image/png", f"{stored.name}.png")

    return map_file


def _faithfulness(explorer: Explorer) -> Any:
    async def faithfulness(request: Request) -> Response:
        service = _needs_model(explorer)
        stored = service.maps.get(request.path_params["id"])
        if stored is None:
            raise HttpError(404, "this map is no longer kept; ask for it again")
        road = text_param(request, "road") in ("1", "true", "yes")
        source, image = await blocking(lambda: explorer.images.decoded(stored.image))
        seconds = explorer.options.request_seconds
        return json_response(await service.run(lambda: service.curves(stored, source, image, road, seconds)))

    return faithfulness


@functools.lru_cache(maxsize=32)
def _table(name: str) -> list[list[int]]:
    """A colormap's 256 RGB entries (0-255), which the page colours maps with (all sent once, with the info)."""
    return [[round(float(v) * 255) for v in entry] for entry in colormap_table(name).tolist()]


def _rows(explorer: Explorer) -> Any:
    async def rows(request: Request) -> Response:
        if explorer.run is None:
            raise HttpError(409, "no run is served; start gradcam serve with a run's output folder")
        where = RowFilter(
            predicted=text_param(request, "predicted"),
            target=text_param(request, "target"),
            min_probability=float_param(request, "pmin", 0.0, 1.0, "the lowest probability (a fraction)"),
            max_probability=float_param(request, "pmax", 0.0, 1.0, "the highest probability (a fraction)"),
            status=text_param(request, "status"),
            drift=text_param(request, "drift"),
            query=text_param(request, "q"),
            sort=text_param(request, "sort", "row") or "row",
            desc=text_param(request, "order") == "desc",
        )
        offset = int_param(request, "offset", 0, 0, 10**9)
        limit = int_param(request, "limit", 50, 1, 200)
        run = explorer.run
        return json_response(await blocking(lambda: run.page(where, offset, limit)))

    return rows


async def _row_path(explorer: Explorer, number: int, k: int | None) -> Path:
    """Row ``number``'s ``k``-th output (``None``: its overlay video) inside the run folder, else a 4xx."""
    if explorer.run is None or explorer.run_dir is None:
        raise HttpError(409, "no run is served")
    run, root = explorer.run, explorer.run_dir
    found = await blocking(lambda: run.row(number))
    if found is None:
        raise HttpError(404, f"no row {number}")
    outputs = found["outputs"]
    return row_output(root, explorer.base, run.manifest, outputs, video_output(outputs) if k is None else k)


def _row_file(explorer: Explorer) -> Any:
    async def row_file(request: Request) -> Response:
        return _file_response(await _row_path(explorer, request.path_params["row"], request.path_params["k"]))

    return row_file


def _frames(explorer: Explorer) -> Any:
    async def frames(request: Request) -> Response:
        path = await _row_path(explorer, request.path_params["row"], None)
        return json_response(await blocking(lambda: video_facts(path)))

    return frames


def _frame(explorer: Explorer) -> Any:
    async def frame(request: Request) -> Response:
        path = await _row_path(explorer, request.path_params["row"], None)
        data = await blocking(lambda: frame_jpeg(path, request.path_params["frame"]))
        return bytes_response(data, "image/jpeg", cache=False)

    return frame


def _file(explorer: Explorer) -> Any:
    async def file(request: Request) -> Response:
        if explorer.run_dir is None:
            raise HttpError(404, "no run folder is served")
        return _file_response(contained(explorer.run_dir, request.path_params["path"]))

    return file


def _file_response(path: Path) -> Response:
    media = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
    kind = media.get(path.suffix.lower(), "application/octet-stream")
    download = None if kind.startswith("image/") else path.name
    return bytes_response(path.read_bytes(), kind, download, cache=False)
