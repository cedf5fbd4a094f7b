"""File names that are not UTF-8 (``bad\\xff.png``) and names with control characters, through every writer of
names on the command line: the console, the --report gallery, panels, the JSON and CSV manifests, --json, and
``gradcam diff --report``. Pages show the name escaped (``bad\\xff.png``) and link its own bytes (``bad%FF.png``);
machine-readable outputs keep the name itself."""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from pathlib import Path

import pytest
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.errors import EXIT_IMAGE_FAILED

SQUARE = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"


def run(*args: str | Path, command: object = app) -> object:
    return CliRunner().invoke(command, [str(a) for a in args])


def _inputs(tmp_path: Path) -> Path:
    """``in/`` with ``bad\\xff.png`` (an image), ``worse\\xfe.png`` (not one) and ``ok.png``."""
    folder = tmp_path / "in"
    folder.mkdir()
    with open(os.fsencode(folder) + b"/bad\xff.png", "wb") as file:
        square_image((64, 48), (10, 10, 30, 30)).save(file, format="PNG")
    with open(os.fsencode(folder) + b"/worse\xfe.png", "wb") as file:
        file.write(b"not an image")
    square_image((64, 48), (10, 10, 30, 30), "green").save(folder / "ok.png")
    return folder


def test_a_name_that_is_not_utf8_goes_through_every_writer_of_a_run(tmp_path):
    folder = _inputs(tmp_path)
    bad = os.fsdecode(os.fsencode(folder) + b"/bad\xff.png")
    out = tmp_path / "out"
    result = run(folder, "-m", SQUARE, "-o", out, "--workers", "0", "--report", "--panel", "--json",
                 "--manifest", out / "m.csv")  # fmt: skip
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output  # worse\xfe.png is not an image
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert "error: " in result.stderr and "worse\\xfe.png" in result.stderr
    assert sorted(json.loads(line)["input"] for line in result.stdout.splitlines()) == sorted(
        [bad, str(folder / "ok.png"), os.fsdecode(os.fsencode(folder) + b"/worse\xfe.png")]
    )
    assert os.path.exists(os.fsencode(out) + b"/bad\xff_panel.png")  # the panel's title escapes the name
    # the CSV manifest keeps the name's bytes
    rows = list(csv.DictReader(io.StringIO((out / "m.csv").read_bytes().decode("utf-8", "surrogateescape"))))
    assert bad in {row["input"] for row in rows}
    written = next(json.loads(row["outputs"]) for row in rows if row["input"] == bad)
    assert all(os.path.exists(path) for path in written)
    # the gallery: valid UTF-8, the name shown escaped and linked by its bytes, the failure listed
    page = (out / "index.html").read_bytes().decode("utf-8")
    assert "bad\\\\xff.png" in page and "bad%FF.png" in page  # in the page's JSON data
    assert "worse\\xfe.png</a>" in page and "worse%FE.png" in page  # the static list of failures

    again = tmp_path / "again"
    result = run(folder, "-m", SQUARE, "-o", again, "--workers", "0", "--method", "layercam",
                 "--manifest", again / "m.jsonl", "-q")  # fmt: skip
    assert result.exit_code == EXIT_IMAGE_FAILED
    assert bad in {json.loads(line)["input"] for line in (again / "m.jsonl").read_text().splitlines()}

    report = tmp_path / "report"
    result = run(out / "m.csv", again / "m.jsonl", "--report", report, command=diff_app)
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output  # other methods: drift, reported
    assert "Traceback" not in result.output and "bad\\xff.png" in result.stdout
    page = (report / "index.html").read_bytes().decode("utf-8")
    assert "bad\\xff.png" in page and "\udcff" not in page


def test_names_the_font_cannot_draw_warn_nothing_on_stderr(tmp_path):
    """CJK class names and control characters in names: the panel draws them (as boxes, or escaped) without
    matplotlib's "Glyph missing" warnings, also where every warning is shown."""
    folder = tmp_path / "in"
    folder.mkdir()
    square_image((64, 48), (10, 10, 30, 30)).save(folder / "猫\x01.png")
    labels = tmp_path / "labels.txt"
    labels.write_text("猫\n\x02犬\n鳥\n", encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run(folder, "-m", SQUARE, "--labels", labels, "-o", tmp_path / "out", "--workers", "0", "--panel",
                     "--top-k", "2", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert [str(w.message) for w in caught if "Glyph" in str(w.message)] == []
    assert (tmp_path / "out" / "猫\x01_panel.png").stat().st_size > 0


def test_eval_rank_report_shows_a_name_that_is_not_utf8(tmp_path):
    from gradcam_cli.cli.eval import app as eval_app

    folder = _inputs(tmp_path)
    os.unlink(os.fsencode(folder) + b"/worse\xfe.png")
    args = [folder, "-m", SQUARE, "--rank", "--method", "gradcam,layercam", "--report", tmp_path / "rank"]
    result = run(*args, "--steps", "4", "--input-size", "32", command=eval_app)
    assert result.exit_code == 0, result.output
    page = (tmp_path / "rank" / "index.html").read_bytes().decode("utf-8")
    assert "bad\\xff.png" in page


@pytest.mark.slow  # a process of its own
def test_a_video_whose_name_is_not_utf8_is_explained(tmp_path):
    """OpenCV takes UTF-8 names only (it crashed the process on ``clip\\xff.mp4``): the clip is opened through a
    plainly named link and written under a plain temporary name, then renamed to its own. A process of its own, so
    that a crash fails this test only."""
    import subprocess
    import sys

    import cv2
    import numpy as np
    from conftest import ROOT

    plain = tmp_path / "plain.mp4"
    writer = cv2.VideoWriter(str(plain), cv2.VideoWriter_fourcc(*"mp4v"), 5, (64, 48))
    for _ in range(4):
        frame = np.full((48, 64, 3), 128, np.uint8)
        frame[10:30, 10:30] = (20, 20, 230)  # BGR: red
        writer.write(frame)
    writer.release()
    clip = os.fsencode(tmp_path) + b"/cl\xffip.mp4"
    os.replace(plain, clip)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "gradcam_cli", os.fsdecode(clip), "-m", SQUARE, "-o", str(out), "--workers", "0"]
    done = subprocess.run([*command, "--report"], capture_output=True, env=env, timeout=600)  # a hang guard only
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert os.listdir(os.fsencode(out / "_thumbs"))
    assert b"cl\xffip_gradcam_top1.mp4" in os.listdir(os.fsencode(out))
    assert b"cl\\xffip_gradcam_top1.mp4" in done.stdout  # the console escapes the name
