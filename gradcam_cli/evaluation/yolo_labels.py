"""Ground-truth boxes in the YOLO label format for ``gradcam eval --boxes FOLDER``: one ``.txt`` file per image.

Each line of ``NAME.txt`` is one object of the image named ``NAME`` (any image suffix, in any input folder):
``class cx cy w h``, the class index and the box's centre and size as fractions of the image's width and height
(as it is shown: EXIF orientation applied, as ultralytics applies it). A segment label's polygon (more than four
numbers after the class) is read as its bounding box. Class ``i`` is named as the model names it, when it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from PIL import Image

from ..errors import UsageError, describe
from .boxes import GroundTruthBox

ROTATED = (5, 6, 7, 8)
"""EXIF orientations that swap an image's width and height."""


def read_yolo_labels(folder: Path) -> list[GroundTruthBox]:
    """Every box of the ``.txt`` files in ``folder``, in fractions of their image (``normalised``)."""
    boxes = []
    for file in sorted(folder.glob("*.txt")):
        try:
            lines = file.read_text(encoding="utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"cannot read {file}: {describe(error, file)}") from error
        for number, line in enumerate(lines, 1):
            cells = line.split()
            if not cells or cells[0].startswith("#"):
                continue
            where = f"{file} line {number}"
            try:
                label, values = int(cells[0]), [float(cell) for cell in cells[1:]]
            except ValueError as error:
                raise UsageError(f"{where}: expected class cx cy w h (numbers), got {line.strip()!r}") from error
            if len(values) == 4:
                cx, cy, w, h = values
                x1, y1, x2, y2 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
            elif len(values) >= 6 and len(values) % 2 == 0:  # a polygon: x1 y1 x2 y2 ...
                x1, x2, y1, y2 = min(values[0::2]), max(values[0::2]), min(values[1::2]), max(values[1::2])
            else:
                raise UsageError(f"{where}: expected class cx cy w h, got {len(cells)} field(s)")
            if not (0 <= x1 < x2 <= 1.0001 and 0 <= y1 < y2 <= 1.0001 and label >= 0):
                raise UsageError(f"{where}: a YOLO box is class cx cy w h with fractions of the image in [0, 1]")
            boxes.append(GroundTruthBox(file.stem, (x1, y1, x2, y2), str(label), where, normalised=True))
    return boxes


def in_pixels(entry: GroundTruthBox, image: Path, categories: Sequence[str] | None) -> GroundTruthBox:
    """A ``normalised`` box of ``image`` in its pixels, its class index replaced by the model's name for it."""
    try:
        with Image.open(image) as opened:
            width, height = opened.size
            if opened.getexif().get(0x0112) in ROTATED:
                width, height = height, width
    except OSError as error:
        raise UsageError(f"cannot read {image}: {describe(error, image)}") from error
    x1, y1, x2, y2 = entry.box
    index = int(entry.label or 0)
    label = categories[index] if categories is not None and index < len(categories) else entry.label
    box = (x1 * width, y1 * height, x2 * width, y2 * height)
    return replace(entry, image=str(image), box=box, label=label, normalised=False)
