"""The ``--manifest`` file: one row per record, as JSON lines or CSV; read back to resume a run."""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import GradcamError, UsageError, describe
from .atomic import write_atomic
from .lock import FolderLock, ensure_folder
from .naming import manifest_lock_path

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
    "fingerprint",
    "provenance",
)
"""The columns of every row, in order (``Record.to_dict`` gives rows in this order)."""
STATUSES = ("ok", "error", "skipped")
"""A row's ``status``."""
_JSON_CELLS = ("outputs", "predictions", "target", "fingerprint", "provenance")
"""CSV cells that hold JSON."""


def check_manifest_path(path: Path) -> None:
    """A :class:`UsageError` unless ``path`` can name a manifest: a ``.jsonl`` or ``.csv`` file name, not a folder,
    in a folder that exists or can be created (which it then is)."""
    if path.suffix.lower() not in (".jsonl", ".csv"):
        raise UsageError(f"--manifest {path}: use a .jsonl or .csv file name")
    if path.is_dir():
        raise UsageError(f"--manifest {path} is a folder; give a .jsonl or .csv file name")
    ensure_folder(path.parent, "--manifest", path)


def manifest_lock(path: Path) -> FolderLock:
    """The lock a run holds on the manifest ``path`` while it writes it (before it opens it), so that two runs never
    write one manifest at once, whatever path each names it by (relative, through symbolic links): the hidden file
    ``.<name>.lock`` beside the file ``path`` leads to."""
    real = Path(os.path.realpath(path))
    shown = str(path) if str(real) == os.path.abspath(path) else f"{path} ({real})"
    return FolderLock(manifest_lock_path(real), shown, "--manifest")


class ManifestWriter:
    """Streams one row per record to ``path``: ``.jsonl`` (JSON lines) or ``.csv`` by extension.

    Each row goes out in a single write and is flushed, so a killed run's manifest lists exactly the rows that
    finished. In CSV, ``outputs``, ``predictions``, ``target``, ``fingerprint`` and ``provenance`` are JSON-encoded
    cells. ``append``: keep the rows already in the file and add to them (resuming); otherwise the file starts
    empty.
    """

    def __init__(self, path: Path, append: bool = False) -> None:
        check_manifest_path(path)
        self.path = path
        self.csv = path.suffix.lower() == ".csv"
        flags = os.O_RDWR | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        try:
            self.fd = os.open(path, flags, 0o666)
        except OSError as error:
            raise UsageError(f"--manifest {path}: cannot write it: {describe(error, path)}") from None
        try:
            size = os.fstat(self.fd).st_size
            if size and os.pread(self.fd, 1, size - 1) != b"\n":
                self._write_all(b"\n")  # a row torn by a killed run stays on a line of its own
            if self.csv and not size:
                self._write_csv(list(MANIFEST_FIELDS))
        except BaseException:
            os.close(self.fd)
            raise

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (``Record.to_dict()``: the values of ``MANIFEST_FIELDS``, in order)."""
        try:
            if self.csv:
                self._write_csv(_csv_cells(row))
            else:
                self._write_all(_json_line(row))
        except OSError as error:
            raise GradcamError(f"--manifest {self.path}: cannot write it: {describe(error, self.path)}") from None

    def _write_csv(self, cells: list[Any]) -> None:
        self._write_all(_csv_line(cells))

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


def _json_line(row: dict[str, Any]) -> bytes:
    return (json.dumps(row) + "\n").encode()


def _csv_cells(row: dict[str, Any]) -> list[Any]:
    return [json.dumps(v) if isinstance(v, (list, dict)) else ("" if v is None else v) for v in row.values()]


def _csv_line(cells: list[Any]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    # surrogateescape: a file name that is not valid UTF-8 is written back as the bytes it had
    return buffer.getvalue().encode("utf-8", "surrogateescape")


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """The rows of a manifest, in file order, as ``Record.to_dict`` gave them; ``[]`` if there is no such file.

    Lines that do not parse (a row torn by a killed run) are left out.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise UsageError(f"--manifest {path}: cannot read it: {describe(error, path)}") from None
    return [row for _, row in parse_rows(data, path.suffix.lower() == ".csv") if row is not None]


def manifest_text(data: bytes) -> str:
    """A manifest's bytes as text: UTF-8, without the byte order mark a spreadsheet may have saved it with (bytes
    that are not UTF-8 become surrogates, so that such file names are written back as they were)."""
    return data.removeprefix(codecs.BOM_UTF8).decode("utf-8", "surrogateescape")


