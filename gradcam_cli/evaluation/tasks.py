"""``gradcam eval`` for detectors, segmenters and every task without a class probability: each explained
detection's own faithfulness, and where their maps point against ground-truth boxes.

The classifier's protocol (curves of one class's probability, the sanity check, ROAD) does not apply as it is:
``--sanity``, ``--road`` and ``--plot`` are refused. A detector's explained detections are each measured on their
own (:mod:`gradcam_cli.evaluation.detections`: deletion and insertion of the detection's score, re-found by IoU and
class in each perturbed image, pointing game and energy in its own box), with or without ``--boxes``; a segmenter
is measured against ``--boxes`` only (required).

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
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..cam.explainer import Explainer
from ..cam.results import ImageExplanation, Prediction
from ..cam.scores import Refound
from ..cam.tasks.base import Pair
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage
from ..io.images import load_image, to_input_tensor
from ..options import EvalOptions
from . import metrics
from .detections import detection_figures
from .images import evaluate_images, report_of, scored_safely
from .plan import with_methods
from .report import BoxScore, DetectionFigures, EvalReport, ImageScores, MethodScores
from .shared import Once, methods_to_run, pass_groups


class TaskEvaluator:
    """Run ``gradcam eval``'s box measures for a detector or a segmenter (see the module docstring)."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        options = self.options
        more = [flag for flag, on in (("--arcc", options.arcc), ("--random-logit", options.random_logit)) if on]
        more += ["--mprt"] if options.mprt else []
        more += ["--meta"] if options.meta else []
        plot = options.plot is not None
        explainer.adapter.eval_checks(options.sanity, plot, options.road, options.correlation, *more)
        self.undetected = 0
        self.on_method: Callable[[str], Any] | None = None
        self.on_result: Callable[[ImageScores], Any] | None = None
        self.done: Mapping[str, ImageScores] = {}
        self._groups = pass_groups(explainer.chosen.methods)
        self._parts: dict[tuple[str, ...], Explainer] = {}
        self._once = Once()

    def run(
        self,
        images: Sequence[InputImage | str | Path],
        boxes: Sequence[GroundTruthBox] | None = None,
        on_image: Callable[[], Any] | None = None,
        on_result: Callable[[ImageScores], Any] | None = None,
        on_method: Callable[[str], Any] | None = None,
        done: Mapping[str, ImageScores] | None = None,
    ) -> EvalReport:
        """Score every image that has boxes; ``on_image`` is called once per image, ``on_method(name)`` as each
        method's work on an image begins, ``on_result`` with each (image, method)'s scores and each failed image;
        ``done``: the methods already finished per image, kept (as :meth:`Evaluator.run
        <gradcam_cli.evaluation.evaluate.Evaluator.run>`)."""
        boxed_only = self.explainer.adapter.boxed_only(bool(boxes))  # a detector's detections: every image
        self.on_method, self.on_result, self.done = on_method, on_result, done or {}
        results, unmatched = evaluate_images(
            self.explainer, images, boxes, self.evaluate_image, on_image, boxed_only, on_result
        )
        return report_of(self.explainer, self.options, results, unmatched, undetected=self.undetected)

    def evaluate_image(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        """The box scores of one image; a failure to read or run it is returned as ``error``, not raised."""
        return scored_safely(path, lambda: self._scores(path, boxes))

    def _scores(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        """One method after another, each handed to ``on_result`` as it is scored; the methods that share passes
        (:mod:`.shared`) explained once for all of them, as the first of them begins."""
        done = self.done.get(str(path))
        scores: dict[str, MethodScores] = {}
        top = done.target if done is not None else None
        self._once.clear()
        for method in methods_to_run(self.explainer.chosen.methods, done, scores, self.on_method):
            group = self._groups[method]
            first = not self._once
            result, pairs, undetected, measure = self._once(("pairs", group), partial(self._paired, group, path, boxes))
            self.undetected += undetected if first else 0  # the same boxes for every group: counted once
            top = top or (result.predictions[0] if result.predictions else Prediction(-1, "nothing found", 0.0))
            scores[method] = MethodScores([], [], math.nan, detections=measure(method) if measure else [])
            for label, truth, explanations in pairs:
                for explanation in (e for e in explanations if e.method == method):
                    scores[method].boxes.append(
                        BoxScore(
                            label,
                            explanation.target,
                            metrics.pointing_hit(explanation.saliency, truth, self.options.tolerance),
                            metrics.energy_inside(explanation.saliency, truth),
                        )
                    )
            if self.on_result is not None:
                self.on_result(ImageScores(str(path), top, {method: scores[method]}))
        self._once.clear()
        assert top is not None
        return ImageScores(str(path), top, scores)

    def _paired(
        self, methods: tuple[str, ...], path: Path, boxes: Sequence[GroundTruthBox]
    ) -> tuple[ImageExplanation, list[Pair], int, Callable[[str], list[DetectionFigures]] | None]:
        """The image explained by ``methods`` (one pass), its boxes paired with their explanations, how many boxes no
        explanation matched, and (detectors) what measures a method's figures per explained detection (as its own
        step begins: each method's curves are its own cost)."""
        if methods not in self._parts:
            self._parts[methods] = with_methods(self.explainer, methods)
        explainer = self._parts[methods]
        picture = load_image(path)  # as explainer.explain(path), keeping the pass's targets and coarse maps
        inputs = to_input_tensor(picture, explainer.model.input_spec).unsqueeze(0).to(explainer.device)
        targets, cams = explainer.compute_targets(inputs)
        result = targets.results(cams, [(picture.height, picture.width)], explainer.model.class_name)[0]
        measure = None
        if isinstance(targets, Refound):  # a detector's detections, each measured on its own

            def measure(method: str, found: Refound = targets) -> list[DetectionFigures]:
                own = {method: cams[method]}
                return detection_figures(explainer, found, own, inputs, result, self.options, targets.region)[method]

        pairs, undetected = explainer.adapter.box_pairs(explainer, path, result, boxes) if boxes else ([], 0)
        return result, pairs, undetected, measure
