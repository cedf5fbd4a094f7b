"""What explaining gives back: predictions, one map per target and method, and the overlay of a result."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from PIL import Image

TOP_PREDICTIONS = 5


@dataclass
class Prediction:
    """A class the model scored: index, name and softmax probability."""

    index: int
    name: str
    probability: float


@dataclass
class Explanation:
    """One saliency map: which method, which target class, the (H, W) map in [0, 1]."""

    method: str
    target: Prediction
    saliency: torch.Tensor


@dataclass
class ImageExplanation:
    """Everything explained about one image."""

    predictions: list[Prediction]
    explanations: list[Explanation]
    pixels: torch.Tensor | None = field(default=None, repr=False)

    def overlay(self, index: int = 0, alpha: float = 0.5, colormap: str = "jet") -> Image.Image:
        """The ``index``-th explanation blended over the image, as a PIL image."""
        if self.pixels is None:
            raise ValueError("this result was computed from a tensor; no pixels to draw on")
        saliency = self.explanations[index].saliency
        from ..render.colour import blend, colormap_table

        table = colormap_table(colormap, saliency.device)
        return Image.fromarray(blend(self.pixels, saliency, table, alpha).cpu().numpy())
