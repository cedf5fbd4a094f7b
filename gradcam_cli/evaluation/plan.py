"""``gradcam eval --rank``'s plan: each method's cost per image, measured on the first image before the heavy work,
and for ``--method all`` on a CPU (or any ``--budget``) the methods that fit the budget (docs/evaluation.md,
"Costs").

A method's evaluation on one image costs its explanation once for the image, once per sanity stage, once more for
a random method's redraw and once per stability copy, plus its scoring: the deletion and insertion steps, the
masked image and ROAD's 18 images, each imputed (the imputation often costs more than the forward passes) and
forwarded; randomcam's four times over. The seed spread re-runs a few images without the cascade. The plan
measures a sample of this real work: the first method that shares a pass (:mod:`.shared`) and randomcam are
evaluated for real on the first image (their results kept, not computed again), which gives one map's scoring
cost (what their evaluation took beyond their explanations); each method's explanation is timed on the same image
(those sharing a pass together, each carrying an equal share; a method that runs batches of masked inputs,
Score-CAM, AblationCAM, RISE, occlusion, stopped through its progress callback after :data:`TIMED_SECONDS` and its
time extrapolated from the share done), and its cost is its explanations plus its maps' scoring.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..cam.explainer import Explainer
from ..cam.masked_scores import ProgressCallback
from ..cam.methods import METHODS
from ..models.modes import model_state_preserved
from ..options import EvalOptions, PerturbationOptions
from .draws import RANDOM_DRAWS, RANDOM_METHODS
from .meta import META_PERTURBATIONS
from .road import ROAD_FRACTIONS
from .shared import pass_groups

BUDGET = 600.0
"""Seconds a ``--method all`` ranking may take on a CPU unless ``--budget`` says otherwise."""
KEPT = ("randomcam",)
"""Methods kept whatever their cost: the floor."""
TIMED_SECONDS = 2.0
"""How long a method with batches of masked inputs is timed before its time is extrapolated."""
SEED_RERUNS = 2
"""Other seeds the seed spread re-runs each image of its subset with (:mod:`gradcam_cli.evaluation.seeds`)."""
SEED_SUBSET = 3
"""Images the seed spread re-runs: the first this many evaluated."""
RERUN_SEED_STEP = 104_729
"""Re-run k uses ``--seed + k * RERUN_SEED_STEP`` (and the maps' seed shifted alike)."""


class _Enough(Exception):
    """Stops a timed explanation once its rate is known."""


Sample = Callable[[tuple[str, ...], Callable[[str], None]], object]
"""Evaluates the first image for real with these methods (the methods sharing a pass), calling ``on_method(name)``
as each method's work begins (:func:`estimate`)."""


@dataclass(frozen=True)
class Costs:
    """What :func:`estimate` measured: each method's seconds per image of the main pass and per image of the seed
    spread (no sanity cascade there), the seconds the timing took, and the methods it evaluated for real on the first
    image (their results kept: the main pass does not run them again there)."""

    seconds: dict[str, float]
    rerun: dict[str, float]
    spent: float = 0.0
    sampled: tuple[str, ...] = ()
    checks: dict[str, float] = field(default_factory=dict)
    """Of ``seconds``: what ``--arcc``, ``--random-logit``, ``--mprt`` and ``--meta`` add per image."""


def _timed(explainer: Explainer, methods: tuple[str, ...], inputs: torch.Tensor) -> float:
    """Seconds ``methods`` (one pass) take to explain the (1, 3, H, W) ``inputs``, extrapolated from their
    progress."""
    marks: dict[str, float] = {}

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if "first" not in marks:
            marks["first"], marks["setup"] = now, now - started
        elif done and "share" not in marks and (now - marks["first"] > TIMED_SECONDS or done >= total):
            marks["share"], marks["spent"] = done / total, now - marks["first"]
            if done < total:
                raise _Enough

    single = with_methods(explainer, methods, progress=progress)
    started = time.perf_counter()
    try:
        single.compute_targets(inputs, explainer.chosen.target, 1)
    except _Enough:
        return marks["setup"] + marks["spent"] / marks["share"]
    return time.perf_counter() - started


def _sampled(sample: Sample, methods: tuple[str, ...]) -> tuple[dict[str, float], float]:
    """Each of ``methods``' seconds in one real evaluation of the first image (the first method's holding the passes
    they share), and the whole evaluation's; none where ``--skip-existing`` had finished them all there."""
    marks: list[tuple[str, float]] = []
    started = time.perf_counter()
    sample(methods, lambda name: marks.append((name, time.perf_counter())))
    ended = time.perf_counter()
    if not marks:
        return {}, 0.0
    ends = [at for _, at in marks[1:]] + [ended]
    return {name: end - at for (name, at), end in zip(marks, ends, strict=True)}, ended - started


def _sample_of(shared: tuple[str, ...]) -> tuple[str, ...]:
    """The methods evaluated for real to time the scoring: the first of those sharing a pass that draws no noise,
    and randomcam (its scoring four maps over)."""
    plain = [m for m in shared if m not in RANDOM_METHODS][:1]
    return tuple(m for m in shared if m in plain or m == "randomcam")


def _forward_scoring(explainer: Explainer, inputs: torch.Tensor, options: EvalOptions) -> float:
    """Without a real sample: one map's scoring estimated as its forward passes alone (no ROAD imputation)."""
    module = explainer.model.module
    batch = inputs.expand(options.batch_size, *inputs.shape[1:]).to(explainer.device)
    with model_state_preserved(module), torch.inference_mode():
        module(batch)  # warm-up
        started = time.perf_counter()
        module(batch)
        forward = (time.perf_counter() - started) / options.batch_size
    return forward * (2 * (options.steps - 1) + 1 + (2 * len(ROAD_FRACTIONS) if options.road else 0))


def with_methods(
    explainer: Explainer,
    methods: Sequence[str],
    module: nn.Module | None = None,
    progress: ProgressCallback | None = None,
    perturbation: PerturbationOptions | None = None,
) -> Explainer:
    """An explainer like ``explainer`` with other ``methods`` (and ``module`` in place of its model's module,
    ``progress`` in place of its masked passes' progress callback, ``perturbation`` in place of its own)."""
    changes = {"perturbation": perturbation} if perturbation is not None else {}
    return explainer.with_options(module, progress, methods=tuple(methods), **changes)


@dataclass(frozen=True)
class Plan:
    """The methods kept and those left out (with the budget, if any), from :class:`Costs`: ``runs`` is the number of
    images each method is still to be evaluated on in the main pass (not those finished, nor the sample), and
    ``seed_images`` the images the seed spread re-runs (:data:`SEED_RERUNS` times each; 0: none)."""

    costs: Costs
    kept: list[str]
    left_out: list[str]
    runs: dict[str, int]
    images: int
    budget: float | None
    seed_images: int = 0
    named: bool = False
    """The methods were named with ``--method`` (not ``all``): the plan does not tell the user to name them."""
    forced: str | None = None
    """A method kept over the budget, which fits only the baseline: a ranking needs a method beside it."""

    @property
    def seconds(self) -> dict[str, float]:
        return self.costs.seconds

    def cost(self, method: str) -> float:
        """``method``'s seconds over the run: its images still to do and the seed spread's re-runs."""
        return (
            self.costs.seconds[method] * self.runs[method] + self.costs.rerun[method] * SEED_RERUNS * self.seed_images
        )

    def total(self) -> float:
        """Seconds the whole run should take, counted from the start of the timing (spent on it included)."""
        return self.costs.spent + sum(self.cost(m) for m in self.kept)

    def lines(self) -> list[str]:
        """The plan as printed before the heavy work."""
        cost = ", ".join(f"{m} ~{self.seconds[m]:.1f}s" for m in self.kept)
        out = [
            f"plan: {len(self.kept)} method(s) on {self.images} image(s), about {self.total():.0f}s in all (timing "
            f"included, {self.costs.spent:.0f}s): {cost} per image"
        ]
        checks = sum(self.costs.checks.get(m, 0.0) * self.runs[m] for m in self.kept)
        if checks:
            out.append(f"plan: --arcc, --random-logit, --mprt and --meta take ~{checks:.0f}s of it (included above)")
        if self.seed_images:
            spread = sum(self.costs.rerun[m] for m in self.kept) * SEED_RERUNS * self.seed_images
            out.append(
                f"plan: the seed spread re-runs {self.seed_images} image(s) with {SEED_RERUNS} other seeds "
                f"(~{spread:.0f}s, included above)"
            )
        if self.forced:
            out.append(
                f"plan: the {self.budget:.0f}s budget fits only the {KEPT[0]} baseline, which ranks nothing alone: "
                f"kept {self.forced}, the cheapest method, over it; raise --budget SECONDS, or lower --steps N"
            )
        if self.left_out:
            over = ", ".join(f"{m} ~{self.seconds[m]:.1f}s" for m in self.left_out)
            advice = "raise --budget SECONDS" if self.named else "name them with --method, or raise --budget SECONDS"
            out.append(f"plan: left out to fit the {self.budget:.0f}s budget (per image: {over}); {advice}")
        return out


def estimate(
    explainer: Explainer,
    inputs: torch.Tensor,
    options: EvalOptions,
    on_method: Callable[[str], None] | None = None,
    sample: Sample | None = None,
) -> Costs:
    """Each of ``explainer``'s methods' estimated seconds to evaluate one image like the (1, 3, H, W) ``inputs``
    (the module docstring); ``on_method(name)`` before each is timed. ``sample``: evaluates the first image for real
    with the methods sharing a pass, which gives their costs and one map's scoring cost (ROAD's imputation
    included); without it, the scoring is estimated from the forward passes alone."""
    started = time.perf_counter()
    cascade = options.sanity_layers if options.sanity or options.meta else 0
    repeats = 1 + cascade + (options.stability_samples if options.stability else 0) + _shared_checks(options)
    scorings = 1 + (META_PERTURBATIONS + 1 if options.meta else 0)  # --meta: each map scored again
    groups, explained = pass_groups(explainer.chosen.methods), {}
    for method in explainer.chosen.methods:
        if on_method:
            on_method(method)
        group = groups[method]
        if group not in explained:  # the methods sharing a pass: timed together, each carries an equal share
            explained[group] = _timed(explainer, group, inputs) / len(group)
    shared = tuple(m for m in explainer.chosen.methods if not METHODS[m].shows_progress)
    sampled = _sample_of(shared)
    measured, whole = _sampled(sample, sampled) if sample is not None and sampled else ({}, 0.0)
    alone = {m: explained[groups[m]] * len(groups[m]) if options.arcc else 0.0 for m in sampled}  # ARCC's own pass
    passes = _timed(explainer, sampled, inputs) * repeats + sum(alone.values()) if measured else 0.0
    maps = sum(RANDOM_DRAWS if m == "randomcam" else 1 for m in measured)
    scoring = max(whole - passes, 0.0) / maps / scorings if maps else _forward_scoring(explainer, inputs, options)
    seconds, rerun, checks = {}, {}, {}
    for method in explainer.chosen.methods:
        explain = explained[groups[method]]
        redraw = 1 if options.sanity and method in RANDOM_METHODS else 0
        draws = RANDOM_DRAWS if method == "randomcam" else 1
        arcc = explain * len(groups[method]) if options.arcc else 0.0
        seconds[method] = explain * (repeats + redraw) + arcc + scoring * scorings * draws
        checks[method] = explain * _shared_checks(options) + arcc + scoring * (scorings - 1) * draws
        rerun[method] = max(seconds[method] - explain * (cascade + redraw) - scoring * (scorings - 1) * draws, 0.0)
    return Costs(seconds, rerun, time.perf_counter() - started, tuple(measured), checks)


def _shared_checks(options: EvalOptions) -> int:
    """The explanations per image that ``--random-logit`` (the other class's) and ``--mprt`` (sMPRT's copies on the
    trained and the randomised model, eMPRT's map there) add to a shared pass."""
    return (1 if options.random_logit else 0) + (1 + 2 * options.mprt_samples if options.mprt else 0)


def draws_noise(methods: Sequence[str], options: EvalOptions) -> bool:
    """Whether anything measured depends on a seed (a random method, ``--road``, ``--faithfulness-correlation``,
    ``--stability``, ``--arcc`` (its ROAD), ``--random-logit`` (its class) or ``--mprt`` (its model and noise))."""
    seeded = (options.road, options.correlation, options.stability, options.arcc, options.random_logit, options.mprt)
    return any(seeded) or any(method in RANDOM_METHODS for method in methods)


def rerun_images(methods: Sequence[str], options: EvalOptions, images: int, subset: int = SEED_SUBSET) -> int:
    """The extra image evaluations the seed spread's re-runs cost: :data:`SEED_RERUNS` for each of the first
    ``subset`` images (the cascade is not re-run)."""
    return SEED_RERUNS * min(subset, images) if draws_noise(methods, options) else 0


def choose(
    costs: Costs,
    images: int,
    budget: float | None,
    seed_images: int = 0,
    done: dict[str, int] | None = None,
    named: bool = False,
) -> Plan:
    """Keep :data:`KEPT`, then each method in the order of ``costs`` (``--method``'s: the classic methods first)
    whose cost still fits ``budget`` (None: all), counted from the start of the timing: the images each method is
    still to run on (``done``: method -> images finished, by ``--skip-existing`` or the sample) and the seed
    spread's re-runs of ``seed_images``. Where a method is left out, the seed spread re-runs fewer images (down to
    one) if that keeps more methods: methods ranked come before a finer spread. Where only the baseline fits, the
    spread re-runs one image and the cheapest other method is kept over the budget (:attr:`Plan.forced`)."""
    done = done or {}
    runs = {m: max(images - done.get(m, 0), 0) for m in costs.seconds}
    plan = _chosen(costs, runs, images, budget, seed_images, named)
    for fewer in range(seed_images - 1, 0, -1):
        if not plan.left_out:
            break
        smaller = _chosen(costs, runs, images, budget, fewer, named)
        if len(smaller.kept) > len(plan.kept):
            plan = smaller
    others = [m for m in costs.seconds if m not in KEPT]
    if budget is None or not others or any(m not in KEPT for m in plan.kept):
        return plan
    plan = _chosen(costs, runs, images, budget, min(seed_images, 1), named)  # the baseline alone: the least spread
    cheapest = min(others, key=plan.cost)
    kept = [m for m in costs.seconds if m in plan.kept or m == cheapest]
    left = [m for m in costs.seconds if m not in kept]
    return Plan(costs, kept, left, runs, images, budget, plan.seed_images, named, cheapest)


def _chosen(
    costs: Costs, runs: dict[str, int], images: int, budget: float | None, seed_images: int, named: bool
) -> Plan:
    everything = Plan(costs, list(costs.seconds), [], runs, images, budget, seed_images, named)
    if budget is None:
        return everything
    chosen = set(KEPT) & set(costs.seconds)
    spent = costs.spent + sum(everything.cost(m) for m in chosen)
    for method in costs.seconds:
        if method not in chosen and spent + everything.cost(method) <= budget:
            chosen.add(method)
            spent += everything.cost(method)
    kept = [m for m in costs.seconds if m in chosen]
    return Plan(costs, kept, [m for m in costs.seconds if m not in chosen], runs, images, budget, seed_images, named)
