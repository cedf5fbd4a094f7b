"""Names as the explorer shows and sends them: a file name that is not UTF-8 (its undecodable bytes held as
surrogates, as Python decodes such names) shows each such byte as ``\\xNN``, as the console shows it, so that every
JSON answer, SQLite text and header can hold it; the file itself is still found by its own path."""

from __future__ import annotations

from urllib.parse import quote

from ..io.display import undecodable_escaped


def shown_text(text: str) -> str:
    """``text`` with the undecodable bytes of a name written ``\\xNN`` (any other lone surrogate ``\\uNNNN``)."""
    return undecodable_escaped(text)


def content_disposition(name: str) -> str:
    """An ``attachment`` header for a download named ``name`` (any text): an ASCII ``filename`` and the exact
    ``filename*`` (RFC 6266) where the name is more than printable ASCII."""
    shown = shown_text(name)
    fallback = "".join(ch if " " <= ch < "\x7f" and ch not in '"\\' else "_" for ch in shown)
    if fallback == shown:
        return f'attachment; filename="{shown}"'
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(shown, safe='')}"
