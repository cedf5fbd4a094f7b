"""Recordings of deterministic command-line runs, made before a refactor and compared after it (issue 36, point 7:
behaviour unchanged, proven).

Record::

    python tests/recordings.py OUT_DIR [--models DIR] [--root CHECKOUT] [--case NAME ...]

runs ``python -m gradcam_cli`` once per case of :data:`CASES` (a classifier with two methods and ``--top-k 2``, a
timm classifier with random weights, a torchvision-style detector and segmenter, a tiny YOLO, ``similar:`` on two
embedding models, ``text:`` on a tiny CLIP, the attention methods on a tiny ViT, and each vision-language family's
answer and per-token maps) with ``--deterministic --save-raw --json --manifest --device cpu --workers 0``, on one
thread. Each case writes into ``OUT_DIR/<case>/``: ``command.txt`` (the command line, runnable from the checkout's
root), ``manifest.jsonl``, ``stdout.jsonl`` (the ``--json`` rows), ``stderr.txt`` and ``out/`` (overlays and
``.npy`` maps). The tiny models and generated inputs are built, seeded, into ``OUT_DIR/models/`` (YOLO trained on
squares, LLaVA, Qwen2-VL and Idefics3, a CLIP, three pictures), or taken from ``--models DIR`` when given (an
earlier recording's: the models are then the very same files). ``--root`` names the checkout whose ``gradcam_cli``
and whose files (``sample_images/``, ``tests/*.py`` factories) are run (default: the one holding this script);
``OUT_DIR/recording.json`` says which, and where the models were.

Compare::

    python tests/recordings.py --compare BEFORE_DIR AFTER_DIR [--strict]

per case: every ``.npy`` and image under ``out/`` byte-identical (a differing ``.npy`` with its maximum absolute
difference), the same files on both sides, the manifest's and the ``--json`` rows equal field by field once
normalised, and, where the rows carry fingerprints, ``python -m gradcam_cli diff BEFORE/<case>/manifest.jsonl
AFTER/<case>`` reporting no drift. The models folders are compared too (each saved tensor). Exit 1 on any difference,
with a summary per case.

Normalising a row before comparing it:

- dropped: ``seconds`` (timing), the package versions in ``provenance`` (:data:`VERSION_KEYS`), and any field named in
  :data:`VOLATILE_KEYS` at any depth;
- paths: the recording's output folder and its models folder are replaced by ``<OUT>`` and ``<MODELS>`` in every
  string (absolute output paths, ``hf:DIR`` models, ``similar:`` references), so recordings in other folders compare;
- a field present in AFTER's row only, or a ``fingerprint`` or ``provenance`` null in BEFORE and filled in AFTER
  (answers' rows gain both in issue 36), is listed as added and is no difference unless ``--strict``; any other field
  missing or changed in AFTER is a difference.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMMON = ["--deterministic", "--save-raw", "--json", "--device", "cpu", "--workers", "0", "--seed", "0"]
"""Options of every case (besides ``-o`` and ``--manifest``)."""
VLM_PROMPT = "what is the cat ?"
VLM = ["--prompt", VLM_PROMPT, "--max-new-tokens", "4", "--method", "gradcam,layercam"]
CASES: dict[str, list[str]] = {
    "classify": ["sample_images", "-m", "efficientnet_lite0", "--method", "gradcam,gradcam++", "--top-k", "2"],
    "classify-timm-random": [
        *("sample_images/chelsea.jpg", "sample_images/rocket.jpg", "-m", "timm:test_resnet", "--weights", "none"),
        *("--input-size", "64", "--method", "gradcam,layercam", "--top-k", "2"),
    ],
    "detect": [
        *("docs/examples/two.png", "-m", "tests/task_models.py:build_detector"),
        *("--labels", "docs/examples/squares.txt", "--method", "gradcam,layercam"),
    ],
    "segment": [
        *("docs/examples/two.png", "-m", "tests/task_models.py:build_segmenter"),
        *("--labels", "docs/examples/squares.txt", "--top-k", "2", "--method", "gradcam,layercam"),
    ],
    "yolo": ["{models}/yolo/wide.png", "-m", "yolo:{models}/yolo/squares.pt", "--method", "layercam,gradcam"],
    "similar": [
        *("{models}/pictures/scene.png", "-m", "tests/embedding_model.py:build"),
        *("--target", "similar:{models}/pictures/ref.png", "--method", "gradcam,layercam"),
    ],
    "similar-timm-random": [
        *("{models}/pictures/scene.png", "-m", "timm:test_resnet", "--weights", "none", "--num-classes", "0"),
        *("--input-size", "64", "--target", "similar:{models}/pictures/ref.png"),
    ],
    "text-clip": [
        *("{models}/pictures/scene.png", "-m", "hf:{models}/clip", "--method", "gradcam,layercam"),
        *("--target", "text:a blue square", "--target", "text:a red square"),
    ],
    "attention-vit": [
        *("{models}/pictures/wide.png", "-m", "tests/attention_models.py:build_vit", "--input-size", "32"),
        *("--method", "rollout,attn-grad,attention,legrad"),
    ],
}
VLM_FAMILIES = {"llava": "llava", "qwen2-vl": "qwen2_vl", "idefics3": "idefics3"}
"""Case name: the builder of tests/vlm_models.py."""
for _name in VLM_FAMILIES:
    CASES[f"vlm-{_name}"] = ["sample_images/chelsea.jpg", "-m", f"hf:{{models}}/{_name}", *VLM]
    CASES[f"vlm-{_name}-per-token"] = ["sample_images/chelsea.jpg", "-m", f"hf:{{models}}/{_name}", *VLM, "--per-token"]

FIXED_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}
FIXED_ENV |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
"""The cases' environment: one thread (the same sums at any core count), no GPU, nothing downloaded."""
VERSION_KEYS = {"gradcam_cli", "torch", "torchvision", "transformers", "timm", "ultralytics", "open_clip", "numpy"}
"""Provenance fields naming a package's version: dropped (they change with the environment, not the code)."""
VOLATILE_KEYS = {"seconds", "elapsed", "duration", "timestamp", "time", "started", "finished"}
"""Fields dropped at any depth of a row: timings and clock times."""
FILLED_KEYS = {"fingerprint", "provenance"}
"""Fields that may be null in BEFORE and filled in AFTER (answers' rows gain both in issue 36): listed as added."""
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".npy", ".mp4", ".gif"}


