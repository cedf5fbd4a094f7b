"""A scan's row in the run view: its map over the scan plane by plane, slice by slice, and its other classes.

A scan's row (one whose outputs hold a NIfTI map, ``.nii.gz``: docs/volumes.md) gets a viewer of three planes. The
page asks for the scan's facts (:meth:`ScanViews.facts`: each plane's voxel axis and number of slices, the slice
through the map's peak, and the classes the run mapped for that scan and method: the rows of its input and method),
then for one slice of one plane at a time, a PNG drawn on the server as the montage draws that plane
(:func:`~gradcam_cli.render.montage.plane_view`: the map over the scan, a cross on the peak), in the row's intensity
window (``volume.intensity_window``; an older row's: the scan's 0.5th to 99.5th percentiles) with the run's colormap
and opacity (or those asked for).

The page names rows by number and planes by name, never a path: the map is found as every row file is
(:func:`~gradcam_cli.serve.files.row_output`: inside the run folder, symbolic links resolved), the scan is the row's
input as the manifest names it (its first channel, as the montage draws it). A scan that can no longer be read, or
lies on another grid than the map, leaves the map shown alone over black, and the facts say why. The scans and maps
read last are kept, up to :data:`SCAN_BYTES`, so that moving a slider reads no file.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..cam.records import intensity_window
from ..errors import GradcamError, ImageError, describe
from ..io.volumes import peak, read_volume
from ..render.colour import colormap_table
from ..render.encode import encode_image
from ..render.montage import PLANE_NAMES, Window, plane_order, plane_view
from .files import row_output
from .http import HttpError, blocking, bytes_response, float_param, guarded, json_response, text_param
from .runindex import RunIndex

SCAN_BYTES = 1 << 30
"""The scans and maps kept in memory at most (least recently used dropped first)."""
DERIVED_KEPT = 256
"""The maps whose peak and window are kept (all forgotten past that)."""
NIFTI = (".nii.gz", ".nii")


@dataclass(frozen=True)
class Shown:
    """What a scan's row draws: the scan's first channel (zeros where it cannot be read), the map, the map's affine,
    its peak voxel, the intensity window, and why the scan is not shown (``""``: it is)."""

    scan: np.ndarray[Any, Any]
    values: np.ndarray[Any, Any]
    affine: np.ndarray[Any, Any]
    peak: tuple[int, ...]
    window: Window
    missing: str


class ScanViews:
    """The run's scans' rows as the page's viewer asks for them (its index ``run``, the run folder ``root``, the
    folder the run's relative paths start from ``base``, the run's ``colormap`` and ``alpha``)."""

    def __init__(self, run: RunIndex, root: Path, base: Path, colormap: str, alpha: float) -> None:
        self.run, self.root, self.base = run, root, base
        self.colormap, self.alpha = colormap, alpha
        self._kept: OrderedDict[tuple[Any, ...], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = OrderedDict()
        self._derived: dict[tuple[Any, ...], tuple[tuple[int, ...], Window]] = {}
        """Each map's peak and window (over its scan), by the files' keys and the row's window."""
        self._lock = threading.Lock()

    def facts(self, number: int) -> dict[str, Any]:
        """``{"planes": [{"plane", "axis", "count", "peak", "backwards"}], "classes": [{"row", "index", "name"}],
        "missing"}``: each plane's voxel axis (``i``, ``j``, ``k``), its slices, the peak's slice (a voxel index)
        and whether the index runs against the world axis; the classes' rows; why the scan is not shown."""
        shown = self.shown(number)
        planes = []
        for plane in PLANE_NAMES:
            axis, count, backwards = plane_order(shown.values.shape, shown.affine, plane)
            planes.append(
                {"plane": plane, "axis": "ijk"[axis], "count": count, "peak": shown.peak[axis], "backwards": backwards}
            )
        classes = [
            {"row": row["row"], "index": row["target_index"], "name": row["target_name"]}
            for row in self.run.siblings(number)
        ]
        return {"planes": planes, "classes": classes, "missing": shown.missing}

    def slice_png(self, number: int, plane: str, index: int, colormap: str | None, alpha: float | None) -> bytes:
        """Slice ``index`` (a voxel index along the plane's axis) of ``plane`` of row ``number``'s map over its scan,
        as a PNG; a plane or slice it does not have: 404."""
        if plane not in PLANE_NAMES:
            raise HttpError(404, f"no plane {plane!r}; the planes are {', '.join(PLANE_NAMES)}")
        shown = self.shown(number)
        axis, count, _ = plane_order(shown.values.shape, shown.affine, plane)
        if not 0 <= index < count:
            raise HttpError(404, f"the {plane} plane has slices 0 to {count - 1}; no slice {index}")
        voxel = list(shown.peak)
        voxel[axis] = index
        table = colormap_table(colormap or self.colormap)
        opacity = self.alpha if alpha is None else alpha
        _, pixels = plane_view(
            shown.scan, shown.values, shown.affine, tuple(voxel), plane, table, opacity, shown.window
        )
        return encode_image(pixels, ".png")

    def shown(self, number: int) -> Shown:
        """Row ``number``'s map and scan, read (or kept from an earlier request)."""
        row = self.run.row(number)
        if row is None:
            raise HttpError(404, f"no row {number}")
        outputs = row["outputs"]
        k = next((k for k, out in enumerate(outputs) if str(out).lower().endswith(NIFTI)), None)
        if row["status"] == "error" or k is None:
            raise HttpError(404, "this row has no scan's map")
        map_path = row_output(self.root, self.base, self.run.manifest, outputs, k)
        map_key, values, affine = self._read(map_path)
        scan_path = self.base / row["path"]
        missing, scan_key = "", None
        try:
            scan_key, scan, _ = self._read(scan_path)
        except GradcamError as error:
            scan, missing = np.zeros_like(values), f"the scan cannot be read ({error}); the map is shown alone"
        if scan.shape != values.shape:
            shapes = "x".join(map(str, scan.shape)), "x".join(map(str, values.shape))
            scan, missing = np.zeros_like(values), f"the scan's grid {shapes[0]} is not the map's {shapes[1]}"
        given = intensity_window(row.get("volume"))
        key = (map_key, scan_key if not missing else None, given)
        with self._lock:
            derived = self._derived.get(key)
        if derived is None:  # the peak and the scan's percentiles: once per map and scan
            window = Window(*given) if given is not None else Window.of(scan) if not missing else Window(0.0, 1.0)
            derived = peak(values, affine)[0], window
            with self._lock:
                if len(self._derived) >= DERIVED_KEPT:
                    self._derived.clear()
                self._derived[key] = derived
        return Shown(scan, values, affine, derived[0], derived[1], missing)

    def _read(self, path: Path) -> tuple[tuple[Any, ...], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """A scan's (or map's) file's key (its path, modification time and size), its first channel and its affine;
        kept while they fit in :data:`SCAN_BYTES`."""
        try:
            stat = path.stat()
        except OSError as error:
            raise ImageError(f"{path.name}: {describe(error, path)}") from None
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return (key, *self._kept[key])
        volume = read_volume([path])
        found = (np.ascontiguousarray(volume.data[0]), volume.affine)
        with self._lock:
            self._kept[key] = found
            while sum(data.nbytes for data, _ in self._kept.values()) > SCAN_BYTES and len(self._kept) > 1:
                self._kept.popitem(last=False)
        return (key, *found)


def scan_routes(views: ScanViews | None) -> list[Route]:
    """``GET /api/run/rows/<n>/scan`` (:meth:`ScanViews.facts`) and ``GET /api/run/rows/<n>/scan/<plane>/<k>.png``
    (``?colormap=&alpha=``: :meth:`ScanViews.slice_png`)."""

    def needed() -> ScanViews:
        if views is None:
            raise HttpError(409, "no run is served")
        return views

    async def facts(request: Request) -> Response:
        served = needed()
        return json_response(await blocking(lambda: served.facts(request.path_params["row"])))

    async def slice_png(request: Request) -> Response:
        served = needed()
        number, plane, index = (request.path_params[name] for name in ("row", "plane", "k"))
        colormap = text_param(request, "colormap")
        alpha = float_param(request, "alpha", 0.0, 1.0)
        data = await blocking(lambda: served.slice_png(number, plane, index, colormap, alpha))
        return bytes_response(data, "image/png", cache=False)

    return [
        Route("/api/run/rows/{row:int}/scan", guarded(facts)),
        Route("/api/run/rows/{row:int}/scan/{plane}/{k:int}.png", guarded(slice_png)),
    ]
