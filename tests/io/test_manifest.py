"""The --manifest record (JSON lines or CSV), and resuming a killed run with --skip-existing."""

from __future__ import annotations

import csv
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import comparable
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cam.records import Record
from gradcam_cli.cam.results import Prediction
from gradcam_cli.cli import app
from gradcam_cli.errors import UsageError
from gradcam_cli.io.atomic import TEMP_MARKER
from gradcam_cli.io.manifest import MANIFEST_FIELDS, ManifestWriter, read_manifest

pytestmark = pytest.mark.quick
ROOT = Path(__file__).resolve().parents[2]
SQUARE_MODEL = f"{ROOT / 'tests' / 'square_model.py'}:build"
FIELDS = ["input", "status", "error", "outputs", "predictions", "target", "method", "layer", "model", "seconds"]
FIELDS += ["fingerprint", "provenance"]


def gradcam_command() -> list[str]:
    script = Path(sys.executable).parent / "gradcam"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gradcam_cli"]


def sample_records() -> list[Record]:
    red = Prediction(0, "red", 0.9)
    return [
        Record("a.png", "ok", "m", "features", "gradcam", red, [red], ["out/a_gradcam_0-red.png"], None, 0.01),
        Record("b.png", "error", "m", "features", error='b.png: not an image, "quoted", comma'),
        Record("c.png", "skipped", "m", "features", outputs=["out/c_gradcam_0-red.png"]),
    ]


def test_jsonl_rows_have_every_field(tmp_path):
    path = tmp_path / "deep" / "m.jsonl"
    with ManifestWriter(path) as writer:
        for record in sample_records():
            writer.write(record.to_dict())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [list(row) for row in rows] == [FIELDS] * 3 and list(MANIFEST_FIELDS) == FIELDS
    assert rows[0]["target"] == {"index": 0, "name": "red", "probability": 0.9}
    assert rows[1]["status"] == "error" and rows[1]["outputs"] == []
    assert rows[2]["status"] == "skipped"


def test_csv_rows_round_trip_with_json_cells(tmp_path):
    path = tmp_path / "m.CSV"
    with ManifestWriter(path) as writer:
        for record in sample_records():
            writer.write(record.to_dict())
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == FIELDS and len(rows) == 3
    assert json.loads(rows[0]["outputs"]) == ["out/a_gradcam_0-red.png"]
    assert json.loads(rows[0]["target"])["name"] == "red"
    assert rows[1]["error"] == 'b.png: not an image, "quoted", comma'
    assert rows[1]["target"] == "" and float(rows[0]["seconds"]) == 0.01


@pytest.mark.parametrize("name", ["m.jsonl", "m.csv"])
def test_appending_keeps_the_rows_and_reads_back_what_was_written(tmp_path, name):
    path = tmp_path / name
    first, *others = [record.to_dict() for record in sample_records()]
    with ManifestWriter(path) as writer:
        writer.write(first)
    with path.open("ab") as handle:
        handle.write(b'{"input": "torn.png", "sta')  # a row cut short by a killed run (no newline)
    with ManifestWriter(path, append=True) as writer:
        for row in others:
            writer.write(row)
    assert read_manifest(path) == [first, *others]  # the torn row is left out, every other row is whole
    if name.endswith(".csv"):
        assert path.read_text().count("input,status") == 1


def test_other_suffixes_are_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"\.jsonl or \.csv"):
        ManifestWriter(tmp_path / "m.json")