# ---------------------------------------------------------------- models


def build_models(models: Path) -> None:
    """The tiny models and pictures the cases read, seeded, into ``models`` (each skipped where already there)."""
    sys.path.insert(0, str(HERE))
    import torch

    torch.set_num_threads(1)
    builders: dict[str, Callable[[Path], object]] = {
        "pictures": _pictures,
        "yolo": _yolo,
        "clip": _clip,
        **{name: _vlm(builder) for name, builder in VLM_FAMILIES.items()},
    }
    for name, build in builders.items():
        if not (models / name).exists():
            started = time.monotonic()
            partial = models / f"{name}.partial"
            partial.mkdir(parents=True, exist_ok=True)
            build(partial)
            partial.rename(models / name)
            print(f"built {models / name} in {time.monotonic() - started:.1f}s", file=sys.stderr)


def _pictures(folder: Path) -> None:
    import numpy as np
    from PIL import Image
    from square_model import square_image

    scene = square_image(size=(160, 120), box=(10, 10, 60, 60), colour="red")
    scene.paste((20, 20, 230), (100, 60, 150, 110))
    scene.save(folder / "scene.png")
    square_image(size=(100, 100), box=(30, 30, 70, 70), colour="red").save(folder / "ref.png")
    Image.fromarray((np.random.default_rng(0).random((48, 96, 3)) * 255).astype(np.uint8)).save(folder / "wide.png")


def _yolo(folder: Path) -> None:
    from yolo_model import make_example

    make_example(folder)


def _vlm(builder: str) -> Callable[[Path], object]:
    def build(folder: Path) -> object:
        import vlm_models

        return getattr(vlm_models, builder)(folder)

    return build


def _clip(folder: Path) -> None:
    """A tiny transformers CLIPModel with a character-level tokenizer (tests/models/test_target_models.py's)."""
    from attention_models import save_tiny_clip

    save_tiny_clip(folder)


# ---------------------------------------------------------------- recording


