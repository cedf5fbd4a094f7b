"""Finding input images: files, folders and glob patterns, in a stable order, each with a unique output stem."""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from ..errors import UsageError, describe
from .volumes import VOLUME_SUFFIXES, group_channels, is_volume_path, volume_stem

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif"})
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm"})


class InputKind(Enum):
    """What an input is, the axis beside the task (docs/internals.md, "How to add an input kind"): the session
    gives each kind to its own runner."""

    IMAGE = "image"
    VIDEO = "video"
    PROMPTED = "prompted image"
    VOLUME = "volume"


@dataclass(frozen=True)
class InputImage:
    """An input to explain and the stem its outputs are named after, relative to the output directory; ``prompt``:
    the question a vision-language model is asked about it (a prompted image)."""

    path: Path
    output_stem: Path
    prompt: str | None = None
    channels: tuple[Path, ...] = ()
    frames: bool = False
    """A folder of frame images, read as one video by a video model (:func:`discover_clips`)."""

    @property
    def kind(self) -> InputKind:
        """A prompted image (or video: a vision-language model's), a video (a file, by its suffix, or a folder of
        frames), a scan (channel files, or a NIfTI, ``.npy`` or DICOM folder path), or an image."""
        if self.prompt is not None:
            return InputKind.PROMPTED
        if self.frames:
            return InputKind.VIDEO
        if self.channels or self.path.is_dir() or self.path.name.lower().endswith(VOLUME_SUFFIXES):
            return InputKind.VOLUME
        return InputKind.VIDEO if self.video else InputKind.IMAGE

    @property
    def video(self) -> bool:
        """A video: a folder of frames, or a file with a video suffix."""
        return self.frames or self.path.suffix.lower() in VIDEO_SUFFIXES


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
        replace(image, output_stem=image.output_stem.with_name(image.path.name))
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
        unique.append(replace(image, output_stem=stem))
    return unique


def _stem_key(stem: Path) -> str:
    return stem.as_posix().casefold()


def discover_inputs(
    inputs: Sequence[str | Path],
    exclude: Path | None = None,
    warn: Callable[[str], None] | None = None,
    channels: Sequence[Path] = (),
) -> tuple[list[InputImage], list[InputImage], list[InputImage]]:
    """``(images, videos, scans)``: video files named on the command line (by suffix) apart; scans named (a NIfTI
    or ``.npy`` file, a folder of ``.dcm`` files) and those under the folders named (:func:`discover_volumes`;
    ``channels``: one scan's channel files, ``--channels``, first); everything else through :func:`discover`.
    Folders yield images and scans, patterns images only. A usage error when nothing is found."""
    videos = [raw for raw in inputs if Path(raw).suffix.lower() in VIDEO_SUFFIXES and Path(raw).is_file()]
    scans = [raw for raw in inputs if raw not in videos and _is_scan(Path(raw))]
    others = [raw for raw in inputs if raw not in videos and raw not in scans]
    images = discover(others, exclude=exclude, warn=warn) if others else []
    folders = [raw for raw in others if Path(raw).is_dir()]
    volumes = discover_volumes([*scans, *folders], exclude, channels) if scans or folders or channels else []
    if inputs and not images and not videos and not volumes:
        raise UsageError(f"no images found in {' '.join(map(str, inputs))}")
    return images, discover(videos) if videos else [], volumes


def _is_scan(path: Path) -> bool:
    try:
        return path.exists() and is_volume_path(path)
    except OSError:  # an unreadable folder: discover() warns about it
        return False


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """A name's sort key in natural order, ignoring case: its runs of digits compare as numbers (``frame2.png``
    before ``frame10.png``), the rest as text."""
    parts = re.split(r"(\d+)", name.casefold())
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in parts if part)


def frame_files(folder: Path) -> list[Path]:
    """The frame images of a folder of frames: its files with an image suffix (any case, hidden ones left out; not
    its subfolders'), in natural order of their names (:func:`natural_key`)."""
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_file()]
    except OSError:
        return []
    chosen = [n for n in names if not n.startswith(".") and os.path.splitext(n)[1].lower() in IMAGE_SUFFIXES]
    return [folder / name for name in sorted(chosen, key=lambda name: (natural_key(name), name))]


