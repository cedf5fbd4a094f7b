"""Tiny seeded volume models for the sliding-window tests: a 3-D segmenter (N, 1, D, H, W) -> (N, 3, D, H, W) with a
bottleneck at half resolution, a 3-D classifier, and volumes with bright blobs in noise."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.profile import LoadedModel

CLASSES = ("background", "bright", "dark")


class TinySegmenter(nn.Module):
    """stem (full resolution) -> down (stride 2) -> bottleneck -> upsampled, concatenated with the stem -> head."""

    def __init__(self, channels: int = 1, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.stem = nn.Conv3d(channels, 4, 3, padding=1)
        self.down = nn.Conv3d(4, 8, 3, stride=2, padding=1)
        self.bottleneck = nn.Conv3d(8, 8, 3, padding=1)
        self.head = nn.Conv3d(12, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.stem(x))
        b = F.relu(self.bottleneck(F.relu(self.down(a))))
        up = F.interpolate(b, size=a.shape[2:], mode="trilinear", align_corners=False)
        return self.head(torch.cat([up, a], dim=1))


def segmenter(seed: int = 0) -> TinySegmenter:
    torch.manual_seed(seed)
    return TinySegmenter().eval()


def classifier(seed: int = 0) -> nn.Module:
    """A 3-D classifier: (N, 1, D, H, W) -> (N, 4); its layer ``2`` gives (N, 8, D/2, H/2, W/2) maps."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv3d(1, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv3d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ).eval()


def loaded(module: nn.Module, patch: tuple[int, int, int], name: str = "tiny") -> LoadedModel:
    """``module`` as a volume segmenter of 1-channel (D, H, W) windows of ``patch``."""
    return LoadedModel(module, name, "random", list(CLASSES), InputSpec(shape=(1, *patch)), task="segment")


def volume(shape: tuple[int, int, int] = (20, 26, 30), seed: int = 1) -> torch.Tensor:
    """(1, D, H, W): noise with a bright blob and a dark one."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, *shape, generator=generator) * 0.3
    grid = torch.stack(torch.meshgrid(*[torch.arange(s, dtype=torch.float32) for s in shape], indexing="ij"))
    for centre, value in (((0.3, 0.3, 0.6), 2.0), ((0.7, 0.6, 0.3), -2.0)):
        c = torch.tensor([p * s for p, s in zip(centre, shape, strict=True)]).view(3, 1, 1, 1)
        x[0] += value * torch.exp(-((grid - c) ** 2).sum(0) / 8.0)
    return x
