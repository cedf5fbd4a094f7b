"""The two sides of ``gradcam diff``: a manifest (``.jsonl`` or ``.csv``, also ``--json`` output saved to a
``.jsonl`` file), or an output folder holding one. Read as every reader of manifests reads them
(:func:`~gradcam_cli.io.manifest.parse_rows`: a byte order mark is dropped, lines that are not rows, such as a row
torn by a killed run, are left out, and the side says which); a file that is no manifest at all, or a row whose
target or fingerprint is malformed, is one line naming it.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..cam.results import NO_TARGET_SCORE
from ..errors import UsageError, describe
from ..io.manifest import latest_row_sets, manifest_text, parse_rows
from ..targets import TARGET_KINDS
from .fingerprint import decode_depth, decode_fingerprint

NAMED_KINDS = tuple(kind for kind in TARGET_KINDS if kind not in ("class", "contrast", "region"))
"""The ``--target`` kinds whose rows' target names begin with the kind (``similar:ref.jpg``)."""
MANIFEST_SUFFIXES = (".jsonl", ".csv")
PREFERRED_NAMES = ("manifest.jsonl", "manifest.csv")
"""In an output folder, these are the manifest; else its only ``.jsonl`` or ``.csv`` file is."""


@dataclass
class MapRow:
    """A manifest row as the diff compares it. ``target`` and ``top``: (class index, name) of the class the row
    explains and of the image's top prediction (an answer's row: its target's label and the answer token it explains,
    ``-1`` for none); ``grid`` and ``size``: its decoded fingerprint; ``raw``: its
    ``.npy`` map where that file exists; ``named``: its target is a ``--target`` other than a class
    (``similar:``, ``text:``, ``output:``, a contrast), which its name tells apart (its index is its place)."""

    line: int
    input: str
    status: str
    method: str | None = None
    target: tuple[int, str] | None = None
    probability: float | None = None
    top: tuple[int, str] | None = None
    grid: torch.Tensor | None = None
    size: tuple[int, int] | None = None
    raw: Path | None = None
    provenance: dict[str, Any] | None = None
    error: str | None = None
    named: bool = False
    answer: str | None = None
    """A prompted image's row: the answer its maps explain (``target`` is then the map's label, as ``named``)."""
    depth: torch.Tensor | None = None
    """A video model's row: its fingerprint's ``depth``, the map's mean over each sixteenth of the clip's frames
    (its ``input`` is then the video's path and ``#clip<N>``: each clip pairs with the same clip)."""
    scan: bool = False
    """A scan's row (docs/volumes.md): its ``depth`` is along the scan's first voxel axis, not over time."""


@dataclass
class Side:
    """One side of the diff: ``role`` (baseline or current, as messages name it), its manifest and its rows (each
    input's latest set of rows, in file order); ``ignored``: the numbers of the lines that are not rows."""

    role: str
    path: Path
    rows: list[MapRow]
    ignored: list[int] = field(default_factory=list)

    @property
    def shown(self) -> str:
        return f"{self.role} {self.path}"


def find_manifest(path: Path, role: str) -> Path:
    """The manifest ``path`` names: the file itself, or an output folder's manifest."""
    if path.is_dir():
        for name in PREFERRED_NAMES:
            if (path / name).is_file():
                return path / name
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in MANIFEST_SUFFIXES and p.is_file())
        if len(found) == 1:
            return found[0]
        if not found:
            raise UsageError(f"{role} {path}: no manifest in this folder (gradcam --manifest writes one)")
        names = ", ".join(p.name for p in found)
        raise UsageError(f"{role} {path}: several manifests in this folder ({names}); name the one to compare")
    if not path.exists():
        raise UsageError(f"{role} {path}: no such file or folder")
    if path.suffix.lower() not in MANIFEST_SUFFIXES:
        raise UsageError(f"{role} {path}: not a manifest; give a .jsonl or .csv file, or an output folder")
    return path


