"""A finished run's manifest as an SQLite index (standard library ``sqlite3``), for paging, filtering and sorting.

The manifest is read with the library's reader (:func:`~gradcam_cli.io.manifest.parse_rows`, torn rows left out,
and :func:`~gradcam_cli.io.manifest.latest_row_sets`, a resumed input's latest rows only) into one table, written
next to the manifest as ``.<name>.gradcam-index.sqlite`` (or, where that folder cannot be written, in the server's
own temporary folder). The index records the manifest's size and modification time; every request compares them
with the file's and rebuilds the index when the manifest changed. Queries page on the server (``LIMIT``/``OFFSET``
over indexed columns), so a page costs the same at 100,000 rows as at 100, and no request sends every row.

Drift: given a ``gradcam diff --json`` result, each row of an input that drifts is ``drift``, a compared one
``ok``, others have no drift status.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError, describe
from ..io.manifest import latest_row_sets, parse_rows
from .names import shown_text

COLUMNS = (
    "row",
    "input",
    "status",
    "error",
    "method",
    "layer",
    "target_index",
    "target_name",
    "probability",
    "predicted_index",
    "predicted_name",
    "predicted_probability",
    "drift",
)
"""What a page of rows gives per row (also the columns it sorts by), besides ``outputs``."""
SCHEMA = 6
PAGE_MAX = 200
COUNTS_KEPT = 256


@dataclass(frozen=True)
class RowFilter:
    """What a page shows: rows whose predicted class / target (index or name, any case), probability range,
    status, drift status and input (a substring) match; sorted by ``sort`` (a column), descending with ``desc``."""

    predicted: str | None = None
    target: str | None = None
    min_probability: float | None = None
    max_probability: float | None = None
    status: str | None = None
    drift: str | None = None
    query: str | None = None
    sort: str = "row"
    desc: bool = False


class RunIndex:
    """The index of one manifest; ``drift``: a ``gradcam diff --json`` file (its drifting inputs are marked)."""

    def __init__(self, manifest: Path, fallback_dir: Path, drift: Path | None = None) -> None:
        self.manifest, self.drift_file = manifest, drift
        hidden = manifest.parent / f".{manifest.name}.gradcam-index.sqlite"
        self.path = hidden if os.access(manifest.parent, os.W_OK) else fallback_dir / "run-index.sqlite"
        self._lock = threading.Lock()
        self._local = threading.local()
        self._generation = 0
        self._counts: dict[tuple[int, str, tuple[Any, ...]], int] = {}
        """Rows matching each filter asked for lately, by index generation (paging a filter counts it once)."""
        self._stamp: tuple[tuple[int, int], tuple[int, int] | None] | None = None
        self._drift: Drift = read_drift(drift)  # checked now, whether or not an index exists
        self.builds = 0
        self.refresh()

    def _file_stamp(self) -> tuple[tuple[int, int], tuple[int, int] | None]:
        """(the manifest's, the drift file's) modification time and size: what the index is built from."""
        stamps: list[tuple[int, int] | None] = []
        for path, label in ((self.manifest, str(self.manifest)), (self.drift_file, f"--drift {self.drift_file}")):
            if path is None:
                stamps.append(None)
                continue
            try:
                stat = path.stat()
            except OSError as error:
                raise UsageError(f"{shown_text(label)}: cannot read it: {describe(error, path)}") from None
            stamps.append((stat.st_mtime_ns, stat.st_size))
        manifest_stamp = stamps[0]
        assert manifest_stamp is not None
        return manifest_stamp, stamps[1]

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, check_same_thread=False)

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection to the current index (its page cache kept between requests); queries
        of several threads run at once, SQLite releasing the GIL while it works."""
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            if getattr(local, "db", None) is not None:
                local.db.close()
            local.db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            local.db.execute("PRAGMA cache_size = -32768")
            local.generation = self._generation
        db: sqlite3.Connection = local.db
        return db

    def refresh(self) -> None:
        """Rebuild the index if the manifest or the drift file differ from the ones it was built from (their size or
        modification time here; the drift's content, for an index an earlier server built)."""
        with self._lock:
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            if self._stamp is not None and stamp[1] != self._stamp[1]:
                self._drift = read_drift(self.drift_file)
            if self._stamp is None and self.path.exists():
                with self._connect() as db:
                    try:
                        kept = db.execute("SELECT mtime, size, schema, drift FROM meta").fetchone()
                    except sqlite3.DatabaseError:
                        kept = None
                if kept == (*stamp[0], SCHEMA, self._drift.digest):
                    self._stamp = stamp
                    self._generation += 1
                    return
            self._build(stamp[0])
            self._stamp = stamp

    def _build(self, stamp: tuple[int, int]) -> None:
        data = self.manifest.read_bytes()
        rows = [row for _, row in parse_rows(data, self.manifest.suffix.lower() == ".csv") if row is not None]
        temporary = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        temporary.unlink(missing_ok=True)
        try:
            db = sqlite3.connect(temporary)
            try:
                self._fill(db, stamp, rows)
            finally:
                db.close()
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self.builds += 1
        self._generation += 1

    def _fill(self, db: sqlite3.Connection, stamp: tuple[int, int], rows: list[dict[str, Any]]) -> None:
        db.execute("CREATE TABLE meta (mtime INTEGER, size INTEGER, schema INTEGER, drift TEXT)")
        db.execute("INSERT INTO meta VALUES (?, ?, ?, ?)", (*stamp, SCHEMA, self._drift.digest))
        db.execute(
            "CREATE TABLE rows (row INTEGER PRIMARY KEY, input TEXT, status TEXT, error TEXT, method TEXT, "
            "layer TEXT, target_index INTEGER, target_name TEXT, probability REAL, predicted_index INTEGER, "
            "predicted_name TEXT, predicted_probability REAL, drift TEXT, outputs TEXT, input_key TEXT, "
            "path TEXT, volume TEXT)"
        )
        records: list[tuple[Any, ...]] = []
        for rows_of_input in latest_row_sets(rows).values():
            for row in rows_of_input:
                records.append(_record(len(records), row, self._drift))
        db.executemany(f"INSERT INTO rows VALUES ({', '.join('?' * 17)})", records)
        for column in COLUMNS[1:]:
            db.execute(f"CREATE INDEX by_{column} ON rows ({column}, row)")
        for column in ("target", "predicted"):  # a class by name or index, often with a probability range
            db.execute(f"CREATE INDEX by_{column}_lower ON rows (lower({column}_name), probability, row)")
            db.execute(f"CREATE INDEX by_{column}_range ON rows ({column}_index, probability, row)")
        db.execute("ANALYZE")  # statistics, so that the planner scans in sort order when a filter matches many rows
        db.commit()

    def page(self, where: RowFilter, offset: int, limit: int) -> dict[str, Any]:
        """``{"total", "rows"}``: how many rows match, and ``limit`` (at most :data:`PAGE_MAX`) of them."""
        self.refresh()
        clauses, values = _clauses(where)
        sql_where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        if where.sort not in COLUMNS:
            raise UsageError(f"cannot sort by {where.sort!r}; use one of {', '.join(COLUMNS)}")
        order = f"{where.sort} {'DESC' if where.desc else 'ASC'}, row {'DESC' if where.desc else 'ASC'}"
        limit = max(1, min(limit, PAGE_MAX))
        db = self._reader()
        key = (self._generation, sql_where, tuple(values))
        total = self._counts.get(key)
        if total is None:
            (total,) = db.execute(f"SELECT count(*) FROM rows {sql_where}", values).fetchone()
            if len(self._counts) >= COUNTS_KEPT:
                self._counts.clear()
            self._counts[key] = total
        cursor = db.execute(
            f"SELECT {', '.join(COLUMNS)}, outputs FROM rows {sql_where} ORDER BY {order} LIMIT ? OFFSET ?",
            [*values, limit, offset],
        )
        rows = [
            {**dict(zip(COLUMNS, found[:-1], strict=True)), "outputs": [shown_text(o) for o in json.loads(found[-1])]}
            for found in cursor
        ]
        return {"total": total, "offset": offset, "rows": rows}

    def row(self, number: int) -> dict[str, Any] | None:
        """Row ``number`` (as the index numbers rows), or ``None``; its ``input`` as shown, ``path`` the input's
        own name, ``outputs`` their own names (which may hold the surrogates of names that are not UTF-8) and
        ``volume`` a scan's row's (``None`` for any other)."""
        self.refresh()
        db = self._reader()
        found = db.execute(
            f"SELECT {', '.join(COLUMNS)}, outputs, path, volume FROM rows WHERE row = ?", (number,)
        ).fetchone()
        if found is None:
            return None
        return {
            **dict(zip(COLUMNS, found[:-3], strict=True)),
            "outputs": json.loads(found[-3]),
            "path": json.loads(found[-2]),
            "volume": json.loads(found[-1]) if found[-1] is not None else None,
        }

    def siblings(self, number: int) -> list[dict[str, Any]]:
        """The rows of row ``number``'s input and method that were not errors, in order (a scan's classes): each
        one's ``row``, ``target_index`` and ``target_name``; none where there is no such row."""
        self.refresh()
        db = self._reader()
        found = db.execute("SELECT input, path, method FROM rows WHERE row = ?", (number,)).fetchone()
        if found is None:
            return []
        cursor = db.execute(
            "SELECT row, target_index, target_name FROM rows WHERE input = ? AND path = ? AND method IS ? "
            "AND status != 'error' ORDER BY row",
            found,
        )
        return [{"row": row, "target_index": index, "target_name": name} for row, index, name in cursor]

    def facets(self) -> dict[str, Any]:
        """The values filters offer: statuses, drift statuses and how many rows there are."""
        self.refresh()
        db = self._reader()
        statuses = [s for (s,) in db.execute("SELECT DISTINCT status FROM rows ORDER BY status")]
        drift = [d for (d,) in db.execute("SELECT DISTINCT drift FROM rows WHERE drift IS NOT NULL ORDER BY drift")]
        (total,) = db.execute("SELECT count(*) FROM rows").fetchone()
        return {"total": total, "statuses": statuses, "drift": drift, "columns": list(COLUMNS)}


