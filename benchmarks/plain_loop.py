"""The plain inference loop ``bench_batch.py`` compares ``gradcam DIR`` with, run as a process of its own.

What a user writes to run a torchvision model over a folder: import PyTorch, build resnet50 (random weights, as
``gradcam -w none``), then for each JPEG decode it with PIL, resize its short side to 224, normalise, and run the
model under ``torch.inference_mode`` (``--batch 1``: one image at a time, as most people write it; ``--batch 4``:
batches of 4, as gradcam uses on the CPU; ``--device cuda`` and ``--precision bf16`` run it on a GPU under
autocast, as ``make gpu-check`` compares it). Nothing is written. Prints one line, ``images=N steady=R``: R is the
images per second from the first image to the last (start-up excluded); the parent times the whole process.

    python benchmarks/plain_loop.py FOLDER [--batch N] [--device cpu|cuda] [--precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()

    import numpy as np
    import torch
    import torchvision
    from PIL import Image

    device = torch.device(args.device)
    model = torchvision.models.resnet50().eval().to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    paths = sorted(args.folder.glob("*.jpg"))
    started = time.perf_counter()
    with torch.inference_mode(), autocast:
        for first in range(0, len(paths), args.batch):
            tensors = []
            for path in paths[first : first + args.batch]:
                image = Image.open(path).convert("RGB")
                width, height = image.size
                scale = 224 / min(width, height)
                image = image.resize((round(width * scale), round(height * scale)), Image.Resampling.BILINEAR)
                pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float().div_(255)
                tensors.append((pixels - mean) / std)
            model(torch.stack(tensors).to(device)).argmax(1).tolist()
    print(f"images={len(paths)} steady={len(paths) / (time.perf_counter() - started):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
