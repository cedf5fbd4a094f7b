"""Putting a layer's image tokens back on the photo: each run of tokens is a grid covering a box of the photo.

A vision-language model's explained layer outputs its image tokens as one sequence (or one per tile); a
:class:`Tile` says which of them form a ``rows`` x ``cols`` grid (row-major) and which box of the original photo
that grid covers, in the photo's pixels (a box may reach past the photo's edges where the processor padded it, or
cover a part of it where it cropped). :func:`place` samples each grid bilinearly at the photo's pixel centres inside
its box and sums the tiles (an Idefics3 tile and the global image over it add up); pixels no tile covers (outside a
centre crop) stay 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Box = tuple[float, float, float, float]
"""(left, top, right, bottom) in the photo's pixels."""


@dataclass(frozen=True)
class Tile:
    """``rows`` x ``cols`` tokens, row-major from token ``start`` of the flattened layer output, covering ``box``."""

    start: int
    rows: int
    cols: int
    box: Box

    @property
    def end(self) -> int:
        """One past the tile's last token."""
        return self.start + self.rows * self.cols


def frame_box(region: Box, valid: tuple[float, float], frame: tuple[float, float]) -> Box:
    """The box a whole ``frame`` (height, width, in the model's pixels) covers on the photo when its top-left
    ``valid`` part (height, width; the rest is padding) shows the photo's ``region``."""
    left, top, right, bottom = region
    return (
        left,
        top,
        left + (right - left) * frame[1] / valid[1],
        top + (bottom - top) * frame[0] / valid[0],
    )


def place(values: torch.Tensor, tiles: list[Tile], size: tuple[int, int]) -> torch.Tensor:
    """Token ``values`` (L,) on a photo of ``size`` (height, width): an (H, W) float map, summed over ``tiles``."""
    height, width = size
    canvas = torch.zeros(height, width, dtype=torch.float32, device=values.device)
    for tile in tiles:
        left, top, right, bottom = tile.box
        x0, y0 = max(0, math.floor(left)), max(0, math.floor(top))
        x1, y1 = min(width, math.ceil(right)), min(height, math.ceil(bottom))
        if x1 <= x0 or y1 <= y0:
            continue
        grid = values[tile.start : tile.end].float().view(1, 1, tile.rows, tile.cols)
        xs = (torch.arange(x0, x1, device=values.device, dtype=torch.float32) + 0.5 - left) / (right - left)
        ys = (torch.arange(y0, y1, device=values.device, dtype=torch.float32) + 0.5 - top) / (bottom - top)
        inside = ((xs >= 0) & (xs <= 1)).view(1, -1) & ((ys >= 0) & (ys <= 1)).view(-1, 1)
        gy, gx = torch.meshgrid(ys * 2 - 1, xs * 2 - 1, indexing="ij")
        sampled = F.grid_sample(
            grid, torch.stack((gx, gy), dim=-1)[None], mode="bilinear", padding_mode="border", align_corners=False
        )[0, 0]
        canvas[y0:y1, x0:x1] += sampled * inside
    return canvas
