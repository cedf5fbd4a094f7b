"""``gradcam eval --rank``'s plan: each method's cost per image, estimated from a timed pass on the first image
before the heavy work, and for ``--method all`` on a CPU (or any ``--budget``) the methods that fit the budget
(docs/evaluation.md, "Costs").

A method's evaluation on one image costs its explanation once for the image, once per sanity stage, once more for
a random method's redraw and once per stability copy, plus one forward pass per perturbed image it is scored on
(deletion and insertion steps, the masked image, ROAD's 18 images; randomcam four times over). The explanation is
timed on the first image (the methods that share a pass, :mod:`.shared`, timed together, each carrying an equal
share); a method that runs batches of masked inputs (Score-CAM, AblationCAM, RISE, occlusion) is
stopped through its progress callback after :data:`TIMED_SECONDS` and its time extrapolated from the share done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..cam.explainer import Explainer
from ..cam.masked_scores import ProgressCallback
from ..models.modes import model_state_preserved
from ..options import EvalOptions, PerturbationOptions
from .draws import RANDOM_DRAWS, RANDOM_METHODS
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
    """Seconds per image for each method, the methods kept and those left out (with the budget, if any)."""

    seconds: dict[str, float]
    kept: list[str]
    left_out: list[str]
    images: int
    budget: float | None
    reruns: int = 0
    """Extra image evaluations of the seed spread (:func:`rerun_images`)."""

    def lines(self) -> list[str]:
        """The plan as printed before the heavy work."""
        per_image = sum(self.seconds[m] for m in self.kept)
        total = per_image * (self.images + self.reruns)
        cost = ", ".join(f"{m} ~{self.seconds[m]:.1f}s" for m in self.kept)
        out = [f"plan: {len(self.kept)} method(s) on {self.images} image(s), about {total:.0f}s: {cost} per image"]
        if self.reruns:
            out.append(
                f"plan: the seed spread re-runs {self.reruns // SEED_RERUNS} image(s) with {SEED_RERUNS} other "
                f"seeds (at most ~{per_image * self.reruns:.0f}s, included above)"
            )
        if self.left_out:
            over = ", ".join(f"{m} ~{self.seconds[m]:.1f}s" for m in self.left_out)
            out.append(
                f"plan: left out to fit the {self.budget:.0f}s budget (per image: {over}); "
                "name them with --method, or raise --budget SECONDS"
            )
        return out


def estimate(
    explainer: Explainer, inputs: torch.Tensor, options: EvalOptions, on_method: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Each of ``explainer``'s methods' estimated seconds to evaluate one image like the (1, 3, H, W) ``inputs``
    (the module docstring); ``on_method(name)`` before each is timed."""
    module = explainer.model.module
    batch = inputs.expand(options.batch_size, *inputs.shape[1:]).to(explainer.device)
    with model_state_preserved(module), torch.inference_mode():
        module(batch)  # warm-up
        started = time.perf_counter()
        module(batch)
        forward = (time.perf_counter() - started) / options.batch_size
    repeats = (
        1 + (options.sanity_layers if options.sanity else 0) + (options.stability_samples if options.stability else 0)
    )
    passes = 2 * (options.steps - 1) + 1 + (2 * len(ROAD_FRACTIONS) if options.road else 0)
    seconds = {}
    groups, explained = pass_groups(explainer.chosen.methods), {}
    for method in explainer.chosen.methods:
        if on_method:
            on_method(method)
        group = groups[method]
        if group not in explained:  # the methods sharing a pass: timed together, each carries an equal share
            explained[group] = _timed(explainer, group, inputs) / len(group)
        explain = explained[group]
        redraw = 1 if options.sanity and method in RANDOM_METHODS else 0
        draws = RANDOM_DRAWS if method == "randomcam" else 1
        seconds[method] = explain * (repeats + redraw) + forward * passes * draws
    return seconds


def draws_noise(methods: Sequence[str], options: EvalOptions) -> bool:
    """Whether anything measured depends on a seed (a random method, ``--road`` or ``--stability``)."""
    return options.road or options.stability or any(method in RANDOM_METHODS for method in methods)


def rerun_images(methods: Sequence[str], options: EvalOptions, images: int) -> int:
    """The extra image evaluations the seed spread's re-runs cost (counted at a whole image's cost: an upper
    bound, since the cascade is not re-run)."""
    return SEED_RERUNS * min(SEED_SUBSET, images) if draws_noise(methods, options) else 0


def planned(
    explainer: Explainer, inputs: torch.Tensor, options: EvalOptions, images: int, budget: float | None
) -> Plan:
    """The plan of evaluating ``images`` images like ``inputs`` (and the seed re-runs) within ``budget``."""
    reruns = rerun_images(explainer.chosen.methods, options, images)
    return choose(estimate(explainer, inputs, options), images, budget, reruns)


def choose(seconds: dict[str, float], images: int, budget: float | None, reruns: int = 0) -> Plan:
    """Keep :data:`KEPT`, then each method in the order of ``seconds`` (``--method``'s: the classic methods first)
    whose cost over ``images`` and ``reruns`` more still fits ``budget`` (None: all)."""
    if budget is None:
        return Plan(seconds, list(seconds), [], images, None, reruns)
    runs = images + reruns
    chosen, spent = set(KEPT) & set(seconds), sum(seconds[m] for m in KEPT if m in seconds) * runs
    for method in seconds:
        if method not in chosen and spent + seconds[method] * runs <= budget:
            chosen.add(method)
            spent += seconds[method] * runs
    kept = [m for m in seconds if m in chosen]
    return Plan(seconds, kept, [m for m in seconds if m not in chosen], images, budget, reruns)
