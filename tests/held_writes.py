"""Run ``gradcam`` with its file writes held at a known point, so that a test can stop a run midway (SIGKILL,
Ctrl-C) for certain, however fast or slow the machine is:

    python held_writes.py READY_FD RELEASE_FD AFTER GRADCAM_ARGUMENT...

The first AFTER output files are written as usual. Every later one has its bytes written (to an unnamed
``O_TMPFILE`` file) but is not linked in under its name until RELEASE_FD is readable (a byte, or its end when the
test closes it). Once AFTER files are in place and a later one is held, one byte goes to READY_FD: from then on
the run cannot finish until released. If the run writes no unnamed files (no ``O_TMPFILE``), nothing is held and
READY_FD closes unwritten when the run ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from gradcam_cli.cli import main
from gradcam_cli.io import atomic

ready_fd, release_fd, after = (int(argument) for argument in sys.argv[1:4])
released = threading.Event()
lock = threading.Lock()
counts = {"entered": 0, "linked": 0, "held": 0}
link_unnamed = atomic._link_unnamed


def wait_for_release() -> None:
    os.read(release_fd, 1)
    released.set()


def tell_when_midway() -> None:
    """Under ``lock``: one byte to READY_FD once AFTER files are in place and a later one is held."""
    if counts["linked"] == after and counts["held"] and not counts.get("told"):
        os.write(ready_fd, b"r")
        counts["told"] = 1


def held_link(fd: int, path: Path) -> bool:
    with lock:
        counts["entered"] += 1
        held = counts["entered"] > after
        counts["held"] += held
        tell_when_midway()
    if held:
        released.wait()
        return link_unnamed(fd, path)
    linked = link_unnamed(fd, path)
    with lock:
        counts["linked"] += 1
        tell_when_midway()
    return linked


# Ctrl-C as at a terminal, even when the tests run in a background job that ignores SIGINT (a shell without job
# control starts its background commands so, and they pass that on): gradcam leaves an ignored SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Thread(target=wait_for_release, daemon=True).start()
atomic._link_unnamed = held_link
sys.argv = ["gradcam", *sys.argv[4:]]
main()
