"""``--engine ray`` on real Ray instances on this machine, run as users run it (``python -m gradcam_cli`` in a
subprocess), every Ray service on the loopback:

- the local instance that gradcam starts itself listens on 127.0.0.1 only (Ray's services have no authentication
  but a token: anyone who reaches them runs code), and stops with the run;
- a run on a two-node cluster (tests/ray_cluster.py) whose second node's raylet is killed while an actor there is
  in the middle of a batch either completes through Ray's retries (no image lost, none twice) or ends with
  ``error: the Ray job failed: ...``; either way stdout holds result lines only, and a rerun with
  ``--skip-existing`` ends with every image's full row and the maps of a local run (docs/scale.md).

Each starts Ray (tens of seconds on two busy cores): marked slow. Every Ray process a test starts is in a process
group of its own, which the test kills at the end whatever happened.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import assert_outputs_agree, assert_rows_agree, comparable
from ray_cluster import listening
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.io.discovery import discover
from gradcam_cli.pipeline.ray_engine import SINGLE_MACHINE

ROOT = Path(__file__).resolve().parents[2]
HELD_MODEL = f"{ROOT / 'tests' / 'ray_cluster.py'}:held"
HANG_GUARD = 600
"""Seconds a step may take before a test gives up: a guard against hangs, never a measure of speed."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads sockets from Linux's /proc"),
]


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short folder under /tmp (Ray's Unix sockets live in its temp folder, and their paths must stay short)."""
    if importlib.util.find_spec("ray") is None:  # not imported here: this process never starts Ray
        pytest.skip("Ray is not installed (pip install 'gradcam-cli[ray]')")
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="gcr"))
    (folder / "ray").mkdir()  # RAY_TMPDIR/ray: Ray's own files (the address of the last instance) stay here
    (folder / "gate").mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def photos(folder: Path, count: int, broken: bool = False) -> list[Path]:
    """``count`` small images of one shape (one model batch per image), and a file that is no image."""
    folder.mkdir()
    for i in range(count):
        square_image((64, 48), (8, 8 + i % 20, 30, 30 + i % 20), ["red", "green", "blue"][i % 3]).save(
            folder / f"{i:02d}.png"
        )
    if broken:
        (folder / "broken.png").write_bytes(b"not an image")
    return [image.path for image in discover([folder])]


