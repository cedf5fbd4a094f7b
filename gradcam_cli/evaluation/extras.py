"""ARCC, the random-logit test, sMPRT and eMPRT of one method's map on one image (docs/evaluation.md, "ARCC",
"Random logit", "sMPRT and eMPRT"): the maps each needs beyond the image's own, computed once per image through the
evaluator's caches. The formulas are in :mod:`gradcam_cli.evaluation.metrics`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..cam.scores import Cams, method_maps
from ..errors import UsageError
from ..options import EvalOptions
from . import metrics, road
from .draws import sanity_seed
from .plan import with_methods
from .report import MethodScores
from .sanity import fully_randomised
from .shared import Once

CamsOf = Callable[[Explainer, tuple[str, ...], torch.Tensor, int, int], Cams]
"""The evaluator's maps of the methods sharing a pass, on inputs, for a class, with a seed (once per image)."""
PartOf = Callable[[Explainer, tuple[str, ...]], Explainer]
"""The evaluator's explainer like the given one with the given methods alone (built once)."""
MPRT_NOISE = 0.1
"""sMPRT's noise: its standard deviation as a fraction of the input's range of values (Quantus' default)."""
MPRT_STAGE = 1000
"""The stage number whose :func:`~gradcam_cli.evaluation.draws.sanity_seed` seeds the random methods on the fully
randomised model (never one of the sanity cascade's)."""
EXTRAS = {"arcc": "higher", "random_logit": "lower", "smprt": "lower", "emprt": "higher"}
"""The figures kept in :attr:`MethodScores.extra`, and which way is better."""


def noisy_copies(image: torch.Tensor, samples: int, seed: int) -> torch.Tensor:
    """sMPRT's ``samples`` copies of the (3, ...) ``image``: N(0, sd^2) noise added, ``sd`` :data:`MPRT_NOISE` times
    the image's range, drawn from ``seed``; the last copy is the image itself (as Quantus' ``SmoothMPRT``)."""
    if samples < 1:
        raise ValueError("sMPRT needs at least one copy")
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(samples, *image.shape, generator=generator, dtype=torch.float64)
    noise[-1] = 0.0
    spread = MPRT_NOISE * float(image.max() - image.min())
    return image + (spread * noise).to(image.device, image.dtype)


def other_class(target: int, classes: int, seed: int) -> int:
    """The random-logit test's class: drawn uniformly from the ``classes`` other than ``target``, from ``seed``."""
    drawn = int(torch.randint(classes - 1, (1,), generator=torch.Generator().manual_seed(seed)))
    return drawn if drawn < target else drawn + 1


class ExtraFigures:
    """What ``arcc``, ``random_logit`` and ``mprt`` of :class:`EvalOptions` ask of one image, per method."""

    def __init__(self, explainer: Explainer, options: EvalOptions, cams: CamsOf, part: PartOf, once: Once) -> None:
        self.explainer, self.options = explainer, options
        self._cams, self._part, self._once = cams, part, once
        self.seed = explainer.options.perturbation.seed
        self.randomised: Explainer | None = None
        if options.mprt:
            if options.mprt_samples < 1:
                raise UsageError("--mprt-samples must be at least 1")
            module = fully_randomised(explainer.model.module, options.seed, explainer.device)
            self.randomised = with_methods(explainer, explainer.chosen.methods, module)
        self._classes: int | None = None

    def measure(
        self,
        inputs: torch.Tensor,
        target: Prediction,
        methods: tuple[str, tuple[str, ...]],
        saliency: torch.Tensor,
        scores: MethodScores,
    ) -> dict[str, float]:
        """The figures asked for of ``methods`` (the method, and those sharing its pass) whose map of the (1, 3, ...)
        ``inputs`` is ``saliency``; ``scores``: its figures so far (ARCC reads their ROAD)."""
        method, group = methods
        out = {}
        if self.options.arcc:
            out["arcc"] = self._arcc(inputs, target, method, saliency, scores)
        if self.options.random_logit:
            out["random_logit"] = self._random_logit(inputs, target, methods, saliency)
        if self.randomised is not None:
            size = tuple(inputs.shape[2:])
            cams = self._cams(self.randomised, group, inputs, target.index, sanity_seed(self.seed, MPRT_STAGE))
            out["emprt"] = metrics.efficient_mprt(saliency, method_maps(method, cams[method][0], size)[0])
            trained = self._smoothed(self.explainer, group, inputs, target.index, self.seed)[method]
            noise = self._smoothed(self.randomised, group, inputs, target.index, sanity_seed(self.seed, MPRT_STAGE))
            out["smprt"] = metrics.smooth_mprt(trained, noise[method])
        return out

    def _arcc(
        self, inputs: torch.Tensor, target: Prediction, method: str, saliency: torch.Tensor, scores: MethodScores
    ) -> float:
        """ARCC from the map's mean, its coherency (the method's map of the input times the map, for the same
        class) and ROAD at :data:`~gradcam_cli.evaluation.metrics.ARCC_FRACTIONS`."""
        masked = inputs * saliency.to(inputs.device, inputs.dtype)
        part = self._part(self.explainer, (method,))
        seed = sanity_seed(self.seed, 0)  # a random method's fresh draw, as the sanity check's redraw
        cams = self._once(("arcc", method), lambda: part.compute_targets(masked, target.index, 1, seed=seed)[1])
        remapped = method_maps(method, cams[method][0], tuple(inputs.shape[2:]))[0]
        at = [road.ROAD_FRACTIONS.index(fraction) for fraction in metrics.ARCC_FRACTIONS]
        road_score = road.combined([scores.road_morf[i] for i in at], [scores.road_lerf[i] for i in at])
        complexity = float(saliency.detach().double().abs().mean())
        return metrics.arcc(complexity, metrics.coherency(saliency, remapped), road_score)

    def _random_logit(
        self, inputs: torch.Tensor, target: Prediction, methods: tuple[str, tuple[str, ...]], saliency: torch.Tensor
    ) -> float:
        """SSIM of the map with the same method's map of a random other class (drawn from ``seed`` and the class
        explained)."""
        method, group = methods
        if self._classes is None:
            probabilities = self._part(self.explainer, group).compute(inputs, target.index, 1)[0]
            self._classes = int(probabilities.shape[-1])
        if self._classes < 2:
            return float("nan")
        other = other_class(target.index, self._classes, self.options.seed + target.index)
        part = self._part(self.explainer, group)
        _, _, cams = self._once(("class", group, other), lambda: part.compute(inputs, other, 1))
        return metrics.ssim(saliency, method_maps(method, cams[method][0], tuple(inputs.shape[2:]))[0])

    def _smoothed(
        self, explainer: Explainer, group: tuple[str, ...], inputs: torch.Tensor, target: int, seed: int
    ) -> dict[str, torch.Tensor]:
        """Each of ``group``'s (N, ...) maps of sMPRT's :func:`noisy_copies` of the input, explained by
        ``explainer`` (the trained or the randomised model) ``batch_size`` copies at a time."""

        def work() -> dict[str, torch.Tensor]:
            copies = noisy_copies(inputs[0], self.options.mprt_samples, self.options.seed)
            part, size, step = self._part(explainer, group), tuple(inputs.shape[2:]), self.options.batch_size
            maps: dict[str, list[torch.Tensor]] = {method: [] for method in group}
            for start in range(0, len(copies), step):
                _, _, cams = part.compute(copies[start : start + step], target, 1, seed=seed)
                for method in group:
                    maps[method].append(method_maps(method, cams[method][0], size))
            return {method: torch.cat(stack) for method, stack in maps.items()}

        return self._once(("smoothed", id(explainer), group, target), work)
