"""The third argument of the methods that need more than one layer's activations and gradients, one builder per
:class:`~gradcam_cli.cam.methods.needs.Need` (:attr:`gradcam_cli.cam.methods.CamMethod.needs`), built for one view of
a batch while its :class:`~gradcam_cli.cam.engine.LayerCapture` is open:

- Score-CAM: a :class:`~gradcam_cli.cam.masked_scores.MaskedScores` (masked inputs, no autograd);
- AblationCAM: an :class:`~gradcam_cli.cam.ablation.AblatedScores` (the layer's output with one channel zeroed);
- guided backpropagation and Guided Grad-CAM: the target's guided input gradient, from one
  :class:`~gradcam_cli.cam.guided.GuidedPass` per view, backpropagated once per target;
- FullGrad: the target's :class:`~gradcam_cli.cam.fullgrad.FullGradients`, from one
  :class:`~gradcam_cli.cam.fullgrad.FullGradPass` per view, backpropagated once per target;
- Finer-CAM: each layer's gradient of the target's Finer-CAM score (:mod:`gradcam_cli.cam.finer`), one more
  backward pass through the capture's own graph per target;
- ShapleyCAM: the layer's Hessian-vector product H A for the target
  (:meth:`~gradcam_cli.cam.engine.LayerCapture.hessian_vector_products`, once per target for every layer);
- randomcam: the seeds of its noise, one per image (:func:`~gradcam_cli.cam.methods.random.image_seeds`);
- RISE and occlusion: a :class:`~gradcam_cli.cam.perturbation.MaskedPasses` (masked inputs, no autograd), with the
  masks' seed;
- D-RISE: one :class:`~gradcam_cli.cam.drise.DetectionPasses` per view (masked inputs, no autograd) for every
  target, each target given its own :class:`~gradcam_cli.cam.drise.WeightedMasks`;
- a DETR's ``attention``: each target's queries' cross-attention, recorded in the explained pass
  (:class:`~gradcam_cli.cam.detr.Attended`);
- the attention methods: the explained pass's :class:`~gradcam_cli.cam.attention.tokens.AttentionMaps`, with the
  target's gradients with respect to the probabilities for attn-grad (one more backward pass per target).

The guided and full-gradient passes re-score the targets chosen in the capture's own pass on their own output
(classifiers and explicit targets only: the methods that need them refuse other tasks when the explainer is built).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..options import PerturbationOptions
from .ablation import AblatedScores
from .attention.legrad import LEGRAD_LAYERS
from .attention.tokens import AttentionMaps
from .detr import Attended
from .drise import DetectionPasses, Proposed, WeightedMasks
from .engine import LayerCapture
from .fullgrad import FullGradients, FullGradPass
from .guided import GuidedPass
from .masked_scores import MaskedScores, ProgressCallback
from .methods.needs import (
    ABLATED_SCORES,
    ATTENTION_GRADIENTS,
    ATTENTION_MAPS,
    DETECTION_PASSES,
    FINER_GRADIENT,
    FULL_GRADIENTS,
    GUIDED_GRADIENT,
    HESSIAN_PRODUCT,
    LAYER_SCORES,
    MASKED_PASSES,
    MASKED_SCORES,
    QUERY_ATTENTION,
    SEED,
    Need,
)
from .methods.random import image_seeds
from .methods.registry import CamMethod
from .perturbation import MaskedPasses
from .reshape import infer_layout
from .scores import Ablatable, Rescorable, Targets

LayerGradients = Callable[[torch.Tensor], dict[str, torch.Tensor]]
"""``gradients(score)``: each layer's gradient of ``score``, in the capture's graph (kept), as the methods take it."""

Layout = Callable[[str, torch.Tensor], torch.Tensor]
"""``(layer, tensor in the layer's own layout)`` -> the tensor as (N, C, h, w), as its activations are given."""


@dataclass(frozen=True)
class ViewPass:
    """One view's pass, as the methods' extra inputs read it: the model and the ``capture`` that ran it on
    ``inputs``, the ``targets`` chosen; ``rescore(output)`` chooses the same targets in another pass's output;
    ``layer_outputs``: each layer's output and its layout (1: as the methods take it, -1: channel-last or tokens);
    ``stack`` closes the passes opened for it (before ``capture`` closes); ``gradients(score)`` differentiates a
    score in the capture's graph (Finer-CAM); ``layout`` turns a layer's tensor into the methods' (N, C, h, w)."""

    model: nn.Module
    capture: LayerCapture
    inputs: torch.Tensor
    targets: Targets
    rescore: Callable[[object], Targets]
    layer_outputs: dict[str, tuple[torch.Tensor, int]]
    stack: ExitStack
    gradients: LayerGradients | None = None
    layout: Layout | None = None


class MethodInputs:
    """Builds the extra arguments for one view (:class:`ViewPass`), with masked inputs or ablated copies
    ``batch_size`` per forward pass (``progress`` called as they run); ``perturbation`` and ``seed`` say which noise
    and masks randomcam and RISE draw."""

    def __init__(
        self,
        view: ViewPass,
        batch_size: int,
        progress: ProgressCallback | None = None,
        perturbation: PerturbationOptions | None = None,
        seed: int | None = None,
    ) -> None:
        self.model, self.capture, self.inputs, self.targets = view.model, view.capture, view.inputs, view.targets
        self.rescore, self.layer_outputs, self.stack = view.rescore, view.layer_outputs, view.stack
        self.batch_size, self.progress, self.gradients = batch_size, progress, view.gradients
        self.layout = view.layout or (lambda _layer, tensor: tensor)
        perturbation = perturbation or PerturbationOptions()
        self.perturbation = perturbation if seed is None else replace(perturbation, seed=seed)
        self._layer_passes: dict[int, tuple[LayerCapture, Targets]] = {}
        self._guided: tuple[GuidedPass, Targets] | None = None
        self._full: tuple[FullGradPass, Targets] | None = None
        self._cache: dict[tuple[Need[object], int], object] = {}
        self._builders: dict[Need[object], Callable[[str | None, int], object]] = {
            SEED: self._seed,
            MASKED_PASSES: self._masked_passes,
            DETECTION_PASSES: self._detection_passes,
            QUERY_ATTENTION: self._query_attention,
            HESSIAN_PRODUCT: self._hessian_product,
            MASKED_SCORES: self._masked_scores,
            ABLATED_SCORES: self._ablated_scores,
            GUIDED_GRADIENT: self._guided_for,
            FULL_GRADIENTS: self._full_for,
            FINER_GRADIENT: self._finer_for,
            ATTENTION_MAPS: lambda _layer, _k: self._cached(ATTENTION_MAPS, 0, lambda _: self._attention(None)),
            ATTENTION_GRADIENTS: lambda _layer, k: self._cached(ATTENTION_GRADIENTS, k, self._attention),
            LAYER_SCORES: lambda _layer, k: self._cached(LAYER_SCORES, k, self._legrad),
        }
        """What builds each need's value for ``(layer, target k)``."""

    def close(self) -> None:
        """Drop the builders and what they made: the builders are this object's own bound methods, a reference
        cycle that would otherwise keep the view's inputs, targets and logits (a window batch's, tens of MB) until
        Python's cycle collector next runs, after several more batches."""
        self._builders.clear()
        self._cache.clear()
        self._layer_passes.clear()
        self._guided = self._full = None

    def arguments(self, method: CamMethod[Any], layer: str | None, k: int) -> tuple[object, ...]:
        """The arguments ``method`` takes after the activations and gradients of ``layer`` (``None`` for a method
        that reads no layer), for target ``k``: none, or what its need's builder makes."""
        if method.needs is None:
            return ()
        build = self._builders.get(method.needs)
        if build is None:
            raise ValueError(f"no pass builds {method.needs!r} (method {method.name!r})")
        return (build(layer, k),)

    def _seed(self, layer: str | None, k: int) -> list[int]:
        """One seed per image, from its own pixels: batching cannot change its noise."""
        return image_seeds(self.perturbation.seed, self.inputs)

    def _masked_passes(self, layer: str | None, k: int) -> MaskedPasses:
        return MaskedPasses(
            self.capture.forward_output_unhooked,
            self.inputs,
            self.targets.masked(k),
            self.perturbation,
            self.batch_size,
            self.progress,
        )

    def _detection_passes(self, layer: str | None, k: int) -> WeightedMasks:
        """Target ``k``'s weighted masks, from the one set of passes made for every target (at the first call)."""
        passes = self._cached(DETECTION_PASSES, 0, lambda _: self._detection_sweep())
        assert isinstance(passes, DetectionPasses)
        return passes.target(k)

    def _detection_sweep(self) -> DetectionPasses:
        if not isinstance(self.targets, Proposed):
            raise UsageError("this method explains detectors only")
        return DetectionPasses(
            self.capture.forward_output_unhooked,
            self.inputs,
            self.targets,
            self.perturbation,
            self.batch_size,
            self.progress,
        )

    def _query_attention(self, layer: str | None, k: int) -> torch.Tensor:
        if not isinstance(self.targets, Attended):
            raise UsageError("this method explains DETR-family detectors only")
        return self.targets.attention(k)

    def _hessian_product(self, layer: str | None, k: int) -> torch.Tensor:
        assert layer is not None
        products = self._cached(HESSIAN_PRODUCT, k, self._hessian_vector_products)
        assert isinstance(products, dict)
        product: torch.Tensor = products[layer]
        return product

    def _masked_scores(self, layer: str | None, k: int) -> MaskedScores:
        return MaskedScores(
            self.capture.forward_output_unhooked,
            self.inputs,
            batch_size=self.batch_size,
            progress=self.progress,
            probability=self.targets.masked(k),
            region=self.targets.region,
        )

    def _ablated_scores(self, layer: str | None, k: int) -> AblatedScores:
        assert layer is not None
        return self._ablated(layer, k)

    def _guided_for(self, layer: str | None, k: int) -> torch.Tensor:
        guided = self._cached(GUIDED_GRADIENT, k, self._guided_gradient)
        assert isinstance(guided, torch.Tensor)
        return guided

    def _full_for(self, layer: str | None, k: int) -> FullGradients:
        full = self._cached(FULL_GRADIENTS, k, self._full_gradients)
        assert isinstance(full, FullGradients)
        return full

    def _finer_for(self, layer: str | None, k: int) -> torch.Tensor:
        finer = self._cached(FINER_GRADIENT, k, self._finer_gradients)
        assert isinstance(finer, dict) and layer is not None
        gradient: torch.Tensor = finer[layer]
        return gradient

    def _cached(self, kind: Need[object], k: int, build: Callable[[int], object]) -> object:
        """One value per kind and target; a new target drops the last one's (FullGrad's gradients are large)."""
        if (kind, k) not in self._cache:
            for key in [key for key in self._cache if key[0] == kind]:
                del self._cache[key]
            self._cache[(kind, k)] = build(k)
        return self._cache[(kind, k)]

    def _class_targets(self) -> Rescorable:
        if not isinstance(self.targets, Rescorable):
            raise UsageError("this method explains classifiers only")
        return self.targets

    def _ablated(self, layer: str, k: int) -> AblatedScores:
        if not isinstance(self.targets, Ablatable):
            raise UsageError("this method explains classifiers only")
        score, original = self.targets.ablated(k)
        layer_output, channel_dim = self.layer_outputs[layer]
        return AblatedScores(
            lambda inputs, replacement: self.capture.forward_output_replaced(inputs, layer, replacement),
            self.inputs,
            layer_output,
            score,
            original,
            channel_dim,
            self.batch_size,
            self.progress,
        )

    def _attention(self, k: int | None) -> AttentionMaps:
        """The explained pass's attention, with the gradients of target ``k``'s score (``None``: without)."""
        attention = self.capture.watched
        if attention is None:
            raise ValueError("the attention methods need the model's attention watched")
        probabilities = self._self_attention(self.capture.attention_maps())
        length = probabilities[0].shape[-1]
        layout = infer_layout((1, length, 1), tuple(self.inputs.shape[2:]), attention.prefix)
        if layout is None or layout.prefix != attention.prefix:
            raise UsageError(f"the attention's {length} tokens make no patch grid on this input")
        grads = None if k is None else self._attention_gradients(self.capture, self.targets, k)
        grid = layout.grid
        return AttentionMaps(probabilities, grads, attention.prefix, attention.class_token, grid, attention.heads)

    @staticmethod
    def _self_attention(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The layers whose attention is the token sequence's over itself, (N, heads, L, L) with the first layer's
        L: an attention-pooling head's (N, heads, queries, L) after them (SigLIP's, open_clip's) is left out."""
        length = tensors[0].shape[-1]
        return [tensor for tensor in tensors if tuple(tensor.shape[-2:]) == (length, length)]

    def _attention_gradients(self, capture: LayerCapture, targets: Targets, k: int) -> list[torch.Tensor]:
        score = targets.value(k)
        if score is None:  # no sample has a k-th target
            return self._self_attention([torch.zeros_like(p) for p in capture.attention_maps()])
        return self._self_attention(capture.attention_gradients(score, retain_graph=True))

    def _legrad(self, k: int) -> AttentionMaps:
        """LeGrad's last :data:`LEGRAD_LAYERS` layers, each with the gradient of its own score: the last layer's from
        the explained pass, an earlier one's from a pass in which the blocks after it are skipped (one pass per
        layer, kept for every target)."""
        maps = self._cached(ATTENTION_GRADIENTS, k, self._attention)
        assert isinstance(maps, AttentionMaps) and maps.gradients is not None
        count = len(maps.probabilities)
        layers = range(max(0, count - LEGRAD_LAYERS), count)
        gradients = [
            maps.gradients[layer]
            if layer == count - 1
            else self._attention_gradients(*self._layer_pass(layer, count), k)[layer]
            for layer in layers
        ]
        return replace(maps, probabilities=[maps.probabilities[layer] for layer in layers], gradients=gradients)

    def _layer_pass(self, layer: int, count: int) -> tuple[LayerCapture, Targets]:
        """A pass whose output comes from layer ``layer``'s tokens (the blocks after it, to the last of ``count``
        self-attention layers, skipped: an attention-pooling head still runs), and its targets."""
        if layer not in self._layer_passes:
            watched = self.capture.watched
            assert watched is not None
            self.capture.remove_hooks()
            capture = self.stack.enter_context(LayerCapture(self.model, {}))
            capture.watch_attention(watched, skipped=watched.blocks[layer + 1 : count])
            output = capture.forward_output(self.inputs)
            self._layer_passes[layer] = (capture, self.rescore(output))
        return self._layer_passes[layer]

    def _finer_gradients(self, k: int) -> dict[str, torch.Tensor]:
        targets = self._class_targets()
        if self.gradients is None:
            raise ValueError("Finer-CAM needs the capture's gradients")
        return self.gradients(targets.finer(k))

    def _hessian_vector_products(self, k: int) -> dict[str, torch.Tensor]:
        score = self.targets.value(k)
        if score is None:  # no sample has a k-th target
            return {name: torch.zeros_like(self.layout(name, out)) for name, (out, _) in self.layer_outputs.items()}
        products = self.capture.hessian_vector_products(score)
        return {name: self.layout(name, product) for name, product in products.items()}

    def _guided_gradient(self, k: int) -> torch.Tensor:
        self._class_targets()
        if self._guided is None:
            self.capture.remove_hooks()
            guided = GuidedPass(self.model, self.inputs)
            self._guided = (guided, self.rescore(guided.output))
        guided, targets = self._guided
        return guided.gradients(targets.value(k))

    def _full_gradients(self, k: int) -> FullGradients:
        self._class_targets()
        if self._full is None:
            self.capture.remove_hooks()
            full = self.stack.enter_context(FullGradPass(self.model, self.inputs))
            self._full = (full, self.rescore(full.output))
        full, targets = self._full
        return full.decompose(targets.value(k))
