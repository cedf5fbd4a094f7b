"""A video model explained clip by clip (docs/video.md), issue 38 point 6: one clip's Grad-CAM against the model's
forward pass on it (goal at most 1.3x), a whole video through ``gradcam VIDEO`` against a plain clip-inference loop
(goal at least 0.9x its throughput), and each side's peak memory.

The model is torchvision's ``r3d_18`` (``--model mc3_18``, ``r2plus1d_18``...) with random weights (``weights=None``,
``--weights none``: nothing is downloaded; speed does not depend on the weights), on the CPU.

* **One clip**, in this process: 16 frames of 112 x 112 (the weights' transform's crop), as
  :class:`~gradcam_cli.pipeline.clips.ClipRunner` explains a clip: ``Explainer.explain_batch`` of the explainer the
  command line builds (``Explainer.from_options``, default layer ``layer4``), its map resized to the 32 video frames
  the clip covers in a 30 fps video; against ``model(clip)`` under ``torch.inference_mode`` (the model as
  ``from_options`` holds it). Each round runs both once, in an order that alternates; printed: the medians and the
  median of the rounds' own ratios.
* **A whole video**: a generated 30 fps video of ``--frames`` frames (default 96: three clips of 32 frames side by
  side) at 320 x 240, each side a process of its own: ``gradcam VIDEO -m MODEL --weights none`` with its defaults
  (the overlay video, its plot, the rows) against the plain loop a user writes (``--side plain``, run from this
  file): import PyTorch and torchvision, build the model, read every frame with OpenCV, take the same 16 frames of
  each clip (the frame at the centre of each of 16 equal parts of its span), resize each's shorter side to 112 with
  PIL (bilinear, as gradcam) and normalise, forward each clip under ``torch.inference_mode``; nothing written, and
  the environment as it is (a user's loop does not set ``OMP_WAIT_POLICY``, which gradcam sets for itself; with
  ``--passive`` the plain loop runs with ``OMP_WAIT_POLICY=PASSIVE`` too). Each
  side is timed as a whole process (launch to exit) and in steady state (first frame read to the last clip done: the
  plain loop's own figure, gradcam's rows' ``seconds``); throughput is clips per second, the ratio gradcam's over
  the plain loop's, per round, their median printed. Memory: each process's peak resident set (``ru_maxrss`` of
  ``os.wait4``); clips are explained one at a time, so the peak is what a clip holds, and the difference between the
  sides is what explaining a clip adds to inferring it.

Usage: ``python benchmarks/bench_video.py [--model NAME] [--repeats N] [--rounds N] [--frames N] [--device cpu]
[--passive]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FPS = 30.0
SIZE = (320, 240)  # the video's (width, height)
MB = 1e6


def make_video(path: Path, frames: int) -> None:
    """A 30 fps MJPG video at 320 x 240: a red square crossing a noisy grey background."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    width, height = SIZE
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, SIZE)
    try:
        for index in range(frames):
            frame = rng.integers(90, 150, (height, width, 3), dtype=np.uint8)
            left = int(index * (width - 48) / max(frames - 1, 1))
            frame[96:144, left : left + 48] = (0, 0, 220)
            writer.write(frame)
    finally:
        writer.release()


def plain_loop(video: Path, model_name: str, device: str) -> int:
    """The plain clip-inference loop (``--side plain``): prints ``clips=N steady=S`` (S: seconds from opening the
    video to the last clip's prediction)."""
    import cv2
    import numpy as np
    import torch
    import torchvision
    from PIL import Image

    model = getattr(torchvision.models.video, model_name)(weights=None).eval().to(device)
    frames, size, rate = 16, 112, 15.0  # the weights' clip_len, crop and frame_rate
    mean = torch.tensor([0.43216, 0.394666, 0.37645]).view(3, 1, 1)
    std = torch.tensor([0.22803, 0.22145, 0.216989]).view(3, 1, 1)
    started = time.perf_counter()
    capture = cv2.VideoCapture(str(video))
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    span = max(1, round(frames * fps / rate))
    starts = list(range(0, total - span + 1, span))
    if not starts or starts[-1] + span < total:
        starts.append(max(0, total - span))
    offsets = [min(span - 1, math.floor((i + 0.5) * span / frames)) for i in range(frames)]
    wanted = {start + offset for start in starts for offset in offsets}
    prepared: dict[int, torch.Tensor] = {}
    done = 0
    with torch.inference_mode():
        for index in range(total):
            ok, frame = capture.read()
            if not ok:
                break
            if index in wanted:
                image = Image.fromarray(np.ascontiguousarray(frame[:, :, ::-1]))
                scale = size / min(image.size)
                image = image.resize(
                    (round(image.width * scale), round(image.height * scale)), Image.Resampling.BILINEAR
                )
                pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float().div_(255)
                prepared[index] = (pixels - mean) / std
            while done < len(starts) and starts[done] + offsets[-1] <= index:
                clip = torch.stack([prepared[starts[done] + offset] for offset in offsets], dim=1)
                model(clip[None].to(device)).argmax(1).tolist()
                done += 1
                keep = starts[done] if done < len(starts) else total
                prepared = {key: value for key, value in prepared.items() if key >= keep}
    capture.release()
    print(f"clips={done} steady={time.perf_counter() - started:.4f}")
    return 0


