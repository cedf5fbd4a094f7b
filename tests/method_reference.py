"""Independent references for EigenGradCAM, AblationCAM, FullGrad and the guided methods, written from the formulas
with nothing but forward hooks and ``torch.autograd.grad`` (none of gradcam_cli's code), and pytorch-grad-cam's
implementations as they are, for the comparisons of ``tests/test_more_methods.py`` and ``tests/test_guided.py``.

Every reference hook hands the network a *clone* of the layer's output and keeps the output itself, so a later
in-place op (``ReLU(inplace=True)``, ``out += identity``, ``F.relu(x, inplace=True)``) edits the clone and the kept
tensor stays the layer's own output (the trick ``tests/test_references.py`` explains).

Where pytorch-grad-cam departs (the tests show each):

* Activations at a layer followed by an in-place op: on CPU its hooks keep ``output.cpu().detach()``, which aliases
  the output, so the in-place op rewrites them (EigenGradCAM, AblationCAM there).
* AblationCAM: an ablated channel is set to a very negative value, not 0, unless the activations' minimum is exactly
  0: min - 1e7, where min is taken again after each row of its batch of 32 is written, so the i-th row of a batch
  gets min(A) - (i + 1) * 1e7 (:func:`pytorch_grad_cam_ablation_value`).
* Guided backpropagation: only ``nn.ReLU`` modules are replaced; functional ReLUs (DenseNet's last
  ``F.relu(..., inplace=True)``, GoogLeNet's ``BasicConv2d``) keep the ordinary gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from cam_reference import signed_projection
from torch import nn

DISPLAY_QUANTILE = 0.99


def minmax(maps: torch.Tensor) -> torch.Tensor:
    maps = maps.double() - maps.double().min()
    return maps / maps.max() if maps.max() > 0 else maps


def up(cam: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(h, w) -> (H, W), bilinear, align_corners=False."""
    return F.interpolate(cam[None, None].double(), size=size, mode="bilinear", align_corners=False)[0, 0]


