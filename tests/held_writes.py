"""Run ``gradcam`` with its file writes held at a known point, so that a test can stop a run midway (SIGKILL,
Ctrl-C) for certain, however fast or slow the machine is:

    python held_writes.py READY_FD RELEASE_FD AFTER GRADCAM_ARGUMENT...

AFTER a number: the first AFTER output files are written as usual. Every later one has its bytes written (to an
unnamed ``O_TMPFILE`` file) but is not linked in under its name until RELEASE_FD is readable (a byte, or its end
when the test closes it). Once AFTER files are in place and a later one is held, one byte goes to READY_FD: from
then on the run cannot finish until released.

AFTER ``HOLD:UNTIL:ROWS`` (two ``fnmatch`` patterns of file names and a number): the files whose names match HOLD
are held, every other one is written as usual; the byte goes to READY_FD once one is held, a file matching UNTIL is
in place and ROWS manifest rows are written. So ``im02_*:im03_*:2`` stops a run with the rows of images 0 and 1 in
its manifest, image 3's files written (its row waits for image 2's) and image 2's not, whatever the timing.

If the run writes no unnamed files (no ``O_TMPFILE``), nothing is held and READY_FD closes unwritten when the run
ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from fnmatch import fnmatchcase
from pathlib import Path

from gradcam_cli.cli import main
from gradcam_cli.io import atomic
from gradcam_cli.io.manifest import ManifestWriter

ready_fd, release_fd = int(sys.argv[1]), int(sys.argv[2])
after = int(sys.argv[3]) if sys.argv[3].isdigit() else None
hold, _, until = sys.argv[3].partition(":")
until, _, rows = until.partition(":")
released = threading.Event()
lock = threading.Lock()
counts = {"entered": 0, "linked": 0, "held": 0, "until": 0, "rows": 0}
link_unnamed = atomic._link_unnamed
write_row = ManifestWriter.write


def wait_for_release() -> None:
    os.read(release_fd, 1)
    released.set()


def tell_when_midway() -> None:
    """Under ``lock``: one byte to READY_FD once AFTER files (or one matching UNTIL, and ROWS rows) are in place
    and a later one is held."""
    midway = counts["linked"] == after if after is not None else counts["until"] and counts["rows"] >= int(rows or 0)
    if midway and counts["held"] and not counts.get("told"):
        os.write(ready_fd, b"r")
        counts["told"] = 1


def held_link(fd: int, path: Path) -> bool:
    with lock:
        counts["entered"] += 1
        held = counts["entered"] > after if after is not None else fnmatchcase(path.name, hold)
        counts["held"] += held
        tell_when_midway()
    if held:
        released.wait()
        return link_unnamed(fd, path)
    linked = link_unnamed(fd, path)
    with lock:
        counts["linked"] += 1
        counts["until"] += after is None and fnmatchcase(path.name, until)
        tell_when_midway()
    return linked


def counted_write(writer: ManifestWriter, row: dict) -> None:
    write_row(writer, row)
    with lock:
        counts["rows"] += 1
        tell_when_midway()


# Ctrl-C as at a terminal, even when the tests run in a background job that ignores SIGINT (a shell without job
# control starts its background commands so, and they pass that on): gradcam leaves an ignored SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Thread(target=wait_for_release, daemon=True).start()
atomic._link_unnamed = held_link
ManifestWriter.write = counted_write
sys.argv = ["gradcam", *sys.argv[4:]]
main()
