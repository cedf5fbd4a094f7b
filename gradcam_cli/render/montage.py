"""A scan's montage: its axial, coronal and sagittal slices through a voxel (the map's peak), the map over the scan.

Each plane is the slice of the voxel axis that runs most nearly along the plane's normal in RAS millimetres (the
affine's columns: axial across S, coronal across A, sagittal across R), shown as radiology viewers (ITK-SNAP, 3D
Slicer) show it by default: superior up (axial: anterior up), the patient's right on the left (sagittal: anterior
on the left). Every plane is drawn at one scale, in millimetres: a pixel per voxel of the finest spacing, enlarged
until the scan's longest side is :data:`MIN_SIDE` pixels, reduced until it is at most :data:`MAX_SIDE`;
the scan's intensities windowed to grey (:class:`Window`), the map blended over them as overlays are
(:func:`~gradcam_cli.render.colour.blend`), and a small cross marks the voxel; the panels stand side by side,
named above.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .colour import blend
from .encode import save_image

MIN_SIDE = 256
"""The scan's longest side (in millimetres) is drawn this many pixels long at least: small scans are enlarged."""
MAX_SIDE = 512
"""... and at most this many: large scans are reduced."""
MIN_WIDTH = 112
"""A panel's width at least (its label's), the plane centred in it."""
LABEL_HEIGHT = 16
STRIP_SIDE = 192
"""Each slice of :func:`strips` is fitted into a square this many pixels wide (the gallery's thumbnail side)."""
STRIP_SLICES = 64
"""At most this many slices of each plane in :func:`strips` (evenly spaced through the scan)."""
PLANES = (("axial", 2, 1, 0), ("coronal", 1, 2, 0), ("sagittal", 0, 2, 1))
"""Each plane: its name, the RAS axis across it (S, A, R), the RAS axis shown upwards, and the one across the
columns (shown decreasing to the right: the patient's right, or anterior, on the left)."""
PLANE_NAMES = tuple(name for name, *_ in PLANES)


@dataclass(frozen=True)
class Window:
    """Intensities from ``low`` (black) to ``high`` (white), as a viewer's window (level = the centre, width = high
    - low)."""

    low: float
    high: float

    @classmethod
    def of(cls, values: np.ndarray[Any, Any], given: tuple[float, float] | None = None) -> Window:
        """``given`` (low, high), else the scan's own 0.5th to 99.5th percentiles."""
        if given is not None:
            return cls(*given)
        low, high = np.percentile(values, (0.5, 99.5))
        return cls(float(low), float(high))

    def grey(self, values: torch.Tensor) -> torch.Tensor:
        """(H, W) intensities as an (H, W, 3) uint8 grey image."""
        span = max(self.high - self.low, 1e-6)
        level = ((values.float() - self.low) / span).clamp(0, 1).mul(255).round().to(torch.uint8)
        return level[..., None].expand(*level.shape, 3)


def plane_axes(affine: np.ndarray[Any, Any]) -> tuple[int, int, int]:
    """The voxel axis that runs most nearly along R, A and S (each voxel axis used once)."""
    weights = np.abs(np.asarray(affine, dtype=np.float64)[:3, :3])  # [ras axis, voxel axis]
    chosen: dict[int, int] = {}
    for flat in np.argsort(-weights, axis=None):
        ras, voxel = divmod(int(flat), 3)
        if ras not in chosen and voxel not in chosen.values():
            chosen[ras] = voxel
    return chosen[0], chosen[1], chosen[2]


def montage(
    scan: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    affine: np.ndarray[Any, Any],
    voxel: tuple[int, ...],
    table: torch.Tensor,
    alpha: float = 0.5,
    window: Window | None = None,
) -> torch.Tensor:
    """The montage of ``scan`` (I, J, K) with the map ``values`` (I, J, K, in [0, 1]) through ``voxel``, as an
    (H, W, 3) uint8 tensor: its :func:`planes` side by side, each named above."""
    shown = planes(scan, values, affine, voxel, table, alpha, window)
    return _side_by_side([_labelled(panel, label) for label, panel in shown])


