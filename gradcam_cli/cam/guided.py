"""Guided backpropagation: the gradient of a score with respect to the input, through ReLUs that pass back only
positive gradients, and the map it gives.

The guided rule (Springenberg et al. 2015, Sec. 3.4): at every ReLU y = max(x, 0), the backward pass sends
dS/dx = [x > 0] * max(dS/dy, 0) instead of [x > 0] * dS/dy. It must hold at *every* ReLU of the network: the
model's ``nn.ReLU`` modules, and the functional ones its ``forward`` calls (``F.relu(x, inplace=True)`` after
DenseNet's features, in GoogLeNet's and Inception's ``BasicConv2d``; ``torch.relu``, ``Tensor.relu`` and their
in-place forms). :func:`guided_relus` therefore changes no module: it installs a ``TorchFunctionMode`` that sees
every call of a ReLU function (``nn.ReLU.forward`` calls ``F.relu`` too) and routes it to an autograd function with
the guided backward; the forward result is the ReLU's own, in place where the call was in place. The mode is
removed on exit, also on error; nothing on the model is touched (no hooks, modes, flags or ``.grad``). Other
activations (SiLU, GELU, Hardswish, ReLU6) keep their ordinary gradient: the rule is defined for ReLU, so on a
network without ReLUs guided backpropagation is the plain input gradient.

The map shown (:func:`guided_saliency`): the input gradient's magnitude summed over the colour channels,
sum_c |G_c|, clipped at its 99th percentile per image (as the PAIR saliency library's ``VisualizeImageGrayscale``:
the few largest gradients would otherwise leave every other pixel black), and then, as every map, resized to the
image and min-max normalised to [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..models.modes import model_state_preserved

DISPLAY_PERCENTILE = 0.99
"""Each guided map is clipped at this quantile of its values before it is normalised (see the module docstring)."""

_OUT_OF_PLACE: set[Callable[..., Any]] = {torch.relu, F.relu, torch.Tensor.relu}
_IN_PLACE: set[Callable[..., Any]] = {torch.relu_, F.relu_, torch.Tensor.relu_}


class _GuidedReLU(torch.autograd.Function):
    """max(x, 0) forward; [x > 0] * max(grad, 0) backward. ``inplace``: the result is written into x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        if inplace:
            ctx.mark_dirty(x)
            output = x.clamp_(min=0)
        else:
            output = x.clamp(min=0)
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (output,) = ctx.saved_tensors
        return grad.clamp(min=0) * (output > 0), None


class _GuidedReLUMode(TorchFunctionMode):
    """Routes every ReLU call made while it is active to :class:`_GuidedReLU`."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _OUT_OF_PLACE or func in _IN_PLACE:
            x = args[0] if args else kwargs["input"]
            inplace = func in _IN_PLACE or bool(kwargs.get("inplace", args[1] if len(args) > 1 else False))
            if isinstance(x, torch.Tensor) and torch.is_grad_enabled():
                return _GuidedReLU.apply(x, inplace)
        return func(*args, **kwargs)


@contextmanager
def guided_relus() -> Iterator[None]:
    """Within this block, every ReLU run with autograd on backpropagates by the guided rule (module docstring)."""
    with _GuidedReLUMode():
        yield


class GuidedPass:
    """One forward pass of ``model`` over a copy of ``inputs`` under :func:`guided_relus`, its parameters frozen
    and every module in eval mode for the pass (restored at once: the backward rule is recorded in the graph);
    :meth:`gradients` backpropagates one score of its :attr:`output` to the input, as often as needed."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor) -> None:
        self.inputs = inputs.detach().clone().requires_grad_(True)
        with model_state_preserved(model), torch.enable_grad(), guided_relus():
            self.output: object = model(self.inputs)

    def gradients(self, score: torch.Tensor | None) -> torch.Tensor:
        """The guided (N, 3, H, W) gradient of ``score``, a scalar from :attr:`output` (``None``: zeros)."""
        if score is None:
            return torch.zeros_like(self.inputs)
        (gradient,) = torch.autograd.grad(score, self.inputs, retain_graph=True, allow_unused=True)
        return torch.zeros_like(self.inputs) if gradient is None else gradient


def guided_saliency(gradients: torch.Tensor) -> torch.Tensor:
    """The readable map of (N, 3, H, W) input gradients: sum_c |G_c|, clipped at the per-image
    :data:`DISPLAY_PERCENTILE` quantile: (N, H, W), not yet normalised."""
    magnitude = gradients.float().abs().sum(dim=1)
    ceiling = torch.quantile(magnitude.flatten(1), DISPLAY_PERCENTILE, dim=1)
    return torch.minimum(magnitude, ceiling.view(-1, 1, 1))
