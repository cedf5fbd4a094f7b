"""Independent references for EigenGradCAM, AblationCAM, FullGrad and the guided methods, written from the formulas
with nothing but forward hooks and ``torch.autograd.grad`` (none of gradcam_cli's code), and pytorch-grad-cam's
implementations as they are, for the comparisons of ``tests/methods/test_more_methods.py`` and
``tests/methods/test_guided.py``.

Every reference hook hands the network a *clone* of the layer's output and keeps the output itself, so a later
in-place op (``ReLU(inplace=True)``, ``out += identity``, ``F.relu(x, inplace=True)``) edits the clone and the kept
tensor stays the layer's own output (the trick ``tests/methods/test_references.py`` explains).

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
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from cam_reference import signed_projection
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.options import PerturbationOptions

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


# --- the newer methods (issue 24): each written from its paper's formula -------------------------------------------


def score_of(logits: torch.Tensor, target: int, score: str) -> torch.Tensor:
    """The differentiated score: the logit, ReST (pytorch-grad-cam's ``ClassifierOutputReST``: the logit minus the
    cross-entropy), or the softmax probability of ``target``."""
    if score == "rest":
        return logits[0, target] - F.cross_entropy(logits, torch.tensor([target]))
    return logits[0, target] if score == "logit" else torch.softmax(logits, dim=1)[0, target]


def first_and_second_order(
    model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int, score: str = "logit"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's own (1, C, h, w) output A, g = dS/dA and the Hessian-vector product H A (double backward)."""
    with stashing([layer]) as stash, torch.enable_grad():
        logits = model(x)
        activations = stash[0][-1]
        (gradients,) = torch.autograd.grad(score_of(logits, target, score), activations, create_graph=True)
        if gradients.requires_grad:
            (product,) = torch.autograd.grad(
                gradients, activations, grad_outputs=activations.detach(), allow_unused=True
            )
        else:
            product = None
    product = torch.zeros_like(activations) if product is None else product
    return activations.detach(), gradients.detach(), product.detach()


def gradcam_elementwise(
    model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int, score: str = "logit"
) -> torch.Tensor:
    """ReLU(sum_k ReLU(g^k ⊙ A^k)), upsampled, min-max: (H, W)."""
    activations, gradients, _ = first_and_second_order(model, layer, x, target, score)
    cam = torch.relu(torch.relu(gradients.double() * activations.double()).sum(dim=1))[0]
    return minmax(up(cam, tuple(x.shape[-2:])))


def shapleycam(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int, score: str = "logit") -> torch.Tensor:
    """ReLU(sum_k mean_ij(g - H A / 2)^k A^k) (Cai 2025), upsampled, min-max: (H, W)."""
    activations, gradients, product = first_and_second_order(model, layer, x, target, score)
    weights = (gradients.double() - 0.5 * product.double()).mean(dim=(2, 3), keepdim=True)
    cam = torch.relu((weights * activations.double()).sum(dim=1))[0]
    return minmax(up(cam, tuple(x.shape[-2:])))


def fem(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int, k: float = 2.0) -> torch.Tensor:
    """FEM in numpy (Fuad et al. 2020): w_k = share of channel k's positions above mean + k std; ReLU(sum w A)."""
    activations, _ = activations_and_gradients(model, layer, x, target)
    a = activations[0].double().numpy()
    threshold = a.mean(axis=(1, 2)) + k * a.std(axis=(1, 2))
    weights = (a > threshold[:, None, None]).mean(axis=(1, 2))
    cam = np.maximum((weights[:, None, None] * a).sum(axis=0), 0)
    return minmax(up(torch.from_numpy(cam), tuple(x.shape[-2:])))


