"""``make gpu-check``: what the first session lent a GPU runs, in under 8 minutes on one GPU.

1. the tests marked ``gpu`` (``pytest -m gpu``);
2. ``gradcam DIR --model resnet50`` images per second on generated 640 x 480 JPEG photos at batch sizes
   :data:`BATCHES`, in fp32 and bf16 (``--precision``), the best batch of each kept, against a plain inference loop
   (``benchmarks/plain_loop.py --device cuda``: decode, resize, normalise, forward under ``torch.inference_mode``)
   at the same batch and precision on the same GPU; ResNet-50's weights are random, written where torchvision's
   cache expects its ImageNet weights (``$TORCH_HOME/hub/checkpoints``, a temporary ``TORCH_HOME``), as the tests do,
   so that the run is the default one and needs no network;
3. a tiny LLaVA's answer map (``gradcam PHOTO --model hf:DIR --prompt ... --device cuda``, tests/vlm_models.py);
4. the peak GPU memory of each run (``torch.cuda.max_memory_allocated`` in the process that ran it).

Its figures go to ``benchmarks/gpu_check.json`` and into docs/benchmarks.md, between the ``gpu-check`` markers of
its "GPU check" section (rewritten from the JSON file). Exit codes: 0 every step passed; 1 a step failed (the gpu
tests, a run); 77 no CUDA GPU here (one line says so; nothing is measured or written).

``--cpu`` runs the same steps on the CPU with a few small photos (a check of the script itself, with no GPU: its
figures mean nothing and go to ``--json``/``--docs`` paths the caller names). ``--images N``, ``--batches
4,8``, ``--skip-tests`` shorten it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JSON_PATH = ROOT / "benchmarks" / "gpu_check.json"
DOCS_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- gpu-check:start -->", "<!-- gpu-check:end -->"
BATCHES = (32, 64, 128)
IMAGES = 512
PRECISIONS = ("fp32", "bf16")
NO_CUDA = 77
"""The exit code without a CUDA GPU (the automake convention for a check that was skipped)."""
TIME_LIMIT = 480.0
"""Eight minutes: the steps left when it is spent are skipped, and the run fails."""
PROMPT = "what is the cat ?"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one gradcam run, started by gradcam()
        return _child(Path(argv[1]), argv[2:])
    args = _parser().parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing measured")
        return NO_CUDA
    device = "cpu" if args.cpu else "cuda"
    started = time.perf_counter()
    figures: dict[str, Any] = {"device": _device_name(device), "failures": []}
    if not args.skip_tests:
        figures["gpu_tests"] = _gpu_tests(started)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        work = Path(scratch)
        figures["resnet50"] = _throughput(work, device, args.images, args.batches, started)
        figures["vlm"] = _vlm(work, device)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    figures["failures"] = _failures(figures)
    args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    fill_docs(args.docs, figures)
    print(summary(figures))
    return 1 if figures["failures"] else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run the steps on the CPU (a check of the script)")
    parser.add_argument("--images", type=int, default=IMAGES, help="photos for the throughput runs")
    parser.add_argument("--batches", type=lambda text: tuple(int(b) for b in text.split(",")), default=BATCHES)
    parser.add_argument("--skip-tests", action="store_true", help="leave out pytest -m gpu")
    parser.add_argument("--json", type=Path, default=JSON_PATH)
    parser.add_argument("--docs", type=Path, default=DOCS_PATH)
    return parser


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def _gpu_tests(started: float) -> dict[str, Any]:
    """``pytest -m gpu``: its exit status and its last line."""
    left = max(60.0, TIME_LIMIT - 300.0 - (time.perf_counter() - started))  # leave time for the measurements
    tests = (ROOT / "tests").rglob("test_*.py")
    marked = sorted(str(path.relative_to(ROOT)) for path in tests if "mark.gpu" in path.read_text(encoding="utf-8"))
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *marked]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=left, check=False)
    except subprocess.TimeoutExpired:
        return {"exit": None, "summary": f"timed out after {left:.0f}s"}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {"exit": done.returncode, "summary": lines[-1] if lines else done.stderr.strip()[-200:]}


def _child(out: Path, argv: list[str]) -> int:
    """Run ``gradcam ARGV`` in this process and write its exit code, seconds and peak GPU memory to ``out``."""
    import torch

    from gradcam_cli.cli import app
    from gradcam_cli.cli.reporting import run_app

    cuda = torch.cuda.is_available() and "cuda" in argv
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    code = 0
    try:
        run_app(app, "gradcam", argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    out.write_text(json.dumps({"exit": code, "seconds": seconds, "peak_mib": peak}), encoding="utf-8")
    return code


def gradcam(work: Path, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """``gradcam ARGS`` in a child process: its exit code, seconds (model loading included) and peak GPU memory."""
    out = work / f"child-{time.monotonic_ns()}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(out), *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"exit": done.returncode}
    result["stderr"] = done.stderr.strip().splitlines()[-1:] if done.returncode else []
    result["rate"] = _rate(done.stderr)
    return result


def _rate(stderr: str) -> float | None:
    """The images per second of gradcam's closing line (``done: N ok ... (R images/s)``): the explaining alone."""
    found = re.search(r"\(([\d.]+) images/s\)", stderr)
    return float(found.group(1)) if found else None


def random_resnet50(torch_home: Path) -> None:
    """Random ResNet-50 weights saved where torchvision's cache expects its default (ImageNet) weights."""
    import torch
    import torchvision

    weights = torchvision.models.ResNet50_Weights.DEFAULT
    cache = torch_home / "hub" / "checkpoints" / Path(weights.url).name
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet50().state_dict(), cache)


