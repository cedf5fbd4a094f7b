"""Hand-built detectors and segmenters whose answers are known: they find coloured squares.

``build_detector`` follows torchvision's detection conventions (a ``GeneralizedRCNNTransform`` that resizes and pads
to a multiple of 32, a list of dicts with boxes, labels and scores in the input's coordinates), with a backbone
whose three channels measure red, green and blue excess: each colour present gives one detection, the box around
its cells, scored by the sigmoid of its strongest cell. ``build_segmenter`` returns ``{"out": logits}`` for classes
background, red, green, blue. ``build_puzzle`` returns something no task fits. Used as ``--model
tests/task_models.py:build_detector`` and in tests.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from gradcam_cli.io.images import IMAGENET_MEAN, IMAGENET_STD

DETECTION_CLASSES = ["__background__", "red", "green", "blue"]
STRIDE = 4
GAIN = 12.0
BIAS = 3.0
"""A cell's colour score is sigmoid(GAIN * excess - BIAS): 0.05 for grey, above 0.99 for a saturated colour."""


def colour_excess() -> nn.Conv2d:
    """A 3x3 convolution whose channel c is colour c minus half the other two (at the centre pixel)."""
    conv = nn.Conv2d(3, 3, kernel_size=3, padding=1)
    with torch.no_grad():
        conv.weight.zero_()
        for out in range(3):
            for inp in range(3):
                conv.weight[out, inp, 1, 1] = 1.0 if out == inp else -0.5
        conv.bias.zero_()
    return conv


class Backbone(nn.Module):
    """``body``: colour excess, ReLU, then STRIDE x STRIDE average pooling: (N, 3, H / STRIDE, W / STRIDE)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(colour_excess(), nn.ReLU(), nn.AvgPool2d(STRIDE))


class SquareDetector(nn.Module):
    """Finds coloured squares: one detection per colour whose strongest cell scores at least 0.05."""

    def __init__(self, min_size: int = 96, max_size: int = 160) -> None:
        super().__init__()
        self.transform = GeneralizedRCNNTransform(min_size, max_size, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
        self.backbone = Backbone()

    def forward(self, images: list[torch.Tensor] | torch.Tensor) -> list[dict[str, torch.Tensor]]:
        originals = [(int(image.shape[-2]), int(image.shape[-1])) for image in images]
        batch, _ = self.transform(list(images))
        features = self.backbone.body(batch.tensors)
        found = [self._detect(cells) for cells in features]
        return self.transform.postprocess(found, batch.image_sizes, originals)

    @staticmethod
    def _detect(cells: torch.Tensor) -> dict[str, torch.Tensor]:
        boxes, labels, scores = [], [], []
        for colour in range(3):
            excess = cells[colour]
            score = torch.sigmoid(GAIN * excess.max() - BIAS)
            if float(score.detach()) < 0.05:
                continue
            rows, cols = (excess.detach() > 0.5 * excess.detach().max()).nonzero(as_tuple=True)
            box = torch.tensor([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=torch.float32)
            boxes.append(box * STRIDE)
            labels.append(colour + 1)
            scores.append(score)
        if not scores:
            return {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long), "scores": torch.zeros(0)}
        stacked = torch.stack(scores)
        order = stacked.detach().argsort(descending=True)
        return {"boxes": torch.stack(boxes)[order], "labels": torch.tensor(labels)[order], "scores": stacked[order]}


class SquareSegmenter(nn.Module):
    """Per pixel: background scores 1, colour c scores 4 x its excess (so it wins where the excess passes 0.25).

    It takes ImageNet-normalised inputs (as any model without a spec of its own gets them) and undoes that first.
    """

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(colour_excess(), nn.ReLU())
        self.classifier = nn.Conv2d(3, 4, kernel_size=1)
        with torch.no_grad():
            self.classifier.weight.zero_()
            self.classifier.bias.zero_()
            self.classifier.bias[0] = 1.0
            for colour in range(3):
                self.classifier.weight[colour + 1, colour] = 4.0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        pixels = x * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        return {"out": self.classifier(self.backbone(pixels))}


class Puzzle(nn.Module):
    """Returns a tuple of two 3-D tensors: no task fits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y.mean(dim=1), y.amax(dim=1)


def build_detector() -> nn.Module:
    """Factory for ``--model tests/task_models.py:build_detector``."""
    return SquareDetector()


def build_segmenter() -> nn.Module:
    """Factory for ``--model tests/task_models.py:build_segmenter``."""
    return SquareSegmenter()


def build_puzzle() -> nn.Module:
    """Factory for ``--model tests/task_models.py:build_puzzle``."""
    return Puzzle()
