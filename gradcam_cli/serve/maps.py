"""The maps the explorer has computed, kept by id, and each map's forms for the page and for downloads.

The page gets a map once, at full precision: a PNG whose red and green channels hold the high and low byte of the
map's value scaled to 16 bits (:func:`packed_png`; an 8-bit RGB PNG decodes in every browser exactly, where a
16-bit one is reduced to 8 bits on a canvas), and colours and blends it itself, so that the colormap and opacity
change without a request. Downloads are the library's own: the overlay as
:func:`~gradcam_cli.render.overlay.overlay` draws it (boxes and outlines included), the colour-mapped heatmap, and
the float32 ``.npy``.

:class:`MapStore` keeps the maps (float32 at the image's size, with what they explain) up to a byte budget, least
recently used dropped first.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..cam.results import Explanation, ImageExplanation, Prediction
from ..io.naming import slug
from ..render.colour import colormap_table, heatmap_image
from ..render.encode import encode_image
from ..render.overlay import overlay

MAP_BYTES = 256 * 2**20
"""Bytes of maps kept by default (a 640 x 480 map takes 1.2 MB)."""
SIXTEEN_BITS = 65535


@dataclass
class StoredMap:
    """One map: its explanation (method, target, (H, W) saliency in [0, 1], a detection's rank, a segment's
    region), the image's predictions and pixels (for the overlay), and the names it is downloaded under."""

    id: str
    image: str
    stem: str
    layer: str
    explanation: Explanation
    predictions: list[Prediction]
    pixels: torch.Tensor = field(repr=False)
    _packed: bytes | None = field(default=None, repr=False)
    file_name: str | None = None
    """The name it is downloaded under where the target's class does not name it (an answer's map)."""

    @property
    def nbytes(self) -> int:
        return int(self.explanation.saliency.numel() * 4)

    @property
    def name(self) -> str:
        """``<stem>_<method>_<class index>-<class>``, as the command names its outputs (a detection adds ``_boxK``,
        the combined map of a detector is ``_boxes``)."""
        if self.file_name is not None:
            return self.file_name
        explanation = self.explanation
        method = slug(explanation.method)
        if explanation.rank == 0:
            return f"{self.stem}_{method}_boxes"
        target = f"{explanation.target.index}-{slug(explanation.target.name)}"
        rank = f"box{explanation.rank}_" if explanation.rank else ""
        return f"{self.stem}_{method}_{rank}{target}"

    def packed_png(self) -> bytes:
        """The map as a PNG of 16-bit values in the red (high byte) and green (low byte) channels."""
        if self._packed is None:
            self._packed = packed_png(self.explanation.saliency)
        return self._packed

    def npy(self) -> bytes:
        """The map as float32 ``.npy`` bytes, (H, W), values in [0, 1] (as ``--save-raw`` writes it)."""
        buffer = io.BytesIO()
        np.save(buffer, self.explanation.saliency.numpy().astype(np.float32))
        return buffer.getvalue()

    def overlay_png(self, colormap: str, alpha: float) -> bytes:
        """The overlay as the command writes it (:func:`~gradcam_cli.render.overlay.overlay`), as PNG bytes."""
        result = ImageExplanation(self.predictions, [self.explanation], self.pixels)
        drawn = torch.from_numpy(np.asarray(overlay(result, 0, alpha, colormap)).copy())
        return encode_image(drawn, ".png")

    def heatmap_png(self, colormap: str) -> bytes:
        """The colour-mapped map alone, as ``--save-heatmap`` writes it, as PNG bytes."""
        return encode_image(heatmap_image(self.explanation.saliency, colormap_table(colormap)), ".png")


@dataclass
class MapAnswer:
    """A computed map with what the page shows beside it; ``forward``: whether this request ran the model."""

    stored: StoredMap
    forward: bool
    spec: str | None = None
    """The ``--target`` spec the map explains (as the page typed it, or the default's); ``None``: a class."""

    def to_dict(self) -> dict[str, Any]:
        e = self.stored.explanation
        height, width = e.saliency.shape[-2:]
        return {
            "id": self.stored.id,
            "image": self.stored.image,
            "layer": self.stored.layer,
            "method": e.method,
            "target": prediction_dict(e.target),
            "spec": self.spec,
            "rank": e.rank,
            "width": int(width),
            "height": int(height),
            "name": self.stored.name,
            "predictions": [prediction_dict(p) for p in self.stored.predictions],
            "forward": self.forward,
        }


def prediction_dict(p: Any) -> dict[str, Any]:
    """A :class:`~gradcam_cli.cam.results.Prediction` as the manifest writes it."""
    out: dict[str, Any] = {"index": p.index, "name": p.name, "probability": p.probability}
    if p.box is not None:
        out["box"] = [float(v) for v in p.box]
    if p.share is not None:
        out["share"] = p.share
    return {**out, **(p.details or {})}


def packed_png(saliency: torch.Tensor) -> bytes:
    """An (H, W) map in [0, 1] as an RGB PNG: value = (red * 256 + green) / 65535, blue 0."""
    levels = (saliency.detach().float().clamp(0, 1) * SIXTEEN_BITS).round().to(torch.int32).cpu()
    rgb = torch.zeros((*levels.shape, 3), dtype=torch.uint8)
    rgb[..., 0] = (levels >> 8).to(torch.uint8)
    rgb[..., 1] = (levels & 255).to(torch.uint8)
    return encode_image(rgb, ".png")


def map_id(*parts: Hashable) -> str:
    """A stable id for a map from what identifies it (image, layers, method, target)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


class MapStore:
    """Maps by id, at most ``budget`` bytes of them (the least recently used dropped first)."""

    def __init__(self, budget: int = MAP_BYTES) -> None:
        self.budget = budget
        self._maps: OrderedDict[str, StoredMap] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, map_id: str) -> StoredMap | None:
        with self._lock:
            stored = self._maps.get(map_id)
            if stored is not None:
                self._maps.move_to_end(map_id)
            return stored

    def put(self, stored: StoredMap) -> None:
        with self._lock:
            previous = self._maps.pop(stored.id, None)
            if previous is not None:
                self._bytes -= previous.nbytes
            self._maps[stored.id] = stored
            self._bytes += stored.nbytes
            while self._bytes > self.budget and len(self._maps) > 1:
                _, dropped = self._maps.popitem(last=False)
                self._bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._maps)
