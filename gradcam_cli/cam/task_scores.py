"""What a model's task differentiates when no ``--target`` says otherwise: a classifier's class score, a detector's
detections (torchvision's or a YOLO model's traced anchors) or a segmenter's classes (see :mod:`.scores`;
explicit targets are :mod:`.targets`')."""

from __future__ import annotations

from ..errors import UsageError
from ..models.loading import LoadedModel
from ..models.tasks import Task, check_task_options, detection_transform
from ..options import MAX_DETECTIONS, SCORE_NAMES, SCORE_THRESHOLD, ExplainOptions
from .detection import DetectionScore
from .scores import ClassScore, Score
from .segmentation import SegmentationScore
from .yolo import is_yolo_module, yolo_score


def task_score(
    model: LoadedModel, name: str | None, threshold: float | None, max_detections: int | None, top_k: int | None
) -> Score:
    """The :class:`Score` of ``model``'s task with ``--score name`` (``None``: the task's own), ``--score-threshold``,
    ``--max-detections`` and ``--top-k`` (each ``None`` where not given); options of another task are refused
    (:func:`~gradcam_cli.models.tasks.check_task_options`)."""
    if is_yolo_module(model.module):
        return yolo_score(model.module, name or "logit", threshold, max_detections, top_k)
    if name == "box":
        raise UsageError("--score box is for YOLO detectors (--model yolo:...)")
    if name is not None and name not in SCORE_NAMES[:3]:
        raise UsageError(f"unknown score {name!r} for a class; use {', '.join(SCORE_NAMES[:3])}")
    check_task_options(
        model.task, ExplainOptions(top_k=top_k, score=name, score_threshold=threshold, max_detections=max_detections)
    )
    if model.task is Task.DETECT:
        if max_detections is not None and max_detections < 1:
            raise UsageError("--max-detections must be at least 1")
        return DetectionScore(
            detection_transform(model.module),
            SCORE_THRESHOLD if threshold is None else threshold,
            MAX_DETECTIONS if max_detections is None else max_detections,
        )
    if model.task is Task.SEGMENT:
        return SegmentationScore()
    return ClassScore(name or "logit")
