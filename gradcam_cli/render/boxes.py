"""Marks drawn over an overlay: a detector's boxes with their label and score, a segmenter's region outline.

Drawn on the finished (H, W, 3) uint8 overlay: lines and labels with Pillow's ``ImageDraw``, the outline in torch.
Line widths and the label's size grow with the image (about 1/250 and 1/30 of its shorter side).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

PALETTE = (
    (255, 255, 255),
    (255, 215, 0),
    (0, 255, 255),
    (255, 0, 255),
    (124, 252, 0),
    (255, 140, 0),
    (135, 206, 250),
    (255, 105, 180),
)
"""Box colours, by detection rank (1: the first, white), repeating."""
OUTLINE = (255, 255, 255)
"""A segmenter's region outline."""

VISIBLE = 0.5
"""Least visibility of a keypoint drawn (ultralytics' own plotting threshold)."""
Mark = tuple[tuple[float, float, float, float], str, int]
"""A box ``(x1, y1, x2, y2)`` in pixels, its caption, and its detection rank (1-based: its colour)."""
Rect = tuple[float, float, float, float]
"""A label's rectangle as drawn: ``(x1, y1, x2, y2)``, both corners inside it."""


def line_width(height: int, width: int) -> int:
    """The width of boxes and outlines for an image of this size, in pixels."""
    return max(2, round(min(height, width) / 250))


def colour(rank: int) -> tuple[int, int, int]:
    """The colour of detection ``rank`` (1-based)."""
    return PALETTE[(rank - 1) % len(PALETTE)]


def draw_boxes(overlay: torch.Tensor, marks: Sequence[Mark]) -> torch.Tensor:
    """``overlay`` (H, W, 3) uint8 with each box drawn in its rank's colour and its caption on a filled label
    above it (:func:`label_place`): every box first, then the labels, so that no box's line crosses a label and no
    label covers another."""
    image = Image.fromarray(overlay.cpu().numpy())
    draw = ImageDraw.Draw(image)
    height, width = overlay.shape[:2]
    thickness = line_width(height, width)
    font = _font(max(10, min(height, width) // 30))
    for (x1, y1, x2, y2), _, rank in marks:
        draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=colour(rank), width=thickness)
    placed: list[Rect] = []
    for box, caption, rank in marks:
        left, top, right, bottom = draw.textbbox((0, 0), caption, font=font)
        size = (right - left + 2 * thickness, bottom - top + 2 * thickness)
        x, y = label_place(box, size, placed, (height, width))
        placed.append((x, y, x + size[0], y + size[1]))
        draw.rectangle(placed[-1], fill=colour(rank))
        draw.text((x + thickness - left, y + thickness - top), caption, fill=(0, 0, 0), font=font)
    return torch.from_numpy(np.asarray(image).copy())


def label_place(
    box: tuple[float, float, float, float], size: tuple[float, float], placed: Sequence[Rect], shape: tuple[int, int]
) -> tuple[float, float]:
    """The top-left corner of a box's label of ``size`` (width, height) in an image of ``shape`` (height, width):
    above the box, inside it where the box touches the top, moved left where it would pass the right edge (a label
    wider than the image starts at its left edge). Where that place covers a label in ``placed`` (inclusive
    corners, as drawn), the nearest free place in the same columns, just below or above one of them, inside the
    image (below first); where none is free, the first place."""
    x1, y1 = box[0], box[1]
    (label_w, label_h), (height, width) = size, shape
    lowest = max(0, height - 1 - label_h)
    x = max(0, min(x1, width - 1 - label_w))
    first = y1 - label_h if y1 - label_h >= 0 else max(0, min(y1, lowest))
    column = [rect for rect in placed if rect[0] <= x + label_w and x <= rect[2]]
    candidates = [first, *(rect[3] + 1 for rect in column), *(rect[1] - label_h - 1 for rect in column)]
    for y in sorted((y for y in candidates if 0 <= y <= lowest), key=lambda y: (abs(y - first), y < first)):
        if not any(rect[1] <= y + label_h and y <= rect[3] for rect in column):
            return x, y
    return x, first


def draw_outline(overlay: torch.Tensor, region: torch.Tensor) -> torch.Tensor:
    """``overlay`` (H, W, 3) uint8 with the border of the (H, W) bool ``region`` drawn: the region's pixels within
    a line width of a pixel outside it."""
    height, width = overlay.shape[:2]
    thickness = line_width(height, width)
    inside = region.to(torch.float32)[None, None]
    outside_near = F.max_pool2d(1.0 - inside, 2 * thickness + 1, stride=1, padding=thickness)
    border = (inside * outside_near)[0, 0].bool().to(overlay.device)
    marked = overlay.clone()
    marked[border] = torch.tensor(OUTLINE, dtype=torch.uint8, device=overlay.device)
    return marked


def draw_points(
    overlay: torch.Tensor, poses: Sequence[tuple[Sequence[tuple[float, float, float]], int]]
) -> torch.Tensor:
    """``overlay`` (H, W, 3) uint8 with each pose's keypoints (x, y, visibility) drawn as dots in its rank's colour,
    those the model sees (visibility at least :data:`VISIBLE`) only."""
    image = Image.fromarray(overlay.cpu().numpy())
    draw = ImageDraw.Draw(image)
    radius = line_width(*overlay.shape[:2]) + 1
    for points, rank in poses:
        for x, y, visible in points:
            if visible >= VISIBLE:
                draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour(rank), outline=OUTLINE)
    return torch.from_numpy(np.asarray(image).copy())


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()
