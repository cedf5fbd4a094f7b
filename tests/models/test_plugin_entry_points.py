"""Plugins through the command line with real entry points (throwaway distributions on PYTHONPATH,
:mod:`plugin_dists`, beside the installed example plugin): a name the package or another plugin holds, an entry point
naming neither an entry nor a module or named otherwise than its entry, each one ``error:`` line naming the plugin's
distribution and the name, exit code 2, no traceback; methods whose maps are NaN, infinite or of another rank, each
the failure of its input only (``gradcam`` and ``gradcam eval``); and docs/internals.md's task plugin as shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from plugin_dists import ROOT, run_gradcam, write_dist

from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_USAGE
from gradcam_cli.registry import FAMILIES_GROUP, METHODS_GROUP, TASKS_GROUP

pytestmark = pytest.mark.slow  # a subprocess each

GRADCAM_AGAIN = """
from gradcam_cli.cam.methods.registry import CamMethod

GRADCAM = CamMethod("gradcam", lambda activations, gradients, *, eigen_smooth=False: activations.sum(dim=1))
"""
CLASSIFY_AGAIN = """
from gradcam_cli.cam.tasks import TaskAdapter, register_task


class Classify(TaskAdapter):
    name = "classify"


register_task(Classify())
"""
TOY_AGAIN = """
from gradcam_cli.models.families import FAMILIES
from gradcam_example_plugin.family import ToyFamily

FAMILIES.register("toy", ToyFamily())
"""
ODD_TASKS = """
from gradcam_cli.cam.tasks import TaskAdapter


class Count(TaskAdapter):
    name = "tally"


ADAPTER = Count()
NOT_AN_ADAPTER = "count"
"""


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "red.png"
    Image.new("RGB", (48, 32), (255, 0, 0)).save(path)
    return path


def refused(image: Path, plugins: Path) -> str:
    """The one stderr line of ``gradcam IMAGE`` with the toy model and ``plugins`` installed (exit code 2)."""
    done = run_gradcam(image, "--model", "toy:tiny", "--weights", "none", "-o", image.parent / "out", plugins=plugins)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (image.parent / "out").exists() or not any((image.parent / "out").glob("*.png"))
    return done.stderr.strip()


def test_a_method_under_a_built_in_name_is_one_line_naming_the_plugin(image: Path, tmp_path: Path) -> None:
    plugins = write_dist(
        tmp_path / "site",
        "gradcam-again",
        "0.2",
        {METHODS_GROUP: {"gradcam": "again:GRADCAM"}},
        {"again": GRADCAM_AGAIN},
    )
    assert refused(image, plugins) == (
        "error: the method plugin 'gradcam' (gradcam-again 0.2: again:GRADCAM) registers a method named 'gradcam', "
        "but it is one of gradcam-cli's own: rename it there or uninstall it (pip uninstall gradcam-again)"
    )


def test_a_task_module_registering_a_built_in_task_is_one_line(image: Path, tmp_path: Path) -> None:
    plugins = write_dist(
        tmp_path / "site",
        "classify-again",
        "1.0",
        {TASKS_GROUP: {"classify": "classify_again"}},
        {"classify_again": CLASSIFY_AGAIN},
    )
    line = refused(image, plugins)
    assert line.startswith("error: the task plugin 'classify' (classify-again 1.0: classify_again) registers a task")
    assert "named 'classify', but it is one of gradcam-cli's own" in line


def test_a_family_another_plugin_holds_is_one_line_naming_both(image: Path, tmp_path: Path) -> None:
    plugins = write_dist(
        tmp_path / "site", "toy-again", "3.1", {FAMILIES_GROUP: {"zz-toy": "toy_again"}}, {"toy_again": TOY_AGAIN}
    )
    line = refused(image, plugins)
    assert line.startswith("error: the model family plugin 'zz-toy' (toy-again 3.1: toy_again) registers a model")
    assert (
        "but the plugin 'toy' (gradcam-example-plugin 0.1.0: gradcam_example_plugin.family:TOY) registered it first"
        in line
    )


@pytest.mark.parametrize(
    ("point", "value", "expected"),
    [
        ("count", "odd_tasks:NOT_AN_ADAPTER", "names a str, neither a task nor a module"),
        ("count", "odd_tasks:ADAPTER", "names a task called 'tally': an entry point is named as the entry it names"),
    ],
    ids=["not-an-adapter", "misnamed"],
)
def test_a_task_entry_point_naming_no_adapter_or_another_name_is_one_line(
    image: Path, tmp_path: Path, point: str, value: str, expected: str
) -> None:
    plugins = write_dist(
        tmp_path / "site", "odd-tasks", "0.0.1", {TASKS_GROUP: {point: value}}, {"odd_tasks": ODD_TASKS}
    )
    assert refused(image, plugins) == f"error: the task plugin 'count' (odd-tasks 0.0.1: {value}) {expected}"


ODD_MAPS = """
import torch

