"""Which requests the explorer answers: :class:`SameOrigin`, the middleware that refuses another site's requests
(and, on a loopback address, other host names), and adds the security headers to every answer."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from .http import error_response
from .server import is_loopback

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; style-src 'self'; object-src 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

OPEN_PATHS = ("/",)
"""What another site may link to: the page itself (a link opens it). Everything else, GET included (an ``<img>`` of
``/api/map`` on another site's page would run the model), answers only the page's own origin."""


class SameOrigin:
    """Refuse (403) a request from another site: a ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (a
    typed address), or an ``Origin`` other than the page's own, for every path but :data:`OPEN_PATHS` and for every
    method (clients that send neither header, such as curl, are not browsers on another site's page); with
    ``local`` (the app listens on a loopback address) also any request whose ``Host`` is not a loopback name (DNS
    rebinding: another site's name pointed at 127.0.0.1). Adds the security headers to every answer."""

    def __init__(self, app: ASGIApp, local: bool = True) -> None:
        self.app, self.local = app, local

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if self.local and not is_loopback(host_name(request.headers.get("host", ""))):
            await error_response(403, "this server answers only to 127.0.0.1 and localhost")(scope, receive, send)
            return
        if request.method not in ("GET", "HEAD") or request.url.path not in OPEN_PATHS:
            origin = request.headers.get("origin")
            host = request.headers.get("host", "")
            fetch_site = request.headers.get("sec-fetch-site")
            if (origin is not None and origin not in (f"http://{host}", f"https://{host}")) or fetch_site in (
                "cross-site",
                "same-site",
            ):
                await error_response(403, "cross-origin requests are refused")(scope, receive, send)
                return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                for key, value in SECURITY_HEADERS.items():
                    message["headers"].append((key.lower().encode(), value.encode()))
            await send(message)

        await self.app(scope, receive, with_headers)


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:80`` -> ``::1``)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
