"""``gradcam eval --rank``'s seed spread: how much each method's figures move with the seeds of the evaluation's own
randomness (RISE's masks and randomcam's noise, ROAD's imputation noise, stability's noisy copies), measured by
re-running the first :data:`SEED_SUBSET` images with :data:`SEED_RERUNS` other seeds (docs/evaluation.md, "Seed
spread"). The between-image intervals do not hold this noise; the spread is reported beside them. Each re-run's
(image, method) results are handed on as they finish (``--report DIR``'s rows file keeps them, so that
``--skip-existing`` resumes the spread where it stopped)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from .evaluate import Evaluator
from .plan import RERUN_SEED_STEP, SEED_RERUNS, SEED_SUBSET, draws_noise, with_methods
from .rank import RANKED
from .report import EvalReport, ImageScores
from .rows import Finished
from .tasks import TaskEvaluator

Spread = dict[str, dict[str, float]]
"""method -> metric -> the mean over the subset of the standard deviation across seeds of its per-image value."""


def seed_spread(
    evaluator: Evaluator | TaskEvaluator,
    report: EvalReport,
    subset_size: int = SEED_SUBSET,
    done: Mapping[int, Finished] | None = None,
    on_result: Callable[[int, ImageScores], object] | None = None,
) -> Spread:
    """Each method's spread per ranked metric (0 where nothing it measures draws noise; the cascade and the boxes
    are not re-run, so ``sanity``, ``pointing`` and ``energy`` have none), over the first ``subset_size`` images.
    ``done``: re-run k -> the results finished before (kept, not computed again); ``on_result(k, scores)`` with each
    re-run's (image, method) scores as they are ready."""
    subset = report.ok[:subset_size]
    done = done or {}
    if not isinstance(evaluator, Evaluator) or not subset or not draws_noise(report.methods, evaluator.options):
        return {}
    explainer, options = evaluator.explainer, evaluator.options
    runs: list[list[ImageScores]] = [subset]
    for k in range(1, SEED_RERUNS + 1):
        shift = k * RERUN_SEED_STEP
        perturbation = replace(explainer.options.perturbation, seed=explainer.options.perturbation.seed + shift)
        reseeded = type(evaluator)(  # a video model's clip evaluator re-runs its clips
            with_methods(explainer, explainer.chosen.methods, perturbation=perturbation),
            replace(options, seed=options.seed + shift, sanity=False, meta=False),
        )
        finished = done.get(k, Finished(explainer.chosen.methods))
        reseeded.done = finished.pending()
        reseeded.on_result = (lambda scores, k=k: on_result(k, scores)) if on_result is not None else None
        kept = {image.image: image for image in finished.images()}
        runs.append(
            [
                kept[image.image] if finished.complete(image.image) else reseeded.evaluate_image(Path(image.image))
                for image in subset
            ]
        )
    spread: Spread = {}
    for method in report.methods:
        for metric, (_, _, value) in RANKED.items():
            deviations = []
            for images in zip(*runs, strict=True):
                if any(image.error or method not in image.methods for image in images):
                    continue
                seen = [value(image, image.methods[method]) for image in images]
                if all(v is not None and not math.isnan(v) for v in seen):
                    deviations.append(statistics.stdev(float(v) for v in seen))  # type: ignore[arg-type]
            if deviations:
                spread.setdefault(method, {})[metric] = statistics.fmean(deviations)
    return spread
