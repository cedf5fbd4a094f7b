"""``gradcam eval --rank``'s progress on a terminal: one step per image and method, the bar naming the image and the
method at work with the plan's estimate for it, advanced as each method's work begins (not once per image)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer.testing
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import reporting
from gradcam_cli.cli.eval import app

SQUARE_MODEL = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_the_rank_bar_advances_per_image_and_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, corners in enumerate([(8, 8, 28, 28), (30, 30, 50, 50)]):
        square_image((64, 64), corners).save(folder / f"square{i}.png")
    events: list[str] = []
    step, describe = reporting.ProgressBar.__call__, reporting.ProgressBar.describe

    def stepped(self: reporting.ProgressBar, skipped: bool = False) -> None:
        events.append(f"step {self.bar.tasks[0].completed + 1}/{self.total}")
        step(self, skipped)

    def described(self: reporting.ProgressBar, text: str) -> None:
        events.append(re.sub(r" \(~\d+s\)$", " (~Ns)", text))
        describe(self, text)

    monkeypatch.setattr(typer.testing._NamedTextIOWrapper, "isatty", lambda _self: True)
    monkeypatch.setattr(reporting.sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(reporting.ProgressBar, "__call__", stepped)
    monkeypatch.setattr(reporting.ProgressBar, "describe", described)
    args = [str(folder), "--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "1"]
    result = CliRunner().invoke(app, [*args, "--input-size", "32", "--rank", "--method", "gradcam,layercam"])
    assert result.exit_code == 0, result.output
    # randomcam is added as the floor; each method's step is counted as the next one begins, the last at the end;
    # the plan evaluated gradcam and randomcam on image 1 for real (its sample, kept): only layercam is left there,
    # and the image's steps not yet counted are counted as it ends, as for an image resumed with --skip-existing
    assert events == [
        "image 1/2 · layercam (~Ns)",
        "step 1/6",
        "step 2/6",
        "step 3/6",
        "image 2/2 · gradcam (~Ns)",
        "step 4/6",
        "image 2/2 · layercam (~Ns)",
        "step 5/6",
        "image 2/2 · randomcam (~Ns)",
        "step 6/6",
    ]
    assert "image 2/2 · randomcam" in ANSI.sub("", result.stderr)  # drawn on the terminal as it changes


def test_a_detectors_eval_bar_advances_per_image_and_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The box measures of a detector step per (image, method) too, the methods sharing one pass per image."""
    folder = tmp_path / "in"
    folder.mkdir()
    square_image((300, 200), (250, 60, 290, 100)).save(folder / "red.png")
    square_image((300, 200), (20, 60, 60, 100)).save(folder / "left.png")
    (tmp_path / "classes.txt").write_text("__background__\nred\ngreen\nblue\n", encoding="utf-8")
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("image,x1,y1,x2,y2,class\nred.png,250,60,290,100,red\nleft.png,20,60,60,100,red\n")
    events: list[str] = []
    step, describe = reporting.ProgressBar.__call__, reporting.ProgressBar.describe
    monkeypatch.setattr(typer.testing._NamedTextIOWrapper, "isatty", lambda _self: True)
    monkeypatch.setattr(reporting.sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(
        reporting.ProgressBar,
        "__call__",
        lambda self, skipped=False: (
            events.append(f"step {self.bar.tasks[0].completed + 1}/{self.total}") or step(self, skipped)
        ),
    )
    monkeypatch.setattr(
        reporting.ProgressBar, "describe", lambda self, text: events.append(text) or describe(self, text)
    )
    detector = f"{Path(__file__).resolve().parents[1] / 'task_models.py'}:build_detector"
    args = [str(folder), "--model", detector, "--labels", str(tmp_path / "classes.txt"), "--boxes", str(boxes)]
    result = CliRunner().invoke(app, [*args, "--method", "gradcam,eigencam", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["methods"]["eigencam"]["pointing"]["overall"]["count"] == 2
    assert events == [
        "image 1/2 · gradcam",
        "step 1/4",
        "image 1/2 · eigencam",
        "step 2/4",
        "image 2/2 · gradcam",
        "step 3/4",
        "image 2/2 · eigencam",
        "step 4/4",
    ]