def calibrate_batchnorm(model: nn.Module, size: tuple[int, int] = (224, 224)) -> nn.Module:
    """Give every BatchNorm the running statistics of its actual input, from one train-mode pass over noise.

    torchvision's init (Kaiming fan-out, which for depthwise convs divides by the channel count) with identity
    running statistics makes the signal vanish in random MobileNetV3 / EfficientNet / MNASNet (logits ~1e-10 to
    1e-14, all classes tied). Calibrated, every model gives O(1) activations and logits, as a trained one would.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0)))
    model.eval()
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
    return model


@contextmanager
def stashing(layers: list[nn.Module]) -> Iterator[list[list[torch.Tensor]]]:
    """Forward hooks keeping each layer's outputs (one list per layer) and handing the network clones."""
    stash: list[list[torch.Tensor]] = [[] for _ in layers]

    def keeper(slot: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
        def keep(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
            slot.append(output)
            return output.clone()

        return keep

    handles = [layer.register_forward_hook(keeper(slot)) for layer, slot in zip(layers, stash, strict=True)]
    try:
        yield stash
    finally:
        for handle in handles:
            handle.remove()


def activations_and_gradients(
    model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's own (1, C, h, w) output and d logit[target] / d output."""
    with stashing([layer]) as stash, torch.enable_grad():
        logits = model(x)
        (gradients,) = torch.autograd.grad(logits[0, target], stash[0][-1])
    return stash[0][-1].detach(), gradients


def eigengradcam(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """ReLU(first principal component of g ⊙ A) (pytorch-grad-cam's projection, signed to correlate with the
    channel sum), upsampled, min-max: (H, W)."""
    activations, gradients = activations_and_gradients(model, layer, x, target)
    projection = signed_projection((gradients * activations).double().numpy())
    return minmax(up(torch.relu(torch.from_numpy(np.asarray(projection))[0]), tuple(x.shape[-2:])))


def ablation_weights(
    model: nn.Module,
    layer: nn.Module,
    x: torch.Tensor,
    target: int,
    value: Callable[[torch.Tensor], float] | None = None,
) -> torch.Tensor:
    """(C,) weights (y - y_k) / y of the paper, one unbatched forward pass per channel; ``value(A)`` the ablated
    channel's value (default 0, the paper's)."""
    activations, _ = activations_and_gradients(model, layer, x, target)
    with torch.no_grad():
        original = float(model(x)[0, target])
        scores = []
        for k in range(activations.shape[1]):

            def ablate(_module: nn.Module, _inputs: object, output: torch.Tensor, k: int = k) -> torch.Tensor:
                output = output.clone()
                output[:, k] = 0.0 if value is None else value(activations, k)
                return output

            handle = layer.register_forward_hook(ablate)
            try:
                scores.append(float(model(x)[0, target]))
            finally:
                handle.remove()
    return (original - torch.tensor(scores, dtype=torch.float64)) / original


def ablationcam(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int, value=None) -> torch.Tensor:
    """ReLU(sum_k w_k A^k), upsampled, min-max: (H, W)."""
    activations, _ = activations_and_gradients(model, layer, x, target)
    weights = ablation_weights(model, layer, x, target, value)
    cam = torch.relu((weights[:, None, None] * activations[0].double()).sum(dim=0))
    return minmax(up(cam, tuple(x.shape[-2:])))


def pytorch_grad_cam_ablation_value(activations: torch.Tensor, k: int, batch_size: int = 32) -> float:
    """The value pytorch-grad-cam's ``AblationLayer`` writes into ablated channel ``k``: 0 where the activations'
    minimum is 0, else the minimum of its batch *as written so far* minus 1e7, which sinks by 1e7 per row."""
    low = float(activations.min())
    return 0.0 if low == 0 else low - 1e7 * (k % batch_size + 1)


def _channel_minmax(maps: torch.Tensor) -> torch.Tensor:
    """Per-channel min-max of (C, h, w), a constant channel becoming zeros."""
    flat = maps.flatten(1)
    low, high = flat.min(dim=1).values[:, None, None], flat.max(dim=1).values[:, None, None]
    span = high - low
    return torch.where(span > 0, (maps - low) / torch.where(span > 0, span, 1), torch.zeros_like(maps))


def fullgrad(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """FullGrad: every Conv2d with a bias and every BatchNorm2d; each term's channels min-max normalised at the
    layer's resolution, each channel upsampled to the input, all summed; min-max: (H, W)."""
    layers = [
        m for m in model.modules() if isinstance(m, nn.Conv2d | nn.BatchNorm2d) and getattr(m, "bias", None) is not None
    ]
    leaf = x.clone().requires_grad_(True)
    with stashing(layers) as stash, torch.enable_grad():
        logits = model(leaf)
        ran = [(layer, slot[-1]) for layer, slot in zip(layers, stash, strict=True) if slot]
        grads = torch.autograd.grad(logits[0, target], [leaf, *(output for _, output in ran)])
    size = tuple(x.shape[-2:])
    total = _channel_minmax((grads[0] * x)[0].abs().double()).sum(dim=0)
    for (layer, _), gradient in zip(ran, grads[1:], strict=True):
        if isinstance(layer, nn.BatchNorm2d):
            bias = layer.bias - layer.running_mean * layer.weight / torch.sqrt(layer.running_var + layer.eps)
        else:
            bias = layer.bias
        terms = _channel_minmax((bias.detach()[:, None, None] * gradient[0]).abs().double())
        total += F.interpolate(terms[None], size=size, mode="bilinear", align_corners=False)[0].sum(dim=0)
    return minmax(total)


def guided_gradient(model: nn.Module, x: torch.Tensor, target: int, functional: bool = True) -> torch.Tensor:
    """Guided backpropagation by another route: every ``F.relu`` call (``nn.ReLU`` calls it too) is run out of
    place with a tensor hook that keeps only the positive part of the gradient reaching it; ``functional=False``
    guides only the ``nn.ReLU`` modules (what pytorch-grad-cam and captum do). (1, 3, H, W)."""
    original = F.relu

    def guided(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        output = original(input)
        if output.requires_grad:
            output.register_hook(lambda grad: grad.clamp(min=0))
        return output

    def module_forward(self: nn.ReLU, input: torch.Tensor) -> torch.Tensor:
        return guided(input)

    leaf = x.clone().requires_grad_(True)
    saved = nn.ReLU.forward
    try:
        if functional:
            F.relu = guided
        else:
            nn.ReLU.forward = module_forward  # type: ignore[method-assign]
        with torch.enable_grad():
            logits = model(leaf)
            (gradient,) = torch.autograd.grad(logits[0, target], leaf)
    finally:
        F.relu = original
        nn.ReLU.forward = saved  # type: ignore[method-assign]
    return gradient


def guided_display(gradient: torch.Tensor) -> torch.Tensor:
    """sum_c |G_c| of (1, 3, H, W), clipped at its 99th percentile, min-max: (H, W)."""
    magnitude = gradient[0].abs().double().sum(dim=0)
    return minmax(magnitude.clamp(max=float(torch.quantile(magnitude.flatten(), DISPLAY_QUANTILE))))


def gradcam(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """Grad-CAM upsampled to the input and min-max normalised: (H, W)."""
    activations, gradients = activations_and_gradients(model, layer, x, target)
    cam = torch.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(dim=1))[0]
    return minmax(up(cam.double(), tuple(x.shape[-2:])))


def pytorch_grad_cam_guided(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """pytorch-grad-cam's ``GuidedBackpropReLUModel`` on a copy of the model (it writes ``.grad`` and swaps the
    ReLU modules): (1, 3, H, W)."""
    from pytorch_grad_cam import GuidedBackpropReLUModel

    copied = copy.deepcopy(model)
    result = GuidedBackpropReLUModel(copied, device="cpu")(x.clone(), target)
    return torch.from_numpy(np.ascontiguousarray(result)).permute(2, 0, 1)[None]


def pytorch_grad_cam_map(cam_class: type, model: nn.Module, layers: list[nn.Module], x: torch.Tensor, target: int):
    """A pytorch-grad-cam class's (H, W) map for ``target``, run on a copy of the model (FullGrad and AblationCAM
    write ``.grad`` or swap modules)."""
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    copied = copy.deepcopy(model)
    names = {id(module): name for name, module in model.named_modules()}
    copied_layers = [copied.get_submodule(names[id(layer)]) for layer in layers]
    cam = cam_class(model=copied, target_layers=copied_layers)
    try:
        return torch.from_numpy(np.asarray(cam(input_tensor=x, targets=[ClassifierOutputTarget(target)])[0]))
    finally:
        cam.activations_and_grads.release()
