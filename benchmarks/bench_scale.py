"""The CPU side of a GPU run: ``gradcam DIR`` with a near-free model, for ``--workers 0..N``, against a floor.

On a GPU the model costs next to nothing per image and the CPU side (decode, resize, upsample, blend, encode,
write) sets the pace. This benchmark measures that side on the machine at hand: the model is a 1x1 convolution
over an 8 x 8 average pool (a few thousand multiply-adds per image, the same on a CPU as on a GPU), so what the
CLI's rate shows is the pipeline around the model.

  (floor, P processes) decode + resize + encode alone, in P worker processes (``multiprocessing``): PIL decode
      of each 640 x 480 JPEG, the resize and normalisation to the network input (``to_input_tensor``), and the
      JPEG encoding of a 640 x 480 RGB image (``encode_image``, as overlays of JPEG photos are encoded), nothing else;
  (gradcam, W workers) ``gradcam DIR --workers W`` as a subprocess with that model, timed by its own summary line,
      which also upsamples each map, blends, encodes and writes one overlay per image; and the CPU time its whole
      process tree spent per image (user + system, from ``getrusage``; a run over one image, the same start-up,
      is subtracted), which says how many cores a given rate needs.

``gradcam`` with W decoding processes also uses its main process (the model and the maps) and two writer threads,
so it is shown against the floor in as many processes as it has decoding processes (one for W = 0) and against the
floor in all the machine's cores. Rounds interleave the runs; each figure is the best round. Then the stages of one
image, so that a GPU machine's CPU budget per image can be worked out (docs/scale.md does).

Environment: BENCH_SCALE_IMAGES (default 128), BENCH_ROUNDS (default 2), BENCH_SCALE_WORKERS (highest W, default:
the number of cores).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_batch import SIZE, gradcam_command, make_photos

FREE_MODEL = '''
"""A near-free classifier: 8 x 8 average pooling, a 1x1 convolution to 8 channels (the explained layer), a head."""
import torch
from torch import nn


class Free(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(8)
        self.features = nn.Sequential(nn.Conv2d(3, 8, kernel_size=1), nn.ReLU())
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.pool(x)).mean(dim=(2, 3)))


def build() -> nn.Module:
    torch.manual_seed(0)
    return Free()
'''


def _floor_one(path: str) -> int:
    """Decode, resize and normalise one photo, and encode a JPEG of its size (gradcam's overlay of a JPEG photo): the
    CPU work no pipeline can skip."""
    from gradcam_cli.io.images import InputSpec, load_image, to_input_tensor, to_pixel_tensor
    from gradcam_cli.render.encode import encode_image

    image = load_image(path)
    to_input_tensor(image, InputSpec())
    return len(encode_image(to_pixel_tensor(image), ".jpg"))


def floor_rate(paths: list[Path], processes: int) -> float:
    """Images per second for the floor in ``processes`` worker processes (their start-up not counted)."""
    with multiprocessing.get_context("spawn").Pool(processes, initializer=_warm) as pool:
        pool.map(_floor_one, [str(paths[0])] * processes)  # every process has imported everything
        started = time.perf_counter()
        pool.map(_floor_one, [str(path) for path in paths], chunksize=4)
        return len(paths) / (time.perf_counter() - started)


def _warm() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(1)  # one core per floor process, as a decoding process has


def gradcam_run(inputs: list[Path], model: Path, out: Path, workers: int) -> tuple[float, float]:
    """(images per second by ``gradcam``'s own summary line, CPU seconds of its process tree) for one run with the
    near-free model."""
    command = [*gradcam_command(), *map(str, inputs), "-m", f"{model}:build", "--layer", "features", "-o", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([*command, "--workers", str(workers)], capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"gradcam failed: {result.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = re.search(r"done: \d+ ok.*\(([\d.]+) images/s\)", result.stderr)
    return (float(summary.group(1)) if summary else 0.0), cpu


def stage_profile(paths: list[Path]) -> None:
    """Milliseconds per image for each CPU stage of one image (fastest of a few calls), one thread."""
    import torch

    from gradcam_cli.cam.maps import to_image_maps
    from gradcam_cli.io.images import InputSpec, load_image, to_input_tensor, to_pixel_tensor
    from gradcam_cli.render.colour import Blender, colormap_table
    from gradcam_cli.render.encode import encode_image

    torch.set_num_threads(1)

    def timed(name: str, work, repeat: int = 8):
        best, value = float("inf"), None
        for _ in range(repeat):
            started = time.perf_counter()
            value = work()
            best = min(best, time.perf_counter() - started)
        print(f"  {name:<40} {best * 1000:7.1f} ms")
        return value

    print("one image's CPU stages (one thread; fastest of a few calls):")
    image = timed("decode (PIL)", lambda: load_image(paths[0]))
    timed("resize + normalise to 224 x 299", lambda: to_input_tensor(image, InputSpec()))
    coarse = torch.rand(1, 28, 37)
    saliency = timed(
        "upsample + normalise the map to 640 x 480", lambda: to_image_maps([coarse], (SIZE[1], SIZE[0]))[0]
    )
    pixels = to_pixel_tensor(image)
    blender = Blender(colormap_table("jet"), 0.5)
    overlay = timed("blend the overlay", lambda: blender(pixels, saliency))
    timed("encode the overlay (JPEG)", lambda: encode_image(overlay, ".jpg"))


def main() -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    count = int(os.environ.get("BENCH_SCALE_IMAGES", "128"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    highest = int(os.environ.get("BENCH_SCALE_WORKERS", str(cores)))
    print(f"{count} JPEG photos {SIZE[0]}x{SIZE[1]}, a near-free model, {cores} cores")
    tmp = Path(tempfile.mkdtemp(prefix="gradcam-bench-scale-"))
    try:
        paths = make_photos(tmp / "photos", count)
        model = tmp / "free_model.py"
        model.write_text(FREE_MODEL, encoding="utf-8")
        floors: dict[int, float] = {}
        rates: dict[int, float] = {}
        cpu_ms: dict[int, float] = {}
        for round_ in range(rounds):
            shown = []
            for processes in range(1, cores + 1):
                rate = floor_rate(paths, processes)
                floors[processes] = max(floors.get(processes, 0.0), rate)
                shown.append(f"floor x{processes} {rate:.1f}")
            for workers in range(highest + 1):
                rate, cpu = gradcam_run([tmp / "photos"], model, tmp / f"out-{round_}-{workers}", workers)
                _, start_up = gradcam_run([paths[0]], model, tmp / f"one-{round_}-{workers}", workers)
                rates[workers] = max(rates.get(workers, 0.0), rate)
                per_image = 1000 * (cpu - start_up) / (count - 1)
                cpu_ms[workers] = min(cpu_ms.get(workers, float("inf")), per_image)
                shown.append(f"W={workers} {rate:.1f} ({per_image:.1f} CPU ms/image)")
            print(f"round {round_ + 1}: " + ", ".join(shown) + " images/s", flush=True)
        print()
        print("floor: decode + resize + encode alone")
        for processes, rate in floors.items():
            print(f"  {processes} process{'es' if processes > 1 else ''}: {rate:7.1f} images/s")
        print(f"gradcam DIR with the near-free model (against the floor in as many processes, and in {cores})")
        for workers, rate in rates.items():
            same = min(cores, max(1, workers))
            print(
                f"  --workers {workers}: {rate:7.1f} images/s  {rate / floors[same]:5.2f} x floor x{same}"
                f"  {rate / floors[cores]:5.2f} x floor x{cores}  {cpu_ms[workers]:5.1f} CPU ms per image"
            )
        print(f"  (floor: {1000 / floors[1]:.1f} CPU ms per image)")
        print()
        stage_profile(paths)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