def test_cli_manifest_has_one_row_per_image_target_and_method(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i, colour in enumerate(["red", "green", "blue"]):
        square_image(colour=colour).save(folder / f"sq{i}.png")
    (folder / "broken.jpg").write_text("nope")
    manifest = tmp_path / "run.jsonl"
    args = [str(folder), "-m", SQUARE_MODEL, "-o", str(tmp_path / "out"), "--workers", "0", "--top-k", "2"]
    result = CliRunner().invoke(app, [*args, "--save-raw", "--manifest", str(manifest)])
    assert result.exit_code == 1, result.output
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 6 and len(rows) == 7
    for row in ok:
        assert row["method"] == "gradcam" and row["layer"] == "features" and row["model"] == SQUARE_MODEL
        assert len(row["outputs"]) == 2 and all(Path(p).exists() for p in row["outputs"])
        assert row["outputs"][1].endswith(".npy") and row["seconds"] > 0
        assert row["target"]["index"] in [p["index"] for p in row["predictions"]]
    for i in range(3):  # two rows (the top two classes) per image
        assert len({r["target"]["index"] for r in ok if r["input"] == str(folder / f"sq{i}.png")}) == 2
    (error,) = [r for r in rows if r["status"] == "error"]
    assert "broken.jpg" in error["error"] and error["input"].endswith("broken.jpg")

    again = CliRunner().invoke(app, [*args, "--save-raw", "--skip-existing", "--manifest", str(tmp_path / "m.csv")])
    assert again.exit_code == 1
    with (tmp_path / "m.csv").open(newline="") as handle:
        resumed = list(csv.DictReader(handle))
    statuses = sorted(row["status"] for row in resumed)
    # a new manifest: the skipped images' rows are rebuilt from their files, one per class as before
    assert statuses == ["error"] + ["skipped"] * 6
    for row in resumed[1:] if resumed[0]["status"] == "error" else resumed[:-1]:
        outputs = json.loads(row["outputs"])
        assert len(outputs) == 2 and all(Path(p).exists() for p in outputs)
        assert json.loads(row["target"])["index"] == int(Path(outputs[0]).stem.rsplit("_", 1)[1].split("-")[0])


HANG_GUARD = 600
"""Seconds a subprocess may take before a test gives up: a guard against hangs, never a measure of speed."""


def held_run(arguments: list[str], after: int | str, **popen) -> tuple[subprocess.Popen, int]:
    """Start ``gradcam ARGUMENTS`` with every output file after the first ``after`` held just before it is named
    (tests/held_writes.py; ``after`` ``"HOLD:UNTIL:ROWS"``: the files matching HOLD held, until one matching UNTIL
    and ROWS manifest rows are written), and return once it is so held: the process, and the descriptor whose
    closing releases the held files."""
    ready_read, ready_write = os.pipe()
    release_read, release_write = os.pipe()
    script = Path(__file__).parents[1].joinpath("held_writes.py")
    command = [sys.executable, str(script), str(ready_write), str(release_read), str(after), *arguments]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, pass_fds=(ready_write, release_read), **popen)
    os.close(ready_write)
    os.close(release_read)
    try:
        readable, _, _ = select.select([ready_read], [], [], HANG_GUARD)
        told = os.read(ready_read, 1) if readable else b""
    finally:
        os.close(ready_read)
    if told != b"r":
        process.kill()
        process.wait()
        os.close(release_write)
        pytest.fail(
            f"the run ended or hung before {after} (files written, the next one held) was reached "
            "(outputs are held only where they are written as unnamed O_TMPFILE files)"
        )
    return process, release_write


def _complete(path: Path) -> None:
    """Raise unless ``path`` is a whole output: an image that decodes fully, or an .npy that loads."""
    if path.suffix == ".npy":
        array = np.load(path)
        assert array.ndim == 2 and np.isfinite(array).all()
    elif path.suffix != ".jsonl":
        with Image.open(path) as image:
            image.load()


@pytest.mark.slow
def test_a_run_killed_midway_leaves_only_complete_files_and_resumes(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    count = 40
    rng = np.random.default_rng(0)
    for i in range(count):
        noise = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)  # noisy images: each PNG takes a while
        image = np.asarray(square_image(size=(640, 480), colour=["red", "green", "blue"][i % 3]))
        Image.fromarray(((image.astype(np.uint16) * 3 + noise) // 4).astype(np.uint8)).save(folder / f"im{i:02d}.png")
    out = tmp_path / "out"
    arguments = [str(folder), "-m", SQUARE_MODEL, "-o", str(out), "--save-raw", "--batch-size", "2"]
    # Killed while 12 files are in place and the next ones' bytes are written but not yet named: held there
    # (tests/held_writes.py), so the kill lands midway however fast or slow the machine is.
    first = [*arguments, "--manifest", str(out / "first.jsonl"), "--workers", "1"]
    process, release = held_run(first, after=12, stderr=subprocess.DEVNULL)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=HANG_GUARD)
    os.close(release)
    assert process.returncode == -signal.SIGKILL
    finished = list(out.glob("*.png")) + list(out.glob("*.npy"))
    assert 0 < len(finished) < 2 * count
    for path in finished:
        _complete(path)
    leftovers = [p for p in out.rglob("*") if TEMP_MARKER in p.name]
    assert leftovers == [], "a killed run left temporary files"

    result = subprocess.run(
        [*gradcam_command(), *arguments, "--skip-existing", "--manifest", str(out / "resume.jsonl")],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "resume.jsonl").read_text().splitlines()]
    assert len(rows) == count and {row["status"] for row in rows} == {"ok", "skipped"}
    skipped = sum(row["status"] == "skipped" for row in rows)
    assert skipped >= 1
    for i in range(count):
        (overlay,) = out.glob(f"im{i:02d}_gradcam_*.png")
        (raw,) = out.glob(f"im{i:02d}_gradcam_*.npy")
        _complete(overlay)
        _complete(raw)
    assert not [p for p in out.rglob("*") if TEMP_MARKER in p.name]

    # Ctrl-C instead: exit code 130, and every image whose files were written has its row
    interrupted = tmp_path / "interrupted"
    arguments = [str(folder), "-m", SQUARE_MODEL, "-o", str(interrupted), "--batch-size", "2"]
    arguments += ["--manifest", str(tmp_path / "ctrl-c.jsonl")]
    # Ctrl-C while 4 files are in place and later ones are held; they are released only once the signal is sent.
    process, release = held_run(arguments, after=4, stderr=subprocess.PIPE, text=True)
    process.send_signal(signal.SIGINT)
    os.close(release)
    _, stderr = process.communicate(timeout=HANG_GUARD)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    rows = [json.loads(line) for line in (tmp_path / "ctrl-c.jsonl").read_text().splitlines()]
    written = sorted(p.name for p in interrupted.glob("*.png"))
    assert sorted(Path(row["outputs"][0]).name for row in rows) == written


