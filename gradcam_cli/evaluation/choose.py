"""Which evaluator ``gradcam eval`` runs for a model's task, and :func:`evaluate`, the library's one call: the whole
protocol for a classifier (:class:`~gradcam_cli.evaluation.evaluate.Evaluator`; per clip for a video model's:
:class:`~gradcam_cli.evaluation.clips.ClipEvaluator`), the boxes for a detector or segmenter
(:class:`~gradcam_cli.evaluation.tasks.TaskEvaluator`), the answer's deletion and insertion for a vision-language
model (:class:`~gradcam_cli.evaluation.answers.AnswerEvaluator`), voxel deletion and insertion for a volume model's
scans (:class:`~gradcam_cli.evaluation.scans.ScanEvaluator`)."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..cam.explainer import Explainer
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage
from ..options import EvalOptions
from .answers import AnswerEvaluator
from .boxes import read_boxes
from .clips import ClipEvaluator
from .evaluate import AnyEvaluator, Evaluator
from .report import EvalReport
from .scans import ScanEvaluator
from .tasks import TaskEvaluator

__all__ = ["AnyEvaluator", "evaluate", "evaluator_for"]


def evaluator_for(explainer: Explainer, options: EvalOptions | None = None) -> AnyEvaluator:
    """The evaluator for the explainer's task (the module docstring), chosen by its adapter; a volume model's
    scans' (segmenters' and classifiers')."""
    if explainer.model.profile.volume is not None:
        return ScanEvaluator(explainer, options)

    def protocol() -> AnyEvaluator:
        if explainer.model.profile.clips is not None:  # a video model's: per clip, in time too
            return ClipEvaluator(explainer, options)
        return Evaluator(explainer, options)

    def boxes() -> AnyEvaluator:
        return TaskEvaluator(explainer, options)

    def answers() -> AnyEvaluator:
        return AnswerEvaluator(explainer, options)

    return explainer.adapter.evaluation(protocol, boxes, answers)


def evaluate(
    explainer: Explainer,
    images: Sequence[InputImage | str | Path],
    options: EvalOptions | None = None,
    boxes: str | Path | Sequence[GroundTruthBox] | None = None,
    on_image: Callable[[], Any] | None = None,
) -> EvalReport:
    """Evaluate ``explainer``'s maps on ``images`` (files, folders or globs); ``boxes``: a file, folder or list."""
    if isinstance(boxes, str | Path):
        boxes = read_boxes(boxes)
    return evaluator_for(explainer, options).run(images, boxes, on_image)
