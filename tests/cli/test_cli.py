"""The ``gradcam`` command: exit codes, one-line errors, outputs, --json, --save-raw, --top-k, --list-layers.

Most cases run in-process through typer's CliRunner (fast); a few run real subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_MODEL, EXIT_OK, EXIT_USAGE
from gradcam_cli.io.naming import RUN_RECORD_NAME
from gradcam_cli.render.colour import blend, colormap_table

SQUARE = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
JSON_KEYS = {"input", "model", "layer", "method", "predictions", "target", "outputs"}


def run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def json_rows(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def images(tmp_path) -> Path:
    """Two photos of different shapes with a red square, and a labels file for the colour detector."""
    folder = tmp_path / "in"
    folder.mkdir()
    square_image(size=(480, 320), box=(330, 40, 390, 100)).save(folder / "wide.png")
    square_image(size=(200, 260), box=(20, 180, 60, 220)).save(folder / "tall.png")
    (tmp_path / "colours.txt").write_text("red\ngreen\nblue\n", encoding="utf-8")
    return folder


@pytest.fixture
def labels(images) -> Path:
    return images.parent / "colours.txt"


def square_args(labels: Path, out: Path, *more: str | Path) -> list[str | Path]:
    return ["-m", SQUARE, "--labels", labels, "-o", out, "--workers", "0", *more]


# --- success ----------------------------------------------------------------------------------------------------


def test_one_image_prints_predictions_and_the_path_written(images, labels, tmp_path):
    out = tmp_path / "out"
    result = run(images / "wide.png", *square_args(labels, out))
    assert result.exit_code == EXIT_OK, result.output
    assert stderr_lines(result) == ["using layer features (last spatial layer; choose with --layer)"]
    written = [p for p in out.iterdir() if p.name != RUN_RECORD_NAME]  # the run record is the only extra
    assert len(written) == 1 and written[0].suffix == ".png"
    assert str(written[0]) in result.stdout
    for name in ("red", "green", "blue"):
        assert f" {name} " in result.stdout  # the predictions with class names
    assert "%" in result.stdout
    assert Image.open(written[0]).size == (480, 320)  # original resolution


def test_json_lines_one_per_image_and_target(tmp_path, images):
    result = run(images, "-m", "resnet18", "--weights", "none", "--input-size", "64", "--layer", "layer4",
                 "--top-k", "2", "--json", "-o", tmp_path / "out", "--workers", "0")  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    rows = json_rows(result)  # stdout holds nothing but JSON lines
    assert len(rows) == 2 * 2
    assert {Path(r["input"]).name for r in rows} == {"wide.png", "tall.png"}
    for row in rows:
        assert row.keys() >= JSON_KEYS
        assert row["model"] == "resnet18" and row["layer"] == "layer4" and row["method"] == "gradcam"
        predictions = row["predictions"]
        assert len(predictions) == 5
        assert all(p.keys() == {"index", "name", "probability"} for p in predictions)
        probabilities = [p["probability"] for p in predictions]
        assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1 + 1e-6
        assert row["target"] in predictions[:2]
        assert all(Path(path).exists() for path in row["outputs"])
    for image in ("wide.png", "tall.png"):
        targets = [r["target"]["index"] for r in rows if r["input"].endswith(image)]
        top2 = [p["index"] for p in next(r for r in rows if r["input"].endswith(image))["predictions"][:2]]
        assert targets == top2


@pytest.mark.quick
def test_save_raw_is_the_map_drawn_in_the_overlay(images, labels, tmp_path):
    out = tmp_path / "out"
    result = run(images / "wide.png", *square_args(labels, out, "--save-raw", "-t", "red", "--json"))
    assert result.exit_code == EXIT_OK, result.output
    (row,) = json_rows(result)
    overlay_path, raw_path = map(Path, row["outputs"])
    assert raw_path == overlay_path.with_suffix(".npy")
    saliency = np.load(raw_path)
    assert saliency.dtype == np.float32 and saliency.shape == (320, 480)
    assert saliency.min() >= 0 and saliency.max() == pytest.approx(1.0)
    pixels = torch.from_numpy(np.asarray(Image.open(images / "wide.png").convert("RGB")).copy())
    expected = blend(pixels, torch.from_numpy(saliency), colormap_table("jet"), 0.5).numpy()
    assert np.array_equal(np.asarray(Image.open(overlay_path)), expected)


@pytest.mark.quick
def test_top_k_writes_one_distinct_overlay_per_class(images, labels, tmp_path):
    out = tmp_path / "out"
    result = run(images / "wide.png", *square_args(labels, out, "--top-k", "3", "--json"))
    assert result.exit_code == EXIT_OK, result.output
    rows = json_rows(result)
    assert [r["target"]["index"] for r in rows] == [p["index"] for p in rows[0]["predictions"][:3]]
    overlays = sorted(out.glob("wide_gradcam_*.png"))
    assert len(overlays) == 3
    assert {o.name.split("_")[-1] for o in overlays} == {"0-red.png", "1-green.png", "2-blue.png"}
    contents = {np.asarray(Image.open(o)).tobytes() for o in overlays}
    assert len(contents) == 3


@pytest.mark.quick
def test_target_class_by_name(images, labels, tmp_path):
    out = tmp_path / "out"
    result = run(
        images / "wide.png", *square_args(labels, out, "--target-class", "RED", "--json", "--layer", "features")
    )
    assert result.exit_code == EXIT_OK, result.output
    (row,) = json_rows(result)
    assert row["target"]["index"] == 0 and row["target"]["name"] == "red"
    assert Path(row["outputs"][0]).name == "wide_gradcam_0-red.png"


def test_list_layers_shows_every_module_shape_default_and_repeats(tmp_path):
    import torchvision

    result = run("-m", "resnet18", "--weights", "none", "--list-layers")
    assert result.exit_code == EXIT_OK, result.output
    table = result.stdout.split("\n\n")[0]  # the legend follows a blank line
    rows = {line[2:].split()[0]: line for line in table.splitlines()}  # "M name type shape [xN]"
    names = {name for name, _ in torchvision.models.resnet18().named_modules() if name}
    assert names <= rows.keys()
    shape = re.compile(r"\s1x\d+(x\d+)*\s")  # every module ran, so every line has its output shape
    assert all(shape.search(rows[name] + " ") for name in names), [rows[n] for n in names if not shape.search(rows[n])]
    assert [name for name, line in rows.items() if line.startswith("*")] == ["layer4"]
    assert "1x512x7x7" in rows["layer4"]
    assert rows["layer4.1.relu"].rstrip().endswith("x2")  # runs twice per forward
    assert not rows["layer4.1.conv1"].rstrip().endswith("x2")
    assert rows["avgpool"].startswith(" ")  # a 1x1 output is no candidate
    assert "1x1000" in rows["fc"]


# --- exit codes and one-line errors -------------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    ("case", "code", "expected"),
    [
        ("bad path", EXIT_USAGE, "nothere.png: no such file or directory"),
        ("unknown layer", EXIT_USAGE, "unknown layer 'featurs'. Did you mean: features"),
        ("unknown model", EXIT_USAGE, "unknown model 'resnt18'. Did you mean: resnet18"),
        ("unknown class", EXIT_USAGE, "unknown class 'rde'. Did you mean: red"),
        ("bad weights name", EXIT_USAGE, "unknown weights 'IMAGENET1K_V3' for resnet18. Did you mean: IMAGENET1K_V1?"),
        ("unreadable image", EXIT_IMAGE_FAILED, "broken.jpg: not an image Pillow can read"),
        ("bad weights file", EXIT_MODEL, "not a plain state dict of tensors"),
        ("bad colormap", EXIT_USAGE, "unknown colormap 'jte'. Did you mean: jet"),
        ("bad colormap, default layer", EXIT_USAGE, "unknown colormap 'jte'. Did you mean: jet"),
    ],
)
def test_each_mistake_gives_one_line_and_its_exit_code(images, labels, tmp_path, case, code, expected):
    out = tmp_path / "out"
    wide = images / "wide.png"
    args = {
        "bad path": [images / "nothere.png", *square_args(labels, out)],
        "unknown layer": [wide, *square_args(labels, out, "--layer", "featurs")],
        "unknown model": [wide, "-m", "resnt18", "-o", out],
        "unknown class": [wide, *square_args(labels, out, "--target-class", "rde")],
        "bad weights name": [wide, "-m", "resnet18", "--weights", "IMAGENET1K_V3", "-o", out],
        "unreadable image": [tmp_path / "broken.jpg", *square_args(labels, out, "-q")],
        "bad weights file": [wide, "-m", "resnet18", "--weights", tmp_path / "bad.pth", "-o", out],
        "bad colormap": [wide, *square_args(labels, out, "--layer", "features", "--colormap", "jte")],
        # found before the model loads, so the default layer is never announced
        "bad colormap, default layer": [wide, *square_args(labels, out, "--colormap", "jte")],
    }[case]
    (tmp_path / "broken.jpg").write_bytes(b"this is not a jpeg")
    torch.save({"weights": torch.zeros(2), "code": Path("x")}, tmp_path / "bad.pth")
    result = run(*args)
    assert result.exit_code == code, result.output
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.quick
def test_some_images_failing_gives_exit_1_and_the_rest_are_written(images, labels, tmp_path):
    (images / "broken.png").write_bytes(b"\x89PNG but no more")
    out = tmp_path / "out"
    result = run(images, *square_args(labels, out, "--layer", "features"))
    assert result.exit_code == EXIT_IMAGE_FAILED
    errors = [line for line in stderr_lines(result) if line.startswith("error:")]
    assert len(errors) == 1 and "broken.png" in errors[0]
    assert sorted(p.name.split("_")[0] for p in out.glob("*.png")) == ["tall", "wide"]
    assert "done: 2 ok, 1 failed" in result.stderr


def test_a_fifo_is_one_failed_input_named_or_in_a_folder_and_never_read(images, labels, tmp_path):
    """Named on the command line as inside a folder: one error line, exit 1, the others explained; nothing opens it
    (opening a FIFO for reading blocks until a writer comes), also in ``gradcam eval``."""
    os.mkfifo(images / "pipe.png")
    os.mkfifo(tmp_path / "named.png")
    out = tmp_path / "out"
    result = run(tmp_path / "named.png", images, *square_args(labels, out))
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    errors = sorted(line for line in stderr_lines(result) if line.startswith("error:"))
    assert errors == [
        f"error: {images / 'pipe.png'}: not a regular file",
        f"error: {tmp_path / 'named.png'}: not a regular file",
    ]
    assert sorted(p.name.split("_")[0] for p in out.glob("*.png")) == ["tall", "wide"]

    done: list[object] = []
    args = [tmp_path / "named.png", images / "wide.png", "-m", SQUARE, "--labels", labels, "--steps", "4"]
    invoke = CliRunner().invoke
    worker = threading.Thread(target=lambda: done.append(invoke(eval_app, list(map(str, args)))), daemon=True)
    worker.start()
    worker.join(timeout=300)  # a hang guard only
    assert done, "gradcam eval blocked reading the FIFO"
    assert done[0].exit_code == EXIT_IMAGE_FAILED, done[0].output
    assert f"error: {tmp_path / 'named.png'}: not a regular file" in done[0].stderr


def test_missing_weights_offline_is_exit_3_with_one_line(images, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def no_network(*_args, **_kwargs):
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    result = run(images / "wide.png", "-m", "resnet18", "-o", tmp_path / "out")
    assert result.exit_code == EXIT_MODEL
    *announced, line = stderr_lines(result)
    assert all(other.startswith("Downloading: ") for other in announced)  # torch.hub's own line, on stderr
    assert line.startswith("error: could not download") and "\n" not in line
    assert "resnet18-f37072fd.pth" in line and "--weights none" in line
    assert result.stdout == ""  # stdout stays clean for --json


def test_cuda_without_cuda_is_a_one_line_usage_error(images, labels, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = run(images / "wide.png", *square_args(labels, tmp_path / "out", "--device", "cuda"))
    assert result.exit_code == EXIT_USAGE
    assert stderr_lines(result) == [
        "error: --device cuda was asked for, but no CUDA GPU is available; use --device cpu"
    ]
    result = run(images / "wide.png", *square_args(labels, tmp_path / "out3", "--device", "cuda:3"))
    assert result.exit_code == EXIT_USAGE  # the device as given (issue 41, item 17)
    assert stderr_lines(result) == [
        "error: --device cuda:3 was asked for, but no CUDA GPU is available; use --device cpu"
    ]


@pytest.mark.quick
def test_outputs_are_never_written_over_an_input(images, labels):
    """With -o pointing at the inputs' folder, one input's overlay name is another input's name: refused."""
    victim = images / "wide_gradcam_0-red.png"
    square_image(size=(64, 48), box=(10, 10, 20, 20)).save(victim)
    before = victim.read_bytes()
    result = run(images / "wide.png", victim, *square_args(labels, images, "-t", "red", "--layer", "features"))
    assert result.exit_code == EXIT_IMAGE_FAILED
    assert victim.read_bytes() == before
    assert "refusing to overwrite input file" in result.stderr
    assert (images / "wide_gradcam_0-red_gradcam_0-red.png").exists()  # the other input was still explained


