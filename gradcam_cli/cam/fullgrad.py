"""FullGrad's pass through the whole network and its map (Srinivas & Fleuret, "Full-Gradient Representation for
Neural Network Visualization", NeurIPS 2019).

The full-gradient decomposition of a score S: the input-gradient ∇_x S ⊙ x plus, for every layer l with a bias
b_l, the bias-gradients b_l ⊙ ∂S/∂z_l (z_l: that layer's output). The bias layers are every ``nn.Conv2d`` with a
bias and every ``nn.BatchNorm2d`` (as pytorch-grad-cam and the authors' code take them); in eval mode a BatchNorm
is z = a x + b with a = gamma / sqrt(var + eps), so its bias is b = beta - mean * a. ``--layer`` plays no part.

One extra forward pass with the inputs requiring gradients and tensor hooks on every bias layer
(:class:`gradcam_cli.cam.engine.LayerCapture`), then one backward pass per target through the whole network.
A bias layer that runs more than once per forward pass counts at its last call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..models.modes import model_state_preserved
from .engine import LayerCapture
from .maps import normalise, upsample


def bias_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Every ``nn.Conv2d`` with a bias and every ``nn.BatchNorm2d`` of ``model`` (with its affine parameters),
    by dotted name, in registration order."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d | nn.BatchNorm2d) and getattr(module, "bias", None) is not None
    }


def layer_bias(module: nn.Module) -> torch.Tensor:
    """The (C,) bias a layer adds: a convolution's own, or an eval-mode BatchNorm's beta - mean * gamma / sqrt(var
    + eps) (the authors' ``tensor_extractor.py``)."""
    if isinstance(module, nn.BatchNorm2d) and module.running_mean is not None and module.running_var is not None:
        scale = module.weight / torch.sqrt(module.running_var + module.eps)
        return (module.bias - module.running_mean * scale).detach()
    bias = module.bias
    assert isinstance(bias, torch.Tensor)
    return bias.detach()


@dataclass
class FullGradients:
    """One target's full-gradient decomposition for a batch: the inputs x, ∇_x S, and per bias layer its (C,) bias
    and ∂S/∂z of its (N, C, h, w) output."""

    inputs: torch.Tensor
    input_gradient: torch.Tensor
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class FullGradPass:
    """FullGrad's forward pass over ``inputs``, a context manager (the model's parameters frozen and its mode and
    hooks restored on exit, as :class:`~gradcam_cli.cam.engine.LayerCapture` does); :meth:`decompose`
    backpropagates one score of its :attr:`output`, as often as needed until the block ends."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor) -> None:
        self.model = model
        self.layers = bias_layers(model)
        self.inputs = inputs.detach().clone().requires_grad_(True)
        self.capture = LayerCapture(model, self.layers, tensor_hooks=True) if self.layers else None
        self.output: object = None

    def __enter__(self) -> FullGradPass:
        if self.capture is None:
            with model_state_preserved(self.model), torch.enable_grad():
                self.output = self.model(self.inputs)
            return self
        self.capture.__enter__()
        try:
            self.output = self.capture.forward_output(self.inputs)
            self.capture.remove_hooks()
        except BaseException:
            self.capture.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.output = None
        if self.capture is not None:
            self.capture.__exit__(*exc_info)

    def decompose(self, score: torch.Tensor | None) -> FullGradients:
        """The decomposition of ``score`` (a scalar from :attr:`output`; ``None``: all zeros)."""
        inputs = self.inputs.detach()
        if score is None:
            return FullGradients(inputs, torch.zeros_like(inputs), [])
        if self.capture is None:
            (gradient,) = torch.autograd.grad(score, self.inputs, retain_graph=True, allow_unused=True)
            return FullGradients(inputs, torch.zeros_like(inputs) if gradient is None else gradient, [])
        input_gradient, grads = self.capture.full_gradients(score, self.inputs, retain_graph=True)
        layers = [(layer_bias(self.layers[name]), grad) for name, grad in grads.items()]
        return FullGradients(inputs, input_gradient, layers)


def channel_normalise(maps: torch.Tensor) -> torch.Tensor:
    """Min-max normalise every channel of every sample of (N, C, h, w) to [0, 1] (a constant channel: zeros)."""
    n, c, h, w = maps.shape
    return normalise(maps.reshape(n * c, h, w)).reshape(n, c, h, w)


def fullgrad_map(decomposition: FullGradients) -> torch.Tensor:
    """S = sum_c psi(|x ⊙ ∇_x S|_c) + sum_l Up(sum_c psi(|b_l,c ∂S/∂z_l,c|)): (N, H, W) at the input's size, psi
    being a per-channel min-max normalisation (pytorch-grad-cam's reading of the paper's Eq. 5, where psi is
    applied to each channel c; see :func:`gradcam_cli.cam.methods.fullgrad`)."""
    size = decomposition.inputs.shape[-2:]
    total = channel_normalise((decomposition.inputs * decomposition.input_gradient).abs().float()).sum(dim=1)
    for bias, gradient in decomposition.layers:
        terms = (bias.view(1, -1, 1, 1) * gradient).abs().float()
        total = total + upsample(channel_normalise(terms).sum(dim=1), size)
    return total
