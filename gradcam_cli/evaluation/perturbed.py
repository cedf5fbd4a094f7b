"""``--meta``'s figures of one method's map on one image (docs/evaluation.md, "Meta-evaluation";
:mod:`gradcam_cli.evaluation.meta` turns them into scores and verdicts): every ranked figure of the map measured
again on each noisy copy of the image that keeps its class (the input resilience test), and of the method's map on
the sanity cascade's last model, measured with that model (the model reactivity test; its maps are the cascade's,
already computed)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..models.modes import model_state_preserved
from .draws import averaged
from .meta import META_NOISE, META_PERTURBATIONS
from .rank import RANKED
from .report import ImageScores, MethodScores
from .shared import Once

Read = Callable[[object], torch.Tensor]
ScoreMaps = Callable[
    [torch.Tensor, Prediction, dict[str, torch.Tensor], Read, "nn.Module | None", tuple[object, ...]],
    dict[str, MethodScores],
]
"""The evaluator's scoring of maps (a method's, and randomcam's draws) on a (3, ...) image for a target, read with
the given model (None: the explainer's), its once-per-image work keyed by the last argument."""


def noise_copies(inputs: torch.Tensor, copies: int, seed: int, noise: float = META_NOISE) -> torch.Tensor:
    """``copies`` copies of the (1, C, ...) ``inputs`` with U(-noise, noise) added, drawn from ``seed``, clipped to
    the input's range of values (MetaQuantus clips below at the input's minimum)."""
    generator = torch.Generator().manual_seed(seed)
    drawn = (torch.rand(copies, *inputs.shape[1:], generator=generator, dtype=torch.float64) * 2 - 1) * noise
    noisy = inputs + drawn.to(inputs.device, inputs.dtype)
    return noisy.clamp(float(inputs.min()), float(inputs.max()))


def figures(name: str, target: Prediction, method: str, scores: MethodScores) -> dict[str, float]:
    """Every ranked figure the scores define (metric -> value)."""
    image = ImageScores(name, target, {method: scores})
    found = {metric: value(image, scores) for metric, (_, _, value) in RANKED.items()}
    return {metric: float(v) for metric, v in found.items() if v is not None and not math.isnan(v)}


class MetaFigures:
    """What ``--meta`` asks of each (image, method): :meth:`measure`."""

    def __init__(self, explainer: Explainer, seed: int, score: ScoreMaps, once: Once) -> None:
        self.explainer, self.seed = explainer, seed
        self._score, self._once = score, once

    def measure(
        self,
        inputs: torch.Tensor,
        target: Prediction,
        maps: tuple[str, dict[str, torch.Tensor]],
        read: Read,
        randomised: tuple[nn.Module, dict[str, torch.Tensor]],
    ) -> tuple[list[dict[str, float]], dict[str, float]]:
        """The figures of ``maps`` (the method, and its maps: its own, randomcam's draws) on each noisy copy of the
        (1, C, ...) ``inputs`` (NaN where the class changed), and of ``randomised`` (the cascade's last model and the
        method's maps there) with that model (NaN where it keeps the class)."""
        method, own = maps
        copies, kept, probabilities = self._once(("meta", "copies"), lambda: self._copies(inputs, target, read))
        noisy = []
        for k in range(len(copies)):
            if not kept[k]:
                noisy.append(dict.fromkeys(RANKED, math.nan))
                continue
            moved = self.explainer.prediction(target.index, probabilities[k])
            scores = self._score(copies[k], moved, own, read, None, ("meta", k))
            noisy.append(figures("", moved, method, _one(scores, method)))
        module, theirs = randomised
        changed, probability = self._once(("meta", "model"), lambda: _class(module, inputs, target, read))
        if not changed:
            return noisy, dict.fromkeys(RANKED, math.nan)
        there = self.explainer.prediction(target.index, probability)
        scores = self._score(inputs[0], there, theirs, read, module, ("meta", "model"))
        return noisy, figures("", there, method, _one(scores, method))

    def _copies(
        self, inputs: torch.Tensor, target: Prediction, read: Read
    ) -> tuple[torch.Tensor, list[bool], list[float]]:
        copies = noise_copies(inputs, META_PERTURBATIONS, self.seed)
        module = self.explainer.model.module
        with model_state_preserved(module), torch.inference_mode():
            output = module(copies)
            kept = (output.argmax(dim=1) == target.index).tolist()
            return copies, kept, read(output).float().tolist()


def _class(module: nn.Module, inputs: torch.Tensor, target: Prediction, read: Read) -> tuple[bool, float]:
    """Whether ``module`` predicts another class than the target for ``inputs``, and its score of the target."""
    with model_state_preserved(module), torch.inference_mode():
        output = module(inputs)
        return int(output.argmax(dim=1)[0]) != target.index, float(read(output)[0])


def _one(scores: dict[str, MethodScores], method: str) -> MethodScores:
    """The method's scores, randomcam's averaged over its draws."""
    return averaged(list(scores.values())) if len(scores) > 1 else scores[method]
