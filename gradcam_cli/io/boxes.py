"""A ground-truth object box as ``gradcam eval --boxes`` reads it (:mod:`gradcam_cli.evaluation.boxes` reads the
files): a value the task adapters take, so it lies below :mod:`gradcam_cli.cam`."""

from __future__ import annotations

from dataclasses import dataclass

Box = tuple[float, float, float, float]
"""``(x1, y1, x2, y2)`` in pixels, exclusive ends."""


@dataclass(frozen=True)
class GroundTruthBox:
    """One object box: the image it belongs to (as written in the file), its corners, its class, where it came from."""

    image: str
    box: Box
    label: str | None
    source: str
    normalised: bool = False
    """A YOLO label's box: fractions of its image's width and height, its label the class index
    (:mod:`gradcam_cli.evaluation.yolo_labels`), its ``image`` the image's name without suffix."""
