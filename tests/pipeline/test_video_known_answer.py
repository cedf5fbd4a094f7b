"""A known answer in time and space (issue 38): a tiny 3-D CNN, trained here (seeded, a few seconds on 2 cores), on
clips in which a red square in two of the eight frames makes the class ``red`` (every clip also shows a green square
in two other frames, the class ``green`` where it is the only one). A video of two clips, the first with both
squares, the second with the green one only, explained through the clip runner: each clip's prediction is right and
the first clip's ``red`` map puts its mass on the red square's frames and on the square, not on the green one.
Training takes about 6 s on 2 cores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from video_models import write_video

from gradcam_cli import Explainer
from gradcam_cli.io.discovery import InputImage
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.profile import LoadedModel
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.clips import ClipRunner

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


RED_FRAMES, GREEN_FRAMES, LATE_GREEN = range(2, 4), range(5, 7), range(11, 13)
RED_AT, GREEN_AT = (8, 20), (20, 4)
"""Video frames (of 16) and (y, x) in video pixels (32 x 32) of the squares: clip 0 (frames 0-7) shows both, clip 1
(frames 8-15) the green one only."""


def _frame(number: int) -> np.ndarray:
    frame = np.full((2 * SIDE, 2 * SIDE, 3), 128, np.uint8)
    for frames, (y, x), colour in (
        (RED_FRAMES, RED_AT, RED),
        (GREEN_FRAMES, GREEN_AT, GREEN),
        (LATE_GREEN, GREEN_AT, GREEN),
    ):
        if number in frames:
            frame[y : y + 2 * SQUARE, x : x + 2 * SQUARE] = colour[::-1]  # BGR
    return frame


@pytest.mark.slow
def test_the_map_of_a_trained_3d_cnn_falls_on_the_frames_and_the_square_that_decide(tmp_path: Path):
    video = write_video(tmp_path / "squares.mp4", 16, 8.0, (2 * SIDE, 2 * SIDE), _frame)
    spec = InputSpec(size=SIDE, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), shape=(3, T, SIDE, SIDE))
    model = LoadedModel(trained(), "tiny3d", "trained", CLASSES, spec)
    assert model.profile.clips is not None and model.profile.clips.frames == T  # a bare 3-D CNN: 8 frames, each
    explainer = Explainer(model, "3", ["gradcam"])
    output = OutputOptions(tmp_path / "out", save_raw=True)
    records = ClipRunner(explainer, model.profile.clips, output, RunOptions()).run(InputImage(video, Path("squares")))
    assert [record.status for record in records] == ["ok", "ok"], records[0].error
    first, second = records
    assert (first.target.name, second.target.name) == ("red", "green")
    assert first.target.probability > 0.9 and second.target.probability > 0.9
    saliency = np.load(first.outputs[2])
    assert saliency.shape == (T, SIDE, SIDE)
    shares = np.array(first.clip.shares)
    assert shares[list(RED_FRAMES)].sum() >= 0.8, shares  # two frames of eight: a quarter would be chance
    assert shares[list(RED_FRAMES)].sum() > 3 * shares[list(GREEN_FRAMES)].sum(), shares
    red = saliency[RED_FRAMES.start : RED_FRAMES.stop]
    y, x = RED_AT[0] // 2, RED_AT[1] // 2
    inside = red[:, max(0, y - 1) : y + SQUARE + 1, max(0, x - 1) : x + SQUARE + 1].sum()
    assert inside / red.sum() >= 0.8  # (6 x 6) / (16 x 16) of the frame: a seventh would be chance
