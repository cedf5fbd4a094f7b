"""A tiny 3-D CNN that learns a known answer in time and space (issue 38), trained in the tests that use it (seeded,
a few seconds on 2 cores): on clips in which a red square in two of the eight frames makes the class ``red`` (every
clip also shows a green square in two other frames, the class ``green`` where it is the only one)."""

from __future__ import annotations

import torch
from torch import nn

T, SIDE, SQUARE = 8, 16, 4
"""Frames per clip, the network input's side and the square's, in network pixels (the video is twice as large)."""
RED, GREEN = (220.0, 40.0, 30.0), (40.0, 200.0, 40.0)
CLASSES = ["green", "red"]


class GlobalMax(nn.Module):
    """Each channel's largest value (``AdaptiveMaxPool3d(1)``, whose backward pass is slow on a CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).amax(dim=2)


def tiny_net() -> nn.Module:
    """(N, 3, T, H, W) -> (N, 2): a colour detector per pixel, a 3 x 3 x 3 convolution, the largest response."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv3d(3, 4, 1), nn.ReLU(), nn.Conv3d(4, 8, 3, padding=1), nn.ReLU(), GlobalMax(), nn.Linear(8, 2)
    )


def _paint(clip: torch.Tensor, colour: tuple[float, ...], frames: range, y: int, x: int) -> None:
    clip[:, frames.start : frames.stop, y : y + SQUARE, x : x + SQUARE] = torch.tensor(colour).view(3, 1, 1, 1) / 255


def training_clips(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` (3, T, SIDE, SIDE) clips in [0, 1]: a grey field with a little noise, a green square in two frames,
    and in half of them (class 1) a red square in two other frames; the squares' colours jittered."""
    clips, labels = [], []
    for number in range(count):
        grey = 0.25 + 0.5 * float(torch.rand(1, generator=generator))
        clip = grey + 0.03 * torch.randn(3, T, SIDE, SIDE, generator=generator)
        starts = torch.randperm(T // 2, generator=generator)[:2] * 2  # two disjoint pairs of frames
        place = torch.randint(0, SIDE - SQUARE, (2, 2), generator=generator)
        jitter = (torch.rand(2, 3, generator=generator) - 0.5) * 50
        _paint(
            clip, tuple((torch.tensor(GREEN) + jitter[0]).tolist()), range(starts[0], starts[0] + 2), *place[0].tolist()
        )
        red = number % 2
        if red:
            _paint(
                clip,
                tuple((torch.tensor(RED) + jitter[1]).tolist()),
                range(starts[1], starts[1] + 2),
                *place[1].tolist(),
            )
        clips.append(clip.clamp(0, 1))
        labels.append(red)
    return torch.stack(clips), torch.tensor(labels)


def trained() -> nn.Module:
    """The tiny 3-D CNN trained (seeded: the same weights each call), in eval mode; at least 95% right on held-out
    clips."""
    generator = torch.Generator().manual_seed(1)
    clips, labels = training_clips(256, generator)
    model = tiny_net()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(60):
        batch = torch.randint(0, len(clips), (16,), generator=generator)
        loss = nn.functional.cross_entropy(model(clips[batch]), labels[batch])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    test, truth = training_clips(64, torch.Generator().manual_seed(2))
    with torch.no_grad():
        accuracy = float((model(test).argmax(dim=1) == truth).float().mean())
    assert accuracy >= 0.95, accuracy  # the model has learnt the task: the test below means something
    return model.eval()
