"""Machine-readable records: JSON lines on stdout and the ``--manifest`` file (JSON lines or CSV)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from .batch import Record
from .errors import UsageError

CSV_FIELDS = [
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
]


def record_to_dict(record: Record) -> dict[str, Any]:
    """A record as plain JSON-ready data (predictions and target as {index, name, probability})."""
    row = asdict(record)
    for prediction in [row["target"], *row["predictions"]]:
        if prediction is not None:
            probability = prediction["probability"]
            prediction["probability"] = round(probability, 6) if math.isfinite(probability) else None  # valid JSON
    return {key: row[key] for key in CSV_FIELDS}


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
            self._write_csv(CSV_FIELDS)

    def write(self, record: Record) -> None:
        """Append one record."""
        row = record_to_dict(record)
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
