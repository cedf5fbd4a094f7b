"""A hand-built classifier whose evidence is known: class 0 = red pixels, class 1 = green, class 2 = blue.

Used as ``--model tests/square_model.py:build`` and in tests where the right map is known in advance: the
``features`` layer's channels are colour detectors, so Grad-CAM for class 0 must light up the red region.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from torch import nn

CLASSES = ["red", "green", "blue"]
CLI_OPTIONS = ["--model", f"{Path(__file__).resolve()}:build", "--weights", "none", "--layer", "features"]
"""The command line's options that explain with this model at its ``features`` layer."""


class ColourDetector(nn.Module):
    """features: 3x3 conv computing colour excess per channel, ReLU; head: global mean, identity-like linear."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv2d(3, 3, kernel_size=3, padding=1)
        with torch.no_grad():
            conv.weight.zero_()
            for out in range(3):
                for inp in range(3):
                    conv.weight[out, inp, 1, 1] = 1.0 if out == inp else -0.5
            conv.bias.zero_()
        self.features = nn.Sequential(conv, nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(3, 3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(3) * 10.0)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(x)).flatten(1))


def build() -> nn.Module:
    """Factory for ``--model tests/square_model.py:build``."""
    return ColourDetector()


def square_image(
    size: tuple[int, int] = (480, 320), box: tuple[int, int, int, int] = (330, 40, 390, 100), colour: str = "red"
) -> Image.Image:
    """A grey ``size`` (W, H) image with one coloured square at ``box`` = (x1, y1, x2, y2), exclusive ends."""
    rgb = {"red": (230, 20, 20), "green": (20, 230, 20), "blue": (20, 20, 230)}[colour]
    image = Image.new("RGB", size, (128, 128, 128))
    image.paste(rgb, box)
    return image


class OneChannel(nn.Module):
    """A tiny 1-channel classifier of 8 x 8 inputs (3 classes): with one channel, Quantus' features are our pixels
    (tests/evaluation's metrics against Quantus)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))