def _throughput(work: Path, device: str, count: int, batches: tuple[int, ...], started: float) -> dict[str, Any]:
    """Each precision's best batch: gradcam's images per second and peak memory, and the plain loop's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_batch import make_photos

    photos = work / "photos"
    make_photos(photos, count)
    env = {"TORCH_HOME": str(work / "torch")}
    random_resnet50(work / "torch")
    results: dict[str, Any] = {"images": count, "runs": []}
    for precision in PRECISIONS:
        for batch in batches:
            if time.perf_counter() - started > TIME_LIMIT:
                results["runs"].append({"precision": precision, "batch": batch, "exit": None, "skipped": "time"})
                continue
            args = [str(photos), "--model", "resnet50", "--device", device, "--precision", precision]
            args += ["--batch-size", str(batch), "-o", str(work / f"out-{precision}-{batch}")]
            run = gradcam(work, args, env)
            run |= {"precision": precision, "batch": batch, "plain": _plain(photos, device, batch, precision)}
            results["runs"].append(run)
    results["best"] = {
        precision: max(
            (run for run in results["runs"] if run["precision"] == precision and run.get("rate")),
            key=lambda run: run["rate"],
            default=None,
        )
        for precision in PRECISIONS
    }
    return results


def _plain(photos: Path, device: str, batch: int, precision: str) -> float | None:
    """The plain loop's images per second (first image to last) at ``batch`` and ``precision`` on ``device``."""
    command = [sys.executable, str(ROOT / "benchmarks" / "plain_loop.py"), str(photos), "--batch", str(batch)]
    command += ["--device", device, "--precision", precision]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"steady=([\d.]+)", done.stdout)
    return float(found.group(1)) if found else None


def _vlm(work: Path, device: str) -> dict[str, Any]:
    """A tiny LLaVA's answer map on ``device``: exit code, seconds, peak memory, and whether the map was written."""
    sys.path.insert(0, str(ROOT / "tests"))
    import vlm_models
    from PIL import Image

    folder = vlm_models.llava(work / "llava")
    photo = work / "halves.png"
    Image.new("RGB", (96, 48), (200, 40, 40)).save(photo)
    out = work / "vlm-out"
    run = gradcam(work, [str(photo), "--model", f"hf:{folder}", "--prompt", PROMPT, "--device", device, "-o", str(out)])
    run["map_written"] = (out / "halves_gradcam_answer.png").is_file()
    return run


def _failures(figures: dict[str, Any]) -> list[str]:
    failures = []
    tests = figures.get("gpu_tests")
    if tests is not None and tests["exit"] not in (0, 5):  # 5: no test selected (none marked gpu ran)
        failures.append(f"pytest -m gpu: {tests['summary']}")
    for run in figures["resnet50"]["runs"]:
        if run["exit"] != 0:
            failures.append(f"gradcam resnet50 {run['precision']} batch {run['batch']}: exit {run['exit']}")
    vlm = figures["vlm"]
    if vlm["exit"] != 0 or not vlm["map_written"]:
        failures.append(f"tiny VLM map: exit {vlm['exit']} {' '.join(vlm.get('stderr', []))}".strip())
    return failures


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def section(figures: dict[str, Any]) -> str:
    """The docs' GPU check section body (markdown), from the figures."""
    lines = [f"Measured on {figures['device']} in {figures['seconds']:.0f} s (`make gpu-check`)."]
    tests = figures.get("gpu_tests")
    if tests is not None:
        lines += ["", f"`pytest -m gpu`: {tests['summary']} (exit {tests['exit']})."]
    resnet = figures["resnet50"]
    lines += [
        "",
        f"ResNet-50, {resnet['images']} JPEG photos of 640 x 480, each batch size's whole `gradcam DIR` run:",
        "",
        "| precision | batch | gradcam images/s | plain loop images/s | gradcam / plain | peak GPU memory (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in resnet["runs"]:
        rate, plain = run.get("rate"), run.get("plain")
        ratio = f"{rate / plain:.2f}" if rate and plain else "-"
        best = " (best)" if resnet["best"].get(run["precision"]) == run else ""
        lines.append(
            f"| {run['precision']} | {run['batch']}{best} | {_number(rate)} | {_number(plain)} | {ratio} | "
            f"{_number(run.get('peak_mib'), 0)} |"
        )
    vlm = figures["vlm"]
    lines += [
        "",
        f"Tiny LLaVA answer map: exit {vlm['exit']}, map written: {'yes' if vlm['map_written'] else 'no'}, "
        f"{_number(vlm.get('seconds'))} s with the model's loading, peak GPU memory "
        f"{_number(vlm.get('peak_mib'), 0)} MiB.",
    ]
    if figures["failures"]:
        lines += ["", "Failed: " + "; ".join(figures["failures"]) + "."]
    return "\n".join(lines)


def fill_docs(path: Path, figures: dict[str, Any]) -> None:
    """Replace what lies between the ``gpu-check`` markers of ``path`` with :func:`section`'s text."""
    text = path.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"gpu-check: {path} has no {START} ... {END} markers")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{START}\n{section(figures)}\n{END}{tail}", encoding="utf-8")


def summary(figures: dict[str, Any]) -> str:
    best = figures["resnet50"]["best"]
    parts = [
        f"{precision} {_number(run['rate'])} images/s at batch {run['batch']}" if run else f"{precision} -"
        for precision, run in best.items()
    ]
    status = "failed: " + "; ".join(figures["failures"]) if figures["failures"] else "ok"
    return f"gpu-check on {figures['device']}: resnet50 {', '.join(parts)}; {status}"


if __name__ == "__main__":
    sys.exit(main())
