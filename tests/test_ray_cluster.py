"""``--engine ray`` on real Ray instances on this machine, run as users run it (``python -m gradcam_cli`` in a
subprocess), every Ray service on the loopback:

- the local instance that gradcam starts itself listens on 127.0.0.1 only (Ray's services have no authentication
  but a token: anyone who reaches them runs code), and stops with the run;

Each starts Ray (tens of seconds on two busy cores): marked slow. Every Ray process a test starts is in a process
group of its own, which the test kills at the end whatever happened.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ray_cluster import listening
from square_model import square_image

from gradcam_cli.io.discovery import discover
from gradcam_cli.pipeline.ray_engine import SINGLE_MACHINE

ROOT = Path(__file__).resolve().parent.parent
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
        left = listening(run.pid)
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
