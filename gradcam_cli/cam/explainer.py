"""The library API: explain images (or ready-made input batches) with one or more CAM methods.

Classifiers, detectors and segmenters alike: what is differentiated for each comes from :mod:`gradcam_cli.cam.scores`.

>>> from gradcam_cli import Explainer, load_model, overlay
>>> explainer = Explainer(load_model("efficientnet_lite0"))
>>> result = explainer.explain("cat.jpg")
>>> result.predictions[0].name, result.explanations[0].saliency.shape
('Egyptian cat', torch.Size([300, 451]))
>>> overlay(result).save("cat_gradcam.png")
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch import nn

from ..errors import UsageError
from ..io.images import load_image, to_input_tensor, to_pixel_tensor, to_rgb
from ..models.folding import fold_batch_norms
from ..models.labels import resolve_target
from ..models.loading import LoadedModel, load_for_run
from ..options import SCORE_NAMES, TOP_K, ExplainOptions, ModelOptions
from .attention.discovery import AttentionModel, attention_for, head_settings, with_heads
from .explainer_input import CallContext, Chosen, ExplainKeywords, explain_options, explained_model, layer_names
from .layers import DryPasses, forget_tokens, reads_tokens, resolve_layer
from .maps import pad_to_region
from .masked_scores import ProgressCallback
from .methods.needs import ATTENTION_NEEDS
from .methods.registry import METHODS, check_maps, resolve_methods
from .passes import MethodInputs, ViewPass
from .perturbation import check_perturbation, perturbation_settings
from .precision import autocast, check_precision, full_precision, to_float32
from .ranks import check_ranks
from .reshape import spatial
from .results import ImageExplanation, Prediction
from .scores import Cams, Classified, Score, Targets, Viewed
from .smoothing import IDENTITY, augmentations, average_views
from .tasks import ScoreRequest, TaskAdapter, adapter_for
from .untargeted import untargeted_methods

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Explainer:
    """Explain a model's decisions at one or more layers: a classifier's classes, a detector's detections, a
    segmenter's classes (see docs/tasks.md).

    ``model``: a :class:`LoadedModel` (from :func:`load_model`) or any ``nn.Module`` (its task found from its output,
    see :mod:`gradcam_cli.models.tasks`; ``task`` overrides it). ``options``: what to explain, an
    :class:`ExplainOptions` taken whole; or its fields as the arguments and keywords below, which build the same
    :class:`ExplainOptions` (:mod:`gradcam_cli.cam.explainer_input`; ``options`` holds it either way). An explainer
    is not changed once built: ``with_options`` and ``folded`` make others; what differs per call is its argument.
    ``dry_passes``: where the dry pass below is kept and found (:class:`~gradcam_cli.cam.layers.DryPasses`).
    ``layers``: dotted module names; ``None`` picks the last spatial layer (RefineCAM alone: :func:`layer_names`).
    Several layers fuse into one map per method: the mean (RefineCAM: product) of the normalised maps, normalised.
    ``methods``: names from ``METHODS``, or ``all`` (every method that serves the model's task); they share one
    forward pass and one backward pass per target. Methods that read no layer (RISE, occlusion) need none: with only
    them, no layer is chosen, and a model without spatial layers is explained too. ``perturbation``: their settings
    and the seed of their masks and of randomcam's noise (:class:`~gradcam_cli.options.PerturbationOptions`).
    ``device``: where to run; ``None`` keeps the model where it is.
    ``target``: the class to explain in every image, an index or a class name; ``None``: each image's own top
    ``top_k`` classes (detectors: only detections of ``target``; ``top_k`` does not apply).
    ``score``: what a classifier's target is scored by, ``logit``, ``softmax`` or ``sigmoid``. Detectors explain each
    detection scoring at least ``score_threshold``, at most ``max_detections`` per image, and their sum.
    ``aug_smooth``: average over flipped and rescaled inputs; ``eigen_smooth``: first principal component of the
    weighted activations instead of their sum (see :mod:`gradcam_cli.cam.smoothing`). ``score_batch_size``: masked
    inputs (scorecam) or ablated copies (ablationcam) per forward pass; ``progress``: called as
    ``progress(done, total)`` during those forward passes (``None``: silent). ``precision``: ``fp32``, or
    ``bf16``/``fp16`` to run the explained forward pass under autocast (see :mod:`gradcam_cli.cam.precision`; maps
    are computed in float32 either way). A method that does not serve the model's task is refused with a one-line
    UsageError. ``targets``: ``--target`` specs (strings or :class:`~gradcam_cli.targets.TargetSpec`), each explained
    in every image (:mod:`gradcam_cli.cam.targets`, docs/targets.md); ``embedding``: which output is the embedding.
    Building the explainer makes (or finds in ``dry_passes``) one dry pass at the model's input size
    (:func:`gradcam_cli.cam.layers.dry_pass`): it picks the default layer, refuses a layer with a single position
    (``avgpool``) or no spatial grid (``fc``) and an input size too small for the model, each with a one-line
    UsageError, before any image is processed.
    """

    def __init__(
        self,
        model: LoadedModel | nn.Module,
        options: ExplainOptions | str | Sequence[str] | None = None,
        methods: str | Sequence[str] | None = None,
        device: torch.device | str | None = None,
        *,
        task: str | None = None,
        precision: str = "fp32",
        progress: ProgressCallback | None = None,
        dry_passes: DryPasses | None = None,
        **keywords: Unpack[ExplainKeywords],
    ) -> None:
        options = explain_options(options, methods, keywords)
        self.options = options
        """What this explainer explains, whole and as given (what they came to for the model: :attr:`chosen`)."""
        model, unshown = explained_model(model, task, options)
        if device is not None:  # a notebook's model; the command's is on its device from its loading on
            model.module.to(device)
        self.device = next(model.module.parameters(), torch.empty(0)).device
        resolve_methods(list(options.methods), model.task, also=METHODS)  # unknown names fail before the dry pass
        names = list(options.layers)
        resolved = {name: resolve_layer(model.module, name) for name in names}
        self.dry_passes = dry_passes or DryPasses()
        adapter = adapter_for(model)  # a bare module's: a classifier's until its dry pass shows its task
        infos = adapter.dry_pass(self.dry_passes, model, self.device)  # a prompted image's model: none
        if unshown:  # a bare module's task, from the dry pass
            model = model.with_task_shown(infos[0].output_shape if infos and not infos[0].name else None)
            adapter = adapter_for(model)
        self.dry_passes.keep(model, self.device, infos)  # found again by with_options' explainers
        self.model = model
        self.adapter: TaskAdapter = adapter
        """What the model's task does (:mod:`gradcam_cli.cam.tasks`): its score, methods, rows and messages."""
        self.tokens = reads_tokens(model, adapter.tokens)  # whether 3-D layer outputs are tokens (:mod:`.reshape`)
        if not self.tokens:
            forget_tokens(infos)
        chosen, self.attention = self._check(options, check_precision(precision))
        self.request = ScoreRequest(self.device, options, chosen.target, options.targets, chosen.methods)
        self.score: Score = self.adapter.score(model, self.request)
        if options.aug_smooth and not self.adapter.aug_smooth:
            raise UsageError(
                f"--aug-smooth is for classifiers: a {self.adapter.noun}'s targets in a flipped or rescaled view are "
                "other pixels and boxes; run without it"
            )
        choose = partial(self.adapter.chosen_layers, model, infos, names, self.tokens)
        self.chosen = replace(
            chosen, layers=layer_names(choose, model.module, infos, names, chosen.methods, self.adapter.method)
        )
        check_ranks(self.chosen.methods, infos, self.chosen.layers, model.input_spec, options.aug_smooth)
        layers = {name: resolved.get(name) or resolve_layer(model.module, name) for name in self.chosen.layers}
        self.network: tuple[nn.Module, Mapping[str, nn.Module]] = (model.module, layers)
        """The module each pass runs and its explained layers (:meth:`folded`: a copy with batch norms folded)."""
        self.context = CallContext(progress=progress)  # what a call passes with when it is given none
        self.model_options: ModelOptions | None = None  # from_options' (the Ray engine's actors load them again)

    def _check(self, options: ExplainOptions, precision: str) -> tuple[Chosen, AttentionModel | None]:
        """The options checked; what they came to (no layers chosen yet) and the attention the methods read."""
        model, adapter = self.model, self.adapter
        taken = [name for name, method in METHODS.items() if adapter.takes(name, method.tasks, model.module)]
        methods = resolve_methods(list(options.methods), adapter.methods_of, taken, adapter.noun)
        wanted = [name for name in methods if adapter.method(name).needs in ATTENTION_NEEDS]
        attention, methods, left_out = attention_for(model, methods, wanted, options.methods)
        methods, need_target = untargeted_methods(model, options, methods, adapter.takes_targets)
        attention = with_heads(attention, options.attention_heads, methods)
        check_perturbation(options.perturbation)
        if options.score is not None and options.score not in SCORE_NAMES:
            raise UsageError(f"unknown score {options.score!r}; use {', '.join(SCORE_NAMES)}")
        if options.targets and not adapter.takes_targets:
            raise UsageError(f"--target is for classifiers and embedding models; a {adapter.noun} explains its own")
        target = options.target_class
        target = resolve_target(model, target) if isinstance(target, str) else target
        top_k = TOP_K if options.top_k is None else options.top_k
        return Chosen(tuple(methods), tuple(left_out), tuple(need_target), (), target, top_k, precision), attention

    @classmethod
    def from_options(
        cls,
        model: ModelOptions | LoadedModel,
        options: ExplainOptions | None = None,
        *,
        progress: ProgressCallback | None = None,
        dry_passes: DryPasses | None = None,
        device: str | None = None,
    ) -> Explainer:
        """An explainer as the command line builds it: the model loaded from :class:`ModelOptions`, once on its
        device (:func:`~gradcam_cli.models.loading.load_for_run`; ``device``: on this one instead, as the Ray
        engine's driver loads it on its CPU), or a model already loaded, explained as :class:`ExplainOptions` says."""
        options = options or ExplainOptions()
        if not isinstance(model, ModelOptions):
            return cls(model, options, progress=progress, dry_passes=dry_passes)
        loaded = load_for_run(model if device is None else replace(model, device=device))
        return cls(loaded, options, precision=model.precision, progress=progress)._copy(model_options=model)

    def _copy(self, **fields: Any) -> Explainer:
        twin = copy.copy(self)  # this one left as it is, the copy with ``fields`` in place of its own
        vars(twin).update(fields)
        return twin

    def with_options(
        self, module: nn.Module | None = None, progress: ProgressCallback | None = None, **changes: Any
    ) -> Explainer:
        """An explainer like this one with some of its options replaced (``methods=(...)``), ``module`` in place of
        its model's module and ``progress`` in place of its masked passes' progress callback; its layers stay
        those chosen here unless ``layers`` is among them."""
        options = replace(self.options, **({"layers": self.chosen.layers} | changes))
        progress, precision = progress or self.context.progress, self.chosen.precision
        model, passes = (self.model, self.dry_passes) if module is None else (replace(self.model, module=module), None)
        twin = Explainer(model, options, precision=precision, progress=progress, dry_passes=passes)
        kept = options.layers if "layers" not in changes and options.layers else twin.chosen.layers  # not widened
        network = (twin.network[0], {name: twin.network[1][name] for name in kept})
        return twin._copy(chosen=replace(twin.chosen, layers=kept), network=network)

    @property
    def settings(self) -> dict[str, object]:
        """What the task adds to a run record: the task, a classifier's score and targets or a detector's selection,
        and the black-box and attention methods' settings."""
        methods = list(self.chosen.methods)
        settings = perturbation_settings(self.options.perturbation, methods) | head_settings(self.attention, methods)
        return self.adapter.settings(self.model, self.score, self.request, settings)

    @property
    def layer_label(self) -> str:
        """The target layers' names joined with ``+``, as records and reports show them."""
        return self.chosen.layer_label

    def prediction(self, index: int, probability: float) -> Prediction:
        """A :class:`Prediction` with the model's name for class ``index``."""
        return Prediction(index, self.model.class_name(index), probability)

    @contextmanager
    def folded(self) -> Iterator[Explainer]:
        """Within, an explainer like this one with batch norms folded into the convolutions before them (by
        :func:`~gradcam_cli.models.folding.fold_batch_norms`, on a copy of the model dropped on exit): faster, the
        same maps to float32 rounding; where a method reads every layer (FullGrad) or the model does not trace, this
        explainer itself. This one and its model are left as they are."""
        copied = None
        if not any(self.adapter.method(method).reads_every_layer for method in self.chosen.methods):
            copied = fold_batch_norms(self.model.module, list(self.chosen.layers))
        try:
            layers = {name: copied.get_submodule(name) for name in self.chosen.layers} if copied is not None else None
        except AttributeError:  # a layer the traced copy does not hold (one the forward pass never calls)
            layers = None
        if copied is None or layers is None:
            yield self
            return
        yield self._copy(network=(copied, layers))

    def compute(
        self,
        inputs: torch.Tensor,
        target: int | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        context: CallContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, Cams]:
        """Forward and backward passes for a batch of equally sized inputs of a classifier.

        Returns ``(probabilities (N, classes), targets (N, K), cams)`` where ``cams[method][k][l]`` is the coarse
        (N, h, w) map of target ``k`` at layer ``l`` (fullgrad and the guided methods: at the input's size; with
        ``aug_smooth``: the average of the views' maps at the input's size). ``target`` fixes the class for every
        sample; otherwise each sample's own top ``top_k`` classes are explained. Without either, the explainer's
        own ``target`` and ``top_k`` apply. ``seed``: of RISE's masks and randomcam's noise for this call (default:
        ``perturbation.seed``). ``context``: what this call passes with (:class:`CallContext`; default: the
        explainer's ``progress``, plain captures). Detectors and segmenters: :meth:`compute_targets`.
        """
        targets, cams = self.compute_targets(inputs, target, top_k, seed, context)
        if not isinstance(targets, Classified):
            raise UsageError(f"compute() is for classifiers; explain a {self.adapter.noun} with compute_targets()")
        probabilities, chosen = targets.classes()
        return probabilities, chosen, cams

    def compute_targets(
        self,
        inputs: torch.Tensor,
        target: int | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        context: CallContext | None = None,
    ) -> tuple[Targets, Cams]:
        """:meth:`compute` for every task: the targets chosen (:class:`~gradcam_cli.cam.scores.Targets`, whose
        ``results`` make the images' explanations) and the coarse maps, ``cams[method][k][l]``."""
        if target is None and top_k is None:
            target = self.chosen.target
        top_k = top_k or self.chosen.top_k
        context = context or self.context
        inputs = inputs.to(self.device)
        targets, cams = self._compute_view(inputs, context, target, top_k, seed=seed)
        if not self.options.aug_smooth or not isinstance(targets, Viewed):
            return targets, cams
        size = tuple(inputs.shape[-2:])
        views = [(IDENTITY, cams)]
        for view in augmentations(self.model.input_spec.fixed_size is not None)[1:]:
            chosen = targets.in_view()
            views.append((view, self._compute_view(view.apply(inputs), context, chosen=chosen, seed=seed)[1]))
        smoothed = {
            method: [
                [average_views([(view, c[method][k][i]) for view, c in views], size) for i in range(len(maps))]
                for k, maps in enumerate(cams[method])
            ]
            for method in self.chosen.methods
        }
        return targets, smoothed

    def _compute_view(
        self,
        inputs: torch.Tensor,
        context: CallContext,
        target: int | None = None,
        top_k: int = 1,
        chosen: torch.Tensor | None = None,
        seed: int | None = None,
    ) -> tuple[Targets, Cams]:
        """One forward pass, one backward pass per target if a method needs gradients, then every method (with the
        extra passes some take: :mod:`gradcam_cli.cam.passes`)."""
        size = tuple(inputs.shape[2:])  # (H, W); (T, H, W), (L,) of inputs of another rank
        module, layers = self.network
        methods, names = self.chosen.methods, self.chosen.layers
        with self.adapter.pass_settings(self.score), context.capture(module, layers) as capture, ExitStack() as passes:
            capture.watch_attention(self.attention)
            with autocast(self.device, self.chosen.precision):
                output = capture.forward_output(inputs)
            output = full_precision(output)  # scores, activations and gradients in float32 from here on
            targets = self.score.targets(output, inputs, target, top_k, chosen)
            prefix = self.model.prefix_tokens
            raw = capture.activations()
            layouts = {n: spatial(a, size, n, prefix, self.tokens) for n, a in raw.items()}
            activations = {n: to_float32(a) for n, a in layouts.items()}
            chosen_targets = targets.in_view() if isinstance(targets, Viewed) else None

            def layout(name: str, tensor: torch.Tensor) -> torch.Tensor:  # a layer's tensor as the methods take it
                return to_float32(spatial(tensor, size, name, prefix, self.tokens))

            view = ViewPass(
                module,
                capture,
                inputs,
                targets,
                lambda out: self.score.targets(full_precision(out), inputs, target, top_k, chosen_targets),
                {n: (a, 1 if layouts[n] is a else -1) for n, a in raw.items()},
                passes,
                lambda score: {n: layout(n, g) for n, g in capture.gradients(score, retain_graph=True).items()},
                layout,
            )
            extras = MethodInputs(
                view, self.options.score_batch_size, context.progress, self.options.perturbation, seed
            )
            passes.callback(extras.close)
            need_gradients = any(self.adapter.method(method).uses_gradients for method in methods)
            keep_graph = any(self.adapter.method(method).keeps_graph for method in methods)
            cams: Cams = {method: [] for method in methods}
            for k in range(targets.count):
                gradients: dict[str, torch.Tensor | None] = dict.fromkeys(names)
                if need_gradients:
                    score = targets.value(k)
                    if score is None:  # no sample has a k-th target: nothing to differentiate
                        gradients = {n: torch.zeros_like(a) for n, a in activations.items()}
                    else:
                        raw_gradients = capture.gradients(score, retain_graph=keep_graph or k < targets.count - 1)
                        gradients = {n: layout(n, g) for n, g in raw_gradients.items()}
                for name in methods:
                    method = self.adapter.method(name)
                    if method.class_agnostic and k > 0:
                        cams[name].append(cams[name][0])
                        continue
                    if not method.uses_layer:  # one map at the input's resolution, in the frame of the layers' maps
                        computed = method.compute(None, None, *extras.arguments(method, None, k))
                        cams[name].append([pad_to_region(computed.detach().float(), targets.region)])
                        continue
                    cams[name].append(
                        [
                            method.compute(
                                activations[n],
                                gradients[n],
                                *extras.arguments(method, n, k),
                                eigen_smooth=self.options.eigen_smooth,
                            )
                            .detach()
                            .float()
                            for n in names
                        ]
                    )
        check_maps(cams, activations, self.chosen.layers, inputs)  # a plugin's NaN or misshapen map: the input fails
        return targets, cams

    def explain_batch(
        self,
        inputs: torch.Tensor,
        sizes: Sequence[tuple[int, ...]] | None = None,
        target: int | None = None,
        top_k: int | None = None,
        context: CallContext | None = None,
    ) -> list[ImageExplanation]:
        """Explain a batch; each sample's maps are upsampled to its entry in ``sizes`` (default: input size; (T, H, W)
        of clips and volumes, (L,) of sequences); ``context``: what this call passes with (:class:`CallContext`)."""
        targets, cams = self.compute_targets(inputs, target, top_k, context=context)
        sizes = sizes or [tuple(inputs.shape[2:])] * inputs.shape[0]
        return targets.results(cams, sizes, self.model.class_name)

    def explain(
        self, image: str | Path | Image.Image, target: int | None = None, top_k: int | None = None
    ) -> ImageExplanation:
        """Explain one image (path or PIL image, any mode :func:`to_rgb` reads); maps come at the image's own
        resolution."""
        if not isinstance(image, Image.Image):
            image = load_image(image)
        elif image.mode != "RGB":
            image = to_rgb(image)
        batch = to_input_tensor(image, self.model.input_spec).unsqueeze(0)
        result = self.explain_batch(batch, [(image.height, image.width)], target, top_k)[0]
        result.pixels = to_pixel_tensor(image)
        return result
