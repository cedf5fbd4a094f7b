"""Map fingerprints: a map small enough to travel in every manifest row, enough to compare runs without the
full-size ``.npy`` files.

A fingerprint is ``{"size": [H, W], "grid": [16 strings of 32 hex digits]}``: the map's height and width in pixels,
and a 16 x 16 grid of the map, row by row from the top, where each cell is the mean of the map over its sixteenth of
the height and of the width (PyTorch's adaptive average pooling), scaled to 0..255, rounded and written as two
lower-case hex digits, left to right. ``"00"`` is no evidence, ``"ff"`` a cell where the whole map is at its maximum.
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
    """The fingerprint of an (H, W) map in [0, 1] (computed where the map is, then two hundred bytes copied)."""
    height, width = (int(side) for side in saliency.shape[-2:])
    cells = F.adaptive_avg_pool2d(saliency.detach().float().reshape(1, 1, height, width), GRID)[0, 0]
    codes = cells.clamp(0.0, 1.0).mul(LEVELS).round().to(torch.uint8).cpu()
    digits = bytes(codes.flatten().tolist()).hex()
    width_digits = 2 * GRID
    rows = [digits[start : start + width_digits] for start in range(0, GRID * width_digits, width_digits)]
    return {"size": [height, width], "grid": rows}


def empty_fingerprint(height: int, width: int) -> dict[str, Any]:
    """The fingerprint of an (H, W) map of zeros (no evidence anywhere): the row of an image where a segmenter
    explains nothing, having found only the background, carries it."""
    return {"size": [height, width], "grid": ["00" * GRID] * GRID}


def decode_fingerprint(value: Any) -> tuple[torch.Tensor, tuple[int, int]]:
    """(the (GRID, GRID) grid in [0, 1] as float64, the map's (H, W)) of a fingerprint; a ValueError saying what is
    wrong when ``value`` is not one."""
    if not isinstance(value, dict):
        raise ValueError("not an object")
    size, grid = value.get("size"), value.get("grid")
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(side, int) and side > 0 for side in size)):
        raise ValueError("its size is not [height, width]")
    if not isinstance(grid, list) or len(grid) != GRID or not all(_is_row(row) for row in grid):
        raise ValueError(f"its grid is not {GRID} rows of {2 * GRID} hex digits")
    codes = torch.tensor(list(bytes.fromhex("".join(grid))), dtype=torch.float64)
    return codes.view(GRID, GRID) / LEVELS, (size[0], size[1])


def _is_row(row: Any) -> bool:
    return isinstance(row, str) and _ROW.fullmatch(row) is not None
