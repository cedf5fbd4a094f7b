"""``make gpu-check`` (benchmarks/gpu_check.py) without a GPU: one line and exit code 77 where CUDA is missing; its
figures turned into the docs' section between the markers; the whole script run on the CPU with a few photos."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.quick
def test_without_cuda_it_says_so_in_one_line_and_exits_77():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 77 and done.stderr == ""
    assert done.stdout == (
        "gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing measured\n"
    )


@pytest.mark.quick
def test_the_figures_fill_the_docs_section_between_its_markers(tmp_path):
    gpu_check = _module()
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert text.count(gpu_check.START) == 1 and text.count(gpu_check.END) == 1
    runs = [
        {"precision": "fp32", "batch": 32, "exit": 0, "rate": 400.0, "plain": 200.0, "peak_mib": 1500.0},
        {"precision": "fp32", "batch": 64, "exit": 0, "rate": 500.0, "plain": 250.0, "peak_mib": 2900.0},
        {"precision": "bf16", "batch": 32, "exit": 0, "rate": 700.0, "plain": 350.0, "peak_mib": 900.0},
        {"precision": "bf16", "batch": 64, "exit": 1, "rate": None, "plain": 360.0, "peak_mib": None},
    ]
    figures = {
        "device": "NVIDIA H100",
        "seconds": 300.0,
        "gpu_tests": {"exit": 0, "summary": "12 passed in 30s"},
        "resnet50": {"images": 512, "runs": runs, "best": {"fp32": runs[1], "bf16": runs[2]}},
        "vlm": {"exit": 0, "map_written": True, "seconds": 9.5, "peak_mib": 40.0},
    }
    figures["failures"] = gpu_check._failures(figures)
    assert figures["failures"] == ["gradcam resnet50 bf16 batch 64: exit 1"]
    docs = tmp_path / "benchmarks.md"
    docs.write_text(text, encoding="utf-8")
    gpu_check.fill_docs(docs, json.loads(json.dumps(figures)))  # as read back from the JSON file
    filled = docs.read_text(encoding="utf-8")
    head, _, rest = text.partition(gpu_check.START)
    assert filled.startswith(head) and filled.endswith(rest.partition(gpu_check.END)[2])
    assert "| fp32 | 64 (best) | 500.0 | 250.0 | 2.00 | 2,900 |" in filled
    assert "| bf16 | 32 (best) | 700.0 | 350.0 | 2.00 | 900 |" in filled
    assert "| bf16 | 64 | - | 360.0 | - | - |" in filled
    assert "Measured on NVIDIA H100 in 300 s" in filled and "Failed: gradcam resnet50 bf16 batch 64: exit 1." in filled
    gpu_check.fill_docs(docs, json.loads(json.dumps(figures)))
    assert docs.read_text(encoding="utf-8") == filled  # rewritten in place, not added to
    assert gpu_check.summary(figures) == (
        "gpu-check on NVIDIA H100: resnet50 fp32 500.0 images/s at batch 64, bf16 700.0 images/s at batch 32; "
        "failed: gradcam resnet50 bf16 batch 64: exit 1"
    )


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu(tmp_path):
    """Every step but the gpu tests, on the CPU, with two photos: the figures file and the docs section written."""
    docs, figures = tmp_path / "benchmarks.md", tmp_path / "gpu_check.json"
    docs.write_text((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"), encoding="utf-8")
    command = [sys.executable, str(SCRIPT), "--cpu", "--images", "2", "--batches", "2", "--skip-tests"]
    done = subprocess.run(
        [*command, "--json", str(figures), "--docs", str(docs)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(figures.read_text())
    assert result["failures"] == [] and result["vlm"]["map_written"]
    assert [(run["precision"], run["batch"], run["exit"]) for run in result["resnet50"]["runs"]] == [
        ("fp32", 2, 0),
        ("bf16", 2, 0),
    ]
    assert all(run["rate"] > 0 and run["plain"] > 0 for run in result["resnet50"]["runs"])
    assert "Measured on cpu" in docs.read_text() and done.stdout.startswith("gpu-check on cpu: resnet50 fp32 ")
