"""``gradcam eval --rank``'s cost per image (issue 30): each method's estimated seconds per image from the plan's
timed pass, the plan ``--method all`` gets on a CPU within the default budget, and one measured image of that plan.

ResNet-50 (random weights, seeded), one 224x224 input, ``layer4``, the ``--rank`` settings (50 steps, ROAD, the
3-stage sanity cascade, 3 stability copies, randomcam over 4 draws) and the method defaults (RISE 4,000 masks,
occlusion window 32 stride 16). The estimates are :func:`gradcam_cli.evaluation.plan.estimate`'s (each method's
explanation timed once on the image, the masked-input methods for 2 s and extrapolated); the plan is
:func:`~gradcam_cli.evaluation.plan.choose`'s for ``--images`` images and ``--budget`` seconds; then one image is
evaluated with the methods kept, timed, against the plan's sum for them.

``--sharing`` measures instead what sharing batched passes across the stability copies would gain: the masked
inputs of 3 copies forwarded as 3 passes of ``--score-batch-size`` (32, today's path) against 1 pass of 3 x 32
(shared), in the same run, best of ``--repeats``. (The cascade's stages cannot share a pass: their weights differ.)

Usage: ``python benchmarks/bench_rank.py [--device cpu|cuda] [--images N] [--budget SECONDS] [--sharing]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_methods import resnet50_case
from PIL import Image

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.plan import BUDGET, choose, estimate, with_methods
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.options import EvalOptions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--images", type=int, default=1, help="images the plan is for")
    parser.add_argument("--budget", type=float, default=BUDGET)
    parser.add_argument("--sharing", action="store_true", help="measure shared masked passes instead")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    device = torch.device(args.device)
    module, inputs, target, _ = resnet50_case(device)
    if args.sharing:
        return sharing(module, inputs, args.repeats)
    loaded = LoadedModel(module, "resnet50", "none", None, InputSpec(size=224))
    explainer = Explainer(loaded, "layer4", ["all"], target=target, device=device)
    options = EvalOptions(sanity=True, road=True, stability=True)
    print(f"ResNet-50, 224x224, layer4, {device}, --rank settings: estimated seconds per image", flush=True)
    seconds = estimate(explainer, inputs, options, on_method=lambda m: print(f"  timing {m} ...", flush=True))
    for method, cost in seconds.items():
        print(f"  {method:<20} {cost:8.1f} s", flush=True)
    print(f"  {'all (default settings)':<20} {sum(seconds.values()):8.1f} s")
    plan = choose(seconds, args.images, args.budget)
    for line in plan.lines():
        print(line)
    kept = with_methods(explainer, plan.kept)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "noise.png"
        pixels = (torch.rand(224, 224, 3, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
        Image.fromarray(pixels.numpy()).save(path)
        started = time.perf_counter()
        report = Evaluator(kept, options).run([path])
        took = time.perf_counter() - started
    assert not report.failed, report.failed[0].error
    planned = sum(seconds[m] for m in plan.kept)
    kept_count = len(plan.kept)
    print(f"measured: the budgeted plan's {kept_count} methods on one image in {took:.1f} s (planned {planned:.1f} s)")
    return 0


def sharing(module: torch.nn.Module, inputs: torch.Tensor, repeats: int, copies: int = 3, batch: int = 32) -> int:
    """Seconds per masked input: ``copies`` passes of ``batch`` (unshared) against one of ``copies * batch``."""
    masked = inputs.expand(copies * batch, *inputs.shape[1:]).contiguous()
    masked = masked * torch.rand(masked.shape[0], 1, *inputs.shape[2:], generator=torch.Generator().manual_seed(0)).to(
        inputs.device
    )

    def timed(work: Callable[[], object]) -> float:
        best = math.inf
        for _ in range(repeats):
            started = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - started)
        return best / masked.shape[0]

    with torch.inference_mode():
        module(masked[:batch])  # warm-up
        unshared = timed(lambda: [module(masked[i * batch : (i + 1) * batch]) for i in range(copies)])
        shared = timed(lambda: module(masked))
    print(f"ResNet-50, 224x224, {inputs.device}, torch threads {torch.get_num_threads()}: seconds per masked input")
    print(f"  unshared ({copies} passes of {batch}): {unshared:.4f} s")
    print(f"  shared   (1 pass of {copies * batch}):  {shared:.4f} s  (ratio shared/unshared {shared / unshared:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
