"""The contract between the registries: every method on every task it applies to, through the command line.

The cases are generated at collection from the method registry (``cam.methods.METHODS``) and the task registry
(``cam.tasks.TASKS``, with the keypoint plugin of tests/task_plugins registered for its cases): a new method or task
is covered without editing a list here. Each task has tiny example models (:data:`EXAMPLES`; a classifier's also
with ``similar:`` targets; a task without one fails :func:`test_every_registered_task_has_an_example`). Each case
runs ``gradcam`` in-process (typer's CliRunner) on one small image with ``--save-raw --manifest`` and light settings
for the black-box methods, and checks that the row is written and the saved map is finite, in [0, 1] and of the
image's shape. That the gradient methods agree with an autograd reference is
tests/methods/test_cli_agreement.py's subject, not repeated here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from square_model import square_image
from torch import nn
from typer.testing import CliRunner

from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cam.methods.needs import ATTENTION_NEEDS
from gradcam_cli.cam.tasks import TASKS
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE

HERE = Path(__file__).parents[1]
PLUGIN_TASKS = {"keypoints": "task_plugins.keypoints"}
"""Tasks the tests' own plugins add (registered for their cases only)."""
LIGHT = ["--rise-masks", "16", "--occlusion-window", "16", "--occlusion-stride", "16"]
LIGHTER = {"detr": ["--rise-masks", "8", "--occlusion-window", "64", "--occlusion-stride", "64"]}
"""Lighter settings where each masked pass is costly (a DETR decodes 100 queries per pass)."""
SIZED = ["--input-size", "64"]
"""The image models' input size (a vision-language model's processor sizes the image: --input-size is refused)."""
UNSIZED = {"answer", "detr"}
"""Tasks whose models' processors size the image (--input-size is refused or not needed)."""
SIZE = (80, 64)
"""The image's (W, H): the saved maps must have its shape."""


