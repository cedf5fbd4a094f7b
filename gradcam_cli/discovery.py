"""Finding input images and naming the files written for them."""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif"})
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm"})


@dataclass(frozen=True)
class InputImage:
    """An image to explain and the stem its outputs are named after, relative to the output directory."""

    path: Path
    output_stem: Path


def discover(inputs: Sequence[str | Path], exclude: Path | None = None) -> list[InputImage]:
    """Expand files, directories (recursively) and glob patterns into images, in a deterministic order.

    Directories yield files with an image suffix (any case); named files are always tried, since the format is
    read from the content. Symlinked directories are followed once (no cycles); ``exclude`` (the output
    directory) is never searched. Outputs mirror each directory's tree; with several roots, each root's name
    leads its part of the tree so that same-named files never collide.
    """
    roots: list[tuple[Path, list[Path], bool]] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            roots.append((path, sorted(_walk(path, exclude), key=_sort_key), True))
        elif path.is_file() or path.is_symlink():
            roots.append((path.parent, [path], False))
        elif glob.has_magic(str(raw)):
            files = sorted((Path(p) for p in glob.glob(str(raw), recursive=True)), key=_sort_key)
            files = [p for p in files if p.is_file()]
            if not files:
                raise UsageError(f"no files match {raw!r}")
            roots.append((Path(os.path.commonpath([p.parent for p in files])), files, True))
        else:
            raise UsageError(f"{raw}: no such file or directory")
    prefix_roots = sum(is_tree for _, _, is_tree in roots) > 1
    seen: set[Path] = set()
    images = []
    for root, files, is_tree in roots:
        for file in files:
            key = file.absolute()
            if key in seen:
                continue
            seen.add(key)
            relative = file.relative_to(root)
            if prefix_roots and is_tree:
                relative = Path(root.absolute().name) / relative
            images.append(InputImage(file, relative.with_suffix("")))
    return _disambiguate(images)


def _walk(root: Path, exclude: Path | None) -> Iterator[Path]:
    """Image files under ``root``, following directory symlinks but never visiting a directory twice."""
    visited: set[tuple[int, int]] = set()
    excluded = exclude.resolve() if exclude is not None else None
    for directory, subdirs, files in os.walk(root, followlinks=True):
        here = Path(directory)
        try:
            stat = here.stat()
        except OSError:
            subdirs[:] = []
            continue
        if (stat.st_dev, stat.st_ino) in visited or (excluded is not None and here.resolve() == excluded):
            subdirs[:] = []
            continue
        visited.add((stat.st_dev, stat.st_ino))
        subdirs.sort()
        for name in files:
            if Path(name).suffix.lower() in IMAGE_SUFFIXES:
                yield here / name


def _sort_key(path: Path) -> tuple[str, ...]:
    return (*(part.lower() for part in path.parts), str(path))


def _disambiguate(images: list[InputImage]) -> list[InputImage]:
    """``a.jpg`` and ``a.png`` in one folder would share outputs: their stems become ``a.jpg`` and ``a.png``."""
    counts = Counter(image.output_stem for image in images)
    return [
        InputImage(image.path, image.output_stem.with_name(image.path.name)) if counts[image.output_stem] > 1 else image
        for image in images
    ]


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe lower-case version of a class name: 'Egyptian cat' -> 'egyptian-cat'."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return cleaned[:limit].rstrip("-") or "class"


def output_path(
    output_dir: Path, image: InputImage, method: str, class_index: int, class_name: str, suffix: str
) -> Path:
    """``<output_dir>/<relative dir>/<stem>_<method>_<class index>-<class slug><suffix>``.

    For example ``gradcam_out/chelsea_gradcam_285-egyptian-cat.png`` and, with ``--save-raw``, the same name
    ending in ``.npy``.
    """
    stem = image.output_stem
    name = f"{stem.name}_{slug(method)}_{class_index}-{slug(class_name)}{suffix}"
    return output_dir / stem.parent / name
