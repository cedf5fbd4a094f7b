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

Usage: ``python benchmarks/bench_volume_windows.py [--shape D,H,W] [--patch N] [--repeat N] [--rounds N]
[--net plain|narrow] [--batch N] [--device cpu]``. ``--rounds N`` alternates the sides' processes N times (best
time, median memory), so that a busy machine slows both alike.

``--large`` runs the comparison at the CT's scale (issue 37's case): 512 x 512 x 300 (or ``--shape``), 128^3
windows, 1 per batch, one run per process, with the narrow MONAI ``UNet`` of ``--scan`` (``--net narrow``,
explained at its innermost ``submodule``), where MONAI's own output buffers ((classes, D, H, W) logits and a count
map) weigh as the windows' map and summed weights do.

``--scan`` measures the command line instead (issue 37 point 6): a synthetic CT-like scan of ``--shape`` (default
there 512 x 512 x 300, int16 NIfTI in a temporary folder) explained by ``gradcam SCAN -m monai:UNet --weights
unet.pt --top-k 1``: a MONAI 3-D ``UNet`` (4, 8 and 16 channels, strides 2, no residual units, 3 classes, random
weights; narrow, so that 196 windows finish on a shared 2-core machine) whose profile (``unet.json``) says its patch,
``--patch`` (default there 128), step 0.5 and a CT normalisation, the class-counting pass included. The child's peak
resident set (sampled every 10 ms) is set against the sum of what it is documented
to hold, counted from the shapes.
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


def network(device: str, kind: str = "plain"):
    """(the network, the layer explained): nnU-Net's ``PlainConvUNet`` at ``encoder.stages.4``, or (``narrow``) the
    synthetic CT's MONAI ``UNet`` (:func:`scan_profile`) at its innermost ``submodule``."""
    import torch

    if kind == "narrow":
        from monai.networks.nets import UNet

        from gradcam_cli.models.families.monai_net import bottleneck

        torch.manual_seed(0)
        unet = UNet(3, 1, 3, channels=(4, 8, 16), strides=(2, 2), num_res_units=0)
        return unet.eval().requires_grad_(False).to(device), bottleneck("UNet", unet)[0]
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
    return net.eval().requires_grad_(False).to(device), "encoder.stages.4"


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


def side(name: str, shape: tuple[int, ...], patch: int, batch: int, args: argparse.Namespace) -> dict[str, float]:
    """One side's best time and its memory growth, in this process."""
    import torch

    from gradcam_cli import Explainer
    from gradcam_cli.cam.windows import Windows, explain_volume
    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.profile import LoadedModel

    device, repeat = args.device, args.repeat
    net, layer = network(device, args.net)
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
        explainer = Explainer(model, layer, ["gradcam"])

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


def ct_like(shape: tuple[int, ...]):
    """An int16 CT-like (x, y, z) volume in HU: air, an elliptic body of soft tissue with noise, a bright ring of bone
    and a darker organ."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.linspace(-1, 1, shape[0], dtype=np.float32)[:, None]
    y = np.linspace(-1, 1, shape[1], dtype=np.float32)[None, :]
    radius = (x / 0.8) ** 2 + (y / 0.6) ** 2
    plane = np.where(radius < 1, 40, -1000).astype(np.int16)
    plane[(radius > 0.85) & (radius < 1)] = 700
    plane[((x - 0.3) / 0.25) ** 2 + ((y + 0.1) / 0.2) ** 2 < 1] = 90
    volume = np.empty(shape, dtype=np.int16)
    for k in range(shape[2]):
        volume[:, :, k] = plane + rng.integers(-20, 21, size=plane.shape, dtype=np.int16)
    return volume


def saved_bytes(model, layer: str, patch: int) -> tuple[int, int]:
    """(bytes the network keeps for the backward pass from its logits to ``layer``, the logits' bytes) for one
    window, counted with ``torch.autograd.graph.saved_tensors_hooks`` (each storage once)."""
    import torch

    network = model.module
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    handle = network.get_submodule(layer).register_forward_hook(lambda m, i, o: o.detach().requires_grad_(True))
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logits = network(torch.zeros(1, 1, patch, patch, patch))
    finally:
        handle.remove()
    return sum(storages.values()), logits.numel() * logits.element_size()


class ChildPeak:
    """A child process's resident set sampled every 10 ms: its peak."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process, self.peak = psutil.Process(pid), 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        import psutil

        while not self.done.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.01)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def scan_profile(patch: int) -> dict[str, object]:
    """The ``monai:UNet`` profile (4, 8, 16 channels) the synthetic CT is explained with, at ``patch``^3 windows."""
    network = {"in_channels": 1, "out_channels": 3, "channels": [4, 8, 16], "strides": [2, 2], "num_res_units": 0}
    return {
        "network": network,
        "patch": [patch] * 3,
        "step": 0.5,
        "intensity": {"scheme": "ct", "low": -900, "high": 1200, "mean": 80, "std": 150},
        "labels": ["background", "liver", "tumour"],
    }


