"""``--shard K/N``: a deterministic part of the inputs, so that N jobs (a Slurm array, a Kubernetes Indexed Job)
cover every input exactly once, each writing into the same output folder.

Which shard an input falls in depends only on its path relative to its input root (the part of the output tree
it is named after, ``cats/a.jpg``), Unicode-normalised (NFC) with forward slashes: not on the order inputs are
found in, the machine, its mount points or its file system. The key is hashed with SHA-256 (Python's own
``hash`` differs from process to process) and taken modulo N, which spreads any naming scheme evenly.

Each shard writes its own manifest (:func:`~gradcam_cli.io.naming.shard_manifest_path`) and a shard record,
``<output_dir>/.gradcam-shard-K-of-N.json`` (:class:`ShardRecord`): the place of each of its inputs in the whole
run's input order, the run record its outputs were made with, whether it finished, and a digest of every input
key it saw, so that ``gradcam merge`` (:mod:`gradcam_cli.pipeline.merge`) can put the rows of all shards in the
order of one local run, and refuse shards that saw other inputs or used other settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError, describe
from ..io.atomic import write_atomic
from ..io.discovery import InputImage
from ..io.naming import shard_file_name
from ..options import Shard


def shard_key(image: InputImage) -> str:
    """The input's path relative to its input root, as the shard split sees it: the folder of its output stem and
    its file name (``cats/a.jpg``), with forward slashes, in Unicode normal form C."""
    relative = (image.output_stem.parent / image.path.name).as_posix()
    return unicodedata.normalize("NFC", relative)


def shard_of(image: InputImage, count: int) -> int:
    """The shard (0 to ``count`` - 1) that ``image`` belongs to."""
    digest = hashlib.sha256(shard_key(image).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % count


def select_shard(inputs: Sequence[InputImage], shard: Shard) -> list[tuple[int, InputImage]]:
    """``(place in inputs, input)`` of each input of ``shard``, in input order."""
    return [(place, image) for place, image in enumerate(inputs) if shard_of(image, shard.count) == shard.index]


def inputs_digest(inputs: Sequence[InputImage]) -> str:
    """A digest of every input's shard key, in order: two shards that saw the same inputs have the same one."""
    digest = hashlib.sha256()
    for image in inputs:
        digest.update(shard_key(image).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


@dataclass
class ShardRecord:
    """What one shard did, as ``<output_dir>/.gradcam-shard-K-of-N.json`` keeps it for ``gradcam merge``.

    ``manifest``: the merged manifest's path and ``shard_manifest`` this shard's (relative to the output directory
    when inside it); ``places``: each of its inputs (as its rows name it) with its place in the whole run's input
    order; ``record``: the run record; ``total`` and ``digest``: how many inputs every shard saw, and their keys'
    digest; ``finished``: the shard went through all its inputs; ``counts``: its inputs by outcome.
    """

    index: int
    count: int
    manifest: str
    shard_manifest: str
    report: bool
    record: dict[str, Any]
    total: int
    digest: str
    places: list[tuple[str, int]]
    finished: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def shard(self) -> Shard:
        return Shard(self.index, self.count)

    def write(self, output_dir: Path) -> None:
        """Write the record atomically into ``output_dir``."""
        path = output_dir / shard_file_name(self.shard.label)
        try:
            write_atomic(path, (json.dumps(asdict(self)) + "\n").encode())
        except OSError as error:
            raise UsageError(f"--output-dir {output_dir}: cannot write there: {describe(error, output_dir)}") from None

    @classmethod
    def read(cls, path: Path) -> ShardRecord:
        """The record at ``path``; a :class:`UsageError` when it cannot be read or is not one."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            data["places"] = [(str(name), int(place)) for name, place in data["places"]]
            return cls(**data)
        except OSError as error:
            raise UsageError(f"{path}: cannot read it: {describe(error, path)}") from None
        except (ValueError, TypeError, KeyError):
            raise UsageError(f"{path}: not a shard record of this version of gradcam; run the shard again") from None

    def path_of(self, stored: str, output_dir: Path) -> Path:
        """A path as the record stores it (``manifest``, ``shard_manifest``), made whole again."""
        return Path(stored) if os.path.isabs(stored) else output_dir / stored


def stored_path(path: Path, output_dir: Path) -> str:
    """``path`` as a shard record stores it: relative to the output directory when inside it (the folder may be
    mounted elsewhere where the shards are merged), absolute otherwise."""
    inner, outer = os.path.realpath(path), os.path.realpath(output_dir)
    if inner.startswith(outer.rstrip(os.sep) + os.sep):
        return Path(os.path.relpath(inner, outer)).as_posix()
    return os.path.abspath(path)