def planes(
    scan: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    affine: np.ndarray[Any, Any],
    voxel: tuple[int, ...],
    table: torch.Tensor,
    alpha: float = 0.5,
    window: Window | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """The axial, coronal and sagittal planes through ``voxel`` (the module docstring), each as its label
    (``axial k=24``) and (H, W, 3) uint8 pixels."""
    window = window or Window.of(scan)
    return [plane_view(scan, values, affine, voxel, name, table, alpha, window) for name, *_ in PLANES]


def plane_view(
    scan: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    affine: np.ndarray[Any, Any],
    voxel: tuple[int, ...],
    plane: str,
    table: torch.Tensor,
    alpha: float,
    window: Window,
) -> tuple[str, torch.Tensor]:
    """One plane (``axial``, ``coronal`` or ``sagittal``) through ``voxel``, a cross on it, as :func:`planes` draws
    each: its label and (H, W, 3) uint8 pixels."""
    chosen = next(entry for entry in PLANES if entry[0] == plane)
    label, overlay, (mark, shape) = _plane(
        scan, values, np.asarray(affine, dtype=np.float64), voxel, chosen, table, alpha, window
    )
    _cross(overlay, mark, shape)
    return label, overlay


def plane_order(shape: tuple[int, ...], affine: np.ndarray[Any, Any], plane: str) -> tuple[int, int, bool]:
    """The voxel axis across ``plane``, its number of slices, and whether its index runs against the RAS axis
    (inferior to superior, posterior to anterior, left to right: slice 0 then is the last voxel index)."""
    _, across, _, _ = next(entry for entry in PLANES if entry[0] == plane)
    affine = np.asarray(affine, dtype=np.float64)
    axis = plane_axes(affine)[across]
    return axis, int(shape[axis]), bool(affine[across, axis] < 0)


def _plane(
    scan: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    affine: np.ndarray[Any, Any],
    voxel: tuple[int, ...],
    plane: tuple[str, int, int, int],
    table: torch.Tensor,
    alpha: float,
    window: Window,
) -> tuple[str, torch.Tensor, tuple[tuple[int, int], tuple[int, ...]]]:
    """One of :data:`PLANES` through ``voxel``: its label, its pixels, and where the voxel lies in it (its row and
    column, and the plane's shape in voxels)."""
    name, across, up, side = plane
    by_ras = plane_axes(affine)
    spacing = np.linalg.norm(affine[:3, :3], axis=0)
    sides_mm = [float(scan.shape[axis] * spacing[axis]) for axis in range(3)]
    longest = max(sides_mm) or 1.0
    per_mm = min(max(1.0 / (float(spacing.min()) or 1.0), MIN_SIDE / longest), MAX_SIDE / longest)
    fixed, rows, columns = by_ras[across], by_ras[up], by_ras[side]
    index: list[Any] = [slice(None)] * 3
    index[fixed] = voxel[fixed]
    shown = [torch.from_numpy(np.array(a[tuple(index)], dtype=np.float32)) for a in (scan, values)]
    if [axis for axis in range(3) if axis != fixed] != [rows, columns]:
        shown = [p.T for p in shown]
    # superior (axial: anterior) up: flip rows whose coordinate grows downwards; right (sagittal: anterior) on
    # the left: flip columns whose coordinate grows to the right
    flips = ([0] if affine[up, rows] > 0 else []) + ([1] if affine[side, columns] > 0 else [])
    shown = [p.flip(flips) if flips else p for p in shown]
    size = (max(1, round(sides_mm[rows] * per_mm)), max(1, round(sides_mm[columns] * per_mm)))
    grey = _resized(window.grey(shown[0]).permute(2, 0, 1).float(), size).round().to(torch.uint8).permute(1, 2, 0)
    heat = _resized(shown[1][None], size)[0].clamp(0, 1)
    overlay = blend(grey, heat, table, alpha)
    shape = tuple(shown[0].shape)
    return f"{name} {'ijk'[fixed]}={voxel[fixed]}", overlay, (_marked(voxel[rows], voxel[columns], shape, flips), shape)


def strips(
    scan: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    affine: np.ndarray[Any, Any],
    table: torch.Tensor,
    alpha: float = 0.5,
    window: Window | None = None,
    side: int = STRIP_SIDE,
    most: int = STRIP_SLICES,
) -> dict[str, torch.Tensor]:
    """The gallery's slice sliders: for each plane (axial, coronal, sagittal), its slices of the map over the scan,
    drawn as the montage draws that plane (at most ``most``, evenly spaced, in :func:`plane_order`: inferior to
    superior, posterior to anterior, left to right; all of them when there are fewer), each fitted into a ``side`` x
    ``side`` black square, stacked from top to bottom as one (n * side, side, 3) uint8 image."""
    window = window or Window.of(scan)
    affine = np.asarray(affine, dtype=np.float64)
    found = {}
    for plane in PLANES:
        axis, depth, backwards = plane_order(scan.shape, affine, plane[0])
        frames = []
        for k in strip_slices(depth, backwards, most):
            voxel = [0, 0, 0]
            voxel[axis] = k
            _, pixels, _ = _plane(scan, values, affine, tuple(voxel), plane, table, alpha, window)
            frames.append(_fitted(pixels, side))
        found[plane[0]] = torch.cat(frames)
    return found


def strip_slices(depth: int, backwards: bool, most: int = STRIP_SLICES) -> list[int]:
    """The voxel indices of a plane's slices in its strip (:func:`strips`), in the strip's order, of the ``depth``
    slices of a plane whose index runs ``backwards`` (:func:`plane_order`)."""
    chosen = sorted({round(float(k)) for k in np.linspace(0, depth - 1, min(depth, most))})
    return chosen[::-1] if backwards else chosen


def _fitted(pixels: torch.Tensor, side: int) -> torch.Tensor:
    """(H, W, 3) uint8 pixels fitted into a ``side`` x ``side`` black square (bilinear), centred."""
    height, width = pixels.shape[:2]
    scale = side / max(height, width)
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    fitted = F.interpolate(pixels.permute(2, 0, 1)[None].float(), size=size, mode="bilinear", align_corners=False)
    square = torch.zeros(3, side, side)
    top, left = (side - size[0]) // 2, (side - size[1]) // 2
    square[:, top : top + size[0], left : left + size[1]] = fitted[0]
    return square.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)


