"""Batch speed and memory: ``gradcam DIR`` against baselines measured in the same run.

On a generated folder of JPEG photos (640 x 480: crops of the sample photos with noise), with resnet50 and random
weights (no download; speed does not depend on the weights):

  (a) decode + resize + forward only: a plain loop of our own (PIL decode, resize to the same 224 x 299 input,
      batches of 4 as gradcam uses on the CPU, ``torch.inference_mode``), the floor for any tool that must at
      least run the model;
  (b) a straightforward pytorch-grad-cam loop, as its README shows: per image cv2.imread, GradCAM on layer4,
      show_cam_on_image, cv2.imwrite of one overlay (fed the same 224 x 299 input, the map resized back up);
  (c) ``gradcam DIR``: the installed CLI as a subprocess with its defaults, timed by its own summary line (from
      the first image to the last: PyTorch's import and the model's construction are left out, as in (a) and (b);
      the rate counting them is printed too). For reference, BatchRunner in this process too.

Rounds interleave (a), (b), (c) so that a noisy machine slows all of them alike; each figure is the best round.
All run with ``OMP_WAIT_POLICY=PASSIVE``, which the CLI sets for itself, unless the variable is set already.
Then: peak memory (RSS of the CLI's whole process tree, sampled) for 10 vs 1,000 images (small 160 x 120 images
at ``--input-size 64`` so the 1,000 run stays short: memory growth with the image count is the question), the time
of ``gradcam --help`` against ``python -c "import torch"``, and where one image's time goes, stage by stage.

Targets on 2 cores: (c) >= 0.9 x (a) and >= 2.7 x (b); RSS(1,000) <= 1.2 x RSS(10).
Environment: BENCH_IMAGES (default 64), BENCH_ROUNDS (default 2), BENCH_RSS_IMAGES (default 1000).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "sample_images").glob("*.jpg"))
SIZE = (640, 480)
BATCH = 4  # as gradcam's default on the CPU


def make_photos(folder: Path, count: int, size: tuple[int, int] = SIZE, seed: int = 0) -> list[Path]:
    """``count`` JPEG photos of ``size``: random crops of the sample photos, flipped at random, with noise."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sources = [Image.open(path).convert("RGB") for path in SAMPLES]
    paths = []
    for i in range(count):
        source = sources[i % len(sources)]
        width, height = source.size
        scale = rng.uniform(0.55, 1.0)
        crop_w, crop_h = int(width * scale), int(height * scale)
        left, top = int(rng.integers(0, width - crop_w + 1)), int(rng.integers(0, height - crop_h + 1))
        image = source.crop((left, top, left + crop_w, top + crop_h)).resize(size, Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 3, (size[1], size[0], 3))
        path = folder / f"photo_{i:04d}.jpg"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def gradcam_command() -> list[str]:
    script = Path(sys.executable).parent / "gradcam"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gradcam_cli"]


# --- (a) decode + resize + forward only -------------------------------------------------------------------------


def baseline_forward(model, paths: list[Path]) -> float:
    """Images per second for PIL decode + resize + normalise + batched forward, nothing else."""
    import torch

    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    started = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(paths), BATCH):
            tensors = []
            for path in paths[first : first + BATCH]:
                image = Image.open(path).convert("RGB")
                width, height = image.size
                scale = 224 / min(width, height)
                image = image.resize((round(width * scale), round(height * scale)), Image.Resampling.BILINEAR)
                pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float().div_(255)
                tensors.append((pixels - mean) / std)
            model(torch.stack(tensors))
    return len(paths) / (time.perf_counter() - started)


# --- (b) pytorch-grad-cam, one image at a time ------------------------------------------------------------------