def record(out: Path, models: Path | None, root: Path, cases: list[str]) -> int:
    """Each of ``cases`` run into ``out/<case>/``; 1 when a case's command failed."""
    out.mkdir(parents=True, exist_ok=True)
    models = (models or out / "models").resolve()
    build_models(models)
    kept = out / "recording.json"
    info = json.loads(kept.read_text("utf-8")) if kept.exists() else {"cases": [], "failed": [], "seconds": {}}
    if info.get("models", str(models)) != str(models):
        raise SystemExit(f"error: {out} was recorded with the models of {info['models']}, not {models}")
    paths = [str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")]  # tests/: the factories' imports
    fixed = {"PYTHONPATH": os.pathsep.join(paths).rstrip(os.pathsep), **FIXED_ENV}
    env = {**os.environ, **fixed}
    prefix = " ".join(f"{name}={shlex.quote(value)}" for name, value in fixed.items())
    failed, timings = [], {}
    for case in cases:
        folder = (out / case).resolve()
        shutil.rmtree(folder, ignore_errors=True)  # nothing left from an earlier recording of the case
        folder.mkdir(parents=True)
        args = [arg.replace("{models}", str(models)) for arg in CASES[case]]
        command = [sys.executable, "-m", "gradcam_cli", *args, *COMMON, "-o", str(folder / "out")]
        command += ["--manifest", str(folder / "manifest.jsonl")]
        line = f"cd {shlex.quote(str(root))} && {prefix} {shlex.join(command)}\n"
        (folder / "command.txt").write_text(line, "utf-8")
        started = time.monotonic()
        with (folder / "stdout.jsonl").open("wb") as stdout, (folder / "stderr.txt").open("wb") as stderr:
            code = subprocess.run(command, cwd=root, env=env, stdout=stdout, stderr=stderr, check=False).returncode
        timings[case] = round(time.monotonic() - started, 1)
        print(f"{case}: exit {code} in {timings[case]}s", file=sys.stderr)
        if code != 0:
            failed.append(case)
            print((folder / "stderr.txt").read_text("utf-8", "replace")[-2000:], file=sys.stderr)
    info |= {"out": str(out.resolve()), "models": str(models), "root": str(root)}
    info["gradcam_cli"] = _module_file(root, env)
    info["cases"] = [case for case in CASES if case in cases or case in info["cases"]]  # an earlier run's kept
    failed += [case for case in info["failed"] if case not in cases]
    info["failed"] = [case for case in info["cases"] if case in failed]
    info["seconds"] |= timings
    kept.write_text(json.dumps(info, indent=1) + "\n", "utf-8")
    return 1 if failed else 0


def _module_file(root: Path, env: dict[str, str]) -> str:
    """Where the cases' ``gradcam_cli`` was imported from (the checkout under test)."""
    code = "import gradcam_cli; print(gradcam_cli.__file__)"
    run = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=False)
    return run.stdout.strip()


# ---------------------------------------------------------------- comparing


