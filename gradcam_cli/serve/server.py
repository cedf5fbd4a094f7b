"""Running the explorer's app on uvicorn: a socket bound first (port 0: a free one), so that the URL is known and
printed before the first request, then uvicorn until Ctrl-C (which it turns back into ``KeyboardInterrupt`` once
it has shut down, so that the command exits with 130 as every command does)."""

from __future__ import annotations

import ipaddress
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

from starlette.types import ASGIApp

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port), with Nagle's algorithm off."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # inherited by every accepted connection: without it, a small answer written in two parts (headers, body) waits
    # for the client's delayed acknowledgement, 40 ms per request on Linux
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    """The page's URL for a bound socket."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(app: ASGIApp, sock: socket.socket, on_started: Callable[[], None] | None = None) -> None:
    """Serve ``app`` on ``sock`` until interrupted; ``on_started`` runs once uvicorn accepts connections. Uvicorn
    shuts down on SIGINT and SIGTERM, then raises the signal again; SIGHUP, where it means Ctrl-C (the command
    line's :mod:`~gradcam_cli.cli.signals`), shuts it down alike. The app's ``state.stopping`` flag (a
    :class:`threading.Event`, where it has one) is set at the first of them: a request body still arriving is
    answered at once (:func:`~gradcam_cli.serve.http.read_body`), as uvicorn waits for every open request."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    stopping = getattr(getattr(app, "state", None), "stopping", None)
    if isinstance(stopping, threading.Event):
        told = server.handle_exit

        def handle_exit(sig: int, frame: FrameType | None) -> None:
            stopping.set()
            told(sig, frame)

        server.handle_exit = handle_exit  # type: ignore[method-assign]
    if on_started is not None:
        original = server.startup

        async def startup(sockets: list[socket.socket] | None = None) -> None:
            await original(sockets)
            on_started()

        server.startup = startup  # type: ignore[method-assign]
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is None or signal.getsignal(hangup) is not signal.default_int_handler:
        server.run(sockets=[sock])
        return

    def on_hangup(_signum: int, frame: FrameType | None) -> None:
        server.handle_exit(signal.SIGTERM, frame)  # raised again after the shutdown: KeyboardInterrupt

    signal.signal(hangup, on_hangup)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(hangup, signal.default_int_handler)
