"""Errors a user can cause, each with the exit code the CLI documents; close-match suggestions; and
:func:`describe`, which turns any exception into a short phrase fit for a one-line message."""

from __future__ import annotations

import difflib
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
