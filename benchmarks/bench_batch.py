"""Batch speed and memory: ``gradcam DIR`` against baselines measured in the same run.

On a generated folder of JPEG photos (640 x 480: crops of the sample photos with noise), with resnet50 and random
weights (no download; speed does not depend on the weights), each side a whole process of its own, start-up
included (``benchmarks/plain_loop.py`` for the plain loops):

  (a1) the plain loop a user writes: import PyTorch, build the model, then one image at a time PIL decode, resize
       to the same 224 x 299 input, normalise, forward under ``torch.inference_mode``; nothing written;
  (a4) the same loop in batches of 4, as gradcam uses on the CPU;
  (c)  ``gradcam DIR -w none`` with its defaults, the installed CLI: every map, overlay and manifest row written;

and, in this process on the first 64 photos, (b) a straightforward pytorch-grad-cam loop as its README shows: per
image cv2.imread, GradCAM on layer4, show_cam_on_image, cv2.imwrite of one overlay.

Both ratios are printed: whole processes (wall clock from launch to exit) and steady state (first image to last:
each side reports its own). The plain loops and (b) run with the environment as it is: a user's loop does not set
``OMP_WAIT_POLICY``, and the CLI sets it for itself. Rounds interleave the sides so that a noisy machine slows all
of them alike; each figure is the median of the rounds, and the ratio (c)/(a1) the median of each round's ratio.
Then: time to the first output for one photo against ``python -c "import torch"`` and against the plain loop over
that one photo (PyTorch, the model, one forward); peak memory for 32 vs 1,000 images; ``gradcam --help``; and
where one image's time goes, stage by stage.

Targets on 2 cores: (c) >= 1.0 x (a1) as whole processes, (c) >= 2.7 x (b); RSS(1,000) <= 1.2 x RSS(32).
Environment: BENCH_IMAGES (default 256), BENCH_ROUNDS (default 3), BENCH_RSS_IMAGES (default 1000).
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


# --- (a1), (a4): the plain loop, a process of its own -------------------------------------------------------------


def plain_loop(folder: Path, batch: int) -> tuple[float, float]:
    """(steady images per second, whole-process seconds) of ``benchmarks/plain_loop.py`` over ``folder``."""
    command = [sys.executable, str(ROOT / "benchmarks" / "plain_loop.py"), str(folder), "--batch", str(batch)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"plain loop failed: {result.stderr[-2000:]}")
    steady = re.search(r"steady=([\d.]+)", result.stdout)
    assert steady, result.stdout
    return float(steady.group(1)), wall


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


def gradcam_cli(folder: Path, out: Path) -> tuple[float, float]:
    """(steady images per second by the CLI's own summary line, whole-process seconds) for ``gradcam DIR``."""
    command = [*gradcam_command(), str(folder), "-m", "resnet50", "-w", "none", "-o", str(out)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"gradcam failed: {result.stderr[-2000:]}")
    summary = re.search(r"done: (\d+) ok.*\(([\d.]+) images/s\)", result.stderr)
    assert summary, result.stderr[-500:]
    return float(summary.group(2)), wall


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
    """Peak memory of a run of ``FOLD_MIN_IMAGES`` images against one of ``count``: both fold the model's batch
    norms (a copy of its convolutions), so the difference is what grows with the number of images."""
    from gradcam_cli.pipeline.batch import FOLD_MIN_IMAGES

    folder = tmp / "rss"
    make_photos(folder, count, size=(160, 120), seed=1)
    few = tmp / "rss_few"
    few.mkdir()
    for path in sorted(folder.iterdir())[:FOLD_MIN_IMAGES]:
        shutil.copy(path, few / path.name)
    base = [*gradcam_command(), "-m", "resnet50", "-w", "none", "--input-size", "64", "-q"]
    rss_few, seconds_few = peak_tree_rss([*base, str(few), "-o", str(tmp / "rss_out_few")])
    rss_many, seconds_many = peak_tree_rss([*base, str(folder), "-o", str(tmp / "rss_out_many")])
    print("peak RSS (CLI process tree), 160x120 JPEGs at --input-size 64:")
    print(f"  {FOLD_MIN_IMAGES:>5} images: {rss_few / 2**20:7.0f} MiB  ({seconds_few:.1f} s)")
    print(f"  {count:>5} images: {rss_many / 2**20:7.0f} MiB  ({seconds_many:.1f} s)")
    ratio = rss_many / rss_few
    print(f"  ratio {ratio:.2f}x  (target <= 1.2x: {'met' if ratio <= 1.2 else 'NOT met'})")


def startup_times(tmp: Path, photo: Path) -> None:
    """Time to the first output for one photo, against importing PyTorch and against the plain loop over it."""
    one = tmp / "one"
    one.mkdir()
    shutil.copy(photo, one / photo.name)

    def median_seconds(command: list[str], runs: int = 5, fresh: Path | None = None) -> float:
        times = []
        for _ in range(runs):
            if fresh is not None:
                shutil.rmtree(fresh, ignore_errors=True)
            started = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    out = tmp / "one_out"
    first = median_seconds([*gradcam_command(), str(one / photo.name), "-m", "resnet50", "-w", "none", "-o", str(out)],
                           fresh=out)  # fmt: skip
    loop = median_seconds([sys.executable, str(ROOT / "benchmarks" / "plain_loop.py"), str(one)])
    torch_time = median_seconds([sys.executable, "-c", "import torch"])
    help_time = median_seconds([*gradcam_command(), "--help"])
    print("start-up, whole processes (median of 5):")
    print(f"  gradcam photo.jpg (first output written)      {first:5.2f} s")
    print(f"  plain loop over that photo (one forward)      {loop:5.2f} s   ratio {first / loop:.2f}")
    print(f"  python -c 'import torch'                      {torch_time:5.2f} s")
    print(f"  gradcam --help                                {help_time:5.2f} s")


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
    timed("  the same, channels-last", lambda: explainer.explain_batch(channels_last, sizes), per=BATCH)
    with explainer.folded():
        timed("  and batch norms folded (ours)", lambda: explainer.explain_batch(channels_last, sizes), per=BATCH)
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
    import torch

    from gradcam_cli import Explainer, load_model

    count = int(os.environ.get("BENCH_IMAGES", "256"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    rss_images = int(os.environ.get("BENCH_RSS_IMAGES", "1000"))
    print(f"{count} JPEG photos {SIZE[0]}x{SIZE[1]}, resnet50 (random weights), {os.cpu_count()} CPUs, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(not set)')}")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="gradcam-bench-"))
    try:
        paths = make_photos(tmp / "photos", count)
        torch.manual_seed(0)
        loaded = load_model("resnet50", "none")
        reference = copy.deepcopy(loaded.module).eval()  # pytorch-grad-cam needs gradients enabled
        runs: dict[str, list[float]] = {}
        for round_ in range(rounds):
            figures = {}
            figures["a1"], figures["a1 wall"] = plain_loop(tmp / "photos", 1)
            figures["c"], figures["c wall"] = gradcam_cli(tmp / "photos", tmp / f"out_c{round_}")
            figures["a4"], figures["a4 wall"] = plain_loop(tmp / "photos", BATCH)
            figures["b"] = baseline_pytorch_grad_cam(reference, paths[:64], tmp / f"out_b{round_}")
            figures["c/a1 wall"] = figures["a1 wall"] / figures["c wall"]
            figures["c/a1"] = figures["c"] / figures["a1"]
            print(f"round {round_ + 1}: steady images/s (a1) {figures['a1']:.2f}  (a4) {figures['a4']:.2f}  "
                  f"(c) {figures['c']:.2f}  (b) {figures['b']:.2f};  whole processes (a1) {figures['a1 wall']:.1f} s  "
                  f"(a4) {figures['a4 wall']:.1f} s  (c) {figures['c wall']:.1f} s;  "
                  f"(c)/(a1) {figures['c/a1 wall']:.2f} whole, {figures['c/a1']:.2f} steady", flush=True)  # fmt: skip
            for key, value in figures.items():
                runs.setdefault(key, []).append(value)
        median = {key: statistics.median(values) for key, values in runs.items()}
        print()
        print(f"medians of {rounds} rounds              steady images/s   whole process ({count} photos)")
        for key, label in (("a1", "(a1) plain loop, one at a time"), ("a4", "(a4) plain loop, batches of 4"),
                           ("c", "(c)  gradcam DIR")):  # fmt: skip
            print(f"{label:<35} {median[key]:8.2f}        {median[key + ' wall']:6.1f} s "
                  f"({count / median[key + ' wall']:.2f} images/s)")  # fmt: skip
        print(f"(b)  pytorch-grad-cam loop           {median['b']:8.2f}")
        whole = median["c/a1 wall"]
        print(f"(c)/(a1), median of the rounds' ratios: whole processes {whole:.2f} (target >= 1.0: "
              f"{'met' if whole >= 1.0 else 'NOT met'}; rounds {', '.join(f'{r:.2f}' for r in runs['c/a1 wall'])}), "
              f"steady {median['c/a1']:.2f} (rounds {', '.join(f'{r:.2f}' for r in runs['c/a1'])});  "
              f"(c)/(a4) whole {median['a4 wall'] / median['c wall']:.2f}, "
              f"steady {median['c'] / median['a4']:.2f}")  # fmt: skip
        ratio_b = median["c"] / median["b"]
        print(f"(c)/(b) steady {ratio_b:.2f}  (target >= 2.7: {'met' if ratio_b >= 2.7 else 'NOT met'})")
        print()
        startup_times(tmp, paths[0])
        print()
        stage_profile(Explainer(loaded, "layer4", device="cpu"), paths)
        print()
        memory_growth(tmp, rss_images)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
