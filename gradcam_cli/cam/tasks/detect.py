"""torchvision's detectors: each detection's class score by the matching rule of :mod:`gradcam_cli.cam.detection`,
explained one by one (``rank`` 1, 2, ...) and combined (``rank`` 0)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ...errors import UsageError
from ...models.tasks import detection_transform
from ...options import MAX_DETECTIONS, SCORE_THRESHOLD, ExplainOptions
from ..detection import MATCH_IOU, DetectionScore, box_iou, no_detection
from ..scores import Score
from .base import Explained, Pair, ScoreRequest, TaskAdapter, check_class_score, register_task

if TYPE_CHECKING:
    from ...io.boxes import GroundTruthBox
    from ...models.loading import LoadedModel
    from ..results import ImageExplanation, Prediction


class DetectTask(TaskAdapter):
    """A detector's detections scoring at least ``--score-threshold``, at most ``--max-detections`` of them."""

    name = "detect"
    noun = "detector"
    ranked = True
    listed = "Detections"
    methods_of = "detect"

    def check_options(self, options: ExplainOptions) -> None:
        check_class_score(options)
        self.check_own_score(options)
        if options.top_k is not None:
            raise UsageError(
                f"--top-k {options.top_k} is for classifiers and segmenters; a detector explains each detection "
                "scoring at least --score-threshold, at most --max-detections of them"
            )
        if options.max_detections is not None and options.max_detections < 1:
            raise UsageError("--max-detections must be at least 1")

    def score(self, model: LoadedModel, request: ScoreRequest) -> Score:
        self.check_options(request.options)
        options = request.options
        threshold = SCORE_THRESHOLD if options.score_threshold is None else options.score_threshold
        most = MAX_DETECTIONS if options.max_detections is None else options.max_detections
        return DetectionScore(detection_transform(model.module), threshold, most)

    def settings(
        self, model: LoadedModel, score: Score, request: ScoreRequest, perturbation: dict[str, object]
    ) -> dict[str, object]:
        chosen: Any = score
        detections = {"score_threshold": chosen.threshold, "max_detections": chosen.max_detections}
        return {"task": self.label, **detections, **perturbation}

    def nothing_found(self, model: LoadedModel, score: Score, target: int | None) -> str | None:
        chosen: Any = score  # a DetectionScore, or a YOLO model's score (both have a threshold)
        return no_detection(model, chosen, target)

    def located(self, prediction: Prediction) -> str | None:
        """``at [x1, y1, x2, y2]``; the combined map's target has no box."""
        return f"at {_box(prediction.box)}" if prediction.box is not None else None

    def box_pairs(
        self, explainer: Explained, image: Any, result: ImageExplanation, boxes: Sequence[GroundTruthBox]
    ) -> tuple[list[Pair], int]:
        """Each box with the explained detection of its class that overlaps it most (``gradcam eval``'s rule:
        :mod:`gradcam_cli.evaluation.tasks`); boxes no detection matches are undetected."""
        pairs: list[Pair] = []
        undetected = 0
        for truth in boxes:
            rank = _matching_rank(truth, result.predictions)
            if rank is None:
                undetected += 1
                continue
            pairs.append((truth.label, [truth.box], [e for e in result.explanations if e.rank == rank]))
        return pairs, undetected


def _box(box: tuple[float, float, float, float]) -> str:
    return "[" + ", ".join(f"{value:g}" for value in box) + "]"


def _matching_rank(truth: GroundTruthBox, detections: Sequence[Prediction]) -> int | None:
    """The rank (1-based) of the detection the ground-truth box pairs with, by the matching rule; ``None``: none."""
    best: tuple[float, int] | None = None
    reference = torch.tensor(truth.box)
    for rank, detection in enumerate(detections, 1):
        if detection.box is None or (truth.label is not None and detection.name.lower() != truth.label.lower()):
            continue
        iou = float(box_iou(reference, torch.tensor([detection.box]))[0])
        if iou >= MATCH_IOU and (best is None or iou > best[0]):
            best = (iou, rank)
    return best[1] if best else None


register_task(DetectTask())