def run_scan(command: list[str], library: Path) -> tuple[float, int, str]:
    """(seconds, peak resident bytes, its output's last lines) of the command line ``command``, run with the
    gradcam_cli of ``library``."""
    env = {**os.environ, "PYTHONPATH": str(library)}
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = ChildPeak(child.pid)
    out, err = child.communicate()
    peak, seconds = sampler.stop(), time.perf_counter() - started
    if child.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{out}{err}")
    return seconds, peak, (out + err)[-3000:]


def scan(shape: tuple[int, ...], patch: int, library: Path) -> int:
    """The command line on a synthetic CT: peak resident set against the documented sum."""
    import tempfile

    import nibabel
    import numpy as np
    import torch
    from monai.networks.nets import UNet

    from gradcam_cli import load_model
    from gradcam_cli.cam.windows import window_slices

    profile = scan_profile(patch)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        unet = UNet(3, 1, 3, channels=(4, 8, 16), strides=(2, 2), num_res_units=0)
        torch.save(unet.state_dict(), root / "unet.pt")
        (root / "unet.json").write_text(json.dumps(profile))
        affine = np.diag([-0.8, 0.8, 2.0, 1.0])
        big, small = root / "ct.nii.gz", root / "one_window.nii.gz"
        nibabel.save(nibabel.Nifti1Image(ct_like(shape), affine), big)
        nibabel.save(nibabel.Nifti1Image(ct_like((patch,) * 3), affine), small)
        model = load_model("monai:UNet", str(root / "unet.pt"))
        layer = model.profile.default_layers[0]
        kept, logits = saved_bytes(model, layer, patch)
        weights = sum(p.numel() * p.element_size() for p in model.module.parameters())
        voxels = int(np.prod(shape))
        windows = len(window_slices(shape, (patch,) * 3))
        base = [sys.executable, "-m", "gradcam_cli", "-m", "monai:UNet", "--weights", str(root / "unet.pt")]
        base += ["--top-k", "1", "-o"]
        fixed = run_scan([*base, str(root / "small"), str(small)], library)
        seconds, peak, tail = run_scan([*base, str(root / "out"), str(big)], library)
        written = sorted(path.name for path in (root / "out").iterdir())
    counted = {
        "the scan as read (float32)": voxels * 4,
        "the map of one class (float32)": voxels * 4,
        "the summed weights (float32)": voxels * 4,
        "one window's logits": logits,
        "what the network keeps for the backward pass, one window": kept,
        "the weights": weights,
    }
    print(f"scan {'x'.join(map(str, shape))} voxels (int16 NIfTI), patch {patch}^3 at step 0.5: {windows} windows")
    print(f"  the command line, one window per batch, --top-k 1: {seconds:.0f} s, peak resident set {peak / MB:.0f} MB")
    print(f"  the same on a scan of one window (imports, model, one window): peak {fixed[1] / MB:.0f} MB")
    print(f"  peak over the one-window run: {(peak - fixed[1]) / MB:.0f} MB")
    for name, size in counted.items():
        print(f"  counted: {name:<58} {size / MB:8.1f} MB")
    print(f"  counted, in all: {sum(counted.values()) / MB:.0f} MB; written: {', '.join(written)}")
    print("  " + tail.strip().splitlines()[-1][-200:] if tail.strip() else "")
    return 0


