"""Errors a user can cause, each with the exit code the CLI documents."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

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
    """Return ' Did you mean: a, b?' for close matches of ``name``, or '' when none is close."""
    pool = list(choices)
    matches = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
    if not matches:
        lowered = {c.lower(): c for c in pool}
        matches = [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)]
    if not matches:
        matches = [c for c in pool if name.lower() in c.lower()][:n]
    return f" Did you mean: {', '.join(matches)}?" if matches else ""
