"""How alike two maps of one image are, in torch: Spearman and Pearson correlation, the overlap of their top 10 %,
and how far the peak moved. The maps are (h, w) tensors in [0, 1]: two fingerprint grids, or two full maps.

Conventions for maps without structure: two constant maps (all zeros: no evidence anywhere) correlate 1, a
constant map and one with structure 0; a constant map has no peak, so against a map that has one the peak counts
as moved the whole diagonal (1).
"""

from __future__ import annotations

import math

import torch

TOP_SHARE = 0.10
"""The share of cells (or pixels) whose overlap :func:`top_iou` measures."""
PEAK_LEVEL = 0.9
"""The peak is the centre of the values above this fraction of the way from the map's minimum to its maximum, each
weighted by how far above."""


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two equally sized maps (float64; exactly 1 for equal maps)."""
    if torch.equal(a, b):
        return 1.0
    x = a.flatten().double()
    y = b.flatten().double()
    x = x - x.mean()
    y = y - y.mean()
    nx, ny = x.norm(), y.norm()
    flat_x = bool(nx <= 1e-12 * max(1.0, float(a.abs().max())))
    flat_y = bool(ny <= 1e-12 * max(1.0, float(b.abs().max())))
    if flat_x or flat_y:
        return 1.0 if flat_x and flat_y else 0.0
    return float((x @ y / (nx * ny)).clamp(-1.0, 1.0))


def ranks(values: torch.Tensor) -> torch.Tensor:
    """The rank of each value (0-based, float64), ties sharing the mean of their ranks."""
    flat = values.flatten()
    _, inverse, counts = torch.unique(flat, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_ranks: torch.Tensor = ends - (counts.double() + 1.0) / 2.0
    return mean_ranks[inverse]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two equally sized maps: Pearson's of their ranks."""
    return pearson(ranks(a), ranks(b))


def top_mask(values: torch.Tensor, share: float = TOP_SHARE) -> torch.Tensor:
    """The cells at or above the value that the top ``share`` of cells reach, leaving out zeros (no evidence)."""
    flat = values.flatten()
    count = max(1, math.ceil(share * flat.numel()))
    threshold = flat.topk(count).values[-1]
    return (flat >= threshold) & (flat > 0)


def top_iou(a: torch.Tensor, b: torch.Tensor, share: float = TOP_SHARE) -> float:
    """Intersection over union of the two maps' top ``share`` (1 when both are empty: all zeros)."""
    x, y = top_mask(a, share), top_mask(b, share)
    union = int((x | y).sum())
    return 1.0 if union == 0 else int((x & y).sum()) / union


def peak(values: torch.Tensor) -> tuple[float, float] | None:
    """Where the map peaks, as (y, x) fractions of its height and width (cell or pixel centres), or ``None`` for a
    constant map: the centre of the values above ``PEAK_LEVEL`` of the way from the minimum to the maximum,
    weighted by how far above, so that a tiny change never makes it jump between two near-equal peaks."""
    grid = values.double()
    high, low = float(grid.max()), float(grid.min())
    if high - low <= 1e-12:
        return None
    weights = (grid - (low + PEAK_LEVEL * (high - low))).clamp(min=0.0)
    height, width = grid.shape
    ys = (torch.arange(height, dtype=torch.float64) + 0.5) / height
    xs = (torch.arange(width, dtype=torch.float64) + 0.5) / width
    total = weights.sum()
    return float((weights.sum(1) * ys).sum() / total), float((weights.sum(0) * xs).sum() / total)


def peak_shift(a: torch.Tensor, b: torch.Tensor, size: tuple[int, int]) -> float:
    """How far the peak moved from ``a`` to ``b``, as a fraction of the diagonal of an image of ``size`` (H, W)."""
    first, second = peak(a), peak(b)
    if first is None or second is None:
        return 0.0 if first is None and second is None else 1.0
    height, width = size
    dy, dx = (second[0] - first[0]) * height, (second[1] - first[1]) * width
    return math.hypot(dy, dx) / math.hypot(height, width)
