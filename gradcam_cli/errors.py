"""Errors a user can cause, each with the exit code the CLI documents; close-match suggestions; and
:func:`describe`, which turns any exception into a short phrase fit for a one-line message."""

from __future__ import annotations

import difflib
import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path

EXIT_OK = 0
EXIT_IMAGE_FAILED = 1
EXIT_USAGE = 2
EXIT_MODEL = 3
EXIT_INTERRUPTED = 130


class GradcamError(Exception):
    """Base class: a one-line message meant for the user, and the process exit code."""

    exit_code = EXIT_USAGE


class UsageError(GradcamError):
    """A bad option value, path, model, layer or class name."""


class ModelLoadError(GradcamError):
    """The model or its weights could not be loaded."""

    exit_code = EXIT_MODEL


class ImageError(GradcamError):
    """One input image could not be read or explained."""

    exit_code = EXIT_IMAGE_FAILED


def suggest(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean: a, b?' for close matches of ``name``, or '' when none is close.

    Choices that contain ``name`` as a whole word come first (``cat``: ``tiger cat``), then choices that contain it
    at all, each group closest first, then close spellings (``resnt18``: ``resnet18``); at most ``n`` in all.
    """
    pool = list(dict.fromkeys(choices))
    text = name.strip().lower()
    matches: list[str] = []
    if text:
        word = re.compile(rf"(?<![^\W_]){re.escape(text)}(?![^\W_])")
        closest = {c: -difflib.SequenceMatcher(None, text, c.lower()).ratio() for c in pool}
        matches += sorted((c for c in pool if word.search(c.lower())), key=closest.__getitem__)
        if len(text) >= 3:
            matches += sorted((c for c in pool if text in c.lower() and c not in matches), key=closest.__getitem__)
    matches += difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
    lowered = {c.lower(): c for c in pool}
    matches += [lowered[m] for m in difflib.get_close_matches(text, list(lowered), n=n, cutoff=0.6)]
    chosen = list(dict.fromkeys(matches))[:n]
    return f" Did you mean: {', '.join(chosen)}?" if chosen else ""


_PHRASES: dict[type[BaseException], str] = {
    MemoryError: "out of memory",
    EOFError: "the data ends too early",
    RecursionError: "too deeply nested",
    ZeroDivisionError: "division by zero",
    AssertionError: "an internal check failed",
    NotImplementedError: "not supported",
}
_CLASS_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Warning|Interrupt)\s*:\s*")
_WRAPPED = re.compile(r"^Caught \w+ in ")
_MAX_CHARS = 300


def describe(error: BaseException, path: str | Path | None = None) -> str:
    """``error`` as a short phrase for a one-line message: its message's first line, never its class name.

    Common cases get a plain phrase (``out of memory``, an OS error's reason). When the caller names ``path``
    itself, mentions of it are dropped from the phrase, so that the message names it once.
    """
    if isinstance(error, MemoryError) or "out of memory" in str(error).lower():
        return "out of memory (try a smaller --batch-size or --max-side)"
    if isinstance(error, OSError) and error.strerror:
        text = error.strerror[:1].lower() + error.strerror[1:]
        where = error.filename
        if where is not None and (path is None or Path(str(where)) != Path(path)):
            text = f"{text} ({where})"
        return text
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if _WRAPPED.match(text):  # torch re-raising a worker's error: its own message is on the last line
        text = lines[-1] if len(lines) > 1 else ""
    while _CLASS_PREFIX.match(text):
        text = _CLASS_PREFIX.sub("", text, count=1)
    if isinstance(error, KeyError) and text:
        text = f"missing key {text}"
    if path is not None and text:
        for form in (f": '{path}'", f': "{path}"', f" '{path}'", f' "{path}"'):
            text = text.replace(form, "")
        text = text.replace(str(path), "the file")
    if not text.strip(" :.'\""):
        text = next((phrase for kind, phrase in _PHRASES.items() if isinstance(error, kind)), "unexpected failure")
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 1].rstrip() + "…"


PATH_NAME_ERRORS = frozenset({errno.ENAMETOOLONG, errno.ELOOP})
"""OS errors about how a path is spelt rather than what is there: only the one who typed the path can mend it."""
_SHOWN_PART = 40


def path_error(error: BaseException) -> UsageError | None:
    """A one-line :class:`UsageError` for an OS error in :data:`PATH_NAME_ERRORS` (a path with a part over the file
    system's limit, typically 255 bytes, or a loop of symbolic links), naming the path with its overlong part cut
    short; ``None`` for any other error.

    Such errors can come from almost any call that takes a path (even ``Path.is_dir``), so the commands turn them
    into usage errors in one place (:func:`gradcam_cli.cli.reporting.run_reported`) instead of at every call.
    """
    if not isinstance(error, OSError) or error.errno not in PATH_NAME_ERRORS:
        return None
    if error.filename is None:
        return UsageError(describe(error))
    name = os.fsdecode(error.filename)
    reason = describe(error, name)
    if error.errno == errno.ENAMETOOLONG:
        reason = _too_long(name, reason)
    return UsageError(f"{_shortened(name)}: {reason}")


def _too_long(name: str, reason: str) -> str:
    """Which limit ``name`` is over: a part's (``NAME_MAX``), or the whole path's (``PATH_MAX``)."""
    longest = max((len(os.fsencode(part)) for part in Path(name).parts), default=0)
    folder = next((p for p in Path(os.path.abspath(name)).parents if os.path.isdir(p)), Path(os.sep))
    try:
        part_limit, path_limit = os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no such setting
        part_limit, path_limit = 255, 4096
    if longest > part_limit:
        return f"{reason} (one part of it is {longest} bytes; the file system allows {part_limit})"
    return f"{reason} (the path is {len(os.fsencode(name))} bytes; the limit is {path_limit})"


def _shortened(name: str) -> str:
    """``name`` with each overlong part, then the whole if still long, cut to its start and end, so that the
    message stays readable."""
    parts = [_cut(part, _SHOWN_PART) for part in name.split(os.sep)]
    return _cut(os.sep.join(parts), 4 * _SHOWN_PART)


def _cut(text: str, most: int) -> str:
    return f"{text[: most // 2]}…{text[-most // 4 :]}" if len(text) > most else text
