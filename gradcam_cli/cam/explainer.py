"""The library API: explain images (or ready-made input batches) with one or more CAM methods.

>>> from gradcam_cli import Explainer, load_model
>>> explainer = Explainer(load_model("efficientnet_lite0"))
>>> result = explainer.explain("cat.jpg")
>>> result.predictions[0].name, result.explanations[0].saliency.shape
('Egyptian cat', torch.Size([300, 451]))
>>> result.overlay().save("cat_gradcam.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from ..errors import UsageError, suggest
from ..io.images import InputSpec, load_image, to_input_tensor, to_pixel_tensor, to_rgb
from ..models.devices import resolve_device
from ..models.labels import resolve_target
from ..models.loading import LoadedModel, load_model
from ..options import ExplainOptions, ModelOptions
from .engine import LayerCapture
from .layers import check_layers, default_layer, dry_pass, resolve_layer
from .maps import to_image_maps
from .methods import METHODS, SCORECAM_BATCH_SIZE, MaskedScores, ProgressCallback
from .reshape import spatial
from .results import TOP_PREDICTIONS, Explanation, ImageExplanation, Prediction
from .smoothing import IDENTITY, augmentations, average_views


class Explainer:
    """Explain a classifier's decisions at one or more layers.

    ``model``: a :class:`LoadedModel` (from :func:`load_model`) or any ``nn.Module`` classifier.
    ``layers``: dotted module names; ``None`` picks the last spatial layer. Several layers fuse into one map per
    method: the mean of the per-layer maps, each normalised to [0, 1], normalised again.
    ``methods``: names from ``METHODS``; they share one forward pass and one backward pass per target.
    ``device``: where to run; ``None`` keeps the model where it is.
    ``target``: the class to explain in every image, an index or a class name; ``None``: each image's own top
    ``top_k`` classes.
    ``aug_smooth``: average over flipped and rescaled inputs; ``eigen_smooth``: first principal component of the
    weighted activations instead of their sum (see :mod:`gradcam_cli.cam.smoothing`). ``score_batch_size``: masked
    inputs per forward pass in scorecam; ``progress``: called as ``progress(done, total)`` during scorecam's
    forward passes (``None``: silent).
    Layers whose output is channel-last (Swin) or a token sequence (ViT) are reshaped to (N, C, h, w) first.
    Building the explainer makes one dry pass at the model's input size (see :func:`gradcam_cli.cam.layers.dry_pass`):
    it picks the default layer, refuses a layer with a single position (``avgpool``) or no spatial grid (``fc``), and
    an input size too small for the model, each with a one-line UsageError, before any image is processed.
    """

    def __init__(
        self,
        model: LoadedModel | nn.Module,
        layers: str | Sequence[str] | None = None,
        methods: str | Sequence[str] = "gradcam",
        device: torch.device | str | None = None,
        *,
        target: int | str | None = None,
        top_k: int = 1,
        aug_smooth: bool = False,
        eigen_smooth: bool = False,
        score_batch_size: int = SCORECAM_BATCH_SIZE,
        progress: ProgressCallback | None = None,
    ) -> None:
        if isinstance(model, nn.Module):
            model = LoadedModel(model, type(model).__name__, "custom", None, InputSpec())
        self.model = model
        if device is not None:
            model.module.to(device)
        self.device = next(model.module.parameters(), torch.empty(0)).device
        self.methods = [methods] if isinstance(methods, str) else list(methods)
        for method in self.methods:
            if method not in METHODS:
                raise UsageError(f"unknown method {method!r}.{suggest(method, METHODS)}")
        self.target = resolve_target(model, target) if isinstance(target, str) else target
        self.top_k = top_k
        names = [layers] if isinstance(layers, str) else list(layers or [])
        resolved = {name: resolve_layer(model.module, name) for name in names}
        infos = dry_pass(model, self.device)
        check_layers(model.module, infos, names)
        self.layer_names = names or [default_layer(model.module, infos)]
        self.layers = resolved or {name: resolve_layer(model.module, name) for name in self.layer_names}
        self.layer_calls: dict[str, int] = {}
        self.aug_smooth = aug_smooth
        self.eigen_smooth = eigen_smooth
        self.score_batch_size = score_batch_size
        self.progress = progress

    @classmethod
    def from_options(
        cls,
        model: ModelOptions | LoadedModel,
        options: ExplainOptions | None = None,
        *,
        progress: ProgressCallback | None = None,
    ) -> Explainer:
        """An explainer as the command line builds it: the model loaded (and moved to its device) from
        :class:`ModelOptions`, or a model already loaded, explained as :class:`ExplainOptions` says."""
        options = options or ExplainOptions()
        device = None
        if isinstance(model, ModelOptions):
            device = resolve_device(model.device)
            model = load_model(model)
        return cls(
            model,
            list(options.layers) or None,
            list(options.methods),
            device,
            target=options.target_class,
            top_k=options.top_k,
            aug_smooth=options.aug_smooth,
            eigen_smooth=options.eigen_smooth,
            progress=progress,
        )

    @property
    def layer_label(self) -> str:
        """The target layers' names joined with ``+``, as records and reports show them."""
        return "+".join(self.layer_names)

    def prediction(self, index: int, probability: float) -> Prediction:
        """A :class:`Prediction` with the model's name for class ``index``."""
        return Prediction(index, self.model.class_name(index), probability)

    def compute(
        self, inputs: torch.Tensor, target: int | None = None, top_k: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[list[torch.Tensor]]]]:
        """Forward and backward passes for a batch of equally sized inputs.

        Returns ``(probabilities (N, classes), targets (N, K), cams)`` where ``cams[method][k][l]`` is the coarse
        (N, h, w) map of target ``k`` at layer ``l`` (with ``aug_smooth``: the average of the views' maps at the
        input's size). ``target`` fixes the class for every sample; otherwise each sample's own top ``top_k``
        classes are explained. Without either, the explainer's own ``target`` and ``top_k`` apply.
        """
        if target is None and top_k is None:
            target = self.target
        top_k = top_k or self.top_k
        inputs = inputs.to(self.device)
        probabilities, targets, cams = self._compute_view(inputs, target, top_k)
        if not self.aug_smooth:
            return probabilities, targets, cams
        size = tuple(inputs.shape[-2:])
        views = [(IDENTITY, cams)]
        for view in augmentations(self.model.input_spec.fixed_size is not None)[1:]:
            views.append((view, self._compute_view(view.apply(inputs), targets=targets)[2]))
        smoothed = {
            method: [
                [average_views([(view, c[method][k][i]) for view, c in views], size) for i in range(len(self.layers))]
                for k in range(targets.shape[1])
            ]
            for method in self.methods
        }
        return probabilities, targets, smoothed

    def _compute_view(
        self, inputs: torch.Tensor, target: int | None = None, top_k: int = 1, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[list[torch.Tensor]]]]:
        """One forward pass, one backward pass per target if a method needs gradients, then every method."""
        size = tuple(inputs.shape[-2:])
        with LayerCapture(self.model.module, self.layers) as capture:
            logits = capture.forward(inputs)
            self.layer_calls = capture.calls()
            if targets is None:
                targets = self._targets(logits, target, top_k)
            prefix = self.model.prefix_tokens
            activations = {n: spatial(a, size, n, prefix) for n, a in capture.activations().items()}
            need_gradients = any(METHODS[method].uses_gradients for method in self.methods)
            cams: dict[str, list[list[torch.Tensor]]] = {method: [] for method in self.methods}
            for k in range(targets.shape[1]):
                gradients: dict[str, torch.Tensor | None] = dict.fromkeys(self.layer_names)
                if need_gradients:
                    score = logits.gather(1, targets[:, k : k + 1]).sum()
                    raw = capture.gradients(score, retain_graph=k < targets.shape[1] - 1)
                    gradients = {n: spatial(g, size, n, prefix) for n, g in raw.items()}
                for name in self.methods:
                    method = METHODS[name]
                    if method.class_agnostic and k > 0:
                        cams[name].append(cams[name][0])
                        continue
                    extra: tuple[MaskedScores, ...] = ()
                    if method.uses_model:
                        extra = (
                            MaskedScores(
                                capture.forward_unhooked, inputs, targets[:, k], self.score_batch_size, self.progress
                            ),
                        )
                    cams[name].append(
                        [
                            method.compute(activations[n], gradients[n], *extra, eigen_smooth=self.eigen_smooth)
                            .detach()
                            .float()
                            for n in self.layer_names
                        ]
                    )
            probabilities = logits.detach().float().softmax(dim=1)
        return probabilities, targets, cams

    def explain_batch(
        self,
        inputs: torch.Tensor,
        sizes: Sequence[tuple[int, int]] | None = None,
        target: int | None = None,
        top_k: int | None = None,
    ) -> list[ImageExplanation]:
        """Explain a batch; each sample's maps are upsampled to its entry in ``sizes`` (default: input size)."""
        probabilities, targets, cams = self.compute(inputs, target, top_k)
        sizes = sizes or [(inputs.shape[-2], inputs.shape[-1])] * inputs.shape[0]
        top_p, top_i = probabilities.topk(min(TOP_PREDICTIONS, probabilities.shape[1]), dim=1)
        results = []
        for i, size in enumerate(sizes):
            predictions = [self.prediction(int(c), float(p)) for p, c in zip(top_p[i], top_i[i], strict=True)]
            explanations = []
            for k in range(targets.shape[1]):
                class_index = int(targets[i, k])
                chosen = self.prediction(class_index, float(probabilities[i, class_index]))
                for method in self.methods:
                    saliency = to_image_maps([cam[i : i + 1] for cam in cams[method][k]], size)[0]
                    explanations.append(Explanation(method, chosen, saliency))
            results.append(ImageExplanation(predictions, explanations))
        return results

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

    def _targets(self, logits: torch.Tensor, target: int | None, top_k: int) -> torch.Tensor:
        classes = logits.shape[1]
        if target is not None:
            if not 0 <= target < classes:
                raise UsageError(f"target class {target} is out of range: the model has {classes} classes")
            return torch.full((logits.shape[0], 1), target, dtype=torch.long, device=logits.device)
        if not 1 <= top_k <= classes:
            raise UsageError(f"--top-k must be between 1 and {classes}")
        return logits.detach().topk(top_k, dim=1).indices