def _classify(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    return ["-m", f"{HERE / 'square_model.py'}:build"]


def _detect(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    labels = tmp_path / "classes.txt"
    labels.write_text("__background__\nred\ngreen\nblue\n", encoding="utf-8")
    return ["-m", f"{HERE / 'task_models.py'}:build_detector", "--labels", str(labels), "--input-size", "96"]


def _similar(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    reference = tmp_path / "reference.png"
    square_image(SIZE, (40, 20, 70, 50)).save(reference)
    return ["-m", f"{HERE / 'embedding_model.py'}:build", "--target", f"similar:{reference}"]


def _segment(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    return ["-m", f"{HERE / 'task_models.py'}:build_segmenter"]


def _yolo(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    checkpoint = request.getfixturevalue("checkpoint")  # trained once per session (conftest.py): slow
    return ["-m", f"yolo:{checkpoint}", "--input-size", "64"]


def _vit(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    return ["-m", f"{HERE / 'attention_models.py'}:build_vit"]


_MADE: dict[str, Path] = {}
"""Examples made once per session (a saved model folder), by name."""


def _llava(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    if "llava" not in _MADE:  # the tiny random LLaVA of tests/vlm_models.py, saved once
        import vlm_models

        folder = request.getfixturevalue("tmp_path_factory").mktemp("llava")
        _MADE["llava"] = vlm_models.llava(folder)
    return ["-m", f"hf:{_MADE['llava']}", "--prompt", "what is the cat ?", "--answer", "a cat"]


def _detr(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    if "detr" not in _MADE:  # the tiny random DETR of tests/detr_models.py, saved once
        import detr_models

        _MADE["detr"] = detr_models.save_detr(request.getfixturevalue("tmp_path_factory").mktemp("detr"))
    return ["-m", f"hf:{_MADE['detr']}"]


def _rtdetr(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    if "rtdetr" not in _MADE:  # the tiny random ultralytics RT-DETR of tests/rtdetr_model.py, saved once
        import rtdetr_model

        folder = request.getfixturevalue("tmp_path_factory").mktemp("rtdetr")
        _MADE["rtdetr"] = rtdetr_model.save_rtdetr(folder / "tiny-rtdetr.pt")
    return ["-m", f"yolo:{_MADE['rtdetr']}"]


def _keypoints(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    return ["-m", f"{HERE / 'task_plugins' / 'keypoints.py'}:build", "--task", "keypoints"]


def _count(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    return ["-m", "toy:counter", "--weights", "none"]  # the example plugin's (tests/plugins/example_plugin, installed)


Example = Callable[[Path, pytest.FixtureRequest], list[str]]
EXAMPLES: dict[str, dict[str, Example]] = {
    "classify": {"classes": _classify, "similar": _similar},
    "detect": {"detector": _detect},
    "segment": {"segmenter": _segment},
    "yolo": {"yolo": _yolo},
    "keypoints": {"heatmaps": _keypoints},
    "count": {"counter": _count},
    "answer": {"llava": _llava},
    "detr": {"detr": _detr, "rtdetr": _rtdetr},
}
"""Each task's examples: the command-line arguments that load a tiny model of it (and its targets)."""
TRANSFORMER_EXAMPLES: dict[str, dict[str, Example]] = {"classify": {"vit": _vit}}
"""The examples of the methods that read a transformer's attention (their needs say so: a CNN refuses them), in
place of the task's own: a tiny timm ViT with a class token and registers (tests/attention_models.py)."""
MAY_REFUSE = {"similar"}
"""Examples whose targets some of the task's methods refuse (Finer-CAM needs a target with rivals): such a case
passes when the method explains or when it is refused in one line naming it, exit code 2."""
SLOW_TASKS = {"yolo"}
"""Tasks whose example is slow to make (the YOLO checkpoint is trained once per session)."""


def _adapter(task: str):  # the plugin's adapter is imported, not registered, at collection
    if task in PLUGIN_TASKS:
        import importlib

        return importlib.import_module(PLUGIN_TASKS[task]).ADAPTER
    return TASKS[task]


def _cases() -> list[object]:
    cases = []
    for task in [*TASKS.names(), *PLUGIN_TASKS]:
        adapter = _adapter(task)
        marks = [pytest.mark.slow] if task in SLOW_TASKS else []
        for name, method in METHODS.items():
            if adapter.takes(name, method.tasks, nn.Identity()):
                examples = EXAMPLES.get(task, {"missing": _missing})
                if method.needs in ATTENTION_NEEDS:
                    examples = TRANSFORMER_EXAMPLES.get(task, {})
                for example in examples:
                    cases.append(pytest.param(task, example, name, marks=marks, id=f"{task}-{example}-{name}"))
    return cases


def _missing(tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    raise AssertionError("this task has no example model in EXAMPLES")


def test_every_registered_task_has_an_example() -> None:
    missing = [task for task in TASKS.names() if task not in EXAMPLES]
    assert not missing, f"give each task an example model in EXAMPLES: {missing}"


@pytest.mark.parametrize(("task", "example", "method"), _cases())
def test_each_method_explains_each_task_it_applies_to_on_the_command_line(
    task: str, example: str, method: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    plugin = task in PLUGIN_TASKS and task not in TASKS
    if plugin:
        TASKS.register(task, _adapter(task))
    try:
        image = tmp_path / "red.png"
        square_image(SIZE, (20, 16, 52, 48)).save(image)
        out = tmp_path / "out"
        build = {**EXAMPLES[task], **TRANSFORMER_EXAMPLES.get(task, {})}[example]
        sized = [] if task in UNSIZED else SIZED
        args = [str(image), *build(tmp_path, request), *LIGHTER.get(task, LIGHT), *sized, "--method", method]
        args += ["-o", str(out), "--save-raw", "--manifest", str(out / "m.jsonl"), "--workers", "0"]
        result = CliRunner().invoke(app, args)
    finally:
        if plugin:
            TASKS.unregister(task)
    if example in MAY_REFUSE and result.exit_code == EXIT_USAGE:
        assert result.stderr.startswith(f"error: --method {method} ") and len(result.stderr.splitlines()) == 1
        return
    assert result.exit_code == EXIT_OK, result.output
    rows = [json.loads(line) for line in (out / "m.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows and all(row["status"] == "ok" and row["method"] == method for row in rows), rows
    raw = [Path(path) for row in rows for path in row["outputs"] if path.endswith(".npy")]
    assert raw, rows
    for path in raw:
        saliency = np.load(path)
        assert saliency.shape == (SIZE[1], SIZE[0]), path
        assert np.isfinite(saliency).all() and saliency.min() >= 0.0 and saliency.max() <= 1.0, path
    assert Image.open(rows[0]["outputs"][0]).size == SIZE
