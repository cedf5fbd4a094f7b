"""A task registered from outside the package (tests/task_plugins/keypoints.py, through the task registry's entry
point callback) runs through the command line, its manifest and resumed rows, the gallery, ``gradcam diff``,
``gradcam eval`` and ``gradcam serve`` with no edit to the package."""

from __future__ import annotations

import io
import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from square_model import square_image
from starlette.testclient import TestClient
from typer.testing import CliRunner

from gradcam_cli import registry as registry_module
from gradcam_cli.cam.tasks import TASKS
from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.io.naming import INDEX_NAME
from gradcam_cli.models.loading import load_model
from gradcam_cli.options import ModelOptions
from gradcam_cli.serve import ModelService, create_app

MODEL = f"{Path(__file__).parents[1] / 'task_plugins' / 'keypoints.py'}:build"
RED_BOX = (40, 20, 72, 52)
"""Where the red square lies in red.png (x1, y1, x2, y2): its keypoint's peak is inside."""


@pytest.fixture
def keypoints(monkeypatch: pytest.MonkeyPatch):
    """The plugin's adapter registered as an entry point naming it would register it; removed afterwards."""
    point = metadata.EntryPoint("keypoints", "task_plugins.keypoints:ADAPTER", "gradcam_cli.tasks")
    installed = registry_module.plugin_entry_points
    monkeypatch.setattr(
        registry_module, "plugin_entry_points", lambda group: [point] if group == point.group else installed(group)
    )
    monkeypatch.setattr(TASKS, "_plugins_loaded", False)
    assert "keypoints" in TASKS  # loads the plugin: the registry's callback registers the adapter object
    yield TASKS["keypoints"]
    TASKS.unregister("keypoints")


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    square_image((120, 80), RED_BOX).save(folder / "red.png")
    square_image((96, 96), (10, 50, 40, 80), "blue").save(folder / "blue.png")
    (tmp_path / "keypoints.txt").write_text("red\nblue\n", encoding="utf-8")
    return folder


def run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def explain(inputs: Path, out: Path, *more: str | Path) -> object:
    labels = inputs.parent / "keypoints.txt" if inputs.is_dir() else inputs.parent.parent / "keypoints.txt"
    common = ["-m", MODEL, "--task", "keypoints", "--labels", labels, "-o", out, "--workers", "0", "--deterministic"]
    return run(inputs, *common, "--manifest", out / "m.jsonl", *more)


def test_a_plugins_task_runs_on_the_command_line_with_its_rows_gallery_and_resume(keypoints, inputs, tmp_path):
    out = tmp_path / "out"
    result = explain(inputs, out, "--json", "--report", "--method", "gradcam,scorecam")
    assert result.exit_code == EXIT_OK, result.output
    rows = {(Path(row["input"]).name, row["method"]): row for row in map(json.loads, result.stdout.splitlines())}
    assert set(rows) == {(name, method) for name in ("red.png", "blue.png") for method in ("gradcam", "scorecam")}
    red = rows["red.png", "gradcam"]
    assert red["status"] == "ok" and red["provenance"]["task"] == "keypoints"
    assert red["target"]["name"] == "red"
    x, y = red["target"]["peak"]  # the task's own payload, as its own key
    assert RED_BOX[0] <= x <= RED_BOX[2] and RED_BOX[1] <= y <= RED_BOX[3]
    assert rows["blue.png", "gradcam"]["target"]["name"] == "blue"
    saved = np.asarray(Image.open(red["outputs"][0]))
    assert saved.shape[:2] == (80, 120)
    assert (out / INDEX_NAME).is_file() and "red.png" in (out / INDEX_NAME).read_text(encoding="utf-8")

    console = explain(inputs / "red.png", tmp_path / "one", "--method", "gradcam")
    assert console.exit_code == EXIT_OK, console.output
    assert "(keypoint 0) peaks at (" in console.stdout and "gradcam for red (peak " in console.stdout

    resumed = explain(inputs, out, "--json", "--skip-existing", "--method", "gradcam,scorecam")
    assert resumed.exit_code == EXIT_OK, resumed.output
    again = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert {row["status"] for row in again} == {"skipped"}
    assert next(r for r in again if r["method"] == "gradcam" and "red" in r["input"])["target"]["peak"] == [x, y]


def test_gradcam_diff_compares_a_plugins_runs(keypoints, inputs, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert explain(inputs, out).exit_code == EXIT_OK
    same = CliRunner().invoke(diff_app, [str(first / "m.jsonl"), str(second / "m.jsonl")])
    assert same.exit_code == EXIT_OK, same.output
    assert same.stderr.startswith("no drift: 2 image(s)")


def test_gradcam_eval_scores_a_plugins_maps_against_boxes(keypoints, inputs, tmp_path):
    boxes = tmp_path / "boxes.csv"
    boxes.write_text(f"image,x1,y1,x2,y2,class\nred.png,{','.join(map(str, RED_BOX))},\n", encoding="utf-8")
    labels = str(inputs.parent / "keypoints.txt")
    base = [str(inputs), "-m", MODEL, "--task", "keypoints", "--labels", labels, "--boxes", str(boxes)]
    result = CliRunner().invoke(eval_app, [*base, "--json"])
    assert result.exit_code == EXIT_OK, result.output
    pointing = json.loads(result.stdout)["methods"]["gradcam"]["pointing"]["overall"]
    assert pointing["count"] == 1 and pointing["hits"] == 1
    refused = CliRunner().invoke(eval_app, [*base, "--sanity"])
    assert refused.exit_code == EXIT_USAGE
    assert refused.stderr.splitlines()[-1].startswith("error: --sanity is for classifiers; a keypoint model's maps")


def test_gradcam_serve_explains_a_plugins_task(keypoints, inputs, tmp_path):
    service = ModelService(load_model(ModelOptions(MODEL, labels=inputs.parent / "keypoints.txt", task="keypoints")))
    buffer = io.BytesIO()
    Image.open(inputs / "red.png").save(buffer, "PNG")
    with TestClient(create_app(service, work_dir=tmp_path / "work"), base_url="http://127.0.0.1:8765") as client:
        info = client.get("/api/info").json()["model"]
        assert info["task"] == "keypoints" and "gradcam" in info["methods"] and "ablationcam" not in info["methods"]
        image_id = client.post("/api/upload?name=red.png", content=buffer.getvalue()).json()["id"]
        answer = client.get(f"/api/map?image={image_id}").json()
        assert answer["predictions"][0]["name"] == "red" and "peak" in answer["predictions"][0]
        blue = client.get(f"/api/map?image={image_id}&target=blue").json()
        assert blue["predictions"][0]["name"] == "red" and blue["id"] != answer["id"]
        refused = client.get(f"/api/maps/{answer['id']}/faithfulness")
        assert refused.status_code == 400 and "not a keypoint model" in refused.json()["error"]
