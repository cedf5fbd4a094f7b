"""A tiny YOLO detector trained in seconds on generated images of coloured squares, so what it detects is known.

Class 0 is a red square, class 1 a blue one, on a grey background; :func:`train_squares` trains ultralytics' own
YOLO11 architecture (widths and depths scaled down) with ultralytics' own loss, seeded.
"""

from __future__ import annotations

import copy
import random
import sys
import types
from pathlib import Path

import torch
from PIL import Image
from threads import one_thread

CLASSES = ["red", "blue"]
COLOURS = [(220, 30, 30), (30, 30, 220)]
SIZE = 64
"""The training images' side (also the model's input size)."""
CLS_GAIN = 1.5
"""The weight of the classification loss (ultralytics: 0.5; higher: confident detections in few steps)."""
LEARNING_RATE = 0.01
"""Adam's peak learning rate: warmed up over the first tenth of the steps, then annealed (one cycle) to ~0, so the
last steps settle rather than jump (a constant rate left duplicate boxes and 5 px errors that came and went with
library versions)."""
WIDE_SCENE = [(0, 10, 10, 46, 46), (1, 80, 20, 116, 56)]
"""The README's ``wide.png`` (128 x 64): a red and a blue square."""


def tiny_config(head: list[object] | None = None) -> dict[str, object]:
    """A YOLO model file's contents: five strided convolutions (P1/2 .. P5/32), a C3k2 block and ultralytics'
    ``Detect`` head (or ``head``: its name and arguments) on P3, P4 and P5, two classes."""
    return {
        "nc": 2,
        "reg_max": 1,
        "backbone": [
            [-1, 1, "Conv", [8, 3, 2]],
            [-1, 1, "Conv", [16, 3, 2]],
            [-1, 1, "Conv", [16, 3, 2]],
            [-1, 1, "C3k2", [16, False, 0.25]],
            [-1, 1, "Conv", [32, 3, 2]],
            [-1, 1, "Conv", [32, 3, 2]],
        ],
        "head": [[[3, 4, 5], 1, *(head or ["Detect", ["nc"]])]],
    }


def square_scene(boxes: list[tuple[int, int, int, int, int]], size: tuple[int, int] = (SIZE, SIZE)) -> Image.Image:
    """A grey (W, H) ``size`` image with a square per (class, x1, y1, x2, y2) of ``boxes``."""
    image = Image.new("RGB", size, (128, 128, 128))
    for label, x1, y1, x2, y2 in boxes:
        image.paste(COLOURS[label], (x1, y1, x2, y2))
    return image


def _random_scene(rng: random.Random) -> list[tuple[int, int, int, int, int]]:
    boxes: list[tuple[int, int, int, int, int]] = []
    while len(boxes) < rng.randint(1, 2):
        side = rng.randint(14, 26)
        x1, y1 = rng.randint(0, SIZE - side), rng.randint(0, SIZE - side)
        box = (rng.randint(0, 1), x1, y1, x1 + side, y1 + side)
        if all(x1 >= b[3] + 4 or b[1] >= x1 + side + 4 or y1 >= b[4] + 4 or b[2] >= y1 + side + 4 for b in boxes):
            boxes.append(box)
    return boxes


def train_squares(steps: int = 200, seed: int = 0) -> torch.nn.Module:
    """A tiny DetectionModel trained ``steps`` Adam steps on batches of 16 random scenes (seeded, single-threaded:
    the same model at any thread count, and fast on busy cores).

    Measured on the tests' scenes (64 x 64, 128 x 64, seeds 0-4): each square is found with confidence >= 0.76, its
    box within 1.5 px, and every other detection scores <= 0.04 (far under the default threshold, 0.25)."""
    with one_thread():
        return _trained(steps, seed)


def _trained(steps: int, seed: int) -> torch.nn.Module:
    import numpy as np
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(seed)
    rng = random.Random(seed)
    net = DetectionModel(tiny_config(), verbose=False)
    net.args = types.SimpleNamespace(box=7.5, cls=CLS_GAIN, dfl=1.5)
    net.names = dict(enumerate(CLASSES))
    optimiser = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, LEARNING_RATE, total_steps=steps, pct_start=0.1)
    net.train()
    for _ in range(steps):
        images, rows = [], []
        for n in range(16):
            scene = _random_scene(rng)
            pixels = np.asarray(square_scene(scene), dtype=np.float32) / 255
            images.append(torch.from_numpy(pixels).permute(2, 0, 1))
            for label, x1, y1, x2, y2 in scene:
                rows.append([n, label, (x1 + x2) / 2 / SIZE, (y1 + y2) / 2 / SIZE, (x2 - x1) / SIZE, (y2 - y1) / SIZE])
        table = torch.tensor(rows)
        batch = {"img": torch.stack(images), "batch_idx": table[:, 0], "cls": table[:, 1:2], "bboxes": table[:, 2:]}
        loss, _ = net.loss(batch)
        optimiser.zero_grad()
        loss.sum().backward()
        optimiser.step()
        schedule.step()
    return net.eval()


def save_checkpoint(net: torch.nn.Module, path: Path) -> Path:
    """``net`` saved as ultralytics saves a trained model (a dict with ``model`` and ``train_args``)."""
    net = copy.deepcopy(net).float()
    for attribute in ("args", "criterion"):
        if hasattr(net, attribute):
            delattr(net, attribute)
    torch.save({"model": net, "train_args": {"imgsz": SIZE}}, path)
    return path


def trained_checkpoint(path: Path) -> Path:
    """:func:`train_squares`'s model saved to ``path``."""
    from gradcam_cli.models.yolo import offline_ultralytics

    offline_ultralytics()  # as gradcam imports it (ultralytics patches PIL.Image.open on import)
    return save_checkpoint(train_squares(), path)


def make_example(folder: Path) -> tuple[Path, Path]:
    """The inputs of the README's YOLO example in ``folder``: ``squares.pt`` and ``wide.png``."""
    folder.mkdir(parents=True, exist_ok=True)
    square_scene(WIDE_SCENE, (128, 64)).save(folder / "wide.png")
    return trained_checkpoint(folder / "squares.pt"), folder / "wide.png"


if __name__ == "__main__":  # make yolo-example: python tests/yolo_model.py [FOLDER]
    for made in make_example(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(f"wrote {made}")
