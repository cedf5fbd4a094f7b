"""Plugins: the example plugin package (tests/plugins/example_plugin, installed into the test environment by
``make install``) adds the ``toy:`` model family, the ``toy-saliency`` method and the ``count`` task through the
installed ``gradcam_cli.families``, ``gradcam_cli.methods`` and ``gradcam_cli.tasks`` entry points (not patched
here), used together from the command line, ``gradcam eval`` and an in-process ``gradcam serve`` app; a family
registered in a notebook is claimed as the package's own are."""

from __future__ import annotations

import io
import json
import os
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE, UsageError
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.families import FAMILIES, Family, family_of
from gradcam_cli.models.families.base import chosen_task
from gradcam_cli.models.loading import load_model
from gradcam_cli.models.profile import LoadedModel, ModelProfile
from gradcam_cli.models.tasks import CLASSIFY
from gradcam_cli.options import ModelOptions
from gradcam_cli.registry import FAMILIES_GROUP, METHODS_GROUP, TASKS_GROUP

PLUGIN = Path(__file__).parents[1].joinpath("plugins") / "example_plugin"
INSTALL = f"pip install -e {PLUGIN.relative_to(Path(__file__).parents[2])} (make install does)"
RED_SQUARE = (8, 8, 40, 40)  # x1, y1, x2, y2 in the 96 x 64 image
COUNTED = {"red": [(8, 8, 24, 24), (40, 8, 56, 24)], "blue": [(60, 40, 76, 56)]}
"""The 16 x 16 squares of each colour in the counting scene (x1, y1, x2, y2, on grey): ``toy:counter`` counts them."""


def plugin_points() -> dict[str, list[str]]:
    return {
        group: [point.name for point in metadata.entry_points(group=group) if point.value.startswith("gradcam_example")]
        for group in (FAMILIES_GROUP, METHODS_GROUP, TASKS_GROUP)
    }


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    if not plugin_points()[FAMILIES_GROUP]:
        pytest.fail(f"the example plugin is not installed: {INSTALL}")


@pytest.fixture
def scene(tmp_path: Path) -> Path:
    """A blue image with a red square at :data:`RED_SQUARE`."""
    image = Image.new("RGB", (96, 64), (0, 0, 255))
    image.paste((255, 0, 0), RED_SQUARE)
    path = tmp_path / "in" / "scene.png"
    path.parent.mkdir()
    image.save(path)
    return path


@pytest.fixture
def squares(tmp_path: Path) -> Path:
    """A grey 96 x 64 image with the squares of :data:`COUNTED`."""
    image = Image.new("RGB", (96, 64), (128, 128, 128))
    for colour, boxes in COUNTED.items():
        for box in boxes:
            image.paste({"red": (255, 0, 0), "blue": (0, 0, 255)}[colour], box)
    path = tmp_path / "in" / "squares.png"
    path.parent.mkdir()
    image.save(path)
    return path


def inside(saliency: np.ndarray, colour: str) -> float:
    """The map's mean over the squares of ``colour``."""
    return float(np.mean([saliency[y1:y2, x1:x2].mean() for x1, y1, x2, y2 in COUNTED[colour]]))


