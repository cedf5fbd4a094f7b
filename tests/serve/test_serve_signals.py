"""``gradcam serve`` stopped while a client is slowly uploading (issue 41, item 15): SIGTERM stops it at once, the
upload answered 503 (the server is stopping), and a second signal on top changes nothing: no traceback, no 500.

Deterministic: the client asks ``Expect: 100-continue``, so the server's ``100 Continue`` says the upload's handler
is reading the body; the signals are sent only then, and every wait has a generous hang guard, never a timing."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from test_serve import ROOT, write_run

GUARD = 60.0
"""Seconds any step may take before the test calls it a hang (the fixed server needs well under one)."""


def started(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """``gradcam serve`` of a small run on a free port, once it prints its URL; and the port."""
    run = write_run(tmp_path / "out", 3)
    model = ["--model", str(ROOT / "tests" / "square_model.py:build"), "--weights", "none"]
    command = [sys.executable, "-m", "gradcam_cli", "serve", str(run), *model, "--port", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 120)
    line = process.stdout.readline() if ready else ""
    assert line.startswith("serving on http://127.0.0.1:"), line
    return process, int(line.split()[2].rstrip("/").rsplit(":", 1)[1])


def uploading(port: int) -> socket.socket:
    """A connection in the middle of an upload: headers of a 100,000-byte body, the server's ``100 Continue``
    received (its handler reads the body), then 1,000 bytes of it."""
    client = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
    head = (
        f"POST /api/upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n"
        "Content-Type: application/octet-stream\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n"
    )
    client.sendall(head.encode())
    continued = b""
    while b"\r\n\r\n" not in continued:
        chunk = client.recv(1024)
        assert chunk, "the server closed the connection before 100 Continue"
        continued += chunk
    assert continued.startswith(b"HTTP/1.1 100 "), continued
    client.sendall(b"\0" * 1000)
    return client


def answer(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_during_a_slow_upload_stops_the_server_at_once(tmp_path, signals):
    process, port = started(tmp_path)
    try:
        client = uploading(port)
        for _ in range(signals):
            process.send_signal(signal.SIGTERM)
        received = answer(client)  # the server does not wait for the rest of the body
        assert process.wait(timeout=GUARD) == 130
        status = received.split(b"\r\n", 1)[0]
        assert status == b"HTTP/1.1 503 Service Unavailable", received
        assert b"the server is stopping" in received
        stderr = process.stderr.read() if process.stderr else ""
        assert "Traceback" not in stderr and "Exception" not in stderr, stderr
        assert stderr.strip().splitlines()[-1] == "error: interrupted", stderr
    finally:
        process.kill()
        process.wait()
