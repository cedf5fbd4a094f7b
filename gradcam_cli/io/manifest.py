"""The ``--manifest`` file: one row per record, as JSON lines or CSV."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import UsageError

MANIFEST_FIELDS = (
    "input",
    "status",
    "error",
    "outputs",
    "predictions",
    "target",
    "method",
    "layer",
    "model",
    "seconds",
)
"""The columns of every row, in order (``Record.to_dict`` gives rows in this order)."""


class ManifestWriter:
    """Streams one row per record to ``path``: ``.jsonl`` (JSON lines) or ``.csv`` by extension.

    Each row goes out in a single write and is flushed, so a killed run's manifest lists exactly the rows that
    finished. In CSV, ``outputs``, ``predictions`` and ``target`` are JSON-encoded cells.
    """

    def __init__(self, path: Path) -> None:
        suffix = path.suffix.lower()
        if suffix not in (".jsonl", ".csv"):
            raise UsageError(f"--manifest {path}: use a .jsonl or .csv file name")
        self.path = path
        self.csv = suffix == ".csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        if self.csv:
            self._write_csv(MANIFEST_FIELDS)

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (``Record.to_dict()``: the values of ``MANIFEST_FIELDS``, in order)."""
        if self.csv:
            cells = [json.dumps(v) if isinstance(v, (list, dict)) else ("" if v is None else v) for v in row.values()]
            self._write_csv(cells)
        else:
            self._write_all((json.dumps(row) + "\n").encode())

    def _write_csv(self, cells: list[Any]) -> None:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(cells)
        # surrogateescape: a file name that is not valid UTF-8 is written back as the bytes it had
        self._write_all(buffer.getvalue().encode("utf-8", "surrogateescape"))

    def _write_all(self, data: bytes) -> None:
        """One ``write`` per row, so rows never interleave or tear; the loop only matters for a full disk."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def __enter__(self) -> ManifestWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        os.close(self.fd)
