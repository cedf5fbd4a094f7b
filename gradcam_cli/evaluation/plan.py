"""``gradcam eval --rank``'s plan: each method's cost per image, estimated from a timed pass on the first image
before the heavy work, and for ``--method all`` on a CPU (or any ``--budget``) the methods that fit the budget
(docs/evaluation.md, "Costs").

A method's evaluation on one image costs its explanation once for the image, once per sanity stage, once more for
a random method's redraw and once per stability copy, plus one forward pass per perturbed image it is scored on
(deletion and insertion steps, the masked image, ROAD's 18 images; randomcam four times over). The explanation is
timed on the first image; a method that runs batches of masked inputs (Score-CAM, AblationCAM, RISE, occlusion) is
stopped through its progress callback after :data:`TIMED_SECONDS` and its time extrapolated from the share done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..cam.engine import model_state_preserved
from ..cam.explainer import Explainer
from ..cam.masked_scores import ProgressCallback
from ..options import EvalOptions
from .draws import RANDOM_DRAWS, RANDOM_METHODS
from .road import ROAD_FRACTIONS

BUDGET = 600.0
"""Seconds a ``--method all`` ranking may take on a CPU unless ``--budget`` says otherwise."""
KEPT = ("randomcam",)
"""Methods kept whatever their cost: the floor."""
TIMED_SECONDS = 2.0
"""How long a method with batches of masked inputs is timed before its time is extrapolated."""


class _Enough(Exception):
    """Stops a timed explanation once its rate is known."""


def _timed(explainer: Explainer, method: str, inputs: torch.Tensor) -> float:
    """Seconds ``method`` takes to explain the (1, 3, H, W) ``inputs``, extrapolated from its progress."""
    marks: dict[str, float] = {}

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if "first" not in marks:
            marks["first"], marks["setup"] = now, now - started
        elif done and "share" not in marks and (now - marks["first"] > TIMED_SECONDS or done >= total):
            marks["share"], marks["spent"] = done / total, now - marks["first"]
            if done < total:
                raise _Enough

    single = with_methods(explainer, [method], progress=progress)
    started = time.perf_counter()
    try:
        single.compute_targets(inputs, explainer.target, 1)
    except _Enough:
        return marks["setup"] + marks["spent"] / marks["share"]
    return time.perf_counter() - started


def with_methods(
    explainer: Explainer,
    methods: Sequence[str],
    module: nn.Module | None = None,
    progress: ProgressCallback | None = None,
) -> Explainer:
    """An explainer like ``explainer`` with other ``methods`` (and ``module`` in place of its model's module,
    ``progress`` in place of its masked passes' progress callback)."""
    return explainer.with_options(module, progress, methods=tuple(methods))


@dataclass(frozen=True)
class Plan:
    """Seconds per image for each method, the methods kept and those left out (with the budget, if any)."""

    seconds: dict[str, float]
    kept: list[str]
    left_out: list[str]
    images: int
    budget: float | None

    def lines(self) -> list[str]:
        """The plan as printed before the heavy work."""
        total = sum(self.seconds[m] for m in self.kept) * self.images
        cost = ", ".join(f"{m} ~{self.seconds[m]:.1f}s" for m in self.kept)
        out = [f"plan: {len(self.kept)} method(s) on {self.images} image(s), about {total:.0f}s: {cost} per image"]
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
    for method in explainer.methods:
        if on_method:
            on_method(method)
        explain = _timed(explainer, method, inputs)
        redraw = 1 if options.sanity and method in RANDOM_METHODS else 0
        draws = RANDOM_DRAWS if method == "randomcam" else 1
        seconds[method] = explain * (repeats + redraw) + forward * passes * draws
    return seconds


def choose(seconds: dict[str, float], images: int, budget: float | None) -> Plan:
    """Keep :data:`KEPT`, then each method in the order of ``seconds`` (``--method``'s: the classic methods first)
    whose cost over ``images`` still fits ``budget`` (None: all)."""
    if budget is None:
        return Plan(seconds, list(seconds), [], images, None)
    chosen, spent = set(KEPT) & set(seconds), sum(seconds[m] for m in KEPT if m in seconds) * images
    for method in seconds:
        if method not in chosen and spent + seconds[method] * images <= budget:
            chosen.add(method)
            spent += seconds[method] * images
    kept = [m for m in seconds if m in chosen]
    return Plan(seconds, kept, [m for m in seconds if m not in chosen], images, budget)
