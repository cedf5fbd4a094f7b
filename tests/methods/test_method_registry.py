"""The method registry as an extension point: a method registered from outside the package (a notebook's
``register_method``, a plugin's entry point) is taken by the library, by the command line (in-process, on the
path users run) and by ``gradcam serve``'s app, and its map is its formula; each method's extra input is typed."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from cam_reference import pearson
from PIL import Image
from square_model import build
from starlette.testclient import TestClient
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import BUILTIN_METHODS, METHODS, CamMethod, register_method
from gradcam_cli.cam.methods.needs import FINER_GRADIENT, HESSIAN_PRODUCT, SEED
from gradcam_cli.cam.methods.registry import register_method_plugin
from gradcam_cli.cli.explain import app
from gradcam_cli.errors import EXIT_OK, UsageError
from gradcam_cli.io.images import InputSpec, to_input_tensor
from gradcam_cli.options import METHOD_NAMES
from gradcam_cli.registry import METHODS_GROUP, Registry

pytestmark = pytest.mark.quick
SIZE = 32


def energy(
    activations: torch.Tensor, gradients: torch.Tensor | None = None, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """A toy method: L = sum_k (A^k)^2."""
    return (activations**2).sum(dim=1)


TOY = CamMethod("toy-energy", energy, uses_gradients=False, class_agnostic=True)
"""Named by the entry point of :func:`test_an_entry_point_naming_a_method_object_registers_it`."""


@pytest.fixture
def toy():
    register_method(TOY)
    yield TOY
    METHODS.unregister(TOY.name)


def reference(image: Image.Image, spec: InputSpec) -> torch.Tensor:
    """The toy formula on the detector's ``features`` output, from a forward hook, min-max normalised."""
    model = build().eval()
    kept: list[torch.Tensor] = []
    model.features.register_forward_hook(lambda _m, _i, output: kept.append(output.detach()))
    with torch.no_grad():
        model(to_input_tensor(image, spec).unsqueeze(0))
    saliency = (kept[0] ** 2).sum(dim=1)[0]
    return (saliency - saliency.min()) / (saliency.max() - saliency.min())


def test_the_registry_holds_the_builtin_methods_in_order_with_typed_needs() -> None:
    assert tuple(method.name for method in BUILTIN_METHODS) == METHOD_NAMES
    assert [name for name in METHODS if name in METHOD_NAMES] == list(METHOD_NAMES)
    assert {name for name in METHOD_NAMES if METHODS[name].keeps_graph} == {
        "finercam",
        "shapleycam",
        "attn-grad",
        "legrad",
    }
    assert METHODS["finercam"].needs is FINER_GRADIENT and METHODS["shapleycam"].needs is HESSIAN_PRODUCT
    assert METHODS["randomcam"].needs is SEED and METHODS["gradcam"].needs is None
    assert {name for name in METHOD_NAMES if METHODS[name].shows_progress} == {
        "scorecam",
        "ablationcam",
        "rise",
        "drise",
        "occlusion",
    }


def noise_image() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_a_notebooks_method_works_in_the_library_the_command_line_and_serve(toy, tmp_path: Path) -> None:
    image = noise_image()
    image.save(tmp_path / "square.png")
    factory = Path(__file__).parents[1] / "square_model.py"
    result = CliRunner().invoke(
        app,
        [str(tmp_path / "square.png"), "-m", f"{factory}:build", "--weights", "none", "--input-size", str(SIZE),
         "--layer", "features", "--method", "gradcam,toy-energy", "--save-raw", "--json", "-o", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    (row,) = [row for row in rows if row["method"] == "toy-energy"]
    ours = np.load(next(path for path in row["outputs"] if path.endswith(".npy")))
    assert ours.shape == (SIZE, SIZE)
    assert pearson(ours, reference(image, InputSpec(size=SIZE))) >= 0.999

    from square_model import CLASSES

    from gradcam_cli.models.loading import LoadedModel
    from gradcam_cli.serve import ModelService, create_app

    model = LoadedModel(build(), "colour-detector", "none", list(CLASSES), InputSpec(mean=(0, 0, 0), std=(1, 1, 1)))
    explained = Explainer(model, "features", ["toy-energy"]).explain(image)
    spec = InputSpec(size=SIZE, mean=(0, 0, 0), std=(1, 1, 1))
    assert pearson(explained.explanations[0].saliency.numpy(), reference(image, spec)) >= 0.999
    with TestClient(create_app(ModelService(model), work_dir=tmp_path / "work"), base_url="http://127.0.0.1") as client:
        assert "toy-energy" in client.get("/api/info").json()["model"]["methods"]


def test_an_unknown_method_is_refused_with_the_registrys_names(toy, tmp_path: Path) -> None:
    noise_image().save(tmp_path / "square.png")
    result = CliRunner().invoke(app, [str(tmp_path / "square.png"), "--method", "toy-enrgy"])
    assert result.exit_code == 2 and "toy-energy" in result.stderr


def test_an_entry_point_naming_a_method_object_registers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    point = metadata.EntryPoint("toy-energy", "test_method_registry:TOY", METHODS_GROUP)
    monkeypatch.setattr("gradcam_cli.registry.plugin_entry_points", lambda group: [point])
    try:
        Registry("method", METHODS_GROUP, register_method_plugin).load_plugins()
        assert METHODS["toy-energy"] is TOY
    finally:
        METHODS.unregister("toy-energy")
    with pytest.raises(UsageError, match="name them alike"):
        register_method_plugin("other-name", TOY)
