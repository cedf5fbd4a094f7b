"""What explaining gives back: predictions and one map per target and method (drawn by
:func:`gradcam_cli.render.overlay.overlay`).

A classifier's target is a class; a detector's is one detection (its class, score and box); a segmenter's a class
with the share of the pixels predicted as it (see docs/tasks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

TOP_PREDICTIONS = 5


Box = tuple[float, float, float, float]
"""``(x1, y1, x2, y2)`` in the original image's pixels (continuous coordinates, exclusive ends)."""


@dataclass
class Prediction:
    """A class the model scored: index, name and probability (a classifier's softmax, or sigmoid with
    ``--score sigmoid``). A detection also has its ``box`` (its probability is the detector's score); a segmenter's
    class its ``share`` of the pixels predicted as it (its probability: their mean softmax probability)."""

    index: int
    name: str
    probability: float
    box: Box | None = None
    share: float | None = None
    score: str | None = None
    """An explicit target's (``--target``): what ``probability`` holds when it is not a probability, ``cosine``,
    ``logit`` or ``output`` (docs/targets.md)."""
    details: dict[str, Any] | None = None
    """What a task adds to its predictions (a plugin's task: :mod:`gradcam_cli.cam.tasks`), JSON-ready: written as
    the prediction's own keys in its rows and read back from them: a YOLO instance's ``area``, a pose's
    ``keypoints``."""

    @property
    def area(self) -> int | None:
        """A YOLO instance's mask area, in pixels of the original image (its ``details``)."""
        area = (self.details or {}).get("area")
        return int(area) if isinstance(area, int | float) else None

    @property
    def keypoints(self) -> list[tuple[float, float, float]] | None:
        """A YOLO pose's keypoints (its ``details``): (x, y) in the original image's pixels and the model's
        visibility in [0, 1]."""
        points = (self.details or {}).get("keypoints")
        return [(float(x), float(y), float(v)) for x, y, v in points] if isinstance(points, list) else None


NO_TARGET_SCORE = "none"
"""The :attr:`Prediction.score` of a map made without a target (:mod:`gradcam_cli.cam.untargeted`)."""
NO_TARGET_NAME = "no target"
"""Its name: rows show ``{"index": 0, "name": "no target", "probability": null, "score": "none"}``, file names
``0-no-target``."""


def no_target() -> Prediction:
    """The target of a map made without one (rollout and attention on an embedding model given no ``--target``)."""
    return Prediction(0, NO_TARGET_NAME, math.nan, score=NO_TARGET_SCORE)


def rescaled(prediction: Prediction, scale_y: float, scale_x: float) -> Prediction:
    """A copy of ``prediction`` with its box, area and keypoints in pixels ``scale_y`` x ``scale_x`` times as large:
    a shrunk image's (``--max-side``) measured in the original's. Nothing else changes (a share is a fraction)."""
    if scale_y == 1 and scale_x == 1:
        return prediction
    box = prediction.box
    details = dict(prediction.details or {})
    if prediction.area is not None:
        details["area"] = round(prediction.area * scale_y * scale_x)
    if prediction.keypoints is not None:
        details["keypoints"] = [[round(x * scale_x, 1), round(y * scale_y, 1), v] for x, y, v in prediction.keypoints]
    return replace(
        prediction,
        box=(
            round(box[0] * scale_x, 1),
            round(box[1] * scale_y, 1),
            round(box[2] * scale_x, 1),
            round(box[3] * scale_y, 1),
        )
        if box is not None
        else None,
        details=details or None,
    )


@dataclass
class Explanation:
    """One saliency map: which method, which target class, the (H, W) map in [0, 1] (a clip's or a volume's
    (T, H, W), a sequence's (L,): :mod:`gradcam_cli.cam.maps`).

    ``rank``: a detection's number (1 = highest score), 0 for a detector's combined map (of the sum of every
    explained detection's score); ``None`` for classifiers and segmenters. ``region``: a segmenter's (H, W) bool
    mask of the pixels predicted as the target class.
    """

    method: str
    target: Prediction
    saliency: torch.Tensor
    rank: int | None = None
    region: torch.Tensor | None = field(default=None, repr=False)


@dataclass
class ImageExplanation:
    """Everything explained about one image. A detector's ``predictions`` are its detections above the threshold
    (an empty list: none), with one combined explanation (``rank`` 0) per method either way."""

    predictions: list[Prediction]
    explanations: list[Explanation]
    pixels: torch.Tensor | None = field(default=None, repr=False)
