"""Finding input images: files, folders and glob patterns, in a stable order, each with a unique output stem."""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ..errors import UsageError, describe

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif"})
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm"})


class InputKind(Enum):
    """What an input is, the axis beside the task (docs/internals.md, "How to add an input kind"): the session
    gives each kind to its own runner."""

    IMAGE = "image"
    VIDEO = "video"
    PROMPTED = "prompted image"


@dataclass(frozen=True)
class InputImage:
    """An input to explain and the stem its outputs are named after, relative to the output directory; ``prompt``:
    the question a vision-language model is asked about it (a prompted image)."""

    path: Path
    output_stem: Path
    prompt: str | None = None

    @property
    def kind(self) -> InputKind:
        """A prompted image, a video file (by its suffix), or an image."""
        if self.prompt is not None:
            return InputKind.PROMPTED
        return InputKind.VIDEO if self.path.suffix.lower() in VIDEO_SUFFIXES else InputKind.IMAGE


def discover(
    inputs: Sequence[str | Path],
    exclude: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[InputImage]:
    """Expand files, directories (recursively) and glob patterns into images, in a deterministic order.

    Directories and glob patterns yield files with an image suffix in any case (``.JPG``, ``.Tiff``); hidden
    files and folders (names starting with ``.``) are left out of directory walks. Files named explicitly are
    always tried, since the format is read from the content. An empty string is refused (``Path("")`` would be the
    current folder: an unset shell variable would explain everything below it). Directory symlinks are followed,
    but no directory is visited twice, so symlink cycles end. ``exclude`` (the output directory) is never
    searched, so earlier outputs are never read back as inputs; it may not be an input directory itself. ``warn``
    receives one line per directory that cannot be read.

    Output stems mirror each directory's tree. With several inputs, each directory's part of the tree is led by
    its path relative to the inputs' common folder (``a/photos``, ``b/photos``), and any stems that would still
    clash (``x.jpg`` beside ``x.png``, or a named file beside a tree) are made unique, so no two images ever
    share an output name.
    """
    excluded = _real(exclude) if exclude is not None else None
    roots = [_root(raw, exclude, excluded, warn) for raw in inputs]
    prefixes = _tree_prefixes([root for root, _, is_tree in roots if is_tree])
    seen: set[str] = set()
    images = []
    for root, files, is_tree in roots:
        for file in files:
            key = os.path.abspath(file)
            if key in seen:
                continue
            seen.add(key)
            if is_tree:
                relative = prefixes[os.path.abspath(root)] / os.path.relpath(key, os.path.abspath(root))
            else:
                relative = Path(file.name)
            images.append(InputImage(file, relative.with_suffix("")))
    return _disambiguate(images)


Root = tuple[Path, list[Path], bool]
"""One input: the folder its files' stems are relative to, its files, and whether it is a tree (a directory or a
glob pattern) rather than a named file."""


def _root(raw: str | Path, exclude: Path | None, excluded: str | None, warn: Callable[[str], None] | None) -> Root:
    """One input expanded (:func:`discover`)."""
    if isinstance(raw, str) and not raw:
        raise UsageError("INPUT '' is an empty path (is a shell variable unset?); use . for the current folder")
    path = Path(raw)
    if path.is_dir():
        if excluded is not None and _real(path) == excluded:
            raise UsageError(
                f"--output-dir {exclude} is the input directory {raw} itself; choose another folder "
                "(a subfolder of the inputs is fine: it is never searched)"
            )
        return path, sorted(_walk(path, excluded, warn), key=_sort_key), True
    if path.exists() or path.is_symlink():  # a file, or a FIFO or device: tried, and failed, as an input
        return path.parent, [path], False
    if not glob.has_magic(str(raw)):
        raise UsageError(f"{raw}: no such file or directory")
    files = _glob_files(str(raw), excluded, warn)
    if not files:
        raise UsageError(f"no images match {raw!r}")
    common = Path(os.path.commonpath([os.path.abspath(p.parent) for p in files]))
    return common, files, True


def _glob_files(pattern: str, excluded: str | None, warn: Callable[[str], None] | None) -> list[Path]:
    """The images a glob pattern matches: its files with an image suffix, and its directories' images."""
    matches = sorted((Path(p) for p in glob.glob(pattern, recursive=True)), key=_sort_key)
    files: list[Path] = []
    for match in matches:
        if excluded is not None and _is_within(_real(match), excluded):
            continue
        if match.is_dir():
            files.extend(sorted(_walk(match, excluded, warn), key=_sort_key))
        elif _has_image_suffix(match.name):
            files.append(match)
    return files


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _is_within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _has_image_suffix(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


def _tree_prefixes(roots: list[Path]) -> dict[str, Path]:
    """With one directory input, its tree is mirrored as is; with several, each is led by its path relative to
    their common folder (``cats`` and ``dogs``; ``a/photos`` and ``b/photos``), never by ``..``."""
    absolute = [os.path.abspath(root) for root in roots]
    if len(set(absolute)) <= 1:
        return dict.fromkeys(absolute, Path())
    try:
        common = os.path.commonpath(absolute)
    except ValueError:  # different drives (Windows): lead with the whole path, drive letter dropped
        return {a: Path(*Path(a).parts[1:]) for a in absolute}
    return {a: Path(os.path.relpath(a, common)) for a in absolute}


def _walk(root: Path, excluded: str | None, warn: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Image files under ``root``, following directory symlinks but never visiting a directory twice."""
    visited: set[tuple[int, int]] = set()

    def on_error(error: OSError) -> None:
        if warn is not None:
            warn(f"cannot read directory {error.filename}: {describe(error, error.filename)}")

    for directory, subdirs, files in os.walk(root, followlinks=True, onerror=on_error):
        here = Path(directory)
        try:
            stat = here.stat()
        except OSError:
            subdirs[:] = []
            continue
        if (stat.st_dev, stat.st_ino) in visited or (excluded is not None and _real(here) == excluded):
            subdirs[:] = []
            continue
        visited.add((stat.st_dev, stat.st_ino))
        subdirs[:] = sorted(name for name in subdirs if not name.startswith("."))
        for name in files:
            if not name.startswith(".") and _has_image_suffix(name):
                yield here / name


def _sort_key(path: Path) -> tuple[tuple[str, ...], str]:
    return tuple(part.lower() for part in path.parts), str(path)


def _disambiguate(images: list[InputImage]) -> list[InputImage]:
    """Make every output stem unique, ignoring case (outputs may land on a case-insensitive file system).

    ``a.jpg`` and ``a.png`` in one folder would share outputs: their stems become ``a.jpg`` and ``a.png``. Stems
    that still clash (``A.jpg`` and ``a.jpg``; a named file and a tree's file) get ``~2``, ``~3``... in input order.
    """
    counts = Counter(_stem_key(image.output_stem) for image in images)
    renamed = [
        InputImage(image.path, image.output_stem.with_name(image.path.name))
        if counts[_stem_key(image.output_stem)] > 1
        else image
        for image in images
    ]
    taken: set[str] = set()
    unique = []
    for image in renamed:
        stem = image.output_stem
        number = 1
        while _stem_key(stem) in taken:
            number += 1
            stem = image.output_stem.with_name(f"{image.output_stem.name}~{number}")
        taken.add(_stem_key(stem))
        unique.append(InputImage(image.path, stem))
    return unique


def _stem_key(stem: Path) -> str:
    return stem.as_posix().casefold()


def discover_inputs(
    inputs: Sequence[str | Path],
    exclude: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> tuple[list[InputImage], list[InputImage]]:
    """``(images, videos)``: video files named on the command line (by suffix) apart, everything else through
    :func:`discover`. Folders and patterns yield images only. A usage error when nothing is found."""
    videos = [raw for raw in inputs if Path(raw).suffix.lower() in VIDEO_SUFFIXES and Path(raw).is_file()]
    others = [raw for raw in inputs if raw not in videos]
    images = discover(others, exclude=exclude, warn=warn) if others else []
    if inputs and not images and not videos:
        raise UsageError(f"no images found in {' '.join(map(str, inputs))}")
    return images, discover(videos) if videos else []
