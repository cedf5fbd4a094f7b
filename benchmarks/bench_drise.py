"""The cost of D-RISE and of the box-level ``gradcam eval`` per image, against plain forward passes of the detector.

Two detectors with random weights (nothing is downloaded): torchvision's mobile Faster R-CNN
(``fasterrcnn_mobilenet_v3_large_320_fpn``, its own 320 input; its score threshold set to 0, as random weights score
every class alike) and YOLOv8n (``yolov8n.yaml``, random weights, saved once as a checkpoint and loaded as
``yolo:PATH``, at ``--yolo-size`` (320), ``--score-threshold`` 1e-5 so that it keeps detections). One sample photo,
explained as ``gradcam IMG --method drise`` explains it (:meth:`Explainer.explain`: the explained pass, the masked
passes, the maps upsampled to the photo). Cases:

* ``drise``: ``--masks`` N masks (1,000), ``--score-batch-size`` (32) masked copies per forward pass, against the
  baseline: N plain forward passes of the same network input under ``torch.no_grad()``, in batches of the same size.
  The ratio says what the similarity scoring, the mask drawing and the weighted sums add to the passes (goal <=
  1.1x); it is a ratio per mask, so a smaller ``--masks`` measures it too, on a busy machine;
* ``eval``: the box-level ``gradcam eval`` (library :func:`evaluate`, Grad-CAM, ``--eval-steps`` (50) steps,
  batches of 16) of the photo's ``--detections`` (3) best detections, against as many plain forward passes as it
  perturbs images (2 + 2 x detections x (steps - 1)), in batches of the same size: what the explanation, the
  perturbing and the re-finding add to those passes. Its seconds are the eval's cost per image.

Each case and its baseline are timed in alternation (baseline, case, baseline), after a warm-up of each; printed:
the medians of ``--repeats`` rounds and the ratio's spread over the rounds (each round's case against the mean of
the baselines either side of it). A busy machine slows both alike; run it under ``nice`` and record the load.

Usage: ``python benchmarks/bench_drise.py [--masks N] [--repeats N] [--device cpu|cuda] [--detections N]
[--eval-steps N] [--yolo-size N] [--skip-yolo] [--skip-faster-rcnn] [--skip-eval]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_methods import _seconds, _sync

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.evaluation.choose import evaluate
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.models.loading import LoadedModel, load_model
from gradcam_cli.models.yolo import offline_ultralytics
from gradcam_cli.options import EvalOptions, ModelOptions, PerturbationOptions

ROOT = Path(__file__).resolve().parent.parent
PHOTO = ROOT / "sample_images" / "chelsea.jpg"
YOLO_CONF = 1e-5
"""Low enough that a randomly initialised YOLOv8n keeps detections (its class logits are near -10)."""


def faster_rcnn(folder: Path, size: int) -> tuple[LoadedModel, float]:
    """The mobile Faster R-CNN (random weights, backbone included) and the score threshold that keeps boxes."""
    del folder, size  # its own input size: 320
    torch.manual_seed(0)
    loaded = load_model("fasterrcnn_mobilenet_v3_large_320_fpn", "none")
    loaded.module.roi_heads.score_thresh = 0.0  # random weights: every class scores about 1/91
    return loaded, 0.0


def yolo(folder: Path, size: int) -> tuple[LoadedModel, float]:
    """YOLOv8n from its model file, random weights, loaded as ``yolo:PATH`` at ``size``."""
    offline_ultralytics()
    from ultralytics import YOLO

    checkpoint = folder / "yolov8n_random.pt"
    torch.manual_seed(0)
    YOLO("yolov8n.yaml").save(checkpoint)
    return load_model(ModelOptions(f"yolo:{checkpoint}", input_size=size)), YOLO_CONF


def forwards(
    loaded: LoadedModel, inputs: torch.Tensor, count: int, batch: int, explainer: Explainer
) -> Callable[[], None]:
    """``count`` plain forward passes of ``inputs`` (1, 3, H, W) under ``torch.no_grad()``, ``batch`` at a time,
    under ``explainer``'s pass settings (a YOLO model's confidence threshold: its NMS keeps what the case's does)."""
    module = loaded.module.eval()
    full, rest = divmod(count, batch)
    batches = [inputs.expand(batch, -1, -1, -1).contiguous()] * full + [inputs.expand(rest, -1, -1, -1).contiguous()]

    def run() -> None:
        with torch.no_grad(), explainer.adapter.pass_settings(explainer.score):
            for chunk in batches:
                if chunk.shape[0]:
                    module(chunk)

    return run


