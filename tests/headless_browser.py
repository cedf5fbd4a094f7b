"""Headless Chromium for the tests of the pages gradcam writes (the gallery, the drift and ranking reports) and of
``gradcam serve``: the ``chromium`` fixture (in conftest) finds it, :func:`browse` loads a page in it; the
``browser`` fixture (in conftest) is Playwright for Python driving it (:func:`playwright_chromium`), and
:class:`Running` serves an app on uvicorn for it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def playwright_chromium() -> Iterator[Any]:
    """Playwright for Python (the ``serve`` extra) driving Debian's headless chromium (no browser download); the test
    is skipped, with the reason, where either is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the [serve] extra) is not installed")
    path = find_chromium()
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


class Running:
    """An app on uvicorn in a thread, on a free port of 127.0.0.1."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from gradcam_cli.serve.server import bind, url_of

        self.sock = bind("127.0.0.1", 0)
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