def parse_rows(data: bytes, is_csv: bool) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, row) of each row of a manifest's bytes (``.jsonl``, or ``.csv`` after its header), with the
    values of ``MANIFEST_FIELDS`` (``None`` for a column the file lacks; a JSON row keeps its other keys, such as
    an answer's); the row is ``None`` where the line is not a manifest row: no JSON object or CSV record of the
    header's length, no ``input``, no known ``status``. Every reader of manifests reads them so, and leaves such
    lines out (a row torn by a killed run)."""
    text = manifest_text(data)
    rows = _csv_rows(text) if is_csv else _json_rows(text)
    for line, row in rows:
        valid = row is not None and isinstance(row.get("input"), str) and row.get("status") in STATUSES
        yield line, row if valid else None


def _json_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | None]]:
    for line, content in enumerate(text.splitlines(), 1):
        if not content.strip():
            continue
        try:
            row = json.loads(content)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            yield line, None
            continue
        columns = {key: row.get(key) for key in MANIFEST_FIELDS}
        yield line, columns | {key: value for key, value in row.items() if key not in columns}  # an answer's too


def _csv_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | None]]:
    lines = csv.reader(io.StringIO(text, newline=""))
    header = next(lines, [])
    for values in lines:
        if not values:
            continue
        yield lines.line_num, _csv_row(header, values)


def _csv_row(header: list[str], values: list[str]) -> dict[str, Any] | None:
    if len(values) != len(header):
        if len(values) != len(MANIFEST_FIELDS) or header != list(MANIFEST_FIELDS[: len(header)]):
            return None  # a row cut short
        header = list(MANIFEST_FIELDS)  # a row this version appended (resuming) to an older version's manifest
    cells = dict(zip(header, values, strict=True))
    try:
        row: dict[str, Any] = {key: cells.get(key) or None for key in MANIFEST_FIELDS}
        for key in _JSON_CELLS:
            row[key] = json.loads(row[key]) if row[key] else None
        row["outputs"] = row["outputs"] or []
        row["predictions"] = row["predictions"] or []
        row["seconds"] = float(row["seconds"] or 0)
    except (ValueError, TypeError):
        return None
    return row


def row_key(row: dict[str, Any]) -> str:
    """The input a row belongs to, as an absolute path (``in/a.png`` and ``./in/a.png`` are one input)."""
    return os.path.abspath(str(row["input"]))


def latest_row_sets(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each input's latest set of rows (one per target and method), keyed by :func:`row_key`, in the order the
    inputs first appear.

    A run writes an input's rows one after the other, all with one status, so a set is a stretch of rows of one
    input; a row with another status, or whose method, target, first output and clip already occur in the stretch,
    starts a new set (a later run of the same input).
    """
    sets: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for row in rows:
        key = row_key(row)
        target, outputs = row.get("target"), row.get("outputs")
        clip = row.get("clip")
        signature = (
            row.get("method"),
            target.get("index") if isinstance(target, dict) else None,
            outputs[0] if isinstance(outputs, list) and outputs else None,
            clip.get("index") if isinstance(clip, dict) else None,  # a video model's rows: one set per clip
        )
        if not current or row_key(current[0]) != key or current[0]["status"] != row["status"] or signature in seen:
            current, seen = [], set()
            sets[key] = current  # a later set replaces the earlier one (and keeps its place)
        current.append(row)
        seen.add(signature)
    return sets


def rewrite_manifest(path: Path, earlier: int, order: Sequence[str]) -> None:
    """Rewrite the manifest at ``path`` atomically with one set of rows per input: the rows after the first
    ``earlier`` (this run's) replace an input's earlier ones; inputs come in ``order`` (their :func:`row_key`),
    then those only earlier runs had, in the order they had them."""
    rows = read_manifest(path)
    sets = latest_row_sets(rows[:earlier])
    for key, mine in _by_input(rows[earlier:]).items():
        sets[key] = mine
    place = {key: number for number, key in enumerate(order)}
    keys = sorted(sets, key=lambda key: place.get(key, len(place)))  # stable: the others keep their order
    write_manifest(path, [row for key in keys for row in sets[key]])


def write_manifest(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` (``Record.to_dict``'s form) as the whole manifest at ``path``, atomically, in its format."""
    if path.suffix.lower() == ".csv":
        data = _csv_line(list(MANIFEST_FIELDS)) + b"".join(_csv_line(_csv_cells(row)) for row in rows)
    else:
        data = b"".join(_json_line(row) for row in rows)
    try:
        write_atomic(Path(os.path.realpath(path)), data)  # through a symbolic link: the file it leads to
    except OSError as error:
        raise GradcamError(f"--manifest {path}: cannot write it: {describe(error, path)}") from None


def _by_input(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row_key(row), []).append(row)
    return grouped
