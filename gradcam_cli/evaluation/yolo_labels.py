"""Ground-truth boxes in the YOLO label format for ``gradcam eval --boxes FOLDER``: one ``.txt`` file per image.

Each line of ``NAME.txt`` is one object of the image named ``NAME`` (any image suffix, in any input folder):
``class cx cy w h``, the class index and the box's centre and size as fractions of the image's width and height
(as it is shown: EXIF orientation applied, as ultralytics applies it). A segment label's polygon (more than four
numbers after the class) is read as its bounding box. Class ``i`` is named as the model names it, when it does.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from ..errors import UsageError, describe
from ..io.images import oriented_size

YoloLabel = tuple[str, tuple[float, float, float, float], int, str]
"""One object: the image's name without suffix, (x1, y1, x2, y2) as fractions of its size, its class index, and
where it was read (file and line)."""


def read_yolo_labels(folder: Path) -> list[YoloLabel]:
    """Every box of the ``.txt`` files in ``folder``, in fractions of their image."""
    boxes: list[YoloLabel] = []
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
            boxes.append((file.stem, (x1, y1, x2, y2), label, where))
    return boxes


def shown_size(image: Path) -> tuple[int, int]:
    """(width, height) of ``image`` as it is shown (EXIF orientation applied), from its header."""
    try:
        with Image.open(image) as opened:
            return oriented_size(opened)
    except OSError as error:
        raise UsageError(f"cannot read {image}: {describe(error, image)}") from error
