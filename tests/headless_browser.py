"""Headless Chromium for the tests of the pages gradcam writes (the gallery, the drift and ranking reports):
the ``chromium`` fixture (in conftest) finds it, :func:`browse` loads a page in it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HANG_GUARD = 600


def find_chromium() -> str:
    """Headless Chromium: ``make install`` installs Debian's package when it runs as root on Debian."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(
            "headless Chromium is not installed: run `make install` as root on Debian (it installs Debian's chromium) "
            "or install Chromium yourself and put `chromium` on PATH"
        )
    return path


def browse(chromium: str, tmp_path: Path, url: str, *extra: str) -> str:
    """``url``'s page in headless Chromium (``extra``: its flags: ``--dump-dom``, ``--screenshot=...``), with a fresh
    profile under ``tmp_path`` and the flags that keep it off the network; what it printed."""
    profile = tempfile.mkdtemp(prefix="profile-", dir=tmp_path)  # a fresh one per run
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *extra,
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
