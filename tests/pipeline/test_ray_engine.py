"""``--engine ray``: the same outputs as a local run, on a local Ray instance started here (2 CPUs, a small object
store, the colour-square model, a dozen small images). Bad files are error rows, ``--skip-existing`` and the exit
codes behave as locally, and every image ticks the progress once.

The tests that start Ray are marked slow (starting Ray and its actors takes several seconds); they run in
``make test``. Without Ray installed they are skipped, and the checks that need no cluster still run.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import assert_outputs_agree, assert_rows_agree, comparable
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, GradcamError, ModelLoadError, UsageError
from gradcam_cli.io.discovery import discover
from gradcam_cli.options import ExplainOptions, ModelOptions, OutputOptions, RunOptions
from gradcam_cli.pipeline.ray_engine import (
    SINGLE_MACHINE,
    ClusterError,
    actor_pool,
    cluster_error,
    connect,
    driver_explainer,
    import_ray,
)
from gradcam_cli.pipeline.session import Session

ROOT = Path(__file__).resolve().parents[2]
SQUARE_MODEL = f"{ROOT / 'tests' / 'square_model.py'}:build"
SHAPES = [(120, 80), (80, 120), (96, 96)]
PERCENT = re.compile(r"(?<=\()(\d+\.\d)(?=%\))")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """Nine images of three shapes in a small tree, one file that is no image, and a labels file."""
    folder = tmp_path / "in"
    for i in range(9):
        where = folder / ("sub" if i % 2 else "")
        where.mkdir(parents=True, exist_ok=True)
        square_image(SHAPES[i % 3], (10, 10 + i, 40, 40 + i), ["red", "green", "blue"][i % 3]).save(where / f"{i}.png")
    (folder / "broken.png").write_bytes(b"not an image")
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    return folder


@pytest.fixture(autouse=True)
def not_deterministic() -> Iterator[None]:
    """PyTorch's deterministic mode off in this process too, as in the actors' (another test may have left it on):
    the local and the Ray runs' provenance must agree."""
    torch.use_deterministic_algorithms(False)
    yield


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[object]:
    """A local Ray instance for this module: 2 CPUs, no dashboard, an 80 MB object store, on the loopback only
    (imported as gradcam imports it, or after it did)."""
    if "ray" not in sys.modules:
        os.environ[SINGLE_MACHINE] = "0"
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gradcam-cli[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'gradcam-cli[ray]')")
    assert ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback, "Ray was imported off the loopback"
    saved = os.environ.get("RAY_BACKEND_LOG_LEVEL")
    os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        log_to_driver=False,
        logging_level="ERROR",
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_BACKEND_LOG_LEVEL", None)
        else:
            os.environ["RAY_BACKEND_LOG_LEVEL"] = saved


def gradcam(photos: Path, out: Path, *more: str | Path):
    args = [photos, "-m", SQUARE_MODEL, "--labels", photos.parent / "labels.txt", "--workers", "0", "-o", out]
    return CliRunner().invoke(app, [str(a) for a in [*args, *more]])


def errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_ray_run_writes_what_a_local_run_writes(photos, tmp_path, ray_instance):
    local, remote = tmp_path / "local", tmp_path / "remote"
    common = ["--save-raw", "--report", "--batch-size", "2"]
    here = gradcam(photos, local, *common, "--manifest", local / "m.jsonl")
    there = gradcam(photos, remote, *common, "--manifest", remote / "m.jsonl", "--engine", "ray")
    assert here.exit_code == there.exit_code == EXIT_IMAGE_FAILED, there.output  # broken.png, on both
    assert errors(there) == errors(here) == [f"error: {photos / 'broken.png'}: not an image Pillow can read"]
    # one line per image, in input order; the same to float rounding (docs/scale.md), as the rows, maps and overlays
    assert PERCENT.sub("", there.stdout) == PERCENT.sub("", here.stdout.replace(str(local), str(remote)))
    shown = [[float(p) for p in PERCENT.findall(result.stdout)] for result in (there, here)]
    assert shown[0] == pytest.approx(shown[1], abs=0.11)
    assert_rows_agree(comparable(remote / "m.jsonl", remote), comparable(local / "m.jsonl", local))
    assert_outputs_agree(remote, local, 9)
    assert (remote / "index.html").is_file()

    resumed = gradcam(photos, remote, *common, "--manifest", remote / "m.jsonl", "--engine", "ray", "--skip-existing")
    assert resumed.exit_code == EXIT_IMAGE_FAILED  # broken.png is tried again, and fails again
    rows = [json.loads(line) for line in (remote / "m.jsonl").read_text().splitlines()]
    assert [(row["input"], row["status"]) for row in rows] == [
        (str(image.path), "error" if image.path.name == "broken.png" else "skipped") for image in discover([photos])
    ]


