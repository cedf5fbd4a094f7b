"""Colour-mapping saliency maps and blending them over the photo: by formula, and by table look-up."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..errors import UsageError, suggest

BLEND_CHUNK_PIXELS = 1 << 20
"""Overlays of large images are blended this many pixels at a time, so blending needs little memory."""


_JET = {
    "red": ((0.0, 0, 0), (0.35, 0, 0), (0.66, 1, 1), (0.89, 1, 1), (1.0, 0.5, 0.5)),
    "green": ((0.0, 0, 0), (0.125, 0, 0), (0.375, 1, 1), (0.64, 1, 1), (0.91, 0, 0), (1.0, 0, 0)),
    "blue": ((0.0, 0.5, 0.5), (0.11, 1, 1), (0.34, 1, 1), (0.65, 0, 0), (1.0, 0, 0)),
}
"""matplotlib's ``jet`` (its segment data), the default ``--colormap``."""


def _jet_table() -> np.ndarray:
    """matplotlib's ``jet`` at 256 evenly spaced values, bit for bit, without importing matplotlib (a tenth of a
    second before a video's first clip): each channel's 256-entry table interpolated from its segments, as
    ``LinearSegmentedColormap`` makes it, and indexed as a colormap called on floats indexes it."""
    size = 256
    channels = []
    for name in ("red", "green", "blue"):
        data = np.array(_JET[name], dtype=float)
        x, y0, y1 = data[:, 0] * (size - 1), data[:, 1], data[:, 2]
        points = (size - 1) * np.linspace(0, 1, size)
        ind = np.searchsorted(x, points)[1:-1]
        distance = (points[1:-1] - x[ind - 1]) / (x[ind] - x[ind - 1])
        channel = np.concatenate([[y1[0]], distance * (y0[ind] - y1[ind - 1]) + y1[ind - 1], [y0[-1]]])
        channels.append(np.clip(channel, 0.0, 1.0))
    index = np.linspace(0.0, 1.0, 256) * size
    index[index == size] = size - 1
    table: np.ndarray = np.stack(channels, axis=1)[index.astype(int)].astype(np.float32)
    return table


@functools.lru_cache(maxsize=16)
def _colormap_table(name: str) -> np.ndarray:
    if name == "jet":
        return _jet_table()
    import matplotlib

    try:
        cmap = matplotlib.colormaps[name]
    except KeyError:
        raise UsageError(f"unknown colormap {name!r}.{suggest(name, list(matplotlib.colormaps))}") from None
    return cmap(np.linspace(0.0, 1.0, 256))[:, :3].astype(np.float32)


def colormap_table(name: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """A (256, 3) float lookup table in [0, 1] for a matplotlib colormap."""
    return torch.from_numpy(_colormap_table(name)).to(device)


def colorize(saliency: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Map an (H, W) float map in [0, 1] through a colour table: (H, W, 3) float in [0, 1].

    Indices come from the float map (clamped, then rounded), so 1.0 is the table's top colour: no uint8 wrap.
    """
    index = (saliency.clamp(0.0, 1.0) * (table.shape[0] - 1)).round().long()
    return table[index]


def heatmap_image(saliency: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The colour-mapped map alone (no photo under it), as an (H, W, 3) uint8 tensor."""
    return (colorize(saliency, table) * 255.0).round().clamp(0, 255).to(torch.uint8)


def blend(pixels: torch.Tensor, saliency: torch.Tensor, table: torch.Tensor, alpha: float) -> torch.Tensor:
    """Overlay: (1 - alpha) * image + alpha * colour(map), as an (H, W, 3) uint8 tensor."""
    heat = colorize(saliency, table)
    image = pixels.to(heat.device, torch.float32) / 255.0
    mixed = (1.0 - alpha) * image + alpha * heat
    return (mixed * 255.0).round().clamp(0, 255).to(torch.uint8)


class Blender:
    """:func:`blend`, bit for bit, by table look-up: a few times faster, and in small memory.

    ``blend`` is a function of each pixel's value (0-255, per channel) and its colour index (the map value scaled
    to the table), so ``blend`` itself, run once over every (index, value) pair, gives a table from which an
    overlay is two integer operations and a gather per channel. Large images go a band of rows at a time.
    """

    def __init__(self, table: torch.Tensor, alpha: float) -> None:
        self.table, self.alpha = table, alpha
        size = table.shape[0]
        levels = torch.arange(size, dtype=torch.float32).view(size, 1).expand(size, 256) / (size - 1)
        values = torch.arange(256, dtype=torch.uint8).view(1, 256, 1).expand(size, 256, 3).contiguous()
        exact = bool((self._index(levels) == torch.arange(size, dtype=torch.int32).view(size, 1)).all())
        lut = blend(values, levels, table.cpu(), alpha).numpy()  # (colour index, pixel value, channel)
        self.lut = np.ascontiguousarray(lut.transpose(0, 2, 1)).reshape(-1) if exact else None
        self.offsets = torch.arange(3, dtype=torch.int32) * 256

    def _index(self, saliency: torch.Tensor) -> torch.Tensor:
        """The colour index exactly as :func:`colorize` computes it."""
        return (saliency.clamp(0.0, 1.0) * (self.table.shape[0] - 1)).round().to(torch.int32)

    def __call__(self, pixels: torch.Tensor, saliency: torch.Tensor) -> torch.Tensor:
        """The (H, W, 3) uint8 overlay of (H, W, 3) uint8 ``pixels`` and an (H, W) map in [0, 1], on the CPU."""
        height, width = pixels.shape[:2]
        rows = max(1, BLEND_CHUNK_PIXELS // max(1, width))
        out = torch.empty((height, width, 3), dtype=torch.uint8)
        for top in range(0, height, rows):
            out[top : top + rows] = self._blend(pixels[top : top + rows], saliency[top : top + rows])
        return out

    def _blend(self, pixels: torch.Tensor, saliency: torch.Tensor) -> torch.Tensor:
        if self.lut is None or saliency.device.type != "cpu" or pixels.dtype != torch.uint8:
            return blend(pixels, saliency, self.table, self.alpha).cpu()
        index = self._index(saliency.detach()).mul_(3 * 256).unsqueeze(-1)
        flat = pixels.to(torch.int32).add_(self.offsets).add_(index)  # in place, in int32: the fastest measured
        return torch.from_numpy(np.take(self.lut, flat.numpy()))
