"""Write squares/ (or the folder given): 11 images, 320 x 240, one or two flat squares (side 40-80 px) of different
colours (red, green, blue) on grey, apart by 16 px at least, drawn from a fixed seed; with docs/examples/two.png they
are the 12 images of the detector ranking in docs/evaluation.md ("Which method for which detector")."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from PIL import Image

COLOURS = [(230, 20, 20), (20, 230, 20), (20, 20, 230)]  # red, green, blue: docs/examples/squares.txt's order
COUNT = 11


def scene(rng: random.Random) -> Image.Image:
    image = Image.new("RGB", (320, 240), (128, 128, 128))
    placed: list[tuple[int, int, int, int]] = []
    colours = rng.sample(range(3), rng.randint(1, 2))
    while len(placed) < len(colours):
        side = rng.randint(40, 80)
        x1, y1 = rng.randint(8, 312 - side), rng.randint(8, 232 - side)
        box = (x1, y1, x1 + side, y1 + side)
        if all(x1 >= b[2] + 16 or b[0] >= box[2] + 16 or y1 >= b[3] + 16 or b[1] >= box[3] + 16 for b in placed):
            image.paste(COLOURS[colours[len(placed)]], box)
            placed.append(box)
    return image


def main(folder: str = "squares") -> None:
    rng = random.Random(0)
    Path(folder).mkdir(parents=True, exist_ok=True)
    for number in range(1, COUNT + 1):
        scene(rng).save(Path(folder) / f"squares{number:02d}.png")


if __name__ == "__main__":
    main(*sys.argv[1:2])