def one_clip(model_name: str, device: str, rounds: int) -> dict[str, list[float]]:
    """Each round's seconds of the forward pass and of the clip's Grad-CAM, in this process."""
    import torch

    from gradcam_cli import Explainer
    from gradcam_cli.options import ExplainOptions, ModelOptions

    explainer = Explainer.from_options(ModelOptions(model_name, "none", device=device), ExplainOptions())
    clip_spec = explainer.model.profile.clips
    assert clip_spec is not None, f"{model_name} does not take clips"
    torch.manual_seed(0)
    clip = torch.randn(1, 3, clip_spec.frames, 112, 112, device=explainer.device)
    sizes = [(clip_spec.span(FPS), 112, 112)]
    module = explainer.model.module

    def forward() -> None:
        with torch.inference_mode():
            module(clip).argmax(1).tolist()

    cases = {"forward": forward, "gradcam": lambda: explainer.explain_batch(clip, sizes)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for case in cases.values():  # warm-up
        case()
    names = list(cases)
    for round_ in range(rounds):
        for name in names[round_ % 2 :] + names[: round_ % 2]:
            started = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - started)
    return times


def run_side(command: list[str], env: dict[str, str], logs: Path) -> tuple[float, float, str]:
    """Run ``command``: its whole time, its peak resident set in bytes and its standard output."""
    out, err = logs / "stdout", logs / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        whole = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed ({process.returncode}): {err.read_text()[-2000:]}")
    return whole, usage.ru_maxrss * 1024, out.read_text()


def whole_video(args: argparse.Namespace, folder: Path) -> dict[str, dict[str, list[float]]]:
    """Each round's whole-process seconds, steady seconds and peak memory of each side, and their clips."""
    video = folder / "walk.avi"
    make_video(video, args.frames)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sides = {
        "plain": [sys.executable, __file__, "--side", "plain", str(video), "--model", args.model],
        "gradcam": [
            sys.executable,
            *("-m", "gradcam_cli", str(video), "-m", args.model, "--weights", "none"),
            *("-o", str(folder / "out"), "--json", "--device", args.device),
        ],
    }
    sides["plain"] += ["--device", args.device]
    plain_env = {**env, "OMP_WAIT_POLICY": "PASSIVE"} if args.passive else env
    results: dict[str, dict[str, list[float]]] = {
        name: {"whole": [], "steady": [], "rss": [], "clips": []} for name in sides
    }
    names = list(sides)
    for round_ in range(args.rounds):
        for name in names[round_ % 2 :] + names[: round_ % 2]:
            whole, rss, output = run_side(sides[name], plain_env if name == "plain" else env, folder)
            if name == "plain":
                fields = dict(item.split("=") for item in output.split())
                clips, steady = int(fields["clips"]), float(fields["steady"])
            else:
                rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
                assert rows and all(row["status"] == "ok" for row in rows), output[-2000:]
                clips, steady = len(rows), float(rows[0]["seconds"])
            for key, value in (("whole", whole), ("steady", steady), ("rss", rss), ("clips", clips)):
                results[name][key].append(value)
    return results


def report_clip(times: dict[str, list[float]], model: str, rounds: int) -> None:
    forward, gradcam = times["forward"], times["gradcam"]
    ratio = statistics.median(a / b for a, b in zip(gradcam, forward, strict=True))
    print(f"(a) one clip, {model} (random weights), 1 x 3 x 16 x 112 x 112, layer4, {rounds} rounds")
    print(f"  forward (inference_mode)   {statistics.median(forward) * 1000:8.1f} ms")
    print(f"  Grad-CAM (explain_batch)   {statistics.median(gradcam) * 1000:8.1f} ms   {ratio:.3f}x  (goal <= 1.3x)")


def report_video(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    plain, ours = results["plain"], results["gradcam"]
    clips = int(ours["clips"][0])
    print(f"(b) a {args.frames}-frame 320 x 240 30 fps video, {clips} clips, {args.rounds} rounds, each side a process")
    print(f"  {'':<30} {'whole s':>8} {'clips/s':>8} {'steady s':>9} {'clips/s':>8} {'peak RSS':>10}")
    for label, side in (("plain clip-inference loop", plain), ("gradcam VIDEO", ours)):
        whole, steady = statistics.median(side["whole"]), statistics.median(side["steady"])
        rss = max(side["rss"]) / MB
        print(f"  {label:<30} {whole:8.2f} {clips / whole:8.3f} {steady:9.2f} {clips / steady:8.3f} {rss:7.0f} MB")
    # throughput ratio per round (gradcam's clips per second over the plain loop's), then the median over the rounds
    whole_ratio = statistics.median(b / a for a, b in zip(ours["whole"], plain["whole"], strict=True))
    steady_ratio = statistics.median(b / a for a, b in zip(ours["steady"], plain["steady"], strict=True))
    extra = (max(ours["rss"]) - max(plain["rss"])) / MB
    print(f"  throughput gradcam / plain: {whole_ratio:.3f}x whole process, {steady_ratio:.3f}x steady (goal >= 0.9x)")
    print(f"  memory: {extra:+.0f} MB peak resident set over the plain loop's (one clip at a time on both sides)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="r3d_18", help="a torchvision video model (r3d_18, mc3_18, r2plus1d_18)")
    parser.add_argument("--repeats", type=int, default=6, help="rounds of the one-clip comparison (a)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the whole-video comparison (b)")
    parser.add_argument("--frames", type=int, default=96, help="the generated video's frames (30 fps)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--passive", action="store_true", help="run the plain loop with OMP_WAIT_POLICY=PASSIVE too, as gradcam sets it"
    )
    parser.add_argument("--side", choices=("plain",), help=argparse.SUPPRESS)
    parser.add_argument("video", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return plain_loop(args.video, args.model, args.device)
    try:
        import cv2  # noqa: F401
    except ImportError as error:
        print(f"skipped: needs OpenCV ({error})")
        return 0
    load = os.getloadavg()[0]
    report_clip(one_clip(args.model, args.device, args.repeats), args.model, args.repeats)
    with tempfile.TemporaryDirectory() as folder:
        report_video(whole_video(args, Path(folder)), args)
    print(f"  (load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
