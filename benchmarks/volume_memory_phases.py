"""Where the command line's memory goes on a scan (issue 37 point 6): ``gradcam SCAN -m monai:UNet`` run in this
process on the synthetic CT of ``bench_volume_windows.py --scan``, its resident set sampled every 5 ms and glibc's
``mallinfo2`` read at each phase (reading, normalising, each window batch, writing): what is in use, what the
allocator holds freed, what is mapped on its own.

Usage: ``python benchmarks/volume_memory_phases.py [--shape D,H,W] [--patch N] [--data DIR] [--trim]``
(``--trim``: ``malloc_trim(0)`` after each window batch, to tell what the allocator keeps from what is held).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
MB = 1e6


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Sampler:
    def __init__(self) -> None:
        self.peak = rss()
        self.done = threading.Event()
        threading.Thread(target=self.sample, daemon=True).start()

    def sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.005)

    def take(self) -> int:
        peak, self.peak = max(self.peak, rss()), rss()
        return peak


SAMPLER: Sampler | None = None
TRIM = False


def log(phase: str) -> None:
    assert SAMPLER is not None
    info = LIBC.mallinfo2()
    peak = SAMPLER.take()
    print(
        f"{phase:<34} rss {rss() / MB:7.0f} MB  peak since last {peak / MB:7.0f} MB  malloc: in use "
        f"{info.uordblks / MB:6.0f} MB, free kept {info.fordblks / MB:6.0f} MB, heap {info.arena / MB:6.0f} MB, "
        f"mmapped {info.hblkhd / MB:6.0f} MB ({info.hblks})",
        flush=True,
    )


def wrap(module: Any, name: str) -> None:
    inner = getattr(module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        log(f"before {name}")
        result = inner(*args, **kwargs)
        log(f"after {name}")
        return result

    setattr(module, name, wrapped)


def prepare(data: Path, shape: tuple[int, ...], patch: int) -> None:
    import nibabel
    import numpy as np
    import torch
    from bench_volume_windows import ct_like, scan_profile
    from monai.networks.nets import UNet

    data.mkdir(parents=True, exist_ok=True)
    scan = data / f"ct_{'x'.join(map(str, shape))}.nii.gz"
    if not scan.exists():
        nibabel.save(nibabel.Nifti1Image(ct_like(shape), np.diag([-0.8, 0.8, 2.0, 1.0])), scan)
    torch.manual_seed(0)
    unet = UNet(3, 1, 3, channels=(4, 8, 16), strides=(2, 2), num_res_units=0)
    torch.save(unet.state_dict(), data / "unet.pt")
    profile = scan_profile(patch)
    (data / "unet.json").write_text(json.dumps(profile))


def main() -> int:
    global SAMPLER
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="256,256,150")
    parser.add_argument("--patch", type=int, default=128)
    parser.add_argument("--data", default="/tmp/volume_memory_phases")
    parser.add_argument("--trim", action="store_true")
    parser.add_argument("--prepare-only", action="store_true")
    args = parser.parse_args()
    shape = tuple(int(side) for side in args.shape.split(","))
    data = Path(args.data)
    SAMPLER = Sampler()
    log("started")
    if args.prepare_only:
        prepare(data, shape, args.patch)
        return 0
    import torch  # noqa: F401

    log("torch imported")
    from gradcam_cli.cam import windows
    from gradcam_cli.cli import entry_point

    volumes = importlib.import_module("gradcam_cli.pipeline.volumes")  # a submodule the package does not import

    log("gradcam_cli imported")
    for module, name in ((volumes, "read_volume"), (volumes, "write_nifti"), (volumes, "montage")):
        wrap(module, name)
    wrap(windows, "_shares")
    inner = volumes.explain_volume

    def explain(*a: Any, **k: Any) -> Any:
        log("before explain_volume")
        given = a[6] if len(a) > 6 else k.get("progress")

        def progress(done: int, total: int) -> None:
            if TRIM:
                LIBC.malloc_trim(0)
            log(f"  window batch {done}/{total}")
            if given is not None:
                given(done, total)

        result = inner(*a[:6], progress=progress)
        log("after explain_volume")
        return result

    volumes.explain_volume = explain
    scan = data / f"ct_{'x'.join(map(str, shape))}.nii.gz"
    out = data / "out"
    sys.argv = ["gradcam", "-m", "monai:UNet", "--weights", str(data / "unet.pt"), "--top-k", "1", "-o", str(out)]
    sys.argv.append(str(scan))
    try:
        entry_point()
    except SystemExit as stop:
        log(f"exit {stop.code}")
    return 0


if __name__ == "__main__":
    TRIM = "--trim" in sys.argv
    sys.exit(main())
