"""What ``gradcam serve PATH...`` takes each path for: a finished run, or images to serve.

A run is a folder holding gradcam's run record (``.gradcam-run.json``) or a manifest gradcam wrote (a ``.jsonl``
whose first row is a manifest row, a ``.csv`` whose header names ``input`` and ``status``), or such a manifest
file itself. Any other folder is served as images, whatever ``.csv`` or ``.jsonl`` files it holds (a
``boxes.csv`` for ``gradcam eval``, say); each such choice is said in a note the command prints. A manifest named
on the command line that gradcam did not write is refused, as ``gradcam diff`` refuses it.

The relative paths in a manifest (inputs, outputs) are relative to the folder the run was started in, which the run
record keeps (``cwd``); for a run whose record lacks it (an older version's), the first folder (the current one,
then the run folder's parents) from which the run's first output exists is taken.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..drift.manifests import MANIFEST_SUFFIXES, PREFERRED_NAMES
from ..errors import UsageError, describe
from ..io.manifest import manifest_text, parse_rows
from ..io.naming import RUN_RECORD_NAME
from ..pipeline.resume import read_run_record
from .names import shown_text


@dataclass(frozen=True)
class ServedRun:
    """A finished run: its folder, its manifest, its run record and the folder its relative paths start from."""

    folder: Path
    manifest: Path
    record: dict[str, Any]
    base: Path


@dataclass
class ServedPaths:
    """``gradcam serve``'s paths sorted out: the run (or none), the image paths, and what was taken for what."""

    run: ServedRun | None = None
    images: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def manifest_problem(path: Path) -> str | None:
    """Why ``path`` is not a manifest gradcam wrote (one phrase), or ``None`` when it is one."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return f"cannot read it: {describe(error, path)}"
    is_csv = path.suffix.lower() == ".csv"
    if is_csv:
        header = next(csv.reader([manifest_text(data).split("\n", 1)[0]]), [])
        if "input" not in header or "status" not in header:
            return "not a gradcam manifest (its first line names no input and status columns)"
    for line, row in parse_rows(data, is_csv):
        if row is not None:
            return None
        return f"not a gradcam manifest (line {line} is not a manifest row)"
    return "not a gradcam manifest (no rows)"


def run_of(manifest: Path) -> ServedRun:
    """The run ``manifest`` belongs to (its folder's record, the folder its paths start from)."""
    folder = manifest.parent
    record = read_run_record(folder)
    return ServedRun(folder, manifest, record, run_base(folder, manifest, record))


def run_base(folder: Path, manifest: Path, record: dict[str, Any]) -> Path:
    """The folder the manifest's relative paths are relative to: the run record's ``cwd``, else the first of the
    current folder and the run folder's parents from which the run's first output exists (else the current one)."""
    kept = record.get("cwd")
    if isinstance(kept, str) and Path(kept).is_dir():
        return Path(kept)
    sample = _first_output(manifest)
    if sample is not None and not Path(sample).is_absolute():
        for base in (Path.cwd(), *folder.resolve().parents):
            if (base / sample).exists():
                return base
    return Path.cwd()


def _first_output(manifest: Path) -> str | None:
    try:
        data = manifest.read_bytes()
    except OSError:
        return None
    for _, row in parse_rows(data, manifest.suffix.lower() == ".csv"):
        outputs = row.get("outputs") if row is not None else None
        if isinstance(outputs, list) and outputs and isinstance(outputs[0], str):
            return outputs[0]
    return None


def folder_manifest(folder: Path, notes: list[str]) -> Path | None:
    """The manifest gradcam wrote in ``folder`` (its ``manifest.jsonl``/``.csv``, else its only one), or ``None``
    (every other ``.jsonl``/``.csv`` file it holds then gets a note); several: a :class:`UsageError`."""
    candidates = sorted(p for p in folder.iterdir() if p.suffix.lower() in MANIFEST_SUFFIXES and p.is_file())
    preferred = [folder / name for name in PREFERRED_NAMES if (folder / name).is_file()]
    found: list[Path] = []
    for path in preferred or candidates:
        problem = manifest_problem(path)
        if problem is None:
            found.append(path)
        else:
            notes.append(f"{shown_text(str(path))}: {problem}; not taken for a run's manifest")
    if len(found) > 1 and not preferred:
        names = ", ".join(shown_text(p.name) for p in found)
        raise UsageError(
            f"{shown_text(str(folder))}: several manifests in this folder ({names}); name the one to serve "
            f"(gradcam serve {shown_text(str(found[0]))})"
        )
    return found[0] if found else None


def sort_paths(paths: list[str]) -> ServedPaths:
    """Which path is the run (one at most) and which are images; a manifest named that gradcam did not write, or a
    second run, is a :class:`UsageError`."""
    served = ServedPaths()
    for text in paths:
        path = Path(text)
        manifest = None
        if path.is_file() and path.suffix.lower() in MANIFEST_SUFFIXES:
            problem = manifest_problem(path)
            if problem is not None:
                raise UsageError(f"PATH {shown_text(text)}: {problem}; give a run's output folder or its manifest")
            manifest = path
        elif path.is_dir():
            before = len(served.notes)
            manifest = folder_manifest(path, served.notes)
            if manifest is None and (path / RUN_RECORD_NAME).is_file():
                served.notes.append(
                    f"{shown_text(text)}: a run without a manifest (gradcam --manifest writes one); serving its images"
                )
            elif manifest is None and len(served.notes) > before:
                served.notes.append(f"{shown_text(text)}: no gradcam run; serving its images")
        if manifest is None:
            served.images.append(text)
            continue
        if served.run is not None:
            raise UsageError(
                f"PATH {shown_text(text)}: gradcam serve shows one run at a time "
                f"({shown_text(str(served.run.manifest))} is served)"
            )
        served.run = run_of(manifest)
        served.notes.append(
            f"run: {shown_text(str(manifest))} (its relative paths from {shown_text(str(served.run.base))})"
        )
    return served