from gradcam_cli.cam.methods.registry import CamMethod


def nan_on_red(activations, gradients, *, eigen_smooth=False):
    # the positive activations' sum, NaN for a sample whose layer sees mostly red (the toy model's channel 0)
    summed = activations.clamp(min=0).sum(dim=1)
    red = activations[:, 0].flatten(1).mean(dim=1) > 0.5
    return torch.where(red[:, None, None], torch.full_like(summed, float("nan")), summed)


NAN_ON_RED = CamMethod("nan-on-red", nan_on_red, uses_gradients=False)
INFINITE = CamMethod(
    "infinite", lambda activations, gradients, *, eigen_smooth=False: torch.full_like(activations[:, 0], float("inf"))
)
UNSUMMED = CamMethod("unsummed", lambda activations, gradients, *, eigen_smooth=False: (activations * gradients).abs())
"""


@pytest.fixture
def odd_maps(tmp_path: Path) -> Path:
    """A distribution adding three methods: NaN maps for mostly red images, infinite maps, and (N, C, h, w) maps."""
    methods = {"nan-on-red": "odd_maps:NAN_ON_RED", "infinite": "odd_maps:INFINITE", "unsummed": "odd_maps:UNSUMMED"}
    return write_dist(tmp_path / "site", "odd-maps", "0.3", {METHODS_GROUP: methods}, {"odd_maps": ODD_MAPS})


@pytest.fixture
def two_images(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for name, colour in (("red.png", (255, 0, 0)), ("blue.png", (0, 0, 255))):
        Image.new("RGB", (48, 32), colour).save(folder / name)
    return folder


TOY = ("--model", "toy:tiny", "--weights", "none")


def test_a_nan_map_fails_its_image_naming_the_method_and_the_batch_goes_on(
    odd_maps: Path, two_images: Path, tmp_path: Path
) -> None:
    """Both images in one batch: the red one fails (an error row, no overlay or .npy), the blue one is explained."""
    out = tmp_path / "out"
    args = (two_images, *TOY, "--method", "nan-on-red", "-o", out, "--save-raw", "--json", "--batch-size", "2")
    done = run_gradcam(*args, "--manifest", out / "m.jsonl", plugins=odd_maps)
    assert done.returncode == EXIT_IMAGE_FAILED, done.stderr
    rows = {Path(row["input"]).name: row for row in map(json.loads, done.stdout.splitlines())}
    assert (rows["red.png"]["status"], rows["blue.png"]["status"]) == ("error", "ok"), rows
    error = rows["red.png"]["error"]
    assert error.startswith(str(two_images / "red.png"))
    assert error.endswith("--method nan-on-red returned NaN values at layer relu, not a map)")
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [f"error: {error}"]
    assert "Traceback" not in done.stderr
    written = sorted(path.name for path in out.iterdir() if path.suffix in (".png", ".npy"))
    assert written == ["blue_nan-on-red_2-blue.npy", "blue_nan-on-red_2-blue.png"], written
    assert np.isfinite(np.load(out / "blue_nan-on-red_2-blue.npy")).all()
    plugins = {"gradcam-example-plugin": "0.1.0", "odd-maps": "0.3"}  # the installed one and this one, by version
    assert rows["blue.png"]["provenance"]["plugins"] == plugins
    assert json.loads((out / ".gradcam-run.json").read_text(encoding="utf-8"))["plugins"] == plugins


def test_an_unsummed_map_and_an_infinite_one_are_errors_naming_the_method(odd_maps: Path, two_images: Path) -> None:
    red = two_images / "red.png"
    for method, expected in (
        (
            "unsummed",
            r"--method unsummed returned a 1 x 3 x (\d+) x (\d+) tensor at layer relu, not a map of 1 x h x w\)$",
        ),
        ("infinite", r"--method infinite returned infinite values at layer relu, not a map\)$"),
    ):
        done = run_gradcam(red, *TOY, "--method", method, "-o", two_images.parent / method, plugins=odd_maps)
        assert done.returncode == EXIT_IMAGE_FAILED, done.stderr
        (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert line.startswith(f"error: {red}: ") and re.search(expected, line), line
        assert not any((two_images.parent / method).glob("*.png"))


def test_gradcam_eval_reports_no_figures_for_a_nan_map(odd_maps: Path, two_images: Path) -> None:
    done = run_gradcam("eval", two_images, *TOY, "--method", "nan-on-red", "--steps", "4", "--json", plugins=odd_maps)
    assert done.returncode == EXIT_IMAGE_FAILED, done.stderr
    report = json.loads(done.stdout)
    assert [Path(image["image"]).name for image in report["per_image"]] == ["blue.png"]
    ((failed),) = report["failed"]
    assert Path(failed["image"]).name == "red.png"
    assert failed["error"].endswith("--method nan-on-red returned NaN values at layer relu, not a map)")
    assert report["per_image"][0]["methods"]["nan-on-red"]["deletion_auc"] is not None


REGRESSOR = """
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
"""


def test_the_docs_task_plugin_runs_as_shown(image: Path, tmp_path: Path) -> None:
    """docs/internals.md's whole task plugin (its module and its entry point, as the page shows them) installed as
    a distribution: ``--task regress`` explains each output of a regression model, its rows carrying the value."""
    from gradcam_cli.io.images import load_image, to_input_tensor
    from gradcam_cli.models.loading import load_model

    page = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
    source = re.search(r"```python\n# my_plugin/regress\.py\n(.*?)```", page, re.S)
    point = re.search(r'```toml\n\[project\.entry-points\."gradcam_cli\.tasks"\]\n(\S+) = "(\S+)"\n```', page)
    assert source is not None and point is not None
    site = write_dist(tmp_path / "site", "my-plugin", "1.0", {TASKS_GROUP: {point[1]: point[2]}}, {})
    (site / "my_plugin").mkdir()
    (site / "my_plugin" / "__init__.py").write_text("", encoding="utf-8")
    (site / "my_plugin" / "regress.py").write_text(source[1], encoding="utf-8")
    (tmp_path / "my_model.py").write_text(REGRESSOR, encoding="utf-8")
    (tmp_path / "outputs.txt").write_text("speed\nheight\n", encoding="utf-8")
    model, out = f"{tmp_path / 'my_model.py'}:build", tmp_path / "out"
    args = ("--model", model, "--task", "regress", "--labels", tmp_path / "outputs.txt", "--top-k", "2")
    done = run_gradcam(image, *args, "-o", out, "--json", "--save-raw", plugins=site)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    loaded = load_model(model, "DEFAULT", labels=tmp_path / "outputs.txt")
    with torch.no_grad():
        values = loaded.module(to_input_tensor(load_image(image), loaded.input_spec).unsqueeze(0))[0]
    by_value = sorted(range(2), key=lambda c: -float(values[c]))  # the top --top-k outputs, largest first
    assert [row["target"]["name"] for row in rows] == [["speed", "height"][c] for c in by_value]
    for row, c in zip(rows, by_value, strict=True):
        assert row["status"] == "ok" and row["provenance"]["task"] == "regress"
        assert row["target"]["value"] == pytest.approx(float(values[c]), abs=1e-3)
        saliency = np.load(next(path for path in row["outputs"] if path.endswith(".npy")))
        assert saliency.shape == (32, 48) and np.isfinite(saliency).all()
    assert row["provenance"]["plugins"]["my-plugin"] == "1.0"