def write_montage(path: Path, image: torch.Tensor) -> None:
    """The montage as a PNG, written atomically."""
    save_image(image, path)


def _marked(row: int, column: int, shape: tuple[int, ...], flips: list[int]) -> tuple[int, int]:
    """The voxel's (row, column) in the shown plane."""
    if 0 in flips:
        row = shape[0] - 1 - row
    if 1 in flips:
        column = shape[1] - 1 - column
    return row, column


def _resized(channels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(C, h, w) resized to (C, H, W): nearest voxel, so that each voxel shows as the block it is."""
    return F.interpolate(channels[None].float(), size=size, mode="nearest-exact")[0]


def _cross(overlay: torch.Tensor, mark: tuple[int, int], shape: tuple[int, ...]) -> None:
    """A small white cross at the voxel's centre (in place)."""
    height, width = overlay.shape[:2]
    row = int((mark[0] + 0.5) * height / shape[0])
    column = int((mark[1] + 0.5) * width / shape[1])
    arm = max(3, min(height, width) // 40)
    overlay[max(0, row - arm) : row + arm + 1, min(column, width - 1)] = 255
    overlay[min(row, height - 1), max(0, column - arm) : column + arm + 1] = 255


def _labelled(panel: torch.Tensor, text: str) -> torch.Tensor:
    """``panel`` under a black band with ``text`` in white."""
    from PIL import Image, ImageDraw

    extra = max(0, MIN_WIDTH - panel.shape[1])
    panel = F.pad(panel.cpu(), (0, 0, extra // 2, extra - extra // 2))
    band = Image.new("RGB", (panel.shape[1], LABEL_HEIGHT))
    ImageDraw.Draw(band).text((4, 2), text, fill=(255, 255, 255))
    return torch.cat([torch.from_numpy(np.array(band)), panel])


def _side_by_side(panels: list[torch.Tensor]) -> torch.Tensor:
    height = max(panel.shape[0] for panel in panels)
    padded = [F.pad(panel, (0, 0, 0, 4, 0, height - panel.shape[0])) for panel in panels]
    return torch.cat(padded, dim=1)[:, :-4]
