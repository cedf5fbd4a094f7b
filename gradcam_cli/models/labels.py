"""Class names: reading a ``--labels`` file and finding the class ``--target-class`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import UsageError, describe, suggest

HEADER_NAMES = frozenset(
    {"name", "names", "label", "labels", "class", "classes", "class_name", "class_names", "category", "categories"}
)
"""A labels file whose first line is exactly one of these (any case) has a header line, which is skipped."""

SUGGESTED_CLASSES = 5
"""At most this many class names are offered for an unknown ``--target-class``."""


class Named(Protocol):
    """Anything with class names (a :class:`~gradcam_cli.models.profile.LoadedModel`); ``None``: none known."""

    @property
    def categories(self) -> list[str] | None: ...


def read_labels(path: str | Path) -> list[str]:
    """Class names from a UTF-8 text file, one per line: a byte-order mark, a header line (one of
    :data:`HEADER_NAMES`) and blank lines at the end are ignored, and each name is stripped."""
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(f"labels file {path} is not UTF-8 text; save it as UTF-8, one class name per line") from error
    except OSError as error:
        raise UsageError(f"cannot read labels file {path}: {describe(error, path)}") from error
    lines = [line.strip() for line in text.splitlines()]
    if lines and lines[0].lower() in HEADER_NAMES:
        lines = lines[1:]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise UsageError(f"labels file {path} is empty")
    return lines


def check_label_count(names: list[str], classes: int | None, path: str | Path) -> None:
    """A labels file must name every class the model has, and no more (``classes`` ``None``: unknown, not checked)."""
    if classes is not None and len(names) != classes:
        raise UsageError(
            f"labels file {path} has {_count(len(names), 'name')} but the model has {_count(classes, 'class')}"
        )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}{'es' if noun.endswith('s') else 's'}"


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
    raise UsageError(f"unknown class {text!r}.{suggest(text, model.categories, SUGGESTED_CLASSES)}")
