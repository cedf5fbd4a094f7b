"""``gradcam eval`` for detectors, segmenters and every task without a class probability: where their maps point,
against ground-truth boxes.

The perturbation curves and the sanity check measure a classifier's probability for one class; a detector's
"probability" is a detection, which may vanish or move as pixels are removed, so for detectors and segmenters
``gradcam eval`` measures the boxes only (``--boxes`` is required; ``--sanity`` and ``--plot`` are refused):

How a task pairs boxes with its explanations is its adapter's (:meth:`~gradcam_cli.cam.tasks.TaskAdapter.box_pairs`):

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

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..errors import UsageError
from ..io.discovery import InputImage
from ..options import EvalOptions
from . import metrics
from .boxes import GroundTruthBox
from .images import evaluate_images, report_of, scored_safely
from .report import BoxScore, EvalReport, ImageScores, MethodScores


class TaskEvaluator:
    """Run ``gradcam eval``'s box measures for a detector or a segmenter (see the module docstring)."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        explainer.adapter.eval_checks(self.options.sanity, self.options.plot is not None, self.options.road)
        self.undetected = 0

    def run(
        self,
        images: Sequence[InputImage | str | Path],
        boxes: Sequence[GroundTruthBox] | None = None,
        on_image: Callable[[], Any] | None = None,
        on_result: Callable[[ImageScores], Any] | None = None,
        on_method: Callable[[str], Any] | None = None,
    ) -> EvalReport:
        """Score every image that has boxes; ``on_image`` is called once per image, ``on_result`` with each scored
        image's scores (``on_method`` is not called: the methods share each image's work)."""
        kind = self.explainer.adapter.noun
        if not boxes:
            raise UsageError(f"gradcam eval of a {kind} needs --boxes: it measures where its maps point")
        results, unmatched = evaluate_images(
            self.explainer, images, boxes, self.evaluate_image, on_image, True, on_result
        )
        return report_of(self.explainer, self.options, results, unmatched, undetected=self.undetected)

    def evaluate_image(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        """The box scores of one image; a failure to read or run it is returned as ``error``, not raised."""
        return scored_safely(path, lambda: self._scores(path, boxes))

    def _scores(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        result = self.explainer.explain(path)
        pairs, undetected = self.explainer.adapter.box_pairs(self.explainer, path, result, boxes)
        self.undetected += undetected
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
