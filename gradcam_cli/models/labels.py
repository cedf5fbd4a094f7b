"""Class names: reading a ``--labels`` file and finding the class ``--target-class`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import UsageError, suggest


class Named(Protocol):
    """Anything with class names (a :class:`~gradcam_cli.models.loading.LoadedModel`); ``None``: none known."""

    categories: list[str] | None


def read_labels(path: str | Path) -> list[str]:
    """Class names from a text file, one per line (blank lines at the end ignored)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"cannot read labels file {path}: {error.strerror or error}") from error
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"labels file {path} is empty")
    return [line.strip() for line in lines]


def resolve_target(model: Named, text: str | None) -> int | None:
    """A class index from ``--target-class``: an index, or a class name (case-insensitive)."""
    if text is None:
        return None
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if model.categories is None:
        raise UsageError(f"class {text!r}: this model has no class names; give an index or --labels FILE")
    lowered = text.lower()
    matches = [i for i, name in enumerate(model.categories) if name.lower() == lowered]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"class name {text!r} is ambiguous (indices {matches}); give the index instead")
    raise UsageError(f"unknown class {text!r}.{suggest(text, model.categories)}")