@pytest.mark.slow
def test_a_yolo_run_and_a_target_run_on_ray_write_what_local_runs_write(checkpoint, photos, tmp_path, ray_instance):
    pytest.importorskip("ultralytics", reason="the [yolo] extra is not installed")
    from yolo_model import square_scene

    scenes = tmp_path / "scenes"
    scenes.mkdir()
    for k, boxes in enumerate([[(0, 8, 8, 32, 32), (1, 36, 30, 60, 54)], [(1, 10, 10, 40, 40)]]):
        square_scene(boxes).save(scenes / f"scene{k}.png")
    runs = {  # (inputs, options): a YOLO model's detections, and a --target (a contrast) on the square model
        "yolo": (scenes, ["-m", f"yolo:{checkpoint}", "--workers", "0", "--batch-size", "1"]),
        "target": (photos, ["-m", SQUARE_MODEL, "--labels", photos.parent / "labels.txt", "--workers", "0"]),
    }
    for name, (inputs, options) in runs.items():
        if name == "target":
            options = [*options, "--target", "contrast:red,blue"]
        local, remote = tmp_path / name / "local", tmp_path / name / "remote"
        for out, engine in ((local, []), (remote, ["--engine", "ray"])):
            arguments = [inputs, *options, "--save-raw", "-o", out, "--manifest", out / "m.jsonl", *engine]
            ran = CliRunner().invoke(app, [str(a) for a in arguments])
            assert ran.exit_code in (0, EXIT_IMAGE_FAILED), ran.output  # the photos hold broken.png
        rows = comparable(local / "m.jsonl", local)
        assert_rows_agree(comparable(remote / "m.jsonl", remote), rows)
        assert_outputs_agree(remote, local, len(list(local.rglob("*.npy"))))
        if name == "yolo":
            assert {row["target"]["name"] for row in rows} == {"red", "blue"} and len(rows) >= 3
        else:
            assert {row["target"]["name"] for row in rows if row["status"] == "ok"} == {"red - blue"}


@pytest.mark.slow
def test_an_attention_run_on_ray_writes_what_a_local_run_writes(photos, tmp_path, ray_instance):
    """rollout and attn-grad on a tiny timm ViT (tests/attention_models.py, at --input-size 32,32: a 4 x 4 patch
    grid for every shape): the actors' maps, rows and overlays equal a local run's."""
    vit = f"{ROOT / 'tests' / 'attention_models.py'}:build_vit"
    options = ["-m", vit, "--input-size", "32,32", "--method", "rollout,attn-grad", "-t", "1", "--workers", "0"]
    local, remote = tmp_path / "local", tmp_path / "remote"
    for out, engine in ((local, []), (remote, ["--engine", "ray"])):
        arguments = [photos, *options, "--save-raw", "-o", out, "--manifest", out / "m.jsonl", *engine]
        ran = CliRunner().invoke(app, [str(a) for a in arguments])
        assert ran.exit_code == EXIT_IMAGE_FAILED, ran.output  # broken.png
    rows = comparable(local / "m.jsonl", local)
    assert_rows_agree(comparable(remote / "m.jsonl", remote), rows)
    assert {row["method"] for row in rows if row["status"] == "ok"} == {"rollout", "attn-grad"}
    assert_outputs_agree(remote, local, 18)  # 9 images, 2 methods


@pytest.mark.slow
def test_every_image_ticks_the_progress_once_and_every_row_has_the_actors_provenance(photos, tmp_path, ray_instance):
    out = tmp_path / "out"
    ticks: list[bool] = []

    @contextmanager
    def progress(_label: str, total: int):
        assert total == 10
        yield lambda skipped=False: ticks.append(skipped)

    model = ModelOptions(SQUARE_MODEL, labels=photos.parent / "labels.txt")
    with Session(OutputOptions(out), RunOptions(engine="ray", batch_size=4)) as session:
        explainer = driver_explainer(model, ExplainOptions())
        records = list(session.explain(explainer, discover([photos], exclude=out), progress=progress))
    assert ticks == [False] * 10
    assert [(record.input, record.status) for record in records] == [
        (str(image.path), "error" if image.path.name == "broken.png" else "ok") for image in discover([photos])
    ]
    (provenance,) = {json.dumps(record.provenance, sort_keys=True) for record in records}  # the actors' own
    assert json.loads(provenance)["device"] == "cpu" and json.loads(provenance)["deterministic"] is False
    assert session.counts.ok == 9 and session.counts.error == 1


def test_videos_are_refused_before_anything_starts(photos, tmp_path):
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    result = gradcam(clip, tmp_path / "out", "--engine", "ray")
    assert result.exit_code == 2
    assert errors(result) == [f"error: --engine ray explains images only; {clip} is a video: run videos without it"]


def test_without_ray_the_engine_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails, as where it is not installed
    with pytest.raises(UsageError, match=r"^--engine ray needs Ray: pip install 'gradcam-cli\[ray\]'$"):
        import_ray()


