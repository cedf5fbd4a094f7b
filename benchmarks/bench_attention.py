"""The attention methods' cost (issue 31) relative to a plain forward pass, on ViT-B/16 and DINOv2-S at 224.

timm's ``vit_base_patch16_224`` and ``vit_small_patch14_dinov2`` (random weights, seeded; DINOv2 at 224, a 16x16
grid), one 224x224 image, one target; the baseline is ``model(x)`` under ``torch.no_grad()`` on the fused path,
timed in alternation with each case (``bench_methods.paired``), medians over ``--repeats`` rounds. ``gradcam`` at
the default layer is timed beside them for scale.

Usage: ``python benchmarks/bench_attention.py [--device cpu|cuda] [--repeats N] [--models NAME,...]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_methods import paired

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.loading import LoadedModel

MODELS = ("vit_base_patch16_224", "vit_small_patch14_dinov2")
CASES = ("rollout", "attention", "attn-grad", "legrad", "gradcam")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    device = torch.device(args.device)
    for name in args.models.split(","):
        torch.manual_seed(0)
        module = timm.create_model(name, pretrained=False, img_size=224).eval().requires_grad_(False).to(device)
        inputs = torch.randn(1, 3, 224, 224, device=device)
        spec = InputSpec(224, (224, 224))
        loaded = LoadedModel(module, name, "random", None, spec, prefix_tokens=int(module.num_prefix_tokens))

        def forward(module: torch.nn.Module = module, inputs: torch.Tensor = inputs) -> None:
            with torch.no_grad():
                module(inputs)

        print(f"{name}, 1x3x224x224, {device}: time / plain forward pass", flush=True)
        for method in CASES:
            explainer = Explainer(loaded, methods=[method])
            took, base = paired(lambda e=explainer, x=inputs: e.compute(x, 0), forward, device, args.repeats)
            print(f"  {method:<10} {took / base:6.2f}x  ({took * 1000:.0f} ms vs {base * 1000:.0f} ms)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