def _eight_images(folder: Path) -> list[str]:
    folder.mkdir()
    for i in range(8):
        square_image(colour=["red", "green", "blue"][i % 3]).save(folder / f"im{i:02d}.png")
    return [f"im{i:02d}.png" for i in range(8)]


@pytest.mark.slow
def test_a_run_killed_between_an_images_files_and_its_row_resumes_with_every_full_row(tmp_path):
    """Rows go out in input order, files as the writers finish them: killed while image 2's overlay is held and
    image 3's is written (its row waits for image 2's), the run leaves image 3 done on disk and missing from the
    manifest. Resuming explains it again: the manifest ends with every image's full row, once, as a clean run's.
    (Held once images 0 and 1 have their rows, so that the resumed run batches the others as the clean run did:
    other batches could change a probability in its last digit.)"""
    names = _eight_images(tmp_path / "in")

    def arguments(out: Path) -> list[str]:
        command = [str(tmp_path / "in"), "-m", SQUARE_MODEL, "-o", str(out), "--manifest", str(out / "m.jsonl")]
        return [*command, "--batch-size", "2", "--workers", "0"]

    clean = CliRunner().invoke(app, arguments(tmp_path / "clean"))
    assert clean.exit_code == 0, clean.output
    out = tmp_path / "out"
    process, release = held_run(arguments(out), "im02_*:im03_*:2", stderr=subprocess.DEVNULL)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=HANG_GUARD)
    os.close(release)
    assert process.returncode == -signal.SIGKILL
    assert list(out.glob("im03_gradcam_*.png")) and not list(out.glob("im02_*"))
    assert [Path(row["input"]).name for row in read_manifest(out / "m.jsonl")] == names[:2]  # not im03.png's

    resumed = CliRunner().invoke(app, [*arguments(out), "--skip-existing"])
    assert resumed.exit_code == 0, resumed.output
    rows, expected = comparable(out / "m.jsonl", out), comparable(tmp_path / "clean" / "m.jsonl", tmp_path / "clean")
    assert [Path(row["input"]).name for row in rows] == names
    assert [row["status"] for row in rows] == ["skipped"] * 2 + ["ok"] * 6  # im03.png explained again
    assert [{**row, "status": "ok"} for row in rows] == expected  # each row whole: predictions, target, fingerprint


@pytest.mark.slow
def test_a_second_run_cannot_write_a_manifest_another_run_is_writing(tmp_path):
    """``gradcam big -o runA --manifest runA/manifest.jsonl &`` then ``gradcam many -o runB --manifest
    runA/manifest.jsonl``: the second run is refused at once (one line, exit 2), also when it names the manifest
    through a link or a relative path, and the first one's manifest comes out whole."""
    names = _eight_images(tmp_path / "in")
    run_a, run_b = tmp_path / "runA", tmp_path / "runB"
    manifest = run_a / "manifest.jsonl"
    first = [str(tmp_path / "in"), "-m", SQUARE_MODEL, "-o", str(run_a), "--manifest", str(manifest)]
    process, release = held_run([*first, "--batch-size", "2", "--workers", "0"], after=3, stderr=subprocess.PIPE)
    try:
        (tmp_path / "link").symlink_to(run_a)
        second = [str(tmp_path / "in"), "-m", SQUARE_MODEL, "-o", str(run_b), "--manifest"]
        refused = subprocess.run(
            [*gradcam_command(), *second, str(manifest)], capture_output=True, text=True, timeout=HANG_GUARD
        )
        assert refused.returncode == 2
        assert refused.stderr == (
            f"error: another gradcam run (pid {process.pid}) is writing to {manifest}; "
            "wait for it or choose another --manifest\n"
        )
        for named in (tmp_path / "link" / "manifest.jsonl", Path(os.path.relpath(manifest))):
            again = CliRunner().invoke(app, [*second, str(named)])
            assert again.exit_code == 2 and f"(pid {process.pid}) is writing to {named}" in again.stderr
            assert len(again.stderr.splitlines()) == 1
        assert list(run_b.iterdir()) == []
    finally:
        os.close(release)
    _, stderr = process.communicate(timeout=HANG_GUARD)
    assert process.returncode == 0, stderr
    assert b"\0" not in manifest.read_bytes()
    rows = read_manifest(manifest)
    assert [Path(row["input"]).name for row in rows] == names and {row["status"] for row in rows} == {"ok"}
