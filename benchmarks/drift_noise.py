"""How much two runs of the same model differ, to choose ``gradcam diff``'s tolerance (docs/ci.md, "The tolerance").

Explains ``sample_images/`` with the pretrained EfficientNet-Lite0 (top 3 classes, gradcam, gradcam++ and
layercam: 75 maps a run) once as the reference, then again under each other way of running: the same settings
again, other batch sizes (which change the batching), decoding processes, thread counts, and
``--deterministic``. Each run is compared with the reference as ``gradcam diff`` does it, from the fingerprints and
from the ``.npy`` maps, and the worst values are printed: the run-to-run variation. For scale, the same is done
for the model with its weights slightly disturbed (Gaussian noise of a share of each tensor's standard deviation),
small stand-ins for a retrained model.

Usage: ``python benchmarks/drift_noise.py [--images DIR] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.drift.compare import compare_pair, diff_runs
from gradcam_cli.drift.manifests import MapRow
from gradcam_cli.drift.provenance import use_deterministic
from gradcam_cli.io.discovery import discover
from gradcam_cli.models.loading import load_model
from gradcam_cli.options import DiffOptions, OutputOptions, RunOptions
from gradcam_cli.pipeline.session import Session

METHODS = ["gradcam", "gradcam++", "layercam"]
TOP_K = 3
RUNS = [
    ("same settings again", RunOptions(batch_size=4, workers=0), None),
    ("same settings a third time", RunOptions(batch_size=4, workers=0), None),
    ("batch size 1", RunOptions(batch_size=1, workers=0), None),
    ("batch size 16, 2 workers", RunOptions(batch_size=16, workers=2), None),
    ("batch size 3, 1 thread", RunOptions(batch_size=3, workers=1), 1),
    ("--deterministic, batch size 8", RunOptions(batch_size=8, workers=0, deterministic=True), None),
]
NOISE = [0.001, 0.003, 0.01, 0.03, 0.1]


def explain(model, images, folder: Path, run: RunOptions) -> Path:
    """One run into ``folder`` with a manifest and the ``.npy`` maps; returns the manifest."""
    shutil.rmtree(folder, ignore_errors=True)
    manifest = folder / "manifest.jsonl"
    explainer = Explainer(model, "_swish", METHODS, top_k=TOP_K)
    with Session(OutputOptions(folder, save_raw=True, manifest=manifest), run) as session:
        for _ in session.explain(explainer, images):
            pass
    return manifest


def worst(reference: Path, manifest: Path) -> dict[str, float]:
    """The worst measures of a run against the reference, over the pairs that explain the same class: from the
    ``.npy`` maps, and from the fingerprints alone (what a diff without ``--save-raw`` compares)."""
    loose = DiffOptions(allow_class_change=True, allow_missing=True)
    results = diff_runs(reference, manifest, loose).results
    same = [result.pair for result in results if result.pair.baseline.target == result.pair.current.target]
    maps = [compare_pair(pair, loose) for pair in same]
    prints = [
        compare_pair(replace(pair, baseline=_no_raw(pair.baseline), current=_no_raw(pair.current)), loose)
        for pair in same
    ]
    return {
        "pairs": len(results),
        "class changes": len(results) - len(same),
        "max |map diff|": max(float(np.abs(np.load(p.baseline.raw) - np.load(p.current.raw)).max()) for p in same),
        "cells changed": sum(int((p.baseline.grid != p.current.grid).sum()) for p in same),
        "spearman maps": min(r.spearman for r in maps),
        "spearman prints": min(r.spearman for r in prints),
        "pearson maps": min(r.pearson for r in maps),
        "pearson prints": min(r.pearson for r in prints),
        "peak shift maps": max(r.peak_shift for r in maps),
        "peak shift prints": max(r.peak_shift for r in prints),
    }


def _no_raw(row: MapRow) -> MapRow:
    return replace(row, raw=None)


def disturbed(model, share: float, seed: int = 1):
    """A copy of the model with noise of ``share`` x each floating tensor's standard deviation added."""
    import copy

    generator = torch.Generator().manual_seed(seed)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in twin.module.parameters():  # learned weights only, not BatchNorm's running statistics
            if tensor.numel() > 1:
                tensor.add_(torch.randn(tensor.shape, generator=generator) * tensor.std() * share)
    return twin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=Path(__file__).resolve().parent.parent / "sample_images")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="drift-noise-"))
    images = discover([str(args.images)])
    model = load_model("efficientnet_lite0")
    threads = torch.get_num_threads()
    reference = explain(model, images, out / "reference", RunOptions(batch_size=4, workers=0))
    rows = []
    for name, run, thread_count in RUNS:
        torch.set_num_threads(thread_count or threads)
        if run.deterministic:
            use_deterministic()
        rows.append((name, worst(reference, explain(model, images, out / "run", run))))
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
    for share in NOISE:
        manifest = explain(disturbed(model, share), images, out / "run", RUNS[0][1])
        rows.append((f"weights + {share:g} std noise", worst(reference, manifest)))
    keys = list(rows[0][1])
    print("run".ljust(31) + "".join(key.rjust(max(12, len(key) + 2)) for key in keys))
    for name, values in rows:
        print(name.ljust(31) + "".join(f"{values[key]:.6g}".rjust(max(12, len(key) + 2)) for key in keys))
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
