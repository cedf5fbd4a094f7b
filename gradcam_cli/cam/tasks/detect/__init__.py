"""torchvision's detectors: each detection's class score by the matching rule of :mod:`gradcam_cli.cam.detection`,
explained one by one (``rank`` 1, 2, ...) and combined (``rank`` 0), and what that layout makes: the ``_box<rank>``
and ``_boxes`` files (their resumed rows: :mod:`gradcam_cli.pipeline.detection_resume`), a video's combined map
with every box drawn, serve's maps of every detection, ``gradcam eval``'s pairing of boxes with detections."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ....errors import UsageError
from ....io.naming import COMBINED_TAIL
from ....models.tasks import LAYER_SCOPES, detection_transform
from ....options import MAX_DETECTIONS, SCORE_THRESHOLD, ExplainOptions, OutputOptions
from ...detection import MATCH_IOU, DetectionScore, box_iou, no_detection
from ...layers import LayerInfo, chosen_layers
from ...scores import Score
from ..base import Explained, Pair, ScoreRequest, TaskAdapter, check_class_score, register_task

if TYPE_CHECKING:
    from ....io.boxes import GroundTruthBox
    from ....models.loading import LoadedModel
    from ...results import Explanation, ImageExplanation, Prediction


class DetectTask(TaskAdapter):
    """A detector's detections scoring at least ``--score-threshold``, at most ``--max-detections`` of them."""

    name = "detect"
    noun = "detector"
    ranked = True
    box_faithfulness = True
    listed = "Detections"
    methods_of = "detect"
    default_layer = "last stage of the backbone"
    layer_scopes = LAYER_SCOPES
    tokens = False
    nothing = "no detection"
    combined_tail = COMBINED_TAIL

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
        return DetectionScore(detection_transform(model.module), threshold, most, len(model.categories or ()))

    def settings(
        self, model: LoadedModel, score: Score, request: ScoreRequest, perturbation: dict[str, object]
    ) -> dict[str, object]:
        chosen: Any = score
        detections = {"score_threshold": chosen.threshold, "max_detections": chosen.max_detections}
        return {"task": self.label, **detections, **perturbation}

    def nothing_found(self, model: LoadedModel, score: Score, target: int | None) -> str | None:
        chosen: Any = score  # a DetectionScore, or a YOLO model's score (both have a threshold)
        return no_detection(model, chosen, target)

    def chosen_layers(self, model: LoadedModel, infos: list[LayerInfo], names: list[str], tokens: bool) -> list[str]:
        """As any task's, and a refused layer gets the default layer suggested (the spatial layers just before a
        detector's head are its own)."""
        return chosen_layers(model, infos, names, tokens, self.layer_scopes, suggest=True)

    def check_outputs(self, output: OutputOptions) -> None:
        if output.panel:
            raise UsageError(
                "--panel is for classifiers and segmenters; a detector's <stem>_<method>_boxes overlay "
                "shows all its detections at once"
            )

    def video_labels(self, target: int | None, top_k: int, class_name: Callable[[int], str]) -> list[str]:
        """One video per method: the combined map, every box drawn."""
        return [COMBINED_TAIL]

    def frame_maps(self, result: ImageExplanation) -> list[tuple[Explanation, bool]]:
        """The combined map, every detection's box, label and score drawn on it."""
        return [(explanation, True) for explanation in result.explanations if explanation.rank == 0]

    def kept_maps(self, result: ImageExplanation, shown: Explanation) -> list[Explanation]:
        """Every other detection's map (and the combined map): one pass made them all."""
        return [other for other in result.explanations if other is not shown and other.rank is not None]

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