def compare(args: argparse.Namespace, shape: tuple[int, ...]) -> None:
    """Each side in processes of its own, the sides alternated ``--rounds`` times: the best time of each, the
    median of its memory growths, and their ratios to MONAI's."""
    import statistics

    runs = [("monai", args.batch), ("ours", args.batch), ("ours", 1)] if args.batch > 1 else [("monai", 1), ("ours", 1)]
    measured: dict[tuple[str, int], list[dict[str, float]]] = {run: [] for run in runs}
    for _ in range(args.rounds):
        for name, batch in runs:
            command = [sys.executable, __file__, "--side", name, "--side-batch", str(batch), *sys.argv[1:]]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}
            output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
            measured[name, batch].append(json.loads(output.strip().splitlines()[-1]))
    results = {
        run: {"seconds": min(r["seconds"] for r in rs), "bytes": statistics.median(r["bytes"] for r in rs)}
        for run, rs in measured.items()
    }
    theirs = results["monai", args.batch]
    net = "nnU-Net PlainConvUNet 16-128" if args.net == "plain" else "MONAI UNet 4,8,16"
    print(
        f"volume {'x'.join(map(str, shape))} voxels, patch {args.patch}^3 at step 0.5 (Gaussian), {net}, "
        f"{args.device}, {args.rounds} round(s) alternated, load {os.getloadavg()[0]:.1f}"
    )
    print(f"  {'':<48} {'seconds':>8} {'memory':>10} {'time':>6} {'memory':>7}")
    for (name, batch), result in results.items():
        label = "MONAI sliding_window_inference" if name == "monai" else "Grad-CAM at the bottleneck, windows"
        ratios = f"{result['seconds'] / theirs['seconds']:5.2f}x {result['bytes'] / max(theirs['bytes'], 1):6.2f}x"
        print(
            f"  {label + f', {batch} per batch':<48} {result['seconds']:8.2f} {result['bytes'] / MB:7.1f} MB {ratios}"
        )
    print("  (ratios against MONAI's; goal <= 2x time, <= 1.5x memory)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default=None, help="D,H,W (default 128,128,96; with --scan or --large 512,512,300)")
    parser.add_argument("--patch", type=int, default=None, help="the window's side (default 64; --scan, --large 128)")
    parser.add_argument("--scan", action="store_true", help="the command line's peak memory on a large scan")
    parser.add_argument(
        "--large", action="store_true", help="the comparison at the CT's scale: --net narrow, 1 window per batch"
    )
    parser.add_argument("--net", choices=("plain", "narrow"), default=None, help="the network (default plain)")
    parser.add_argument("--library", default=str(ROOT), help="with --scan: the checkout whose gradcam_cli runs")
    parser.add_argument("--repeat", type=int, default=None, help="runs per process, the best timed (default 2)")
    parser.add_argument("--rounds", type=int, default=1, help="the sides' processes alternated this many times")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--batch", type=int, default=None, help="windows per batch of MONAI's and of the first Grad-CAM run"
    )
    parser.add_argument("--side", choices=("ours", "monai"), help=argparse.SUPPRESS)
    parser.add_argument("--side-batch", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    big = args.scan or args.large
    args.shape = args.shape or ("512,512,300" if big else "128,128,96")
    args.patch = args.patch or (128 if big else 64)
    args.net = args.net or ("narrow" if args.large else "plain")
    args.batch = args.batch or (1 if args.large else 2)
    args.repeat = args.repeat or (1 if args.large else 2)
    shape = tuple(int(side) for side in args.shape.split(","))
    if args.scan:
        return scan(shape, args.patch, Path(args.library))
    if args.side:
        print(json.dumps(side(args.side, shape, args.patch, args.side_batch, args)))
        return 0
    try:
        import dynamic_network_architectures  # noqa: F401
        import monai  # noqa: F401
    except ImportError as error:
        print(f"skipped: needs the medical extra ({error})")
        return 0
    compare(args, shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
