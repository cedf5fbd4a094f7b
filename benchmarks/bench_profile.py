"""Where a whole ``gradcam DIR`` run spends its time, thread by thread, sampled by py-spy.

Runs ``gradcam DIR -m resnet50 -w none`` over generated 640 x 480 JPEG photos under ``py-spy record --threads
--idle --subprocesses`` (100 samples a second of every Python thread, waiting ones included, the decoding
process's too) and sorts each sample by the innermost gradcam function on its stack: the model (forward and
backward pass), upsampling and normalising the maps, colour-mapping and blending, encoding, writing files,
decoding and resizing, handing decoded images to the main process (or waiting for them), start-up (imports, the
model's construction, the dry pass, folding batch norms), and idle (waiting for work).
Prints, for each thread, the share of its samples in each stage.
PyTorch's own OpenMP threads are not Python threads: the model's time is counted on the main thread that waits
for them. Skipped, with a message, when py-spy is not installed (``make install`` installs it).

Environment: BENCH_PROFILE_IMAGES (default 128).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_batch import gradcam_command, make_photos

STAGES = (  # (stage, what marks it on a stack), the first match from the innermost frame outwards
    ("encode", ("render/encode.py",)),
    ("colour-map + blend", ("render/colour.py",)),
    ("write", ("io/atomic.py", "io/manifest.py")),
    ("upsample + normalise", ("cam/maps.py",)),
    ("model", ("cam/engine.py", "cam/explainer.py")),
    ("decode + resize", ("io/images.py", "pipeline/decode.py(ImageDataset")),
    ("receive decoded", ("pipeline/decode.py",)),
    ("start-up", ("models/loading.py", "models/folding.py", "cam/layers.py", "importlib", "<module>")),
)
IDLE = ("wait", "select", "accept", "_worker (concurrent", "sleep", "_recv", "poll", "get (queue")


def stage_of(frames: list[str]) -> str:
    """The stage of one sampled stack (outermost frame first)."""
    leaf = frames[-1]
    waiting = any(marker in leaf for marker in IDLE)
    for frame in reversed(frames):
        compact = frame.replace(" (", "(")
        for stage, markers in STAGES:
            if any(marker.replace(" (", "(") in compact for marker in markers):
                if waiting and stage not in ("receive decoded",):
                    return "idle"
                return stage
    return "idle" if waiting else "other"


def thread_of(frames: list[str]) -> str:
    """A readable name for the thread a sample came from (the decoding process's main thread by that name)."""
    in_child = len(frames) > 2 and frames[1].startswith("process ")
    thread = frames[2] if in_child else frames[1] if len(frames) > 1 else ""
    name = thread.split(":", 1)[1].strip() if ":" in thread else "MainThread"
    if in_child:
        return "decoding process" if name == "MainThread" else f"decoding process: {name}"
    if name.startswith("gradcam-decoder"):
        return "decoding thread"
    return "writer threads" if name.startswith("gradcam-writer") else name


def main() -> int:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy is not installed (pip install py-spy, or make install): profile skipped")
        return 0
    count = int(os.environ.get("BENCH_PROFILE_IMAGES", "128"))
    tmp = Path(tempfile.mkdtemp(prefix="gradcam-profile-"))
    try:
        make_photos(tmp / "photos", count)
        raw = tmp / "profile.txt"
        command = [spy, "record", "--format", "raw", "--threads", "--idle", "--subprocesses", "--rate", "100"]
        command += ["-o", str(raw), "--", *gradcam_command(), str(tmp / "photos"), "-m", "resnet50", "-w", "none"]
        result = subprocess.run([*command, "-o", str(tmp / "out"), "-q"], capture_output=True, text=True, check=False)
        if result.returncode != 0 or not raw.exists():
            print(f"py-spy could not profile the run (it needs ptrace permission): {result.stderr.strip()[-300:]}")
            return 0
        samples: dict[str, Counter[str]] = defaultdict(Counter)
        for line in raw.read_text(encoding="utf-8").splitlines():
            stack, _, number = line.rpartition(" ")
            frames = stack.split(";")
            samples[thread_of(frames)][stage_of(frames)] += int(number)
        # Threads that only wait (the loader's queue feeder, the decoding process's helpers) are left out.
        samples = {thread: counts for thread, counts in samples.items() if counts["idle"] < 0.98 * sum(counts.values())}
        stages = [stage for stage, _ in STAGES] + ["idle", "other"]
        print(f"gradcam DIR over {count} photos 640x480, resnet50: share of each thread's samples (py-spy, 100/s)")
        print(f"{'stage':<22}" + "".join(f"{thread[:18]:>20}" for thread in samples))
        for stage in stages:
            cells = [100 * counts[stage] / max(1, sum(counts.values())) for counts in samples.values()]
            if any(cell >= 0.05 for cell in cells):
                print(f"{stage:<22}" + "".join(f"{cell:19.1f}%" for cell in cells))
        print(f"{'samples':<22}" + "".join(f"{sum(counts.values()):>20}" for counts in samples.values()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
