"""Resuming a run: --skip-existing keeps every image's rows in the manifest and the gallery, rows come in input
order, two runs cannot share an output folder, a resumed run refuses another run's settings, and output folder
problems are one line before the model loads."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cli import app
from gradcam_cli.errors import UsageError
from gradcam_cli.io.discovery import discover
from gradcam_cli.io.lock import FolderLock
from gradcam_cli.io.manifest import latest_row_sets, manifest_lock, read_manifest
from gradcam_cli.io.naming import LOCK_NAME, RUN_RECORD_NAME, manifest_lock_path
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.batch import BatchRunner
from gradcam_cli.pipeline.session import Session

ROOT = Path(__file__).resolve().parents[2]
SQUARE_MODEL = f"{ROOT / 'tests' / 'square_model.py'}:build"
COLOURS = ["red", "green", "blue"]


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """Five images, named so that sorting ignores case (b.png before C.png), and a labels file beside them."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i, name in enumerate(["a", "b", "C", "d", "e"]):
        square_image(colour=COLOURS[i % 3]).save(folder / f"{name}.png")
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    return folder


def gradcam(tmp_path: Path, *args: str | Path):
    base = [str(tmp_path / "in"), "-m", SQUARE_MODEL, "--labels", str(tmp_path / "labels.txt"), "--workers", "0"]
    return CliRunner().invoke(app, [*base, *map(str, args)])


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sorted_inputs(folder: Path) -> list[str]:
    return [str(image.path) for image in discover([folder])]


