"""Which files the explorer serves: only those inside the run folder, after resolving symbolic links.

A requested path is refused (404, one message for every refusal, so that nothing outside can be probed) when it is
absolute, has a ``..`` part, a NUL or a backslash, or resolves (symbolic links followed) to a place outside the run
folder, or is no regular file. Paths arrive percent-decoded once by the server; what remains of an encoding
(``%2e%2e``) is taken literally, as a file name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from .http import HttpError

NOT_SERVED = "no such file in the served folder"


def contained(root: Path, relative: str) -> Path:
    """The regular file ``relative`` names inside ``root`` (resolved); any other is a 404 :class:`HttpError`."""
    if not relative or "\x00" in relative or "\\" in relative:
        raise HttpError(404, NOT_SERVED)
    parts = PurePosixPath(relative)
    if parts.is_absolute() or ".." in parts.parts:
        raise HttpError(404, NOT_SERVED)
    base = root.resolve()
    try:
        path = (base / parts).resolve(strict=True)
    except (OSError, RuntimeError):
        raise HttpError(404, NOT_SERVED) from None
    if not path.is_relative_to(base) or not path.is_file():
        raise HttpError(404, NOT_SERVED)
    return path


def row_output(root: Path, base: Path, manifest: Path, outputs: Sequence[str], k: int) -> Path:
    """A run row's ``k``-th output file (the path the row names, from ``base``, the folder the run started in, or
    from the manifest's folder), if it lies inside ``root``."""
    if not 0 <= k < len(outputs):
        raise HttpError(404, NOT_SERVED)
    inside = root.resolve()
    for candidate in (base / outputs[k], manifest.parent / outputs[k]):
        try:
            path = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if path.is_relative_to(inside) and path.is_file():
            return path
    raise HttpError(404, NOT_SERVED)
