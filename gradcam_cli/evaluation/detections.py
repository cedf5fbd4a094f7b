"""``gradcam eval`` per detection: each explained detection's own faithfulness (docs/evaluation.md, "Detections").

For every explained detection (not the combined map) and every method:

- **deletion and insertion** of the detection's score. The network input's pixels are perturbed in the order of that
  detection's map (at the network input's resolution, ties in row-major order), as a classifier's are
  (:class:`~gradcam_cli.evaluation.evaluate.Evaluator`): deletion replaces them, most salient first, by the input's
  zero; insertion puts them back into the blurred input. In each perturbed image the detection is *re-found*
  (:class:`~gradcam_cli.cam.scores.Refound`; a detector's: the matching rule,
  :func:`~gradcam_cli.cam.detection.matched_score`, the detection of the same class whose box overlaps the explained
  box most, with an IoU of at least :data:`~gradcam_cli.cam.detection.MATCH_IOU`) and its score read; **a detection
  that vanishes (none matches) scores 0**. The curves' ends are the detection's own score
  (nothing perturbed) and its score in the all-zero and the blurred image (every detection's read from one pass).
- **pointing game and energy in its own box**: the detection's map at the original image's resolution against the
  detection's box (:func:`~gradcam_cli.evaluation.metrics.pointing_hit`, ``--tolerance``;
  :func:`~gradcam_cli.evaluation.metrics.energy_inside`).

The perturbed images of every method in ``cams`` (:class:`~gradcam_cli.evaluation.tasks.TaskEvaluator` gives one
at a time) and every detection go through the detector ``--batch-size`` at a time; each output is read as it comes
and dropped (a YOLO output holds every anchor's class logits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..cam.explainer import Explainer
from ..cam.maps import Region
from ..cam.results import ImageExplanation
from ..cam.scores import Cams, Refound, method_maps
from ..models.modes import model_state_preserved
from ..options import EvalOptions
from . import metrics
from .report import BLUR_KERNEL, BLUR_SIGMA, DetectionFigures

Job = tuple[Any, ...]
"""One perturbed image: ``("baseline",)`` and ``("blurred",)`` (shared by every detection), or
``(method, k, kind, step)``: detection ``k``'s map of ``method``, ``kind`` deletion or insertion."""


def detection_figures(
    explainer: Explainer,
    targets: Refound,
    cams: Cams,
    inputs: torch.Tensor,
    result: ImageExplanation,
    options: EvalOptions,
    region: Region,
) -> dict[str, list[DetectionFigures]]:
    """Each method of ``cams`` -> the figures of each explained detection of the (1, 3, H, W) ``inputs`` (the
    module docstring); ``targets``, ``cams`` and ``region`` (the part of the maps that shows the input): the
    explained pass's, ``result``: its explanations at the original image's resolution."""
    if not result.predictions:  # nothing explained: no passes
        return {method: [] for method in cams}
    size = (int(inputs.shape[-2]), int(inputs.shape[-1]))
    maps = {
        (method, k): method_maps(method, [cam[:1] for cam in cams[method][k]], size, region)[0]
        for method in cams
        for k in range(len(result.predictions))
    }
    scores = _curve_scores(explainer, targets, inputs[0], maps, options)
    steps = options.steps
    figures: dict[str, list[DetectionFigures]] = {method: [] for method in cams}
    for (method, k), _ in maps.items():
        own = result.predictions[k].probability
        deletion = [scores[(method, k, "deletion", step)][0] for step in range(1, steps)]
        insertion = [scores[(method, k, "insertion", step)][0] for step in range(1, steps)]
        target = result.predictions[k]
        saliency = next(e.saliency for e in result.explanations if e.method == method and e.rank == k + 1)
        box = [target.box] if target.box is not None else []
        figures[method].append(
            DetectionFigures(
                rank=k + 1,
                target=target,
                deletion=[own, *deletion, scores[("baseline",)][k]],
                insertion=[scores[("blurred",)][k], *insertion, own],
                hit=metrics.pointing_hit(saliency, box, options.tolerance),
                energy=metrics.energy_inside(saliency, box),
            )
        )
    return figures


def _curve_scores(
    explainer: Explainer,
    targets: Refound,
    image: torch.Tensor,
    maps: dict[tuple[str, int], torch.Tensor],
    options: EvalOptions,
) -> dict[Job, list[float]]:
    """Each job's re-found scores: every detection's for the shared images, the job's own detection's otherwise."""
    import torchvision.transforms.functional as TF

    steps = options.steps
    height, width = image.shape[-2:]
    counts = metrics.step_counts(height * width, steps)
    baseline = torch.zeros_like(image)
    blurred: torch.Tensor = TF.gaussian_blur(image, [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA])
    ranks = {key: metrics.importance_ranks(saliency) for key, saliency in maps.items()}

    def build(job: Job) -> torch.Tensor:
        if job[0] == "baseline":
            return baseline
        if job[0] == "blurred":
            return blurred
        method, k, kind, step = job
        perturbed = ranks[(method, k)] < counts[step]
        if kind == "deletion":
            return torch.where(perturbed, baseline, image)
        return torch.where(perturbed, image, blurred)

    jobs: list[Job] = [("baseline",), ("blurred",)]
    jobs += [(*key, kind, step) for key in maps for kind in ("deletion", "insertion") for step in range(1, steps)]
    return dict(zip(jobs, _forwarded(explainer, targets, jobs, build, options.batch_size), strict=True))


def _forwarded(
    explainer: Explainer, targets: Refound, jobs: Sequence[Job], build: Callable[[Job], torch.Tensor], batch_size: int
) -> Iterator[list[float]]:
    """Each job's image built and forwarded ``batch_size`` at a time (under the task's pass settings: a YOLO
    model's confidence threshold), its detections re-found as they come: every one for the shared images, the job's
    own otherwise."""
    module = explainer.model.module
    with (
        model_state_preserved(module),
        torch.inference_mode(),
        explainer.adapter.pass_settings(explainer.score),
    ):
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start : start + batch_size]
            scores = targets.refound(0, module(torch.stack([build(job) for job in chunk])))
            for job, row in zip(chunk, scores.tolist(), strict=True):
                yield row if len(job) == 1 else [row[job[1]]]
