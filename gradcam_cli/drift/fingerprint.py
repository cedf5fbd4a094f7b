"""Map fingerprints: a map small enough to travel in every manifest row, enough to compare runs without the
full-size ``.npy`` files.

A fingerprint is ``{"size": [H, W], "grid": [16 strings of 32 hex digits]}``: the map's height and width in pixels,
and a 16 x 16 grid of the map, row by row from the top, where each cell is the mean of the map over its sixteenth of
the height and of the width (PyTorch's adaptive average pooling), scaled to 0..255, rounded and written as two
lower-case hex digits, left to right. ``"00"`` is no evidence, ``"ff"`` a cell where the whole map is at its maximum.

Maps of another rank: a sequence's (L,) map is fingerprinted as a 1 x L image (``size`` ``[1, L]``, its 16 rows
alike); a clip's or a volume's ``size`` lists its three sides, ``[T, H, W]`` (``[D, H, W]``), its grid is that of its
mean over the first axis (over the frames, or the slices), and ``"depth"``, one more row of 32 hex digits, holds the
map's mean over each sixteenth of the first axis (the frames' or slices' share, on the same 0..255 scale).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F

GRID = 16
"""Cells per side of the grid."""
LEVELS = 255
"""A cell's value 0..1 is stored as round(value x LEVELS)."""
_ROW = re.compile(rf"[0-9a-f]{{{2 * GRID}}}")


def map_fingerprint(saliency: torch.Tensor) -> dict[str, Any]:
    """The fingerprint of an (H, W) map in [0, 1] (computed where the map is, then two hundred bytes copied); of an
    (L,) or a (T, H, W) map alike (see the module docstring)."""
    plane = saliency.detach().float()
    if plane.dim() == 1:
        plane = plane.view(1, -1)
    sides = [int(side) for side in plane.shape]
    if plane.dim() == 3:
        plane = plane.mean(dim=0)
    height, width = (int(side) for side in plane.shape[-2:])
    cells = F.adaptive_avg_pool2d(plane.reshape(1, 1, height, width), GRID)[0, 0]
    digits = _hex(cells)
    width_digits = 2 * GRID
    rows = [digits[start : start + width_digits] for start in range(0, GRID * width_digits, width_digits)]
    fingerprint: dict[str, Any] = {"size": sides, "grid": rows}
    if saliency.dim() == 3:
        profile = saliency.detach().float().mean(dim=(1, 2))  # no flattened copy of a transposed volume
        fingerprint["depth"] = _hex(F.adaptive_avg_pool1d(profile.view(1, 1, -1), GRID)[0, 0])
    return fingerprint


def _hex(cells: torch.Tensor) -> str:
    """Cells in [0, 1] as two hex digits each (round(value x LEVELS)), in order."""
    codes = cells.clamp(0.0, 1.0).mul(LEVELS).round().to(torch.uint8).cpu()
    return bytes(codes.flatten().tolist()).hex()


def empty_fingerprint(height: int, width: int) -> dict[str, Any]:
    """The fingerprint of an (H, W) map of zeros (no evidence anywhere): the row of an image where a segmenter
    explains nothing, having found only the background, carries it."""
    return {"size": [height, width], "grid": ["00" * GRID] * GRID}


def decode_fingerprint(value: Any) -> tuple[torch.Tensor, tuple[int, int]]:
    """(the (GRID, GRID) grid in [0, 1] as float64, the (H, W) of the plane it shows: the map's own, the last two
    sides of a 3-D map's) of a fingerprint; a ValueError saying what is wrong when ``value`` is not one."""
    if not isinstance(value, dict):
        raise ValueError("not an object")
    size, grid = value.get("size"), value.get("grid")
    if not (
        isinstance(size, list) and 2 <= len(size) <= 3 and all(isinstance(side, int) and side > 0 for side in size)
    ):
        raise ValueError("its size is not [height, width] (nor [depth, height, width])")
    if not isinstance(grid, list) or len(grid) != GRID or not all(_is_row(row) for row in grid):
        raise ValueError(f"its grid is not {GRID} rows of {2 * GRID} hex digits")
    if "depth" in value and not _is_row(value["depth"]):
        raise ValueError(f"its depth is not {2 * GRID} hex digits")
    codes = torch.tensor(list(bytes.fromhex("".join(grid))), dtype=torch.float64)
    return codes.view(GRID, GRID) / LEVELS, (size[-2], size[-1])


def _is_row(row: Any) -> bool:
    return isinstance(row, str) and _ROW.fullmatch(row) is not None


def decode_depth(value: Any) -> torch.Tensor | None:
    """A 3-D map's fingerprint's ``depth`` row, its sixteenths of the first axis (a clip's frames) in [0, 1] as
    float64; ``None`` for a fingerprint without one (an image's). Call :func:`decode_fingerprint` first: it checks
    the row."""
    depth = value.get("depth") if isinstance(value, dict) else None
    if not isinstance(depth, str) or not _is_row(depth):
        return None
    return torch.tensor(list(bytes.fromhex(depth)), dtype=torch.float64) / LEVELS
