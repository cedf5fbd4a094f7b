"""Each CAM method's cost relative to a plain forward pass: ResNet-50 (random weights), one 224x224 image.

The baseline is ``model(x)`` under ``torch.no_grad()``. A method's time is :meth:`Explainer.compute` for one
target (hooks, forward, the backward pass if the method needs one, the method itself; no upsampling or file
writing). Each case is timed in alternation with the plain forward pass, so that a busy machine slows both alike;
times are medians over ``--repeats`` rounds after a warm-up; scorecam and ablationcam (2,048 masked or ablated
forward passes each, batched ``--score-batch-size`` at a time) run ``--scorecam-repeats`` times without a warm-up.
fullgrad, guided-backprop and guided-gradcam add a forward pass and a backward pass through the whole network.

Usage: ``python benchmarks/bench_methods.py [--device cpu|cuda] [--repeats N] [--skip-scorecam]
[--skip-ablationcam] [--only NAME,...]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cam.masked_scores import SCORECAM_BATCH_SIZE
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cam.methods.needs import ATTENTION_NEEDS


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(function, device: torch.device) -> float:
    started = time.perf_counter()
    function()
    _sync(device)
    return time.perf_counter() - started


def paired(function, baseline, device: torch.device, repeats: int, warm_up: bool = True) -> tuple[float, float]:
    """Median times of ``function()`` and of ``baseline()``, measured in alternation (so that a busy machine
    slows both alike), after one warm-up run of each."""
    if warm_up:
        function()
    baseline()
    _sync(device)
    method_times, baseline_times = [], []
    for _ in range(repeats):
        baseline_times.append(_seconds(baseline, device))
        method_times.append(_seconds(function, device))
        baseline_times.append(_seconds(baseline, device))
    return statistics.median(method_times), statistics.median(baseline_times)


NEWER_LAYER_METHODS = ("gradcam-elementwise", "shapleycam", "kpcacam", "fem", "randomcam")
BLACK_BOX_METHODS = ("rise", "occlusion")
"""Timed by bench_newer_methods.py (RISE and occlusion once each, at their defaults), not here."""


def resnet50_case(device: torch.device) -> tuple[torch.nn.Module, torch.Tensor, int, Callable[[], None]]:
    """The benchmarks' setting: ResNet-50 (random weights, seeded), one 224x224 input, its top class, and the plain
    forward pass every ratio is taken against."""
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval().to(device)
    inputs = torch.randn(1, 3, 224, 224, device=device)
    with torch.no_grad():
        target = int(model(inputs).argmax())

    def forward() -> None:
        with torch.no_grad():
            model(inputs)

    return model, inputs, target, forward


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scorecam-repeats", type=int, default=1)
    parser.add_argument("--score-batch-size", type=int, default=SCORECAM_BATCH_SIZE)
    parser.add_argument("--skip-scorecam", action="store_true")
    parser.add_argument("--skip-ablationcam", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated case labels to run (default: all)")
    args = parser.parse_args()

    device = torch.device(args.device)
    model, inputs, target, forward = resnet50_case(device)

    threads = f", {torch.get_num_threads()} CPU threads" if device.type == "cpu" else ""
    print(f"resnet50 (random weights), 1x3x224x224 on {device}{threads}; layer4; one target")
    print(f"{'case':<34} {'time':>12} {'forward':>10}  ratio")

    elsewhere = NEWER_LAYER_METHODS + BLACK_BOX_METHODS  # bench_newer_methods; the attention methods: bench_attention
    cnn = [name for name in METHODS if METHODS[name].needs not in ATTENTION_NEEDS]
    cases: list[tuple[str, list[str], dict]] = [(name, [name], {}) for name in cnn if name not in elsewhere]
    cases += [
        ("5 gradient methods, one run", ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam"], {}),
        ("gradcam --eigen-smooth", ["gradcam"], {"eigen_smooth": True}),
        ("gradcam --aug-smooth", ["gradcam"], {"aug_smooth": True}),
    ]
    cases.append(("guided-backprop + guided-gradcam", ["guided-backprop", "guided-gradcam"], {}))
    only = {label for label in args.only.split(",") if label}
    for label, methods, options in cases:
        if (args.skip_scorecam and "scorecam" in methods) or (args.skip_ablationcam and "ablationcam" in methods):
            continue
        if only and label not in only:
            continue
        explainer = Explainer(model, "layer4", methods, score_batch_size=args.score_batch_size, **options)
        many = any(METHODS[method].uses_model for method in methods)  # 2,048 passes: no warm-up run needed
        repeats = args.scorecam_repeats if many else args.repeats
        seconds, baseline = paired(
            lambda e=explainer: e.compute(inputs, target=target), forward, device, repeats, warm_up=not many
        )
        print(f"{label:<34} {seconds * 1000:9.1f} ms {baseline * 1000:7.1f} ms {seconds / baseline:7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