def baseline_pytorch_grad_cam(model, paths: list[Path], out: Path) -> float:
    """Images per second for the loop pytorch-grad-cam's README shows, writing one overlay per image."""
    import cv2
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.image import preprocess_image, show_cam_on_image

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with GradCAM(model=model, target_layers=[model.layer4[-1]]) as cam:
        for path in paths:
            rgb = np.float32(cv2.imread(str(path), cv2.IMREAD_COLOR)[:, :, ::-1]) / 255
            height, width = rgb.shape[:2]
            scale = 224 / min(width, height)
            small = cv2.resize(rgb, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_LINEAR)
            input_tensor = preprocess_image(small, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
            grayscale = cam(input_tensor=input_tensor, targets=None)[0]
            grayscale = cv2.resize(grayscale, (width, height), interpolation=cv2.INTER_LINEAR)
            visualization = show_cam_on_image(rgb, grayscale, use_rgb=True)
            cv2.imwrite(str(out / f"{path.stem}.png"), cv2.cvtColor(visualization, cv2.COLOR_RGB2BGR))
    return len(paths) / (time.perf_counter() - started)


# --- (c) gradcam DIR --------------------------------------------------------------------------------------------


def gradcam_library(explainer, folder: Path, out: Path) -> float:
    """Images per second for BatchRunner over ``folder`` with the CLI's defaults (as ``gradcam DIR`` runs it)."""
    from gradcam_cli.io.atomic import remove_stale_temporaries
    from gradcam_cli.io.discovery import discover
    from gradcam_cli.options import OutputOptions
    from gradcam_cli.pipeline.batch import BatchRunner

    started = time.perf_counter()
    images = discover([folder], exclude=out)
    remove_stale_temporaries(out)
    records = list(BatchRunner(explainer, OutputOptions(out)).run(images))  # default batch size and workers
    elapsed = time.perf_counter() - started
    assert all(record.status == "ok" for record in records), records[:3]
    return len(images) / elapsed


def gradcam_cli(folder: Path, out: Path) -> tuple[float, float]:
    """(images per second by the CLI's own summary, images per second including start-up) for ``gradcam DIR``."""
    command = [*gradcam_command(), str(folder), "-m", "resnet50", "-w", "none", "-o", str(out)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"gradcam failed: {result.stderr[-2000:]}")
    summary = re.search(r"done: (\d+) ok.*\(([\d.]+) images/s\)", result.stderr)
    assert summary, result.stderr[-500:]
    return float(summary.group(2)), int(summary.group(1)) / wall


# --- memory -----------------------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def peak_tree_rss(command: list[str]) -> tuple[int, float]:
    """Run ``command``; return (peak RSS of it and its descendants together, sampled every 20 ms; seconds)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            tree = _children()
            pids, total = [process.pid], 0
            while pids:
                pid = pids.pop()
                total += _rss_bytes(pid)
                pids.extend(tree.get(pid, []))
            peak = max(peak, total)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"gradcam failed: {stderr.decode()[-2000:]}")
    return peak, time.perf_counter() - started


def memory_growth(tmp: Path, count: int) -> None:
    folder = tmp / "rss"
    make_photos(folder, count, size=(160, 120), seed=1)
    few = tmp / "rss_few"
    few.mkdir()
    for path in sorted(folder.iterdir())[:10]:
        shutil.copy(path, few / path.name)
    base = [*gradcam_command(), "-m", "resnet50", "-w", "none", "--input-size", "64", "-q"]
    rss_few, seconds_few = peak_tree_rss([*base, str(few), "-o", str(tmp / "rss_out_few")])
    rss_many, seconds_many = peak_tree_rss([*base, str(folder), "-o", str(tmp / "rss_out_many")])
    print("peak RSS (CLI process tree), 160x120 JPEGs at --input-size 64:")
    print(f"  {10:>5} images: {rss_few / 2**20:7.0f} MiB  ({seconds_few:.1f} s)")
    print(f"  {count:>5} images: {rss_many / 2**20:7.0f} MiB  ({seconds_many:.1f} s)")
    ratio = rss_many / rss_few
    print(f"  ratio {ratio:.2f}x  (target <= 1.2x: {'met' if ratio <= 1.2 else 'NOT met'})")


def startup_times() -> None:
    def median_seconds(command: list[str], runs: int = 5) -> float:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    help_time = median_seconds([*gradcam_command(), "--help"])
    torch_time = median_seconds([sys.executable, "-c", "import torch"])
    print(f"gradcam --help: {help_time:.2f} s   python -c 'import torch': {torch_time:.2f} s   (median of 5)")


# --- where the time goes ----------------------------------------------------------------------------------------


def stage_profile(explainer, paths: list[Path]) -> None:
    """Single-threaded cost of each stage of one image (a batch of 8 for the model), in milliseconds."""
    import torch

    from gradcam_cli.io.images import load_image, to_input_tensor, to_pixel_tensor
    from gradcam_cli.render.colour import Blender
    from gradcam_cli.render.encode import encode_image

    spec = explainer.model.input_spec
    images = [load_image(path) for path in paths[:BATCH]]
    stages = {}

    def timed(name: str, function, per: int = 1, repeat: int = 3) -> object:
        result = function()
        best = float("inf")
        for _ in range(repeat):  # the fastest call: the least disturbed by anything else running
            started = time.perf_counter()
            result = function()
            best = min(best, time.perf_counter() - started)
        stages[name] = best / per * 1000
        return result

    timed("decode (PIL)", lambda: [load_image(path) for path in paths[:BATCH]], per=BATCH)
    tensors = timed("resize + normalise", lambda: [to_input_tensor(image, spec) for image in images], per=BATCH)
    batch = torch.stack(tensors)
    with torch.inference_mode():
        timed("forward only (inference_mode)", lambda: explainer.model.module(batch), per=BATCH)
    sizes = [(image.height, image.width) for image in images]
    results = timed("forward + backward + maps", lambda: explainer.explain_batch(batch, sizes), per=BATCH)
    channels_last = batch.contiguous(memory_format=torch.channels_last)
    timed("  the same, channels-last (ours)", lambda: explainer.explain_batch(channels_last, sizes), per=BATCH)
    pixels = to_pixel_tensor(images[0])
    from gradcam_cli.render.colour import colormap_table

    table = colormap_table("jet")
    saliency = results[0].explanations[0].saliency
    blender = Blender(table, 0.5)
    overlay = timed("blend overlay", lambda: blender(pixels, saliency), repeat=10)
    timed("encode PNG", lambda: encode_image(overlay, ".png"), repeat=10)
    timed("encode JPEG", lambda: encode_image(overlay, ".jpg"), repeat=10)
    print(f"where one image's time goes (torch threads: {torch.get_num_threads()}; fastest of a few calls):")
    for name, ms in stages.items():
        print(f"  {name:<32} {ms:7.1f} ms")


def main() -> int:
    # The CLI makes PyTorch's waiting OpenMP threads sleep (see docs/batch.md, Threads); the baselines get the
    # same, so that they are not slowed by spinning threads when something else shares the cores: the comparison
    # is between pipelines, and no easier for (c).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from gradcam_cli import Explainer, load_model

    count = int(os.environ.get("BENCH_IMAGES", "64"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    rss_images = int(os.environ.get("BENCH_RSS_IMAGES", "1000"))
    print(f"{count} JPEG photos {SIZE[0]}x{SIZE[1]}, resnet50 (random weights), {os.cpu_count()} CPUs, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="gradcam-bench-"))
    try:
        paths = make_photos(tmp / "photos", count)
        torch.manual_seed(0)
        loaded = load_model("resnet50", "none")
        plain = copy.deepcopy(loaded.module).eval()
        for param in plain.parameters():
            param.requires_grad_(False)
        reference = copy.deepcopy(loaded.module).eval()  # pytorch-grad-cam needs gradients enabled
        explainer = Explainer(loaded, "layer4", device="cpu")
        best = {"a": 0.0, "b": 0.0, "c": 0.0, "c_wall": 0.0, "lib": 0.0}
        for round_ in range(rounds):
            a = baseline_forward(plain, paths)
            b = baseline_pytorch_grad_cam(reference, paths, tmp / f"out_b{round_}")
            c, c_wall = gradcam_cli(tmp / "photos", tmp / f"out_c{round_}")
            lib = gradcam_library(explainer, tmp / "photos", tmp / f"out_lib{round_}")
            figures = f"(a) {a:.2f}  (b) {b:.2f}  (c) {c:.2f}  (library) {lib:.2f} images/s"
            print(f"round {round_ + 1}: {figures};  (c)/(a) {c / a:.2f}  (c)/(b) {c / b:.2f}", flush=True)
            for key, value in {"a": a, "b": b, "c": c, "c_wall": c_wall, "lib": lib}.items():
                best[key] = max(best[key], value)
        print()
        print(f"(a) decode + resize + forward only      {best['a']:7.2f} images/s")
        print(f"(b) pytorch-grad-cam loop               {best['b']:7.2f} images/s")
        print(f"(c) gradcam DIR (CLI subprocess)        {best['c']:7.2f} images/s by its summary "
              f"({best['c_wall']:.2f} counting its start-up)")  # fmt: skip
        print(f"    BatchRunner in this process         {best['lib']:7.2f} images/s")
        ratio_a, ratio_b = best["c"] / best["a"], best["c"] / best["b"]
        print(f"(c)/(a) = {ratio_a:.2f}  (target >= 0.9: {'met' if ratio_a >= 0.9 else 'NOT met'})")
        print(f"(c)/(b) = {ratio_b:.2f}  (target >= 2.7: {'met' if ratio_b >= 2.7 else 'NOT met'})")
        print()
        stage_profile(explainer, paths)
        print()
        memory_growth(tmp, rss_images)
        startup_times()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
