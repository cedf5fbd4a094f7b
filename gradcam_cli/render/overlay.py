"""A result drawn: an explanation's map blended over its image, with what it explains marked on it (a detection's
box and label, a YOLO pose's keypoints, a segmenter's region outline). The results themselves
(:mod:`gradcam_cli.cam.results`) do not draw."""

from __future__ import annotations

import torch
from PIL import Image

from ..cam.results import Explanation, ImageExplanation
from .boxes import draw_boxes, draw_outline, draw_points
from .colour import blend, colormap_table


def overlay(result: ImageExplanation, index: int = 0, alpha: float = 0.5, colormap: str = "jet") -> Image.Image:
    """``result``'s ``index``-th explanation blended over its image, with its marks (:func:`mark`), as a PIL
    image."""
    if result.pixels is None:
        raise ValueError("this result was computed from a tensor; no pixels to draw on")
    explanation = result.explanations[index]
    table = colormap_table(colormap, explanation.saliency.device)
    blended = blend(result.pixels, explanation.saliency, table, alpha).cpu()
    return Image.fromarray(mark(result, blended, explanation).numpy())


def mark(result: ImageExplanation, overlay: torch.Tensor, explanation: Explanation) -> torch.Tensor:
    """An (H, W, 3) uint8 ``overlay`` of ``explanation`` (one of ``result``'s) with what it explains drawn on it: a
    detection's box with its label and score (every detection's, for the combined map), a segmenter's region
    outline."""
    if explanation.region is not None:
        overlay = draw_outline(overlay, explanation.region)
    if explanation.rank is None:
        return overlay
    ranked = enumerate(result.predictions, 1) if explanation.rank == 0 else [(explanation.rank, explanation.target)]
    ranked = list(ranked)
    marks = [(p.box, f"{p.name} {p.probability:.2f}", rank) for rank, p in ranked if p.box is not None]
    points = [(p.keypoints, rank) for rank, p in ranked if p.keypoints]
    overlay = draw_points(overlay, points) if points else overlay
    return draw_boxes(overlay, marks) if marks else overlay
