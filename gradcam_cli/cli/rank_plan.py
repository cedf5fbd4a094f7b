"""``gradcam eval --rank``'s plan as the command runs it: measured on the first image still to do (the methods the
plan samples evaluated there for real, their results kept), printed, and the methods that fit the budget kept
(:mod:`gradcam_cli.evaluation.plan` computes it; docs/evaluation.md, "Costs")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import GradcamError
from .ranking import RankOptions
from .reporting import Reporter

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..evaluation.report import ImageScores
    from ..evaluation.rows import Finished
    from ..io.discovery import InputImage
    from ..options import EvalOptions


@dataclass
class RankPlan:
    """The explainer with the methods kept, each method's seconds per image, the whole run's planned seconds, the
    images the seed spread re-runs, and the plan's sampled (image, method) results (kept by the run)."""

    explainer: Explainer
    seconds: dict[str, float]
    total: float
    seed_images: int
    sampled: list[ImageScores] = field(default_factory=list)


def plan_rank(
    reporter: Reporter,
    ranking: RankOptions,
    named: bool,
    explainer: Explainer,
    images: list[InputImage],
    options: EvalOptions,
    keep: bool = True,
) -> RankPlan | None:
    """Print the plan and keep, for ``--method all`` on a CPU (not ``named``) or with ``--budget``, the methods that
    fit the budget; its sample's results are kept where ``keep`` (no boxes to score). None: the first image fails
    to load (no plan; the evaluation reports it)."""
    from ..evaluation.plan import BUDGET, SEED_SUBSET, choose, estimate, rerun_images, with_methods
    from ..io.images import load_image, to_input_tensor

    budget = ranking.budget
    if budget is None and not named and explainer.device.type == "cpu":
        budget = BUDGET
    finished = _finished(ranking, explainer)
    first = next((image for image in images if not finished.complete(str(image.path))), images[0])
    try:
        picture = load_image(first.path)
    except GradcamError:
        return None
    inputs = to_input_tensor(picture, explainer.model.input_spec).unsqueeze(0).to(explainer.device)
    reporter.info(f"plan: timing each method on {first.path.name} ...")
    sampled: list[ImageScores] = []
    costs = estimate(explainer, inputs, options, sample=_sample(explainer, options, first, finished, sampled))
    done = {m: sum(1 for image in finished.images() if m in image.methods) for m in explainer.chosen.methods}
    if not keep:
        sampled.clear()
    for method in costs.sampled:
        done[method] += any(method in row.methods for row in sampled)
    seeds = rerun_images(explainer.chosen.methods, options, len(images)) and min(SEED_SUBSET, len(images))
    plan = choose(costs, len(images), budget, seeds, done, named)
    for line in plan.lines():
        reporter.info(line)
    kept = explainer if not plan.left_out else with_methods(explainer, plan.kept)
    return RankPlan(kept, plan.seconds, plan.total(), plan.seed_images, sampled)


def _finished(ranking: RankOptions, explainer: Explainer) -> Finished:
    """With ``--skip-existing``: the results the rows file holds (the plan counts only what is left)."""
    from ..evaluation.rows import ROWS_NAME, Finished, read_finished

    if not ranking.skip_existing or ranking.report is None:
        return Finished(explainer.chosen.methods)
    return read_finished(ranking.report / ROWS_NAME, explainer.chosen.methods)


def _sample(
    explainer: Explainer, options: EvalOptions, image: InputImage, finished: Finished, results: list[ImageScores]
) -> Callable[[tuple[str, ...], Callable[[str], None]], object] | None:
    """The plan's real evaluation of ``image`` with the given methods (its per-method rows appended to
    ``results``); None for a task evaluator (no per-method work to time)."""
    from ..evaluation.evaluate import Evaluator
    from ..evaluation.plan import with_methods

    def sample(methods: tuple[str, ...], on_method: Callable[[str], None]) -> object:
        evaluator = Evaluator(with_methods(explainer, methods), options)
        evaluator.on_method, evaluator.on_result = on_method, results.append
        evaluator.done = finished.pending()
        return evaluator.evaluate_image(image.path)

    return explainer.adapter.evaluation(lambda: sample, lambda: None)