def test_a_gradcam_error_in_an_actor_keeps_its_message_and_exit_code():
    class ActorDied(Exception):
        """Ray's error: the actor's own error as its cause."""

        def __init__(self, cause: BaseException) -> None:
            super().__init__("ray::MapWorker(MapBatches(ExplainActor)).__init__() (pid=1, ip=10.0.0.2)\n...")
            self.cause = cause

    failed = cluster_error(ActorDied(ModelLoadError("cannot load weights w.pth: no such file")))
    assert isinstance(failed, ModelLoadError) and str(failed) == "cannot load weights w.pth: no such file"
    as_text = RuntimeError(
        "The actor died because of an error raised in its creation task, \x1b[36mray::MapWorker()\x1b[39m\n"
        '  File "ray_engine.py", line 9, in __init__\n'
        "gradcam_cli.errors.ModelLoadError: cannot load weights w.pth: no such file\n"
    )
    failed = cluster_error(as_text)  # an actor's start-up error reaches the driver as text only
    assert isinstance(failed, ModelLoadError) and str(failed) == "cannot load weights w.pth: no such file"
    other = cluster_error(RuntimeError("the cluster went away"))
    assert isinstance(other, ClusterError) and isinstance(other, GradcamError)
    assert str(other) == "the Ray job failed: the cluster went away" and other.exit_code == EXIT_IMAGE_FAILED


def test_ray_options_without_the_ray_engine_are_one_line(photos, tmp_path):
    result = gradcam(photos, tmp_path / "out", "--actors", "2")
    assert result.exit_code == 2
    assert result.stderr == "error: --actors is for --engine ray; add --engine ray or leave it out\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_actor_that_cannot_start_ends_the_run_with_its_own_one_line_error(
    photos, tmp_path, ray_instance, monkeypatch
):
    from gradcam_cli import __version__
    from gradcam_cli.pipeline import ray_engine

    monkeypatch.setattr(ray_engine, "__version__", "9.9.9")  # this command's version; the actors keep theirs
    result = gradcam(photos, tmp_path / "out", "--engine", "ray", "-q")
    assert result.exit_code == 2
    assert result.stderr == f"error: the Ray workers run gradcam-cli {__version__}, this command 9.9.9; install one\n"
    assert result.stdout == ""


def test_a_local_instance_is_never_started_off_the_loopback(monkeypatch):
    """Where Ray was imported before gradcam could keep a new instance on the loopback, none is started."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_BACKEND_LOG_LEVEL", "fatal")  # as connect sets it (restored after the test)
    started: list[object] = []

    class Util:
        @staticmethod
        def get_node_ip_address() -> str:
            return "192.0.2.7"  # what Ray takes for this machine's address then

    class Ray:
        util = Util

        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(**options: object) -> None:
            started.append(options)
            raise ConnectionError("no cluster there")

    with pytest.raises(UsageError, match=r"^a local Ray instance would listen on 192\.0\.2\.7, reachable from"):
        connect(Ray, None)
    assert started == []
    with pytest.raises(UsageError, match=r"^--ray-address ray://head:10001: cannot connect or start a cluster"):
        connect(Ray, "ray://head:10001")  # a cluster's address: tried, its security is the cluster's
    assert len(started) == 1


def test_the_actor_pool_leaves_a_cpu_to_decode_and_has_no_idle_actors():
    """Each actor takes a CPU and decoding needs one more: with none left the run would wait for ever (measured: a
    local instance of 2 CPUs, --actors 2, 40 images, nothing written in 4 minutes)."""
    cpu_only = RunOptions(engine="ray", batch_size=1)  # 4 images per call
    assert actor_pool({"CPU": 5.0}, cpu_only, "cpu", 40) == (2, 0.0, 4)  # one per two CPUs
    assert actor_pool({"CPU": 5.0}, replace(cpu_only, actors=4), "cpu", 40) == (4, 0.0, 4)
    assert actor_pool({"CPU": 2.0}, replace(cpu_only, actors=2), "cpu", 3) == (1, 0.0, 4)  # one call: one actor
    with pytest.raises(
        UsageError,
        match=r"^the Ray cluster has 2 CPUs: 2 actors would take them all and leave "
        r"none to decode the images; give --actors 1 or fewer$",
    ):
        actor_pool({"CPU": 2.0}, replace(cpu_only, actors=2), "cpu", 40)
    with pytest.raises(UsageError, match=r"^the Ray cluster has 1 of the 2 CPUs it needs \(one for an actor, one"):
        actor_pool({"CPU": 1.0}, cpu_only, "cpu", 40)
    gpus = {"CPU": 8.0, "GPU": 2.0}
    assert actor_pool(gpus, RunOptions(engine="ray"), "cuda", 1000) == (2, 1.0, 64)  # one per GPU, 16 per batch
    assert actor_pool(gpus, RunOptions(engine="ray", gpus_per_worker=0.5), "cuda", 1000) == (4, 0.5, 64)


@pytest.mark.slow
def test_a_pool_that_would_leave_no_cpu_to_decode_is_one_line(photos, tmp_path, ray_instance):
    result = gradcam(photos, tmp_path / "out", "--engine", "ray", "--actors", "2", "--batch-size", "1")
    assert result.exit_code == 2
    assert errors(result) == [
        "error: the Ray cluster has 2 CPUs: 2 actors would take them all and leave none to decode the images; "
        "give --actors 1 or fewer"
    ]
    assert result.stdout == "" and not list((tmp_path / "out").glob("*.png"))
