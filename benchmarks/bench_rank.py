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

``--shared-pass`` measures what explaining the methods that read the captured pass together saves in the evaluation
itself (:mod:`gradcam_cli.evaluation.shared`): one image evaluated with the ``--rank`` settings (``--steps``, at
``--size`` pixels) by Grad-CAM, Grad-CAM++, LayerCAM, XGrad-CAM, HiResCAM, EigenCAM and randomcam, sharing their
passes against one method at a time, run alternately ``--repeats`` times each in the same process; it prints the
ratio of the best times (shared / one at a time) and checks that both give the same figures.

``--photos DIR`` measures the plan against the whole run (issue 41): ``gradcam eval DIR --rank --method all
--model MODEL`` (``--model``, default ``efficientnet_lite0``; ``--budget`` when given) run as a user runs it, and
the plan's total (timing, main pass and seed spread) printed against the time the run then took, as a ratio
(actual / plan), with the methods ranked. The machine's load average is printed beside it: compare the ratio, not
the seconds.

``--road-solve`` measures ROAD's imputation of one 224x224 image's 18 masks (a Grad-CAM-like map: a 7 x 7 map
upsampled) on the CPU: the direct sparse LU (today's CPU path) against the conjugate gradients (the path before,
still the accelerators'), alternating ``--repeats`` times, in CPU seconds (``time.process_time``), with the ratio
of the best and the largest difference between the two.

Usage: ``python benchmarks/bench_rank.py [--device cpu|cuda] [--images N] [--budget SECONDS] [--sharing]
[--shared-pass [--steps N] [--size PIXELS] [--no-road]] [--photos DIR [--model NAME]] [--road-solve]``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
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
    parser.add_argument("--budget", type=float, default=None, help=f"default {BUDGET:.0f}")
    parser.add_argument("--photos", type=Path, help="measure `gradcam eval DIR --rank --method all`'s plan instead")
    parser.add_argument("--model", default="efficientnet_lite0", help="with --photos: the model")
    parser.add_argument("--sharing", action="store_true", help="measure shared masked passes instead")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--shared-pass", action="store_true", help="measure the evaluation's shared passes instead")
    parser.add_argument("--steps", type=int, default=10, help="with --shared-pass: curve steps")
    parser.add_argument("--size", type=int, default=128, help="with --shared-pass: the input's side")
    parser.add_argument("--no-road", action="store_true", help="with --shared-pass: without ROAD (its imputation)")
    parser.add_argument("--road-solve", action="store_true", help="measure ROAD's direct against iterative solve")
    args = parser.parse_args()

    if args.road_solve:
        return road_solve(args.repeats)
    if args.photos is not None:
        return plan_against_run(args.photos, args.model, args.budget)
    device = torch.device(args.device)
    module, inputs, target, _ = resnet50_case(device)
    if args.sharing:
        return sharing(module, inputs, args.repeats)
    if args.shared_pass:
        return shared_pass(module, device, args.repeats, args.steps, args.size, not args.no_road)
    loaded = LoadedModel(module, "resnet50", "none", None, InputSpec(size=224))
    explainer = Explainer(loaded, "layer4", ["all"], target=target, device=device)
    options = EvalOptions(sanity=True, road=True, stability=True)
    print(f"ResNet-50, 224x224, layer4, {device}, --rank settings: estimated seconds per image", flush=True)
    costs = estimate(explainer, inputs, options, on_method=lambda m: print(f"  timing {m} ...", flush=True))
    seconds = costs.seconds
    for method, cost in seconds.items():
        print(f"  {method:<20} {cost:8.1f} s", flush=True)
    print(f"  {'all (default settings)':<20} {sum(seconds.values()):8.1f} s")
    plan = choose(costs, args.images, BUDGET if args.budget is None else args.budget)
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


def road_solve(repeats: int) -> int:
    """ROAD's imputation on the CPU: the direct solve against the iterative one (CPU seconds, best of ``repeats``)."""
    from gradcam_cli.evaluation import road

    generator = torch.Generator().manual_seed(0)
    image = torch.randn(3, 224, 224, generator=generator)
    coarse = torch.rand(1, 1, 7, 7, generator=generator)
    saliency = torch.nn.functional.interpolate(coarse, size=(224, 224), mode="bilinear")[0, 0]
    removed = torch.cat(road.road_masks(saliency))
    images = image.expand(removed.shape[0], *image.shape)
    unknown = removed.float().unsqueeze(1)

    def direct() -> torch.Tensor:
        return torch.stack([road._direct(x, mask) for x, mask in zip(images, removed, strict=True)])

    def iterative() -> torch.Tensor:
        return torch.where(removed.unsqueeze(1), road._iterative(images, unknown, road.ROAD_TOLERANCE), images)

    best = {"direct": math.inf, "iterative": math.inf}
    results = {}
    for _ in range(repeats):
        for name, solve in (("iterative", iterative), ("direct", direct)):
            started = time.process_time()
            results[name] = solve()
            best[name] = min(best[name], time.process_time() - started)
    difference = (results["direct"] - results["iterative"]).abs().max().item()
    print(f"ROAD imputation, one 224x224 image, {removed.shape[0]} masks, CPU seconds (best of {repeats}):")
    print(f"  iterative (conjugate gradients, before) {best['iterative']:6.2f} s")
    print(f"  direct (sparse LU, now)                 {best['direct']:6.2f} s")
    print(f"  ratio new / old {best['direct'] / best['iterative']:.2f}; largest difference {difference:.1e}")
    return 0


def plan_against_run(photos: Path, model: str, budget: float | None) -> int:
    """``gradcam eval PHOTOS --rank --method all --model MODEL``: its plan's total against the time it took."""
    command = [sys.executable, "-m", "gradcam_cli", "eval", str(photos), "--rank", "--method", "all", "--model", model]
    command += ["--budget", str(budget)] if budget is not None else []
    load = os.getloadavg()[0]
    print(f"{' '.join(command[2:])}  (CPUs {os.cpu_count()}, torch threads {torch.get_num_threads()}, load {load:.1f})")
    root = str(Path(__file__).resolve().parent.parent)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    plan = [line for line in done.stderr.splitlines() if line.startswith("plan:") and "timing each" not in line]
    print("\n".join(plan))
    total = re.search(r"plan: .* about (\d+)s in all", done.stderr)
    taken = re.search(r"in ([\d.]+)s \(the plan said", done.stderr)
    if done.returncode or total is None or taken is None:
        print(done.stderr[-3000:])
        return 1
    ranked = sorted({line.split()[2] for line in done.stdout.splitlines() if re.match(r"\s+\d+\.\s", line)})
    print(f"ranked: {', '.join(ranked)}")
    planned, actual = float(total[1]), float(taken[1])
    print(f"plan {planned:.0f} s, actual {actual:.0f} s: ratio actual/plan {actual / planned:.2f}")
    print(f"load average now {os.getloadavg()[0]:.1f} (at the start {load:.1f})")
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


SHARED = ("gradcam", "gradcam++", "layercam", "xgradcam", "hirescam", "eigencam", "randomcam")


def shared_pass(module: torch.nn.Module, device: torch.device, repeats: int, steps: int, size: int, road: bool) -> int:
    """Seconds to evaluate one image with :data:`SHARED` sharing their passes, and one method at a time."""
    from gradcam_cli.evaluation import evaluate

    loaded = LoadedModel(module, "resnet50", "none", None, InputSpec(size=size))
    explainer = Explainer(loaded, "layer4", list(SHARED), device=device)
    options = EvalOptions(steps=steps, sanity=True, road=road, stability=True)
    grouped = evaluate.pass_groups
    times: dict[str, list[float]] = {"shared": [], "alone": []}
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "noise.png"
        pixels = (torch.rand(size, size, 3, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
        Image.fromarray(pixels.numpy()).save(path)
        for _ in range(repeats):
            for mode in ("alone", "shared"):
                evaluate.pass_groups = grouped if mode == "shared" else lambda ms: {m: (m,) for m in ms}  # type: ignore[assignment]
                started = time.perf_counter()
                report = Evaluator(explainer, options).run([path])
                times[mode].append(time.perf_counter() - started)
                figures[mode] = report.to_dict()["per_image"]
                print(f"  {mode:<7} {times[mode][-1]:6.1f} s", flush=True)
    evaluate.pass_groups = grouped  # type: ignore[assignment]
    shared, alone = min(times["shared"]), min(times["alone"])
    settings = "--rank settings" if road else "--rank settings without ROAD"
    print(f"ResNet-50, {size}x{size}, {device}, {settings}, {steps} steps, {len(SHARED)} methods, one image:")
    print(
        f"  one method at a time {alone:.1f} s, shared passes {shared:.1f} s: ratio shared/alone {shared / alone:.2f}"
    )
    print(f"  same figures: {figures['shared'] == figures['alone']}")
    return 0 if figures["shared"] == figures["alone"] else 1


if __name__ == "__main__":
    sys.exit(main())
