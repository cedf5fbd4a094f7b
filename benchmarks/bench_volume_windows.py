"""Grad-CAM of a volume over sliding windows (gradcam_cli.cam.windows) against the model's own sliding-window
inference (MONAI's ``sliding_window_inference``, Gaussian weights, the same windows), issue 37 point 6: time and
peak memory as ratios; the goal is at most 2x the time and 1.5x the memory.

The model is nnU-Net's 3-D U-Net (``PlainConvUNet`` of dynamic_network_architectures, 5 stages, 16 to 128 features,
random weights), explained at its bottleneck (``encoder.stages.4``) for one class; the volume 128 x 128 x 96 voxels
and the patch 64^3 at step 0.5, where nnU-Net's and MONAI's windows are the same 18, 2 per batch. Each side runs in
a child process of its own; its memory is the growth of the process's resident set during its first run over the
state with the model and the volume built (sampled every 5 ms; glibc's fixed ``MALLOC_MMAP_THRESHOLD_`` maps every
tensor of 64 kB or more on its own, so that freed tensors leave the resident set and it follows what is held), its
time the best of ``--repeat`` runs.

Usage: ``python benchmarks/bench_volume_windows.py [--shape D,H,W] [--patch N] [--repeat N] [--device cpu]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MB = 1e6


def network(device: str):
    import torch
    from dynamic_network_architectures.architectures.unet import PlainConvUNet
    from torch import nn

    torch.manual_seed(0)
    stages = 5
    net = PlainConvUNet(
        1,
        stages,
        [16, 32, 64, 128, 128],
        nn.Conv3d,
        [[3, 3, 3]] * stages,
        [[1, 1, 1]] + [[2, 2, 2]] * (stages - 1),
        [2] * stages,
        3,
        [2] * (stages - 1),
        conv_bias=True,
        norm_op=nn.InstanceNorm3d,
        norm_op_kwargs={"eps": 1e-5, "affine": True},
        nonlin=nn.LeakyReLU,
        nonlin_kwargs={"inplace": True},
    )
    return net.eval().requires_grad_(False).to(device)


class PeakRss:
    """The process's resident set sampled every 5 ms: its growth over the moment it was started, at its peak."""

    def __init__(self) -> None:
        self.start = self.peak = self.rss()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.005)

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.rss())


def side(name: str, shape: tuple[int, ...], patch: int, batch: int, device: str, repeat: int) -> dict[str, float]:
    """One side's best time and its memory growth, in this process."""
    import torch

    from gradcam_cli import Explainer
    from gradcam_cli.cam.windows import Windows, explain_volume
    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.profile import LoadedModel

    net = network(device)
    volume = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0)).to(device)
    windows = Windows((patch,) * 3, batch_size=batch)
    if name == "monai":
        from monai.inferers import sliding_window_inference

        def run() -> None:
            with torch.no_grad():
                sliding_window_inference(
                    volume[None], windows.patch, batch, net, overlap=0.5, mode="gaussian", sigma_scale=0.125
                )

        with torch.no_grad():  # as the explainer's dry pass: one window's forward pass
            net(volume[None, :, :patch, :patch, :patch])
    else:
        model = LoadedModel(net, "unet", "random", None, InputSpec(shape=(1, *windows.patch)), task="segment")
        explainer = Explainer(model, "encoder.stages.4", ["gradcam"])

        def run() -> None:
            explain_volume(explainer, volume, windows, classes=[1])

    with PeakRss() as memory:  # the first run: nothing freed earlier for the allocator to reuse
        started = time.perf_counter()
        run()
        best = time.perf_counter() - started
    for _ in range(repeat - 1):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    growth = memory.peak - memory.start
    return {"seconds": best, "bytes": growth}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="128,128,96")
    parser.add_argument("--patch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--batch", type=int, default=2, help="windows per batch of MONAI's and of the first Grad-CAM run"
    )
    parser.add_argument("--side", choices=("ours", "monai"), help=argparse.SUPPRESS)
    parser.add_argument("--side-batch", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(side) for side in args.shape.split(","))
    if args.side:
        print(json.dumps(side(args.side, shape, args.patch, args.side_batch, args.device, args.repeat)))
        return 0
    try:
        import dynamic_network_architectures  # noqa: F401
        import monai  # noqa: F401
    except ImportError as error:
        print(f"skipped: needs the medical extra ({error})")
        return 0
    results: dict[tuple[str, int], dict[str, float]] = {}
    runs = [("monai", args.batch), ("ours", args.batch), ("ours", 1)] if args.batch > 1 else [("monai", 1), ("ours", 1)]
    for name, batch in runs:
        command = [sys.executable, __file__, "--side", name, "--side-batch", str(batch), *sys.argv[1:]]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}
        output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
        results[name, batch] = json.loads(output.strip().splitlines()[-1])
    theirs = results["monai", args.batch]
    print(f"volume {args.shape} voxels, patch {args.patch}^3 at step 0.5 (Gaussian), {args.device}")
    print(f"  {'':<48} {'seconds':>8} {'memory':>10} {'time':>6} {'memory':>7}")
    for (name, batch), result in results.items():
        label = "MONAI sliding_window_inference" if name == "monai" else "Grad-CAM at the bottleneck, windows"
        ratios = f"{result['seconds'] / theirs['seconds']:5.2f}x {result['bytes'] / max(theirs['bytes'], 1):6.2f}x"
        print(
            f"  {label + f', {batch} per batch':<48} {result['seconds']:8.2f} {result['bytes'] / MB:7.1f} MB {ratios}"
        )
    print("  (ratios against MONAI's; goal <= 2x time, <= 1.5x memory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