def kpcacam(model: nn.Module, layer: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """KPCA-CAM with scikit-learn's ``KernelPCA(n_components=1, kernel='sigmoid')`` (gamma 1/C, coef0 1) on the
    positions' centred channel vectors (pytorch-grad-cam's procedure), signed to correlate with the centred channel
    sum, ReLU, upsampled, min-max: (H, W)."""
    from sklearn.decomposition import KernelPCA

    activations, _ = activations_and_gradients(model, layer, x, target)
    a = activations[0].double().numpy()
    samples = a.reshape(a.shape[0], -1).T
    samples = samples - samples.mean(axis=0)
    projection = KernelPCA(n_components=1, kernel="sigmoid").fit_transform(samples)[:, 0]
    if float((projection * samples.sum(axis=1)).sum()) < 0:
        projection = -projection
    cam = np.maximum(projection.reshape(a.shape[1:]), 0)
    return minmax(up(torch.from_numpy(cam), tuple(x.shape[-2:])))


def probability(model: nn.Module, x: torch.Tensor, target: int) -> float:
    with torch.no_grad():
        return float(torch.softmax(model(x), dim=1)[0, target])


def occlusion(model: nn.Module, x: torch.Tensor, target: int, window: int, stride: int) -> torch.Tensor:
    """Zeiler & Fergus occlusion, one window at a time: the mean drop of the softmax probability over the windows
    covering each pixel (windows from 0 by ``stride``, plus one flush with the far edge), min-max: (H, W)."""
    height, width = x.shape[-2:]

    def starts(length: int) -> list[int]:
        last = max(0, length - window)
        found = list(range(0, last + 1, stride))
        return found if found[-1] == last else [*found, last]

    original = probability(model, x, target)
    drops = torch.zeros(height, width, dtype=torch.float64)
    counts = torch.zeros(height, width, dtype=torch.float64)
    for top in starts(height):
        for left in starts(width):
            hidden = x.clone()
            hidden[..., top : top + window, left : left + window] = 0.0
            drops[top : top + window, left : left + window] += original - probability(model, hidden, target)
            counts[top : top + window, left : left + window] += 1
    return minmax(drops / counts)


def rise_masks(count: int, grid: int, p: float, size: tuple[int, int], seed: int) -> torch.Tensor:
    """RISE's masks from the documented draws (cells, then row and column offsets, one CPU generator), one at a
    time: each grid x grid binary grid upsampled bilinearly to (grid + 1) cells and cropped: (count, H, W)."""
    height, width = size
    generator = torch.Generator().manual_seed(seed)
    cells = (torch.rand(count, grid, grid, generator=generator) < p).float()
    cell_h, cell_w = -(-height // grid), -(-width // grid)
    rows = torch.randint(0, cell_h, (count,), generator=generator)
    cols = torch.randint(0, cell_w, (count,), generator=generator)
    masks = []
    for i in range(count):
        big = F.interpolate(cells[i][None, None], size=((grid + 1) * cell_h, (grid + 1) * cell_w), mode="bilinear")
        top, left = int(rows[i]), int(cols[i])
        masks.append(big[0, 0, top : top + height, left : left + width])
    return torch.stack(masks)


def rise(model: nn.Module, x: torch.Tensor, target: int, count: int, grid: int, p: float, seed: int) -> torch.Tensor:
    """RISE (Petsiuk et al. 2018, Eq. 6): sum_i f(x ⊙ M_i) M_i / (N p), masks one at a time, min-max: (H, W)."""
    masks = rise_masks(count, grid, p, tuple(x.shape[-2:]), seed)
    total = torch.zeros(x.shape[-2:], dtype=torch.float64)
    for mask in masks:
        total += probability(model, x * mask, target) * mask.double()
    return minmax(total / (count * p))


# --- D-RISE (Petsiuk et al. 2021), the paper's formula written out ------------------------------------------------


def iou(a: list[float], b: list[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


Detection = tuple[list[float], list[float], float]
"""(box, class vector, objectness)."""


def drise_reference(run, x: torch.Tensor, explained: list[Detection], masks: torch.Tensor, p: float) -> list:
    """D-RISE (Petsiuk et al. 2021, Eq. 2-4), one mask at a time: for each explained detection t, the sum over masks
    of max_j IoU(L_t, L_j) cos(P_t, P_j) O_j (0 without detections) times the mask, over N p; min-max: (H, W) each.
    ``run(masked input)`` gives the masked image's detections."""
    totals = [torch.zeros(x.shape[-2:], dtype=torch.float64) for _ in explained]
    for mask in masks:
        found = run(x * mask)
        for t, (box, vector, _) in enumerate(explained):
            best = 0.0
            for other, other_vector, objectness in found:
                best = max(best, iou(box, other) * cosine(vector, other_vector) * objectness)
            totals[t] += best * mask.double()
    return [total / (len(masks) * p) for total in totals]


def drise_maps(model, x: torch.Tensor, options: PerturbationOptions, **keywords) -> dict[int, torch.Tensor]:
    """gradcam's D-RISE maps of ``x`` at its own size, by rank (0: the combined map)."""
    explainer = Explainer(model, None, ["drise"], perturbation=options, score_batch_size=7, **keywords)
    result = explainer.explain_batch(x)[0]
    return {e.rank: e.saliency for e in result.explanations}