@dataclass(frozen=True)
class Drift:
    """A ``gradcam diff --json`` result as the index uses it: the drifting inputs, the compared ones, and a digest
    of the file (``""``: no drift file), which the index records."""

    drifting: frozenset[str] = frozenset()
    compared: frozenset[str] = frozenset()
    digest: str = ""


def read_drift(path: Path | None) -> Drift:
    """``--drift``'s file read and checked: a JSON object with ``drifting`` (input names) and ``pairs`` (objects
    naming an ``input``), as ``gradcam diff --json`` writes it; anything else is a :class:`UsageError`."""
    if path is None:
        return Drift()
    shown = shown_text(str(path))
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UsageError(f"--drift {shown}: cannot read it: {describe(error, path)}") from None
    try:
        report = json.loads(data.decode("utf-8", "surrogateescape"))
        drifting = report["drifting"]
        pairs = report["pairs"]
        if not isinstance(drifting, list) or not isinstance(pairs, list):
            raise TypeError("drifting and pairs are not lists")
        names = frozenset(str(name) for name in drifting)
        compared = frozenset(str(pair["input"]) for pair in pairs)
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"--drift {shown}: not a gradcam diff --json result ({shown_text(describe(error))})") from None
    return Drift(names, compared, hashlib.sha256(data).hexdigest())


