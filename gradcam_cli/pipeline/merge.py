"""``gradcam merge OUTPUT_DIR``: the shards of a ``--shard K/N`` run joined into one run's manifest and gallery.

Merging reads the shard records (``.gradcam-shard-K-of-N.json``, :mod:`~gradcam_cli.pipeline.shards`) and checks
them before writing anything: every shard present and finished (unless ``partial``), all made with the same run
record and over the same inputs. It then writes the merged manifest, its rows in the input order of one local
run over the same inputs (each shard knows the place of each of its inputs), and, where the shards ran with
``--report`` (or ``report`` says so), the gallery of the whole output. It holds the output folder's lock
exclusively, so it cannot run while a shard is still writing there, and it removes what killed shards left
behind (temporary files). The shards' own manifests and records stay, so a merge can be made again after a shard
is run again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cam.records import Record
from ..errors import UsageError
from ..io.atomic import remove_stale_temporaries
from ..io.lock import FolderLock
from ..io.manifest import latest_row_sets, read_manifest, row_key, write_manifest
from ..io.naming import LOCK_NAME, SHARD_FILE
from .resume import RECORD_LABELS
from .session import Counts
from .shards import ShardRecord


@dataclass
class Merged:
    """What a merge wrote: the shards merged (of ``count``), the manifest, the gallery (or ``None``), the inputs by
    outcome, and the shards left out (``partial``: missing or unfinished)."""

    merged: list[int]
    count: int
    manifest: Path
    gallery: Path | None
    counts: Counts
    left_out: list[int]


def merge_shards(output_dir: Path, partial: bool = False, report: bool | None = None) -> Merged:
    """Merge the shards in ``output_dir`` (see the module docstring). ``partial``: merge the shards there are, even
    when some are missing or did not finish; ``report``: write the gallery (``None``: when the shards did)."""
    if not output_dir.is_dir():
        raise UsageError(f"{output_dir}: no such folder")
    try:
        lock = FolderLock(output_dir / LOCK_NAME, output_dir, "OUTPUT_DIR")
        lock.acquire()
    except UsageError as error:
        if "another gradcam run" not in str(error):
            raise
        raise UsageError(f"a gradcam run is still writing to {output_dir}; merge once every shard has ended") from None
    try:
        shards = _read_shards(output_dir)
        count = shards[0].count
        missing = sorted(set(range(count)) - {shard.index for shard in shards})
        unfinished = [shard.index for shard in shards if not shard.finished]
        if (missing or unfinished) and not partial:
            raise UsageError(_not_finished(output_dir, count, missing, unfinished))
        _check_alike(shards)
        manifest = shards[0].path_of(shards[0].manifest, output_dir)
        rows = _merged_rows(shards, output_dir)
        write_manifest(manifest, rows)
        records = [Record.from_dict(row) for row in rows]
        counts = Counts()
        for record in records:
            counts.add(record)
        gallery = None
        if report if report is not None else any(shard.report for shard in shards):
            from ..render.gallery import write_gallery

            gallery = write_gallery(records, output_dir)
        remove_stale_temporaries(output_dir)
        done = sorted(shard.index for shard in shards)
        return Merged(done, count, manifest, gallery, counts, sorted({*missing, *unfinished}))
    finally:
        lock.release()


def _read_shards(output_dir: Path) -> list[ShardRecord]:
    """The shard records in ``output_dir``, all of one split, by index."""
    names = sorted(entry.name for entry in os.scandir(output_dir) if SHARD_FILE.fullmatch(entry.name))
    if not names:
        raise UsageError(f"{output_dir} holds no shards; run gradcam with --shard K/N into it first")
    shards = [ShardRecord.read(output_dir / name) for name in names]
    counts = sorted({shard.count for shard in shards})
    if len(counts) > 1:
        splits = " and ".join(f"{count} shards" for count in counts)
        raise UsageError(
            f"{output_dir} holds runs split into {splits}; delete the .gradcam-shard-*-of-N.json files of the "
            "split you no longer use"
        )
    return sorted(shards, key=lambda shard: shard.index)


def _not_finished(output_dir: Path, count: int, missing: list[int], unfinished: list[int]) -> str:
    parts = []
    if missing:
        parts.append(f"shard{'s' if len(missing) > 1 else ''} {_listed(missing)} of {count} never ran")
    if unfinished:
        parts.append(f"shard{'s' if len(unfinished) > 1 else ''} {_listed(unfinished)} did not finish")
    return (
        f"{output_dir}: {' and '.join(parts)}; run them (with --skip-existing to resume), or merge the rest with "
        "--partial"
    )


def _listed(indices: list[int]) -> str:
    return ", ".join(map(str, indices))


def _check_alike(shards: list[ShardRecord]) -> None:
    """The shards saw the same inputs, were made with the same settings and write the same merged manifest."""
    first = shards[0]
    for shard in shards[1:]:
        pair = f"shards {first.index} and {shard.index}"
        if shard.digest != first.digest:
            raise UsageError(
                f"{pair} were run over different inputs ({first.total} and {shard.total} found); give every shard "
                "the same INPUT arguments"
            )
        differences = [
            f"{label} {first.record.get(key)} (shard {shard.index}: {shard.record.get(key)})"
            for key, label in RECORD_LABELS.items()
            if first.record.get(key) != shard.record.get(key)
        ]
        if differences:
            raise UsageError(f"{pair} were made with different settings: {', '.join(differences)}")
        if shard.manifest != first.manifest:
            raise UsageError(f"{pair} name different manifests ({first.manifest} and {shard.manifest})")


def _merged_rows(shards: list[ShardRecord], output_dir: Path) -> list[dict[str, Any]]:
    """Every shard's latest rows per input, inputs in the order of the whole run (any input without a known place
    after the others, in shard order)."""
    placed: list[tuple[int, int, list[dict[str, Any]]]] = []
    unplaced = max(shard.total for shard in shards)
    for number, shard in enumerate(shards):
        places = {row_key({"input": name}): place for name, place in shard.places}
        sets = latest_row_sets(read_manifest(shard.path_of(shard.shard_manifest, output_dir)))
        for key, rows in sets.items():
            placed.append((places.get(key, unplaced + number), len(placed), rows))
    return [row for _, _, rows in sorted(placed, key=lambda entry: entry[:2]) for row in rows]
