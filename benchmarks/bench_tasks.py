"""The cost of explaining a detector's detections and a segmenter's classes, against a plain forward pass.

Faster R-CNN (ResNet-50 FPN) and DeepLabV3 (ResNet-50), random weights (nothing is downloaded), on the sample
photos at the models' own input sizes (800 for Faster R-CNN, 520 for DeepLabV3; ``--input-size`` changes both).
Random weights score every box alike, so the detector's own score threshold is set to 0 and the explainer takes
the ``--detections`` best boxes whatever their score: each costs one backward pass, and the combined map one more.

The baseline is the model on the same batch under ``torch.no_grad()``. The explaining is
:meth:`Explainer.compute_targets` with Grad-CAM at the default layer (hooks, the forward pass with gradients, one
backward pass per target, the maps; no upsampling or file writing). Both are timed in alternation, so that a busy
machine slows both alike; times are medians over ``--repeats`` rounds after a warm-up.

Usage: ``python benchmarks/bench_tasks.py [--device cpu|cuda] [--repeats N] [--detections N] [--input-size N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_methods import paired

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.models.loading import LoadedModel, load_model

ROOT = Path(__file__).resolve().parent.parent

PHOTOS = ("chelsea.jpg", "chelsea.jpg")
"""The batch: the same photo twice, so that every image has the same shape and the batch is one tensor."""


def batch_for(model: LoadedModel, device: torch.device) -> torch.Tensor:
    """The sample photos as the model's network input (a detector's: pixels in [0, 1], scaled as its transform
    would scale them)."""
    images = [load_image(ROOT / "sample_images" / name) for name in PHOTOS]
    return torch.stack([to_input_tensor(image, model.input_spec) for image in images]).to(device)


def detector(input_size: int | None, detections: int, device: torch.device) -> tuple[Explainer, torch.Tensor]:
    loaded = load_model("fasterrcnn_resnet50_fpn", "none", input_size=input_size)
    loaded.module.roi_heads.score_thresh = 0.0  # random weights: every class scores about 1/91
    loaded.module.eval().to(device)
    return Explainer(loaded, score_threshold=0.0, max_detections=detections), batch_for(loaded, device)


def segmenter(input_size: int | None, device: torch.device) -> tuple[Explainer, torch.Tensor]:
    loaded = load_model("deeplabv3_resnet50", "none", input_size=input_size)
    loaded.module.eval().to(device)
    return Explainer(loaded, top_k=2, target=None), batch_for(loaded, device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--detections", type=int, default=5)
    parser.add_argument("--input-size", type=int, default=None)
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    threads = f", {torch.get_num_threads()} CPU threads" if device.type == "cpu" else ""
    print(f"random weights, a batch of {len(PHOTOS)} photos on {device}{threads}; gradcam at the default layer")
    print(f"{'case':<52} {'explain':>10} {'forward':>10}  ratio")
    cases = [("fasterrcnn_resnet50_fpn", *detector(args.input_size, args.detections, device))]
    cases.append(("deeplabv3_resnet50", *segmenter(args.input_size, device)))
    for name, explainer, inputs in cases:
        module = explainer.model.module
        targets, _ = explainer.compute_targets(inputs)
        detect = explainer.model.task == "detect"
        what = f"{targets.count - 1} detections + combined" if detect else f"{targets.count} classes"
        label = f"{name} {'x'.join(map(str, inputs.shape[-2:]))}, {what}"

        def forward(module=module, inputs=inputs) -> None:
            with torch.no_grad():
                module(inputs)

        seconds, baseline = paired(lambda e=explainer, x=inputs: e.compute_targets(x), forward, device, args.repeats)
        print(f"{label:<52} {seconds * 1000:7.0f} ms {baseline * 1000:7.0f} ms {seconds / baseline:6.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
