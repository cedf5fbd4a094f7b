"""Ground-truth object boxes for ``gradcam eval``: reading CSV / Pascal VOC files and matching them to input images."""

from __future__ import annotations

import csv
import math
import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from ..errors import UsageError, describe
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage

if TYPE_CHECKING:
    from . import metrics


def read_boxes(path: str | Path) -> list[GroundTruthBox]:
    """Boxes from a CSV file (``image,x1,y1,x2,y2[,class]``), a folder of Pascal VOC XML files, or a folder of YOLO
    label ``.txt`` files (:mod:`gradcam_cli.evaluation.yolo_labels`).

    CSV corners are pixel coordinates with exclusive ends (``0,0,10,10`` covers pixels 0..9); a first line that is
    not a box is taken as a header; blank lines and lines starting with ``#`` are skipped. VOC's 1-based inclusive
    ``xmin..xmax`` become ``xmin - 1 .. xmax``. A malformed line raises :class:`UsageError` naming it.
    """
    path = Path(path)
    if path.is_dir() and not any(path.glob("*.xml")) and any(path.glob("*.txt")):
        from .yolo_labels import read_yolo_labels

        boxes = [GroundTruthBox(n, box, str(c), where, normalised=True) for n, box, c, where in read_yolo_labels(path)]
    elif path.is_dir():
        boxes = _read_voc(path)
    elif path.is_file():
        boxes = _read_csv(path)
    else:
        raise UsageError(f"boxes file {path} does not exist")
    if not boxes:
        raise UsageError(f"no boxes in {path}")
    return boxes


def _read_csv(path: Path) -> list[GroundTruthBox]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"boxes file {path} is not UTF-8 text; save it as UTF-8 (CSV: image,x1,y1,x2,y2[,class] per line)"
        ) from error
    except OSError as error:
        raise UsageError(f"cannot read boxes file {path}: {describe(error, path)}") from error
    boxes = []
    first = True
    for number, row in enumerate(csv.reader(text.splitlines()), 1):
        cells = [cell.strip() for cell in row]
        if not any(cells) or cells[0].startswith("#"):
            continue
        where = f"{path} line {number}"
        if first and len(cells) >= 5 and not _is_number(cells[1]):
            first = False
            continue  # a header
        first = False
        if len(cells) not in (5, 6) or not cells[0]:
            raise UsageError(f"{where}: expected image,x1,y1,x2,y2[,class], got {len(cells)} field(s)")
        label = cells[5] if len(cells) == 6 and cells[5] else None
        boxes.append(GroundTruthBox(cells[0], _corners(cells[1:5], where), label, where))
    return boxes


def _read_voc(folder: Path) -> list[GroundTruthBox]:
    files = sorted(folder.glob("*.xml"))
    if not files:
        raise UsageError(f"no .xml files in {folder}; --boxes takes a CSV file or a folder of Pascal VOC XML files")
    boxes = []
    for file in files:
        try:
            root = ElementTree.parse(file).getroot()
        except ElementTree.ParseError as error:
            raise UsageError(f"{file} line {error.position[0]}: not valid XML ({error})") from error
        except OSError as error:
            raise UsageError(f"cannot read {file}: {describe(error, file)}") from error
        filename = (root.findtext("filename") or "").strip()
        if not filename:
            raise UsageError(f"{file}: no <filename> element (is it a Pascal VOC annotation?)")
        for number, obj in enumerate(root.iter("object"), 1):
            where = f"{file} object {number}"
            box = obj.find("bndbox")
            if box is None:
                raise UsageError(f"{where}: no <bndbox>")
            cells = [(box.findtext(tag) or "").strip() for tag in ("xmin", "ymin", "xmax", "ymax")]
            x1, y1, x2, y2 = _corners(cells, where)
            label = (obj.findtext("name") or "").strip() or None
            boxes.append(GroundTruthBox(filename, (x1 - 1, y1 - 1, x2, y2), label, where))
    return boxes


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _corners(cells: Sequence[str], where: str) -> metrics.Box:
    values = []
    for name, cell in zip(("x1", "y1", "x2", "y2"), cells, strict=True):
        if not _is_number(cell):
            raise UsageError(f"{where}: {name} {cell!r} is not a number")
        values.append(float(cell))
    x1, y1, x2, y2 = values
    if not (x1 < x2 and y1 < y2):
        raise UsageError(f"{where}: a box needs x1 < x2 and y1 < y2, got {x1:g},{y1:g},{x2:g},{y2:g}")
    return x1, y1, x2, y2


def match_boxes(
    boxes: Sequence[GroundTruthBox], images: Sequence[InputImage], categories: Sequence[str] | None = None
) -> tuple[dict[Path, list[GroundTruthBox]], list[GroundTruthBox]]:
    """Assign boxes to input images: ``({image path: boxes}, boxes naming no input image)``.

    A box's image matches an input whose path ends with it: a bare file name, or a relative path of any depth
    (``JPEGImages/0001.jpg``); an absolute path must be the input's. A name that fits several inputs is an error.
    A YOLO label's box matches the input of its name, any suffix, and comes back in its pixels, its class named as
    ``categories`` (the model's class names) name it.
    """
    by_name: dict[str, list[InputImage]] = {}
    for image in images:
        by_name.setdefault(image.path.name, []).append(image)
    matched: dict[Path, list[GroundTruthBox]] = {}
    unmatched = []
    for entry in boxes:
        wanted = PurePath(os.path.normpath(entry.image.replace("\\", "/")))
        candidates = [
            image
            for image in by_name.get(wanted.name, [])
            if _path_ends_with(Path(os.path.normpath(image.path.absolute())), wanted)
        ]
        if entry.normalised:
            candidates = [image for image in images if image.path.stem == entry.image]
        if len(candidates) > 1:
            names = ", ".join(str(c.path) for c in candidates[:3])
            raise UsageError(f"{entry.source}: {entry.image!r} matches several inputs ({names}); give a longer path")
        if candidates and entry.normalised:
            matched.setdefault(candidates[0].path, []).append(_in_pixels(entry, candidates[0].path, categories))
        elif candidates:
            matched.setdefault(candidates[0].path, []).append(entry)
        else:
            unmatched.append(entry)
    return matched, unmatched


def _in_pixels(entry: GroundTruthBox, image: Path, categories: Sequence[str] | None) -> GroundTruthBox:
    """A YOLO label's box of ``image`` in its pixels, its class index replaced by the model's name for it."""
    from .yolo_labels import shown_size

    width, height = shown_size(image)
    x1, y1, x2, y2 = entry.box
    index = int(entry.label or 0)
    label = categories[index] if categories is not None and index < len(categories) else entry.label
    box = (x1 * width, y1 * height, x2 * width, y2 * height)
    return replace(entry, image=str(image), box=box, label=label, normalised=False)


def _path_ends_with(path: PurePath, tail: PurePath) -> bool:
    if tail.is_absolute():
        return path == tail
    return len(tail.parts) <= len(path.parts) and path.parts[-len(tail.parts) :] == tail.parts


def class_of(label: str | None, categories: Sequence[str] | None, targeted: bool = False) -> int | None:
    """The class a box's ``label`` names (one of ``categories``, any case; exactly one match), or ``None``: no label,
    no class names, no single match, or ``targeted`` (a ``--target`` fixes what is explained)."""
    if label is None or categories is None or targeted:
        return None
    matches = [i for i, name in enumerate(categories) if name.lower() == label.lower()]
    return matches[0] if len(matches) == 1 else None
