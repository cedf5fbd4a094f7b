"""What the explorer's routes share: errors as one-line JSON answers, typed query parameters, and the blocking work
run off the event loop.

Every failure a request can cause ends in a JSON object ``{"error": "<one line>"}`` with a 4xx status (the
request's fault: a bad parameter, an unknown image or layer, an upload that is too large or not an image) or 500
(the model failed on it); the server keeps serving either way. A request body still arriving when the server is
told to stop is answered 503 at once (:func:`read_body`), so that a slow client does not hold up the shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import GradcamError, ImageError, describe
from .names import content_disposition

T = TypeVar("T")

STOPPING_POLL = 0.1
"""Seconds between looks at the stop flag while a request body arrives (uvicorn's own look at its exit flag)."""
STOPPING = "the server is stopping; send the request again once it is back"
"""The 503 answer to a request whose body was still arriving when the server was told to stop."""


class HttpError(Exception):
    """A request that cannot be answered: ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def one_line(message: str) -> str:
    """``message`` with its line breaks (and the blanks around them) made single spaces."""
    return re.sub(r"\s*[\r\n\u2028\u2029]+\s*", " ", message).strip()


class AsciiJSONResponse(JSONResponse):
    """JSON in ASCII: every other character escaped (``\\uNNNN``), so that any text, a lone surrogate of a name
    that is not UTF-8 included, makes a valid answer."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(status: int, message: str) -> JSONResponse:
    """``{"error": message}`` on one line, with ``status``."""
    return AsciiJSONResponse({"error": one_line(message)}, status_code=status, headers={"Cache-Control": "no-store"})


def json_response(data: Any, cache: bool = False) -> JSONResponse:
    """JSON data; ``cache``: the answer never changes for this URL (an immutable map, say)."""
    control = "private, max-age=3600, immutable" if cache else "no-store"
    return AsciiJSONResponse(data, headers={"Cache-Control": control})


def bytes_response(data: bytes, media_type: str, download: str | None = None, cache: bool = True) -> Response:
    """Bytes of a file; ``download``: the file name it is saved under (any text: the header escapes it)."""
    headers = {"Cache-Control": "private, max-age=3600, immutable" if cache else "no-store"}
    if download is not None:
        headers["Content-Disposition"] = content_disposition(download)
    return Response(data, media_type=media_type, headers=headers)


def as_http_error(error: BaseException) -> HttpError:
    """The answer to an exception raised while serving: a user's mistake is 400 (an image that cannot be read 422),
    anything else the model or the code raised 500; the message is one line either way."""
    if isinstance(error, HttpError):
        return error
    if isinstance(error, ImageError):
        return HttpError(422, str(error))
    if isinstance(error, GradcamError):
        return HttpError(400, str(error))
    return HttpError(500, f"the request failed: {describe(error)}")


async def blocking(work: Callable[[], T]) -> T:
    """Run ``work`` in the thread pool (model passes, decoding, SQLite), so that the event loop keeps answering."""
    return await run_in_threadpool(work)


def guarded(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route whose failures become :func:`error_response` answers (never a traceback page)."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as error:
            failure = as_http_error(error)
            return error_response(failure.status, failure.message)

    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


def text_param(request: Request, name: str, default: str | None = None, limit: int = 500) -> str | None:
    """A query parameter as text (``default`` when absent or empty); refused when longer than ``limit``."""
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    if len(value) > limit:
        raise HttpError(400, f"{name}: at most {limit} characters")
    return value


def required_param(request: Request, name: str) -> str:
    value = text_param(request, name)
    if value is None:
        raise HttpError(400, f"{name} is required")
    return value


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]."""
    text = text_param(request, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise HttpError(400, f"{name}: {text!r} is not a whole number") from None
    if not low <= value <= high:
        raise HttpError(400, f"{name}: {value} is not between {low} and {high}")
    return value


def float_param(request: Request, name: str, low: float, high: float, label: str | None = None) -> float | None:
    """A number within [low, high], or None when absent; ``label``: what messages call it (default: ``name``)."""
    text = text_param(request, name)
    if text is None:
        return None
    label = label or name
    try:
        value = float(text)
    except ValueError:
        raise HttpError(400, f"{label}: {text!r} is not a number") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise HttpError(400, f"{label}: {text} is not between {low:g} and {high:g}")
    return value


def stopping_flag(request: Request) -> threading.Event | None:
    """The app's stop flag (``app.state.stopping``, set once the server is told to stop), if it has one."""
    flag = getattr(request.app.state, "stopping", None)
    return flag if isinstance(flag, threading.Event) else None


async def read_body(request: Request, limit: int, too_large: str) -> bytes:
    """The request's body, at most ``limit`` bytes (a 413 answer, ``too_large``, beyond); a 503 answer as soon as the
    server is told to stop while it still arrives (uvicorn waits for every open request before it stops)."""
    data = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            data.extend(chunk)
            if len(data) > limit:
                raise HttpError(413, too_large)

    stopping = stopping_flag(request)
    reading = asyncio.ensure_future(read())
    try:
        while not reading.done():
            await asyncio.wait({reading}, timeout=STOPPING_POLL)
            if not reading.done() and stopping is not None and stopping.is_set():
                raise HttpError(503, STOPPING)
        reading.result()  # its 413, or the client gone
    finally:
        if not reading.done():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
    return bytes(data)
