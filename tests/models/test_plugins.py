"""Plugins: the example plugin package (tests/plugins/example_plugin, installed into the test environment by
``make install``) adds the ``toy:`` model family through the ``gradcam_cli.families`` entry point, used here from
the command line, ``gradcam eval`` and an in-process ``gradcam serve`` app; a family registered in a notebook is
claimed as the package's own are."""

from __future__ import annotations

import io
import json
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
from gradcam_cli.models.tasks import Task
from gradcam_cli.options import ModelOptions
from gradcam_cli.registry import FAMILIES_GROUP, METHODS_GROUP, TASKS_GROUP

PLUGIN = Path(__file__).parents[1].joinpath("plugins") / "example_plugin"
INSTALL = f"pip install -e {PLUGIN.relative_to(Path(__file__).parents[2])} (make install does)"
RED_SQUARE = (8, 8, 40, 40)  # x1, y1, x2, y2 in the 96 x 64 image


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


def test_the_plugin_declares_one_entry_point_of_each_group() -> None:
    assert plugin_points() == {FAMILIES_GROUP: ["toy"], METHODS_GROUP: ["toy-saliency"], TASKS_GROUP: ["toy"]}


def test_the_toy_family_is_registered_from_its_entry_point_and_claims_its_prefix() -> None:
    assert "toy" in FAMILIES and FAMILIES.names()[-1] == "toy"  # after the package's own
    assert family_of("toy:tiny").name == "toy"
    assert family_of("tests/square_model.py:build").name == "custom"  # the catch-alls are asked after it
    loaded = load_model("toy:tiny", "none")
    assert (loaded.categories, loaded.task.value, loaded.input_spec.size) == (["red", "green", "blue"], "classify", 64)
    with pytest.raises(UsageError, match=r"unknown toy model 'tiy'\. Did you mean: tiny\?"):
        load_model("toy:tiy", "none")


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
        profile = ModelProfile(InputSpec(size=32), None, chosen_task(options, Task.CLASSIFY))
        return LoadedModel(module, options.model, options.weights, profile=profile)


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
    seen: list[torch.Tensor] = []
    handle = model.module.get_submodule("features").register_forward_hook(lambda _m, _i, output: seen.append(output))
    try:
        logits = model.module(inputs)
    finally:
        handle.remove()
    (gradients,) = torch.autograd.grad(logits[:, 0].sum(), seen[0])
    assert torch.allclose(coarse, (gradients * seen[0]).abs().sum(dim=1), atol=1e-6)