def discover_clips(
    inputs: Sequence[str | Path], exclude: Path | None = None
) -> tuple[list[InputImage], list[InputImage]]:
    """``(images, videos)`` for a model that takes clips (docs/video.md, "A folder of frames"): video files, and in
    each folder named (searched recursively, hidden folders and ``exclude`` left out) every folder that directly
    holds images, as one video of those frames (:func:`frame_files`; its stem: its path from the named folder's
    parent, ``frames`` or ``clips/walk``); anything else as :func:`discover_inputs` finds it (images, refused by a
    video model)."""
    excluded = _real(exclude) if exclude is not None else None
    folders = [raw for raw in inputs if Path(raw).is_dir()]
    others = [raw for raw in inputs if raw not in folders]
    images, videos, _ = discover_inputs(others, exclude) if others else ([], [], [])  # scans: not a video model's
    for raw in folders:
        root = Path(raw)
        top = Path(os.path.abspath(root)).name or "frames"
        for directory, subdirs, _ in os.walk(root, followlinks=False):
            here = Path(directory)
            subdirs[:] = sorted((name for name in subdirs if not name.startswith(".")), key=natural_key)
            if excluded is not None and _real(here) == excluded:
                subdirs[:] = []
            elif frame_files(here):
                videos.append(InputImage(here, Path(top) / here.relative_to(root), frames=True))
    if inputs and not images and not videos:
        raise UsageError(f"no videos or folders of frames found in {' '.join(map(str, inputs))}")
    return images, _disambiguate(videos)


def discover_videos(inputs: Sequence[str | Path], model: str) -> list[InputImage]:
    """The videos among ``inputs`` for the video model named ``model`` (:func:`discover_clips`); a
    :class:`UsageError` for an image among them."""
    images, videos = discover_clips(inputs)
    if images:
        raise UsageError(f"{model} takes clips: give it videos; {images[0].path} is an image")
    return videos


def discover_volumes(
    inputs: Sequence[str | Path], exclude: Path | None = None, channels: Sequence[Path] = ()
) -> list[InputImage]:
    """Scans among ``inputs``: NIfTI and ``.npy`` files and DICOM series folders, named or found in folders
    (recursively; a folder holding ``.dcm`` files is one scan, not searched further), in a stable order.

    Files named by nnU-Net's channel rule (``CASE_0000.nii.gz``, ``CASE_0001.nii.gz``) become one input of
    several channels (:func:`~gradcam_cli.io.volumes.group_channels`); ``channels`` (``--channels a,b``) names one
    scan's channel files explicitly. Each input's ``channels`` lists its files in channel order; its stem is the
    case's name (``CASE``), relative to its folder as for images."""
    excluded = _real(exclude) if exclude is not None else None
    found: list[tuple[Path, Path]] = []  # (path, stem relative to the outputs)
    for raw in inputs:
        path = Path(raw)
        if path.is_dir() and not is_volume_path(path):
            found.extend((s, s.relative_to(path)) for s in sorted(_walk_volumes(path, excluded), key=_sort_key))
        elif is_volume_path(path):
            found.append((path, Path(path.name)))
    named = {os.path.abspath(path) for path in channels}
    found = [(path, stem) for path, stem in found if os.path.abspath(path) not in named]  # the channels' scan once
    scans = []
    if channels:
        scans.append(InputImage(channels[0], Path(case_name(channels[0])), channels=tuple(channels)))
    by_path = dict(found)
    for group in group_channels([path for path, _ in found]):
        stem = by_path[group[0]].with_name(case_name(group[0]) if len(group) > 1 else volume_stem(group[0]))
        scans.append(InputImage(group[0], stem, channels=group if len(group) > 1 else ()))
    return _disambiguate(scans)


def case_name(path: Path) -> str:
    """``CASE`` of ``CASE_0000.nii.gz`` (the stem without the channel number), or the scan's stem."""
    stem = volume_stem(path)
    return stem[:-5] if len(stem) > 5 and stem[-5] == "_" and stem[-4:].isdigit() else stem


def _walk_volumes(root: Path, excluded: str | None) -> Iterator[Path]:
    """Scans under ``root`` in a stable order: NIfTI and ``.npy`` files, and folders of ``.dcm`` files."""
    for directory, subdirs, files in os.walk(root, followlinks=False):
        here = Path(directory)
        if excluded is not None and _real(here) == excluded:
            subdirs[:] = []
            continue
        subdirs[:] = sorted(name for name in subdirs if not name.startswith("."))
        if here != root and any(name.lower().endswith(".dcm") for name in files):
            subdirs[:] = []
            yield here
            continue
        for name in sorted(files):
            if not name.startswith(".") and name.lower().endswith(VOLUME_SUFFIXES):
                yield here / name
