"""Evaluating saliency maps over many images: faithfulness, ground-truth boxes and the randomisation sanity check.

The protocol (what is perturbed and towards what, how the curves are sampled, which map a box is scored with, the
sanity cascade and its threshold) is described in docs/evaluation.md; this module runs it. The formulas are in
:mod:`gradcam_cli.evaluation.metrics`; boxes are read and matched to images by :mod:`gradcam_cli.evaluation.boxes`;
the scores, their JSON form and the curve plot are in :mod:`gradcam_cli.evaluation.report`.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..cam.scores import Cams, Measured, method_maps
from ..cam.untargeted import NoTargetScore, ask_for_target
from ..errors import UsageError
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage
from ..io.images import load_image, to_input_tensor
from ..models.modes import model_state_preserved
from ..options import EvalOptions
from . import metrics
from .answers import AnswerEvaluator
from .boxes import class_of
from .correlation import correlation_drops
from .draws import RANDOM_METHODS, averaged, random_draws, sanity_seed
from .extras import ExtraFigures
from .images import evaluate_images, report_of, scored_safely
from .perturbed import MetaFigures
from .plan import with_methods
from .report import BLUR_KERNEL, BLUR_SIGMA, STABILITY_SIGMA, BoxScore, EvalReport, ImageScores, MethodScores
from .road import ROAD_FRACTIONS, impute, road_masks
from .sanity import parameterised_modules, randomised_stages, reinitialise
from .scans import ScanEvaluator
from .shared import Once, methods_to_run, pass_groups
from .tasks import TaskEvaluator

__all__ = [
    "AnswerEvaluator",
    "EvalOptions",
    "EvalReport",
    "Evaluator",
    "parameterised_modules",
    "reinitialise",
]

Inputs = Sequence[InputImage | str | Path]
Boxes = Sequence[GroundTruthBox] | None
Tick = Callable[[], Any] | None
Told = Callable[[ImageScores], Any] | None
Job = tuple[Any, ...]
"""One perturbed image to score: ``("baseline",)``, ``("blurred",)`` or ``(method, kind, step)`` (kinds: deletion,
insertion, masked, and with ``--road`` road, whose step indexes :func:`_road_images`); faithfulness correlation's
``("subset", run)``."""


class Evaluator:
    """Run the evaluation protocol (docs/evaluation.md) with one :class:`Explainer` over many images."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        if self.options.steps < 2:
            raise UsageError("--steps must be at least 2")
        if self.options.batch_size < 1:
            raise UsageError("--batch-size must be at least 1")
        if len(explainer.options.targets) > 1:
            raise UsageError("gradcam eval scores one target per image; give one --target")
        if isinstance(explainer.score, NoTargetScore):  # rollout, attention on an embedding model: no score to follow
            give = ask_for_target(explainer.model)
            raise UsageError(f"gradcam eval follows a target's score; {explainer.model.name} has none: give {give}")
        if self.options.stability and explainer.options.targets:
            raise UsageError("--stability measures a class's map; run it without --target")
        if self.options.random_logit and explainer.options.targets:
            raise UsageError("--random-logit compares a class's map with another class's; run it without --target")
        if self.options.arcc and not self.options.road:
            self.options = replace(self.options, road=True)  # ARCC reads ROAD
        if self.options.meta and explainer.options.targets:
            raise UsageError(
                "--meta compares a class's figures under noise and model randomisation; run it without --target"
            )
        if self.options.meta and not self.options.sanity:
            self.options = replace(self.options, sanity=True)  # its model test reads the cascade's last model
        self.sanity_modules: list[str] = []
        self.randomised: list[Explainer] = []
        self.redraw: Explainer | None = None
        self.seed = explainer.options.perturbation.seed  # the maps' own seed (RISE's masks, randomcam's noise)
        self.on_method: Callable[[str], Any] | None = None
        self.on_result: Callable[[ImageScores], Any] | None = None
        self.done: Mapping[str, ImageScores] = {}
        self._groups = pass_groups(explainer.chosen.methods)
        self._parts: dict[tuple[int, tuple[str, ...]], Explainer] = {}
        self._once = Once()
        self._extras = ExtraFigures(explainer, self.options, self._cams, self._part, self._once)
        self._module: nn.Module | None = None  # the model the scores are read with, where not the explainer's
        self._meta = (
            MetaFigures(explainer, self.options.seed, self._scored_maps, self._once) if self.options.meta else None
        )
        if self.options.sanity:
            self._build_randomised()

    def _build_randomised(self) -> None:
        """One explainer per cascade stage: stage k has the top k parameterised modules re-initialised."""
        self.sanity_modules, stages = randomised_stages(
            self.explainer.model.module, self.options, self.explainer.device
        )
        for module in stages:
            self.randomised.append(with_methods(self.explainer, self.explainer.chosen.methods, module))
        random = [method for method in self.explainer.chosen.methods if method in RANDOM_METHODS]
        self.redraw = with_methods(self.explainer, random) if random else None

    def run(
        self,
        images: Inputs,
        boxes: Boxes = None,
        on_image: Tick = None,
        on_result: Told = None,
        on_method: Callable[[str], Any] | None = None,
        done: Mapping[str, ImageScores] | None = None,
    ) -> EvalReport:
        """Evaluate every image; ``on_image`` is called once per image and ``on_method(name)`` as each method's
        work on an image begins (for progress bars), ``on_result`` with each (image, method)'s scores as they are
        ready, and with each failed image (``gradcam eval --rank``'s rows file, :mod:`.rows`). ``done``: image path
        -> the methods already finished on it (``--skip-existing``), kept, not computed again."""
        self.on_method, self.on_result, self.done = on_method, on_result, done or {}
        results, unmatched = self._inputs(images, boxes, on_image, on_result)
        return report_of(self.explainer, self.options, results, unmatched, self.sanity_modules)

    def _inputs(self, images: Inputs, boxes: Boxes, on_image: Tick, on_result: Told) -> tuple[list[ImageScores], int]:
        """Each input's figures (:meth:`run`), and how many boxes name no input."""
        return evaluate_images(self.explainer, images, boxes, self.evaluate_image, on_image, False, on_result)

    def evaluate_image(self, path: Path, boxes: Sequence[GroundTruthBox] = ()) -> ImageScores:
        """All figures for one image; a failure to read or run it is returned as ``error``, not raised."""
        return scored_safely(path, lambda: self._evaluate(path, boxes))

    def _part(self, explainer: Explainer, methods: tuple[str, ...]) -> Explainer:
        """``explainer`` (the trained model's or a cascade stage's) with ``methods`` alone, built once."""
        key = (id(explainer), methods)
        if key not in self._parts:
            self._parts[key] = with_methods(explainer, methods)
        return self._parts[key]

    def _cams(
        self, explainer: Explainer, methods: tuple[str, ...], inputs: torch.Tensor, target: int, seed: int
    ) -> Cams:
        """The maps of ``methods`` (those sharing a pass) on ``inputs`` for class ``target``, computed once per
        image."""
        part = self._part(explainer, methods)
        key = ("cams", id(explainer), methods, target, seed)
        return self._once(key, lambda: part.compute_targets(inputs, target, 1, seed=seed)[1])

    def _evaluate(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        """One method after another (so that progress advances per method), each scored, checked for stability and
        through the cascade, and handed to ``on_result`` before the next; the methods that share passes
        (:mod:`.shared`) are explained once for all of them, as the first of them begins."""
        picture = load_image(path)
        inputs = to_input_tensor(picture, self.explainer.model.input_spec).unsqueeze(0).to(self.explainer.device)
        return self._scored(str(path), inputs, (picture.height, picture.width), boxes)

    def _scored(
        self, name: str, inputs: torch.Tensor, size: tuple[int, int], boxes: Sequence[GroundTruthBox]
    ) -> ImageScores:
        """:meth:`_evaluate` of the (1, 3, ...) network input of the image (or clip) ``name``, ``size`` its
        (height, width)."""
        done = self.done.get(name)
        scores: dict[str, MethodScores] = {}
        target: Prediction | None = done.target if done is not None else None
        self._once.clear()
        for method in methods_to_run(self.explainer.chosen.methods, done, scores, self.on_method):
            group = self._part(self.explainer, self._groups[method])
            explained, cams, read = self._once(
                ("explained", self._groups[method]), partial(self._explained, inputs, group)
            )
            target = target or explained
            scores[method] = self._method_scores(inputs, target, method, cams, read)
            if boxes:
                self._score_boxes(method, scores[method], inputs, size, boxes, target, cams)
            if self.on_result is not None:
                self.on_result(ImageScores(name, target, {method: scores[method]}))
        self._once.clear()
        assert target is not None
        return ImageScores(name, target, scores)

    def _method_scores(
        self, inputs: torch.Tensor, target: Prediction, method: str, cams: Cams, read: Callable[[object], torch.Tensor]
    ) -> MethodScores:
        """One method's figures on one image: faithfulness (randomcam's averaged over its draws), faithfulness
        correlation, sparseness, stability, and its maps' agreement through the cascade."""
        input_size = tuple(inputs.shape[2:])  # (H, W) of an image, (T, H, W) of a clip
        maps = self._maps(method, cams, inputs)
        scores = self._scored_maps(inputs[0], target, maps, read)
        result = averaged([scores[name] for name in maps]) if len(maps) > 1 else scores[method]
        saliency, group = maps[method], self._groups[method]
        if self.options.stability:
            result.stability = self._stability(inputs, target.index, saliency, method)
        if self.redraw is not None and method in self.redraw.chosen.methods:  # a random method's agreement with itself
            random = tuple(m for m in group if m in self.redraw.chosen.methods)
            redrawn = self._cams(self.explainer, random, inputs, target.index, sanity_seed(self.seed, 0))
            result.sanity_redraw = metrics.spearman(saliency, method_maps(method, redrawn[method][0], input_size)[0])
        for stage, randomised in enumerate(self.randomised, 1):  # fresh masks and noise: never the trained model's
            random_cams = self._cams(randomised, group, inputs, target.index, sanity_seed(self.seed, stage))
            result.sanity.append(metrics.spearman(saliency, method_maps(method, random_cams[method][0], input_size)[0]))
        if self._meta is not None:  # the cascade's last model: its maps computed above
            stage = len(self.randomised)
            cams = self._cams(self.randomised[-1], group, inputs, target.index, sanity_seed(self.seed, stage))
            last = (self.randomised[-1].model.module, self._maps(method, cams, inputs))
            result.meta_input, result.meta_model = self._meta.measure(inputs, target, (method, maps), read, last)
        result.extra = self._extras.measure(inputs, target, (method, group), saliency, scores[method])
        return result

    def _maps(self, method: str, cams: Cams, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The method's map of the (1, C, ...) ``inputs``; randomcam's, with its other draws (the floor: its figures
        averaged over several draws)."""
        size = tuple(inputs.shape[2:])
        maps = {method: method_maps(method, cams[method][0], size)[0]}
        if method == "randomcam":
            for d, cam in enumerate(random_draws(cams, inputs, self.seed), 1):
                maps[f"randomcam#{d}"] = method_maps(method, cam, size)[0]
        return maps

    def _scored_maps(
        self,
        image: torch.Tensor,
        target: Prediction,
        maps: dict[str, torch.Tensor],
        read: Callable[[object], torch.Tensor],
        module: nn.Module | None = None,
        key: tuple[object, ...] = (),
    ) -> dict[str, MethodScores]:
        """Each map's figures on the (C, ...) ``image``: its curves, ROAD, faithfulness correlation (its subsets drawn
        once per image and ``key``), sparseness and complexity, the scores read with ``module`` (None: the
        explainer's model)."""
        self._module = module
        try:
            scores = self._perturbation_scores(image, target, maps, read)
            scored = partial(self._probabilities, read=read)
            drops = partial(correlation_drops, image, target.probability, self.options, scored)
            correlation = self._once(("correlation", *key), drops)  # the same subsets for every method
        finally:
            self._module = None
        for name, saliency in maps.items():
            scores[name].gini, scores[name].entropy = metrics.gini(saliency), metrics.entropy(saliency)
            if correlation is not None:
                scores[name].faithfulness_correlation = metrics.faithfulness_correlation(saliency, *correlation)
        return scores

    def _explained(
        self, inputs: torch.Tensor, explainer: Explainer
    ) -> tuple[Prediction, Cams, Callable[[object], torch.Tensor]]:
        """The target explained in one image, its maps, and how its score is read from the model's output for a
        batch of perturbed copies: a class's probability (softmax; sigmoid with ``--score sigmoid``), or a
        ``--target``'s own score (a similarity's cosine; a class's probability; docs/targets.md)."""
        targets, cams = explainer.compute_targets(inputs, explainer.chosen.target, 1)
        assert isinstance(targets, Measured)
        prediction, read = targets.measured(explainer.score, inputs, explainer.model.class_name)
        return prediction, cams, read

    def _stability(self, inputs: torch.Tensor, target: int, saliency: torch.Tensor, method: str) -> list[float]:
        """The map change ||m' - m|| / ||m|| of ``method`` on ``stability_samples`` noisy copies of the (1, 3, H, W)
        input (N(0, STABILITY_SIGMA^2) added in the network's input space, drawn from ``seed``), keeping only copies
        whose top class is still ``target`` (the copies explained once for the methods sharing ``method``'s pass)."""
        generator = torch.Generator().manual_seed(self.options.seed)
        noise = torch.randn(self.options.stability_samples, *inputs.shape[1:], generator=generator)
        noisy = inputs + STABILITY_SIGMA * noise.to(inputs.device, inputs.dtype)
        group = self._part(self.explainer, self._groups[method])
        probabilities, _, cams = self._once(
            ("stability", self._groups[method]), partial(group.compute, noisy, target, 1)
        )
        kept = (probabilities.argmax(dim=1) == target).nonzero().flatten().tolist()
        noisy_maps = method_maps(method, cams[method][0], tuple(inputs.shape[2:]))
        return [metrics.relative_change(saliency, noisy_maps[i]) for i in kept]

    def _perturbation_scores(
        self,
        image: torch.Tensor,
        target: Prediction,
        maps: dict[str, torch.Tensor],
        read: Callable[[object], torch.Tensor],
    ) -> dict[str, MethodScores]:
        """Deletion and insertion curves and the masked-image probability for every method, batched."""
        import torchvision.transforms.functional as TF

        steps = self.options.steps
        counts = metrics.step_counts(image[0].numel(), steps)  # the pixels of an image, the voxels of a clip
        baseline = torch.zeros_like(image)
        blurred: torch.Tensor = TF.gaussian_blur(image, [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA])
        ranks = {method: metrics.importance_ranks(saliency) for method, saliency in maps.items()}
        roads = (
            {method: self._road_images(image, saliency) for method, saliency in maps.items()}
            if self.options.road
            else {}
        )

        def build(job: Job) -> torch.Tensor:
            if job[0] == "baseline":
                return baseline
            if job[0] == "blurred":
                return blurred
            method, kind, k = job
            if kind == "masked":
                return image * maps[method]
            if kind == "road":
                return roads[method][k]
            perturbed = ranks[method] < counts[k]
            if kind == "deletion":
                return torch.where(perturbed, baseline, image)
            return torch.where(perturbed, image, blurred)

        jobs: list[Job] = [("baseline",), ("blurred",)]
        for method in maps:
            jobs += [(method, kind, k) for kind in ("deletion", "insertion") for k in range(1, steps)]
            jobs.append((method, "masked", 0))
            jobs += [(method, "road", k) for k in range(2 * len(ROAD_FRACTIONS) if self.options.road else 0)]
        scores = dict(zip(jobs, self._probabilities(jobs, build, read), strict=True))
        result = {}
        for method in maps:
            deletion = [scores[(method, "deletion", k)] for k in range(1, steps)]
            insertion = [scores[(method, "insertion", k)] for k in range(1, steps)]
            result[method] = MethodScores(
                deletion=[target.probability, *deletion, scores[("baseline",)]],
                insertion=[scores[("blurred",)], *insertion, target.probability],
                masked_probability=scores[(method, "masked", 0)],
            )
            if self.options.road:
                fractions = len(ROAD_FRACTIONS)
                result[method].road_morf = [scores[(method, "road", k)] for k in range(fractions)]
                result[method].road_lerf = [scores[(method, "road", fractions + k)] for k in range(fractions)]
        return result

    def _road_images(self, image: torch.Tensor, saliency: torch.Tensor) -> torch.Tensor:
        """ROAD's perturbed copies of one (3, H, W) image: the pixels of each MoRF mask, then of each LeRF mask,
        removed by noisy linear imputation (:mod:`gradcam_cli.evaluation.road`), the noise seeded by ``--seed``."""
        morf, lerf = road_masks(saliency)
        removed = torch.cat([morf, lerf])
        generator = torch.Generator(device=image.device).manual_seed(self.options.seed)
        return impute(image.expand(removed.shape[0], *image.shape), removed, generator=generator)

    def _probabilities(
        self, jobs: list[Job], build: Callable[[Job], torch.Tensor], read: Callable[[object], torch.Tensor]
    ) -> Iterator[float]:
        """The target's score for each job's image (:meth:`_explained`), forwarded ``batch_size`` images at a
        time."""
        module = self._module or self.explainer.model.module
        size = self.options.batch_size
        with model_state_preserved(module), torch.inference_mode():
            for start in range(0, len(jobs), size):
                batch = torch.stack([build(job) for job in jobs[start : start + size]])
                yield from read(module(batch)).float().tolist()

    def _score_boxes(
        self,
        method: str,
        scores: MethodScores,
        inputs: torch.Tensor,
        size: tuple[int, int],
        boxes: Sequence[GroundTruthBox],
        target: Prediction,
        cams: Cams,
    ) -> None:
        """``method``'s pointing game and energy per box class, on maps at the original image's resolution (another
        class's maps explained once for the methods sharing ``method``'s pass)."""
        labels = list(dict.fromkeys(box.label for box in boxes))
        for label in labels:
            group = [box.box for box in boxes if box.label == label]
            explained, group_cams = target, cams
            class_index = class_of(label, self.explainer.model.categories, bool(self.explainer.options.targets))
            if class_index is not None and class_index != target.index:
                part = self._part(self.explainer, self._groups[method])
                probabilities, _, group_cams = self._once(
                    ("class", self._groups[method], class_index), partial(part.compute, inputs, class_index, 1)
                )
                explained = self.explainer.prediction(class_index, float(probabilities[0, class_index]))
            saliency = method_maps(method, group_cams[method][0], size)[0]
            scores.boxes.append(
                BoxScore(
                    label,
                    explained,
                    metrics.pointing_hit(saliency, group, self.options.tolerance),
                    metrics.energy_inside(saliency, group),
                )
            )


AnyEvaluator = Evaluator | TaskEvaluator | AnswerEvaluator | ScanEvaluator
"""Every task's evaluator: each runs over many images into an :class:`EvalReport`."""