def with_features(model: LoadedModel, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The toy model's output for ``inputs`` and its layer ``features``' output, captured separately (autograd's
    reference for the maps)."""
    seen: list[torch.Tensor] = []
    handle = model.module.get_submodule("features").register_forward_hook(lambda _m, _i, output: seen.append(output))
    try:
        output = model.module(inputs)
    finally:
        handle.remove()
    return output, seen[0]


def test_the_plugin_declares_one_entry_point_of_each_group() -> None:
    assert plugin_points() == {FAMILIES_GROUP: ["toy"], METHODS_GROUP: ["toy-saliency"], TASKS_GROUP: ["toy"]}


def test_the_toy_family_is_registered_from_its_entry_point_and_claims_its_prefix() -> None:
    assert "toy" in FAMILIES and FAMILIES.names()[-1] == "toy"  # after the package's own
    assert family_of("toy:tiny").name == "toy"
    assert family_of("tests/square_model.py:build").name == "custom"  # the catch-alls are asked after it
    loaded = load_model("toy:tiny", "none")
    assert (loaded.categories, loaded.task, loaded.input_spec.size) == (["red", "green", "blue"], "classify", 64)
    with pytest.raises(UsageError, match=r"unknown toy model 'tiy'\. Did you mean: tiny\?"):
        load_model("toy:tiy", "none")


@pytest.mark.quick
def test_the_command_line_explains_a_toy_model(scene: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [scene, "--model", "toy:tiny", "--weights", "none", "--target-class", "red", "--output-dir", out]
    result = CliRunner().invoke(app, [*map(str, args), "--json", "--save-raw"])
    assert result.exit_code == EXIT_OK, result.output
    row = json.loads(result.stdout.splitlines()[0])
    assert (row["model"], row["target"]["name"], row["predictions"][0]["name"]) == ("toy:tiny", "red", "blue")
    saliency = np.load(next(out.glob("*.npy")))
    assert saliency.shape == (64, 96)
    x1, y1, x2, y2 = RED_SQUARE
    assert saliency[y1:y2, x1:x2].mean() > 0.9 and saliency[45:, 50:].max() < 0.1  # on the red square only
    unknown = CliRunner().invoke(app, [str(scene), "--model", "toy:tiy", "--weights", "none", "--quiet"])
    assert unknown.exit_code == EXIT_USAGE and "Did you mean: tiny?" in unknown.stderr


@pytest.mark.quick
def test_the_run_record_and_every_rows_provenance_name_the_plugins_version(scene: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [scene, "--model", "toy:tiny", "--weights", "none", "--method", "toy-saliency", "--output-dir", out]
    result = CliRunner().invoke(app, [*map(str, args), "--json"])
    assert result.exit_code == EXIT_OK, result.output
    version = metadata.version("gradcam-example-plugin")
    assert json.loads(result.stdout)["provenance"]["plugins"] == {"gradcam-example-plugin": version}
    record = json.loads((out / ".gradcam-run.json").read_text(encoding="utf-8"))
    assert record["plugins"] == {"gradcam-example-plugin": version}


def test_gradcam_eval_measures_a_toy_model(tmp_path: Path) -> None:
    image = Image.new("RGB", (96, 64), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 56, 64))  # red on the left, the top class
    image.save(tmp_path / "half.png")
    options = ["--model", "toy:tiny", "--weights", "none", "--target-class", "red", "--steps", "8", "--json"]
    result = CliRunner().invoke(eval_app, [str(tmp_path / "half.png"), *options, "--quiet"])
    assert result.exit_code == EXIT_OK, result.output
    figures = json.loads(result.stdout.splitlines()[0])["per_image"][0]["methods"]["gradcam"]
    assert figures["deletion_auc"] < figures["insertion_auc"]  # the map's red pixels deleted first, inserted first


def test_serve_explains_a_toy_model(scene: Path, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gradcam_cli.serve import ModelService, create_app

    service = ModelService(ModelOptions("toy:tiny", weights="none"))
    with TestClient(create_app(service, work_dir=tmp_path / "work"), base_url="http://127.0.0.1:8765") as client:
        image_id = client.post("/api/upload?name=scene.png", content=scene.read_bytes()).json()["id"]
        answer = client.get(f"/api/map?image={image_id}&target=red").json()
        assert answer["target"]["name"] == "red", answer
        saliency = np.load(io.BytesIO(client.get(f"/api/maps/{answer['id']}/map.npy").content))
    x1, y1, x2, y2 = RED_SQUARE
    assert saliency.shape == (64, 96) and saliency[y1:y2, x1:x2].mean() > 0.9


class Doubling(Family):
    """A family registered in a notebook: ``double:N`` is a 1x1 convolution of N output channels."""

    name = "double"
    prefix = "double:"
    counts_classes = True

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        channels = int(options.model.removeprefix("double:"))
        module = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        profile = ModelProfile(InputSpec(size=32), None, chosen_task(options, CLASSIFY))
        return LoadedModel(module, options.model, options.weights, profile=profile)


@pytest.mark.quick
def test_a_family_registered_in_a_notebook_loads_through_load_model(tmp_path: Path) -> None:
    FAMILIES.register("double", Doubling())
    try:
        labels = tmp_path / "labels.txt"
        labels.write_text("a\nb\nc\nd\n", encoding="utf-8")
        loaded = load_model("double:4", "none", labels=labels, input_size=48)
        assert (loaded.categories, loaded.input_spec.size) == (["a", "b", "c", "d"], 48)  # what load_model adds
        labels.write_text("a\nb\n", encoding="utf-8")
        with pytest.raises(UsageError, match="2 names but the model has 4 classes"):
            load_model("double:4", "none", labels=labels)
    finally:
        FAMILIES.unregister("double")
    assert family_of("double:4").name == "custom"


def test_the_plugin_method_runs_from_the_command_line_and_equals_its_formula(scene: Path, tmp_path: Path) -> None:
    from gradcam_cli import Explainer

    out = tmp_path / "out"
    args = [scene, "--model", "toy:tiny", "--weights", "none", "--method", "toy-saliency", "--target-class", "red"]
    result = CliRunner().invoke(app, [*map(str, args), "--output-dir", str(out), "--json", "--save-raw"])
    assert result.exit_code == EXIT_OK, result.output
    assert json.loads(result.stdout.splitlines()[0])["method"] == "toy-saliency"
    saliency = np.load(next(out.glob("*.npy")))
    x1, y1, x2, y2 = RED_SQUARE
    assert saliency[y1:y2, x1:x2].mean() > 0.9 and saliency[45:, 50:].max() < 0.1

    model = load_model("toy:tiny", "none")
    inputs = torch.rand(2, 3, 16, 24)
    coarse = Explainer(model, "features", "toy-saliency").compute(inputs, target=0)[2]["toy-saliency"][0][0]
    logits, features = with_features(model, inputs)
    (gradients,) = torch.autograd.grad(logits[:, 0].sum(), features)
    assert torch.allclose(coarse, (gradients * features).abs().sum(dim=1), atol=1e-6)


def test_the_plugin_task_counts_from_the_command_line_with_the_plugin_family_and_method(
    squares: Path, tmp_path: Path
) -> None:
    from gradcam_cli.cam.tasks import TASKS

    assert "count" in TASKS and TASKS.names()[-1] == "count"  # the installed entry point registered it, last
    out = tmp_path / "out"
    common = [squares, "--model", "toy:counter", "--weights", "none", "--output-dir", out, "--top-k", "2"]
    args = [*common, "--method", "gradcam,toy-saliency", "--manifest", out / "m.jsonl", "--report"]
    result = CliRunner().invoke(app, [*map(str, args), "--json", "--save-raw"])
    assert result.exit_code == EXIT_OK, result.output
    rows = {(row["method"], row["target"]["name"]): row for row in map(json.loads, result.stdout.splitlines())}
    assert set(rows) == {(method, colour) for method in ("gradcam", "toy-saliency") for colour in ("red", "blue")}
    for (_, colour), row in rows.items():
        assert row["provenance"]["task"] == "count" and row["model"] == "toy:counter"
        assert row["target"]["count"] == pytest.approx(len(COUNTED[colour]), abs=1e-3)  # the task's own key
        assert [p["name"] for p in row["predictions"]] == ["red", "blue", "green"]
        assert row["predictions"][0]["probability"] == pytest.approx(2 / 3, abs=1e-3)  # a share of all counted
        saliency = np.load(next(path for path in row["outputs"] if path.endswith(".npy")))
        other = "blue" if colour == "red" else "red"
        assert saliency.shape == (64, 96) and inside(saliency, colour) > 0.7 and inside(saliency, other) < 0.05
    assert (out / "index.html").is_file() and "toy-saliency" in (out / "index.html").read_text(encoding="utf-8")

    console = CliRunner().invoke(app, [*map(str, common), "--method", "toy-saliency", "--output-dir", tmp_path / "c"])
    assert console.exit_code == EXIT_OK, console.output
    assert "(class 0), 2 counted" in console.stdout and "toy-saliency for blue (count 1) ->" in console.stdout

    named = CliRunner().invoke(app, [str(squares), "--model", "toy:tiny", "--weights", "none", "--task", "count"])
    assert named.exit_code == EXIT_USAGE  # a classifier asked to count is not explained as a classifier
    assert "a counting model returns (N, classes, h, w) density maps" in named.stderr


def test_each_image_of_a_counted_batch_gets_its_own_map(squares: Path, tmp_path: Path) -> None:
    """Two different images in one batch (the CPU's default batch of 4): each image's map is the one it gets alone
    (``--batch-size 1``), on its own most counted colour's squares."""
    other = {"blue": [(8, 40, 24, 56), (40, 40, 56, 56)], "red": [(76, 8, 92, 24)]}
    image = Image.new("RGB", (96, 64), (128, 128, 128))
    for colour, boxes in other.items():
        for box in boxes:
            image.paste({"red": (255, 0, 0), "blue": (0, 0, 255)}[colour], box)
    image.save(squares.parent / "other.png")
    maps = {}
    for batch in ("4", "1"):
        out = tmp_path / f"batch{batch}"
        args = [squares.parent, "--model", "toy:counter", "--weights", "none", "--method", "gradcam,toy-saliency"]
        options = ["--top-k", "1", "--batch-size", batch, "--output-dir", out, "--json", "--save-raw"]
        result = CliRunner().invoke(app, [*map(str, [*args, *options])])
        assert result.exit_code == EXIT_OK, result.output
        for row in map(json.loads, result.stdout.splitlines()):
            npy = next(path for path in row["outputs"] if path.endswith(".npy"))
            maps[batch, Path(row["input"]).name, row["method"], row["target"]["name"]] = np.load(npy)
    assert len(maps) == 8
    for (_, name, method, colour), saliency in maps.items():
        assert (name, colour) in (("squares.png", "red"), ("other.png", "blue"))  # two squares of each
        assert np.allclose(saliency, maps["1", name, method, colour], atol=1e-5)
        counted = COUNTED if name == "squares.png" else other
        mean = {c: np.mean([saliency[y1:y2, x1:x2].mean() for x1, y1, x2, y2 in counted[c]]) for c in counted}
        assert mean[colour] > 0.7 and mean["blue" if colour == "red" else "red"] < 0.05


def test_the_count_score_is_a_density_maps_sum_and_its_gradient_what_the_maps_show() -> None:
    from gradcam_cli import Explainer

    model = load_model("toy:counter", "none")
    inputs = torch.rand(2, 3, 32, 48)
    targets, cams = Explainer(model, "features", "toy-saliency").compute_targets(inputs, target=2)
    density, features = with_features(model, inputs)
    assert density.shape == (2, 3, 8, 12)
    (gradients,) = torch.autograd.grad(density[:, 2].sum(), features)
    assert torch.allclose(cams["toy-saliency"][0][0], (gradients * features).abs().sum(dim=1), atol=1e-6)
    value = targets.value(0)
    assert value is not None and float(value.detach()) == pytest.approx(float(density[:, 2].detach().sum()), rel=1e-5)


def test_gradcam_eval_scores_the_plugin_tasks_maps_against_each_colours_boxes(squares: Path, tmp_path: Path) -> None:
    lines = [f"squares.png,{','.join(map(str, box))},{colour}" for colour, boxes in COUNTED.items() for box in boxes]
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("\n".join(["image,x1,y1,x2,y2,class", *lines, "squares.png,0,40,16,56,green"]), encoding="utf-8")
    options = ["--model", "toy:counter", "--weights", "none", "--method", "gradcam,toy-saliency", "--json"]
    result = CliRunner().invoke(eval_app, [str(squares.parent), *options, "--boxes", str(boxes), "--quiet"])
    assert result.exit_code == EXIT_OK, result.output
    report = json.loads(result.stdout)
    for method in ("gradcam", "toy-saliency"):
        pointing = report["methods"][method]["pointing"]
        assert pointing["overall"]["count"] == 2 and pointing["overall"]["hits"] == 2, pointing  # red, blue
    assert report["undetected_boxes"] == 1  # the green box: nothing green is counted
    refused = CliRunner().invoke(eval_app, [str(squares.parent), *options, "--boxes", str(boxes), "--sanity"])
    assert refused.exit_code == EXIT_USAGE
    assert refused.stderr.splitlines()[-1].startswith("error: --sanity is for classifiers; a counting model's maps")


def test_serve_explains_the_plugin_task_with_the_plugin_method(squares: Path, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gradcam_cli.serve import ModelService, create_app

    service = ModelService(ModelOptions("toy:counter", weights="none"))
    with TestClient(create_app(service, work_dir=tmp_path / "work"), base_url="http://127.0.0.1:8765") as client:
        info = client.get("/api/info").json()["model"]
        assert info["task"] == "count" and "toy-saliency" in info["methods"] and "ablationcam" not in info["methods"]
        image_id = client.post("/api/upload?name=squares.png", content=squares.read_bytes()).json()["id"]
        answer = client.get(f"/api/map?image={image_id}").json()
        assert (answer["target"]["name"], answer["target"]["count"]) == ("red", pytest.approx(2, abs=1e-3)), answer
        blue = client.get(f"/api/map?image={image_id}&target=blue&method=toy-saliency").json()
        assert (blue["method"], blue["target"]["name"], blue["predictions"][0]["name"]) == (
            "toy-saliency",
            "blue",
            "red",
        )
        saliency = np.load(io.BytesIO(client.get(f"/api/maps/{blue['id']}/map.npy").content))
    assert saliency.shape == (64, 96) and inside(saliency, "blue") > 0.7 and inside(saliency, "red") < 0.05


@pytest.mark.quick
@pytest.mark.parametrize("command", [[], ["eval"]], ids=["gradcam", "gradcam eval"])
def test_help_shows_its_panels_and_the_plugins_method_without_importing_torch(command: list[str]) -> None:
    import subprocess
    import sys

    code = (
        f"import sys; sys.argv = ['gradcam', *{command!r}, '--help']\n"
        "import gradcam_cli.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "False"  # nothing imported torch: the plugin's name was read from its entry point
    titles = [line for line in lines if line and not line[0].isspace() and line.endswith(":")]
    expected = ["Input and model:", "What to explain:", "Methods:", "Vision-language (--prompt):"]
    expected += ["Measures:", "Ranking (--rank):"] if command else []
    assert titles == [*expected, "Output:", "Run:"]
    methods = " ".join(" ".join(lines[lines.index("Methods:") : lines.index("Vision-language (--prompt):")]).split())
    compact = methods.replace(" ", "")  # rich may break a line inside a hyphenated name ("toy-" / "saliency")
    assert "--method NAME[,NAME...]" in methods and "andtheplugins'toy-saliency;all:" in compact
    run = lines[lines.index("Run:") :]
    assert any(line.lstrip().startswith("--help") for line in run)
