"""A plugin's mistakes, through the command line with real entry points (throwaway distributions on PYTHONPATH,
:mod:`plugin_dists`, beside the installed example plugin): a name the package or another plugin holds, an entry point
naming neither an entry nor a module or named otherwise than its entry, each one ``error:`` line naming the plugin's
distribution and the name, exit code 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from plugin_dists import run_gradcam, write_dist

from gradcam_cli.errors import EXIT_USAGE
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
