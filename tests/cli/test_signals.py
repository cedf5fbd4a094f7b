"""SIGTERM and SIGHUP end ``gradcam`` as Ctrl-C does (exit 130, ``error: interrupted``), with nothing left behind:
no lock, no temporary file, no torn manifest row. The command runs in a subprocess over a folder, its model held
in its forward pass (a marker file) until the signal has been sent; ``gradcam serve``'s own signal tests are in
tests/serve/test_serve_runs.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
HOLDING_MODEL = '''
import time
from pathlib import Path

from torch import nn

HERE = Path(__file__).parent


class Holding(nn.Module):
    """A tiny classifier whose forward pass says it started (``ready``) and waits while ``hold`` exists."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        (HERE / "ready").touch()
        for _ in range(2400):  # at most 2 minutes: a hang guard
            if not (HERE / "hold").exists():
                break
            time.sleep(0.05)
        return self.fc(self.features(x).mean((2, 3)))


def build():
    return Holding()
'''


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_a_folder_run_as_ctrl_c_does(tmp_path, number):
    (tmp_path / "holding.py").write_text(HOLDING_MODEL)
    (tmp_path / "hold").touch()
    photos = tmp_path / "photos"
    photos.mkdir()
    for n in range(4):
        Image.new("RGB", (32, 24), (60 * n, 0, 255)).save(photos / f"p{n}.png")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "gradcam_cli", str(photos), "-o", str(out), "--manifest", str(out / "m.jsonl")]
    command += ["--model", f"{tmp_path / 'holding.py'}:build", "--weights", "none", "--input-size", "32", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(2400):  # the model is in its forward pass (a hang guard, never a timing)
            if (tmp_path / "ready").exists() or process.poll() is not None:
                break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
        process.send_signal(number)
        (tmp_path / "hold").unlink()
        assert process.stderr is not None
        code = process.wait(timeout=120)
        errors = process.stderr.read()
    finally:
        process.kill()
    assert code == 130 and errors.strip().splitlines()[-1] == "error: interrupted", (code, errors)
    left = sorted(p.name for p in tmp_path.rglob("*") if p.name.endswith(".lock") or ".gradcam-tmp-" in p.name)
    assert left == []
    if (out / "m.jsonl").exists():
        for line in (out / "m.jsonl").read_text().splitlines():
            assert json.loads(line)["status"] in ("ok", "error")  # every row whole
