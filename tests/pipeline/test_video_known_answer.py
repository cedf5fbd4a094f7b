"""A known answer in time and space (issue 38): a tiny 3-D CNN, trained here (:mod:`clip_models`: seeded, about 6 s
on 2 cores), on clips in which a red square in two of the eight frames makes the class ``red`` (every clip also
shows a green square in two other frames, the class ``green`` where it is the only one). A video of two clips, the
first with both squares, the second with the green one only, explained through the clip runner: each clip's
prediction is right and the first clip's ``red`` map puts its mass on the red square's frames and on the square,
not on the green one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clip_models import CLASSES, GREEN, RED, SIDE, SQUARE, T, trained
from video_models import write_video

from gradcam_cli import Explainer
from gradcam_cli.io.discovery import InputImage
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.profile import LoadedModel
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.clips import ClipRunner

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
