"""Names shown to people and linked from pages, whatever bytes they are made of.

A file name need not be UTF-8 (``bad\\xff.jpg``): Python hands it over with each undecodable byte as a lone
surrogate, which no UTF-8 writer takes. Everything that shows a name (the console, the ``--report`` gallery,
``gradcam diff --report``) shows :func:`displayable` text, in which such a byte reads ``\\xff`` and control
characters and line separators are escaped too; everything that links a file (the pages' ``href``/``src``) uses
:func:`href`, which percent-encodes the name's own bytes, so the link opens the very file. Machine-readable
outputs keep the name itself: JSON escapes it (``\\udcff``, read back as the same name) and the CSV manifest writes
its bytes (``io/manifest.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from .naming import relative_posix

_ESCAPES = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def undecodable_escaped(text: str) -> str:
    """``text`` with the undecodable bytes of a name written ``\\xNN`` (any other lone surrogate ``\\uNNNN``):
    valid UTF-8, the rest as it is (``gradcam serve``'s JSON answers and SQLite text)."""
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    return "".join(
        f"\\x{ord(ch) - 0xDC00:02x}"
        if "\udc80" <= ch <= "\udcff"
        else f"\\u{ord(ch):04x}"
        if "\ud800" <= ch <= "\udfff"
        else ch
        for ch in text
    )


def displayable(text: str) -> str:
    """``text`` with control characters (a newline in a file name, a terminal escape), line separators and the
    undecodable bytes of a name escaped (``\\n``, ``\\x1b``, ``\\xff``): one line of valid UTF-8."""
    return undecodable_escaped(text).translate(_ESCAPES)


def href(path: Path | str, root: str) -> str:
    """A URL from a page in the absolute directory ``root`` to ``path``: relative where one exists (else a file
    URI), percent-encoding the name's bytes (also those that are not UTF-8)."""
    relative = relative_posix(str(path), root)
    if relative is None:
        return Path(path).absolute().as_uri()
    return quote(os.fsencode(relative), safe="/")