class Side:
    """One recording: its folder and the paths to write as ``<OUT>``/``<MODELS>`` in its rows."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        info = json.loads((folder / "recording.json").read_text("utf-8"))
        self.cases: list[str] = info["cases"]
        self.swaps = [(info["models"], "<MODELS>"), (info["out"], "<OUT>"), (str(self.folder), "<OUT>")]

    def rows(self, case: str, name: str) -> list[Any]:
        path = self.folder / case / name
        if not path.exists():
            return []
        lines = path.read_text("utf-8").splitlines()
        return [self.normal(json.loads(line)) for line in lines if line.strip()]

    def normal(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            drop = VOLATILE_KEYS | (VERSION_KEYS if key == "provenance" else set())
            return {k: self.normal(v, k) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [self.normal(v, key) for v in value]
        if isinstance(value, str):
            for path, mark in self.swaps:
                value = value.replace(path, mark)
        return value


def differences(before: Any, after: Any, where: str, added: list[str]) -> list[str]:
    """Where ``after`` differs from ``before`` (fields only in ``after`` go to ``added``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = [f"{where}.{k}: missing in AFTER (was {_short(before[k])})" for k in before if k not in after]
        added += [f"{where}.{k}" for k in after if k not in before]
        for k in before:
            if k in after:
                found += differences(before[k], after[k], f"{where}.{k}", added)
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        pairs = enumerate(zip(before, after, strict=True))
        return [d for n, (b, a) in pairs for d in differences(b, a, f"{where}[{n}]", added)]
    if before is None and after is not None and where.rsplit(".", 1)[-1] in FILLED_KEYS:
        added.append(where)
        return []
    return [] if before == after else [f"{where}: {_short(before)} -> {_short(after)}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def compare_files(before: Path, after: Path) -> list[str]:
    """The overlays, heatmaps and ``.npy`` maps under the two ``out/`` folders that differ or exist on one side."""
    import numpy as np

    def listed(folder: Path) -> set[str]:
        if not folder.exists():
            return set()
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES}

    old, new = listed(before), listed(after)
    found = [f"{name}: only in BEFORE" for name in sorted(old - new)]
    found += [f"{name}: only in AFTER" for name in sorted(new - old)]
    for name in sorted(old & new):
        a, b = (before / name).read_bytes(), (after / name).read_bytes()
        if a == b:
            continue
        if name.endswith(".npy"):
            x, y = np.load(before / name), np.load(after / name)
            if x.shape != y.shape:
                found.append(f"{name}: shape {x.shape} -> {y.shape}")
            else:
                gap = np.abs(x.astype(np.float64) - y.astype(np.float64))
                found.append(f"{name}: max abs diff {np.nanmax(gap) if gap.size else 0:.3g}")
        else:
            found.append(f"{name}: bytes differ")
    return found


def compare_models(before: Path, after: Path) -> list[str]:
    """Saved tensors and pictures of the two models folders that differ (``.pt`` by state dict, others by bytes)."""
    import torch

    if before.resolve() == after.resolve():
        return []
    found = []
    names = {str(p.relative_to(before)) for p in before.rglob("*") if p.suffix in {".safetensors", ".pt", ".png"}}
    for name in sorted(names):
        if not (after / name).exists():
            found.append(f"models/{name}: only in BEFORE")
        elif not name.endswith(".pt"):
            if (before / name).read_bytes() != (after / name).read_bytes():
                found.append(f"models/{name}: bytes differ")
        else:
            one = torch.load(before / name, weights_only=False)["model"].state_dict()
            two = torch.load(after / name, weights_only=False)["model"].state_dict()
            if one.keys() != two.keys() or any(not torch.equal(one[k], two[k]) for k in one):
                found.append(f"models/{name}: tensors differ")
    return found


def drift(before: Path, after: Path) -> list[str]:
    """``gradcam diff``'s verdict between two manifests holding fingerprints (nothing when no drift)."""
    command = [sys.executable, "-m", "gradcam_cli", "diff", str(before / "manifest.jsonl"), str(after)]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode == 0:
        return []
    lines = (run.stdout + run.stderr).strip().splitlines()
    return [f"gradcam diff exit {run.returncode}: " + " | ".join(lines[-6:])]


def compare_case(old: Side, new: Side, case: str) -> tuple[list[str], list[str]]:
    """A case's differences and its added fields."""
    found: list[str] = []
    added: list[str] = []
    if case not in new.cases:
        return ["not recorded in AFTER"], added
    for name in ("manifest.jsonl", "stdout.jsonl"):
        rows, other = old.rows(case, name), new.rows(case, name)
        if len(rows) != len(other):
            found.append(f"{name}: {len(rows)} rows -> {len(other)}")
        for n, (a, b) in enumerate(zip(rows, other, strict=False)):
            found += differences(a, b, f"{name}[{n}]", added)
    found += compare_files(old.folder / case / "out", new.folder / case / "out")
    if any(row.get("fingerprint") for row in old.rows(case, "manifest.jsonl")):
        found += drift(old.folder / case, new.folder / case)
    return found, sorted(set(added))


def compare(before: Path, after: Path, strict: bool) -> int:
    """Every case of ``before`` against ``after``: 0 when all are the same, else 1."""
    old, new = Side(before), Side(after)
    failing = 0
    models = compare_models(Path(old.swaps[0][0]), Path(new.swaps[0][0]))
    if models:
        failing += 1
        print(f"models: {len(models)} difference(s)\n  " + "\n  ".join(models))
    for case in old.cases:
        found, added = compare_case(old, new, case)
        if strict:
            found += [f"{field}: only in AFTER" for field in added]
        maps = len(list((old.folder / case / "out").rglob("*.npy")))
        rows = len(old.rows(case, "manifest.jsonl"))
        verdict = "same" if not found else f"{len(found)} difference(s)"
        print(f"{case}: {verdict} ({rows} rows, {maps} maps)")
        for line in found[:40]:
            print(f"  {line}")
        if len(found) > 40:
            print(f"  ... and {len(found) - 40} more")
        if added:
            print(f"  fields added in AFTER (not compared): {', '.join(added[:10])}{' ...' * (len(added) > 10)}")
        failing += bool(found)
    extra = [case for case in new.cases if case not in old.cases]
    if extra:
        print(f"recorded in AFTER only (not compared): {', '.join(extra)}")
    print(f"{'DIFFERENT' if failing else 'SAME'}: {len(old.cases)} case(s), {failing} with differences")
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("out", nargs="?", type=Path, help="the folder to record into")
    parser.add_argument("--models", type=Path, help="an existing models folder (default: build into OUT/models)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to run (default: this script's)")
    parser.add_argument("--case", action="append", choices=list(CASES), help="only this case (repeatable)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--strict", action="store_true", help="--compare: a field added in AFTER is a difference")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = args.compare
        return compare(before, after, strict=args.strict)
    if args.out is None:
        parser.error("give OUT_DIR, or --compare BEFORE AFTER")
    return record(args.out, args.models, args.root.resolve(), args.case or list(CASES))


if __name__ == "__main__":
    sys.exit(main())
