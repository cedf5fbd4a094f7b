"""Shared fixtures: the shipped sample photos, the pretrained EfficientNet-Lite0, the colour-square model."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DIR = ROOT / "sample_images"
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Boxes (x1, y1, x2, y2) around the main object of each sample photo, in original pixel coordinates.
# chelsea.jpg (451 x 300): the cat's face fills the frame and everything inside this box is cat (eyes at x 135-210
# and 295-345, nose near (265, 240)). Her right cheek's edge runs from x = 360 (y = 170) to x = 325 (y = 270);
# beyond it, and in the top-left corner, lies the blurred room.
OBJECT_BOXES = {
    "chelsea.jpg": (60, 30, 320, 290),
}


QUICK = "quick and not slow"
"""``make test-quick``'s marker expression: the tests marked ``quick`` (a few light ones in every folder of tests/),
less their ``slow`` cases."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under :data:`QUICK`, a test module that marks no test quick is not even imported: collecting them all would
    take a good part of the quick run's minute (torch, transformers, Ray, Ultralytics...)."""
    module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if config.getoption("markexpr") != QUICK or not module:
        return None
    return True if "pytest.mark.quick" not in collection_path.read_text("utf-8") else None


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE_DIR


@pytest.fixture(scope="session")
def lite0():
    """The ImageNet-pretrained EfficientNet-Lite0 (installed from PyPI, no network needed)."""
    from gradcam_cli import load_model

    return load_model("efficientnet_lite0")


@pytest.fixture
def square_model():
    """The hand-built colour detector wrapped as a LoadedModel (no normalisation, classes red/green/blue)."""
    from square_model import CLASSES, build

    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.loading import LoadedModel

    return LoadedModel(build(), "colour-detector", "none", list(CLASSES), InputSpec(mean=(0, 0, 0), std=(1, 1, 1)))


@pytest.fixture
def small_square_model():
    """The colour-square model at the size of 32 x 24 images (shorter side 24, no normalisation): the light tests
    of ARCC and the randomisation metrics."""
    from square_model import CLASSES, build

    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.loading import LoadedModel

    spec = InputSpec(size=24, mean=(0, 0, 0), std=(1, 1, 1))
    return LoadedModel(build(), "colour-detector", "none", list(CLASSES), spec)


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random LLaVA of tests/vlm_models.py, saved once per test module (its folder)."""
    pytest.importorskip("transformers")
    import vlm_models

    return vlm_models.llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread while the module runs, the count restored after: for modules of many small passes, where
    on busy cores OpenMP's spin-waiting threads cost more than they bring (tests/methods/test_references.py)."""
    from threads import one_thread

    with one_thread():
        yield


@pytest.fixture
def restore_determinism():
    """For tests that run with --deterministic, which switches PyTorch's deterministic algorithms on for the process."""
    yield
    import torch

    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def split_options(**options):
    """Keyword options of the old flat form, as (OutputOptions, RunOptions): tests name only what they change."""
    from dataclasses import fields

    from gradcam_cli.options import OutputOptions, RunOptions

    output_fields = {f.name for f in fields(OutputOptions)}
    output = OutputOptions(**{k: v for k, v in options.items() if k in output_fields})
    run = RunOptions(**{k: v for k, v in options.items() if k not in output_fields})
    return output, run


def comparable(manifest: Path, out: Path) -> list[dict]:
    """A manifest's rows without their timings, outputs relative to their output folder."""
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    for row in rows:
        row["seconds"] = None
        row["outputs"] = [os.path.relpath(path, out) for path in row["outputs"]]
    return rows


RAY_MAP_TOLERANCE, RAY_OVERLAY_LEVELS = 2e-6, 3
"""How far a Ray run's maps and overlays may be from a local run's: float rounding, as with another batching or
thread count (docs/scale.md, The Ray engine)."""


def assert_outputs_agree(got: Path, expected: Path, count: int) -> None:
    """The ``.npy`` maps (``count`` of them) of two output folders, and their PNG overlays, agree to float rounding
    (``RAY_MAP_TOLERANCE``, ``RAY_OVERLAY_LEVELS``)."""
    import numpy as np
    from PIL import Image

    maps = sorted(path.relative_to(expected) for path in expected.rglob("*.npy"))
    assert maps == sorted(path.relative_to(got) for path in got.rglob("*.npy")) and len(maps) == count
    for name in maps:
        np.testing.assert_allclose(np.load(got / name), np.load(expected / name), rtol=0, atol=RAY_MAP_TOLERANCE)
        overlays = [np.asarray(Image.open(folder / name.with_suffix(".png")), np.int16) for folder in (got, expected)]
        assert np.abs(overlays[0] - overlays[1]).max() <= RAY_OVERLAY_LEVELS, name


def assert_rows_agree(got: list[dict], expected: list[dict], skipped: bool = False) -> None:
    """Comparable rows (:func:`comparable`) of two runs that agree to float rounding: the same fields, but the
    probabilities within 1e-5 and each fingerprint cell within one level. ``skipped``: ``got`` may have ``skipped``
    rows where ``expected`` has ``ok`` ones."""
    assert [row["input"] for row in got] == [row["input"] for row in expected]
    for mine, theirs in zip(got, expected, strict=True):
        mine, theirs = dict(mine), dict(theirs)
        if skipped and (mine["status"], theirs["status"]) == ("skipped", "ok"):
            mine["status"] = "ok"
        ours, local = [*mine.pop("predictions"), mine.pop("target")], [*theirs.pop("predictions"), theirs.pop("target")]
        assert [p and (p["index"], p["name"]) for p in ours] == [p and (p["index"], p["name"]) for p in local], mine
        for p, q in zip(ours, local, strict=True):
            assert p is None or abs(p["probability"] - q["probability"]) <= 1e-5, (mine["input"], p, q)
        cells = [mine.pop("fingerprint"), theirs.pop("fingerprint")]
        if None in cells:
            assert cells[0] == cells[1], mine["input"]
        else:
            assert cells[0]["size"] == cells[1]["size"], mine["input"]
            grids = [bytes.fromhex("".join(cell["grid"])) for cell in cells]
            assert max(abs(a - b) for a, b in zip(*grids, strict=True)) <= 1, mine["input"]
        assert mine == theirs


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny YOLO of tests/yolo_model.py trained on coloured squares (single-threaded: seeded and fast on busy
    cores), as a .pt file (tests/models/test_yolo.py, tests/pipeline/test_ray_engine.py)."""
    from yolo_model import trained_checkpoint

    return trained_checkpoint(tmp_path_factory.mktemp("yolo") / "squares.pt")


@pytest.fixture(scope="session")
def squares_detr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Conditional DETR of tests/detr_trained.py trained on coloured squares (single-threaded, seeded), as
    a Hugging Face folder for ``--model hf:DIR`` (tests/models/test_detr_known.py)."""
    from detr_trained import save_trained

    return save_trained(tmp_path_factory.mktemp("squares_detr") / "squares_detr")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Headless Chromium's path; the test is skipped where it is not installed (tests/headless_browser.py)."""
    from headless_browser import find_chromium

    return find_chromium()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Playwright driving headless Chromium (tests/headless_browser.py); skipped where either is missing."""
    from headless_browser import playwright_chromium

    yield from playwright_chromium()