def read_side(path: Path, role: str) -> Side:
    """Read one side; every problem with the file is a :class:`UsageError` naming it (and the line)."""
    manifest = find_manifest(path, role)
    shown = f"{role} {manifest}"
    try:
        data = manifest.read_bytes()
    except OSError as error:
        raise UsageError(f"{shown}: cannot read it: {describe(error, manifest)}") from None
    is_csv = manifest.suffix.lower() == ".csv"
    if is_csv:
        header = next(csv.reader([manifest_text(data).split("\n", 1)[0]]), [])
        if "input" not in header or "status" not in header:
            raise UsageError(f"{shown}: not a manifest (its first line names no input and status columns)")
    rows: list[dict[str, Any]] = []
    ignored: list[int] = []
    for line, row in parse_rows(data, is_csv):
        if row is None:
            ignored.append(line)
        else:
            rows.append({**row, "line": line})
    if not rows:
        raise UsageError(
            f"{shown}: " + (f"not a manifest (line {ignored[0]} is not a manifest row)" if ignored else "no rows")
        )
    latest = [row for rows_of_input in latest_row_sets(rows).values() for row in rows_of_input]
    return Side(role, manifest, [_map_row(row, manifest, shown) for row in latest], ignored)


def _map_row(row: dict[str, Any], manifest: Path, shown: str) -> MapRow:
    line = int(row["line"])
    target = row.get("target")
    if isinstance(row.get("prompt"), str) and "answer" in row:  # a prompted image's row (docs/vlm.md)
        target = _answer_target(target, shown, line)
    predictions = row.get("predictions")
    top = predictions[0] if isinstance(predictions, list) and predictions else None
    if not _is_prediction(target) or not _is_prediction(top):
        raise UsageError(f"{shown}: line {line}: its target or predictions are not {{index, name, probability}}")
    grid, size = None, None
    if row.get("fingerprint") is not None:
        try:
            grid, size = decode_fingerprint(row["fingerprint"])
        except ValueError as error:
            raise UsageError(f"{shown}: line {line}: the fingerprint is malformed ({error})") from None
    provenance = row.get("provenance")
    clip = row.get("clip")
    clip_index = clip.get("index") if isinstance(clip, dict) else None
    return MapRow(
        line,
        str(row["input"]) + (f"#clip{clip_index}" if isinstance(clip_index, int) else ""),  # each clip pairs alone
        str(row["status"]),
        str(row["method"]) if row.get("method") else None,
        (target["index"], str(target.get("name", ""))) if target else None,
        _probability(target),
        (top["index"], str(top.get("name", ""))) if top else None,
        grid,
        size,
        _raw_map(row.get("outputs"), manifest),
        provenance if isinstance(provenance, dict) else None,
        str(row["error"]) if row.get("error") else None,
        _is_named(target) or "answer" in row,
        str(row["answer"]) if isinstance(row.get("answer"), str) else None,
        decode_depth(row["fingerprint"]) if grid is not None else None,
        isinstance(row.get("volume"), dict),
    )


def _answer_target(target: Any, shown: str, line: int) -> dict[str, Any] | None:
    """An answer row's ``{name, token, logprob, probability}`` target as a class-like one (its token as index)."""
    if target is None:
        return None
    if not isinstance(target, dict) or not isinstance(target.get("name"), str):
        raise UsageError(f"{shown}: line {line}: its target is not an answer's {{name, token, logprob, probability}}")
    token = target.get("token")
    return {**target, "index": token if isinstance(token, int) else -1}


def _is_named(target: dict[str, Any] | None) -> bool:
    """Whether a row's target is a ``--target`` other than a class, by its name (``similar:ref.jpg``) or its score
    (a contrast's ``difference``, a map's made without a target ``none``)."""
    if not target:
        return False
    name = str(target.get("name", ""))
    kinds = any(name.startswith(f"{kind}:") for kind in NAMED_KINDS)
    return target.get("score") in ("difference", NO_TARGET_SCORE) or kinds


def _is_prediction(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and isinstance(value.get("index"), int))


def _probability(target: dict[str, Any] | None) -> float | None:
    value = target.get("probability") if target else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _raw_map(outputs: Any, manifest: Path) -> Path | None:
    """The row's ``.npy`` map, at the path the row names or relative to the manifest's folder, if it exists."""
    for output in outputs if isinstance(outputs, list) else []:
        if isinstance(output, str) and output.lower().endswith(".npy"):
            for candidate in (Path(output), manifest.parent / output):
                if candidate.is_file():
                    return candidate
    return None
