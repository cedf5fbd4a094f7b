"""``gradcam eval`` for detectors and segmenters: where their maps point, against ground-truth boxes.

The perturbation curves and the sanity check measure a classifier's probability for one class; a detector's
"probability" is a detection, which may vanish or move as pixels are removed, so for detectors and segmenters
``gradcam eval`` measures the boxes only (``--boxes`` is required; ``--sanity`` and ``--plot`` are refused):

- Detector: each ground-truth box is paired with the explained detection of the same class (the box's label
  matched to a class name, any case; a box without a label pairs with any class) that overlaps it most, with an
  intersection over union of at least :data:`~gradcam_cli.cam.detection.MATCH_IOU` (the matching rule of
  :mod:`gradcam_cli.cam.detection`). That detection's map is scored against that box: pointing game and energy.
  Boxes no explained detection matches are counted as undetected, not scored.
- Segmenter: as for a classifier, the boxes of one label are scored together with the map of the class of that
  name (a box without a label: the image's first explained class); a label that names no class is undetected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..cam.detection import MATCH_IOU, box_iou
from ..cam.explainer import Explainer
from ..cam.results import Explanation, ImageExplanation, Prediction
from ..errors import GradcamError, UsageError, describe
from ..io.discovery import InputImage, discover
from ..models.tasks import Task
from ..options import EvalOptions
from . import metrics
from .boxes import GroundTruthBox, match_boxes
from .report import BoxScore, EvalReport, ImageScores, MethodScores


class TaskEvaluator:
    """Run ``gradcam eval``'s box measures for a detector or a segmenter (see the module docstring)."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        kind = explainer.task.noun
        if self.options.sanity:
            raise UsageError(f"--sanity is for classifiers; a {kind}'s maps are evaluated against --boxes")
        if self.options.plot is not None:
            raise UsageError(f"--plot draws deletion and insertion curves, which a {kind} is not measured by")
        if self.options.road:
            raise UsageError(f"--road is for classifiers; a {kind}'s maps are evaluated against --boxes")
        self.undetected = 0

    def run(
        self,
        images: Sequence[InputImage | str | Path],
        boxes: Sequence[GroundTruthBox] | None = None,
        on_image: Callable[[], Any] | None = None,
        on_result: Callable[[ImageScores], Any] | None = None,
    ) -> EvalReport:
        """Score every image that has boxes; ``on_image`` is called once per image, ``on_result`` with each scored
        image's scores."""
        kind = self.explainer.task.noun
        if not boxes:
            raise UsageError(f"gradcam eval of a {kind} needs --boxes: it measures where its maps point")
        inputs = [image for image in images if isinstance(image, InputImage)]
        if len(inputs) < len(images):
            inputs = discover([image.path if isinstance(image, InputImage) else image for image in images])
        matched, unmatched = match_boxes(boxes, inputs, self.explainer.model.categories)
        if not matched:
            raise UsageError(f"none of the {len(boxes)} boxes names one of the input images (e.g. {boxes[0].image!r})")
        results = []
        for image in inputs:
            if image.path in matched:
                results.append(self.evaluate_image(image.path, matched[image.path]))
                if on_result:
                    on_result(results[-1])
            if on_image:
                on_image()
        explainer = self.explainer
        return EvalReport(
            model=explainer.model.name,
            layers=list(explainer.layer_names),
            methods=list(explainer.methods),
            options=self.options,
            sanity_modules=[],
            images=results,
            unmatched_boxes=len(unmatched),
            target=explainer.target,
            undetected_boxes=self.undetected,
        )

    def evaluate_image(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        """The box scores of one image; a failure to read or run it is returned as ``error``, not raised."""
        try:
            result = self.explainer.explain(path)
            if self.explainer.task is Task.DETECT:
                pairs = self._detection_pairs(result, boxes)
            else:
                pairs = self._segmentation_pairs(path, result, boxes)
        except UsageError:
            raise
        except GradcamError as error:
            return ImageScores(str(path), error=str(error))
        except Exception as error:
            return ImageScores(str(path), error=f"{path}: cannot evaluate this image ({describe(error, path)})")
        scores = {method: MethodScores([], [], math.nan) for method in self.explainer.methods}
        for label, group, explanations in pairs:
            for explanation in explanations:
                saliency = explanation.saliency
                scores[explanation.method].boxes.append(
                    BoxScore(
                        label,
                        explanation.target,
                        metrics.pointing_hit(saliency, group, self.options.tolerance),
                        metrics.energy_inside(saliency, group),
                    )
                )
        top = result.predictions[0] if result.predictions else Prediction(-1, "nothing found", 0.0)
        return ImageScores(str(path), top, scores)

    def _detection_pairs(
        self, result: ImageExplanation, boxes: Sequence[GroundTruthBox]
    ) -> list[tuple[str | None, list[metrics.Box], list[Explanation]]]:
        """(label, [box], the matched detection's explanations) for each box an explained detection matches."""
        pairs = []
        for truth in boxes:
            rank = _matching_rank(truth, result.predictions)
            if rank is None:
                self.undetected += 1
                continue
            chosen = [e for e in result.explanations if e.rank == rank]
            pairs.append((truth.label, [truth.box], chosen))
        return pairs

    def _segmentation_pairs(
        self, path: Path, result: ImageExplanation, boxes: Sequence[GroundTruthBox]
    ) -> list[tuple[str | None, list[metrics.Box], list[Explanation]]]:
        """(label, the label's boxes, the explanations of the class it names) for each label of the image."""
        pairs = []
        for label in dict.fromkeys(box.label for box in boxes):
            group = [box.box for box in boxes if box.label == label]
            explained = result
            if label is not None:
                index = self._class_of(label)
                if index is None:
                    self.undetected += len(group)
                    continue
                explained = self.explainer.explain(path, target=index)
            if not explained.explanations or not explained.explanations[0].target.share:
                self.undetected += len(group)  # the class is predicted nowhere: its map is empty
                continue
            first = explained.explanations[0].target.index
            pairs.append((label, group, [e for e in explained.explanations if e.target.index == first]))
        return pairs

    def _class_of(self, label: str) -> int | None:
        categories = self.explainer.model.categories or []
        matches = [i for i, name in enumerate(categories) if name.lower() == label.lower()]
        return matches[0] if len(matches) == 1 else None


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