def rounds(function: Callable[[], object], baseline: Callable[[], None], device: torch.device, repeats: int) -> str:
    """``function`` against ``baseline``, alternated (baseline, function, baseline) over ``repeats`` rounds after a
    warm-up of each: "median s, baseline median s, median ratio (lowest-highest round's ratio)"."""
    function()
    baseline()
    _sync(device)
    before = _seconds(baseline, device)
    cases, baselines, ratios = [], [before], []
    for _ in range(repeats):
        case = _seconds(function, device)
        after = _seconds(baseline, device)
        cases.append(case)
        baselines.append(after)
        ratios.append(case / ((before + after) / 2))
        before = after
    spread = f"({min(ratios):.2f}-{max(ratios):.2f})" if repeats > 1 else ""
    median = statistics.median
    return f"{median(cases):8.2f} s {median(baselines):8.2f} s {median(ratios):6.2f}x {spread}"


def eval_passes(detections: int, steps: int) -> int:
    """The images the box-level eval perturbs for one image: the zero and the blurred one, and each detection's
    deletion and insertion steps (:mod:`gradcam_cli.evaluation.detections`)."""
    return 2 + 2 * detections * (steps - 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masks", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--score-batch-size", type=int, default=32)
    parser.add_argument("--detections", type=int, default=3)
    parser.add_argument("--eval-steps", type=int, default=50)
    parser.add_argument("--yolo-size", type=int, default=320)
    parser.add_argument("--skip-yolo", action="store_true")
    parser.add_argument("--skip-faster-rcnn", action="store_true")
    parser.add_argument("--skip-eval", action="store_true")
    args = parser.parse_args()

    device = torch.device(args.device)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    threads = f", {torch.get_num_threads()} CPU threads" if device.type == "cpu" else ""
    print(f"random weights, {PHOTO.name} one image at a time on {device}{threads}, load average {load:.1f}")
    print(f"{'case':<62} {'case':>10} {'baseline':>10}  ratio (spread)")
    photo = load_image(PHOTO)
    builders = {"fasterrcnn_mobilenet_v3_large_320_fpn": faster_rcnn, "yolov8n (yolo:)": yolo}
    if args.skip_yolo:
        del builders["yolov8n (yolo:)"]
    if args.skip_faster_rcnn:
        del builders["fasterrcnn_mobilenet_v3_large_320_fpn"]
    with tempfile.TemporaryDirectory() as folder:
        for name, build in builders.items():
            loaded, threshold = build(Path(folder), args.yolo_size)
            loaded.module.eval().to(device)
            inputs = to_input_tensor(photo, loaded.input_spec)[None].to(device)
            size = "x".join(map(str, inputs.shape[-2:]))
            drise = Explainer(
                loaded,
                None,
                "drise",
                device,
                perturbation=PerturbationOptions(rise_masks=args.masks),
                score_batch_size=args.score_batch_size,
                score_threshold=threshold,
                max_detections=args.detections,
            )
            explained = len(drise.explain(photo).predictions)
            label = f"{name} {size}: drise, {args.masks} masks, {explained} det."
            timed = rounds(
                lambda e=drise: e.explain(photo),
                forwards(loaded, inputs, args.masks, args.score_batch_size, drise),
                device,
                args.repeats,
            )
            print(f"{label:<62} {timed}", flush=True)
            if args.skip_eval:
                continue
            explainer = Explainer(
                loaded, None, "gradcam", device, score_threshold=threshold, max_detections=args.detections
            )
            options = EvalOptions(steps=args.eval_steps)
            passes = eval_passes(explained, options.steps)
            timed = rounds(
                lambda e=explainer, o=options: evaluate(e, [PHOTO], o),
                forwards(loaded, inputs, passes, options.batch_size, explainer),
                device,
                args.repeats,
            )
            label = f"{name} {size}: eval, gradcam, {explained} det., {options.steps} steps ({passes} passes)"
            print(f"{label:<62} {timed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
