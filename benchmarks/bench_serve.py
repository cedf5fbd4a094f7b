"""``gradcam serve`` under a bounded load on 127.0.0.1: the command in a process of its own, clients over HTTP.

ResNet-18 (random weights, no download) at its default layer, 224-pixel inputs, on the CPU. Printed:

* ``first map / library``: the first map of a newly uploaded image (``GET /api/map``, a forward and a backward
  pass) against the library's single-image ``Explainer.explain`` of the same image, medians, start-up excluded;
* ``class switch``: another class of an image already explained (replayed: no forward pass), against the same;
* p50/p95 per request kind with 4 concurrent clients (maps with class switches, packed map PNGs, overlays,
  run-view pages, info);
* a run of 100,000 rows: the start-up (the index built), and the p50/p95 of filtered, sorted pages with 4
  concurrent clients and with one.

Usage: ``python benchmarks/bench_serve.py [--rounds N] [--rows N] [--only-run]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as gradcam sets it: idle threads must not spin on 2 cores

import httpx
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.options import ModelOptions

ROOT = Path(__file__).resolve().parent.parent


class Served:
    """``gradcam serve ARGS --port 0`` in a process of its own (as users run it), until :meth:`stop` (Ctrl-C)."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, "-m", "gradcam_cli", "serve", *args, "--port", "0", "--quiet"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line.startswith("serving on "):
            self.process.kill()
            raise SystemExit(f"gradcam serve did not start: {line!r}")
        self.url = line.split()[2].rstrip("/")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        finally:
            self.process.kill()


def picture(seed: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(240, 320, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p50 = ordered[len(ordered) // 2]
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"p50 {1000 * p50:7.1f} ms  p95 {1000 * p95:7.1f} ms  (n={len(values)})"


def model_figures(rounds: int) -> None:
    library = Explainer.from_options(ModelOptions("resnet18", weights="none", device="cpu"))
    server = Served("--model", "resnet18", "--weights", "none", "--device", "cpu")
    client = httpx.Client(base_url=server.url, timeout=120)
    first, with_png, switch, baseline = [], [], [], []
    ids = []
    for n in range(rounds + 1):
        image = picture(n)
        library_time = timed(lambda image=image: library.explain(image))
        image_id = client.post("/api/upload", content=png(image)).json()["id"]
        ids.append(image_id)
        began = time.perf_counter()
        answer = client.get(f"/api/map?image={image_id}").json()
        map_time = time.perf_counter() - began
        client.get(f"/api/maps/{answer['id']}.png").raise_for_status()
        png_time = time.perf_counter() - began
        began = time.perf_counter()
        switched = client.get(f"/api/map?image={image_id}&target={n + 7}").json()
        switch_time = time.perf_counter() - began
        assert answer["forward"] is True and switched["forward"] is False, switched
        if n == 0:
            continue  # the first round warms both sides up
        baseline.append(library_time)
        first.append(map_time / library_time)
        with_png.append(png_time / library_time)
        switch.append(switch_time / library_time)
    lib = statistics.median(baseline)
    print(f"library explain (one image)          median {1000 * lib:7.1f} ms")
    for label, ratios in (
        ("first map of a new image", first),
        ("first map + its 16-bit PNG", with_png),
        ("class switch (no forward pass)", switch),
    ):
        print(f"{label:<36} median {1000 * lib * statistics.median(ratios):7.1f} ms  "
              f"ratio to library {statistics.median(ratios):.2f}x (median of the rounds' ratios)")  # fmt: skip

    kinds: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()

    kept = ids[-4:]  # the images whose passes the server keeps (RETAINED_PASSES)
    forwards = []

    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as own:

            def get(kind: str, url: str) -> httpx.Response:
                started = time.perf_counter()
                answer = own.get(url)
                answer.raise_for_status()
                with lock:
                    kinds[kind].append(time.perf_counter() - started)
                return answer

            for k in range(rounds * 2):
                target = (worker * 31 + k * 17) % 1000
                answer = get("map (class switch)", f"/api/map?image={kept[(worker + k) % len(kept)]}&target={target}")
                forwards.append(answer.json()["forward"])
                get("map PNG (16-bit)", f"/api/maps/{answer.json()['id']}.png")
                get("overlay PNG", f"/api/maps/{answer.json()['id']}/overlay.png")
                get("info", "/api/info")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client_loop, range(4)))
    print(f"4 concurrent clients ({sum(forwards)} of {len(forwards)} class switches ran a forward pass):")
    for kind, values in kinds.items():
        print(f"  {kind:<22} {percentiles(values)}")
    server.stop()


def run_figures(rows: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    names = ["red", "green", "blue", "cat", "dog"]
    with (folder / "manifest.jsonl").open("w") as out:
        for n in range(rows):
            if n % 50 == 7:
                row: dict[str, Any] = {
                    "input": f"in/{n}.jpg",
                    "status": "error",
                    "error": "not an image",
                    "outputs": [],
                }
            else:
                target = {"index": n % 5, "name": names[n % 5], "probability": (n * 7919 % 1000) / 1000}
                row = {"input": f"in/{n}.jpg", "status": "ok", "error": None, "outputs": [f"{n}_gradcam.jpg"],
                       "predictions": [target], "target": target, "method": "gradcam", "layer": "layer4"}  # fmt: skip
            out.write(json.dumps(row) + "\n")
    started = time.perf_counter()
    server = Served(str(folder))
    print(f"run of {rows:,} rows: gradcam serve started, its index built, in {time.perf_counter() - started:.2f} s")
    filters = [
        "status=error",
        "target=cat&pmin=0.2&pmax=0.6&sort=probability&order=desc",
        "predicted=dog&sort=input",
        "q=99&sort=probability",
        "pmin=0.9&offset=5000",
        "sort=target_name&order=desc&offset=50000",
    ]
    times: list[float] = []
    lock = threading.Lock()

    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as own:
            for k in range(30):
                url = f"/api/run/rows?limit=50&{filters[(worker + k) % len(filters)]}"
                started = time.perf_counter()
                own.get(url).raise_for_status()
                with lock:
                    times.append(time.perf_counter() - started)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client_loop, range(4)))
    print(f"  filtered page, 4 clients       {percentiles(times)}")
    times.clear()
    client_loop(0)
    print(f"  filtered page, 1 client        {percentiles(times)}")
    server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--only-run", action="store_true", help="Only the run view's figures.")
    args = parser.parse_args()
    torch.manual_seed(0)
    if not args.only_run:
        model_figures(args.rounds)
    run_figures(args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
