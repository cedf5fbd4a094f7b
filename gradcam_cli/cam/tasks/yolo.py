"""Ultralytics YOLO detectors, instance segmenters and pose models (``--model yolo:...``): each detection scored by
the tracing rule of :mod:`gradcam_cli.cam.yolo`, shown as a detector's are (a mask's area, a pose's keypoints)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from torch import nn

from ...models.yolo import YOLO_TASK
from ...options import ExplainOptions
from ..methods import METHODS
from ..methods.needs import ABLATED_SCORES
from ..scores import Score
from ..yolo import yolo_score
from .base import ScoreRequest, register_task
from .detect import DetectTask

if TYPE_CHECKING:
    from ...models.loading import LoadedModel


class YoloTask(DetectTask):
    """A YOLO model's detections (detect, segment and pose alike): a detector's layout and rows; AblationCAM
    applies (its ablated passes read the same anchor)."""

    name = YOLO_TASK
    shown = "detect"
    by_name = False

    def check_options(self, options: ExplainOptions) -> None:
        """Checked by :func:`~gradcam_cli.cam.yolo.yolo_score`."""

    def score(self, model: LoadedModel, request: ScoreRequest) -> Score:
        options = request.options
        return yolo_score(
            model.module, options.score or "logit", options.score_threshold, options.max_detections, options.top_k
        )

    def takes(self, method: str, tasks: Sequence[str], module: nn.Module) -> bool:
        return "detect" in tasks or METHODS[method].needs is ABLATED_SCORES

    def settings(
        self, model: LoadedModel, score: Score, request: ScoreRequest, perturbation: dict[str, object]
    ) -> dict[str, object]:
        chosen: Any = score
        return {**super().settings(model, score, request, perturbation), "score": chosen.kind}

    def pass_settings(self, score: Score) -> AbstractContextManager[None]:
        """The score's confidence threshold for the NMS (:func:`gradcam_cli.models.yolo_net.confidence`: this
        pass's own, not set on the model)."""
        from ...models.yolo_net import confidence

        chosen: Any = score  # a YoloScore
        return confidence(float(chosen.threshold))


register_task(YoloTask())
