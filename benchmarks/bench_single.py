"""The cost of explaining one image in Python, against a plain forward pass and a minimal hook implementation.

ResNet-50 (random weights) at 224x224, layer4, Grad-CAM of the top class, on the CPU. Cases, all in one process:

* ``forward``: ``model(x)`` under ``torch.no_grad()``, the floor;
* ``minimal``: the least a Grad-CAM needs, written out here: a forward hook handing the network a leaf, a full
  backward hook keeping the gradient, one forward and one backward pass, the weighted sum, ReLU, bilinear upsampling
  to the input and min-max normalisation;
* ``gradcam-cli``: ``Explainer.explain_batch`` (hooks, model state kept, score, maps upsampled to the input, the
  results built), on the model in eval mode with frozen parameters (as ``Explainer.from_options`` holds it), and
  ``gradcam-cli, built`` on one in training mode with parameters requiring gradients (as torchvision builds it:
  each pass switches both and back);
* the peers, where installed: pytorch-grad-cam's ``GradCAM`` and captum's ``LayerGradCam`` (upsampled with
  ``LayerAttribution.interpolate``).

Each round runs every case once, in an order that rotates from round to round, so that a busy machine or a warming
cache slows all of them alike. Printed: each case's median time, and the medians over the rounds of its ratio to
``forward`` and to ``minimal`` and of its difference from ``minimal``, each taken within a round.

Usage: ``python benchmarks/bench_single.py [--rounds N] [--batch N] [--threads N]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gradcam_cli.cam.explainer import Explainer


def minimal_gradcam(model: torch.nn.Module, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Grad-CAM of each sample's top class with nothing but two hooks: (N, H, W) in [0, 1]."""
    kept: dict[str, torch.Tensor] = {}

    def forward_hook(_module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        kept["a"] = output.detach().requires_grad_(True)
        return kept["a"]

    def backward_hook(_module: torch.nn.Module, _grad_in: object, grad_out: tuple[torch.Tensor, ...]) -> None:
        kept["g"] = grad_out[0]

    handles = [layer.register_forward_hook(forward_hook), layer.register_full_backward_hook(backward_hook)]
    try:
        with torch.enable_grad():
            logits = model(x)
            logits.gather(1, logits.argmax(dim=1, keepdim=True)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    activations, gradients = kept["a"].detach(), kept["g"]
    cam = torch.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(dim=1, keepdim=True))
    cam = F.interpolate(cam, size=x.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    low = cam.flatten(1).min(dim=1).values[:, None, None]
    span = cam.flatten(1).max(dim=1).values[:, None, None] - low
    return torch.where(span > 0, (cam - low) / span.clamp(min=1e-12), 0)


def peers(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The peers' Grad-CAM of the top class, each where its package is installed, on a copy of the model whose
    parameters require gradients, as they need (from the input on)."""
    model = copy.deepcopy(model).requires_grad_(True)
    cases: dict[str, Callable[[], object]] = {}
    with torch.no_grad():
        targets = model(x).argmax(dim=1).tolist()
    try:
        from pytorch_grad_cam import GradCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

        cam = GradCAM(model=model, target_layers=[model.layer4])
        cases["pytorch-grad-cam"] = lambda: cam(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets])
    except ImportError:
        pass
    try:
        from captum.attr import LayerAttribution, LayerGradCam

        captum = LayerGradCam(model, model.layer4)
        cases["captum"] = lambda: LayerAttribution.interpolate(
            captum.attribute(x, target=targets, relu_attributions=True), x.shape[-2:], "bilinear"
        )
    except ImportError:
        pass
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval().requires_grad_(False)  # as from_options holds it
    x = torch.randn(args.batch, 3, 224, 224)
    explainer = Explainer(model, "layer4")
    built = copy.deepcopy(model).train().requires_grad_(True)  # as torchvision builds it
    built_explainer = Explainer(built, "layer4")

    def forward() -> None:
        with torch.no_grad():
            model(x)

    cases: dict[str, Callable[[], object]] = {
        "forward": forward,
        "minimal": lambda: minimal_gradcam(model, model.layer4, x),
        "gradcam-cli": lambda: explainer.explain_batch(x),
        "gradcam-cli, built": lambda: built_explainer.explain_batch(x),
        **peers(model, x),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for name in names:  # warm-up
        cases[name]()
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            started = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    shape = f"{args.batch}x3x224x224"
    print(f"resnet50 (random weights), {shape}, layer4, {args.threads} CPU threads, {args.rounds} rounds")
    print(f"{'case':<20} {'median':>10} {'/forward':>9} {'/minimal':>9} {'- minimal':>10}")
    for name, seconds in median.items():
        # ratios and differences within each round (one call of each case, back to back), then their median:
        # the machine's drifts in speed, which move whole rounds, cancel out
        ratio = statistics.median(a / b for a, b in zip(times[name], times["forward"], strict=True))
        to_minimal = statistics.median(a / b for a, b in zip(times[name], times["minimal"], strict=True))
        extra = statistics.median(a - b for a, b in zip(times[name], times["minimal"], strict=True))
        print(f"{name:<20} {seconds * 1000:7.1f} ms {ratio:8.3f}x {to_minimal:8.3f}x {extra * 1000:+7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