# ------------------------------------------------------------------------------------------- 7: resume keeps data


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_resumed_run_keeps_every_rows_predictions_in_manifest_and_gallery(tmp_path, images, suffix):
    out = tmp_path / "out"
    manifest = out / f"run{suffix}"
    first = gradcam(tmp_path, "-o", out, "--top-k", "2", "--save-raw", "--report", "--manifest", manifest)
    assert first.exit_code == 0, first.output
    before = read_manifest(manifest)
    assert len(before) == 10 and all(row["predictions"] for row in before)
    for path in out.glob("d_gradcam_*.png"):
        path.unlink()  # d.png must be explained again; the others are skipped
    again = gradcam(
        tmp_path, "-o", out, "--top-k", "2", "--save-raw", "--report", "--skip-existing", "--manifest", manifest
    )
    assert again.exit_code == 0, again.output
    assert "4 skipped" in again.stderr

    rows = read_manifest(manifest)
    assert len(rows) == 10  # one set of rows per input, nothing lost, nothing twice
    assert [row["input"] for row in rows[::2]] == sorted_inputs(images)  # in input order (b before C)
    old = {(row["input"], row["target"]["index"]): row for row in before}
    for row in rows:
        earlier = old[(row["input"], row["target"]["index"])]
        if row["input"].endswith("d.png"):
            assert row["status"] == "ok"
            continue
        assert row["status"] == "skipped"
        for key in ("predictions", "target", "method", "outputs", "seconds", "fingerprint", "provenance"):
            assert row[key] == earlier[key], key
        assert row["fingerprint"] and row["provenance"]  # carried over, not dropped
    if suffix == ".csv":  # still a CSV with one header
        assert manifest.read_text().count("input,status") == 1

    page = (out / "index.html").read_text()
    entries = json.loads(re.search(r'id="gallery-data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert len(entries) == 5
    for entry in entries:
        assert len(entry["views"]) == 2 and entry["predictions"], entry["name"]
        assert all(view["thumb"] and view["target"][1] is not None for view in entry["views"])
    assert sorted(entry["status"] for entry in entries) == ["ok"] + ["skipped"] * 4


def test_without_an_earlier_manifest_rows_are_rebuilt_from_the_files(tmp_path, images):
    out = tmp_path / "out"
    assert gradcam(tmp_path, "-o", out, "--top-k", "2", "--panel").exit_code == 0
    manifest = tmp_path / "later.jsonl"
    again = gradcam(tmp_path, "-o", out, "--top-k", "2", "--panel", "--skip-existing", "--manifest", manifest)
    assert again.exit_code == 0, again.output
    rows = jsonl(manifest)
    assert [row["status"] for row in rows] == ["skipped"] * 10
    assert [row["input"] for row in rows[::2]] == sorted_inputs(images)
    for row in rows:
        overlay, panel = row["outputs"]
        index, name = re.search(r"_gradcam_(\d+)-([a-z]+)\.png$", overlay).groups()
        assert row["target"] == {"index": int(index), "name": name, "probability": None}
        assert name == COLOURS[int(index)]  # the name comes from the model's classes
        assert panel.endswith("_panel.png") and Path(panel).is_file() and Path(overlay).is_file()
        assert row["method"] == "gradcam" and row["predictions"] == []


def test_with_a_fixed_class_rows_are_rebuilt_for_that_class(tmp_path, images, square_model):
    out = tmp_path / "out"
    explainer = Explainer(square_model, "features", target="blue")
    assert all(r.status == "ok" for r in BatchRunner(explainer, OutputOptions(out)).run(discover([images])))
    rows = list(BatchRunner(explainer, OutputOptions(out, skip_existing=True)).run(discover([images])))
    assert [(r.status, r.target.index, r.target.name) for r in rows] == [("skipped", 2, "blue")] * 5
    assert all(Path(r.outputs[0]).name.endswith("_gradcam_2-blue.png") for r in rows)


def test_an_image_whose_rows_the_resumed_manifest_lacks_is_explained_again(tmp_path, images):
    """A killed run may leave an image's files without its rows (they wait for an earlier image's), or with some of
    them: resuming that manifest explains such an image again, so it ends with every image's full rows, once."""
    out = tmp_path / "out"
    manifest = out / "m.jsonl"
    assert gradcam(tmp_path, "-o", out, "--top-k", "2", "--manifest", manifest).exit_code == 0
    before = jsonl(manifest)
    lost = [row for row in before if not row["input"].endswith("b.png")]  # b.png: no row left
    lost.remove(next(row for row in lost if row["input"].endswith("d.png")))  # d.png: one of its two
    manifest.write_text("".join(json.dumps(row) + "\n" for row in lost))
    again = gradcam(tmp_path, "-o", out, "--top-k", "2", "--manifest", manifest, "--skip-existing")
    assert again.exit_code == 0, again.output
    assert "done: 2 ok, 0 failed, 3 skipped" in again.stderr
    rows = jsonl(manifest)
    assert [row["status"] for row in rows] == ["skipped", "skipped", "ok", "ok"] * 2 + ["skipped"] * 2
    assert [{**row, "status": "ok", "seconds": 0} for row in rows] == [{**row, "seconds": 0} for row in before]


def test_the_earlier_rows_stay_in_the_manifest_while_a_resumed_run_goes(tmp_path, images, square_model):
    """A crash at any moment loses nothing: this run's rows are appended; Ctrl-C still leaves one set per input."""
    out = tmp_path / "out"
    manifest = out / "m.jsonl"
    explainer = Explainer(square_model, "features", top_k=2)
    options = OutputOptions(out, manifest=manifest)
    with Session(options, RunOptions(workers=0)) as session:
        list(session.explain(explainer, discover([images])))
    before = jsonl(manifest)
    for path in out.glob("b_gradcam_*.png"):
        path.unlink()
    resumed = OutputOptions(out, manifest=manifest, skip_existing=True)
    seen: list[str] = []
    with pytest.raises(KeyboardInterrupt), Session(resumed, RunOptions(workers=0)) as session:
        for record in session.explain(explainer, discover([images])):
            seen.append(record.input)
            if seen.count(record.input) == 2 and record.input.endswith("b.png"):  # Ctrl-C once b's rows are in
                rows = jsonl(manifest)  # mid-run: every earlier row is still there, this run's rows after them
                assert rows[: len(before)] == before and rows[-1]["input"].endswith("b.png")
                raise KeyboardInterrupt
    rows = jsonl(manifest)
    assert [row["input"] for row in rows[::2]] == sorted_inputs(images)
    assert [row["status"] for row in rows] == ["skipped"] * 2 + ["ok"] * 2 + ["ok"] * 6  # c..e: the earlier rows
    assert rows[4:] == before[4:]


@pytest.mark.quick
def test_the_latest_set_of_rows_wins_even_next_to_an_earlier_one():
    def row(name: str, index: int, status: str = "ok") -> dict:
        return {"input": name, "status": status, "method": "gradcam", "target": {"index": index}}

    rows = [row("a", 0), row("a", 1), row("b", 0), row("b", 1), row("b", 0, "skipped"), row("b", 1, "skipped")]
    rows += [row("a", 1), row("a", 0)]
    sets = latest_row_sets(rows)
    assert list(sets) == [os.path.abspath("a"), os.path.abspath("b")]
    assert sets[os.path.abspath("a")] == [row("a", 1), row("a", 0)]
    assert [r["status"] for r in sets[os.path.abspath("b")]] == ["skipped", "skipped"]


# ---------------------------------------------------------------------------------------- 15: rows in input order


@pytest.mark.quick
def test_records_come_in_input_order_though_batches_do_not(tmp_path, square_model):
    names = []
    for i in range(8):  # two sizes, alternating: batches of one size run images 0, 2, 4... before 1, 3...
        name = f"i{i}.png"
        square_image(size=(480, 320) if i % 2 else (320, 320)).save(tmp_path / name)
        names.append(name)
    (tmp_path / "i5.png").write_text("not an image")
    out = tmp_path / "out"
    explainer = Explainer(square_model, "features")
    runner = BatchRunner(explainer, OutputOptions(out), RunOptions(batch_size=2, workers=0))
    assert [Path(r.input).name for r in runner.run(discover([tmp_path], exclude=out))] == names
    for path in [*out.glob("i3_*"), *out.glob("i6_*")]:
        path.unlink()
    resumed = BatchRunner(explainer, OutputOptions(out, skip_existing=True), RunOptions(batch_size=2, workers=0))
    records = list(resumed.run(discover([tmp_path], exclude=out)))
    assert [Path(r.input).name for r in records] == names
    assert [r.status for r in records] == ["skipped"] * 3 + ["ok", "skipped", "error", "ok", "skipped"]


# ------------------------------------------------------------------------------------- 11: one run per output folder


def test_a_second_run_into_a_locked_output_folder_fails_with_one_line(tmp_path, images):
    out = tmp_path / "out"
    out.mkdir()
    with FolderLock(out / LOCK_NAME, out, "--output-dir"):
        locked = gradcam(tmp_path, "-o", out)
        assert locked.exit_code == 2
        assert locked.stderr == (
            f"error: another gradcam run (pid {os.getpid()}) is writing to {out}; "
            "wait for it or choose another --output-dir\n"
        )
        assert not list(out.glob("*.png"))
    assert gradcam(tmp_path, "-o", out).exit_code == 0
    assert len(list(out.glob("*.png"))) == 5
    assert not (out / LOCK_NAME).exists()  # removed when the run ends


@pytest.mark.quick
@pytest.mark.parametrize("named", ["outside", "inside", "linked folder", "linked file", "relative"])
def test_a_manifest_another_run_writes_is_refused_whatever_path_names_it(tmp_path, images, monkeypatch, named):
    """The manifest is claimed by itself, not only through the output folder it may lie in: a run writing to it
    from another output folder keeps out a run that names it in any way."""
    manifest = tmp_path / "shared" / "m.jsonl"
    manifest.parent.mkdir()
    manifest.write_text("{}\n")
    (tmp_path / "link").symlink_to(manifest.parent)
    (tmp_path / "alias.jsonl").symlink_to(manifest)
    monkeypatch.chdir(tmp_path)
    out, given = {
        "outside": (tmp_path / "out", manifest),
        "inside": (manifest.parent, manifest),
        "linked folder": (tmp_path / "out", tmp_path / "link" / "m.jsonl"),
        "linked file": (tmp_path / "out", tmp_path / "alias.jsonl"),
        "relative": (tmp_path / "out", Path("link/../shared/m.jsonl")),
    }[named]
    shown = f"{given} ({manifest})" if named.startswith("linked") else given  # the file a link leads to
    with manifest_lock(manifest):
        locked = gradcam(tmp_path, "-o", out, "--manifest", given)
        assert locked.exit_code == 2
        assert locked.stderr == (
            f"error: another gradcam run (pid {os.getpid()}) is writing to {shown}; "
            "wait for it or choose another --manifest\n"
        )
        assert manifest.read_text() == "{}\n" and not list(out.glob("*.png"))
    if named == "linked file":  # once it is free: written through the link, which stays one
        assert gradcam(tmp_path, "-o", out, "--manifest", given, "--skip-existing").exit_code == 0
        assert len(jsonl(manifest)) == 5 and (tmp_path / "alias.jsonl").is_symlink()
        assert not manifest_lock_path(manifest).exists()  # removed when the run ends


def test_the_lock_is_exclusive_within_the_library(tmp_path):
    with FolderLock(tmp_path / LOCK_NAME, tmp_path, "--output-dir") as held:
        assert held.held_by() == os.getpid()
        with pytest.raises(UsageError, match="another gradcam run"):
            FolderLock(tmp_path / LOCK_NAME, tmp_path, "--output-dir").acquire()
    with FolderLock(tmp_path / LOCK_NAME, tmp_path, "--output-dir"):
        assert (tmp_path / LOCK_NAME).is_file()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_forked_child_that_outlives_a_killed_run_does_not_keep_the_lock(tmp_path):
    """Decoding processes are forked from the run: if the run is killed, one may live on a moment. It must not
    hold the folder's lock (a flock is shared with forked children), or resuming at once would be refused."""
    ready_read, ready_write = os.pipe()
    end_read, end_write = os.pipe()
    run = os.fork()
    if run == 0:  # the run: takes the lock, forks a decoding process, dies without unlocking
        try:
            FolderLock(tmp_path / LOCK_NAME, tmp_path, "--output-dir").acquire()
            if os.fork() == 0:  # the decoding process: says it runs, then lives until the test is done
                os.write(ready_write, b"x")
                os.read(end_read, 1)
        finally:
            os._exit(0)
    os.close(ready_write)
    try:
        assert os.waitpid(run, 0)[1] == 0
        assert os.read(ready_read, 1) == b"x", "the decoding process did not start"
        with FolderLock(tmp_path / LOCK_NAME, tmp_path, "--output-dir") as claimed:  # the dead run's lock is gone
            assert claimed.held_by() == os.getpid()
    finally:
        os.write(end_write, b"x")
        for fd in (ready_read, end_read, end_write):
            os.close(fd)


# ------------------------------------------------------------------------ 13: --skip-existing checks the run record


def test_skip_existing_refuses_outputs_made_with_other_settings(tmp_path, images):
    out = tmp_path / "out"
    assert gradcam(tmp_path, "-o", out).exit_code == 0
    record = json.loads((out / RUN_RECORD_NAME).read_text())
    assert record["model"] == SQUARE_MODEL and record["layers"] == "features" and record["alpha"] == 0.5
    other = gradcam(tmp_path, "-o", out, "--skip-existing", "--alpha", "0.3", "--colormap", "viridis")
    assert other.exit_code == 2
    assert other.stderr == (
        f"error: --skip-existing: the outputs in {out} were made with colormap jet (this run: viridis), "
        "alpha 0.5 (this run: 0.3); add --colormap jet --alpha 0.5 to resume them, choose another --output-dir, or "
        "run without --skip-existing\n"
    )
    assert gradcam(tmp_path, "-o", out, "--skip-existing").exit_code == 0  # same settings: resumes
    (out / RUN_RECORD_NAME).unlink()  # outputs of an older version: no record, nothing to compare
    assert gradcam(tmp_path, "-o", out, "--skip-existing", "--alpha", "0.3").exit_code == 0
    assert json.loads((out / RUN_RECORD_NAME).read_text())["alpha"] == 0.3


@pytest.mark.quick
def test_resuming_with_another_method_is_refused_and_with_both_keeps_both(tmp_path, images):
    """Issue 41, item 16: a resume with --method layercam after a --method gradcam run would replace each image's
    rows (gradcam's with them) in the manifest and the gallery: refused in one line, exit 2, nothing changed;
    resumed with both methods, the manifest and the gallery have both methods' rows for every image."""
    out, manifest = tmp_path / "out", tmp_path / "out" / "rows.jsonl"
    common = ("-o", out, "--manifest", manifest, "--report")
    assert gradcam(tmp_path, *common, "--method", "gradcam").exit_code == 0
    before = manifest.read_text()
    other = gradcam(tmp_path, *common, "--method", "layercam", "--skip-existing")
    assert other.exit_code == 2 and other.stderr == (
        f"error: --skip-existing: the outputs in {out} were made with --method gradcam; resuming with --method "
        "layercam would drop the rows of gradcam from the manifest and the gallery: add --method layercam,gradcam, "
        "choose another --output-dir, or run without --skip-existing\n"
    )
    assert manifest.read_text() == before
    both = gradcam(tmp_path, *common, "--method", "layercam,gradcam", "--skip-existing")
    assert both.exit_code == 0, both.output
    methods = {(Path(row["input"]).name, row["method"]) for row in jsonl(manifest)}
    assert methods == {(f"{name}.png", method) for name in "abCde" for method in ("gradcam", "layercam")}
    page = (out / "index.html").read_text()
    entries = json.loads(re.search(r'id="gallery-data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert len(entries) == 5 and all(len(entry["views"]) == 2 for entry in entries)
    again = gradcam(tmp_path, *common, "--method", "gradcam,layercam", "--skip-existing")  # any order: resumes
    assert again.exit_code == 0 and "5 skipped" in again.stderr


def test_skip_existing_refuses_another_layer(tmp_path, images):
    out = tmp_path / "out"
    assert gradcam(tmp_path, "-o", out, "--layer", "features", "--format", "png").exit_code == 0
    other = gradcam(tmp_path, "-o", out, "--skip-existing", "--layer", "features.0", "--format", "jpg")
    assert other.exit_code == 2
    assert "made with layer features (this run: features.0), format png (this run: jpg);" in other.stderr


# ------------------------------------------------------------------------- 8: output problems, one line, up front


@pytest.mark.parametrize(
    "case",
    ["manifest in /proc", "manifest is a folder", "manifest under a file", "output is a file", "report in /proc"],
)
def test_output_problems_are_one_line_before_the_model_loads(tmp_path, images, case):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.jsonl").mkdir()
    args, expected = {
        "manifest in /proc": (["--manifest", "/proc/x/m.jsonl"], "--manifest /proc/x/m.jsonl: cannot create"),
        "manifest is a folder": (["--manifest", tmp_path / "folder.jsonl"], "is a folder"),
        "manifest under a file": (["--manifest", tmp_path / "file" / "m.csv"], "is a file, not a folder"),
        "output is a file": (["-o", tmp_path / "file"], f"--output-dir {tmp_path / 'file'} is a file, not a folder"),
        "report in /proc": (["-o", "/proc/x/out", "--report"], "--output-dir /proc/x/out: cannot create"),
    }[case]
    # the model named does not exist: an "unknown model" error would mean the output folder was checked too late
    command = [str(images), "-m", "no_such_model", "--workers", "0", "-o", str(tmp_path / "out"), *map(str, args)]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    assert expected in result.stderr and "Traceback" not in result.output and "Error:" not in result.stderr


def test_an_unwritable_output_folder_is_one_line(tmp_path, images, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):  # as root, chmod cannot make a folder read-only
        if Path(path).parent == out:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    result = CliRunner().invoke(app, [str(images), "-m", "no_such_model", "-o", str(out)])
    assert result.exit_code == 2
    assert result.stderr == f"error: --output-dir {out}: cannot write there: permission denied\n"


def test_a_missing_output_folder_is_created_with_its_parents(tmp_path, images):
    out = tmp_path / "new" / "deeper" / "out"
    result = gradcam(tmp_path, "-o", out, "--manifest", tmp_path / "also" / "new" / "m.csv")
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*.png"))) == 5
    with (tmp_path / "also" / "new" / "m.csv").open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 5


def test_a_skipped_video_gets_its_earlier_rows_or_its_files(tmp_path, square_model):
    cv2 = pytest.importorskip("cv2")
    import numpy as np

    from gradcam_cli.io.discovery import InputImage

    clip = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 12.0, (64, 48))
    for _ in range(3):
        writer.write(np.full((48, 64, 3), (20, 20, 230), np.uint8))
    writer.release()
    out, manifest = tmp_path / "out", tmp_path / "out" / "m.jsonl"
    explainer = Explainer(square_model, "features", top_k=2)
    video = [InputImage(clip, Path("clip"))]
    with Session(OutputOptions(out, manifest=manifest)) as session:
        assert [r.status for r in session.explain(explainer, [], video)] == ["ok", "ok"]
    before = jsonl(manifest)
    with Session(OutputOptions(out, manifest=manifest, skip_existing=True)) as session:
        records = list(session.explain(explainer, [], video))
    assert [r.status for r in records] == ["skipped", "skipped"]
    rows = jsonl(manifest)
    assert [{**row, "status": "ok"} for row in rows] == before
    lost = tmp_path / "lost.jsonl"
    with Session(OutputOptions(out, manifest=lost, skip_existing=True)) as session:
        list(session.explain(explainer, [], video))
    assert [row["outputs"] for row in jsonl(lost)] == [row["outputs"] for row in before]
    manifest.write_text(json.dumps(before[0]) + "\n")  # a row lost: the clip is explained again
    with Session(OutputOptions(out, manifest=manifest, skip_existing=True)) as session:
        assert [r.status for r in session.explain(explainer, [], video)] == ["ok", "ok"]
    assert [{**row, "seconds": 0} for row in jsonl(manifest)] == [{**row, "seconds": 0} for row in before]