def _record(number: int, row: dict[str, Any], drift: Drift) -> tuple[Any, ...]:
    target = row.get("target") if isinstance(row.get("target"), dict) else None
    predictions = row.get("predictions")
    top = predictions[0] if isinstance(predictions, list) and predictions and isinstance(predictions[0], dict) else None
    name = str(row["input"])
    status = "drift" if name in drift.drifting else "ok" if name in drift.compared else None
    outputs = [o for o in row.get("outputs") or [] if isinstance(o, str)]
    shown = shown_text(name)
    return (
        number,
        shown,
        row["status"],
        _text(row.get("error")),
        _text(row.get("method")),
        _text(row.get("layer")),
        _number(target, "index"),
        _text(target.get("name")) if target else None,
        _number(target, "probability"),
        _number(top, "index"),
        _text(top.get("name")) if top else None,
        _number(top, "probability"),
        status,
        json.dumps(outputs),  # ASCII: a name's surrogates kept as escapes
        shown.lower(),
        json.dumps(name),
        json.dumps(row["volume"]) if isinstance(row.get("volume"), dict) else None,
    )


def _text(value: Any) -> str | None:
    return shown_text(str(value)) if value is not None else None


def _number(item: dict[str, Any] | None, key: str) -> Any:
    value = item.get(key) if item else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _clauses(where: RowFilter) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    values: list[Any] = []
    for column, text in (("predicted", where.predicted), ("target", where.target)):
        if text:
            if text.strip().isdigit():
                clauses.append(f"{column}_index = ?")
                values.append(int(text))
            else:
                clauses.append(f"lower({column}_name) = ?")
                values.append(text.strip().lower())
    if where.min_probability is not None:
        clauses.append("probability >= ?")
        values.append(where.min_probability)
    if where.max_probability is not None:
        clauses.append("probability <= ?")
        values.append(where.max_probability)
    for column, value in (("status", where.status), ("drift", where.drift)):
        if value:
            clauses.append(f"{column} = ?")
            values.append(value)
    if where.query:
        clauses.append("instr(input_key, ?) > 0")
        values.append(where.query.lower())
    return clauses, values
