"""The cost of explaining every YOLO detection, against a plain ``model.predict`` and ultralytics' ``visualize=True``.

YOLO11n (``yolo11n.yaml``, random weights, saved once as a checkpoint that both sides load), the photos of
``sample_images/`` repeated to ``--images`` (64), one image at a time, at ``--input-size`` (640). Cases:

* ``predict``: ``YOLO(checkpoint).predict(image, conf=CONF)``, the baseline;
* ``visualize=True``: the same with ultralytics' own activation map (one combined LayerCAM map per image: a
  backward pass to the head inputs for each of up to 16 predictions above ``conf``, their maps' element-wise maximum);
* ``gradcam-cli``: ``Explainer.explain`` with Grad-CAM at the head inputs, every detection NMS keeps at
  ``--score-threshold CONF`` explained (at most 10 per image: random weights give 10 with a low threshold), plus the
  combined map, upsampled to the photo.

Printed: each case's seconds per image and its ratio to ``predict``, measured in the same run. Ratios only: the
machine's speed cancels out.

Usage: ``python benchmarks/bench_yolo.py [--images N] [--input-size S] [--threads N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.io.images import load_image
from gradcam_cli.models.loading import load_model
from gradcam_cli.models.yolo import offline_ultralytics
from gradcam_cli.options import ModelOptions

CONF = 1e-5
"""Low enough that a randomly initialised YOLO11n (class logits near -10) keeps 10 detections or more per photo."""
MAX_DETECTIONS = 10


def seconds_per_image(run: Callable[[object], object], images: list[object]) -> float:
    run(images[0])  # warm-up
    started = time.perf_counter()
    for image in images:
        run(image)
    return (time.perf_counter() - started) / len(images)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--input-size", type=int, default=640)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    offline_ultralytics()
    from ultralytics import YOLO

    photos = sorted((Path(__file__).resolve().parent.parent / "sample_images").glob("*.jpg"))
    pil = [load_image(photos[i % len(photos)]) for i in range(args.images)]
    arrays = [np.ascontiguousarray(np.asarray(image)[:, :, ::-1]) for image in pil]  # BGR, as ultralytics reads
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "yolo11n_random.pt"
        torch.manual_seed(0)
        YOLO("yolo11n.yaml").save(checkpoint)
        yolo = YOLO(str(checkpoint))
        options = {"imgsz": args.input_size, "conf": CONF, "max_det": 300, "verbose": False}
        loaded = load_model(ModelOptions(f"yolo:{checkpoint}", input_size=args.input_size))
        explainer = Explainer(loaded, score_threshold=CONF, max_detections=MAX_DETECTIONS)
        counts = [len(explainer.explain(image).predictions) for image in pil[:3]]
        print(
            f"YOLO11n (random weights), {args.images} photos one at a time at {args.input_size}, "
            f"{torch.get_num_threads()} threads; detections explained per photo: {counts[0]} (of at most "
            f"{MAX_DETECTIONS}), plus the combined map"
        )
        cases = {
            "predict": lambda image: yolo.predict(image, **options),
            "visualize=True (one combined map)": lambda image: yolo.predict(
                image, visualize=True, project=folder, name="visualize", exist_ok=True, **options
            ),
        }
        times = {name: seconds_per_image(run, arrays) for name, run in cases.items()}
        times["gradcam-cli (a map per detection)"] = seconds_per_image(explainer.explain, pil)
    base = times["predict"]
    print(f"{'case':<40} {'per image':>10}  ratio to predict")
    for name, seconds in times.items():
        print(f"{name:<40} {seconds * 1000:7.0f} ms  {seconds / base:6.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
