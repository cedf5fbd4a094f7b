"""What both evaluators share (:class:`~gradcam_cli.evaluation.evaluate.Evaluator`, a classifier's whole protocol,
and :class:`~gradcam_cli.evaluation.tasks.TaskEvaluator`, the boxes of every other task): the images, matched to
their ground-truth boxes, each scored with its failure kept as its ``error``, and the report they make."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..cam.explainer import Explainer
from ..errors import GradcamError, UsageError, describe
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage, discover
from ..options import EvalOptions
from .boxes import match_boxes
from .report import EvalReport, ImageScores

ImageEvaluation = Callable[[Path, Sequence[GroundTruthBox]], ImageScores]
"""One image's figures from its path and its boxes."""


def evaluate_images(
    explainer: Explainer,
    images: Sequence[InputImage | str | Path],
    boxes: Sequence[GroundTruthBox] | None,
    evaluate_image: ImageEvaluation,
    on_image: Callable[[], Any] | None,
    boxed_only: bool,
    on_result: Callable[[ImageScores], Any] | None = None,
) -> tuple[list[ImageScores], int]:
    """Each image's figures (``boxed_only``: only of the images that have boxes), and how many boxes name no input
    image; ``on_image`` is called once per image (for progress bars), ``on_result`` with each failed image (the
    evaluators hand it each finished (image, method) themselves)."""
    inputs = [image for image in images if isinstance(image, InputImage)]
    if len(inputs) < len(images):
        inputs = discover([image.path if isinstance(image, InputImage) else image for image in images])
    matched, unmatched = match_boxes(boxes, inputs, explainer.model.categories) if boxes else ({}, [])
    if boxes and not matched:
        raise UsageError(f"none of the {len(boxes)} boxes names one of the input images (e.g. {boxes[0].image!r})")
    results = []
    for image in inputs:
        if not boxed_only or image.path in matched:
            results.append(evaluate_image(image.path, matched.get(image.path, [])))
            if on_result and results[-1].error is not None:
                on_result(results[-1])
        if on_image:
            on_image()
    return results, len(unmatched)


def scored_safely(path: Path, work: Callable[[], ImageScores]) -> ImageScores:
    """``work``'s figures for the image at ``path``; a failure to read or run it is returned as ``error`` (a
    :class:`UsageError` is raised: it is the run's, not the image's)."""
    try:
        return work()
    except UsageError:
        raise
    except GradcamError as error:
        return ImageScores(str(path), error=str(error))
    except Exception as error:
        return ImageScores(str(path), error=f"{path}: cannot evaluate this image ({describe(error, path)})")


def report_of(
    explainer: Explainer,
    options: EvalOptions,
    results: list[ImageScores],
    unmatched: int,
    sanity_modules: Sequence[str] = (),
    undetected: int = 0,
) -> EvalReport:
    """The :class:`EvalReport` of ``results``."""
    return EvalReport(
        model=explainer.model.name,
        layers=list(explainer.chosen.layers),
        methods=list(explainer.chosen.methods),
        options=options,
        sanity_modules=list(sanity_modules),
        images=results,
        unmatched_boxes=unmatched,
        target=explainer.chosen.target,
        undetected_boxes=undetected,
    )


def in_order(images: Sequence[InputImage], scores: list[ImageScores]) -> list[ImageScores]:
    """``scores`` in the order of ``images``."""
    place = {str(image.path): i for i, image in enumerate(images)}
    return sorted(scores, key=lambda s: place.get(s.image, len(place)))
