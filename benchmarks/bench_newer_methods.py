"""The newer methods' cost (issue 24) relative to a plain forward pass, and RISE's and occlusion's images per second.

ResNet-50 (random weights), one 224x224 image, ``layer4``, one target; the baseline is ``model(x)`` under
``torch.no_grad()``, timed in alternation with each case (``bench_methods.paired``), medians over ``--repeats``
rounds. ``gradcam-elementwise``, ``shapleycam`` (a second backward pass; softmax score, where its Hessian term is
not zero), ``kpcacam``, ``fem`` and ``randomcam`` are timed as :meth:`Explainer.compute`; ``rise`` (4,000 masks)
and ``occlusion`` (window 32, stride 16: 169 windows) at their defaults, once each (no warm-up), reported as images
per second and as a ratio.

Usage: ``python benchmarks/bench_newer_methods.py [--device cpu|cuda] [--repeats N] [--rise-masks N]
[--black-box-only]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_methods import BLACK_BOX_METHODS, NEWER_LAYER_METHODS, paired, resnet50_case

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.options import PerturbationOptions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rise-masks", type=int, default=PerturbationOptions().rise_masks)
    parser.add_argument("--black-box-only", action="store_true", help="time only rise and occlusion")
    args = parser.parse_args()

    device = torch.device(args.device)
    model, inputs, target, forward = resnet50_case(device)

    print(f"ResNet-50, 1x3x224x224, layer4, {device}: time / plain forward pass")
    for method in [] if args.black_box_only else ["gradcam", *NEWER_LAYER_METHODS]:
        score = "softmax" if method == "shapleycam" else "logit"
        explainer = Explainer(model, "layer4", method, score=score)
        took, base = paired(lambda e=explainer: e.compute(inputs, target), forward, device, args.repeats)
        print(f"  {method:<20} {took / base:6.2f}x  ({took * 1000:.0f} ms vs {base * 1000:.0f} ms)", flush=True)
    options = PerturbationOptions(rise_masks=args.rise_masks)
    for method in BLACK_BOX_METHODS:
        explainer = Explainer(model, None, method, perturbation=options)
        took, base = paired(lambda e=explainer: e.compute(inputs, target), forward, device, 1, warm_up=False)
        print(
            f"  {method:<20} {took / base:6.1f}x  {1 / took:.3f} images/s  ({took:.1f} s vs {base * 1000:.0f} ms)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