def command(inputs: Path, out: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gradcam_cli", str(inputs), "-m", HELD_MODEL, "-o", str(out), "--workers", "0", *more]


def spawn(arguments: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen:
    """Start ``arguments`` as the leader of a new session, stdout and stderr into files in ``logs``."""
    with (logs / "stdout").open("w") as stdout, (logs / "stderr").open("w") as stderr:
        return subprocess.Popen(arguments, env=env, stdout=stdout, stderr=stderr, start_new_session=True)


def wait_for(done: Callable[[], bool], what: str, process: subprocess.Popen) -> None:
    """Poll until ``done()``; fail if ``process`` ends first or after the hang guard."""
    start = time.monotonic()
    while not done():
        if process.poll() is not None:
            pytest.fail(f"the run ended (exit code {process.returncode}) before {what}")
        if time.monotonic() - start > HANG_GUARD:
            pytest.fail(f"waited {HANG_GUARD} s for {what}")
        time.sleep(0.1)


def stop(process: subprocess.Popen) -> None:
    """Kill what is left of ``process``'s group (it leads its own session): every Ray process it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def test_a_local_instance_that_gradcam_starts_listens_on_the_loopback_only(scratch):
    images = photos(scratch / "in", 2)
    gate = scratch / "gate"
    env = {name: value for name, value in os.environ.items() if name not in (SINGLE_MACHINE, "RAY_ADDRESS")}
    env.update(GRADCAM_TEST_GATE=str(gate), RAY_TMPDIR=str(scratch))  # gradcam itself must keep Ray on 127.0.0.1
    out = scratch / "out"
    run = spawn(command(scratch / "in", out, "--engine", "ray"), env, scratch)
    try:
        wait_for(lambda: any(gate.glob("held-*")), "an actor had started explaining", run)
        sockets = listening(run.pid)  # Ray's services, the driver and the workers, all up while the actor waits
        (gate / "open").touch()
        run.wait(timeout=HANG_GUARD)
        deadline = time.monotonic() + HANG_GUARD
        while (left := listening(run.pid)) and time.monotonic() < deadline:  # Ray's processes end with the run
            time.sleep(0.1)
    finally:
        (gate / "open").touch()
        stop(run)
    assert run.returncode == 0, (scratch / "stderr").read_text()
    names = {name for _, _, name in sockets}
    assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::") for name in names), sockets
    assert [socket for socket in sockets if not loopback(socket[0])] == []
    assert left == []  # the instance stopped with the run
    stdout = (scratch / "stdout").read_text().splitlines()
    assert [line.split(": ")[0] for line in stdout] == [str(image) for image in images]


def test_losing_a_node_mid_run_loses_no_image_and_a_rerun_completes_it(scratch):
    """Every actor starts on the second node (the head's CPUs are held until then), explains a batch and holds in
    the middle of the next when that node's raylet is killed; the head's CPUs are freed, the gate opens, and the run
    goes on where Ray can take it."""
    images = photos(scratch / "in", 20, broken=True)
    broken = str(scratch / "in" / "broken.png")
    common = ["--batch-size", "1", "--save-raw", "--manifest"]
    local, out = scratch / "local", scratch / "out"
    here = CliRunner().invoke(app, command(scratch / "in", local, *common, str(local / "m.jsonl"))[3:])
    assert here.exit_code == 1 and here.stderr.count("error:") == 1, here.output  # broken.png

    gate = scratch / "gate"
    env = {
        **os.environ,
        SINGLE_MACHINE: "0",
        "RAY_TMPDIR": str(scratch),
        "RAY_AUTH_MODE": "token",  # and no one else on this machine may use the cluster either
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "GRADCAM_TEST_GATE": str(gate),
    }
    env.pop("RAY_ADDRESS", None)
    (scratch / "cluster").mkdir()
    with (scratch / "cluster" / "stdout").open("w") as log:
        cluster = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "ray_cluster.py"), str(scratch), "3", "3"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    assert cluster.stdin is not None
    run: subprocess.Popen | None = None
    try:
        wait_for((scratch / "cluster.json").exists, "the cluster had started", cluster)
        cluster_info = json.loads((scratch / "cluster.json").read_text())
        second = cluster_info["node"]
        (gate / f"after-{second}").write_text("4")  # each actor there explains 4 images (a batch), then holds
        ray_run = command(scratch / "in", out, *common, str(out / "m.jsonl"), "--engine", "ray", "--actors", "2")
        ray_run += ["--ray-address", cluster_info["address"]]
        run = spawn(ray_run, env, scratch)
        wait_for(lambda: any(gate.glob(f"held-{second}-*")), "an actor on the second node was mid-batch", run)
        sockets = listening(cluster.pid) + listening(run.pid)  # the cluster's processes, and the driver's
        assert sockets and [socket for socket in sockets if not loopback(socket[0])] == []
        os.kill(cluster_info["raylet"], signal.SIGKILL)
        cluster.stdin.write("free\n")  # the head's CPUs, for the actors Ray starts again
        cluster.stdin.flush()
        (gate / "open").touch()
        run.wait(timeout=HANG_GUARD)

        stdout = (scratch / "stdout").read_text().splitlines()
        stderr = (scratch / "stderr").read_text()
        rows = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
        recorded = [row["input"] for row in rows]
        failed = [line for line in stderr.splitlines() if line.startswith("error: the Ray job failed: ")]
        assert run.returncode == 1, stderr  # broken.png, or the job
        assert len(recorded) == len(set(recorded)), "an image has two rows"
        assert all(line.startswith(f"{scratch / 'in'}{os.sep}") and " -> " in line for line in stdout), stdout
        assert len(stdout) == len(set(stdout)) == len([row for row in rows if row["status"] == "ok"])
        assert all(re.match(r"(using layer |done: |error: )", line) for line in stderr.splitlines()), stderr
        if failed:  # the job failed: one line says so, after what was finished is recorded
            assert len(failed) == 1 and set(recorded) <= {str(image) for image in images}, stderr
        else:  # Ray's retries finished it: every image once, in input order
            assert recorded == [str(image) for image in images]
            assert [line for line in stderr.splitlines() if line.startswith("error:")] == [
                f"error: {broken}: not an image Pillow can read"
            ]
        print(f"after the node's loss: {'the job failed' if failed else 'completed by Ray retries'}; {stderr}")

        resumed = subprocess.run(
            [*ray_run, "--skip-existing"], env=env, capture_output=True, text=True, timeout=HANG_GUARD
        )
    finally:
        (gate / "open").touch()
        if run is not None:
            stop(run)
        cluster.stdin.close()  # the cluster stops...
        try:
            cluster.wait(timeout=HANG_GUARD)
        finally:
            stop(cluster)  # ... and whatever it left is killed

    assert resumed.returncode == 1, resumed.stderr  # broken.png, tried again
    got, expected = comparable(out / "m.jsonl", out), comparable(local / "m.jsonl", local)
    assert_rows_agree(got, expected, skipped=True)  # every image once, in input order, with its full row
    assert all(row["predictions"] and row["target"] for row in got if row["input"] != broken)
    assert_outputs_agree(out, local, 20)