# --- stdout: results only, one line each ---------------------------------------------------------------------------

NOISY_MODEL = """
import sys
sys.path.insert(0, {tests!r})
from square_model import ColourDetector
print("noisy: imported")

class Noisy(ColourDetector):
    def forward(self, x):
        print("noisy: forward")
        return super().forward(x)

def build():
    print("Loaded pretrained weights for noisy")
    sys.stdout.write("noisy: written\\n")
    return Noisy()
"""


def test_whatever_a_model_prints_goes_to_stderr_and_json_stays_clean(images, labels, tmp_path):
    factory = tmp_path / "noisy.py"
    factory.write_text(NOISY_MODEL.format(tests=str(Path(__file__).parents[1])), encoding="utf-8")
    out = tmp_path / "out"
    for extra in (["--json"], ["--json", "--list-layers"]):
        result = run(images, "-m", f"{factory}:build", "--labels", labels, "-o", out, "--workers", "0", *extra)
        assert result.exit_code == EXIT_OK, result.output
        rows = json_rows(result)  # every stdout line is JSON
        assert len(rows) == (2 if extra == ["--json"] else 5)
        for said in ("noisy: imported", "Loaded pretrained weights for noisy", "noisy: written", "noisy: forward"):
            assert said in result.stderr


def test_control_characters_in_names_are_escaped_so_each_output_stays_one_line(images, labels, tmp_path):
    (images / "wide.png").rename(images / "wi\nde.png")
    (images / "tall.png").rename(images / "ta\tll\x1b[31m.png")
    (images / "bro\rken.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    result = run(images, *square_args(labels, out, "-t", "red"))
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    assert [re.sub(r" \(\d+\.\d%\)", "", line) for line in result.stdout.splitlines()] == [
        f"{images}/ta\\tll\\x1b[31m.png: gradcam for red -> {out}/ta\\tll\\x1b[31m_gradcam_0-red.png",
        f"{images}/wi\\nde.png: gradcam for red -> {out}/wi\\nde_gradcam_0-red.png",
    ]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == f"error: {images}/bro\\rken.png: not an image Pillow can read"
    rows = json_rows(run(images, *square_args(labels, tmp_path / "again", "-t", "red", "--json")))
    assert {Path(row["input"]).name for row in rows} == {"wi\nde.png", "ta\tll\x1b[31m.png", "bro\rken.png"}


# --- real processes -----------------------------------------------------------------------------------------------


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_help_does_not_import_torch():
    code = (
        "import sys; sys.argv = ['gradcam', '--help']\n"
        "import gradcam_cli.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--layer" in done.stdout and "Exit codes" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.slow  # a subprocess of its own
def test_python_dash_m_gradcam_cli_explains_an_image(images, labels, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "gradcam_cli", str(images / "wide.png"), *map(str, square_args(labels, out, "--json"))],
        capture_output=True, text=True, env=subprocess_env(), timeout=600, cwd=tmp_path,  # hang guard only
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert Path(row["outputs"][0]).exists()
    assert "Traceback" not in done.stderr


@pytest.mark.slow  # a subprocess of its own
def test_the_console_script_exits_quickly_yet_finishes_what_is_running(tmp_path):
    # entry_point skips the interpreter's teardown, so it must first wait for running threads, run the atexit
    # handlers and flush the streams, and keep the command's exit code and its one-line error.
    script = f"""
import atexit, sys, threading, time
from pathlib import Path
from gradcam_cli.cli import entry_point
def late_write():
    time.sleep(0.3)
    Path({str(tmp_path / "thread.txt")!r}).write_text("done")
threading.Thread(target=late_write).start()
atexit.register(lambda: Path({str(tmp_path / "atexit.txt")!r}).write_text("ran"))
sys.stdout.write("unflushed output")
sys.argv = ["gradcam", {str(tmp_path / "missing.jpg")!r}]
entry_point()
print("not reached")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env(), timeout=600
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE
    assert done.stdout == "unflushed output"
    assert done.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing.jpg'}: no such file or directory"]
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "atexit.txt").read_text() == "ran"


def explain_in_a_process(images: Path, labels: Path, out: Path, stdout: int, *more: str) -> tuple[int, list[str]]:
    """``python -m gradcam_cli`` over ``images`` with its stdout on the descriptor ``stdout``: exit code, stderr."""
    args = [sys.executable, "-m", "gradcam_cli", str(images), *map(str, square_args(labels, out, *more))]
    done = subprocess.run(
        args,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        timeout=600,  # hang guard only
    )
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_a_stdout_closed_by_its_reader_stops_the_printing_not_the_run(images, labels, tmp_path):
    square_image(size=(90, 60), box=(5, 5, 25, 25)).save(images / "third.png")
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the first line: every write meets a broken pipe
    try:
        code, stderr = explain_in_a_process(
            images, labels, tmp_path / "out", writer, "--manifest", tmp_path / "m.jsonl"
        )
    finally:
        os.close(writer)
    assert code == EXIT_OK, stderr
    assert stderr[-1] == (
        "warning: stdout was closed by its reader after 0 lines; nothing more was printed, but the command ran to "
        "its end"
    )
    assert not any(line.startswith("error:") or "Traceback" in line for line in stderr), stderr
    assert sorted(p.name.split("_")[0] for p in (tmp_path / "out").glob("*.png")) == ["tall", "third", "wide"]
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows] == ["ok"] * 3


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_stdout_is_one_line_and_exit_1_and_every_output_is_written(images, labels, tmp_path):
    with open("/dev/full", "wb") as full:
        code, stderr = explain_in_a_process(images, labels, tmp_path / "out", full.fileno(), "--json")
    assert code == EXIT_IMAGE_FAILED, stderr
    errors = [line for line in stderr if line.startswith("error:") or "Traceback" in line]
    assert errors == [
        "error: cannot write to stdout after 0 lines (no space left on device); nothing more was printed, but the "
        "command ran to its end"
    ]
    assert sorted(p.name.split("_")[0] for p in (tmp_path / "out").glob("*.png")) == ["tall", "wide"]
