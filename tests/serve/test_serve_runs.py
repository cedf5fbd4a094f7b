"""``gradcam serve`` over finished runs as users start it: the command in a subprocess (a real server on 127.0.0.1),
stopped with SIGTERM or SIGHUP as with Ctrl-C; what it takes for a run and what for images; the run index and its
drift file; names that are not UTF-8."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from gradcam_cli.serve import create_app

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model", str(ROOT / "tests" / "square_model.py:build"), "--weights", "none"]
LOCAL = "http://127.0.0.1:8765"
BAD = os.fsdecode(b"bad\xff.png")
"""A file name that is not UTF-8 (its byte 0xff held as a surrogate, as Python decodes such names)."""


def photos(folder: Path, names: tuple[str, ...] = ("a.png", BAD)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n, name in enumerate(names):
        image = Image.new("RGB", (40, 30), (0, 0, 255))
        image.paste((255, 0, 0) if n % 2 == 0 else (0, 255, 0), (4, 4, 20, 20))
        image.save(folder / name, "PNG")
    return folder


def make_run(project: Path, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...] = ("a.png", BAD)) -> Path:
    """``gradcam photos -o out --manifest out/manifest.jsonl``, run in ``project``: its paths are relative to it."""
    from gradcam_cli.cli.explain import app

    photos(project / "photos", names)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["photos", "-o", "out", "--manifest", "out/manifest.jsonl", *MODEL, "-q"])
    assert result.exit_code == 0, result.output
    return project / "out"


class Served:
    """``gradcam serve ARGS`` in a subprocess, in ``cwd``, its temporary files in ``tmp``; ``url`` once serving."""

    def __init__(self, args: list[str], cwd: Path, tmp: Path) -> None:
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
        command = [sys.executable, "-m", "gradcam_cli", "serve", *args, "--port", "0"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 120)  # a hang guard, never a timing
        line = self.process.stdout.readline() if ready else ""
        assert line.startswith("serving on http://127.0.0.1:"), line + self.stop(signal.SIGKILL)[1]
        self.url = line.split()[2]

    def get(self, path: str, **headers: str) -> object:
        import httpx

        return httpx.get(self.url + path, headers=headers, timeout=60)

    def stop(self, number: int) -> tuple[int, str]:
        """Send ``number``; the exit code and stderr."""
        self.process.send_signal(number)
        try:
            code = self.process.wait(timeout=60)
        finally:
            self.process.kill()
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_started_elsewhere_is_served_from_anywhere_and_a_signal_cleans_up(tmp_path, monkeypatch, number):
    run = make_run(tmp_path / "project", monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    served = Served([str(run), *MODEL], elsewhere, tmp_path / "tmp")
    try:
        rows = served.get("api/run/rows").json()  # type: ignore[attr-defined]
        assert rows["total"] == 2 and {r["input"] for r in rows["rows"]} == {"photos/a.png", "photos/bad\\xff.png"}
        for row in rows["rows"]:
            output = served.get(f"api/run/rows/{row['row']}/outputs/0")
            assert output.status_code == 200 and output.headers["content-type"] == "image/png"  # type: ignore[attr-defined]
            assert served.get(f"api/images/r{row['row']}.png").status_code == 200  # type: ignore[attr-defined]
            live = served.get(f"api/map?image=r{row['row']}").json()  # type: ignore[attr-defined]
            assert live["width"] == 40 and live["name"].startswith(("a_", "bad"))
        other_site = served.get("api/map?image=r0&method=scorecam", **{"Sec-Fetch-Site": "cross-site"})
        assert other_site.status_code == 403  # type: ignore[attr-defined]
        import httpx

        image = (run.parent / "photos" / "a.png").read_bytes()
        assert httpx.post(served.url + "api/upload?name=x.png", content=image, timeout=60).status_code == 200
        assert list((tmp_path / "tmp").glob("gradcam-serve-*/uploads/*"))
    finally:
        code, errors = served.stop(number)
    assert code == 130 and errors.strip().splitlines()[-1] == "error: interrupted", errors
    assert list((tmp_path / "tmp").iterdir()) == []  # the uploads went with the server's folder
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    assert [p.name for p in run.iterdir() if p.name.endswith(".sqlite")] == [".manifest.jsonl.gradcam-index.sqlite"]


@pytest.mark.slow
def test_a_folder_of_photos_with_a_boxes_csv_is_served_as_images(tmp_path):
    folder = photos(tmp_path / "photos", ("a.png", "b.png"))
    (folder / "boxes.csv").write_text("image,x1,y1,x2,y2,label\na.png,4,4,20,20,red\n")
    served = Served([str(folder), *MODEL], tmp_path, tmp_path / "tmp")
    try:
        info = served.get("api/info").json()  # type: ignore[attr-defined]
        assert info["run"] is None and info["inputs"] == 2
        names = [i["name"] for i in served.get("api/images").json()["images"]]  # type: ignore[attr-defined]
        assert [Path(n).name for n in names] == ["a.png", "b.png"]
    finally:
        code, errors = served.stop(signal.SIGTERM)
    assert code == 130
    assert (
        f"{folder / 'boxes.csv'}: not a gradcam manifest" in errors and "no gradcam run; serving its images" in errors
    )


def serve_command(*args: str) -> tuple[int, str]:
    from gradcam_cli.cli.serve import app

    result = CliRunner().invoke(app, [*args, "--port", "0"])
    return result.exit_code, result.output


@pytest.mark.quick
def test_what_is_no_run_is_refused_or_served_as_images(tmp_path):
    from gradcam_cli.serve.runs import sort_paths

    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("hello\n")
    code, output = serve_command(str(garbage))
    assert code == 2 and output == f"error: PATH {garbage}: not a gradcam manifest (line 1 is not a manifest row); " \
        "give a run's output folder or its manifest\n"  # fmt: skip
    two = tmp_path / "two"
    for name in ("a.jsonl", "b.jsonl"):
        (two / name).parent.mkdir(exist_ok=True)
        (two / name).write_text(json.dumps({"input": "x.png", "status": "ok", "outputs": []}) + "\n")
    code, output = serve_command(str(two))
    assert code == 2 and "several manifests in this folder (a.jsonl, b.jsonl); name the one to serve" in output
    assert "compare" not in output
    served = sort_paths([str(tmp_path)])  # a folder with a garbage .jsonl and no run record: images
    assert served.run is None and served.images == [str(tmp_path)]
    assert any("garbage.jsonl: not a gradcam manifest" in note for note in served.notes)
    code, output = serve_command(str(two / "a.jsonl"), "--drift", "/etc/passwd")
    assert code == 2 and output.startswith("error: --drift /etc/passwd: not a gradcam diff --json result")
    code, output = serve_command(str(tmp_path / "x.png"), "--drift", str(garbage))
    assert code == 2 and "--drift" in output


def drift_file(path: Path, drifting: list[str], compared: list[str]) -> Path:
    path.write_text(json.dumps({"drifting": drifting, "pairs": [{"input": name} for name in compared]}))
    return path


def test_the_index_follows_the_drift_file_it_was_built_with(tmp_path, monkeypatch):
    run = make_run(tmp_path / "project", monkeypatch, ("a.png", "b.png"))
    manifest = run / "manifest.jsonl"
    drifted = drift_file(tmp_path / "d.json", ["photos/a.png"], ["photos/a.png"])
    clear = drift_file(tmp_path / "clear.json", [], ["photos/a.png"])

    def statuses(drift: Path | None) -> dict[str, str | None]:
        app = create_app(None, run_dir=run, manifest=manifest, drift=drift, work_dir=tmp_path / "work")
        with TestClient(app, base_url=LOCAL) as client:
            return {r["input"]: r["drift"] for r in client.get("/api/run/rows").json()["rows"]}

    assert statuses(drifted)["photos/a.png"] == "drift"
    assert statuses(None)["photos/a.png"] is None  # restarted without --drift: no stale status
    assert statuses(drifted)["photos/a.png"] == "drift"
    assert statuses(clear)["photos/a.png"] == "ok"  # an all-clear file
    app = create_app(None, run_dir=run, manifest=manifest, drift=clear, work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as client:
        drift_file(clear, ["photos/a.png"], ["photos/a.png"])  # the file changed while serving
        os.utime(clear, ns=(1, 1))
        rows = client.get("/api/run/rows").json()["rows"]
        assert {r["input"]: r["drift"] for r in rows}["photos/a.png"] == "drift"
    for bad in (Path("/etc/passwd"), tmp_path / "none.json"):
        with pytest.raises(Exception, match="--drift"):
            create_app(None, run_dir=run, manifest=manifest, drift=bad, work_dir=tmp_path / "work")
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_a_name_that_is_not_utf8_is_served_escaped(tmp_path, monkeypatch):
    run = make_run(tmp_path / "project", monkeypatch)
    monkeypatch.chdir(tmp_path)  # elsewhere: the run record's cwd finds the files
    app = create_app(None, [], run_dir=run, manifest=run / "manifest.jsonl", work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as client:
        rows = client.get("/api/run/rows?q=bad").json()["rows"]
        assert [r["input"] for r in rows] == ["photos/bad\\xff.png"]
        assert rows[0]["outputs"][0].startswith("out/bad\\xff_")
        assert client.get(f"/api/run/rows/{rows[0]['row']}/outputs/0").status_code == 200
        assert client.get(f"/api/images/r{rows[0]['row']}.png").status_code == 200
    from gradcam_cli.io.discovery import discover

    app = create_app(None, discover([run.parent / "photos"]), work_dir=tmp_path / "work2")
    with TestClient(app, base_url=LOCAL) as client:
        names = [i["name"] for i in client.get("/api/images").json()["images"]]
        assert sorted(Path(n).name for n in names) == ["a.png", "bad\\xff.png"]


@pytest.mark.slow
def test_a_yolo_models_default_layer_is_given_its_own_reason(tmp_path):
    pytest.importorskip("ultralytics")
    import yaml
    from yolo_model import tiny_config

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config()), encoding="utf-8")
    folder = photos(tmp_path / "photos", ("a.png",))
    model = ["--model", f"yolo:{tmp_path / 'tiny.yaml'}", "--weights", "none", "--input-size", "64"]
    served = Served([str(folder), *model], tmp_path, tmp_path / "tmp")
    code, errors = served.stop(signal.SIGTERM)
    assert code == 130
    assert "(the feature maps entering the head; choose with --layer)" in errors, errors


def test_a_record_without_cwd_finds_the_run_from_its_outputs(tmp_path, monkeypatch):
    run = make_run(tmp_path / "project", monkeypatch, ("a.png",))
    record = json.loads((run / ".gradcam-run.json").read_text())
    assert record["cwd"] == str(tmp_path / "project")
    del record["cwd"]  # as an older version wrote it
    (run / ".gradcam-run.json").write_text(json.dumps(record))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    app = create_app(None, run_dir=run, manifest=run / "manifest.jsonl", work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/api/run/rows/0/outputs/0").status_code == 200
        assert client.get("/api/images/r0.png").status_code == 200
